//! Injected I/O errors, latency spikes and silent corruption fail exactly
//! the ranges they touch, with the right status; other ranges and other
//! clients are unaffected, nothing panics, and `sluicectl scrub` names the
//! bad chunks.

mod common;

use std::time::{Duration, Instant};

use common::{random_file, sealed_dataset, NodeProcess};
use sluice_client::blocking::Client;
use sluice_client::{RangeStatus, ReadRange};

const MIB: u64 = 1 << 20;

fn faulty_node(dir: &std::path::Path, verify_all: bool) -> (NodeProcess, Vec<u8>) {
    let config = dir.join("node.toml");
    std::fs::write(
        &config,
        format!(
            "verify_all_reads = {verify_all}\n[faults]\nio_errors = [[{}, {}]]\ncorruptions = [[{}, {}]]\ndelays = [[{}, {}, 300]]\n",
            MIB,
            MIB + 4096,
            3 * MIB + 100,
            3 * MIB + 101,
            5 * MIB,
            5 * MIB + 4096
        ),
    )
    .expect("write config");
    let node = NodeProcess::start_with(&dir.join("node"), &["--config", config.to_str().expect("p")]);
    let data = random_file(&dir.join("data.bin"), 8 << 20, 3);
    sealed_dataset(&node, "data", &[&dir.join("data.bin")]);
    (node, data)
}

/// Each fault fails only its range, with the status that names it.
#[test]
fn faults_fail_only_the_ranges_they_touch() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (node, data) = faulty_node(dir.path(), false);
    let client = Client::connect(&node.endpoint).expect("connect");
    let dataset = client.open("data").expect("open");
    let ranges = [
        ReadRange { offset: 0, len: 4096, dest: 0 },
        ReadRange { offset: MIB + 100, len: 10, dest: 4096 },
        ReadRange { offset: 3 * MIB, len: 65_536, dest: 8192 },
        ReadRange { offset: 5 * MIB, len: 4096, dest: 8192 + 65_536 },
        ReadRange { offset: 7 * MIB, len: MIB as u32, dest: 12_288 + 65_536 },
    ];
    let mut buf = vec![0u8; 12_288 + 65_536 + MIB as usize];
    let started = Instant::now();
    let statuses = dataset.read_batch(&ranges, &mut buf).expect("batch");
    assert!(started.elapsed() >= Duration::from_millis(300), "the delayed read held the batch");
    use RangeStatus::*;
    assert_eq!(statuses, [Ok, IoError, ChecksumMismatch, Ok, Ok]);
    for i in [0, 3, 4] {
        let r = ranges[i];
        let want = &data[r.offset as usize..(r.offset + u64::from(r.len)) as usize];
        assert!(&buf[r.dest as usize..r.dest as usize + r.len as usize] == want, "range {i}");
    }

    // Another client reading clean ranges is unaffected, then and after.
    let other = Client::connect(&node.endpoint).expect("connect").open("data").expect("open");
    let mut small = vec![0u8; 4096];
    for offset in [2 * MIB, 6 * MIB, 4 * MIB + 1] {
        let statuses = other.read_batch(&[ReadRange { offset, len: 4096, dest: 0 }], &mut small).expect("read");
        assert_eq!(statuses, [Ok]);
        assert!(small == data[offset as usize..offset as usize + 4096]);
    }

    let out = node.ctl(&["scrub", "data", "--json"]);
    assert!(!out.status.success(), "scrub exits 1 when it finds bad chunks");
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(report["chunks"], 128);
    assert_eq!(report["bad_chunks"], serde_json::json!([[16, "I/O error"], [48, "checksum mismatch"]]));
}

