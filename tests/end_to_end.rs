//! A real node, real clients, TCP on loopback, io_uring with O_DIRECT on
//! files: what is ingested comes back byte-exact.

mod common;

use common::{assert_socket_io, random_file, sealed_dataset, NodeProcess};
use rand::{Rng, SeedableRng};
use sluice_client::blocking::Client;
use sluice_client::{OpenOptions, RangeStatus, ReadRange};

/// Thousands of random unaligned ranges of 1 byte to 4 MiB, in batches,
/// read back byte-exact from a dataset ingested from three files.
#[test]
fn random_ranges_read_back_byte_exact() {
    random_ranges_read_back_byte_exact_over(&[]);
}

/// The same over the cores' socket rings (io_uring) instead of readiness.
#[test]
fn random_ranges_read_back_byte_exact_over_the_socket_ring() {
    random_ranges_read_back_byte_exact_over(&["--socket-io", "uring"]);
}

fn random_ranges_read_back_byte_exact_over(socket_io: &[&str]) {
    let dir = tempfile::tempdir().expect("tempdir");
    let node = NodeProcess::start_with(&dir.path().join("node"), socket_io);
    assert_socket_io(&node, socket_io);
    let sizes = [9_999_991usize, 1, 14_680_065];
    let mut expected = Vec::new();
    let mut paths = Vec::new();
    for (i, size) in sizes.iter().enumerate() {
        let path = dir.path().join(format!("part{i}.bin"));
        expected.extend(random_file(&path, *size, i as u64));
        paths.push(path);
    }
    let refs: Vec<&std::path::Path> = paths.iter().map(|p| p.as_path()).collect();
    sealed_dataset(&node, "random", &refs);
    // Without namespace devices the dataset is a file under the data dir.
    let namespaces = node.ctl_ok(&["namespaces", "ls"]);
    assert!(namespaces.lines().any(|l| l.starts_with("random") && l.contains(" file ")), "{namespaces}");
    let devices: serde_json::Value = serde_json::from_str(&node.ctl_ok(&["--json", "devices", "ls"])).expect("json");
    assert_eq!(devices[0]["kind"], "data_dir", "{devices}");
    assert_eq!(devices[0]["datasets"], serde_json::json!(["random"]), "{devices}");

    let client = Client::connect(&node.endpoint).expect("connect");
    assert_eq!(client.transport(), "tcp");
    let dataset =
        client.open_with("random", OpenOptions { verify_chunks: true, ..OpenOptions::default() }).expect("open");
    assert_eq!(dataset.len_bytes(), expected.len() as u64);
    assert!(dataset.info().content_hash.starts_with("blake3:"));

    let mut rng = rand::rngs::SmallRng::seed_from_u64(99);
    let mut ranges_read = 0;
    for _batch in 0..20 {
        let mut ranges = Vec::new();
        let mut dest = 0u64;
        for _ in 0..rng.gen_range(50..200) {
            // Mostly small, sometimes up to 4 MiB; log-uniform lengths.
            let len = if rng.gen_ratio(1, 20) { rng.gen_range(1..=4u32 << 20) } else { 1u32 << rng.gen_range(0..16) };
            let len = (len + rng.gen_range(0..len.max(2) / 2)).min(4 << 20);
            let offset = rng.gen_range(0..=expected.len() as u64 - u64::from(len));
            ranges.push(ReadRange { offset, len, dest });
            dest += u64::from(len);
        }
        let mut buf = vec![0u8; dest as usize];
        let statuses = dataset.read_batch(&ranges, &mut buf).expect("batch");
        for (i, r) in ranges.iter().enumerate() {
            assert_eq!(statuses[i], RangeStatus::Ok, "range {i} {r:?}");
            let want = &expected[r.offset as usize..(r.offset + u64::from(r.len)) as usize];
            let got = &buf[r.dest as usize..(r.dest + u64::from(r.len)) as usize];
            assert!(want == got, "range {i} {r:?} differs");
        }
        ranges_read += ranges.len();
    }
    assert!(ranges_read > 1000);

    // The CLI reads the same bytes.
    let out = dir.path().join("out.bin");
    node.ctl_ok(&["read", "random", "--offset", "9999990", "--len", "5000000", "-o", out.to_str().expect("path")]);
    assert!(std::fs::read(&out).expect("read out") == expected[9_999_990..14_999_990]);
    assert_eq!(node.stop().code(), Some(0), "sluiced stops cleanly on SIGTERM");
}

