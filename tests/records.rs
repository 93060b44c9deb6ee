//! `records`, `wds` and `mds` datasets: ingest with an offsets index, fixed-size
//! records, and WebDataset tar shards indexed at ingest; the record loader
//! reads each step's samples in one batch, resumes exactly, and replays.

mod common;

use std::sync::Arc;

use common::NodeProcess;
use sluice_client::loader::{replay_step, LoaderError, RecordLoader, RecordLoaderConfig, StepSchedule};
use sluice_client::Client;

fn config(global_batch: u64) -> RecordLoaderConfig {
    RecordLoaderConfig { global_batch, rank: 0, world: 1, seed: 8, samples_per_epoch: None, prefetch: 3 }
}

/// Variable-size records from a data file plus offsets, across two files;
/// a bad index is refused; loader output, resume and replay are exact.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn variable_records_with_an_index() {
    let dir = tempfile::tempdir().expect("tempdir");
    let node = NodeProcess::start(&dir.path().join("node"));
    node.ctl_ok(&["dataset", "create", "recs", "--kind", "records"]);
    let mut records: Vec<Vec<u8>> = Vec::new();
    for file in 0..2u8 {
        let mut data = Vec::new();
        let mut offsets = vec![0u64];
        for i in 0..300u32 {
            let record: Vec<u8> = (0..(i * 37 % 1000)).map(|b| (b as u8) ^ file ^ (i as u8)).collect();
            data.extend_from_slice(&record);
            offsets.push(data.len() as u64);
            records.push(record);
        }
        let data_path = dir.path().join(format!("part{file}.bin"));
        let index_path = dir.path().join(format!("part{file}.idx"));
        std::fs::write(&data_path, &data).expect("write");
        std::fs::write(&index_path, offsets.iter().flat_map(|o| o.to_le_bytes()).collect::<Vec<u8>>()).expect("write");
        if file == 0 {
            let out = node.ctl(&["dataset", "ingest", "recs", data_path.to_str().expect("p")]);
            assert!(String::from_utf8_lossy(&out.stderr).contains("send its offsets first"));
            let short = dir.path().join("short.idx");
            std::fs::write(&short, [0u64, 5].iter().flat_map(|o| o.to_le_bytes()).collect::<Vec<u8>>()).expect("write");
            let args =
                ["dataset", "ingest", "recs", data_path.to_str().expect("p"), "--index", short.to_str().expect("p")];
            let out = node.ctl(&args);
            assert!(String::from_utf8_lossy(&out.stderr).contains("offsets must run from 0"), "{out:?}");
        }
        node.ctl_ok(&[
            "dataset",
            "ingest",
            "recs",
            data_path.to_str().expect("p"),
            "--index",
            index_path.to_str().expect("p"),
        ]);
    }
    node.ctl_ok(&["dataset", "seal", "recs"]);
    let stat: serde_json::Value =
        serde_json::from_str(&node.ctl_ok(&["dataset", "stat", "recs", "--json"])).expect("json");
    assert_eq!(stat["record_count"], 600);

    let client = Client::connect(&node.endpoint).await.expect("connect");
    let dataset = Arc::new(client.open("recs").await.expect("open"));
    let index: Arc<[(u64, u64)]> = dataset.record_index().await.expect("index").into();
    assert_eq!(index.len(), 600);
    let mut straight = RecordLoader::new(Arc::clone(&dataset), Arc::clone(&index), &config(20)).expect("loader");
    let mut seen = Vec::new();
    let mut expected_steps = Vec::new();
    for _ in 0..45 {
        let batch = straight.next_batch().await.expect("batch");
        for (i, &r) in batch.records.iter().enumerate() {
            assert_eq!(batch.sample(i), records[r as usize].as_slice(), "record {r}");
            seen.push(r);
        }
        expected_steps.push(batch.records.clone());
    }
    let mut epoch0 = seen[..600].to_vec();
    epoch0.sort_unstable();
    assert_eq!(epoch0, (0..600).collect::<Vec<u64>>(), "an epoch visits every record once");

    let mut first = RecordLoader::new(Arc::clone(&dataset), Arc::clone(&index), &config(20)).expect("loader");
    for _ in 0..10 {
        first.next_batch().await.expect("batch");
    }
    let state = first.state();
    drop(first);
    let mut resumed =
        RecordLoader::from_state(Arc::clone(&dataset), Arc::clone(&index), state.clone(), 0, 1, 2).expect("resume");
    for (step, expected) in expected_steps.iter().enumerate().skip(10) {
        assert_eq!(&resumed.next_batch().await.expect("batch").records, expected, "step {step}");
    }
    // Three workers on a schedule each (steps w, w + 3, ... before 30):
    // taken in worker order, their batches are the straight run's steps.
    let mut workers: Vec<RecordLoader> = (0..3u64)
        .map(|w| {
            let mut loader = RecordLoader::new(Arc::clone(&dataset), Arc::clone(&index), &config(20)).expect("loader");
            loader.set_schedule(StepSchedule { first: w, stride: 3, end: Some(30) });
            loader
        })
        .collect();
    for (step, expected) in expected_steps.iter().enumerate().take(30) {
        let batch = workers[step % 3].next_batch().await.expect("batch");
        assert_eq!((batch.step, &batch.records), (step as u64, expected), "step {step}");
    }
    for worker in &mut workers {
        assert!(worker.finished(), "every step of the schedule was returned");
        assert!(matches!(worker.next_batch().await, Err(LoaderError::End(_))), "nothing after the schedule's end");
    }
    let replayed = replay_step(&state, 33, Some(&index)).expect("replay");
    assert_eq!(replayed.iter().map(|s| s.index).collect::<Vec<_>>(), expected_steps[33]);
    let state_path = dir.path().join("state.bin");
    std::fs::write(&state_path, state.encode().expect("encode")).expect("write");
    let rows: serde_json::Value = serde_json::from_str(&node.ctl_ok(&[
        "replay",
        "--state",
        state_path.to_str().expect("p"),
        "--step",
        "33",
        "--json",
    ]))
    .expect("json");
    for (row, &r) in rows.as_array().expect("rows").iter().zip(&expected_steps[33]) {
        assert_eq!(row["index"], r);
        assert_eq!(row["crc32c"], crc32c::crc32c(&records[r as usize]));
    }
}

