//! Source-backed datasets in a cluster (etcd and an S3-compatible server,
//! both on loopback): created on one node and placed on two, the second
//! copy is ready without a byte copied from the first, fills its chunks
//! from the source itself (the first node's cache stays empty while the
//! second serves), takes a `records` dataset's sample index from the first
//! node, and goes with the dataset when it is deleted.

mod common;

use common::etcd::{live_members, ready_copies, start_etcd, start_node_with_env};
use common::s3::S3;
use common::{eventually, NodeProcess};
use rand::{Rng, SeedableRng};
use sluice_client::blocking::Client;
use sluice_client::{OpenOptions, RangeStatus, ReadRange};

const CHUNK: usize = 64 * 1024;

fn cache(node: &NodeProcess, name: &str) -> serde_json::Value {
    let stat: serde_json::Value =
        serde_json::from_str(&node.ctl_ok(&["--json", "dataset", "stat", name])).expect("stat json");
    stat["cache"].clone()
}

fn token(node: &NodeProcess, dataset: &str) -> String {
    let grant: serde_json::Value =
        serde_json::from_str(&node.ctl_ok(&["--json", "grant", "create", dataset, "--client", "trainer"]))
            .expect("grant json");
    grant["token"].as_str().expect("token").to_string()
}

/// Opens `name` on `node` with `token`, once the node has picked up the
/// grant made on the other node.
fn open(node: &NodeProcess, name: &str, token: &str) -> sluice_client::blocking::Dataset {
    let client = Client::connect(&node.endpoint).expect("connect");
    let options = || OpenOptions { token: Some(token.to_string()), ..OpenOptions::default() };
    assert!(eventually(30, || client.open_with(name, options()).is_ok()), "the grant reached {}", node.endpoint);
    client.open_with(name, options()).expect("open")
}

#[test]
fn a_source_backed_dataset_placed_on_two_nodes_fills_each_copy_from_the_source() {
    let Some(s3) = S3::start() else { return };
    let dir = tempfile::tempdir().expect("tempdir");
    let Some(etcd) = start_etcd(dir.path()) else { return };
    let mut rng = rand::rngs::StdRng::seed_from_u64(23);
    let data: Vec<u8> = (0..40 * CHUNK).map(|_| rng.gen()).collect();
    s3.create_bucket("shared");
    s3.put("shared", "data.bin", &data);
    // Records of 1 to 5000 bytes over the same bytes, by an offsets object.
    let mut offsets = vec![0u64];
    while let Some(&last) = offsets.last().filter(|&&o| o < data.len() as u64 - 5000) {
        offsets.push(last + rng.gen_range(1..5000));
    }
    offsets.push(data.len() as u64);
    s3.put("shared", "offsets.bin", &offsets.iter().flat_map(|o| o.to_le_bytes()).collect::<Vec<u8>>());
    let config = dir.path().join("sluiced.toml");
    std::fs::write(&config, "source_timeout_ms = 1500\nsource_retries = 4\n").expect("config");
    let flags = ["--config", config.to_str().expect("utf-8 path")];
    let n1 = start_node_with_env(dir.path(), &etcd, "n1", &flags, &s3.env());
    let n2 = start_node_with_env(dir.path(), &etcd, "n2", &flags, &s3.env());
    assert!(eventually(30, || live_members(&n1).len() == 2), "both nodes joined");

    n1.ctl_ok(&["dataset", "create", "web", "--kind", "bytes", "--source", "s3://shared/data.bin"]);
    n1.ctl_ok(&[
        "dataset",
        "create",
        "recs",
        "--kind",
        "records",
        "--source",
        "s3://shared/data.bin",
        "--index",
        "s3://shared/offsets.bin",
    ]);
    let gets_at_create = s3.gets();
    for name in ["web", "recs"] {
        assert!(
            eventually(60, || ready_copies(&n1, name).len() == 2),
            "{name}: a copy on each node: {}",
            common::etcd::cluster(&n1)
        );
    }
    assert_eq!(s3.gets(), gets_at_create, "making the second copies fetched no chunk from the source");

    // n2 serves its copy byte-exact, filling from the source itself.
    let web = open(&n2, "web", &token(&n1, "web"));
    let ranges: Vec<ReadRange> = (0..24u64)
        .map(|i| {
            let len = rng.gen_range(1..20_000u32);
            ReadRange { offset: rng.gen_range(0..(data.len() - len as usize) as u64), len, dest: i * 20_000 }
        })
        .collect();
    let mut buf = vec![0u8; 24 * 20_000];
    let statuses = web.read_batch(&ranges, &mut buf).expect("read on n2");
    for (range, status) in ranges.iter().zip(&statuses) {
        assert_eq!(*status, RangeStatus::Ok);
        let (at, len, dest) = (range.offset as usize, range.len as usize, range.dest as usize);
        assert!(buf[dest..dest + len] == data[at..at + len], "n2 reads byte-exact at {at}");
    }
    assert!(s3.gets() > gets_at_create, "n2 fetched its chunks from the source");
    assert!(cache(&n2, "web")["chunks_present"].as_u64() > Some(0), "{}", cache(&n2, "web"));
    assert_eq!(cache(&n1, "web")["chunks_present"], 0, "n1 filled nothing for n2's reads");

    // The records copy has the sample index, and its records read exact.
    let recs = open(&n2, "recs", &token(&n1, "recs"));
    let index = recs.record_index().expect("index on n2");
    assert_eq!(index.len(), offsets.len() - 1);
    for record in [0, index.len() / 2, index.len() - 1] {
        let (at, len) = index[record];
        assert_eq!((at, at + len), (offsets[record], offsets[record + 1]), "record {record}");
        let mut one = vec![0u8; len as usize];
        let read = recs.read_batch(&[ReadRange { offset: at, len: len as u32, dest: 0 }], &mut one).expect("read");
        assert_eq!(read, [RangeStatus::Ok]);
        assert!(one == data[at as usize..(at + len) as usize], "record {record} byte-exact on n2");
    }

    // Deleted on n1: n2 drops its copy and its cache's files.
    let cache_files = || std::fs::read_dir(dir.path().join("n2/cache")).map_or(0, |d| d.count());
    assert_eq!(cache_files(), 4, "a bitmap and a checksum file per dataset on n2");
    drop((web, recs));
    n1.ctl_ok(&["dataset", "rm", "web"]);
    assert!(eventually(30, || cache_files() == 2), "n2 dropped web's cache: {} files left", cache_files());
    let top: serde_json::Value = serde_json::from_str(&n2.ctl_ok(&["--json", "top", "--once"])).expect("top json");
    let names: Vec<&str> =
        top["caches"].as_array().expect("caches").iter().filter_map(|c| c["name"].as_str()).collect();
    assert_eq!(names, ["recs"], "n2's caches after the delete: {top}");
}

