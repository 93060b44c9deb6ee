//! What the sluice rig tests share: starting `sluiced` in the storage guest.

use std::time::Duration;

use hw_tests::{Host, Rig};

pub const CONTROL_PORT: u16 = 7070;
pub const DATA_PORT: u16 = 7071;

/// Starts `sluiced` on the storage host (one core, data under its scratch
/// directory, log in the shared directory) serving on `addr`, and waits
/// until its control API is up.
pub fn start_sluiced(rig: &Rig, addr: &str, args: &str) {
    let sluiced = rig.sluice_binary("sluiced").expect("sluiced");
    let (_, shared) = rig.shared_dir();
    let scratch = rig.scratch_dir(Host::Storage);
    rig.sh(
        Host::Storage,
        &format!(
            "mkdir -p {scratch}/data; setsid {sluiced} --data-dir {scratch}/data --cores 1 \
             --listen {addr}:{DATA_PORT} --control {addr}:{CONTROL_PORT} {args} \
             > {shared}/sluiced.log 2>&1 & echo $! > {scratch}/sluiced.pid"
        ),
    )
    .expect("start sluiced");
    let ready = rig
        .exec_with(
            Host::Storage,
            &format!(
                "while kill -0 $(cat {scratch}/sluiced.pid) 2>/dev/null; do \
                   grep -q 'control API on' {shared}/sluiced.log && exit 0; sleep 0.2; done; \
                 cat {shared}/sluiced.log; exit 1"
            ),
            Duration::from_secs(120),
        )
        .expect("wait for sluiced");
    assert!(ready.success(), "sluiced did not start: {}", ready.stdout);
}
