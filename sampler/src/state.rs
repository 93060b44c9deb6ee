//! The sampler state: everything needed to resume a sample sequence exactly,
//! in 92 bytes (or as JSON), bound to the dataset's content hash so it is
//! never resumed against other data.

use serde::{Deserialize, Serialize};

const MAGIC: &[u8; 4] = b"SLST";
const VERSION: u8 = 1;
/// Encoded size in bytes.
pub const STATE_BYTES: usize = 92;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SamplerKind {
    /// Windows of `window` tokens of `element_bytes` each over `domain_len`
    /// tokens.
    Window,
    /// Records of `element_bytes` each (`window` is 1) over `domain_len`
    /// records.
    Record,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SamplerState {
    /// `blake3:<64 hex>` of the dataset this sequence is over.
    pub content_hash: String,
    pub kind: SamplerKind,
    /// Bytes per token (windows) or per record.
    pub element_bytes: u32,
    /// Tokens (windows) or records in the dataset.
    pub domain_len: u64,
    /// Tokens per window (1 for records).
    pub window: u32,
    pub samples_per_epoch: u64,
    pub seed: u64,
    /// Samples per training step across all ranks.
    pub global_batch: u64,
    /// Epoch of `next_sample` (always `next_sample / samples_per_epoch`).
    pub epoch: u64,
    /// Global index of the next sample to read; a multiple of `global_batch`
    /// at step boundaries.
    pub next_sample: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum StateError {
    #[error("sampler state is {0} bytes, expected {STATE_BYTES}")]
    Length(usize),
    #[error("not a sluice sampler state (bad magic or version)")]
    Magic,
    #[error("sampler state checksum mismatch: the state is damaged")]
    Checksum,
    #[error("content hash {0:?} is not blake3:<64 hex digits>")]
    Hash(String),
    #[error("sampler state is inconsistent: {0}")]
    Inconsistent(&'static str),
    #[error("sampler state JSON: {0}")]
    Json(#[from] serde_json::Error),
}

fn hash_bytes(hash: &str) -> Result<[u8; 32], StateError> {
    // Lowercase only: the hash must compare equal to the node's, byte for byte.
    let hex = hash
        .strip_prefix("blake3:")
        .filter(|h| h.len() == 64 && h.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)))
        .ok_or_else(|| StateError::Hash(hash.into()))?;
    let mut out = [0u8; 32];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).map_err(|_| StateError::Hash(hash.into()))?;
    }
    Ok(out)
}

impl SamplerState {
    pub fn step(&self) -> u64 {
        self.next_sample / self.global_batch.max(1)
    }

    fn check(&self) -> Result<(), StateError> {
        hash_bytes(&self.content_hash)?;
        if self.samples_per_epoch == 0 || self.global_batch == 0 || self.window == 0 || self.element_bytes == 0 {
            return Err(StateError::Inconsistent("zero sizes"));
        }
        if self.epoch != self.next_sample / self.samples_per_epoch {
            return Err(StateError::Inconsistent("epoch does not match next_sample"));
        }
        if self.kind == SamplerKind::Record && self.window != 1 {
            return Err(StateError::Inconsistent("record samplers have window 1"));
        }
        Ok(())
    }

    /// The 92-byte little-endian form, with a CRC32C trailer.
    pub fn encode(&self) -> Result<Vec<u8>, StateError> {
        self.check()?;
        let mut out = Vec::with_capacity(STATE_BYTES);
        out.extend_from_slice(MAGIC);
        out.push(VERSION);
        out.push(match self.kind {
            SamplerKind::Window => 0,
            SamplerKind::Record => 1,
        });
        out.extend_from_slice(&[0, 0]);
        out.extend_from_slice(&hash_bytes(&self.content_hash)?);
        out.extend_from_slice(&self.element_bytes.to_le_bytes());
        out.extend_from_slice(&self.window.to_le_bytes());
        for v in [self.domain_len, self.samples_per_epoch, self.seed, self.global_batch, self.next_sample] {
            out.extend_from_slice(&v.to_le_bytes());
        }
        let crc = crc32c::crc32c(&out);
        out.extend_from_slice(&crc.to_le_bytes());
        assert_eq!(out.len(), STATE_BYTES);
        Ok(out)
    }

