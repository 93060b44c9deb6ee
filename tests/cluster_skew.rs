//! A cluster part way through a rolling upgrade (or a node rolled back):
//! etcd holds dataset records a newer build wrote, of a kind this build
//! does not know. This build passes them over: it lists, serves
//! and restarts as if they were not there, never takes one's name, and
//! keeps the copy it holds of one (it ran the newer build before), files
//! and copy record alike, for the build that reads it. Before, one such
//! record failed every listing on the older nodes and stopped any of them
//! that restarted ("opening the catalog: … unknown variant"). The cluster
//! report names them apart, with their copies and why they do not read.

mod common;

use common::etcd::{cluster, start_etcd, start_node, ROOT_PASSWORD};
use common::random_file;
use sluice_client::blocking::Client;
use sluice_client::{OpenOptions, RangeStatus, ReadRange};

/// A dataset record as a newer build writes one, of a kind this build
/// does not know, placed on `placement`.
fn newer_record(name: &str, id: u64, placement: &str) -> String {
    serde_json::json!({
        "id": id, "name": name, "kind": "parquet", "state": "sealed", "length_bytes": 8192,
        "files_ingested": 1, "chunk_size_bytes": 65536, "content_hash": "blake3:00",
        "namespace": {"kind": "remote", "path": "", "base_offset_bytes": 0, "reason": "held by other nodes"},
        "created_unix_ms": 1, "sealed_unix_ms": 2, "record_size_bytes": null, "record_count": 0,
        "placement": [placement], "row_groups": 3
    })
    .to_string()
}

#[test]
fn records_a_newer_build_wrote_are_passed_over_and_the_copy_held_here_is_kept() {
    let dir = tempfile::tempdir().expect("tempdir");
    let Some(etcd) = start_etcd(dir.path()) else { return };
    let mut node = start_node(dir.path(), &etcd, "n1");
    let expected = random_file(&dir.path().join("a.bin"), 300_000, 7);
    node.ctl_ok(&["dataset", "create", "a", "--kind", "bytes"]);
    node.ctl_ok(&["dataset", "ingest", "a", dir.path().join("a.bin").to_str().expect("utf-8 path")]);
    node.ctl_ok(&["dataset", "seal", "a"]);

    // "held" has a copy on n1, as a newer build left it; "elsewhere" is
    // placed on a node of the newer build only.
    let copy = dir.path().join("n1/namespaces").join(format!("{:016x}.ns", 41));
    let copy_bytes = random_file(&copy, 8192, 41);
    let replica = serde_json::json!({
        "node": "n1", "dataset": "held", "dataset_id": 41, "ready": true, "length_bytes": 8192,
        "namespace": {"kind": "file", "path": copy.to_str().expect("utf-8 path"), "base_offset_bytes": 0, "reason": "a file"}
    });
    let put = |key: &str, value: &str| {
        let out =
            etcd.etcdctl(Some(&format!("root:{ROOT_PASSWORD}"))).args(["put", key, value]).output().expect("etcdctl");
        assert!(out.status.success(), "put {key}: {}", String::from_utf8_lossy(&out.stderr));
    };
    put("/sluice-test/datasets/held", &newer_record("held", 41, "n1"));
    put("/sluice-test/replicas/n1/held", &replica.to_string());
    put("/sluice-test/datasets/elsewhere", &newer_record("elsewhere", 42, "n9"));
    let copy_record_kept = || {
        let out = etcd
            .etcdctl(Some(&format!("root:{ROOT_PASSWORD}")))
            .args(["get", "--print-value-only", "/sluice-test/replicas/n1/held"])
            .output()
            .expect("etcdctl");
        String::from_utf8_lossy(&out.stdout).contains("\"dataset_id\":41")
    };

    let check = |node: &common::NodeProcess| {
        let listed: serde_json::Value =
            serde_json::from_str(&node.ctl_ok(&["--json", "dataset", "ls"])).expect("ls json");
        let names: Vec<&str> = listed.as_array().expect("a list").iter().filter_map(|d| d["name"].as_str()).collect();
        assert_eq!(names, ["a"], "{listed}");
        let status = cluster(node);
        let reported: Vec<&str> =
            status["datasets"].as_array().expect("datasets").iter().filter_map(|d| d["name"].as_str()).collect();
        assert_eq!(reported, ["a"], "{status}");
        // The report names the datasets it cannot read, their copies and
        // why, so an operator sees them while the upgrade lasts.
        let foreign = status["foreign_datasets"].as_array().expect("foreign datasets");
        let mut names: Vec<&str> = foreign.iter().filter_map(|d| d["name"].as_str()).collect();
        names.sort_unstable();
        assert_eq!(names, ["elsewhere", "held"], "{status}");
        for d in foreign {
            assert!(d["why"].as_str().is_some_and(|why| why.contains("parquet")), "{d}");
            let copies: Vec<&str> =
                d["copies"].as_array().expect("copies").iter().filter_map(|c| c["node"].as_str()).collect();
            let expected: &[&str] = if d["name"] == "held" { &["n1"] } else { &[] };
            assert_eq!(copies, expected, "{d}");
        }
        let shown = node.ctl_ok(&["cluster"]);
        assert!(
            shown.contains("2 datasets this build cannot read") && shown.lines().any(|l| l.starts_with("held ")),
            "{shown}"
        );
        let grant: serde_json::Value =
            serde_json::from_str(&node.ctl_ok(&["--json", "grant", "create", "a", "--client", "trainer"]))
                .expect("grant json");
        let options = OpenOptions { token: grant["token"].as_str().map(String::from), ..OpenOptions::default() };
        let dataset = Client::connect(&node.endpoint).expect("connect").open_with("a", options).expect("open");
        let mut buf = vec![0u8; expected.len()];
        let whole = [ReadRange { offset: 0, len: expected.len() as u32, dest: 0 }];
        assert_eq!(dataset.read_batch(&whole, &mut buf).expect("read"), [RangeStatus::Ok]);
        assert!(buf == expected, "a reads back exact");
        // The name stays the newer dataset's; what it is stays unsaid.
        let taken = node.ctl(&["dataset", "create", "held", "--kind", "bytes"]);
        assert!(!taken.status.success(), "a dataset this build cannot read keeps its name");
        let stat = node.ctl(&["dataset", "stat", "held"]);
        let said = String::from_utf8_lossy(&stat.stderr);
        assert!(!stat.status.success() && said.contains("parquet"), "{said}");
    };
    check(&node);
    // Rounds of the replication loop go by (it reaps copies of datasets
    // it does not find), and the copy stays.
    std::thread::sleep(std::time::Duration::from_secs(3));
    assert!(copy_record_kept(), "the copy's record stays");
    assert_eq!(std::fs::read(&copy).expect("the copy's file stays"), copy_bytes);

    // A restart: the node starts, quarantines nothing of the copy, and
    // serves as before.
    node.kill();
    drop(node);
    let node = start_node(dir.path(), &etcd, "n1");
    check(&node);
    std::thread::sleep(std::time::Duration::from_secs(2));
    assert!(copy_record_kept(), "the copy's record stays");
    assert_eq!(std::fs::read(&copy).expect("the copy's file stays where it was"), copy_bytes);
    let quarantined = std::fs::read_dir(dir.path().join("n1/orphans")).map(|d| d.count()).unwrap_or(0);
    assert_eq!(quarantined, 0, "nothing was taken for an orphan");
}
