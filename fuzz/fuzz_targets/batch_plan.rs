//! The batch planner on arbitrary ranges and geometries: every in-bounds
//! range is covered by its pieces exactly, nothing panics.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sluice_dataplane::plan::{plan_batch, PlanGeometry};
use sluice_dataplane::ByteRange;
use sluice_proto::RangeStatus;

fuzz_target!(|data: &[u8]| {
    if data.len() < 10 {
        return;
    }
    let length_bytes = u64::from(u32::from_le_bytes([data[0], data[1], data[2], data[3]]));
    let block_size_bytes = 512u32 << (data[4] % 4);
    let widen_to_bytes = if data[5] & 1 == 1 { 65_536 } else { 0 };
    let ranges: Vec<ByteRange> = data[6..]
        .chunks_exact(12)
        .map(|c| ByteRange {
            offset_bytes: u64::from_le_bytes(c[..8].try_into().expect("8 bytes")) % (length_bytes + 100).max(1),
            len_bytes: u32::from_le_bytes(c[8..].try_into().expect("4 bytes")) % (8 << 20),
        })
        .collect();
    let geometry = PlanGeometry {
        block_size_bytes,
        unit_bytes_max: 128 * 1024,
        base_offset_bytes: 0,
        length_bytes,
        widen_to_bytes,
    };
    let plan = plan_batch(&ranges, geometry);
    for (i, range) in ranges.iter().enumerate() {
        let covered: u64 = plan.pieces_of(i).iter().map(|p| u64::from(p.len_bytes)).sum();
        if plan.statuses()[i] == RangeStatus::Ok {
            assert_eq!(covered, u64::from(range.len_bytes));
        } else {
            assert_eq!(covered, 0);
        }
    }
});
