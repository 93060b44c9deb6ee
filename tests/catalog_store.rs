//! One catalog contract for both stores (redb on a node, etcd for a
//! cluster), and etcd's own walls: a node's role writes only its own keys,
//! and copy records forged by one node touch nothing outside it. Against a
//! real, secured etcd (`tests/common/etcd.rs`).

mod common;

use std::io::Write as _;

use common::etcd::{live_members, path, start_etcd, ROOT_PASSWORD};
use common::{eventually, random_file, NodeProcess};
use sluice_control::catalog::{CatalogError, CatalogStore, DatasetState, NamespaceKind, NamespaceRecord};
use sluice_control::cluster::EtcdCatalog;
use sluice_control::etcd::{Etcd, EtcdAccess};
use sluice_control::grants::GrantRecord;
use sluice_control::{Catalog, DatasetKind};

fn file_namespace(id: u64) -> NamespaceRecord {
    NamespaceRecord::new(NamespaceKind::File, format!("ns/{id}"), "test")
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
        expires_unix_ms: (id % 2 == 0).then_some(1_000 + id),
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
    assert_eq!(seen.namespace.kind, NamespaceKind::Remote, "n1's namespace is n1's alone");
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

/// A node's etcd password rotated (`etcdctl user passwd`, which ends the
/// user's tokens, and its password file rewritten, as a Kubernetes Secret
/// is) is taken at the next sign-in, with no restart; a client holding
/// the password it was given at start is refused from then on.
#[test]
fn a_rotated_etcd_password_is_read_from_its_file_at_the_next_sign_in() {
    let dir = tempfile::tempdir().expect("tempdir");
    let Some(etcd) = start_etcd(dir.path()) else { return };
    let access = etcd.access("/sluice-test", "n1");
    let follows_file = Etcd::connect(&etcd.endpoint, &access).expect("etcd as n1");
    let fixed = Etcd::connect(&etcd.endpoint, &EtcdAccess { password_file: None, ..access.clone() }).expect("etcd");
    for client in [&follows_file, &fixed] {
        client.put("/sluice-test/datasets/r", b"{}", None).expect("signed in with the first password");
    }

    let rotated = format!("pw-rotated-{}", rand::random::<u64>());
    let mut passwd = etcd
        .etcdctl(Some(&format!("root:{ROOT_PASSWORD}")))
        .args(["user", "passwd", "n1", "--interactive=false"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("etcdctl user passwd");
    passwd.stdin.take().expect("stdin").write_all(format!("{rotated}\n").as_bytes()).expect("new password");
    let out = passwd.wait_with_output().expect("etcdctl");
    assert!(out.status.success(), "etcdctl user passwd: {}", String::from_utf8_lossy(&out.stderr));
    let file = access.password_file.as_ref().expect("the test's access names its password file");
    std::fs::write(file, format!("{rotated}\n")).expect("rewrite the password file");

    let kept = follows_file.get("/sluice-test/datasets/r").expect("signed in again with the file's new password");
    assert_eq!(kept.map(|kv| kv.value), Some(b"{}".to_vec()));
    let err = fixed.get("/sluice-test/datasets/r").expect_err("the old password no longer signs in");
    assert!(err.to_string().contains("authentication failed"), "{err}");
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