/// The catalog and the data survive a restart; listing and stat show them.
#[test]
fn datasets_survive_restart() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = random_file(&dir.path().join("a.bin"), 300_000, 5);
    let node_dir = dir.path().join("node");
    let node = NodeProcess::start(&node_dir);
    sealed_dataset(&node, "keep", &[&dir.path().join("a.bin")]);
    node.ctl_ok(&["dataset", "create", "later", "--kind", "tokens:u16"]);
    let stat_before = node.ctl_ok(&["dataset", "stat", "keep", "--json"]);
    node.stop();

    let node = NodeProcess::start(&node_dir);
    assert_eq!(node.ctl_ok(&["dataset", "stat", "keep", "--json"]), stat_before);
    let listed: serde_json::Value = serde_json::from_str(&node.ctl_ok(&["dataset", "ls", "--json"])).expect("json");
    let names: Vec<&str> = listed.as_array().expect("array").iter().filter_map(|r| r["name"].as_str()).collect();
    assert_eq!(names, ["keep", "later"]);
    let client = Client::connect(&node.endpoint).expect("connect");
    let dataset = client.open("keep").expect("open");
    let mut buf = vec![0u8; 300_000];
    let statuses = dataset.read_batch(&[ReadRange { offset: 0, len: 300_000, dest: 0 }], &mut buf).expect("read");
    assert_eq!(statuses, [RangeStatus::Ok]);
    assert!(buf == data);

    node.ctl_ok(&["dataset", "rm", "keep"]);
    let gone = dataset.read_batch(&[ReadRange { offset: 0, len: 1, dest: 0 }], &mut buf);
    assert!(gone.is_err(), "a deleted dataset's open handle fails its next batch");
    assert!(!node.ctl(&["dataset", "stat", "keep"]).status.success());
    let files = std::fs::read_dir(node_dir.join("namespaces")).expect("namespaces").count();
    assert_eq!(files, 1, "the deleted dataset's namespace file is released");
}

/// Token datasets take raw `.bin` and `.npy` files of the right dtype, and
/// either compressed with zstd (named `.zst` or `.zstd`: sluicectl
/// decompresses them as it sends them, and its checksum is of the bytes the
/// node stores).
#[test]
fn token_files_ingest_raw_and_npy() {
    let dir = tempfile::tempdir().expect("tempdir");
    let node = NodeProcess::start(&dir.path().join("node"));
    let tokens: Vec<u8> = (0..100_000u32).flat_map(|t| t.to_le_bytes()).collect();
    let mut npy_file = sluice_proto::npy::encode_header("<u4", 100_000);
    npy_file.extend_from_slice(&tokens);
    let files = [
        ("a.bin", tokens.clone()),
        ("b.npy", npy_file.clone()),
        ("c.npy.zst", zstd::encode_all(npy_file.as_slice(), 3).expect("compress")),
        ("d.bin.zstd", zstd::encode_all(tokens.as_slice(), 3).expect("compress")),
    ];
    let mut paths = Vec::new();
    for (name, bytes) in &files {
        let path = dir.path().join(name);
        std::fs::write(&path, bytes).expect("write");
        paths.push(path.to_str().expect("utf-8 path").to_string());
    }
    node.ctl_ok(&["dataset", "create", "toks", "--kind", "tokens:u32"]);
    let mut ingest = vec!["dataset", "ingest", "toks"];
    ingest.extend(paths.iter().map(String::as_str));
    node.ctl_ok(&ingest);
    node.ctl_ok(&["dataset", "seal", "toks"]);
    let stat: serde_json::Value =
        serde_json::from_str(&node.ctl_ok(&["dataset", "stat", "toks", "--json"])).expect("json");
    assert_eq!(stat["length_bytes"], 1_600_000, "four files of 100 000 tokens");
    assert_eq!(stat["kind"], "tokens:u32");
    let client = Client::connect(&node.endpoint).expect("connect");
    let dataset = client.open("toks").expect("open");
    for boundary in [400_000, 800_000, 1_200_000] {
        let mut buf = vec![0u8; 8];
        dataset
            .read_batch(&[ReadRange { offset: boundary - 4, len: 8, dest: 0 }], &mut buf)
            .expect("read across a file boundary");
        assert_eq!(buf, [0x9f, 0x86, 0x01, 0x00, 0, 0, 0, 0], "token 99999 then token 0, at {boundary}");
    }
}
