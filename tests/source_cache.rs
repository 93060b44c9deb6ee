//! Source-backed datasets against a real S3-compatible server (moto, on
//! loopback, behind a proxy that counts requests and injects faults): cold
//! reads of every kind byte-exact, a warm second pass that reaches no
//! server, a changed object failing only its ranges, retried faults that
//! never serve a wrong byte, and a warm killed midway that resumes and
//! hashes as an ingest of the same files does.

mod common;

use std::time::{Duration, Instant};

use common::reads::{assert_exact, bytes_of, random_ranges, read, stat};
use common::s3::{Fault, S3};
use common::{npy_u16, NodeProcess};
use rand::{Rng, SeedableRng};
use sluice_client::blocking::Client;
use sluice_client::RangeStatus;

const CHUNK: usize = 64 * 1024;

/// A node pointed at `s3` whose fetches give up fast.
fn node_for(s3: &S3, dir: &std::path::Path) -> NodeProcess {
    common::source_node(dir, &s3.env(), "")
}

/// Every kind from a source: random unaligned ranges of a cold dataset
/// come back byte-exact against the source objects; a second pass over
/// the same ranges sends no GET to the server.
#[test]
fn cold_reads_of_every_kind_are_byte_exact_and_a_second_pass_reaches_no_server() {
    let Some(s3) = S3::start() else { return };
    let dir = tempfile::tempdir().expect("tempdir");
    s3.create_bucket("train");
    // bytes: three objects of unaligned sizes under a prefix.
    let parts: Vec<Vec<u8>> =
        [3 * CHUNK + 1234, 777, 5 * CHUNK - 3].iter().zip(1..).map(|(&n, s)| bytes_of(n, s)).collect();
    for (i, part) in parts.iter().enumerate() {
        s3.put("train", &format!("bytes/part-{i}.bin"), part);
    }
    s3.put("train", "bytesx/other.bin", b"not under the prefix");
    let bytes_expected = parts.concat();
    // tokens: .npy arrays, whose headers are not data.
    let shards: Vec<Vec<u8>> = (0..2).map(|s| bytes_of(2 * (100_000 + s * 333), 10 + s as u64)).collect();
    for (i, shard) in shards.iter().enumerate() {
        s3.put("train", &format!("tokens/shard-{i}.npy"), &npy_u16(shard));
    }
    let tokens_expected = shards.concat();
    // records: one data object and its offsets object.
    let mut record_data = Vec::new();
    let mut offsets = vec![0u64];
    for i in 0..500u64 {
        record_data.extend(bytes_of((i * 97 % 3000) as usize, i));
        offsets.push(record_data.len() as u64);
    }
    s3.put("train", "records/data.bin", &record_data);
    s3.put("train", "records/offsets.idx", &offsets.iter().flat_map(|o| o.to_le_bytes()).collect::<Vec<u8>>());
    // wds: two tar shards.
    let mut tar_expected = Vec::new();
    for shard in 0..2 {
        let members: Vec<(String, Vec<u8>)> = (0..20)
            .flat_map(|i| {
                let key = format!("s{shard:02}{i:03}");
                [(format!("{key}.txt"), bytes_of(100 + i, i as u64)), (format!("{key}.bin"), bytes_of(9000 + i, 7))]
            })
            .collect();
        let refs: Vec<(&str, &[u8])> = members.iter().map(|(n, b)| (n.as_str(), b.as_slice())).collect();
        let tar = sluice_proto::tar::write_tar(&refs);
        s3.put("train", &format!("wds/shard-{shard}.tar"), &tar);
        tar_expected.extend(tar);
    }

    let node = node_for(&s3, dir.path());
    node.ctl_ok(&["dataset", "create", "b", "--kind", "bytes", "--source", "s3://train/bytes/"]);
    node.ctl_ok(&["dataset", "create", "t", "--kind", "tokens:u16", "--source", "s3://train/tokens/"]);
    node.ctl_ok(&[
        "dataset",
        "create",
        "r",
        "--kind",
        "records",
        "--source",
        "s3://train/records/data.bin",
        "--index",
        "s3://train/records/offsets.idx",
    ]);
    node.ctl_ok(&[
        "dataset",
        "create",
        "w",
        "--kind",
        "wds",
        "--source",
        "s3://train/wds/shard-0.tar,s3://train/wds/shard-1.tar",
    ]);
    assert_eq!(stat(&node, "b")["length_bytes"], bytes_expected.len());
    assert_eq!(stat(&node, "t")["length_bytes"], tokens_expected.len());
    assert_eq!(stat(&node, "r")["record_count"], 500);
    assert_eq!(stat(&node, "w")["record_count"], 40);
    assert_eq!(stat(&node, "b")["cache"]["chunks_present"], 0, "nothing is fetched at create");

    let client = Client::connect(&node.endpoint).expect("connect");
    let mut rng = rand::rngs::SmallRng::seed_from_u64(5);
    let mut passes = Vec::new();
    for (name, expected) in [("b", &bytes_expected), ("t", &tokens_expected), ("r", &record_data), ("w", &tar_expected)]
    {
        let dataset = client.open(name).expect("open");
        assert_eq!(dataset.len_bytes(), expected.len() as u64);
        let ranges = random_ranges(&mut rng, expected.len(), 40);
        assert_exact(expected, &ranges, &read(&dataset, &ranges));
        passes.push((dataset, ranges, expected));
    }
    // Each record read through its index entry.
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    let records = runtime.block_on(async {
        let client = sluice_client::Client::connect(&node.endpoint).await.expect("connect");
        client.open("r").await.expect("open").record_index().await.expect("index")
    });
    assert_eq!(records.len(), 500);
    assert_eq!(records[499], (offsets[499], offsets[500] - offsets[499]));

    let gets = s3.gets();
    assert!(gets > 0, "the cold pass fetched from the server");
    for (dataset, ranges, expected) in &passes {
        assert_exact(expected, ranges, &read(dataset, ranges));
    }
    assert_eq!(s3.gets(), gets, "the second pass was served from the node alone");
    let cache = &stat(&node, "b")["cache"];
    assert!(cache["chunks_filled"].as_u64() > Some(0) && cache["reads_present"].as_u64() > Some(0), "{cache}");
}

