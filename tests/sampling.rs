//! The window loader against a real node: exact resume from a saved state,
//! elastic resume at another world size, and replay of any step, from Rust
//! and from `sluicectl replay`.

mod common;

use std::sync::Arc;

use common::{random_file, NodeProcess};
use sluice_client::loader::{replay_step, WindowLoader, WindowLoaderConfig};
use sluice_client::sampler::SamplerState;
use sluice_client::Client;

const WINDOW: u32 = 128;
const GLOBAL_BATCH: u64 = 32;

fn config(rank: u32, world: u32) -> WindowLoaderConfig {
    WindowLoaderConfig {
        window_tokens: WINDOW,
        global_batch: GLOBAL_BATCH,
        rank,
        world,
        seed: 1234,
        samples_per_epoch: Some(8_000),
        stride_ratio: None,
        prefetch: 4,
    }
}

/// (starts, crc32c of the bytes) of each step.
type Steps = Vec<(Vec<u64>, u32)>;

async fn run(loader: &mut WindowLoader, steps: usize, tokens: &[u8]) -> Steps {
    let mut out = Vec::with_capacity(steps);
    for _ in 0..steps {
        let batch = loader.next_batch().await.expect("batch");
        // Every window is the dataset's bytes at its start.
        for (i, &start) in batch.starts.iter().enumerate() {
            let len = (WINDOW * 2) as usize;
            let want = &tokens[start as usize * 2..start as usize * 2 + len];
            assert!(&batch.data[i * len..(i + 1) * len] == want, "step {} window {i}", batch.step);
        }
        out.push((batch.starts, crc32c::crc32c(&batch.data)));
    }
    out
}

fn node_with_tokens(dir: &std::path::Path) -> (NodeProcess, Vec<u8>) {
    let node = NodeProcess::start(&dir.join("node"));
    let tokens = random_file(&dir.join("tokens.bin"), 2_000_000, 9);
    node.ctl_ok(&["dataset", "create", "toks", "--kind", "tokens:u16"]);
    node.ctl_ok(&["dataset", "ingest", "toks", dir.join("tokens.bin").to_str().expect("path")]);
    node.ctl_ok(&["dataset", "seal", "toks"]);
    (node, tokens)
}

/// 1000 steps straight equal 400 steps, a saved state, and 600 steps from
/// that state through a new connection — across an epoch boundary (8000
/// samples per epoch = 250 steps).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resume_from_saved_state_is_exact() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (node, tokens) = node_with_tokens(dir.path());
    let client = Client::connect(&node.endpoint).await.expect("connect");
    let dataset = Arc::new(client.open("toks").await.expect("open"));

    let mut straight = WindowLoader::new(Arc::clone(&dataset), &config(0, 1)).expect("loader");
    let expected = run(&mut straight, 1000, &tokens).await;

    let mut first = WindowLoader::new(Arc::clone(&dataset), &config(0, 1)).expect("loader");
    let mut resumed = run(&mut first, 400, &tokens).await;
    let saved = first.state().encode().expect("encode");
    assert_eq!(saved.len(), sluice_client::sampler::state::STATE_BYTES);
    drop(first);

    let client = Client::connect(&node.endpoint).await.expect("reconnect");
    let dataset = Arc::new(client.open("toks").await.expect("reopen"));
    let state = SamplerState::decode(&saved).expect("decode");
    assert_eq!((state.next_sample, state.epoch), (400 * GLOBAL_BATCH, 1));
    let mut second = WindowLoader::from_state(dataset, state, 0, 1, 4).expect("resume");
    resumed.extend(run(&mut second, 600, &tokens).await);
    assert!(resumed == expected, "resumed sequence differs");
}

/// Four ranks together read the same global sequence as one; a state saved
/// at four ranks resumes at two with the global sequence unchanged; and
/// replay of a step lists exactly the samples the loaders produced.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn elastic_resume_and_replay() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (node, tokens) = node_with_tokens(dir.path());
    let client = Client::connect(&node.endpoint).await.expect("connect");
    let dataset = Arc::new(client.open("toks").await.expect("open"));

    let mut single = WindowLoader::new(Arc::clone(&dataset), &config(0, 1)).expect("loader");
    let global = run(&mut single, 100, &tokens).await;

    let mut four: Vec<WindowLoader> =
        (0..4).map(|r| WindowLoader::new(Arc::clone(&dataset), &config(r, 4)).expect("loader")).collect();
    let mut per_rank = Vec::new();
    for loader in &mut four {
        per_rank.push(run(loader, 50, &tokens).await);
    }
    for step in 0..50 {
        let joined: Vec<u64> = per_rank.iter().flat_map(|r| r[step].0.clone()).collect();
        assert_eq!(joined, global[step].0, "step {step} at world size 4");
    }
    let state = four[0].state();
    let mut two: Vec<WindowLoader> = (0..2)
        .map(|r| WindowLoader::from_state(Arc::clone(&dataset), state.clone(), r, 2, 2).expect("resume"))
        .collect();
    let mut halves = Vec::new();
    for loader in &mut two {
        halves.push(run(loader, 50, &tokens).await);
    }
    for step in 0..50 {
        let joined: Vec<u64> = halves.iter().flat_map(|r| r[step].0.clone()).collect();
        assert_eq!(joined, global[50 + step].0, "step {} after resuming at world size 2", 50 + step);
    }

    // Replay, from the library and from the CLI.
    let replayed = replay_step(&state, 77, None).expect("replay");
    let starts: Vec<u64> = replayed.iter().map(|s| s.index).collect();
    assert_eq!(starts, global[77].0);
    let state_path = dir.path().join("state.json");
    std::fs::write(&state_path, state.to_json().expect("json")).expect("write state");
    let dump = dir.path().join("dump");
    let out = node.ctl_ok(&[
        "replay",
        "--state",
        state_path.to_str().expect("p"),
        "--step",
        "77",
        "--dump",
        dump.to_str().expect("p"),
        "--json",
    ]);
    let rows: serde_json::Value = serde_json::from_str(&out).expect("json");
    let rows = rows.as_array().expect("array");
    assert_eq!(rows.len() as u64, GLOBAL_BATCH);
    for (i, row) in rows.iter().enumerate() {
        let start = global[77].0[i];
        assert_eq!(row["index"], start);
        let bytes = &tokens[start as usize * 2..start as usize * 2 + WINDOW as usize * 2];
        assert_eq!(row["crc32c"], crc32c::crc32c(bytes));
        assert_eq!(row["dataset"], "toks");
        let dumped = std::fs::read(dump.join(format!("step77-{i:05}.bin"))).expect("dumped sample");
        assert!(dumped == bytes);
    }
}
