//! `records`, `wds` and `mds` datasets: ingest with an offsets index, fixed-size
//! records, and WebDataset tar shards indexed at ingest; the record loader
//! reads each step's samples in one batch, resumes exactly, and replays.

mod common;

use std::sync::Arc;

use common::NodeProcess;
use sluice_client::loader::{replay_step, LoaderError, RecordLoader, RecordLoaderConfig, RecordMixture, StepSchedule};
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

/// Record `r` of a mixture test's dataset `tag`: `size` bytes that differ
/// from every other record's of either dataset.
fn mixed_record(tag: u8, r: u32, size: usize) -> Vec<u8> {
    let r = r.to_le_bytes();
    (0..size).map(|b| if b < 4 { r[b] } else { tag ^ (b as u8) }).collect()
}

/// Two datasets mixed 6 + 2 records a step: every step holds both shares,
/// each equal to its dataset read alone, across the small dataset's epoch
/// boundary; the state resumes the mixture exactly; a worker schedule reads
/// the same steps; what cannot be mixed is refused and changes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mixture_holds_each_share_in_every_step() {
    let dir = tempfile::tempdir().expect("tempdir");
    let node = NodeProcess::start(&dir.path().join("node"));
    let client = Client::connect(&node.endpoint).await.expect("connect");
    // web: 240 records, one epoch in 40 steps of 6; code: 60, 30 steps of 2.
    let kinds = [("web", 1u8, 240u32, 100usize), ("code", 2, 60, 40)];
    let mut sources = Vec::new();
    for (name, tag, records, size) in kinds {
        node.ctl_ok(&["dataset", "create", name, "--kind", "records", "--record-size", &size.to_string()]);
        let data: Vec<u8> = (0..records).flat_map(|r| mixed_record(tag, r, size)).collect();
        let path = dir.path().join(format!("{name}.bin"));
        std::fs::write(&path, &data).expect("write");
        node.ctl_ok(&["dataset", "ingest", name, path.to_str().expect("p")]);
        node.ctl_ok(&["dataset", "seal", name]);
        let dataset = Arc::new(client.open(name).await.expect("open"));
        let index: Arc<[(u64, u64)]> = dataset.record_index().await.expect("index").into();
        sources.push((dataset, index));
    }
    let loaders = |configs: [RecordLoaderConfig; 2]| -> Vec<RecordLoader> {
        sources
            .iter()
            .zip(configs)
            .map(|((dataset, index), config)| {
                RecordLoader::new(Arc::clone(dataset), Arc::clone(index), &config).expect("loader")
            })
            .collect()
    };
    let shares = || [config(6), config(2)];
    // Each dataset read alone: `alone[step][dataset]`, the records of 40 steps.
    let mut alone: Vec<[Vec<u64>; 2]> = vec![Default::default(); 40];
    for (d, mut loader) in loaders(shares()).into_iter().enumerate() {
        for step in &mut alone {
            step[d] = loader.next_batch().await.expect("batch").records;
        }
    }

    let mut mixture = RecordMixture::new(loaders(shares())).expect("mixture");
    let mut saved = None;
    for (step, expected) in alone.iter().enumerate() {
        if step == 7 {
            saved = Some(mixture.state());
        }
        let batches = mixture.next_batch().await.expect("batches");
        assert_eq!(batches.len(), 2, "a batch per dataset");
        for (d, batch) in batches.iter().enumerate() {
            let (_, tag, _, size) = kinds[d];
            assert_eq!((batch.step, &batch.records), (step as u64, &expected[d]), "dataset {d}, step {step}");
            for (i, &r) in batch.records.iter().enumerate() {
                assert_eq!(batch.sample(i), mixed_record(tag, r as u32, size).as_slice(), "dataset {d}, record {r}");
            }
        }
    }
    let epochs: Vec<u64> = mixture.state().iter().map(|s| s.epoch).collect();
    assert_eq!(epochs, [1, 1], "both read on into their next epoch, the small one from step 30");
    let mut code_epoch0: Vec<u64> = alone[..30].iter().flat_map(|step| step[1].clone()).collect();
    code_epoch0.sort_unstable();
    assert_eq!(code_epoch0, (0..60).collect::<Vec<u64>>(), "the small dataset's first 30 steps are its epoch");

    // Refused, and the mixture is unchanged: it still reads step 0 next.
    let saved = saved.expect("saved at step 7");
    let mut resumed = RecordMixture::new(loaders(shares())).expect("mixture");
    let short = resumed.resume(saved[..1].to_vec());
    assert!(matches!(short, Err(LoaderError::MixtureStates { states: 1, streams: 2 })), "{short:?}");
    let swapped = resumed.resume(vec![saved[1].clone(), saved[0].clone()]);
    assert!(matches!(swapped, Err(LoaderError::WrongDataset { .. })), "{swapped:?}");
    let first = resumed.next_batch().await.expect("batches");
    assert_eq!([first[0].records.clone(), first[1].records.clone()], alone[0]);
    // Resumed at step 7, it reads the straight run's steps from there.
    resumed.resume(saved).expect("resume");
    for (step, expected) in alone.iter().enumerate().skip(7) {
        let batches = resumed.next_batch().await.expect("batches");
        assert_eq!(&[batches[0].records.clone(), batches[1].records.clone()], expected, "step {step}");
    }

    // A worker's schedule reads the same steps of both datasets.
    let mut worker = RecordMixture::new(loaders(shares())).expect("mixture");
    worker.set_schedule(StepSchedule { first: 1, stride: 3, end: Some(40) });
    for (step, expected) in alone.iter().enumerate().skip(1).step_by(3) {
        let batches = worker.next_batch().await.expect("batches");
        assert_eq!((batches[0].step, batches[1].step), (step as u64, step as u64));
        assert_eq!(&[batches[0].records.clone(), batches[1].records.clone()], expected, "step {step}");
    }
    assert!(worker.finished(), "every step of the schedule was returned");
    assert!(matches!(worker.next_batch().await, Err(LoaderError::End(_))), "nothing after the schedule's end");

    // What cannot be mixed.
    assert!(matches!(RecordMixture::new(Vec::new()).err(), Some(LoaderError::EmptyMixture)));
    let mut ahead = loaders(shares());
    ahead[1].next_batch().await.expect("batch");
    let refused = RecordMixture::new(ahead).err();
    assert!(matches!(refused, Some(LoaderError::MixtureSteps { first: 0, other: 1 })), "{refused:?}");
    let other_rank = RecordLoaderConfig { rank: 1, world: 2, ..config(2) };
    let refused = RecordMixture::new(loaders([config(6), other_rank])).err();
    assert!(matches!(refused, Some(LoaderError::MixtureRanks { first: (0, 1), other: (1, 2) })), "{refused:?}");
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
