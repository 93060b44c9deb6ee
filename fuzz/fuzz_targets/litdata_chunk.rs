//! LitData token datasets from untrusted sources: `index.json` parsing, and
//! a chunk's header checked against an index entry. An accepted header
//! promises token bytes that end the chunk, in whole tokens, after the
//! header the entry sizes.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sluice_proto::litdata::{ChunkEntry, TokenIndex};

fuzz_target!(|data: &[u8]| {
    let Some((&selector, rest)) = data.split_first() else { return };
    if selector & 1 == 0 {
        if let Ok(index) = TokenIndex::parse(rest) {
            assert!(index.token_bytes == 2 || index.token_bytes == 4);
            assert!(index.chunks.iter().all(|c| !c.filename.contains('/') && c.filename != ".."));
        }
        return;
    }
    // The entry is read from the chunk's own count, sometimes off by one.
    let items = rest.get(..4).map_or(0, |b| u64::from(u32::from_le_bytes([b[0], b[1], b[2], b[3]])));
    let items = items + u64::from(selector >> 7);
    let token_bytes = if selector & 2 == 0 { 2 } else { 4 };
    let tokens = (selector & 4 != 0).then(|| (rest.len() as u64).saturating_sub(4 + 4 * (items + 1)) / token_bytes);
    let entry = ChunkEntry { items, filename: "c.bin".into(), tokens };
    let header_end = entry.header_bytes().min(rest.len() as u64) as usize;
    if let Ok(data_bytes) = entry.check_header(&rest[..header_end], rest.len() as u64, token_bytes) {
        assert_eq!(entry.header_bytes() + data_bytes, rest.len() as u64);
        assert_eq!(data_bytes % token_bytes, 0);
    }
});
