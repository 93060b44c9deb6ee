//! Three nodes sharing one catalog in etcd (Debian's etcd-server, started
//! here on loopback) with two copies of each dataset: the second copy is
//! made and verified by the node it is placed on; a client reading from a
//! node that is killed mid-read moves to the other copy and every byte
//! stays exact; a live node takes a copy in the dead one's place; the node
//! restarted rejoins and serves again; grants and deletes made on one node
//! hold on all.

mod common;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use common::etcd::{cluster, live_members, path, ready_copies, start_etcd, start_node, start_node_with};
use common::{eventually, random_file, NodeProcess};
use rand::{Rng, SeedableRng};
use serde_json::Value;
use sluice_client::blocking::Client;
use sluice_client::{OpenOptions, RangeStatus, ReadRange};

fn read_whole(dataset: &sluice_client::blocking::Dataset, expected: &[u8]) {
    let mut buf = vec![0u8; expected.len()];
    let statuses =
        dataset.read_batch(&[ReadRange { offset: 0, len: expected.len() as u32, dest: 0 }], &mut buf).expect("read");
    assert_eq!(statuses, [RangeStatus::Ok]);
    assert!(buf == expected, "whole dataset byte-exact");
}

#[test]
fn three_nodes_two_copies_survive_a_node_killed_mid_read() {
    let dir = tempfile::tempdir().expect("tempdir");
    let Some(etcd) = start_etcd(dir.path()) else { return };
    let ids = ["n1", "n2", "n3"];
    let mut nodes: Vec<NodeProcess> = ids.iter().map(|id| start_node(dir.path(), &etcd, id)).collect();
    assert!(eventually(20, || live_members(&nodes[0]).len() == 3), "three members: {}", cluster(&nodes[0]));

    // Created, ingested and sealed on n1; placed on n1 and one other node,
    // which copies and verifies it.
    let expected = random_file(&dir.path().join("corpus.bin"), (6 << 20) + 12_345, 7);
    nodes[0].ctl_ok(&["dataset", "create", "corpus", "--kind", "bytes"]);
    nodes[0].ctl_ok(&["dataset", "ingest", "corpus", dir.path().join("corpus.bin").to_str().expect("utf-8")]);
    nodes[0].ctl_ok(&["dataset", "seal", "corpus"]);
    assert!(eventually(60, || ready_copies(&nodes[1], "corpus").len() == 2), "two copies: {}", cluster(&nodes[1]));
    let holders = ready_copies(&nodes[0], "corpus");
    assert!(holders.contains(&"n1".to_string()), "the ingesting node holds a copy: {holders:?}");
    let other = ids.iter().position(|id| *id != "n1" && holders.iter().any(|h| h == id)).expect("a second holder");
    let spare = ids.iter().position(|id| !holders.iter().any(|h| h == id)).expect("a node without a copy");

    // A grant issued on the node without a copy opens the dataset on the
    // holders; that node itself says where to read instead.
    let grant: Value =
        serde_json::from_str(&nodes[spare].ctl_ok(&["--json", "grant", "create", "corpus", "--client", "trainer"]))
            .expect("grant json");
    let token = grant["token"].as_str().expect("token").to_string();
    let options = || OpenOptions { token: Some(token.clone()), ..OpenOptions::default() };
    let text = nodes[spare].ctl_ok(&["cluster"]);
    assert!(text.contains("corpus") && text.contains("n1:ready"), "{text}");
    let err = Client::connect(&nodes[spare].endpoint)
        .expect("connect")
        .open_with("corpus", options())
        .err()
        .expect("no copy on the spare node")
        .to_string();
    assert!(err.contains("no complete copy on this node") && err.contains(&nodes[0].endpoint), "{err}");

    let client = Client::connect(&nodes[0].endpoint).expect("connect to n1");
    let dataset = Arc::new(client.open_with("corpus", options()).expect("open on n1"));
    assert_eq!(dataset.info().replicas.len(), 2, "the open lists both copies: {:?}", dataset.info().replicas);
    assert_eq!(dataset.info().replicas[0], nodes[0].endpoint, "the answering node first");

    // A read load of random batches, every byte checked.
    let expected = Arc::new(expected);
    let batches = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let failure = Arc::new(Mutex::new(None::<String>));
    let reader = {
        let (dataset, expected, batches, stop, failure) = (
            Arc::clone(&dataset),
            Arc::clone(&expected),
            Arc::clone(&batches),
            Arc::clone(&stop),
            Arc::clone(&failure),
        );
        std::thread::spawn(move || {
            let mut rng = rand::rngs::SmallRng::seed_from_u64(11);
            let mut buf = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                let mut ranges = Vec::new();
                let mut dest = 0u64;
                for _ in 0..16 {
                    let len = rng.gen_range(1..=65_536u32);
                    let offset = rng.gen_range(0..expected.len() as u64 - u64::from(len));
                    ranges.push(ReadRange { offset, len, dest });
                    dest += u64::from(len);
                }
                buf.resize(dest as usize, 0);
                let outcome = dataset.read_batch(&ranges, &mut buf).map_err(|e| e.to_string()).and_then(|statuses| {
                    for (r, status) in ranges.iter().zip(&statuses) {
                        let want = &expected[r.offset as usize..(r.offset + u64::from(r.len)) as usize];
                        if *status != RangeStatus::Ok || &buf[r.dest as usize..r.dest as usize + r.len as usize] != want
                        {
                            return Err(format!("range at {} ({} bytes): {status:?} or wrong bytes", r.offset, r.len));
                        }
                    }
                    Ok(())
                });
                if let Err(err) = outcome {
                    *failure.lock().expect("lock") = Some(err);
                    return;
                }
                batches.fetch_add(1, Ordering::Relaxed);
            }
        })
    };
    assert!(eventually(30, || batches.load(Ordering::Relaxed) >= 20), "reads flow before the kill");
    nodes[0].kill();
    let at_kill = batches.load(Ordering::Relaxed);
    let flowing = eventually(60, || {
        batches.load(Ordering::Relaxed) >= at_kill + 50 || failure.lock().map(|f| f.is_some()).unwrap_or(true)
    });
    stop.store(true, Ordering::Relaxed);
    reader.join().expect("reader thread");
    assert_eq!(*failure.lock().expect("lock"), None, "no read failed or differed across the kill");
    assert!(flowing, "reads continued after n1 was killed ({} batches)", batches.load(Ordering::Relaxed));
    assert!(dataset.failovers() >= 1, "the dataset moved to the other copy");
    assert_eq!(dataset.endpoint(), nodes[other].endpoint, "now read from the other holder");
    assert!(
        eventually(30, || !live_members(&nodes[other]).contains(&"n1".to_string())),
        "the killed node leaves the membership when its lease expires"
    );
    // Two seconds short of a live holder, the spare node takes a copy.
    let spare_id = ids[spare].to_string();
    assert!(
        eventually(60, || ready_copies(&nodes[other], "corpus").contains(&spare_id)),
        "the spare node copies the dataset in n1's place: {}",
        cluster(&nodes[other])
    );
    let healed =
        Client::connect(&nodes[spare].endpoint).expect("connect").open_with("corpus", options()).expect("open");
    read_whole(&healed, &expected);
    drop(healed);

    // Restarted on its data, n1 rejoins and serves its copy again.
    nodes[0] = start_node(dir.path(), &etcd, "n1");
    assert!(eventually(20, || live_members(&nodes[other]).contains(&"n1".to_string())), "n1 rejoins");
    let again = Client::connect(&nodes[0].endpoint).expect("connect").open_with("corpus", options()).expect("reopen");
    read_whole(&again, &expected);
    drop(again);

    // Deleted on the other holder: every copy goes, n1's namespace file too.
    nodes[other].ctl_ok(&["dataset", "rm", "corpus"]);
    let n1_files = || std::fs::read_dir(dir.path().join("n1").join("namespaces")).map(|d| d.count()).unwrap_or(0);
    assert!(
        eventually(30, || ready_copies(&nodes[0], "corpus").is_empty() && n1_files() == 0),
        "copies dropped after delete: {} ({} files on n1)",
        cluster(&nodes[0]),
        n1_files()
    );
    let out = nodes[0].ctl(&["dataset", "stat", "corpus"]);
    assert!(!out.status.success(), "the dataset is gone on every node");
    drop(etcd);
}