/// Object keys as people name them: with spaces, `#`, `?`, `%`, `+` and
/// letters outside ASCII, beside the empty "folder" objects consoles
/// write. Every key is read back exact, the folders are passed over, a key
/// named by its percent-encoded URL is found, and a URL that would lose
/// part of its key (a raw `#`) or a prefix without its `/` is refused with
/// what to write instead.
#[test]
fn keys_with_url_characters_read_back_and_folder_objects_are_passed_over() {
    let Some(s3) = S3::start() else { return };
    let dir = tempfile::tempdir().expect("tempdir");
    s3.create_bucket("train");
    let keys = ["a%20b.bin", "c%23d.bin", "e%3Ff.bin", "g%2541.bin", "h+i.bin", "%C3%BC.bin"];
    let mut expected = Vec::new();
    for (i, key) in keys.iter().enumerate() {
        let data = bytes_of(1000 + i * 77, 40 + i as u64);
        s3.put_public("train", &format!("odd/{key}"), &data);
        expected.push(data);
    }
    s3.put_public("train", "odd/sub/", b"");
    s3.put_public("train", "odd/sub/inner.bin", b"inner");
    s3.put_public("train", "odd/zz-empty.bin", b"");
    // In key order: "a b", "c#d", "e?f", "g%41", "h+i", "sub/inner", "ü".
    expected.insert(5, b"inner".to_vec());
    let expected = expected.concat();

    let node = node_for(&s3, dir.path());
    node.ctl_ok(&["dataset", "create", "odd", "--kind", "bytes", "--source", "s3://train/odd/"]);
    let record = stat(&node, "odd");
    assert_eq!(record["files_ingested"], 7, "the folder and the empty object are passed over: {record}");
    let client = Client::connect(&node.endpoint).expect("connect");
    let dataset = client.open("odd").expect("open");
    let whole = [(0, expected.len() as u32)];
    assert_exact(&expected, &whole, &read(&dataset, &whole));

    node.ctl_ok(&["dataset", "create", "one", "--kind", "bytes", "--source", "s3://train/odd/c%23d.bin"]);
    let dataset = client.open("one").expect("open");
    let first = [(0, 1077)];
    assert_exact(&expected[1000..], &first, &read(&dataset, &first));

    let refused = node.ctl(&["dataset", "create", "raw", "--kind", "bytes", "--source", "s3://train/odd/c#d.bin"]);
    let said = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success() && said.contains("%23"), "{said}");
    let refused = node.ctl(&["dataset", "create", "prefix", "--kind", "bytes", "--source", "s3://train/odd"]);
    let said = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success() && said.contains("end the URL with '/'"), "{said}");
}

