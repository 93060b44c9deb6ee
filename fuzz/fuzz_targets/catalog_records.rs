//! Catalog records and the sample index as stored on disk.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sluice_proto::api::DatasetRecord;
use sluice_proto::sample_index;

fuzz_target!(|data: &[u8]| {
    if let Ok(record) = serde_json::from_slice::<DatasetRecord>(data) {
        let again = serde_json::to_vec(&record).expect("encode");
        assert_eq!(serde_json::from_slice::<DatasetRecord>(&again).expect("round trip"), record);
    }
    if let Ok(entries) = sample_index::decode(data) {
        assert_eq!(sample_index::encode(&entries), data);
    }
});
