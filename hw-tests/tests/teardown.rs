//! No QEMU process outlives its rig: not after a failing test (the rig is
//! dropped while unwinding), and not when the test process itself is killed
//! (the kernel kills QEMU through `PR_SET_PDEATHSIG`).

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use hw_tests::{require, Rig};

/// Set in the child process of `a_killed_test_process_takes_its_guests_along`
/// to the file where it reports its guests' process ids.
const CHILD_ENV: &str = "SLUICE_RIG_TEARDOWN_CHILD";

fn alive(pid: u32) -> bool {
    // A zombie is dead for this purpose: it holds no guest.
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .is_ok_and(|stat| stat.rsplit(')').next().is_some_and(|rest| !rest.trim_start().starts_with('Z')))
}

fn wait_gone(pids: &[u32]) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while pids.iter().any(|pid| alive(*pid)) {
        assert!(Instant::now() < deadline, "QEMU processes {pids:?} survived their rig");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn a_failing_test_leaves_no_qemu_behind() {
    if std::env::var_os(CHILD_ENV).is_some() {
        return;
    }
    let Some(rig) = require(Rig::builder("teardown-panic").boot()) else { return };
    if !rig.is_emulated() {
        return;
    }
    let pids = rig.qemu_pids();
    assert!(pids.iter().all(|pid| alive(*pid)));
    let run_dir = rig.run_dir().to_path_buf();
    let unwound = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || {
        let _rig = rig;
        panic!("a test failing with its rig up");
    }));
    assert!(unwound.is_err());
    wait_gone(&pids);
    assert!(Path::new(&run_dir).join("storage.console").is_file(), "a failed rig keeps its logs");
    let _ = std::fs::remove_dir_all(run_dir);
}

#[test]
fn a_killed_test_process_takes_its_guests_along() {
    if let Some(report) = std::env::var_os(CHILD_ENV) {
        // The child: boot, say which processes are the guests, then wait to
        // be killed.
        let pids = match require(Rig::builder("teardown-kill").boot()) {
            Some(rig) => {
                let pids: Vec<String> = rig.qemu_pids().iter().map(u32::to_string).collect();
                std::fs::write(&report, format!("pids {}\n", pids.join(" "))).expect("report pids");
                Some(rig)
            }
            None => {
                std::fs::write(&report, "skipped\n").expect("report skip");
                None
            }
        };
        std::thread::sleep(Duration::from_secs(300));
        drop(pids);
        return;
    }
    let report = std::env::temp_dir().join(format!("sluice-teardown-{}", std::process::id()));
    let _ = std::fs::remove_file(&report);
    let mut child = Command::new(std::env::current_exe().expect("own test binary"))
        .args(["--exact", "a_killed_test_process_takes_its_guests_along", "--test-threads=1"])
        .env(CHILD_ENV, &report)
        .spawn()
        .expect("spawn the child test");
    let deadline = Instant::now() + Duration::from_secs(240);
    let text = loop {
        match std::fs::read_to_string(&report) {
            Ok(text) if text.ends_with('\n') => break text,
            _ => {}
        }
        if let Ok(Some(status)) = child.try_wait() {
            panic!("the child test exited ({status}) before booting its rig");
        }
        assert!(Instant::now() < deadline, "the child test never booted its rig");
        std::thread::sleep(Duration::from_millis(100));
    };
    let _ = std::fs::remove_file(&report);
    let pids: Vec<u32> = text
        .trim()
        .strip_prefix("pids")
        .unwrap_or_default()
        .split_whitespace()
        .filter_map(|p| p.parse().ok())
        .collect();
    if pids.is_empty() {
        // Skipped, or real-hardware mode: no guests to leave behind.
        let _ = child.kill();
        let _ = child.wait();
        return;
    }
    assert!(pids.iter().all(|pid| alive(*pid)));
    child.kill().expect("SIGKILL the child test");
    let _ = child.wait();
    wait_gone(&pids);
}
