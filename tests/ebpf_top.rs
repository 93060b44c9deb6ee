//! `sluiced --ebpf` attaches the trace program to its own probes and
//! `sluicectl top --json --once` shows the traffic it saw (as root; skipped,
//! saying why, otherwise).

mod common;

use common::{random_file, sealed_dataset, NodeProcess};
use sluice_client::blocking::Client;
use sluice_client::ReadRange;

#[test]
fn top_shows_traced_batches() {
    if !nix::unistd::Uid::effective().is_root() {
        eprintln!("SKIP top_shows_traced_batches: sluiced --ebpf needs root to load BPF programs");
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let node = NodeProcess::start_with(&dir.path().join("node"), &["--ebpf"]);
    let snapshot: serde_json::Value = serde_json::from_str(&node.ctl_ok(&["top", "--json", "--once"])).expect("json");
    // As root the trace must attach; an unavailable trace is a failure, not a skip.
    assert_eq!(snapshot["available"], serde_json::Value::Bool(true), "eBPF did not attach: {}", snapshot["reason"]);
    random_file(&dir.path().join("data.bin"), 1 << 20, 1);
    sealed_dataset(&node, "traced", &[&dir.path().join("data.bin")]);
    let dataset = Client::connect(&node.endpoint).expect("connect").open("traced").expect("open");
    let mut buf = vec![0u8; 8 * 4096];
    for _ in 0..25 {
        let ranges: Vec<ReadRange> =
            (0..8u64).map(|i| ReadRange { offset: i * 10_000, len: 4096, dest: i * 4096 }).collect();
        dataset.read_batch(&ranges, &mut buf).expect("read");
    }
    let snapshot: serde_json::Value = serde_json::from_str(&node.ctl_ok(&["top", "--json", "--once"])).expect("json");
    let entry = snapshot["entries"]
        .as_array()
        .expect("entries")
        .iter()
        .find(|e| e["dataset"] == "traced")
        .unwrap_or_else(|| panic!("no entry for the dataset: {snapshot}"))
        .clone();
    assert_eq!(entry["lane"], "latency");
    assert_eq!(entry["batches"], 25);
    assert_eq!(entry["ranges"], 200);
    assert_eq!(entry["size_log2"][12], 200, "every range is 4 KiB");
    let table = node.ctl_ok(&["top", "--once"]);
    assert!(table.contains("traced") && table.contains("latency"), "{table}");
}
