//! A node killed with SIGKILL during ingest restarts with its catalog
//! intact, never serves the half-ingested dataset as sealed, and drops the
//! bytes of the ingest that did not finish.

mod common;

use std::io::Read;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{random_file, NodeProcess};
use sluice_client::blocking::Client;
use sluice_client::{RangeStatus, ReadRange};

/// A request body that sends `total` bytes slowly and counts what it sent.
struct SlowBody {
    left: u64,
    sent: Arc<AtomicU64>,
}

impl Read for SlowBody {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if self.left == 0 {
            return Ok(0);
        }
        std::thread::sleep(Duration::from_millis(2));
        let n = (buf.len() as u64).min(self.left).min(64 * 1024) as usize;
        buf[..n].fill(0xee);
        self.left -= n as u64;
        self.sent.fetch_add(n as u64, Ordering::Relaxed);
        Ok(n)
    }
}

/// Starts an ingest of 1 GiB that cannot finish, and kills the node with
/// SIGKILL once some MiB have landed.
fn kill_during_ingest(node: &mut NodeProcess, name: &str) {
    let url = format!("{}/v1/datasets/{name}/ingest?format=raw", node.endpoint);
    let sent = Arc::new(AtomicU64::new(0));
    let body = SlowBody { left: 1 << 30, sent: Arc::clone(&sent) };
    let upload = std::thread::spawn(move || ureq::post(&url).send(body).is_ok());
    let deadline = Instant::now() + Duration::from_secs(30);
    while sent.load(Ordering::Relaxed) < 8 << 20 {
        assert!(Instant::now() < deadline, "upload did not start");
        std::thread::sleep(Duration::from_millis(10));
    }
    node.kill();
    assert!(!upload.join().expect("upload thread"), "the cut-off upload must fail");
}

fn stat(node: &NodeProcess, name: &str) -> serde_json::Value {
    serde_json::from_str(&node.ctl_ok(&["dataset", "stat", name, "--json"])).expect("stat json")
}

/// SIGKILL during the first file: the dataset is back to empty, not
/// readable, and a fresh ingest then seal works.
#[test]
fn sigkill_during_first_ingest() {
    let dir = tempfile::tempdir().expect("tempdir");
    let node_dir = dir.path().join("node");
    let mut node = NodeProcess::start(&node_dir);
    node.ctl_ok(&["dataset", "create", "half", "--kind", "bytes"]);
    kill_during_ingest(&mut node, "half");

    let node = NodeProcess::start(&node_dir);
    let record = stat(&node, "half");
    assert_eq!(record["state"], "creating");
    assert_eq!(record["length_bytes"], 0);
    let client = Client::connect(&node.endpoint).expect("connect");
    let refused = client.open("half").err().expect("an unsealed dataset is not served");
    assert!(refused.to_string().contains("creating"), "{refused}");
    assert!(!node.ctl(&["dataset", "seal", "half"]).status.success(), "nothing to seal");

    let data = random_file(&dir.path().join("good.bin"), 1_000_003, 1);
    node.ctl_ok(&["dataset", "ingest", "half", dir.path().join("good.bin").to_str().expect("p")]);
    node.ctl_ok(&["dataset", "seal", "half"]);
    let dataset = client.open("half").expect("open after seal");
    assert_eq!(dataset.len_bytes(), data.len() as u64);
    let mut buf = vec![0u8; data.len()];
    let statuses =
        dataset.read_batch(&[ReadRange { offset: 0, len: data.len() as u32, dest: 0 }], &mut buf).expect("read");
    assert_eq!(statuses, [RangeStatus::Ok]);
    assert!(buf == data);
}

/// SIGKILL during the second file: the first file's bytes stay committed,
/// the partial second file's bytes are truncated away, and sealing serves
/// exactly the first file.
#[test]
fn sigkill_during_second_ingest() {
    let dir = tempfile::tempdir().expect("tempdir");
    let node_dir = dir.path().join("node");
    let mut node = NodeProcess::start(&node_dir);
    let first = random_file(&dir.path().join("first.bin"), 3_000_001, 2);
    node.ctl_ok(&["dataset", "create", "two", "--kind", "bytes"]);
    node.ctl_ok(&["dataset", "ingest", "two", dir.path().join("first.bin").to_str().expect("p")]);
    kill_during_ingest(&mut node, "two");

    let node = NodeProcess::start(&node_dir);
    let record = stat(&node, "two");
    assert_eq!(record["state"], "ingesting");
    assert_eq!(record["length_bytes"], 3_000_001);
    let path = record["namespace"]["path"].as_str().expect("namespace path");
    let on_disk = std::fs::metadata(path).expect("namespace file").len();
    assert_eq!(on_disk, 3_000_001u64.next_multiple_of(4096), "uncommitted bytes were truncated");

    node.ctl_ok(&["dataset", "seal", "two"]);
    let client = Client::connect(&node.endpoint).expect("connect");
    let dataset = client.open("two").expect("open");
    let mut buf = vec![0u8; first.len()];
    let statuses =
        dataset.read_batch(&[ReadRange { offset: 0, len: first.len() as u32, dest: 0 }], &mut buf).expect("read");
    assert_eq!(statuses, [RangeStatus::Ok]);
    assert!(buf == first);
}