/// A grant revoked on n1 closes a session on n2 within 5 s, while n2 is
/// in the middle of a long copy (n1's reads are slowed so the copy takes
/// longer than that).
#[test]
fn a_revocation_reaches_another_node_during_a_copy() {
    let dir = tempfile::tempdir().expect("tempdir");
    let Some(etcd) = start_etcd(dir.path()) else { return };
    let slow = dir.path().join("slow.toml");
    std::fs::write(&slow, "[faults]\ndelays = [[0, 1099511627776, 1500]]\n").expect("config");
    let n1 = start_node_with(dir.path(), &etcd, "n1", &["--config", path(&slow)]);
    let n2 = start_node(dir.path(), &etcd, "n2");
    assert!(eventually(20, || live_members(&n1).len() == 2), "two members");
    let small = random_file(&dir.path().join("small.bin"), 100_000, 3);
    n1.ctl_ok(&["dataset", "create", "small", "--kind", "bytes"]);
    n1.ctl_ok(&["dataset", "ingest", "small", path(&dir.path().join("small.bin"))]);
    n1.ctl_ok(&["dataset", "seal", "small"]);
    assert!(eventually(60, || ready_copies(&n2, "small").len() == 2), "small on both: {}", cluster(&n2));
    let grant: Value =
        serde_json::from_str(&n1.ctl_ok(&["--json", "grant", "create", "small", "--client", "trainer"])).expect("json");
    let token = grant["token"].as_str().expect("token").to_string();
    let id = grant["id"].as_u64().expect("id").to_string();
    let session = Client::connect(&n2.endpoint)
        .expect("connect to n2")
        .open_with("small", OpenOptions { token: Some(token), ..OpenOptions::default() })
        .expect("open on n2");
    read_whole(&session, &small);

    random_file(&dir.path().join("big.bin"), 40 << 20, 4);
    n1.ctl_ok(&["dataset", "create", "big", "--kind", "bytes"]);
    n1.ctl_ok(&["dataset", "ingest", "big", path(&dir.path().join("big.bin"))]);
    n1.ctl_ok(&["dataset", "seal", "big"]);
    let copying = || {
        cluster(&n2)["datasets"].as_array().is_some_and(|d| {
            d.iter().any(|d| {
                d["name"] == "big"
                    && d["copies"]
                        .as_array()
                        .is_some_and(|c| c.iter().any(|c| c["node"] == "n2" && c["ready"] == false))
            })
        })
    };
    assert!(eventually(30, copying), "n2 starts copying big: {}", cluster(&n2));
    n1.ctl_ok(&["grant", "revoke", &id]);
    let revoked_at = std::time::Instant::now();
    let mut buf = vec![0u8; 4096];
    let closed =
        eventually(5, || session.read_batch(&[ReadRange { offset: 0, len: 4096, dest: 0 }], &mut buf).is_err());
    assert!(closed, "the session on n2 closed within 5 s of the revocation on n1");
    assert!(copying(), "the copy was still running {:?} after the revocation", revoked_at.elapsed());
}

