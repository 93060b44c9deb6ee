//! Three nodes sharing one catalog in etcd (Debian's etcd-server, started
//! here on loopback) with two copies of each dataset: the second copy is
//! made and verified by the node it is placed on; a client reading from a
//! node that is killed mid-read moves to the other copy and every byte
//! stays exact; a live node takes a copy in the dead one's place; the node
//! restarted rejoins and serves again; grants and deletes made on one node
//! hold on all.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use common::{eventually, random_file, NodeProcess};
use rand::{Rng, SeedableRng};
use serde_json::Value;
use sluice_client::blocking::Client;
use sluice_client::{OpenOptions, RangeStatus, ReadRange};
use sluice_control::catalog::{CatalogError, CatalogStore, DatasetState, NamespaceRecord};
use sluice_control::cluster::{EtcdCatalog, REMOTE_KIND};
use sluice_control::grants::GrantRecord;
use sluice_control::{Catalog, DatasetKind};

/// An etcd server on loopback ports, killed when dropped.
struct EtcdServer {
    child: Child,
    endpoint: String,
}

impl Drop for EtcdServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("a free port").port()
}

fn etcd_binary() -> Option<PathBuf> {
    std::env::var_os("PATH")
        .into_iter()
        .flat_map(|paths| std::env::split_paths(&paths).collect::<Vec<_>>())
        .chain([PathBuf::from("/usr/bin")])
        .map(|dir| dir.join("etcd"))
        .find(|path| path.is_file())
}

/// Starts etcd, or says what is missing and returns `None` (a failure when
/// `SLUICE_ETCD_REQUIRE=1`, as in `.ci/run`).
fn start_etcd(dir: &Path) -> Option<EtcdServer> {
    let Some(binary) = etcd_binary() else {
        let why = "SKIP: etcd is not installed (apt-get install etcd-server); the cluster tests need it";
        assert!(std::env::var("SLUICE_ETCD_REQUIRE").as_deref() != Ok("1"), "{why}");
        eprintln!("{why}");
        return None;
    };
    let (client, peer) = (free_port(), free_port());
    let client_url = format!("http://127.0.0.1:{client}");
    let peer_url = format!("http://127.0.0.1:{peer}");
    let child = Command::new(binary)
        .args(["--name", "test", "--data-dir", dir.join("etcd").to_str().expect("utf-8 path")])
        .args(["--listen-client-urls", &client_url, "--advertise-client-urls", &client_url])
        .args(["--listen-peer-urls", &peer_url, "--initial-advertise-peer-urls", &peer_url])
        .args(["--initial-cluster", &format!("test={peer_url}")])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn etcd");
    let server = EtcdServer { child, endpoint: client_url };
    let health = format!("{}/health", server.endpoint);
    assert!(
        eventually(30, || ureq::get(&health).call().is_ok_and(|r| r.into_string().is_ok_and(|b| b.contains("true")))),
        "etcd did not become healthy at {}",
        server.endpoint
    );
    Some(server)
}

fn start_node(dir: &Path, etcd: &str, id: &str) -> NodeProcess {
    NodeProcess::start_secure_with(
        &dir.join(id),
        &["--etcd", etcd, "--etcd-prefix", "/sluice-test", "--node-id", id, "--replicas", "2", "--repair-after-s", "2"],
    )
}

fn cluster(node: &NodeProcess) -> Value {
    match node.get("/v1/cluster") {
        Ok(response) => response.into_json().unwrap_or(Value::Null),
        Err(_) => Value::Null,
    }
}

fn live_members(node: &NodeProcess) -> Vec<String> {
    cluster(node)["members"]
        .as_array()
        .map(|m| m.iter().filter_map(|m| m["node"].as_str().map(String::from)).collect())
        .unwrap_or_default()
}

/// The nodes holding a complete copy of `name`.
fn ready_copies(node: &NodeProcess, name: &str) -> Vec<String> {
    let status = cluster(node);
    let Some(datasets) = status["datasets"].as_array() else { return Vec::new() };
    datasets
        .iter()
        .filter(|d| d["name"] == name)
        .flat_map(|d| d["copies"].as_array().cloned().unwrap_or_default())
        .filter(|c| c["ready"] == true)
        .filter_map(|c| c["node"].as_str().map(String::from))
        .collect()
}

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
    let mut nodes: Vec<NodeProcess> = ids.iter().map(|id| start_node(dir.path(), &etcd.endpoint, id)).collect();
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
    nodes[0] = start_node(dir.path(), &etcd.endpoint, "n1");
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

fn file_namespace(id: u64) -> NamespaceRecord {
    NamespaceRecord::new("file", format!("ns/{id}"), "test")
}

