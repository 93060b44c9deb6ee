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

fn trace_batches(node: &NodeProcess, dataset: &str, lane: &str) -> u64 {
    let snapshot: serde_json::Value = serde_json::from_str(&node.ctl_ok(&["top", "--json", "--once"])).expect("json");
    snapshot["entries"]
        .as_array()
        .expect("entries")
        .iter()
        .find(|e| e["dataset"] == dataset && e["lane"] == lane)
        .map_or(0, |e| e["batches"].as_u64().expect("batches"))
}

fn policy(node: &NodeProcess) -> serde_json::Value {
    serde_json::from_str(&node.ctl_ok(&["--json", "policy", "show"])).expect("json")
}

/// `sluiced --ebpf` steers with the default policy: a client reading many
/// small ranges (800 KiB batches, over the size threshold) is served in the
/// latency lane from its second batch, and its next connection lands on
/// the latency-lane workers. `sluicectl policy load` swaps the policy
/// without a restart, refuses a file that is no policy (keeping the one
/// attached), and `policy unload` hands lanes back to the threshold. The
/// kernel-side io_uring latency shows beside the probes' view.
#[test]
fn steering_follows_the_policy_and_swaps_at_run_time() {
    if !nix::unistd::Uid::effective().is_root() {
        eprintln!("SKIP steering_follows_the_policy_and_swaps_at_run_time: sluiced --ebpf needs root");
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let node = NodeProcess::start_with(&dir.path().join("node"), &["--ebpf", "--policy-load"]);
    let shown = policy(&node);
    assert_eq!(shown["available"], true, "steering did not start as root: {shown}");
    assert_eq!(shown["policy"]["name"], "default");
    random_file(&dir.path().join("data.bin"), 4 << 20, 2);
    sealed_dataset(&node, "steered", &[&dir.path().join("data.bin")]);

    let small_batch = |count: u64, seed: u64| -> Vec<ReadRange> {
        (0..count)
            .map(|i| ReadRange { offset: ((seed * count + i) * 8192) % (4 << 20), len: 4096, dest: i * 4096 })
            .collect()
    };
    let mut buf = vec![0u8; 200 * 4096];
    let first = Client::connect(&node.endpoint).expect("connect").open("steered").expect("open");
    for seed in 0..20 {
        first.read_batch(&small_batch(200, seed), &mut buf).expect("read");
    }
    assert_eq!(trace_batches(&node, "steered", "bulk"), 1, "the first batch, before any decision");
    assert_eq!(trace_batches(&node, "steered", "latency"), 19);
    let shown = policy(&node);
    assert_eq!(shown["flows"]["latency"], 1, "{shown}");
    assert_eq!(shown["connections"]["bulk_workers"], 1, "an unknown peer's connection: {shown}");

    let second = Client::connect(&node.endpoint).expect("connect").open("steered").expect("open");
    second.read_batch(&small_batch(8, 0), &mut buf).expect("read");
    let shown = policy(&node);
    assert_eq!(shown["connections"]["latency_workers"], 1, "a small-reader's next connection: {shown}");
    assert_eq!(shown["flows"]["open"], 2, "one flow per dataset opened on a connection: {shown}");

    let all_bulk = concat!(env!("CARGO_MANIFEST_DIR"), "/ebpf/bpf/all_bulk.bpf.o");
    let loaded = node.ctl_ok(&["policy", "load", all_bulk]);
    assert!(loaded.contains("all_bulk.bpf.o attached"), "{loaded}");
    for seed in 0..5 {
        first.read_batch(&small_batch(100, seed), &mut buf).expect("read");
    }
    // One more batch on the old decision, then bulk.
    assert_eq!(trace_batches(&node, "steered", "latency"), 19 + 1 + 1);
    assert_eq!(trace_batches(&node, "steered", "bulk"), 1 + 4);

    let refused = node.ctl(&["policy", "load", "/etc/hostname"]);
    assert!(!refused.status.success(), "a non-BPF file was accepted");
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(stderr.contains("bad_policy"), "{stderr}");
    assert_eq!(policy(&node)["policy"]["name"], "all_bulk.bpf.o");

    // Hostile objects are refused with the reason before anything reaches
    // the kernel, and the running policy keeps deciding.
    let swaps = policy(&node)["swaps"].clone();
    for (name, reason) in [
        ("kprobe", "a (non-sleepable) uprobe"),
        ("tracepoint", "a (non-sleepable) uprobe"),
        ("write_user", "bpf_probe_write_user"),
        ("read_kernel", "bpf_probe_read_kernel"),
        ("extra_map", "map `exfil`"),
        ("pinned_map", "pinned by name"),
    ] {
        let Some(object) = common::hostile_policy(name, dir.path()) else { return };
        let refused = node.ctl(&["policy", "load", object.to_str().expect("utf-8 path")]);
        let stderr = String::from_utf8_lossy(&refused.stderr);
        assert!(
            !refused.status.success() && stderr.contains("bad_policy") && stderr.contains(reason),
            "{name}: {stderr}"
        );
        assert_eq!(policy(&node)["policy"]["name"], "all_bulk.bpf.o", "{name} replaced the policy");
    }
    assert_eq!(policy(&node)["swaps"], swaps, "no refused object counted as a swap");
    first.read_batch(&small_batch(100, 7), &mut buf).expect("read");
    assert_eq!(trace_batches(&node, "steered", "bulk"), 1 + 4 + 1, "all_bulk still decides after the refusals");

    let unloaded = node.ctl_ok(&["policy", "unload"]);
    assert!(unloaded.contains("all_bulk.bpf.o detached"), "{unloaded}");
    assert_eq!(policy(&node)["policy"], serde_json::Value::Null);
    first.read_batch(&small_batch(100, 9), &mut buf).expect("read");
    assert_eq!(trace_batches(&node, "steered", "latency"), 22, "400 KiB batches: latency by size");

    let snapshot: serde_json::Value = serde_json::from_str(&node.ctl_ok(&["top", "--json", "--once"])).expect("json");
    let kernel = &snapshot["kernel"];
    assert_eq!(kernel["available"], true, "io_uring tracepoints: {kernel}");
    assert!(kernel["requests"].as_u64().expect("requests") > 0, "{kernel}");
    let table = node.ctl_ok(&["top", "--once"]);
    assert!(table.contains("io_uring"), "{table}");
}
