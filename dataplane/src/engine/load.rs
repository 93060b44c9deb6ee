//! What each core says of its own load at the end of every pass. Placement
//! reads how many batches a core holds to pick where a connection's next
//! batch goes; the node's metrics read all of it, so an operator (or a
//! test) can tell a core whose reads are at the device from one whose
//! reads wait to be pushed and one that holds nothing.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

/// One core's load, written by that core alone and read by anyone: gauges
/// as of its last pass, not counts to rely on, and one counter the core
/// bumps when it happens.
#[derive(Debug, Default)]
pub(crate) struct CoreLoad {
    batches: AtomicUsize,
    batches_to_push: AtomicUsize,
    reads_at_device: AtomicUsize,
    bulk_bytes_at_device: AtomicU64,
    completions_found_late: AtomicU64,
}

/// A core's load as of its last pass.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CoreLoadSnapshot {
    /// Batches waiting for slots or being read.
    pub batches: usize,
    /// Of those being read, the ones with reads not yet pushed to the
    /// device (the queue was full, or the bulk lane at its bytes' bound).
    pub batches_to_push: usize,
    /// Reads pushed and not yet reaped.
    pub reads_at_device: usize,
    /// Bytes of bulk-lane reads among them (the bound's count).
    pub bulk_bytes_at_device: u64,
    /// Passes since start that found completions only after the core's
    /// recheck nudged it: wake-ups that never came. Stays 0 on a healthy
    /// core.
    pub completions_found_late: u64,
}

/// The gauges a core stores at the end of each pass: the fields of
/// [`CoreLoadSnapshot`] that describe the moment, not its history.
#[derive(Clone, Copy, Debug)]
pub(crate) struct PassLoad {
    pub(crate) batches: usize,
    pub(crate) batches_to_push: usize,
    pub(crate) reads_at_device: usize,
    pub(crate) bulk_bytes_at_device: u64,
}

impl CoreLoad {
    /// Batches the core holds, for placement.
    pub(crate) fn batches(&self) -> usize {
        self.batches.load(Ordering::Relaxed)
    }

    /// The gauges at the end of a pass.
    pub(crate) fn store(&self, pass: PassLoad) {
        self.batches.store(pass.batches, Ordering::Relaxed);
        self.batches_to_push.store(pass.batches_to_push, Ordering::Relaxed);
        self.reads_at_device.store(pass.reads_at_device, Ordering::Relaxed);
        self.bulk_bytes_at_device.store(pass.bulk_bytes_at_device, Ordering::Relaxed);
    }

    /// Counts one more pass that found completions late; returns the count
    /// so far. Rare on a healthy core, so its atomic add costs no pass
    /// anything.
    pub(crate) fn completions_found_late(&self) -> u64 {
        self.completions_found_late.fetch_add(1, Ordering::Relaxed) + 1
    }

    pub(crate) fn snapshot(&self) -> CoreLoadSnapshot {
        CoreLoadSnapshot {
            batches: self.batches.load(Ordering::Relaxed),
            batches_to_push: self.batches_to_push.load(Ordering::Relaxed),
            reads_at_device: self.reads_at_device.load(Ordering::Relaxed),
            bulk_bytes_at_device: self.bulk_bytes_at_device.load(Ordering::Relaxed),
            completions_found_late: self.completions_found_late.load(Ordering::Relaxed),
        }
    }
}