fn grant(id: u64) -> GrantRecord {
    GrantRecord {
        id,
        client: "job".into(),
        dataset: "a".into(),
        dataset_id: 1,
        token_hash: format!("hash-{id}"),
        created_unix_ms: 0,
        cert_name: None,
    }
}

/// One sequence of catalog operations, with the answers every store must
/// give: the trait's contract.
fn exercise(store: &dyn CatalogStore) {
    let mut a = store.create("a", DatasetKind::TokensU16, 1, &mut file_namespace).expect("create a");
    assert_eq!(
        (a.state, a.length_bytes, a.namespace.path.clone()),
        (DatasetState::Creating, 0, format!("ns/{}", a.id))
    );
    assert!(matches!(store.create("a", DatasetKind::Bytes, 2, &mut file_namespace), Err(CatalogError::Exists(_))));
    assert!(matches!(store.create("../x", DatasetKind::Bytes, 2, &mut file_namespace), Err(CatalogError::BadName(_))));
    // Checksums over more than one etcd page, then an append that changes
    // the old tail's and adds more.
    let mut crcs: Vec<u32> = (0..40_000u32).map(|i| i.wrapping_mul(2_654_435_761)).collect();
    a.state = DatasetState::Ingesting;
    a.length_bytes = 40_000 * 65_536 - 10;
    store.update(&a, Some(&crcs)).expect("update a");
    assert_eq!(store.chunk_crcs(a.id).expect("crcs"), crcs);
    crcs[39_999] = 7;
    crcs.extend(0..30_000u32);
    a.length_bytes = 70_000 * 65_536;
    a.state = DatasetState::Sealed;
    store.update(&a, Some(&crcs)).expect("append to a");
    assert_eq!(store.chunk_crcs(a.id).expect("crcs"), crcs);
    assert_eq!(store.require("a").expect("a"), a);
    let b = store.create("b", DatasetKind::Bytes, 3, &mut file_namespace).expect("create b");
    assert_eq!(store.list().expect("list").len(), 2);
    assert!(store.get("nope").expect("get").is_none());
    assert!(matches!(store.require("nope"), Err(CatalogError::Unknown(_))));
    let mut ghost = b.clone();
    ghost.name = "ghost".into();
    assert!(matches!(store.update(&ghost, None), Err(CatalogError::Unknown(_))));

    let first = store.add_grant(&mut grant).expect("grant");
    let second = store.add_grant(&mut grant).expect("grant");
    assert!(second.id > first.id, "grant ids grow");
    assert_eq!(store.grants().expect("grants").len(), 2);
    assert!(store.remove_grant(first.id).expect("revoke"));
    assert!(!store.remove_grant(first.id).expect("revoke again"), "a grant goes once");
    assert_eq!(store.grants().expect("grants"), vec![second]);

    store.remove(&a).expect("remove a");
    assert!(store.get("a").expect("get").is_none());
    assert!(store.chunk_crcs(a.id).expect("crcs").is_empty(), "checksums go with the dataset");
    let c = store.create("a", DatasetKind::Bytes, 4, &mut file_namespace).expect("create a again");
    assert!(c.id > b.id, "ids are not reused");
}

/// The embedded redb store and the etcd store keep the same contract; in
/// etcd a dataset's namespace is per node, so another node sees none.
#[test]
fn both_catalog_stores_keep_one_contract() {
    let dir = tempfile::tempdir().expect("tempdir");
    let Some(etcd) = start_etcd(dir.path()) else { return };
    let redb = Catalog::open(&dir.path().join("catalog.redb")).expect("redb");
    let n1 = EtcdCatalog::connect(&etcd.endpoint, "/contract", "n1").expect("etcd as n1");
    for store in [&redb as &dyn CatalogStore, &n1] {
        exercise(store);
    }
    let n2 = EtcdCatalog::connect(&etcd.endpoint, "/contract", "n2").expect("etcd as n2");
    let seen = n2.require("b").expect("n2 sees b");
    assert_eq!(seen.namespace.kind, REMOTE_KIND, "n1's namespace is n1's alone");
    assert_eq!(n2.list().expect("list").len(), 2);
    assert!(n2.describe().contains("node n2"), "{}", n2.describe());

    let err = EtcdCatalog::connect("http://127.0.0.1:1", "/x", "n1").err().expect("no etcd there").to_string();
    assert!(err.contains("etcd at http://127.0.0.1:1"), "{err}");
    assert!(EtcdCatalog::connect(&etcd.endpoint, "/x", "bad id").is_err(), "node ids are checked");
}
