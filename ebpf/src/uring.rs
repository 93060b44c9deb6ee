//! The kernel's view of the node's I/O: `bpf/uring.bpf.c` on the io_uring
//! tracepoints times requests the node submits, from submission to
//! completion, as a log2 histogram beside the probes' batch latency. It
//! times one request in 2^`sample_shift`: the tracepoints fire for every
//! request, and timing each costs a map update and delete that a node
//! doing half a million reads a second notices.

use aya::maps::{Array, MapData, MapError};
use aya::programs::{ProgramError, TracePoint};
use aya::{Ebpf, EbpfError, Pod};

use crate::LATENCY_BUCKETS;

/// The io_uring tracepoint program, as `bpf/build.sh` compiles it.
pub static URING_OBJECT: &[u8] = aya::include_bytes_aligned!("../bpf/uring.bpf.o");

const TRACEFS: &str = "/sys/kernel/tracing";

/// `struct uring_config` of `uring.bpf.c`.
#[derive(Clone, Copy, Debug)]
#[repr(C)]
struct UringConfig {
    tgid: u32,
    sample_shift: u32,
}

/// `struct uring_stats` of `uring.bpf.c`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(C)]
pub struct UringStats {
    /// Timed requests of the node's process that completed.
    pub requests: u64,
    /// Of those, completions with a negative result.
    pub errors: u64,
    pub latency_log2_us: [u64; LATENCY_BUCKETS],
}

// SAFETY: a `repr(C)` struct of u64s, valid for every bit pattern.
unsafe impl Pod for UringStats {}
// SAFETY: two u32s, no padding.
unsafe impl Pod for UringConfig {}

/// Requests timed by default: one in 2^3.
pub const DEFAULT_SAMPLE_SHIFT: u32 = 3;

#[derive(Debug, thiserror::Error)]
pub enum UringTraceError {
    #[error("loading the io_uring trace: {0}")]
    Load(#[from] EbpfError),
    #[error("attaching the io_uring tracepoints: {0}")]
    Program(#[from] ProgramError),
    #[error("io_uring trace map: {0}")]
    Map(#[from] MapError),
    #[error("the io_uring trace object has no {0}")]
    Missing(&'static str),
    #[error("tracefs is not mounted at {TRACEFS} and mounting it failed: {0}")]
    Tracefs(std::io::Error),
}

impl UringTraceError {
    /// Whether the kernel refused for lack of privilege.
    pub fn is_permission(&self) -> bool {
        crate::refused_for_privilege(self)
    }
}

/// The attached io_uring tracepoints.
pub struct UringTracer {
    bpf: Ebpf,
    sample_shift: u32,
}

impl UringTracer {
    /// Attaches to `io_uring:io_uring_submit_req` and `io_uring_complete`,
    /// timing one in 2^`sample_shift` (at most 16) requests of process
    /// `tgid` only. Mounts tracefs at its usual place first where nothing
    /// has (aya finds tracepoints there).
    pub fn attach(tgid: u32, sample_shift: u32) -> Result<Self, UringTraceError> {
        ensure_tracefs()?;
        let sample_shift = sample_shift.min(16);
        let mut bpf = Ebpf::load(URING_OBJECT)?;
        let mut config: Array<&mut MapData, UringConfig> =
            Array::try_from(bpf.map_mut("config").ok_or(UringTraceError::Missing("config"))?)?;
        config.set(0, UringConfig { tgid, sample_shift }, 0)?;
        // The submission tracepoint is `io_uring_submit_req` on newer kernels
        // and `io_uring_submit_sqe` on older ones (6.1 among them); the
        // fields read sit at the same offsets.
        for (program, events) in [
            ("submit_req", &["io_uring_submit_req", "io_uring_submit_sqe"][..]),
            ("complete", &["io_uring_complete"][..]),
        ] {
            let tracepoint: &mut TracePoint =
                bpf.program_mut(program).ok_or(UringTraceError::Missing("a tracepoint program"))?.try_into()?;
            tracepoint.load()?;
            let mut attached = Err(UringTraceError::Missing("an io_uring tracepoint"));
            for event in events {
                attached = tracepoint.attach("io_uring", event).map(drop).map_err(UringTraceError::from);
                if attached.is_ok() {
                    break;
                }
            }
            attached?;
        }
        Ok(Self { bpf, sample_shift })
    }

    /// One request in this many is timed.
    pub fn sampled_one_in(&self) -> u64 {
        1 << self.sample_shift
    }

    pub fn snapshot(&self) -> Result<UringStats, UringTraceError> {
        let stats: Array<&MapData, UringStats> =
            Array::try_from(self.bpf.map("uring_stats").ok_or(UringTraceError::Missing("uring_stats"))?)?;
        Ok(stats.get(&0, 0)?)
    }
}

/// `TRACEFS_MAGIC` of `linux/magic.h`.
const TRACEFS_MAGIC: i64 = 0x7472_6163;

fn tracefs_mounted() -> bool {
    let populated = std::fs::read_dir(TRACEFS).map(|mut entries| entries.next().is_some()).unwrap_or(false);
    populated
        || nix::sys::statfs::statfs(TRACEFS)
            .is_ok_and(|fs| fs.filesystem_type() == nix::sys::statfs::FsType(TRACEFS_MAGIC as _))
}

/// Mounts tracefs at /sys/kernel/tracing when nothing has (a system whose
/// init did not), as `mount -t tracefs` would. Safe when several
/// processes do it at once on a fresh host: one that loses the race gets
/// `EBUSY` from the kernel, finds tracefs mounted, and goes on.
pub fn ensure_tracefs() -> Result<(), UringTraceError> {
    if tracefs_mounted() {
        return Ok(());
    }
    match nix::mount::mount(Some("tracefs"), TRACEFS, Some("tracefs"), nix::mount::MsFlags::empty(), None::<&str>) {
        Ok(()) => Ok(()),
        Err(_) if tracefs_mounted() => Ok(()),
        Err(err) => Err(UringTraceError::Tracefs(err.into())),
    }
}
