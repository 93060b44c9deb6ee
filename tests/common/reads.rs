//! Reading a dataset back in the tests of source-backed datasets: random
//! data, batches of ranges, and checks that each came back exact.

use rand::{Rng, SeedableRng};
use sluice_client::blocking::Dataset;
use sluice_client::{RangeStatus, ReadRange};

use super::NodeProcess;

/// `len` random bytes, the same for the same `seed`.
pub fn bytes_of(len: usize, seed: u64) -> Vec<u8> {
    let mut rng = rand::rngs::SmallRng::seed_from_u64(seed);
    let mut data = vec![0u8; len];
    rng.fill(&mut data[..]);
    data
}

/// Reads `ranges` and gives each one's status and bytes.
pub fn read(dataset: &Dataset, ranges: &[(u64, u32)]) -> Vec<(RangeStatus, Vec<u8>)> {
    let mut dest = 0;
    let batch: Vec<ReadRange> = ranges
        .iter()
        .map(|&(offset, len)| {
            let range = ReadRange { offset, len, dest };
            dest += u64::from(len);
            range
        })
        .collect();
    let mut buf = vec![0u8; dest as usize];
    let statuses = dataset.read_batch(&batch, &mut buf).expect("batch");
    batch
        .iter()
        .zip(statuses)
        .map(|(r, s)| (s, buf[r.dest as usize..(r.dest + u64::from(r.len)) as usize].to_vec()))
        .collect()
}

/// `count` ranges of 1 to 100 000 bytes at random places in `len` bytes.
pub fn random_ranges(rng: &mut impl Rng, len: usize, count: usize) -> Vec<(u64, u32)> {
    (0..count)
        .map(|_| {
            let size = rng.gen_range(1..=100_000u32).min(len as u32);
            (rng.gen_range(0..=(len - size as usize) as u64), size)
        })
        .collect()
}

/// Every range came back whole and equal to `expected`'s bytes there.
pub fn assert_exact(expected: &[u8], ranges: &[(u64, u32)], got: &[(RangeStatus, Vec<u8>)]) {
    for (&(offset, len), (status, bytes)) in ranges.iter().zip(got) {
        assert_eq!(*status, RangeStatus::Ok, "{len} bytes at {offset}");
        assert!(bytes[..] == expected[offset as usize..offset as usize + len as usize], "{len} bytes at {offset}");
    }
}

/// `sluicectl dataset stat NAME`, as JSON.
pub fn stat(node: &NodeProcess, name: &str) -> serde_json::Value {
    serde_json::from_str(&node.ctl_ok(&["--json", "dataset", "stat", name])).expect("stat json")
}
