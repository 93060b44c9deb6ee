//! The helper's messages, with no I/O: one request a datagram, one reply
//! a datagram, JSON-encoded and bounded. The reply to [`Request::Open`]
//! carries the opened device's two descriptors beside it (`SCM_RIGHTS`).
//!
//! A controller is named by its index in the list the helper was started
//! with, so the unprivileged side cannot name any other device.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};
use sluice_dataplane::NvmeNamespace;

/// The largest datagram either side sends or accepts: a reply listing a
/// controller's namespaces is the largest message (about 70 bytes a
/// namespace), and stays well under a Unix socket's default send buffer.
pub const MESSAGE_BYTES_MAX: usize = 128 << 10;

/// Descriptors a reply carries: the open device's control and O_DIRECT
/// descriptors.
pub const DESCRIPTORS_MAX: usize = 2;

/// What the node asks of the helper.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Request {
    /// Whether the helper is up and serving.
    Ping,
    ManagesNamespaces {
        controller: u16,
    },
    Create {
        controller: u16,
        bytes: u64,
    },
    Delete {
        controller: u16,
        nsid: u32,
    },
    Namespaces {
        controller: u16,
    },
    Identity {
        controller: u16,
        nsid: u32,
    },
    Attach {
        controller: u16,
        nsid: u32,
    },
    Detach {
        controller: u16,
        nsid: u32,
    },
    /// Open the attached namespace's block device exclusively; the reply
    /// is [`Reply::Opened`] with its descriptors.
    Open {
        controller: u16,
        nsid: u32,
    },
}

/// What the helper answers.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Reply {
    Done,
    Flag(bool),
    Nsid(u32),
    Namespaces(Vec<NvmeNamespace>),
    Identity(String),
    /// The device opened; its control and O_DIRECT descriptors ride along,
    /// in that order.
    Opened {
        path: PathBuf,
        capacity_bytes: u64,
    },
    /// The command failed or was refused, and why.
    Failed(String),
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ProtoError {
    #[error("a message of {0} bytes is over the {MESSAGE_BYTES_MAX}-byte limit")]
    TooLarge(usize),
    #[error("malformed message: {0}")]
    Malformed(String),
}

pub fn encode<T: Serialize>(message: &T) -> Result<Vec<u8>, ProtoError> {
    let bytes = serde_json::to_vec(message).map_err(|e| ProtoError::Malformed(e.to_string()))?;
    if bytes.len() > MESSAGE_BYTES_MAX {
        return Err(ProtoError::TooLarge(bytes.len()));
    }
    Ok(bytes)
}

pub fn decode<'a, T: Deserialize<'a>>(bytes: &'a [u8]) -> Result<T, ProtoError> {
    if bytes.len() > MESSAGE_BYTES_MAX {
        return Err(ProtoError::TooLarge(bytes.len()));
    }
    serde_json::from_slice(bytes).map_err(|e| ProtoError::Malformed(e.to_string()))
}

impl Request {
    /// The controller index the request names, if it names one.
    pub fn controller(&self) -> Option<u16> {
        match *self {
            Self::Ping => None,
            Self::ManagesNamespaces { controller }
            | Self::Create { controller, .. }
            | Self::Delete { controller, .. }
            | Self::Namespaces { controller }
            | Self::Identity { controller, .. }
            | Self::Attach { controller, .. }
            | Self::Detach { controller, .. }
            | Self::Open { controller, .. } => Some(controller),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_and_replies_round_trip() {
        let requests = [
            Request::Ping,
            Request::Create { controller: 1, bytes: 1 << 30 },
            Request::Open { controller: 0, nsid: 7 },
        ];
        for request in requests {
            let bytes = encode(&request).expect("encode");
            assert_eq!(decode::<Request>(&bytes), Ok(request));
        }
        let reply =
            Reply::Namespaces(vec![NvmeNamespace { nsid: 3, attached: false, capacity_bytes: 64 << 20, shared: true }]);
        assert_eq!(decode::<Reply>(&encode(&reply).expect("encode")), Ok(reply));
    }

    /// A full controller's namespace list (1,024, Identify's limit) fits.
    #[test]
    fn the_largest_namespace_list_fits_in_a_message() {
        let all = (1..=1024)
            .map(|nsid| NvmeNamespace {
                nsid: u32::MAX - nsid,
                attached: true,
                capacity_bytes: u64::MAX,
                shared: false,
            })
            .collect();
        let bytes = encode(&Reply::Namespaces(all)).expect("fits");
        assert!(bytes.len() <= MESSAGE_BYTES_MAX);
    }

    #[test]
    fn malformed_and_oversized_messages_are_errors() {
        assert!(matches!(decode::<Request>(b"{\"Open\":{\"controller\":-1}}"), Err(ProtoError::Malformed(_))));
        assert!(matches!(decode::<Request>(b"\xff\xfe"), Err(ProtoError::Malformed(_))));
        assert!(matches!(decode::<Request>(b""), Err(ProtoError::Malformed(_))));
        let huge = vec![b' '; MESSAGE_BYTES_MAX + 1];
        assert_eq!(decode::<Request>(&huge), Err(ProtoError::TooLarge(MESSAGE_BYTES_MAX + 1)));
        let oversized = encode(&Reply::Identity("x".repeat(MESSAGE_BYTES_MAX)));
        assert!(matches!(oversized, Err(ProtoError::TooLarge(n)) if n > MESSAGE_BYTES_MAX), "{oversized:?}");
    }
}
