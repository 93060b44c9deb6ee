//! eBPF for the data plane: C programs under `bpf/` attached as uprobes to
//! the probe ABI (`sluice_dataplane::probe`), loaded with aya. It depends
//! on the data plane (for that ABI) and nothing above it.
//!
//! `trace.bpf.c` keeps per (dataset, lane) counters, log2 histograms of
//! range size and batch latency, and a ring buffer of slow batches. The
//! compiled object is checked in (`bpf/trace.bpf.o`, built by
//! `bpf/build.sh`), so the node builds without clang; a test rebuilds it
//! from source where clang exists and fails if the two differ.

pub mod policy_check;
pub mod steer;
pub mod uring;

use std::path::Path;
use std::time::Duration;

use aya::maps::{Array, HashMap, MapData, MapError, RingBuf};
use aya::programs::uprobe::UProbeScope;
use aya::programs::{ProgramError, UProbe};
use aya::{Ebpf, EbpfError, Pod};
use sluice_dataplane::probe::{BatchProbe, SIZE_BUCKETS};

/// The trace program, as `bpf/build.sh` compiles it.
pub static TRACE_OBJECT: &[u8] = aya::include_bytes_aligned!("../bpf/trace.bpf.o");

/// Buckets of the latency histogram (`LATENCY_BUCKETS`): bucket b counts
/// batches of [2^b, 2^(b+1)) microseconds.
pub const LATENCY_BUCKETS: usize = 32;

/// `struct trace_key` of `trace.bpf.c`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(C)]
pub struct TraceKey {
    pub dataset_id: u64,
    pub lane: u32,
    pub pad: u32,
}

/// `struct trace_stats` of `trace.bpf.c`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(C)]
pub struct TraceStats {
    pub batches: u64,
    pub ranges: u64,
    pub bytes: u64,
    pub failed_ranges: u64,
    pub size_log2: [u64; SIZE_BUCKETS],
    pub latency_log2_us: [u64; LATENCY_BUCKETS],
}

// SAFETY: both are `repr(C)` structs of integers with no padding, so every
// bit pattern the kernel hands back is a valid value.
unsafe impl Pod for TraceKey {}
// SAFETY: as above.
unsafe impl Pod for TraceStats {}

#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    #[error("loading the trace program: {0}")]
    Load(#[from] EbpfError),
    #[error("attaching the trace program: {0}")]
    Program(#[from] ProgramError),
    #[error("trace map: {0}")]
    Map(#[from] MapError),
    #[error("the trace object has no {0}")]
    Missing(&'static str),
}

impl TraceError {
    /// Whether the kernel refused for lack of privilege (not root, no
    /// CAP_BPF/CAP_PERFMON, or BPF disabled), as opposed to a bug.
    pub fn is_permission(&self) -> bool {
        refused_for_privilege(self)
    }
}

/// Whether an aya error (however deeply wrapped) is the kernel refusing for
/// lack of privilege: aya keeps the errno only inside its own error types.
fn refused_for_privilege(err: &dyn std::fmt::Debug) -> bool {
    let text = format!("{err:?}");
    text.contains("PermissionDenied") || text.contains("EPERM") || text.contains("Operation not permitted")
}

/// Whose probe calls are traced.
#[derive(Clone, Copy, Debug)]
pub enum Scope {
    /// The calling process (a node tracing itself).
    ThisProcess,
    /// Every process running the binary.
    AllProcesses,
}

impl Scope {
    fn uprobe_scope(self) -> UProbeScope {
        match self {
            Self::ThisProcess => UProbeScope::CallingProcess,
            Self::AllProcesses => UProbeScope::AllProcesses,
        }
    }
}

/// The loaded, attached trace program.
pub struct Tracer {
    bpf: Ebpf,
}

impl Tracer {
    /// Loads `trace.bpf.o` and attaches it to `sluice_probe_batch_complete`
    /// in `binary`; batches slower than `slow_threshold` go to the ring.
    pub fn attach(binary: &Path, scope: Scope, slow_threshold: Duration) -> Result<Self, TraceError> {
        let mut bpf = Ebpf::load(TRACE_OBJECT)?;
        let program: &mut UProbe =
            bpf.program_mut("batch_complete").ok_or(TraceError::Missing("batch_complete"))?.try_into()?;
        program.load()?;
        program.attach("sluice_probe_batch_complete", binary, scope.uprobe_scope())?;
        let mut threshold: Array<&mut MapData, u64> =
            Array::try_from(bpf.map_mut("slow_threshold_ns").ok_or(TraceError::Missing("slow_threshold_ns"))?)?;
        threshold.set(0, slow_threshold.as_nanos().min(u128::from(u64::MAX)) as u64, 0)?;
        Ok(Self { bpf })
    }

    /// Every (dataset, lane) seen so far with its counters and histograms.
    pub fn snapshot(&self) -> Result<Vec<(TraceKey, TraceStats)>, TraceError> {
        let map: HashMap<&MapData, TraceKey, TraceStats> =
            HashMap::try_from(self.bpf.map("trace_stats").ok_or(TraceError::Missing("trace_stats"))?)?;
        let mut entries = map.iter().collect::<Result<Vec<_>, _>>()?;
        entries.sort_by_key(|(key, _)| *key);
        Ok(entries)
    }

    /// Drains the ring of batches slower than the threshold.
    pub fn slow_batches(&mut self) -> Result<Vec<BatchProbe>, TraceError> {
        let mut ring: RingBuf<&mut MapData> =
            RingBuf::try_from(self.bpf.map_mut("slow_batches").ok_or(TraceError::Missing("slow_batches"))?)?;
        let mut out = Vec::new();
        while let Some(item) = ring.next() {
            if item.len() >= size_of::<BatchProbe>() {
                // SAFETY: the item holds at least a whole BatchProbe, a
                // `repr(C)` struct of integers valid for any bytes; the read
                // is unaligned-safe.
                out.push(unsafe { std::ptr::read_unaligned(item.as_ptr().cast::<BatchProbe>()) });
            }
        }
        Ok(out)
    }
}
