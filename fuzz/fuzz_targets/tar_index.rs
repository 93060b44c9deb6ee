//! WebDataset tar indexing as bytes stream in (in two pieces at a
//! fuzzer-chosen split), and splitting a span back into members: the
//! splitter must find in every indexed span the members the indexer
//! counted, under the indexer's key.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sluice_proto::tar::{keyed_members, members, TarIndexer};

fuzz_target!(|data: &[u8]| {
    let split = data.first().map_or(0, |b| usize::from(*b) * 7).min(data.len());
    let mut indexer = TarIndexer::new();
    if indexer.push(&data[..split]).is_ok() && indexer.push(&data[split..]).is_ok() {
        if let Ok(spans) = indexer.finish() {
            for span in spans {
                assert!(span.offset_bytes + span.len_bytes <= data.len() as u64);
                let bytes = &data[span.offset_bytes as usize..(span.offset_bytes + span.len_bytes) as usize];
                let split = keyed_members(bytes).expect("an indexed span splits");
                assert_eq!(split.len(), span.members as usize, "members of {:?}", span.key);
                assert!(split.iter().all(|(key, _, _)| *key == span.key), "keys in {:?}", span.key);
            }
        }
    }
    let _ = members(data);
});