/// Fixed-size records need no index; a file of a partial record is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fixed_size_records() {
    let dir = tempfile::tempdir().expect("tempdir");
    let node = NodeProcess::start(&dir.path().join("node"));
    node.ctl_ok(&["dataset", "create", "fixed", "--kind", "records", "--record-size", "100"]);
    let data: Vec<u8> = (0..100_000u32).map(|i| (i / 100) as u8).collect();
    let path = dir.path().join("fixed.bin");
    std::fs::write(&path, &data).expect("write");
    let bad = dir.path().join("bad.bin");
    std::fs::write(&bad, &data[..150]).expect("write");
    assert!(!node.ctl(&["dataset", "ingest", "fixed", bad.to_str().expect("p")]).status.success());
    node.ctl_ok(&["dataset", "ingest", "fixed", path.to_str().expect("p")]);
    node.ctl_ok(&["dataset", "seal", "fixed"]);
    let client = Client::connect(&node.endpoint).await.expect("connect");
    let dataset = Arc::new(client.open("fixed").await.expect("open"));
    let index: Arc<[(u64, u64)]> = dataset.record_index().await.expect("index").into();
    assert_eq!(index.len(), 1000);
    let empty = RecordLoaderConfig { samples_per_epoch: Some(0), ..config(50) };
    let refused = RecordLoader::new(Arc::clone(&dataset), Arc::clone(&index), &empty).err();
    assert!(matches!(refused, Some(LoaderError::EmptyEpoch)), "an epoch of no samples is refused");
    let mut loader = RecordLoader::new(dataset, index, &config(50)).expect("loader");
    let batch = loader.next_batch().await.expect("batch");
    for (i, &r) in batch.records.iter().enumerate() {
        assert_eq!(batch.sample(i), vec![r as u8; 100].as_slice());
    }
}

/// WebDataset shards: samples grouped by key, each served as one span
/// whose members split back out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn webdataset_shards() {
    let dir = tempfile::tempdir().expect("tempdir");
    let node = NodeProcess::start(&dir.path().join("node"));
    node.ctl_ok(&["dataset", "create", "shards", "--kind", "wds"]);
    let mut expected = Vec::new();
    for shard in 0..3 {
        let mut members: Vec<(String, Vec<u8>)> = Vec::new();
        for key in 0..40 {
            let name = format!("s{shard}/{key:04}");
            let image = vec![(shard * 40 + key) as u8; 100 + key * 13];
            let label = format!("{}", shard * 40 + key).into_bytes();
            members.push((format!("{name}.jpg"), image.clone()));
            members.push((format!("{name}.cls"), label.clone()));
            expected.push((image, label));
        }
        let refs: Vec<(&str, &[u8])> = members.iter().map(|(n, d)| (n.as_str(), d.as_slice())).collect();
        let path = dir.path().join(format!("shard{shard}.tar"));
        std::fs::write(&path, sluice_control::tar::write_tar(&refs)).expect("write");
        node.ctl_ok(&["dataset", "ingest", "shards", path.to_str().expect("p")]);
    }
    let truncated = dir.path().join("cut.tar");
    let whole = sluice_control::tar::write_tar(&[("x.bin", &[1u8; 3000][..])]);
    std::fs::write(&truncated, &whole[..2000]).expect("write");
    let out = node.ctl(&["dataset", "ingest", "shards", truncated.to_str().expect("p")]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("ends inside a member"), "{out:?}");
    // A gzip-compressed shard (WebDataset's `.tar.gz`) says what it is.
    let gzipped = dir.path().join("shard.tar.gz");
    let mut gzip = vec![0x1f, 0x8b, 0x08, 0x00, 0, 0, 0, 0, 0, 0x03];
    gzip.resize(4096, 0x5a);
    std::fs::write(&gzipped, &gzip).expect("write");
    let out = node.ctl(&["dataset", "ingest", "shards", gzipped.to_str().expect("p")]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("gzip-compressed shard"), "{out:?}");
    node.ctl_ok(&["dataset", "seal", "shards"]);

    let client = Client::connect(&node.endpoint).await.expect("connect");
    let dataset = Arc::new(client.open("shards").await.expect("open"));
    let index: Arc<[(u64, u64)]> = dataset.record_index().await.expect("index").into();
    assert_eq!(index.len(), 120);
    let mut loader = RecordLoader::new(dataset, index, &config(24)).expect("loader");
    for _ in 0..5 {
        let batch = loader.next_batch().await.expect("batch");
        for (i, &r) in batch.records.iter().enumerate() {
            let members = sluice_control::tar::members(batch.sample(i)).expect("members");
            let (image, label) = &expected[r as usize];
            assert_eq!(members, vec![("jpg".to_string(), image.as_slice()), ("cls".to_string(), label.as_slice())]);
        }
    }
}
