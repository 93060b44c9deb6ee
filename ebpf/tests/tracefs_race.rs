//! First-time set-up on a fresh host: several processes that find tracefs
//! unmounted and mount it at once all succeed (a clean machine's test run
//! once failed here with `EBUSY`, where a machine with tracefs already
//! mounted passed). Run in a private mount namespace (`unshare`) with
//! tracefs unmounted, so the host's own mount is untouched; root only.

use std::process::Command;
use std::sync::{Arc, Barrier};

const INNER: &str = "SLUICE_TRACEFS_RACE_INNER";
const RACERS: usize = 8;

#[test]
fn concurrent_first_mounts_of_tracefs_all_succeed() {
    if std::env::var_os(INNER).is_some() {
        return race();
    }
    if !nix::unistd::Uid::effective().is_root() {
        eprintln!("SKIP concurrent_first_mounts_of_tracefs_all_succeed: mounting needs root");
        return;
    }
    let exe = std::env::current_exe().expect("this test binary");
    let script = "umount -l /sys/kernel/tracing 2>/dev/null; \
                  exec \"$0\" --exact concurrent_first_mounts_of_tracefs_all_succeed --nocapture --test-threads 1";
    let out = Command::new("unshare")
        .args(["--mount", "--propagation", "private", "sh", "-c", script])
        .arg(&exe)
        .env(INNER, "1")
        .output()
        .expect("run unshare (util-linux)");
    assert!(
        out.status.success(),
        "the race inside a private mount namespace failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Inside the namespace: tracefs is gone; eight threads mount it at once.
fn race() {
    let empty = std::fs::read_dir("/sys/kernel/tracing").map(|mut e| e.next().is_none()).unwrap_or(true);
    assert!(empty, "tracefs is still mounted inside the namespace");
    let barrier = Arc::new(Barrier::new(RACERS));
    let racers: Vec<_> = (0..RACERS)
        .map(|_| {
            let barrier = Arc::clone(&barrier);
            std::thread::spawn(move || {
                barrier.wait();
                sluice_ebpf::uring::ensure_tracefs()
            })
        })
        .collect();
    for racer in racers {
        racer.join().expect("racer").expect("every first mount succeeds or finds tracefs mounted");
    }
    assert!(std::path::Path::new("/sys/kernel/tracing/events").exists(), "tracefs is mounted");
}