/// A store's refusal reaches the operator as the store's code and
/// message (and its request id), not as the XML document it came in; a
/// single object in a missing bucket says the bucket is missing; no
/// dataset is made.
#[test]
fn a_missing_bucket_is_refused_in_the_store_s_words_not_its_xml() {
    let Some(s3) = S3::start() else { return };
    let dir = tempfile::tempdir().expect("tempdir");
    let node = node_for(&s3, dir.path());
    let refused = node.ctl(&["dataset", "create", "gone", "--kind", "bytes", "--source", "s3://no-such-bucket/p/"]);
    let said = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success(), "{said}");
    assert!(said.contains("404 Not Found: NoSuchBucket: The specified bucket does not exist (request id "), "{said}");
    assert!(!said.contains('<') && !said.contains("HostId"), "the XML body is gone: {said}");
    // A HEAD's 404 has no body: the listing beside it names the bucket.
    let refused = node.ctl(&["dataset", "create", "gone", "--kind", "bytes", "--source", "s3://no-such-bucket/k.bin"]);
    let said = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success(), "{said}");
    assert!(said.contains("404 Not Found; listing under it: ") && said.contains("NoSuchBucket"), "{said}");
    assert!(!node.ctl_ok(&["dataset", "ls"]).contains("gone"));
}

/// A prefix of `.npy` arrays that holds another file too (a
/// `stats.json`, here of a whole number of tokens) is refused by that
/// file's name, not spliced into the tokens; the arrays named one by one
/// make the dataset.
#[test]
fn tokens_from_arrays_beside_other_objects_are_refused_by_name() {
    let Some(s3) = S3::start() else { return };
    let dir = tempfile::tempdir().expect("tempdir");
    s3.create_bucket("train");
    let shards: Vec<Vec<u8>> = (0..2).map(|s| bytes_of(2 * (1000 + s), 60 + s as u64)).collect();
    for (i, shard) in shards.iter().enumerate() {
        s3.put("train", &format!("tokens/shard-{i}.npy"), &npy_u16(shard));
    }
    s3.put("train", "tokens/stats.json", b"{\"tokens\": 20002}\n");
    let node = node_for(&s3, dir.path());
    let refused = node.ctl(&["dataset", "create", "t", "--kind", "tokens:u16", "--source", "s3://train/tokens/"]);
    let said = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success() && said.contains("stats.json: not an .npy array"), "{said}");
    node.ctl_ok(&[
        "dataset",
        "create",
        "t",
        "--kind",
        "tokens:u16",
        "--source",
        "s3://train/tokens/shard-0.npy,s3://train/tokens/shard-1.npy",
    ]);
    let expected = shards.concat();
    let dataset = Client::connect(&node.endpoint).expect("connect").open("t").expect("open");
    let whole = [(0, expected.len() as u32)];
    assert_exact(&expected, &whole, &read(&dataset, &whole));
}

