//! The probe ABI: functions the data plane calls once per batch, each with a
//! pointer to a `#[repr(C)]` struct, for BPF uprobes to attach to. With
//! nothing attached a probe costs one call. The C side of the same structs
//! is `ebpf/include/sluice_probes.h`; the `sluice-ebpf` crate's layout test
//! fails if they differ.

use std::time::Instant;

/// log2 buckets of range sizes (`SLUICE_SIZE_BUCKETS`).
pub const SIZE_BUCKETS: usize = 24;
/// `SLUICE_LANE_LATENCY` and `SLUICE_LANE_BULK`: the probe ABI's numbers
/// for the one lane type.
pub const LANE_LATENCY: u8 = sluice_proto::Lane::Latency as u8;
pub const LANE_BULK: u8 = sluice_proto::Lane::Bulk as u8;
/// The batch-size threshold chose the lane (`SLUICE_LANE_BY_THRESHOLD`).
pub const LANE_BY_THRESHOLD: u8 = 0;
/// The policy's decision for the flow chose it (`SLUICE_LANE_BY_POLICY`).
pub const LANE_BY_POLICY: u8 = 1;

/// `struct sluice_batch_probe`.
#[derive(Clone, Copy, Debug, Default)]
#[repr(C)]
pub struct BatchProbe {
    pub dataset_id: u64,
    pub client_id: u32,
    pub lane: u8,
    /// What chose `lane` (`LANE_BY_*`).
    pub lane_source: u8,
    pub pad: [u8; 2],
    pub ranges: u32,
    pub failed_ranges: u32,
    pub bytes: u64,
    pub submit_ns: u64,
    pub complete_ns: u64,
    pub size_hist: [u32; SIZE_BUCKETS],
    /// Index of the flow (dataset on a connection) in the decision array,
    /// `u32::MAX` when unsteered.
    pub flow: u32,
    /// Tells a reused flow index from the flow that held it before.
    pub flow_generation: u32,
    /// The peer's address, IPv6 or IPv4-mapped.
    pub peer: [u8; 16],
}

impl BatchProbe {
    /// The lane admission wrote into the probe, as the one lane type.
    pub fn lane(&self) -> sluice_proto::Lane {
        if self.lane == LANE_LATENCY {
            sluice_proto::Lane::Latency
        } else {
            sluice_proto::Lane::Bulk
        }
    }
}

const _: () = assert!(size_of::<BatchProbe>() == 168);

/// The log2 bucket of a range of `len` bytes.
pub fn size_bucket(len: u32) -> usize {
    (31 - len.max(1).leading_zeros() as usize).min(SIZE_BUCKETS - 1)
}

/// Nanoseconds on a monotonic clock shared by every core.
pub fn monotonic_ns(origin: Instant) -> u64 {
    origin.elapsed().as_nanos() as u64
}

/// Called when a core admits a batch.
#[no_mangle]
#[inline(never)]
pub extern "C" fn sluice_probe_batch_submit(probe: *const BatchProbe) {
    probe_entry();
    std::hint::black_box((probe, ProbeSite::Submit));
}

/// Called when a batch reaches its core and its lane is chosen (the probe's
/// `lane`, `lane_source`; timestamps are not set yet).
#[no_mangle]
#[inline(never)]
pub extern "C" fn sluice_probe_lane_select(probe: *const BatchProbe) {
    probe_entry();
    std::hint::black_box((probe, ProbeSite::LaneSelect));
}

/// Called when a batch completes, before its reply is sent.
#[no_mangle]
#[inline(never)]
pub extern "C" fn sluice_probe_batch_complete(probe: *const BatchProbe) {
    probe_entry();
    std::hint::black_box((probe, ProbeSite::Complete));
}

/// The first instruction of every probe: a `nop`, like a USDT probe site,
/// which the kernel emulates when a uprobe sits on it. On any other first
/// instruction (a stack store, say) the uprobe must single-step it out of
/// line: a second trap on every batch.
#[inline(always)]
fn probe_entry() {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a `nop` reads and writes nothing, not even flags; it is here
    // for the uprobe that replaces it with a breakpoint.
    unsafe {
        std::arch::asm!("nop", options(nostack, preserves_flags));
    }
}

/// Which probe a body belongs to. Each probe passes its own value to
/// `black_box`, so the bodies differ and the linker cannot fold them into
/// one address (identical-code folding did, in release builds, and a uprobe
/// on one then fired for all three).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
enum ProbeSite {
    LaneSelect = 0x5e1e,
    Submit = 0x5b17,
    Complete = 0xc0de,
}

/// Whether every probe function has an address of its own (a uprobe on one
/// must not fire for another); the node refuses to attach BPF otherwise.
pub fn probes_are_distinct() -> bool {
    let addresses = [
        sluice_probe_lane_select as *const () as usize,
        sluice_probe_batch_submit as *const () as usize,
        sluice_probe_batch_complete as *const () as usize,
    ];
    addresses[0] != addresses[1] && addresses[1] != addresses[2] && addresses[0] != addresses[2]
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Sizes land in their power-of-two bucket; the last takes the rest.
    #[test]
    fn probe_functions_have_distinct_addresses() {
        assert!(probes_are_distinct());
    }

    #[test]
    fn buckets() {
        assert_eq!(size_bucket(0), 0);
        assert_eq!(size_bucket(1), 0);
        assert_eq!(size_bucket(4095), 11);
        assert_eq!(size_bucket(4096), 12);
        assert_eq!(size_bucket(u32::MAX), SIZE_BUCKETS - 1);
    }
}
