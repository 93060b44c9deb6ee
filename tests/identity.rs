//! A node never destroys data it cannot account for: with its catalog
//! moved aside it refuses to start and touches nothing; given the old
//! catalog back it serves as before; told to `--adopt` a new catalog, it
//! quarantines the files that catalog does not list in `orphans/` (listed
//! by `devices ls`, `orphans ls` and `/metrics`) until `orphans purge`.

mod common;

use std::process::Command;

use common::{random_file, sealed_dataset, NodeProcess};
use sluice_client::blocking::Client;
use sluice_client::ReadRange;

fn start_refused(data_dir: &std::path::Path, extra: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_sluiced"))
        .args(["--data-dir", data_dir.to_str().expect("utf-8")])
        .args(["--listen", "127.0.0.1:0", "--control", "127.0.0.1:0", "--cores", "1"])
        .args(extra)
        .output()
        .expect("run sluiced")
}

#[test]
fn a_lost_catalog_stops_the_node_and_adopting_one_quarantines() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("node");
    let mut node = NodeProcess::start(&data);
    let bytes = random_file(&dir.path().join("a.bin"), 300_000, 3);
    sealed_dataset(&node, "a", &[&dir.path().join("a.bin")]);
    let stat: serde_json::Value =
        serde_json::from_str(&node.ctl_ok(&["--json", "dataset", "stat", "a"])).expect("stat json");
    let namespace = std::path::PathBuf::from(stat["namespace"]["path"].as_str().expect("path"));
    let before = std::fs::read(&namespace).expect("namespace file");
    node.kill();

    // The catalog moved aside (a wrong layout, a restored backup): refused,
    // saying what differs, and the namespace file is untouched.
    std::fs::rename(data.join("catalog.redb"), dir.path().join("catalog.redb.aside")).expect("move aside");
    let out = start_refused(&data, &["--insecure"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "a node with a new catalog over old data started");
    assert!(stderr.contains("belongs to catalog") && stderr.contains("--adopt"), "{stderr}");
    assert_eq!(std::fs::read(&namespace).expect("namespace file"), before, "the data is byte-identical");
    assert!(!data.join("orphans").exists(), "nothing was quarantined without --adopt");

    // The right catalog back: served as before.
    std::fs::rename(dir.path().join("catalog.redb.aside"), data.join("catalog.redb")).expect("restore");
    let node = NodeProcess::start(&data);
    let dataset = Client::connect(&node.endpoint).expect("connect").open("a").expect("open");
    let mut buf = vec![0u8; bytes.len()];
    dataset.read_batch(&[ReadRange { offset: 0, len: bytes.len() as u32, dest: 0 }], &mut buf).expect("read");
    assert!(buf == bytes, "served byte-exact with its own catalog");
    drop(dataset);
    drop(node);

    // Adopting an empty catalog: the old files are quarantined, not lost.
    std::fs::rename(data.join("catalog.redb"), dir.path().join("catalog.redb.aside")).expect("move aside");
    let node = NodeProcess::start_with(&data, &["--adopt"]);
    assert!(!namespace.exists(), "the namespace left namespaces/");
    let orphans: serde_json::Value =
        serde_json::from_str(&node.ctl_ok(&["--json", "orphans", "ls"])).expect("orphans json");
    let listed = orphans.as_array().expect("array");
    let quarantined = listed
        .iter()
        .map(|o| std::path::PathBuf::from(o["path"].as_str().expect("path")))
        .find(|p| std::fs::read(p).is_ok_and(|b| b == before))
        .expect("the namespace file is in orphans/, byte-identical");
    assert!(quarantined.starts_with(data.join("orphans")));
    let devices = node.ctl_ok(&["--json", "devices", "ls"]);
    assert!(devices.contains("\"orphan\""), "{devices}");
    assert_eq!(node.gauge("sluice_orphaned_files"), Some(listed.len() as f64));

    let purged: serde_json::Value =
        serde_json::from_str(&node.ctl_ok(&["--json", "orphans", "purge"])).expect("purge json");
    assert_eq!(purged["files"].as_u64(), Some(listed.len() as u64));
    assert!(std::fs::read_dir(data.join("orphans")).expect("orphans dir").next().is_none(), "purged");
    assert_eq!(node.gauge("sluice_orphaned_files"), Some(0.0));
}

/// The data directory named another way (a symlink, a relative path, a
/// mount point's other name) is the same directory: its datasets' files are
/// theirs, not orphans, and are served.
#[test]
fn another_name_for_the_data_directory_keeps_its_datasets() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("node");
    let node = NodeProcess::start(&data);
    let bytes = random_file(&dir.path().join("a.bin"), 300_000, 5);
    sealed_dataset(&node, "a", &[&dir.path().join("a.bin")]);
    drop(node);

    let link = dir.path().join("link");
    std::os::unix::fs::symlink(&data, &link).expect("symlink");
    let node = NodeProcess::start(&link);
    assert!(!data.join("orphans").exists(), "nothing was quarantined");
    let dataset = Client::connect(&node.endpoint).expect("connect").open("a").expect("open a");
    let mut buf = vec![0u8; bytes.len()];
    dataset.read_batch(&[ReadRange { offset: 0, len: bytes.len() as u32, dest: 0 }], &mut buf).expect("read");
    assert!(buf == bytes, "served byte-exact under the directory's other name");
}