/// A LitData token dataset read in place: its `index.json` orders the
/// chunks (here against their keys' order), each chunk's header is checked
/// from a ranged read and skipped, and what does not fit is refused by
/// name, creating nothing.
#[test]
fn a_litdata_token_dataset_is_read_in_its_index_order_past_its_chunk_headers() {
    use sluice_proto::litdata::{write_chunk, write_index};
    let Some(s3) = S3::start() else { return };
    let dir = tempfile::tempdir().expect("tempdir");
    s3.create_bucket("train");
    let sequence = |seed: u64, tokens: usize| -> Vec<u8> { bytes_of(4 * tokens, seed) };
    let first = [sequence(1, 700), sequence(2, 333)];
    let second = [sequence(3, 50_000)];
    s3.put("train", "lit/chunk-0-0.bin", &write_chunk(&second));
    s3.put("train", "lit/chunk-1-0.bin", &write_chunk(&first));
    let index =
        write_index("no_header_tensor:16", "TokensLoader", &[("chunk-1-0.bin", 2, 1033), ("chunk-0-0.bin", 1, 50_000)]);
    s3.put("train", "lit/index.json", index.as_bytes());
    let expected = [first.concat(), second.concat()].concat();

    let node = node_for(&s3, dir.path());
    let refused = node.ctl(&["dataset", "create", "l16", "--kind", "tokens:u16", "--source", "s3://train/lit/"]);
    let said = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success() && said.contains("go into a tokens:u32 dataset, not tokens:u16"), "{said}");
    node.ctl_ok(&["dataset", "create", "l", "--kind", "tokens:u32", "--source", "s3://train/lit/"]);
    assert_eq!(stat(&node, "l")["length_bytes"], expected.len() as u64);
    let dataset = Client::connect(&node.endpoint).expect("connect").open("l").expect("open");
    let whole = [(0, expected.len() as u32)];
    assert_exact(&expected, &whole, &read(&dataset, &whole));
    let mut rng = rand::rngs::SmallRng::seed_from_u64(21);
    let ranges = random_ranges(&mut rng, expected.len(), 64);
    assert_exact(&expected, &ranges, &read(&dataset, &ranges));
    // Warmed, it hashes as the same directory ingested by `sluicectl` does.
    let local = dir.path().join("lit");
    std::fs::create_dir(&local).expect("a directory");
    std::fs::write(local.join("chunk-0-0.bin"), write_chunk(&second)).expect("written");
    std::fs::write(local.join("chunk-1-0.bin"), write_chunk(&first)).expect("written");
    std::fs::write(local.join("index.json"), &index).expect("written");
    node.ctl_ok(&["dataset", "create", "lit-local", "--kind", "tokens:u32"]);
    node.ctl_ok(&["dataset", "ingest", "lit-local", local.to_str().expect("utf-8 path")]);
    node.ctl_ok(&["dataset", "seal", "lit-local"]);
    assert!(node.ctl_ok(&["dataset", "warm", "l"]).contains("is warm"));
    let (warmed, ingested) = (stat(&node, "l"), stat(&node, "lit-local"));
    assert_eq!(warmed["content_hash"], ingested["content_hash"]);
    assert_eq!(ingested["length_bytes"], expected.len() as u64);

    // A stray object, a chunk cut short, a chunk the index names that is
    // not there: each refused by name.
    s3.put("train", "stray/index.json", index.as_bytes());
    s3.put("train", "stray/chunk-0-0.bin", &write_chunk(&second));
    s3.put("train", "stray/chunk-1-0.bin", &write_chunk(&first));
    s3.put("train", "stray/README.md", b"tokenized with the GPT-2 tokenizer\n");
    s3.put("train", "cut/index.json", index.as_bytes());
    s3.put("train", "cut/chunk-0-0.bin", &write_chunk(&second)[..1000]);
    s3.put("train", "cut/chunk-1-0.bin", &write_chunk(&first));
    s3.put("train", "gone/index.json", index.as_bytes());
    s3.put("train", "gone/chunk-1-0.bin", &write_chunk(&first));
    for (prefix, why) in [
        ("stray", "stray/README.md: not a chunk"),
        ("cut", "cut/chunk-0-0.bin: LitData chunk: its offsets end at byte 200012, the file has 1000"),
        ("gone", "names chunk s3://train/gone/chunk-0-0.bin, which the source does not hold"),
    ] {
        let refused = node.ctl(&[
            "dataset",
            "create",
            prefix,
            "--kind",
            "tokens:u32",
            "--source",
            &format!("s3://train/{prefix}/"),
        ]);
        let said = String::from_utf8_lossy(&refused.stderr);
        assert!(!refused.status.success() && said.contains(why), "{prefix}: {said}");
        let listed = node.ctl_ok(&["dataset", "ls"]);
        assert!(!listed.lines().any(|line| line.starts_with(prefix)), "{prefix} was created: {listed}");
    }
}

