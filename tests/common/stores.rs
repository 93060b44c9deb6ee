//! What the source tests do the same way against every object store
//! emulator (fake-gcs-server, Azurite): the store's part is making
//! buckets and objects and pointing a node at it; the node's part, and
//! what it must get right against each store's listing, ETags and
//! conditional reads, is here once.

use rand::SeedableRng;
use sluice_client::blocking::Client;
use sluice_client::RangeStatus;

use super::reads::{assert_exact, bytes_of, random_ranges, read, stat};
use super::{npy_u16, NodeProcess};

const CHUNK: usize = 64 * 1024;

/// An object store server a test started.
pub trait StoreServer {
    /// The URL scheme a node names it by (`gs`, `az`).
    fn scheme(&self) -> &'static str;
    /// The environment that points a node at it, with its credentials.
    fn env(&self) -> Vec<(String, String)>;
    /// Makes a bucket (a container, in Azure's words).
    fn create_bucket(&self, bucket: &str);
    /// Writes (or overwrites) an object.
    fn put(&self, bucket: &str, name: &str, bytes: &[u8]);
    fn delete(&self, bucket: &str, name: &str);
}

/// Objects under a prefix (names with spaces) and `.npy` arrays read back
/// exact from cold; then an object rewritten after create and one deleted
/// fail the ranges not yet fetched from them as source changed, and what
/// was fetched before, and the object left alone, still serve.
pub fn cold_reads_are_exact_and_a_changed_object_fails_only_its_own_ranges(server: &dyn StoreServer) {
    let dir = tempfile::tempdir().expect("tempdir");
    let scheme = server.scheme();
    server.create_bucket("train");
    let parts: Vec<Vec<u8>> =
        [3 * CHUNK + 1234, 777, 4 * CHUNK - 3].iter().zip(1..).map(|(&n, s)| bytes_of(n, s)).collect();
    for (i, part) in parts.iter().enumerate() {
        server.put("train", &format!("bytes/part {i}.bin"), part);
    }
    server.put("train", "bytesx/other.bin", b"not under the prefix");
    let bytes_expected = parts.concat();
    let shards: Vec<Vec<u8>> = (0..2).map(|s| bytes_of(2 * (50_000 + s * 333), 10 + s as u64)).collect();
    for (i, shard) in shards.iter().enumerate() {
        server.put("train", &format!("tokens/shard-{i}.npy"), &npy_u16(shard));
    }
    let tokens_expected = shards.concat();

    let node = super::source_node(dir.path(), &server.env(), "");
    node.ctl_ok(&["dataset", "create", "b", "--kind", "bytes", "--source", &format!("{scheme}://train/bytes/")]);
    node.ctl_ok(&["dataset", "create", "t", "--kind", "tokens:u16", "--source", &format!("{scheme}://train/tokens/")]);
    assert_eq!(stat(&node, "b")["length_bytes"], bytes_expected.len());
    assert_eq!(stat(&node, "t")["length_bytes"], tokens_expected.len());
    assert_eq!(stat(&node, "b")["cache"]["chunks_present"], 0, "nothing is fetched at create");

    let client = Client::connect(&node.endpoint).expect("connect");
    let tokens = client.open("t").expect("open");
    let whole = [(0, tokens_expected.len() as u32)];
    assert_exact(&tokens_expected, &whole, &read(&tokens, &whole));
    let bytes = client.open("b").expect("open");
    // The first chunk of each part, fetched now; the rest stay cold.
    let first_chunks: Vec<(u64, u32)> =
        [0, parts[0].len(), parts[0].len() + parts[1].len()].iter().map(|&start| (start as u64 + 5, 100)).collect();
    assert_exact(&bytes_expected, &first_chunks, &read(&bytes, &first_chunks));

    // Part 0 rewritten with other bytes, part 2 deleted.
    server.put("train", "bytes/part 0.bin", &bytes_of(parts[0].len(), 99));
    server.delete("train", "bytes/part 2.bin");
    let part2 = (parts[0].len() + parts[1].len()) as u64;
    let got = read(&bytes, &[(2 * CHUNK as u64 + 7, 1000), (part2 + 2 * CHUNK as u64, 1000)]);
    assert_eq!(got[0].0, RangeStatus::SourceChanged, "a cold chunk of the rewritten object");
    assert_eq!(got[1].0, RangeStatus::SourceChanged, "a cold chunk of the deleted object");
    let cache = &stat(&node, "b")["cache"];
    assert!(cache["source_changed"].as_u64() >= Some(2), "{cache}");
    assert!(cache["last_error"].as_str().is_some_and(|e| e.contains("changed")), "{cache}");
    assert_exact(&bytes_expected, &first_chunks, &read(&bytes, &first_chunks));
    let mut rng = rand::rngs::SmallRng::seed_from_u64(3);
    let part1: Vec<(u64, u32)> = random_ranges(&mut rng, parts[1].len(), 8)
        .into_iter()
        .map(|(offset, len)| (offset + parts[0].len() as u64, len))
        .collect();
    assert_exact(&bytes_expected, &part1, &read(&bytes, &part1));
}

/// A bucket that does not exist (the store's answer says `missing_says`)
/// and a prefix with no objects are refused at create, and neither makes
/// a dataset. The store's answer reaches the operator as its words, not as
/// the XML document it came in.
pub fn a_missing_bucket_and_an_empty_prefix_make_nothing(
    server: &dyn StoreServer,
    dir: &std::path::Path,
    missing_says: &str,
) {
    let scheme = server.scheme();
    server.create_bucket("train");
    server.put("train", "data/a.bin", &bytes_of(1000, 1));
    let node = super::source_node(dir, &server.env(), "");
    for (source, says) in
        [(format!("{scheme}://nothere/data/"), missing_says), (format!("{scheme}://train/empty/"), "no objects")]
    {
        let refused = node.ctl(&["dataset", "create", "d", "--kind", "bytes", "--source", &source]);
        let said = String::from_utf8_lossy(&refused.stderr);
        assert!(!refused.status.success() && said.contains(says), "{source}: {said}");
        assert!(!said.contains('<'), "{source}: no XML: {said}");
    }
    assert_nothing_made(&node);
}

/// The node has no dataset.
pub fn assert_nothing_made(node: &NodeProcess) {
    let listed: serde_json::Value = serde_json::from_str(&node.ctl_ok(&["--json", "dataset", "ls"])).expect("ls json");
    assert_eq!(listed, serde_json::json!([]), "nothing was made");
}