/// Many creates on n2 and a copy n2 makes, racing over a pool of two
/// namespace devices: no two datasets ever share one. (Without the
/// allocator lock, two of three runs put two datasets on one device.)
#[test]
fn concurrent_creates_and_a_copy_never_share_a_namespace() {
    let dir = tempfile::tempdir().expect("tempdir");
    let Some(etcd) = start_etcd(dir.path()) else { return };
    let Some(a) = common::loopdev::LoopDevice::new(dir.path(), "a", 8 << 20) else { return };
    let Some(b) = common::loopdev::LoopDevice::new(dir.path(), "b", 8 << 20) else { return };
    let n1 = start_node(dir.path(), &etcd, "n1");
    let n2 = start_node_with(
        dir.path(),
        &etcd,
        "n2",
        &["--namespace-device", a.path_str(), "--namespace-device", b.path_str()],
    );
    assert!(eventually(20, || live_members(&n1).len() == 2), "two members");
    random_file(&dir.path().join("src.bin"), 1 << 20, 5);
    n1.ctl_ok(&["dataset", "create", "src", "--kind", "bytes"]);
    n1.ctl_ok(&["dataset", "ingest", "src", path(&dir.path().join("src.bin"))]);
    let n2 = Arc::new(n2);
    let creators: Vec<_> = (0..10)
        .map(|i| {
            let n2 = Arc::clone(&n2);
            std::thread::spawn(move || n2.ctl(&["dataset", "create", &format!("d{i}"), "--kind", "bytes"]))
        })
        .collect();
    n1.ctl_ok(&["dataset", "seal", "src"]);
    for creator in creators {
        creator.join().expect("creator");
    }
    assert!(eventually(60, || ready_copies(&n2, "src").len() == 2), "n2 copied src: {}", cluster(&n2));
    let copies: Vec<(String, String, String)> = etcd
        .root()
        .list("/sluice-test/replicas/n2/", 1000)
        .expect("n2's copies")
        .iter()
        .filter_map(|kv| serde_json::from_slice::<Value>(&kv.value).ok())
        .map(|r| {
            let field = |v: &Value| v.as_str().unwrap_or_default().to_string();
            (field(&r["dataset"]), field(&r["namespace"]["kind"]), field(&r["namespace"]["path"]))
        })
        .collect();
    let mut devices: Vec<&str> =
        copies.iter().filter(|(_, kind, _)| kind == "device").map(|(_, _, path)| path.as_str()).collect();
    let placed = devices.len();
    devices.sort();
    devices.dedup();
    assert_eq!(devices.len(), placed, "a namespace device holds one dataset: {copies:?}");
    assert_eq!(placed, 2, "both devices were taken (the rest went to files): {copies:?}");
}
