//! Load and soak: several clients, each with several batches in flight, for
//! a bounded time (`SLUICE_SOAK_SECONDS`, default 8), every byte verified;
//! no errors, and no growth of the node's descriptors or memory.
//! Also: the node drops root privileges and keeps serving.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{random_file, sealed_dataset, NodeProcess};
use rand::{Rng, SeedableRng};
use sluice_client::{Client, RangeStatus, ReadRange};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn soak_with_verified_reads() {
    let seconds: u64 = std::env::var("SLUICE_SOAK_SECONDS").ok().and_then(|s| s.parse().ok()).unwrap_or(8);
    let dir = tempfile::tempdir().expect("tempdir");
    let node = NodeProcess::start(&dir.path().join("node"));
    let data = Arc::new(random_file(&dir.path().join("data.bin"), 32 << 20, 77));
    sealed_dataset(&node, "data", &[&dir.path().join("data.bin")]);

    let run = |seconds: u64| {
        let mut tasks = Vec::new();
        for client_id in 0..4u64 {
            let endpoint = node.endpoint.clone();
            let data = Arc::clone(&data);
            tasks.push(tokio::spawn(async move {
                let client = Client::connect(&endpoint).await.expect("connect");
                let dataset = Arc::new(client.open("data").await.expect("open"));
                let deadline = Instant::now() + Duration::from_secs(seconds);
                let mut inflight = Vec::new();
                for lane in 0..4u64 {
                    let (dataset, data) = (Arc::clone(&dataset), Arc::clone(&data));
                    inflight.push(tokio::spawn(async move {
                        let mut rng = rand::rngs::SmallRng::seed_from_u64(client_id * 10 + lane);
                        let (mut batches, mut bytes) = (0u64, 0u64);
                        while Instant::now() < deadline {
                            let mut ranges = Vec::new();
                            let mut dest = 0u64;
                            for _ in 0..rng.gen_range(1..64) {
                                let len = 1u32 << rng.gen_range(0..20);
                                let offset = rng.gen_range(0..data.len() as u64 - u64::from(len));
                                ranges.push(ReadRange { offset, len, dest });
                                dest += u64::from(len);
                            }
                            let mut buf = vec![0u8; dest as usize];
                            let statuses = dataset.read_batch(&ranges, &mut buf).await.expect("no errors under load");
                            for (r, s) in ranges.iter().zip(&statuses) {
                                assert_eq!(*s, RangeStatus::Ok);
                                let want = &data[r.offset as usize..(r.offset + u64::from(r.len)) as usize];
                                assert!(&buf[r.dest as usize..(r.dest + u64::from(r.len)) as usize] == want);
                            }
                            batches += 1;
                            bytes += dest;
                        }
                        (batches, bytes)
                    }));
                }
                let mut totals = (0, 0);
                for task in inflight {
                    let (b, n) = task.await.expect("lane");
                    totals = (totals.0 + b, totals.1 + n);
                }
                totals
            }));
        }
        tasks
    };
    // Warm up, then measure descriptors and memory across the soak.
    for task in run(1) {
        task.await.expect("warm-up");
    }
    let (fds_before, (rss_before, _)) = (node.fd_count(), node.memory_kib());
    let (mut batches, mut bytes) = (0u64, 0u64);
    for task in run(seconds) {
        let (b, n) = task.await.expect("client");
        batches += b;
        bytes += n;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (fds_after, (rss_after, peak)) = (node.fd_count(), node.memory_kib());
    eprintln!(
        "soak: 4 clients x 4 in flight, {seconds} s: {batches} batches, {} MiB verified; fds {fds_before} -> {fds_after}; RSS {} -> {} MiB (peak {} MiB)",
        bytes >> 20,
        rss_before >> 10,
        rss_after >> 10,
        peak >> 10
    );
    assert!(batches > 0);
    assert!(fds_after <= fds_before, "descriptors leaked: {fds_before} -> {fds_after}");
    assert!(rss_after < rss_before + (64 << 10), "memory grew: {rss_before} -> {rss_after} KiB");
}

/// Started as root with `--user nobody`, the node runs as nobody and still
/// creates, ingests, seals and serves.
#[test]
fn drops_root_privileges() {
    if !nix::unistd::Uid::effective().is_root() {
        eprintln!("SKIP drops_root_privileges: needs root to start as root and drop to nobody");
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let node_dir = dir.path().join("node");
    let node = NodeProcess::start_with(&node_dir, &["--user", "nobody"]);
    let status = std::fs::read_to_string(format!("/proc/{}/status", node.child.id())).expect("status");
    let uid_line = status.lines().find(|l| l.starts_with("Uid:")).expect("Uid line");
    let nobody = nix::unistd::User::from_name("nobody").expect("lookup").expect("nobody exists").uid;
    assert!(uid_line.split_whitespace().skip(1).all(|u| u == nobody.to_string()), "{uid_line}");
    let data = random_file(&dir.path().join("data.bin"), 100_000, 4);
    sealed_dataset(&node, "data", &[&dir.path().join("data.bin")]);
    let out = dir.path().join("out.bin");
    node.ctl_ok(&["read", "data", "--offset", "0", "--len", "100000", "-o", out.to_str().expect("p")]);
    assert!(std::fs::read(&out).expect("read") == data);
}