/// Two servers on one host are two sources: objects of one name on
/// either, read over `http://` in one dataset, come each from its own
/// server, not both from the first one asked.
#[test]
fn two_servers_on_one_host_are_two_sources() {
    let Some(first) = S3::start() else { return };
    let Some(second) = S3::start() else { return };
    let dir = tempfile::tempdir().expect("tempdir");
    for (s3, data) in [(&first, b"from the first server".as_slice()), (&second, b"and from the second".as_slice())] {
        s3.create_bucket("train");
        s3.put_public("train", "part.bin", data);
    }
    // http sources are fetched only where the node's config lists them.
    let allow = format!(
        "source_allow = [\"http://127.0.0.1:{}/train/\", \"http://127.0.0.1:{}/train/\"]\n",
        first.moto_port, second.moto_port
    );
    let node = common::source_node(dir.path(), &first.env(), &allow);
    let urls = format!(
        "http://127.0.0.1:{}/train/part.bin,http://127.0.0.1:{}/train/part.bin",
        first.moto_port, second.moto_port
    );
    node.ctl_ok(&["dataset", "create", "two", "--kind", "bytes", "--source", &urls]);
    let dataset = Client::connect(&node.endpoint).expect("connect").open("two").expect("open");
    let expected = b"from the first serverand from the second";
    let whole = [(0, expected.len() as u32)];
    assert_exact(expected, &whole, &read(&dataset, &whole));
}

/// An object overwritten after create fails its ranges as source changed,
/// and says so in `dataset stat`; other objects still serve.
#[test]
fn an_overwritten_object_fails_its_ranges_as_source_changed_and_the_others_still_serve() {
    let Some(s3) = S3::start() else { return };
    let dir = tempfile::tempdir().expect("tempdir");
    s3.create_bucket("src");
    let a = bytes_of(2 * CHUNK, 1);
    let b = bytes_of(2 * CHUNK, 2);
    s3.put("src", "d/a", &a);
    s3.put("src", "d/b", &b);
    let node = node_for(&s3, dir.path());
    node.ctl_ok(&["dataset", "create", "d", "--kind", "bytes", "--source", "s3://src/d/"]);
    s3.put("src", "d/b", &bytes_of(2 * CHUNK, 3));
    let client = Client::connect(&node.endpoint).expect("connect");
    let dataset = client.open("d").expect("open");
    let got = read(&dataset, &[(100, 5000), (2 * CHUNK as u64 + 10, 5000)]);
    assert_eq!(got[0].0, RangeStatus::Ok);
    assert!(got[0].1 == a[100..5100]);
    assert_eq!(got[1].0, RangeStatus::SourceChanged);
    let cache = &stat(&node, "d")["cache"];
    assert!(cache["source_changed"].as_u64() >= Some(1), "{cache}");
    assert!(cache["last_error"].as_str().is_some_and(|e| e.contains("changed")), "{cache}");
    // A vanished object too; what was filled before still serves.
    s3.delete("src", "d/a");
    let got = read(&dataset, &[(100, 5000), (CHUNK as u64 + 7, 100)]);
    assert_eq!(got[0].0, RangeStatus::Ok, "a filled chunk needs no source");
    assert_eq!(got[1].0, RangeStatus::SourceChanged);
}

/// 503 SlowDown, a reset mid-body, a short body and a stalled response
/// are each retried and the read comes back exact; past the retry budget
/// the ranges fail as unavailable and a later read, the store well again,
/// fills them. No wrong byte is ever served.
#[test]
fn faults_are_retried_then_fail_clearly_and_no_wrong_byte_is_served() {
    let Some(s3) = S3::start() else { return };
    let dir = tempfile::tempdir().expect("tempdir");
    s3.create_bucket("faults");
    let data = bytes_of(16 * CHUNK, 9);
    s3.put("faults", "obj", &data);
    let node = node_for(&s3, dir.path());
    node.ctl_ok(&["dataset", "create", "f", "--kind", "bytes", "--source", "s3://faults/obj"]);
    let client = Client::connect(&node.endpoint).expect("connect");
    let dataset = client.open("f").expect("open");
    for (i, fault) in [Fault::SlowDown, Fault::ResetMidBody, Fault::ShortBody, Fault::Stall(Duration::from_secs(4))]
        .into_iter()
        .enumerate()
    {
        let before = s3.gets();
        s3.inject(&[fault]);
        let range = [(i as u64 * 2 * CHUNK as u64 + 11, 3000)];
        assert_exact(&data, &range, &read(&dataset, &range));
        assert_eq!(s3.gets() - before, 2, "{fault:?}: one failed attempt, one retry");
    }
    s3.always(Some(Fault::SlowDown));
    let range = [(10 * CHUNK as u64, 100)];
    let got = read(&dataset, &range);
    assert_eq!(got[0].0, RangeStatus::SourceUnavailable);
    let cache = &stat(&node, "f")["cache"];
    assert!(cache["source_errors"].as_u64() >= Some(1), "{cache}");
    s3.always(None);
    assert_exact(&data, &range, &read(&dataset, &range));
    // Everything filled so far is what the source holds.
    let whole = [(0, data.len() as u32)];
    assert_exact(&data, &whole, &read(&dataset, &whole));
}

