//! Mosaic Data Shards from untrusted uploads and sources, indexed as their
//! bytes stream in (in two pieces at a fuzzer-chosen split): every sample
//! span lies after the header and inside the shard, the spans tile the
//! shard's data in order, the split changes nothing, and a reader that
//! fetches only the header (`header_bytes_wanted`, then `finish_at`) gets
//! the same spans.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sluice_proto::mds::{MdsError, MdsIndexer};

/// Pushes `data` in two pieces split at `split`; the spans or the error.
fn streamed(data: &[u8], split: usize) -> Result<Vec<(u64, u64)>, MdsError> {
    let mut indexer = MdsIndexer::new(None);
    indexer.push(&data[..split])?;
    indexer.push(&data[split..])?;
    indexer.finish()
}

/// Fetches only what `header_bytes_wanted` asks for, as a reader that
/// seeks does, then ends the shard at its full length.
fn header_only(data: &[u8]) -> Result<Vec<(u64, u64)>, MdsError> {
    let mut indexer = MdsIndexer::new(None);
    let mut at = 0usize;
    loop {
        let wanted = indexer.header_bytes_wanted()?;
        if wanted == 0 || at == data.len() {
            break;
        }
        let take = usize::try_from(wanted).unwrap_or(usize::MAX).min(data.len() - at);
        indexer.push(&data[at..at + take])?;
        at += take;
    }
    indexer.finish_at(data.len() as u64)
}

fuzz_target!(|data: &[u8]| {
    let split = data.first().map_or(0, |b| usize::from(*b) * 13).min(data.len());
    let whole = streamed(data, data.len());
    assert_eq!(whole, streamed(data, split), "split at {split}");
    assert_eq!(whole, header_only(data), "header-only read");
    if let Ok(spans) = whole {
        let count = u64::from(u32::from_le_bytes(data[..4].try_into().expect("a parsed shard has a count")));
        assert_eq!(spans.len() as u64, count);
        let header_end = 4 + 4 * (count + 1);
        let mut next = spans.first().map_or(data.len() as u64, |&(offset, _)| offset);
        assert!(next >= header_end, "the first sample starts inside the offsets");
        for &(offset, len) in &spans {
            assert_eq!(offset, next, "spans tile the data");
            next = offset + len;
        }
        assert_eq!(next, data.len() as u64, "the last span ends the shard");
    }
});
