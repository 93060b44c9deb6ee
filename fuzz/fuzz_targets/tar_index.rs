//! WebDataset tar indexing as bytes stream in (in two pieces at a
//! fuzzer-chosen split), and splitting a span back into members.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sluice_proto::tar::{members, TarIndexer};

fuzz_target!(|data: &[u8]| {
    let split = data.first().map_or(0, |b| usize::from(*b) * 7).min(data.len());
    let mut indexer = TarIndexer::new();
    if indexer.push(&data[..split]).is_ok() && indexer.push(&data[split..]).is_ok() {
        if let Ok(spans) = indexer.finish() {
            for span in spans {
                assert!(span.offset_bytes + span.len_bytes <= data.len() as u64);
                let bytes = &data[span.offset_bytes as usize..(span.offset_bytes + span.len_bytes) as usize];
                let _ = members(bytes);
            }
        }
    }
    let _ = members(data);
});