fn cache_of(node: &NodeProcess, name: &str) -> serde_json::Value {
    stat(node, name)["cache"].clone()
}

/// A warm SIGKILLed midway goes on at restart by itself, finishes, and
/// the content hash equals that of an ingest of the same files.
#[test]
fn a_warm_killed_midway_resumes_after_restart_and_hashes_as_an_ingest_does() {
    let Some(s3) = S3::start() else { return };
    let dir = tempfile::tempdir().expect("tempdir");
    s3.create_bucket("warm");
    let parts: Vec<Vec<u8>> = (0..3).map(|i| bytes_of(100 * CHUNK + 999 * i, 20 + i as u64)).collect();
    let mut files = Vec::new();
    for (i, part) in parts.iter().enumerate() {
        s3.put("warm", &format!("p/{i}"), part);
        let path = dir.path().join(format!("{i}.bin"));
        std::fs::write(&path, part).expect("write");
        files.push(path);
    }
    // A slow store, so the kill lands while the warm is under way.
    s3.always(Some(Fault::Stall(Duration::from_millis(150))));
    let mut node = node_for(&s3, dir.path());
    node.ctl_ok(&["dataset", "create", "warmed", "--kind", "bytes", "--source", "s3://warm/p/"]);
    node.ctl_ok(&["dataset", "warm", "warmed", "--parallel", "1", "--no-wait"]);
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let present = cache_of(&node, "warmed")["chunks_present"].as_u64().unwrap_or(0);
        if present > 0 {
            break;
        }
        assert!(Instant::now() < deadline, "the warm filled nothing in 60 s");
        std::thread::sleep(Duration::from_millis(20));
    }
    node.kill();
    s3.always(None);
    let node = node_for(&s3, dir.path());
    let deadline = Instant::now() + Duration::from_secs(120);
    let cache = loop {
        let cache = cache_of(&node, "warmed");
        if cache["hydrated"] == true {
            break cache;
        }
        assert!(Instant::now() < deadline, "the warm did not go on and finish after the restart: {cache}");
        std::thread::sleep(Duration::from_millis(100));
    };
    let total = cache["chunks_total"].as_u64().expect("total");
    assert_eq!(cache["chunks_present"].as_u64(), Some(total));
    let filled = cache["chunks_filled"].as_u64().unwrap_or(0);
    assert!(filled > 0 && filled < total, "the restart fetched what was missing, and only that: {cache}");
    let gets = s3.gets();
    let out = node.ctl_ok(&["dataset", "warm", "warmed"]);
    assert!(out.contains("is warm"), "{out}");
    assert_eq!(s3.gets(), gets, "a warm dataset is not fetched again");
    // The same files ingested give the same content hash.
    let refs: Vec<&std::path::Path> = files.iter().map(|p| p.as_path()).collect();
    common::sealed_dataset(&node, "ingested", &refs);
    let warmed = stat(&node, "warmed");
    assert_eq!(warmed["content_hash"], stat(&node, "ingested")["content_hash"]);
    assert!(warmed["content_hash"].as_str().is_some_and(|h| h.starts_with("blake3:")));
    let whole = parts.concat();
    let client = Client::connect(&node.endpoint).expect("connect");
    let dataset = client.open("warmed").expect("open");
    let all = [(0, whole.len() as u32)];
    assert_exact(&whole, &all, &read(&dataset, &all));
}

