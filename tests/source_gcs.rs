//! Source-backed datasets in Google Cloud Storage, against a real
//! GCS-compatible server (fake-gcs-server, on loopback): objects and
//! `.npy` arrays read back byte-exact, an overwritten or deleted object
//! failing only its ranges, a bucket that is not there refused by name.
//! `source_cache.rs` tests the same node code against S3; what differs
//! here is the store's own: its listing, its generations and ETags, and a
//! server that, like some GCS-compatible stores, sends a changed object
//! whatever `If-Match` says (the node's check of the response catches it).

mod common;

use common::gcs::FakeGcs;
use common::npy_u16;
use common::reads::{assert_exact, bytes_of, random_ranges, read, stat};
use rand::SeedableRng;
use sluice_client::blocking::Client;
use sluice_client::RangeStatus;

const CHUNK: usize = 64 * 1024;

/// Objects under a prefix (bytes) and `.npy` arrays (tokens) read back
/// exact from cold; then an object overwritten after create fails the
/// ranges not yet fetched from it as source changed, a deleted one too,
/// and what was fetched before still serves.
#[test]
fn objects_read_back_exact_and_a_changed_object_fails_only_its_own_ranges() {
    let Some(gcs) = FakeGcs::start() else { return };
    let dir = tempfile::tempdir().expect("tempdir");
    gcs.create_bucket("train");
    let parts: Vec<Vec<u8>> =
        [3 * CHUNK + 1234, 777, 4 * CHUNK - 3].iter().zip(1..).map(|(&n, s)| bytes_of(n, s)).collect();
    for (i, part) in parts.iter().enumerate() {
        gcs.put("train", &format!("bytes/part {i}.bin"), part);
    }
    gcs.put("train", "bytesx/other.bin", b"not under the prefix");
    let bytes_expected = parts.concat();
    let shards: Vec<Vec<u8>> = (0..2).map(|s| bytes_of(2 * (50_000 + s * 333), 10 + s as u64)).collect();
    for (i, shard) in shards.iter().enumerate() {
        gcs.put("train", &format!("tokens/shard-{i}.npy"), &npy_u16(shard));
    }
    let tokens_expected = shards.concat();

    let node = common::source_node(dir.path(), &gcs.env(), "");
    node.ctl_ok(&["dataset", "create", "b", "--kind", "bytes", "--source", "gs://train/bytes/"]);
    node.ctl_ok(&["dataset", "create", "t", "--kind", "tokens:u16", "--source", "gs://train/tokens/"]);
    assert_eq!(stat(&node, "b")["length_bytes"], bytes_expected.len());
    assert_eq!(stat(&node, "t")["length_bytes"], tokens_expected.len());
    assert_eq!(stat(&node, "b")["cache"]["chunks_present"], 0, "nothing is fetched at create");

    let client = Client::connect(&node.endpoint).expect("connect");
    let tokens = client.open("t").expect("open");
    let whole = [(0, tokens_expected.len() as u32)];
    assert_exact(&tokens_expected, &whole, &read(&tokens, &whole));
    let bytes = client.open("b").expect("open");
    let first_chunks: Vec<(u64, u32)> =
        [0, parts[0].len(), parts[0].len() + parts[1].len()].iter().map(|&start| (start as u64 + 5, 100)).collect();
    assert_exact(&bytes_expected, &first_chunks, &read(&bytes, &first_chunks));

    gcs.put("train", "bytes/part 0.bin", &bytes_of(parts[0].len(), 99));
    gcs.delete("train", "bytes/part 2.bin");
    let part2 = (parts[0].len() + parts[1].len()) as u64;
    let got = read(&bytes, &[(2 * CHUNK as u64 + 7, 1000), (part2 + 2 * CHUNK as u64, 1000)]);
    assert_eq!(got[0].0, RangeStatus::SourceChanged, "a cold chunk of the rewritten object");
    assert_eq!(got[1].0, RangeStatus::SourceChanged, "a cold chunk of the deleted object");
    let cache = &stat(&node, "b")["cache"];
    assert!(cache["source_changed"].as_u64() >= Some(2), "{cache}");
    assert_exact(&bytes_expected, &first_chunks, &read(&bytes, &first_chunks));
    let mut rng = rand::rngs::SmallRng::seed_from_u64(3);
    let part1: Vec<(u64, u32)> = random_ranges(&mut rng, parts[1].len(), 8)
        .into_iter()
        .map(|(offset, len)| (offset + parts[0].len() as u64, len))
        .collect();
    assert_exact(&bytes_expected, &part1, &read(&bytes, &part1));
}

/// A bucket that does not exist and a prefix with no objects are refused
/// at create with what is wrong, and neither makes a dataset.
#[test]
fn a_missing_bucket_and_an_empty_prefix_are_refused_and_make_nothing() {
    let Some(gcs) = FakeGcs::start() else { return };
    let dir = tempfile::tempdir().expect("tempdir");
    gcs.create_bucket("train");
    gcs.put("train", "data/a.bin", &bytes_of(1000, 1));
    let node = common::source_node(dir.path(), &gcs.env(), "");
    let refusals = [("gs://nothere/data/", "no bucket named nothere"), ("gs://train/empty/", "no objects")];
    for (source, says) in refusals {
        let refused = node.ctl(&["dataset", "create", "d", "--kind", "bytes", "--source", source]);
        let said = String::from_utf8_lossy(&refused.stderr);
        assert!(!refused.status.success() && said.contains(says), "{source}: {said}");
    }
    let listed: serde_json::Value = serde_json::from_str(&node.ctl_ok(&["--json", "dataset", "ls"])).expect("ls json");
    assert_eq!(listed, serde_json::json!([]), "nothing was made");
}