/// With every read widened to whole chunks, even a 10-byte read of a
/// corrupted chunk is caught; many small ranges still fit the limits the
/// node announces.
#[test]
fn verify_all_reads_catches_small_reads_of_corrupt_chunks() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (node, data) = faulty_node(dir.path(), true);
    let client = Client::connect(&node.endpoint).expect("connect");
    let dataset = client.open("data").expect("open");
    let mut ranges = vec![ReadRange { offset: 3 * MIB + 90, len: 20, dest: 0 }];
    for i in 1..600u64 {
        ranges.push(ReadRange { offset: (i * 7919 * 13) % (2 * MIB), len: 20, dest: i * 20 });
    }
    let mut buf = vec![0u8; 600 * 20];
    let statuses = dataset.read_batch(&ranges, &mut buf).expect("batch");
    assert_eq!(statuses[0], RangeStatus::ChecksumMismatch);
    let mut failed = 0;
    for (i, r) in ranges.iter().enumerate().skip(1) {
        if r.offset < MIB + 4096 && MIB < r.offset + 20 {
            assert_eq!(statuses[i], RangeStatus::IoError, "range {i} reads the bad block");
            failed += 1;
            continue;
        }
        assert_eq!(statuses[i], RangeStatus::Ok, "range {i}");
        assert!(buf[r.dest as usize..r.dest as usize + 20] == data[r.offset as usize..r.offset as usize + 20]);
    }
    assert!(failed < 5, "only ranges on the bad block fail");
}

/// One byte flipped in a sealed dataset's namespace file, under the
/// default config: every read that touches its 4 KiB block fails as a
/// checksum mismatch, however small (no chunk-sized read is needed to
/// catch it), and the bytes around it are still served exactly.
#[test]
fn a_flipped_byte_fails_every_read_of_its_block() {
    use std::os::unix::fs::FileExt;
    let dir = tempfile::tempdir().expect("tempdir");
    let node = NodeProcess::start(&dir.path().join("node"));
    let data = random_file(&dir.path().join("data.bin"), 2 << 20, 11);
    sealed_dataset(&node, "data", &[&dir.path().join("data.bin")]);
    let stat: serde_json::Value =
        serde_json::from_str(&node.ctl_ok(&["--json", "dataset", "stat", "data"])).expect("stat json");
    let path = stat["namespace"]["path"].as_str().expect("namespace path").to_string();
    let base = stat["namespace"]["base_offset_bytes"].as_u64().expect("base");
    let client = Client::connect(&node.endpoint).expect("connect");
    let dataset = client.open("data").expect("open");
    let block = 300 * 4096u64;
    let read = |offset: u64, len: u32| {
        let mut buf = vec![0u8; len as usize];
        let statuses = dataset.read_batch(&[ReadRange { offset, len, dest: 0 }], &mut buf).expect("batch");
        (statuses[0], buf)
    };
    assert_eq!(read(block, 4096).0, RangeStatus::Ok, "served before the flip");

    let flipped = block + 1234;
    let file = std::fs::OpenOptions::new().write(true).open(&path).expect("open the namespace file");
    file.write_at(&[!data[flipped as usize]], base + flipped).expect("flip a byte");
    file.sync_all().expect("sync");
    drop(file);

    for (offset, len) in [(block, 4096), (flipped, 1), (block + 4000, 96), (block - 100, 200)] {
        assert_eq!(read(offset, len).0, RangeStatus::ChecksumMismatch, "{len} bytes at {offset}");
    }
    for (offset, len) in [(block - 4096, 4096), (block + 4096, 4096), (block - 10, 10), (block + 4096, 70_000)] {
        let (status, bytes) = read(offset, len);
        assert_eq!(status, RangeStatus::Ok, "{len} bytes at {offset}");
        assert!(bytes == data[offset as usize..offset as usize + len as usize], "{len} bytes at {offset}");
    }
    let scrub = node.ctl(&["--json", "scrub", "data"]);
    assert!(!scrub.status.success(), "scrub finds the flipped chunk");
    assert!(String::from_utf8_lossy(&scrub.stdout).contains(&format!("{}", flipped / 65_536)));
}