/// A cache budget smaller than the dataset: reads stay byte-exact while
/// chunks are evicted and filled again; the budget holds; a pinned
/// source-backed dataset and an ingested one lose nothing.
#[test]
fn under_a_budget_smaller_than_the_dataset_reads_stay_exact_and_pinned_and_ingested_data_stay() {
    let Some(s3) = S3::start() else { return };
    let dir = tempfile::tempdir().expect("tempdir");
    s3.create_bucket("budget");
    let big = bytes_of(40 * CHUNK, 31);
    let small = bytes_of(4 * CHUNK, 32);
    s3.put("budget", "big", &big);
    s3.put("budget", "small", &small);
    let ingested_file = dir.path().join("ingested.bin");
    std::fs::write(&ingested_file, bytes_of(10 * CHUNK, 33)).expect("write");
    let budget = 16 * CHUNK;
    let node = common::source_node(dir.path(), &s3.env(), &format!("cache_bytes_max = {budget}\n"));
    node.ctl_ok(&["dataset", "create", "big", "--kind", "bytes", "--source", "s3://budget/big"]);
    node.ctl_ok(&["dataset", "create", "small", "--kind", "bytes", "--source", "s3://budget/small"]);
    common::sealed_dataset(&node, "ingested", &[ingested_file.as_path()]);
    node.ctl_ok(&["dataset", "pin", "small"]);
    node.ctl_ok(&["dataset", "warm", "small"]);
    let refused = node.ctl(&["dataset", "warm", "big"]);
    assert!(String::from_utf8_lossy(&refused.stderr).contains("larger than the node's cache budget"), "{refused:?}");

    let client = Client::connect(&node.endpoint).expect("connect");
    let dataset = client.open("big").expect("open");
    let ingested = client.open("ingested").expect("open");
    let ingested_bytes = std::fs::read(&ingested_file).expect("read");
    let mut rng = rand::rngs::SmallRng::seed_from_u64(17);
    for _ in 0..60 {
        let ranges: Vec<(u64, u32)> = (0..3)
            .map(|_| {
                let len = rng.gen_range(1..10_000u32);
                (rng.gen_range(0..(big.len() - len as usize) as u64), len)
            })
            .collect();
        assert_exact(&big, &ranges, &read(&dataset, &ranges));
        let used = node.gauge("sluice_cache_used_bytes").expect("used gauge");
        assert!(used <= budget as f64, "{used} bytes cached over a budget of {budget}");
    }
    let cache = cache_of(&node, "big");
    assert!(cache["chunks_evicted"].as_u64() > Some(0), "{cache}");
    assert!(cache["chunks_present"].as_u64() <= Some(16 - 4), "{cache}");
    let pinned = cache_of(&node, "small");
    assert_eq!(pinned["chunks_present"], pinned["chunks_total"], "a pinned dataset keeps every chunk: {pinned}");
    assert_eq!(pinned["chunks_evicted"], 0);
    // `sluicectl top` shows both caches, and only they: the ingested
    // dataset has none.
    let top: serde_json::Value = serde_json::from_str(&node.ctl_ok(&["top", "--json", "--once"])).expect("json");
    let names: Vec<&str> =
        top["caches"].as_array().expect("caches").iter().filter_map(|c| c["name"].as_str()).collect();
    assert_eq!(names, ["big", "small"], "{top}");
    assert_eq!(top["caches"][0]["bytes_evicted"], cache["bytes_evicted"]);
    let table = node.ctl_ok(&["top", "--once"]);
    let row = |name: &str| table.lines().find(|l| l.starts_with(&format!("{name} "))).map(str::to_string);
    let small_row = row("small").unwrap_or_else(|| panic!("no row for small: {table}"));
    assert!(small_row.contains("100.0%") && small_row.ends_with("hydrated,pinned"), "{small_row}");
    assert!(row("big").is_some_and(|r| !r.contains(" 0B ")), "big's evictions are shown: {table}");
    assert!(row("ingested").is_none(), "{table}");
    let gets = s3.gets();
    let small_dataset = client.open("small").expect("open");
    let all = [(0, small.len() as u32)];
    assert_exact(&small, &all, &read(&small_dataset, &all));
    let all = [(0, ingested_bytes.len() as u32)];
    assert_exact(&ingested_bytes, &all, &read(&ingested, &all));
    assert_eq!(s3.gets(), gets, "the pinned and the ingested datasets were read from the node alone");
    // Unpinned, its chunks may go: the big dataset's reads evict them.
    node.ctl_ok(&["dataset", "unpin", "small"]);
    for chunk in 0..40u64 {
        let range = [(chunk * CHUNK as u64, 100)];
        assert_exact(&big, &range, &read(&dataset, &range));
    }
    assert!(cache_of(&node, "small")["chunks_evicted"].as_u64() > Some(0));
}

