//! The sample index of `records`, `wds` and `mds` datasets as stored and served:
//! one `(offset, len)` pair of little-endian u64s per sample. The node
//! writes it beside its catalog and serves it at
//! `/v1/datasets/{name}/index`; the client decodes it.

/// Bytes of one entry: offset then length, little-endian.
pub const ENTRY_BYTES: u64 = 16;

/// An index whose length is not a whole number of entries: cut short on
/// disk or on the wire.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("a sample index of {len} bytes is not a whole number of {ENTRY_BYTES}-byte entries")]
pub struct Truncated {
    pub len: usize,
}

/// The bytes of `entries`, in order.
pub fn encode(entries: &[(u64, u64)]) -> Vec<u8> {
    entries.iter().flat_map(|&(offset, len)| offset.to_le_bytes().into_iter().chain(len.to_le_bytes())).collect()
}

/// The entries of an index; refuses a length that would drop a partial
/// last entry rather than lose a sample without a word.
pub fn decode(bytes: &[u8]) -> Result<Vec<(u64, u64)>, Truncated> {
    let entry = ENTRY_BYTES as usize;
    if !bytes.len().is_multiple_of(entry) {
        return Err(Truncated { len: bytes.len() });
    }
    let word = |at: &[u8]| {
        let mut le = [0u8; 8];
        le.copy_from_slice(at);
        u64::from_le_bytes(le)
    };
    Ok(bytes.chunks_exact(entry).map(|e| (word(&e[..8]), word(&e[8..]))).collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_partial_last_entry_is_an_error_not_a_lost_sample() {
        let bytes = encode(&[(0, 10), (10, 20)]);
        assert_eq!(decode(&bytes[..31]), Err(Truncated { len: 31 }));
        assert_eq!(decode(&bytes), Ok(vec![(0, 10), (10, 20)]));
        assert_eq!(decode(&[]), Ok(vec![]));
    }

    proptest! {
        #[test]
        fn decode_inverts_encode(entries in proptest::collection::vec((any::<u64>(), any::<u64>()), 0..64)) {
            let bytes = encode(&entries);
            prop_assert_eq!(bytes.len() as u64, entries.len() as u64 * ENTRY_BYTES);
            prop_assert_eq!(decode(&bytes), Ok(entries));
        }
    }
}