/// A dataset record is input, not an order: a node in the cluster (or
/// whoever holds its etcd credentials) that writes a dataset whose source
/// is another node's local file (its key, its admin token) gets nothing
/// from that node. The other node, whose `source_allow` lists no
/// `file://` source, fails the reads as unavailable, names why, and never
/// reads the file.
#[test]
fn a_node_fetches_only_the_sources_its_own_config_allows_whoever_wrote_the_record() {
    let dir = tempfile::tempdir().expect("tempdir");
    let Some(etcd) = start_etcd(dir.path()) else { return };
    let secrets = dir.path().join("n2-secrets");
    std::fs::create_dir(&secrets).expect("secrets dir");
    let secret = b"-----BEGIN PRIVATE KEY----- the second node's key";
    std::fs::write(secrets.join("node.key"), secret).expect("secret");
    let writer_config = dir.path().join("writer.toml");
    std::fs::write(&writer_config, format!("source_allow = [\"file://{}/\"]\n", secrets.display())).expect("config");
    let n1 = start_node_with_env(dir.path(), &etcd, "n1", &["--config", writer_config.to_str().expect("utf-8")], &[]);
    let n2 = start_node_with_env(dir.path(), &etcd, "n2", &[], &[]);
    assert!(eventually(30, || live_members(&n1).len() == 2), "both nodes joined");

    let url = format!("file://{}/node.key", secrets.display());
    n1.ctl_ok(&["dataset", "create", "loot", "--kind", "bytes", "--source", &url]);
    assert!(eventually(60, || ready_copies(&n1, "loot").len() == 2), "a copy on each node");
    let refused = n2.ctl(&["dataset", "create", "direct", "--kind", "bytes", "--source", &url]);
    let said = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success() && said.contains("source_allow"), "n2 refuses the URL itself: {said}");

    let loot = open(&n2, "loot", &token(&n1, "loot"));
    let mut buf = vec![0u8; secret.len()];
    let statuses =
        loot.read_batch(&[ReadRange { offset: 0, len: secret.len() as u32, dest: 0 }], &mut buf).expect("read");
    assert_eq!(statuses, [RangeStatus::SourceUnavailable], "n2 fetched nothing outside its source_allow");
    assert!(buf.iter().all(|&b| b == 0), "no byte of the file reached the reader");
    let n2_cache = cache(&n2, "loot");
    assert_eq!(n2_cache["chunks_present"], 0, "{n2_cache}");
    assert!(n2_cache["source_errors"].as_u64() > Some(0), "{n2_cache}");
}
