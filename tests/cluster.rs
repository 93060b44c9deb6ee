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
use sluice_control::etcd::{Etcd, EtcdAccess};
use sluice_control::grants::GrantRecord;
use sluice_control::{Catalog, DatasetKind};

/// An etcd server on loopback ports, killed when dropped: TLS with
/// client-certificate auth and etcd authentication on, as a deployment
/// runs it; certificates made here. Nodes sign in as users whose role
/// allows their own keys only (`deploy/etcd-roles.sh`).
struct EtcdServer {
    child: Child,
    endpoint: String,
    pki: PathBuf,
    ca: PathBuf,
    authority: common::pki::Authority,
}

impl Drop for EtcdServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

const ROOT_PASSWORD: &str = "root-password-for-tests";

impl EtcdServer {
    fn etcdctl(&self, user: Option<&str>) -> Command {
        let (cert, key) = self.client_cert("root");
        let mut command = Command::new("etcdctl");
        command
            .env("ETCDCTL_API", "3")
            .env("ETCDCTL_ENDPOINTS", &self.endpoint)
            .env("ETCDCTL_CACERT", &self.ca)
            .env("ETCDCTL_CERT", cert)
            .env("ETCDCTL_KEY", key)
            .env("ETCDCTL_DIAL_TIMEOUT", "5s");
        if let Some(user) = user {
            command.env("ETCDCTL_USER", user);
        }
        command
    }

    /// A client certificate (no CN: the gateway refuses one with a CN)
    /// in files named after `cn`, made once.
    fn client_cert(&self, cn: &str) -> (PathBuf, PathBuf) {
        let (cert, key) = (self.pki.join(format!("{cn}.pem")), self.pki.join(format!("{cn}.key")));
        if !cert.exists() {
            common::pki::issue_without_cn(&self.pki, &self.authority, cn);
        }
        (cert, key)
    }