/// With `prefetch_steps`, the window loader tells the node the ranges of
/// the steps ahead and the node fills them from the source before they
/// are read: once the first steps are in, every read is served from the
/// node (no batch waits on a fill), where without it every step's reads
/// wait on the source.
#[test]
fn prefetch_steps_fill_the_steps_ahead_before_they_are_read() {
    use sluice_client::loader::{WindowLoader, WindowLoaderConfig};
    let Some(s3) = S3::start() else { return };
    let dir = tempfile::tempdir().expect("tempdir");
    s3.create_bucket("prefetch");
    let tokens = bytes_of(2 * 400 * CHUNK, 41);
    s3.put("prefetch", "tokens.bin", &tokens);
    let node = node_for(&s3, dir.path());
    for name in ["ahead", "plain"] {
        node.ctl_ok(&["dataset", "create", name, "--kind", "tokens:u16", "--source", "s3://prefetch/tokens.bin"]);
    }
    let config = WindowLoaderConfig {
        window_tokens: 1024,
        global_batch: 8,
        rank: 0,
        world: 1,
        seed: 3,
        samples_per_epoch: Some(4000),
        stride_ratio: None,
        prefetch: 1,
    };
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("rt");
    let reads_filled = |name: &str| cache_of(&node, name)["reads_filled"].as_u64().expect("reads_filled");
    runtime.block_on(async {
        let client = sluice_client::Client::connect(&node.endpoint).await.expect("connect");
        let mut loaders = Vec::new();
        for (name, steps) in [("ahead", 24), ("plain", 0)] {
            let dataset = std::sync::Arc::new(client.open(name).await.expect("open"));
            let mut loader = WindowLoader::new(dataset, &config).expect("loader");
            loader.set_prefetch_steps(steps);
            let first = loader.next_batch().await.expect("step 0");
            assert_eq!(first.step, 0);
            loaders.push(loader);
        }
        // The chunks the node has been told of: step 0 was read and, with
        // one step in flight, the hint named steps 1..=24. Once all of
        // them are present (nothing else reads this dataset) the hint has
        // been filled; counting only the steps read below would let the
        // chunks of steps 0 and 20..=24 stand in for ones still missing.
        let mut wanted = std::collections::BTreeSet::new();
        for step in 0..=24 {
            for start in loaders[0].starts_of_step(step).expect("starts") {
                let (a, b) = (start * 2, start * 2 + 2048);
                wanted.extend(a / CHUNK as u64..b.div_ceil(CHUNK as u64));
            }
        }
        let deadline = Instant::now() + Duration::from_secs(60);
        while (cache_of(&node, "ahead")["chunks_present"].as_u64().unwrap_or(0) as usize) < wanted.len() {
            assert!(Instant::now() < deadline, "the hinted steps were not filled in 60 s");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let (ahead_before, plain_before) = (reads_filled("ahead"), reads_filled("plain"));
        for step in 1..20 {
            for loader in &mut loaders {
                let batch = loader.next_batch().await.expect("batch");
                assert_eq!(batch.step, step);
                for (i, &start) in batch.starts.iter().enumerate() {
                    let at = start as usize * 2;
                    assert!(batch.data[i * 2048..(i + 1) * 2048] == tokens[at..at + 2048], "step {step} sample {i}");
                }
            }
        }
        assert_eq!(reads_filled("ahead"), ahead_before, "with prefetch_steps no read waited on the source");
        assert!(reads_filled("plain") >= plain_before + 15, "without it the reads wait on fills");
    });
}
