//! `.npy` headers from untrusted uploads.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sluice_proto::npy;

fuzz_target!(|data: &[u8]| {
    if let Ok(header) = npy::parse_header(data) {
        assert!(header.data_offset_bytes <= npy::HEADER_BYTES_MAX);
        let _ = header.data_len_bytes();
    }
});
