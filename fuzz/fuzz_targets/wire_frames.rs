//! Hot-path frame decoding: headers in both directions, batch requests (TCP
//! and RDMA, with the RDMA destination check).
#![no_main]

use libfuzzer_sys::fuzz_target;
use sluice_proto::wire;

fuzz_target!(|data: &[u8]| {
    if let Some(head) = data.get(..wire::FrameHeader::SIZE) {
        let head: [u8; wire::FrameHeader::SIZE] = head.try_into().expect("16 bytes");
        let _ = wire::parse_frame_header(&head, false);
        let _ = wire::parse_frame_header(&head, true);
    }
    if let Ok((header, ranges)) = wire::parse_batch_request(data) {
        assert_eq!(header.range_count.get() as usize, ranges.len());
    }
    if let Ok((header, ranges)) = wire::parse_rdma_batch_request(data) {
        assert_eq!(header.range_count.get() as usize, ranges.len());
        if wire::destinations_fit(header, ranges) {
            let buffer = header.remote_len.get();
            assert!(ranges.iter().all(|r| r.dest.get() + u64::from(r.len.get()) <= buffer));
        }
    }
});
