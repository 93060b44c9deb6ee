//! The README's first command, `cargo run --release -- quickstart`: an
//! embedded node makes (or ingests) a token dataset, proves 256 windows
//! byte-exact against the namespace, and reads random windows. Run here on
//! a small dataset: killed while it makes its dataset, it starts over on
//! the next run; a sealed dataset is reused; a truncated input file is
//! refused with its reason and the next good one is served.

mod common;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Output, Stdio};

use common::npy_u16;

/// `sluice quickstart` over `data_dir`, reading for half a second.
fn quickstart(data_dir: &Path, args: &[&str]) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_sluice"));
    command.arg("quickstart").arg("--data-dir").arg(data_dir).args(["--seconds", "0.5"]).args(args);
    command
}

fn stdout_of(output: &Output) -> String {
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(output.status.success(), "quickstart failed: {stdout}\n{}", String::from_utf8_lossy(&output.stderr));
    stdout
}

/// What every successful run prints: the served windows checked against
/// the namespace's bytes, a rate, and a clean stop.
fn assert_served(stdout: &str) {
    for line in
        ["checked 256 random windows byte-exact against the namespace file", "windows/s", "node stopped cleanly"]
    {
        assert!(stdout.contains(line), "no {line:?} in:\n{stdout}");
    }
}

#[test]
fn a_killed_quickstart_starts_over_and_a_sealed_dataset_is_reused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    let size = ["--size-mib", "32"];

    // Killed once it has begun to make its dataset: while it generates,
    // ingests or seals. Its stdout stays read until then, so the kill, not
    // a closed pipe at its next line, is what ends it.
    let mut first = quickstart(&data, &size).stdout(Stdio::piped()).stderr(Stdio::null()).spawn().expect("spawn");
    let mut lines = BufReader::new(first.stdout.take().expect("stdout")).lines().map_while(Result::ok);
    let begun = lines.any(|line| line.starts_with("generating"));
    assert!(begun, "the first run began to make its dataset");
    first.kill().expect("kill");
    first.wait().expect("wait");
    drop(lines);

    let rerun = stdout_of(&quickstart(&data, &size).output().expect("run"));
    assert_served(&rerun);
    assert!(
        rerun.contains("sealed quickstart-tokens") || rerun.contains("reusing sealed dataset quickstart-tokens"),
        "the rerun starts the dataset over (or the kill came after its seal):\n{rerun}"
    );

    let again = stdout_of(&quickstart(&data, &size).output().expect("run"));
    assert!(again.contains("reusing sealed dataset quickstart-tokens"), "{again}");
    assert_served(&again);
}

#[test]
fn a_truncated_input_is_refused_and_the_next_good_one_is_served() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    let input = dir.path().join("tokens.npy");
    let tokens: Vec<u8> = (0..1u32 << 19).flat_map(|t| (t as u16).to_le_bytes()).collect();
    let npy = npy_u16(&tokens);
    let input_arg = ["--input", input.to_str().expect("path")];

    std::fs::write(&input, &npy[..npy.len() / 2]).expect("write");
    let refused = quickstart(&data, &input_arg).output().expect("run");
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success(), "a truncated .npy is refused");
    assert!(stderr.contains("sluice quickstart: truncated .npy"), "the reason is named: {stderr}");

    std::fs::write(&input, &npy).expect("write");
    let served = stdout_of(&quickstart(&data, &input_arg).output().expect("run"));
    assert!(served.contains(&format!("{} bytes", tokens.len())), "every token is ingested:\n{served}");
    assert!(served.contains("dataset tokens: 524288 tokens"), "{served}");
    assert_served(&served);
}