    pub fn decode(bytes: &[u8]) -> Result<Self, StateError> {
        if bytes.len() != STATE_BYTES {
            return Err(StateError::Length(bytes.len()));
        }
        if &bytes[..4] != MAGIC || bytes[4] != VERSION {
            return Err(StateError::Magic);
        }
        let (body, trailer) = bytes.split_at(STATE_BYTES - 4);
        if crc32c::crc32c(body) != u32::from_le_bytes(trailer.try_into().map_err(|_| StateError::Magic)?) {
            return Err(StateError::Checksum);
        }
        let kind = match bytes[5] {
            0 => SamplerKind::Window,
            1 => SamplerKind::Record,
            _ => return Err(StateError::Magic),
        };
        let u32_at = |at: usize| u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap_or([0; 4]));
        let u64_at = |at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap_or([0; 8]));
        let hex: String = bytes[8..40].iter().map(|b| format!("{b:02x}")).collect();
        let samples_per_epoch = u64_at(56);
        let next_sample = u64_at(80);
        let state = Self {
            content_hash: format!("blake3:{hex}"),
            kind,
            element_bytes: u32_at(40),
            window: u32_at(44),
            domain_len: u64_at(48),
            samples_per_epoch,
            seed: u64_at(64),
            global_batch: u64_at(72),
            epoch: next_sample.checked_div(samples_per_epoch).unwrap_or(0),
            next_sample,
        };
        state.check()?;
        Ok(state)
    }

    pub fn to_json(&self) -> Result<String, StateError> {
        self.check()?;
        Ok(serde_json::to_string_pretty(self)?)
    }

    pub fn from_json(text: &str) -> Result<Self, StateError> {
        let state: Self = serde_json::from_str(text)?;
        state.check()?;
        Ok(state)
    }

    /// Either form: binary if it starts with the magic, JSON otherwise.
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, StateError> {
        if bytes.starts_with(MAGIC) {
            Self::decode(bytes)
        } else {
            Self::from_json(std::str::from_utf8(bytes).map_err(|_| StateError::Magic)?)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn sample_state() -> SamplerState {
        SamplerState {
            content_hash: format!("blake3:{}", "ab".repeat(32)),
            kind: SamplerKind::Window,
            element_bytes: 2,
            domain_len: 10_000_000_000,
            window: 1024,
            samples_per_epoch: 9_765_625,
            seed: 42,
            global_batch: 512,
            epoch: 1,
            next_sample: 9_765_625 + 512 * 3,
        }
    }

    /// Binary and JSON forms round-trip; the binary form is 92 bytes.
    #[test]
    fn round_trips() {
        let state = sample_state();
        let bytes = state.encode().expect("encode");
        assert_eq!(bytes.len(), STATE_BYTES);
        assert_eq!(SamplerState::from_bytes(&bytes).expect("decode"), state);
        let json = state.to_json().expect("json");
        assert_eq!(SamplerState::from_bytes(json.as_bytes()).expect("from json"), state);
    }

    /// A flipped bit is caught.
    #[test]
    fn damage_is_detected() {
        let mut bytes = sample_state().encode().expect("encode");
        bytes[60] ^= 1;
        assert!(matches!(SamplerState::decode(&bytes), Err(StateError::Checksum)));
    }

    /// Found by fuzzing: an uppercase hex digit decoded, then encoded back
    /// lowercase, so the state no longer named its dataset's hash.
    #[test]
    fn hash_must_be_canonical() {
        let mut state = sample_state();
        state.content_hash = format!("blake3:{}C{}", "ab".repeat(10), "d".repeat(43));
        assert!(matches!(state.encode(), Err(StateError::Hash(_))));
        assert!(SamplerState::from_json(&serde_json::to_string(&state).expect("json")).is_err());
    }

    proptest! {
        /// Arbitrary bytes never panic the decoder.
        #[test]
        fn decode_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..120)) {
            let _ = SamplerState::from_bytes(&bytes);
            let mut framed = b"SLST\x01".to_vec();
            framed.extend_from_slice(&bytes);
            framed.resize(STATE_BYTES, 0);
            let _ = SamplerState::decode(&framed);
        }
    }
}
