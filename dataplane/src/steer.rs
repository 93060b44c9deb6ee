//! Lane steering: a flow is one dataset opened on one connection; a policy
//! (a BPF program in `sluice-ebpf`) writes a decision per flow into shared
//! memory, and each core reads it per batch with a plain load, no syscall
//! and no lock. With no decision for a flow, the batch-size threshold
//! decides.

use std::sync::{Arc, Mutex};

/// Flows the decision array holds (`SLUICE_FLOWS_MAX`). A flow opened when
/// all are taken gets [`Flow::UNSTEERED`] and the size threshold.
pub const FLOWS_MAX: u32 = 4096;
/// No decision yet: the size threshold decides (`SLUICE_DECISION_NONE`).
pub const DECISION_NONE: u32 = 0;
/// Serve this flow in the latency lane (`SLUICE_DECISION_LATENCY`).
pub const DECISION_LATENCY: u32 = 1;
/// Serve this flow in the bulk lane (`SLUICE_DECISION_BULK`).
pub const DECISION_BULK: u32 = 2;

/// Where per-flow decisions come from: memory a policy writes and the
/// data plane loads from per batch (and clears when a flow index is reused).
pub trait LaneDecisions: Send + Sync {
    /// The decision word for flow `index` (`DECISION_*`; other values count
    /// as none). `index < FLOWS_MAX`.
    fn decision(&self, index: u32) -> u32;
    /// Forgets the decision of a flow whose index is being reused.
    fn clear(&self, index: u32);
}

/// A flow's identity as batches carry it to the cores and the probes: the
/// index into the decision array, a generation that tells a reused index
/// from the flow that held it before, and the peer's address (IPv6, or
/// IPv4-mapped) so a policy can steer the peer's next connections too.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Flow {
    pub index: u32,
    pub generation: u32,
    pub peer: [u8; 16],
}

impl Flow {
    /// A flow with no index (none free, or a caller that does not steer).
    pub const UNSTEERED: Flow = Flow { index: u32::MAX, generation: 0, peer: [0; 16] };

    pub fn is_steered(&self) -> bool {
        self.index < FLOWS_MAX
    }
}

/// Hands out flow indices. Opening and closing take a lock; they happen at
/// dataset open and close, never per batch.
pub struct FlowTable {
    state: Mutex<FlowState>,
}

struct FlowState {
    free: Vec<u32>,
    generations: Vec<u32>,
    decisions: Option<Arc<dyn LaneDecisions>>,
}

impl Default for FlowTable {
    fn default() -> Self {
        Self::new()
    }
}

impl FlowTable {
    pub fn new() -> Self {
        let state = FlowState {
            free: (0..FLOWS_MAX).rev().collect(),
            generations: vec![0; FLOWS_MAX as usize],
            decisions: None,
        };
        Self { state: Mutex::new(state) }
    }

    /// Sets the decision memory that new flows' entries are cleared in.
    pub(crate) fn set_decisions(&self, decisions: Arc<dyn LaneDecisions>) {
        self.lock().decisions = Some(decisions);
    }

    /// Opens a flow for a dataset opened by `peer`; it closes when the
    /// returned lease drops.
    pub fn open(self: &Arc<Self>, peer: [u8; 16]) -> FlowLease {
        let mut state = self.lock();
        let Some(index) = state.free.pop() else {
            return FlowLease { table: Arc::clone(self), flow: Flow { peer, ..Flow::UNSTEERED } };
        };
        let generation = state.generations[index as usize].wrapping_add(1);
        state.generations[index as usize] = generation;
        if let Some(decisions) = &state.decisions {
            decisions.clear(index);
        }
        FlowLease { table: Arc::clone(self), flow: Flow { index, generation, peer } }
    }

    /// Flows open now.
    pub fn open_count(&self) -> usize {
        FLOWS_MAX as usize - self.lock().free.len()
    }

    fn close(&self, flow: Flow) {
        if flow.is_steered() {
            let mut state = self.lock();
            debug_assert!(!state.free.contains(&flow.index), "flow {} closed twice", flow.index);
            state.free.push(flow.index);
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, FlowState> {
        // A panic while holding it leaves the free list whole (every update
        // is one push or pop), so a poisoned lock is still usable.
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// An open flow; dropping it returns the index.
pub struct FlowLease {
    table: Arc<FlowTable>,
    flow: Flow,
}

impl FlowLease {
    pub fn flow(&self) -> Flow {
        self.flow
    }
}

impl Drop for FlowLease {
    fn drop(&mut self) {
        self.table.close(self.flow);
    }
}

impl std::fmt::Debug for FlowLease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.flow.fmt(f)
    }
}

/// The peer address as flows carry it: IPv6, with IPv4 mapped
/// (`::ffff:a.b.c.d`), the form the `sk_reuseport` program keys on.
pub fn peer_key(addr: std::net::IpAddr) -> [u8; 16] {
    match addr {
        std::net::IpAddr::V4(v4) => v4.to_ipv6_mapped().octets(),
        std::net::IpAddr::V6(v6) => v6.octets(),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU32, Ordering};

    use super::*;

    /// Decisions in ordinary memory, standing in for the BPF array.
    pub struct LocalDecisions {
        words: Vec<AtomicU32>,
    }

    impl Default for LocalDecisions {
        fn default() -> Self {
            Self { words: (0..FLOWS_MAX).map(|_| AtomicU32::new(DECISION_NONE)).collect() }
        }
    }

    impl LocalDecisions {
        pub fn set(&self, index: u32, decision: u32) {
            self.words[index as usize].store(decision, Ordering::Relaxed);
        }
    }

    impl LaneDecisions for LocalDecisions {
        fn decision(&self, index: u32) -> u32 {
            self.words.get(index as usize).map_or(DECISION_NONE, |w| w.load(Ordering::Relaxed))
        }

        fn clear(&self, index: u32) {
            self.set(index, DECISION_NONE);
        }
    }

    /// Every index is handed out once, reuse bumps the generation and
    /// clears the old decision, and an exhausted table yields unsteered
    /// flows instead of failing the open.
    #[test]
    fn flows_are_unique_reused_with_a_new_generation_and_bounded() {
        let table = Arc::new(FlowTable::new());
        let decisions = Arc::new(LocalDecisions::default());
        table.set_decisions(decisions.clone());
        let leases: Vec<_> = (0..FLOWS_MAX).map(|_| table.open([1; 16])).collect();
        let mut indices: Vec<u32> = leases.iter().map(|l| l.flow().index).collect();
        indices.sort_unstable();
        indices.dedup();
        assert_eq!(indices.len(), FLOWS_MAX as usize);
        assert!(!table.open([2; 16]).flow().is_steered());

        let first = leases[0].flow();
        decisions.set(first.index, DECISION_BULK);
        drop(leases);
        assert_eq!(table.open_count(), 0);
        let reopened: Vec<_> = (0..FLOWS_MAX).map(|_| table.open([3; 16])).collect();
        let again = reopened.iter().find(|l| l.flow().index == first.index).expect("index reused");
        assert_eq!(again.flow().generation, first.generation + 1);
        assert_eq!(again.flow().peer, [3; 16]);
        assert_eq!(decisions.decision(first.index), DECISION_NONE);
    }

    #[test]
    fn peer_keys_map_ipv4() {
        let key = peer_key("127.0.0.2".parse().expect("addr"));
        assert_eq!(&key[10..], &[0xff, 0xff, 127, 0, 0, 2]);
    }
}
