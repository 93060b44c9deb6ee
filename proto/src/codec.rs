//! Control messages (handshake, open, close, errors), bincode-encoded with a
//! size limit. The only place bincode is used: it is unmaintained
//! (RUSTSEC-2025-0141), so it stays confined to this module and never sees
//! hot-path data.

use bincode::Options;
use serde::{Deserialize, Serialize};

use crate::wire::CONTROL_PAYLOAD_MAX_BYTES;

/// Stable error codes; the message beside each is for people.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ErrorCode {
    UnknownDataset,
    NotSealed,
    AccessDenied,
    MalformedFrame,
    OversizedFrame,
    Protocol,
    Internal,
    /// The node is at a limit (connections); try again later.
    Busy,
}

/// What a client learns when it opens a dataset.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OpenInfo {
    pub kind: String,
    pub length_bytes: u64,
    pub content_hash: String,
    pub chunk_size_bytes: u64,
    /// Control endpoints of the live nodes holding a complete copy, the
    /// answering node first: where a client fails over to (empty on a
    /// single node).
    pub replicas: Vec<String>,
}

/// A credential (a grant's token): encoded as the plain string, but never
/// shown by `Debug`, so no log line or error message carries it.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Secret(String);

impl Secret {
    pub fn new(secret: String) -> Self {
        Self(secret)
    }

    /// The secret itself, for the one place that checks it.
    pub fn expose(&self) -> &str {
        &self.0
    }

    pub fn into_inner(self) -> String {
        self.0
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(<redacted>)")
    }
}

/// Longest dataset name, in bytes: the catalog takes no longer one, so a
/// node answers an `Open` of a longer name without looking it up.
pub const DATASET_NAME_BYTES_MAX: usize = 128;

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ControlMessage {
    Hello { protocol: u32, client: String },
    HelloOk { node: String, ranges_per_batch_max: u32, batch_footprint_max_bytes: u64, credits: u32 },
    Open { name: String, token: Option<Secret> },
    Opened { handle: u32, info: OpenInfo },
    Close { handle: u32 },
    Error { code: ErrorCode, message: String },
}

fn options() -> impl Options {
    bincode::DefaultOptions::new()
        .with_limit(u64::from(CONTROL_PAYLOAD_MAX_BYTES))
        .with_little_endian()
        .with_fixint_encoding()
        .reject_trailing_bytes()
}

#[derive(Debug, thiserror::Error)]
#[error("control message: {0}")]
pub struct CodecError(#[from] bincode::Error);

pub fn encode(message: &ControlMessage) -> Result<Vec<u8>, CodecError> {
    Ok(options().serialize(message)?)
}

pub fn decode(bytes: &[u8]) -> Result<ControlMessage, CodecError> {
    Ok(options().deserialize(bytes)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Messages round-trip.
    #[test]
    fn round_trip() {
        let message = ControlMessage::Opened {
            handle: 3,
            info: OpenInfo {
                kind: "tokens:u16".into(),
                length_bytes: 10,
                content_hash: "ab".into(),
                chunk_size_bytes: 65536,
                replicas: vec!["http://127.0.0.1:7070".into()],
            },
        };
        assert_eq!(decode(&encode(&message).expect("encode")).expect("decode"), message);
    }

    /// A token inside an Open round-trips but never shows in Debug output.
    #[test]
    fn secrets_stay_out_of_debug() {
        let message = ControlMessage::Open { name: "a".into(), token: Some(Secret::new("sluice_topsecret".into())) };
        assert!(!format!("{message:?}").contains("topsecret"));
        assert_eq!(decode(&encode(&message).expect("encode")).expect("decode"), message);
    }

    proptest! {
        /// Arbitrary bytes decode to an error or a message, never a panic or
        /// a huge allocation.
        #[test]
        fn decode_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
            let _ = decode(&bytes);
        }
    }
}
