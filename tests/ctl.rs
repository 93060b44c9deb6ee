//! `sluicectl` as scripts use it: each kind of failure has its own exit
//! code (the table in `--help`), and completion scripts and man pages come
//! from the same definitions as `--help`.

mod common;

use std::process::{Command, Output, Stdio};

use common::NodeProcess;

fn code(out: &Output) -> Option<i32> {
    out.status.code()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn each_kind_of_failure_has_its_exit_code() {
    let dir = tempfile::tempdir().expect("tempdir");
    let node = NodeProcess::start_secure(&dir.path().join("node"));

    let unknown = node.ctl(&["dataset", "stat", "no-such-dataset"]);
    assert_eq!(code(&unknown), Some(3), "the node refuses: {}", stderr(&unknown));
    // Refused on the data port, not the control API: the same code.
    let unknown_read = node.ctl(&["read", "no-such-dataset", "--offset", "0", "--len", "1"]);
    assert_eq!(code(&unknown_read), Some(3), "the open is refused: {}", stderr(&unknown_read));
    let anonymous = node.ctl_anonymous(&["dataset", "ls"]);
    assert_eq!(code(&anonymous), Some(3), "no operator token: {}", stderr(&anonymous));

    node.ctl_ok(&["dataset", "create", "corpus", "--kind", "bytes"]);
    let missing = dir.path().join("not-here.bin");
    let local = node.ctl(&["dataset", "ingest", "corpus", missing.to_str().expect("utf-8")]);
    assert_eq!(code(&local), Some(5), "a local file: {}", stderr(&local));
    assert!(stderr(&local).contains("not-here.bin"), "{}", stderr(&local));
    let usage = node.ctl(&["dataset", "ingest", "corpus", "a", "b", "--index", "offsets.bin"]);
    assert_eq!(code(&usage), Some(2), "arguments that do not fit together: {}", stderr(&usage));

    let unreachable = Command::new(env!("CARGO_BIN_EXE_sluicectl"))
        .args(["--endpoint", "http://127.0.0.1:9", "dataset", "ls"])
        .output()
        .expect("run sluicectl");
    assert_eq!(code(&unreachable), Some(4), "no node there: {}", stderr(&unreachable));

    let help = Command::new(env!("CARGO_BIN_EXE_sluicectl")).arg("--help").output().expect("run sluicectl");
    let help = String::from_utf8_lossy(&help.stdout);
    for line in ["3  the node refused", "4  the node could not be reached", "5  a local file", "141  stdout's reader"] {
        assert!(help.contains(line), "--help documents exit code {line:?}: {help}");
    }
}

/// `sluicectl dataset ls | head`: when the reader of its output has gone,
/// sluicectl ends quietly with 141, as a tool SIGPIPE ends, not a panic.
#[test]
fn a_closed_stdout_ends_sluicectl_quietly() {
    let dir = tempfile::tempdir().expect("tempdir");
    let node = NodeProcess::start(&dir.path().join("node"));
    for name in ["a", "b", "c"] {
        node.ctl_ok(&["dataset", "create", name, "--kind", "bytes"]);
    }
    let mut ls =
        node.ctl_command(&["dataset", "ls"]).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("spawn");
    // Closed before sluicectl has asked the node anything, so its first
    // write finds no reader.
    drop(ls.stdout.take());
    let out = ls.wait_with_output().expect("wait");
    assert_eq!(code(&out), Some(141), "{}", stderr(&out));
    assert!(stderr(&out).is_empty(), "nothing on stderr: {}", stderr(&out));
}

#[test]
fn completion_scripts_and_man_pages_cover_every_command() {
    for shell in ["bash", "zsh", "fish"] {
        let out = Command::new(env!("CARGO_BIN_EXE_sluicectl")).args(["completion", shell]).output().expect("run");
        assert!(out.status.success(), "{shell}: {}", stderr(&out));
        let script = String::from_utf8_lossy(&out.stdout);
        assert!(script.contains("sluicectl") && script.contains("ingest") && script.contains("revoke"), "{shell}");
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let out = Command::new(env!("CARGO_BIN_EXE_sluicectl"))
        .args(["man", "--out", dir.path().to_str().expect("utf-8")])
        .output()
        .expect("run");
    assert!(out.status.success(), "{}", stderr(&out));
    for page in ["sluicectl.1", "sluicectl-dataset-create.1", "sluicectl-grant-revoke.1", "sluicectl-bench-read.1"] {
        let text = std::fs::read_to_string(dir.path().join(page)).unwrap_or_else(|e| panic!("{page}: {e}"));
        assert!(text.starts_with(".ie") || text.contains(".TH"), "{page} is a man page");
    }
    let create = std::fs::read_to_string(dir.path().join("sluicectl-dataset-create.1")).expect("page");
    assert!(create.contains("record\\-size") || create.contains("record-size"), "its options: {create}");
}
