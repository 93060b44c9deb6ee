//! Hex text for digests, tokens and ids, written and read in one place.

use rand::RngCore;

/// Lower-case hex of `bytes`.
pub fn encode(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A 32-byte digest from exactly 64 hex digits.
pub fn decode_32(text: &str) -> Option<[u8; 32]> {
    if text.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(text.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

/// Hex of `N` fresh bytes from the OS.
pub fn random<const N: usize>() -> String {
    let mut bytes = [0u8; N];
    rand::rngs::OsRng.fill_bytes(&mut bytes);
    encode(&bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digests_round_trip_and_bad_text_is_refused() {
        let digest = [0xabu8; 32];
        assert_eq!(decode_32(&encode(&digest)), Some(digest));
        assert_eq!(decode_32("ab"), None);
        assert_eq!(decode_32(&"zz".repeat(32)), None);
        assert_eq!(random::<16>().len(), 32);
        assert_ne!(random::<16>(), random::<16>());
    }
}