    /// The etcd user of node `node` in cluster `prefix`, made once with
    /// the deploy script: its password file.
    fn node_user(&self, prefix: &str, node: &str) -> PathBuf {
        let password = self.pki.join(format!("{node}{}.password", prefix.replace('/', "_")));
        if !password.exists() {
            std::fs::write(&password, format!("pw-{node}-{}\n", rand::random::<u64>())).expect("password");
            let etcdctl = self.etcdctl(Some(&format!("root:{ROOT_PASSWORD}")));
            let env: Vec<_> = etcdctl.get_envs().filter_map(|(k, v)| Some((k.to_owned(), v?.to_owned()))).collect();
            let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/etcd-roles.sh");
            let out = Command::new("bash")
                .arg(&script)
                .args([prefix, node])
                .arg(&password)
                .envs(env)
                .output()
                .expect("run deploy/etcd-roles.sh");
            assert!(
                out.status.success(),
                "deploy/etcd-roles.sh {prefix} {node}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        password
    }

    /// How node `node` of cluster `prefix` reaches etcd.
    fn access(&self, prefix: &str, node: &str) -> EtcdAccess {
        let password = self.node_user(prefix, node);
        let secret = std::fs::read_to_string(&password).expect("password").trim().to_string();
        EtcdAccess {
            ca: Some(self.ca.clone()),
            identity: Some(self.client_cert(node)),
            user: Some((node.to_string(), sluice_proto::codec::Secret::new(secret))),
        }
    }

    /// etcd as its root user.
    fn root(&self) -> Etcd {
        let access = EtcdAccess {
            ca: Some(self.ca.clone()),
            identity: Some(self.client_cert("root")),
            user: Some(("root".into(), sluice_proto::codec::Secret::new(ROOT_PASSWORD.into()))),
        };
        Etcd::connect(&self.endpoint, &access).expect("etcd as root")
    }

    /// `sluiced` flags for node `node` of cluster `prefix`.
    fn node_flags(&self, prefix: &str, node: &str) -> Vec<String> {
        let password = self.node_user(prefix, node);
        let (cert, key) = self.client_cert(node);
        [
            "--etcd",
            &self.endpoint,
            "--etcd-prefix",
            prefix,
            "--etcd-ca",
            path(&self.ca),
            "--etcd-cert",
            path(&cert),
            "--etcd-key",
            path(&key),
            "--etcd-user",
            node,
            "--etcd-password-file",
            path(&password),
        ]
        .map(String::from)
        .to_vec()
    }
}

fn path(p: &Path) -> &str {
    p.to_str().expect("utf-8 path")
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

/// Starts a secured etcd, or says what is missing and returns `None` (a
/// failure when `SLUICE_ETCD_REQUIRE=1`, as in `.ci/run`).
fn start_etcd(dir: &Path) -> Option<EtcdServer> {
    let etcdctl_there = Command::new("etcdctl").arg("version").output().is_ok_and(|o| o.status.success());
    let Some(binary) = etcd_binary().filter(|_| etcdctl_there) else {
        let why = "SKIP: etcd or etcdctl is not installed (apt-get install etcd-server etcd-client); the cluster tests need both";
        assert!(std::env::var("SLUICE_ETCD_REQUIRE").as_deref() != Ok("1"), "{why}");
        eprintln!("{why}");
        return None;
    };
    let pki = dir.join("etcd-pki");
    std::fs::create_dir_all(&pki).expect("pki dir");
    let authority = common::pki::authority(&pki, "etcd-test-ca");
    let (server_cert, server_key) = common::pki::issue(&pki, &authority, "etcd-server", true);
    let (client, peer) = (free_port(), free_port());
    let client_url = format!("https://127.0.0.1:{client}");
    let peer_url = format!("http://127.0.0.1:{peer}");
    let child = Command::new(binary)
        .args(["--name", "test", "--data-dir", path(&dir.join("etcd"))])
        .args(["--listen-client-urls", &client_url, "--advertise-client-urls", &client_url])
        .args(["--listen-peer-urls", &peer_url, "--initial-advertise-peer-urls", &peer_url])
        .args(["--initial-cluster", &format!("test={peer_url}")])
        .args(["--cert-file", path(&server_cert), "--key-file", path(&server_key)])
        .args(["--trusted-ca-file", path(&authority.pem), "--client-cert-auth"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn etcd");
    let ca = authority.pem.clone();
    let server = EtcdServer { child, endpoint: client_url, pki, ca, authority };
    assert!(
        eventually(30, || server.etcdctl(None).args(["endpoint", "health"]).output().is_ok_and(|o| o.status.success())),
        "etcd did not become healthy at {}",
        server.endpoint
    );
    for args in [
        vec!["user", "add", "root", &format!("--new-user-password={ROOT_PASSWORD}")],
        vec!["user", "grant-role", "root", "root"],
        vec!["auth", "enable"],
    ] {
        let out = server.etcdctl(None).args(&args).output().expect("etcdctl");
        assert!(out.status.success(), "etcdctl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    }
    Some(server)
}

fn start_node(dir: &Path, etcd: &EtcdServer, id: &str) -> NodeProcess {
    start_node_with(dir, etcd, id, &[])
}

fn start_node_with(dir: &Path, etcd: &EtcdServer, id: &str, extra: &[&str]) -> NodeProcess {
    let mut flags = etcd.node_flags("/sluice-test", id);
    flags.extend(["--node-id", id, "--replicas", "2", "--repair-after-s", "2"].map(String::from));
    flags.extend(extra.iter().map(|s| s.to_string()));
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    NodeProcess::start_secure_with(&dir.join(id), &flags)
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
    let n1 = EtcdCatalog::connect_with(&etcd.endpoint, &etcd.access("/contract", "n1"), "/contract", "n1")
        .expect("etcd as n1");
    for store in [&redb as &dyn CatalogStore, &n1] {
        exercise(store);
    }
    let n2 = EtcdCatalog::connect_with(&etcd.endpoint, &etcd.access("/contract", "n2"), "/contract", "n2")
        .expect("etcd as n2");
    let seen = n2.require("b").expect("n2 sees b");
    assert_eq!(seen.namespace.kind, REMOTE_KIND, "n1's namespace is n1's alone");
    assert_eq!(n2.list().expect("list").len(), 2);
    assert!(n2.describe().contains("node n2"), "{}", n2.describe());

    let err = EtcdCatalog::connect("http://127.0.0.1:1", "/x", "n1").err().expect("no etcd there").to_string();
    assert!(err.contains("etcd at http://127.0.0.1:1"), "{err}");
    assert!(EtcdCatalog::connect(&etcd.endpoint, "/x", "bad id").is_err(), "node ids are checked");
    let err = EtcdCatalog::connect(&etcd.endpoint, "/contract", "n1").err().expect("no CA, no certificate").to_string();
    assert!(err.contains("etcd at"), "a secured etcd refuses a plain client: {err}");
}

/// The role `deploy/etcd-roles.sh` gives a node lets it write its own
/// copies and membership and the shared keys, and nothing of another
/// node's or another cluster's; a client without a user reads nothing.
#[test]
fn a_node_role_writes_only_its_own_keys() {
    let dir = tempfile::tempdir().expect("tempdir");
    let Some(etcd) = start_etcd(dir.path()) else { return };
    let n1 = Etcd::connect(&etcd.endpoint, &etcd.access("/sluice-test", "n1")).expect("etcd as n1");
    etcd.node_user("/sluice-test", "n2");
    for own in
        ["/sluice-test/replicas/n1/x", "/sluice-test/members/n1", "/sluice-test/datasets/x", "/sluice-test/grants/1"]
    {
        n1.put(own, b"{}", None).unwrap_or_else(|e| panic!("n1 writes {own}: {e}"));
    }
    let root = etcd.root();
    root.put("/sluice-test/replicas/n2/x", b"n2's", None).expect("root writes n2's copy");
    for foreign in [
        "/sluice-test/replicas/n2/x",
        "/sluice-test/replicas/n2/y",
        "/sluice-test/members/n2",
        "/sluice-test/members/n10",
        "/other-cluster/datasets/x",
    ] {
        let err = n1.put(foreign, b"forged", None).err().unwrap_or_else(|| panic!("n1 wrote {foreign}"));
        assert!(err.to_string().contains("permission denied"), "{foreign}: {err}");
    }
    assert!(n1.delete("/sluice-test/replicas/n2/x").is_err(), "n1 cannot delete n2's copy");
    let wipe = [sluice_control::etcd::Op::DeletePrefix("/sluice-test/replicas/".into())];
    assert!(n1.txn(&[], &wipe).is_err(), "nor every copy at once");
    let kept = root.get("/sluice-test/replicas/n2/x").expect("read").expect("still there");
    assert_eq!(kept.value, b"n2's");

    let anonymous = EtcdAccess { user: None, ..etcd.access("/sluice-test", "n1") };
    let err = Etcd::connect(&etcd.endpoint, &anonymous).expect("client").get("/sluice-test/datasets/x");
    assert!(err.is_err(), "a client with a certificate but no etcd user reads nothing");
    let no_cert = EtcdAccess { identity: None, ..etcd.access("/sluice-test", "n1") };
    let err = Etcd::connect(&etcd.endpoint, &no_cert).expect("client").get("/sluice-test/datasets/x");
    assert!(err.is_err(), "a client without a certificate is refused at the handshake");
}

/// Copy records in etcd are input, not orders: one naming a file outside
/// the node's namespaces directory, and one naming a "device" that is not
/// in the node's config, are refused by the reaper, which leaves both
/// targets byte-identical.
#[test]
fn forged_copy_records_touch_nothing_outside_the_node() {
    let dir = tempfile::tempdir().expect("tempdir");
    let Some(etcd) = start_etcd(dir.path()) else { return };
    let log = dir.path().join("n1.log");
    let mut flags = etcd.node_flags("/sluice-test", "n1");
    flags.extend(["--node-id", "n1"].map(String::from));
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let node = NodeProcess::start_secure_logged(&dir.path().join("n1"), &flags, &log);
    assert!(eventually(20, || live_members(&node).len() == 1), "n1 joined");
    let victim_file = dir.path().join("victim-file");
    let victim_device = dir.path().join("victim-device");
    let file_bytes = random_file(&victim_file, 3 << 20, 1);
    let device_bytes = random_file(&victim_device, 3 << 20, 2);
    let root = etcd.root();
    for (name, kind, target) in [("ghost-file", "file", &victim_file), ("ghost-device", "device", &victim_device)] {
        let forged = serde_json::json!({
            "node": "n1", "dataset": name, "dataset_id": 4242, "ready": true, "length_bytes": 3u64 << 20,
            "namespace": { "kind": kind, "path": path(target), "base_offset_bytes": 0, "reason": "forged" }
        });
        root.put(&format!("/sluice-test/replicas/n1/{name}"), forged.to_string().as_bytes(), None).expect("forge");
    }
    let refusals = || std::fs::read_to_string(&log).unwrap_or_default().matches("refused a catalog record").count();
    assert!(
        eventually(30, || refusals() >= 2),
        "the reaper refused both records:\n{}",
        std::fs::read_to_string(&log).unwrap_or_default()
    );
    assert!(std::fs::read(&victim_file).expect("victim file") == file_bytes, "the file outside is unchanged");
    assert!(std::fs::read(&victim_device).expect("victim device") == device_bytes, "the 'device' is unchanged");
    drop(node);
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
