//! Crash safety: 50 runs of SIGKILL at random points of create, ingest,
//! seal and delete. After every restart the catalog is consistent, every
//! sealed dataset reads back byte-exact and scrubs clean, half-done
//! operations are completed or rolled back, and no space leaks.

mod common;

use std::collections::HashSet;
use std::time::Duration;

use common::NodeProcess;
use rand::{Rng, SeedableRng};
use sluice_client::blocking::Client;
use sluice_client::{RangeStatus, ReadRange};

/// Every file ingested is this long (odd on purpose).
const FILE_BYTES: usize = (1 << 20) + 123;
const RUNS: u64 = 50;

fn file_bytes(dataset: u64, index: u64) -> Vec<u8> {
    let mut rng = rand::rngs::SmallRng::seed_from_u64(dataset * 1000 + index);
    let mut data = vec![0u8; FILE_BYTES];
    rng.fill(&mut data[..]);
    data
}

/// A random mix of operations against the node until it is killed.
fn workload(endpoint: String, run: u64) {
    let mut rng = rand::rngs::SmallRng::seed_from_u64(run);
    let api = |path: &str| format!("{endpoint}{path}");
    for step in 0..20u64 {
        let id = run * 100 + step;
        let name = format!("d{id}");
        let body = serde_json::json!({"name": name, "kind": "bytes"});
        if ureq::post(&api("/v1/datasets")).send_json(body).is_err() {
            return;
        }
        for index in 0..rng.gen_range(1..=3) {
            let url = api(&format!("/v1/datasets/{name}/ingest"));
            if ureq::post(&url).send_bytes(&file_bytes(id, index)).is_err() {
                return;
            }
        }
        if rng.gen_bool(0.7) && ureq::post(&api(&format!("/v1/datasets/{name}/seal"))).call().is_err() {
            return;
        }
        if rng.gen_bool(0.3) {
            let victim = format!("d{}", rng.gen_range(run.saturating_sub(3) * 100..=id));
            let _ = ureq::delete(&api(&format!("/v1/datasets/{victim}"))).call();
        }
    }
}

/// Checks every invariant a restarted node must hold; reads back the
/// content of sealed datasets made since run `since` (all, at the end).
fn check_invariants(node: &NodeProcess, since: u64) {
    let records: serde_json::Value = serde_json::from_str(&node.ctl_ok(&["dataset", "ls", "--json"])).expect("json");
    let client = Client::connect(&node.endpoint).expect("connect");
    let mut expected_files = HashSet::new();
    let mut expected_bytes = 0u64;
    for record in records.as_array().expect("array") {
        let name = record["name"].as_str().expect("name");
        let id: u64 = name[1..].parse().expect("numbered name");
        let state = record["state"].as_str().expect("state");
        let length = record["length_bytes"].as_u64().expect("length");
        assert_ne!(state, "deleting", "{name}: interrupted deletes complete at start");
        assert_eq!(length % FILE_BYTES as u64, 0, "{name}: only whole files are committed");
        assert_eq!(record["files_ingested"].as_u64(), Some(length / FILE_BYTES as u64), "{name}");
        let path = record["namespace"]["path"].as_str().expect("path").to_string();
        let on_disk = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
        assert_eq!(on_disk, length.next_multiple_of(4096), "{name}: namespace holds exactly the committed bytes");
        expected_bytes += on_disk;
        expected_files.insert(path);
        if state == "sealed" && id >= since * 100 {
            let dataset = client.open(name).expect("open sealed");
            let mut buf = vec![0u8; length as usize];
            let ranges: Vec<ReadRange> = (0..length / FILE_BYTES as u64)
                .map(|i| ReadRange {
                    offset: i * FILE_BYTES as u64,
                    len: FILE_BYTES as u32,
                    dest: i * FILE_BYTES as u64,
                })
                .collect();
            let statuses = dataset.read_batch(&ranges, &mut buf).expect("read");
            assert!(statuses.iter().all(|s| *s == RangeStatus::Ok), "{name}: {statuses:?}");
            for (i, piece) in buf.chunks(FILE_BYTES).enumerate() {
                assert!(piece == file_bytes(id, i as u64).as_slice(), "{name}: file {i} differs");
            }
            node.ctl_ok(&["scrub", name]);
        } else if state != "sealed" {
            assert!(client.open(name).is_err(), "{name}: an unsealed dataset is never served");
        }
    }
    let dir = node.data_dir.join("namespaces");
    let files: HashSet<String> =
        std::fs::read_dir(&dir).expect("namespaces").flatten().map(|e| e.path().display().to_string()).collect();
    assert_eq!(files, expected_files, "no orphaned namespace files");
    let used: u64 = files.iter().map(|f| std::fs::metadata(f).map(|m| m.len()).unwrap_or(0)).sum();
    assert_eq!(used, expected_bytes, "no space leaks");
}

#[test]
fn sigkill_at_random_points_never_breaks_the_catalog() {
    let dir = tempfile::tempdir().expect("tempdir");
    let node_dir = dir.path().join("node");
    let mut rng = rand::rngs::SmallRng::seed_from_u64(2026);
    for run in 0..RUNS {
        let mut node = NodeProcess::start(&node_dir);
        check_invariants(&node, run.saturating_sub(1));
        let endpoint = node.endpoint.clone();
        let worker = std::thread::spawn(move || workload(endpoint, run));
        std::thread::sleep(Duration::from_millis(rng.gen_range(0..400)));
        node.kill();
        worker.join().expect("workload thread");
    }
    let node = NodeProcess::start(&node_dir);
    check_invariants(&node, 0);
    let records: serde_json::Value = serde_json::from_str(&node.ctl_ok(&["dataset", "ls", "--json"])).expect("json");
    let sealed_seen = records.as_array().map_or(0, |r| r.iter().filter(|r| r["state"] == "sealed").count());
    eprintln!(
        "crash loop: {RUNS} SIGKILLs; {} datasets survive, {sealed_seen} sealed and byte-exact",
        records.as_array().map_or(0, |r| r.len())
    );
    assert!(sealed_seen > 0, "the workload got as far as sealing");
}
