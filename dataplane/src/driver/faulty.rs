//! A driver wrapper that injects faults at chosen namespace byte ranges: I/O
//! errors, latency spikes and silent corruption. It proves that a bad block
//! fails only the ranges that touch it (corruption caught by the chunk CRC),
//! and that nothing panics. For tests and drills, never for production.

use std::collections::{HashMap, VecDeque};
use std::io;
use std::ops::Range;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{
    BlockDriver, Completion, DriverError, DriverKind, IoTarget, Namespace, NamespaceSpec, Queue, QueueFull, ReadIo,
};
use crate::dma::Arena;

/// What to inject, by namespace byte range (every namespace alike).
#[derive(Clone, Debug, Default)]
pub struct FaultPlan {
    /// Reads overlapping these fail with EIO.
    pub io_errors: Vec<Range<u64>>,
    /// Bytes of these ranges are flipped in every read that covers them.
    pub corruptions: Vec<Range<u64>>,
    /// Reads overlapping these complete this much later.
    pub delays: Vec<(Range<u64>, Duration)>,
    /// The queue never says when a delayed read is due (no
    /// `FaultyQueue::completion_due` for it): a wake-up lost between the
    /// kernel and the event loop, which only a core that looks again by
    /// itself survives.
    pub delays_unannounced: bool,
}

fn overlaps(a: &Range<u64>, start: u64, len: u64) -> bool {
    a.start < start + len && start < a.end
}

pub struct FaultyDriver {
    inner: Arc<dyn BlockDriver>,
    plan: Arc<FaultPlan>,
    pushed: Arc<std::sync::Mutex<Vec<u64>>>,
    in_flight_peak: Arc<AtomicU32>,
}

impl FaultyDriver {
    pub fn new(inner: Arc<dyn BlockDriver>, plan: FaultPlan) -> Self {
        Self { inner, plan: Arc::new(plan), pushed: Arc::default(), in_flight_peak: Arc::default() }
    }

    /// The most reads any of its queues held at once: what a test of how
    /// deep the node fills the device checks.
    pub fn in_flight_peak(&self) -> u32 {
        self.in_flight_peak.load(Ordering::Relaxed)
    }

    /// The namespace offset of every read its queues took, in order: what
    /// a test of I/O ordering checks.
    pub fn pushed_offsets(&self) -> Vec<u64> {
        self.pushed.lock().map(|p| p.clone()).unwrap_or_default()
    }
}

impl BlockDriver for FaultyDriver {
    fn kind(&self) -> DriverKind {
        self.inner.kind()
    }

    fn open_namespace(&self, spec: &NamespaceSpec) -> Result<Arc<dyn Namespace>, DriverError> {
        self.inner.open_namespace(spec)
    }

    fn nvme_admin(&self) -> Option<&dyn super::NvmeAdmin> {
        self.inner.nvme_admin()
    }

    fn create_queue(&self, arena: &Arena, depth: u32) -> Result<Queue, DriverError> {
        let inner = self.inner.create_queue(arena, depth)?;
        Ok(Queue::Faulty(Box::new(FaultyQueue {
            inner,
            plan: Arc::clone(&self.plan),
            pushed: Arc::clone(&self.pushed),
            in_flight_peak: Arc::clone(&self.in_flight_peak),
            reads: HashMap::new(),
            ready: VecDeque::new(),
            delayed: VecDeque::new(),
            scratch: Vec::new(),
        })))
    }
}

pub struct FaultyQueue {
    inner: Queue,
    plan: Arc<FaultPlan>,
    pushed: Arc<std::sync::Mutex<Vec<u64>>>,
    in_flight_peak: Arc<AtomicU32>,
    /// Reads submitted to the inner queue, by tag.
    reads: HashMap<u64, ReadIo>,
    /// Completions made up here, handed out at the next reap.
    ready: VecDeque<Completion>,
    /// Completions held back by a delay, earliest due first.
    delayed: VecDeque<(Instant, Completion)>,
    scratch: Vec<Completion>,
}

impl FaultyQueue {
    pub(super) fn register_namespace(&mut self, index: u32, target: &IoTarget) {
        self.inner.register_namespace(index, target);
    }

    pub(super) fn unregister_namespace(&mut self, index: u32) {
        self.inner.unregister_namespace(index);
    }

    /// # Safety
    /// See [`Queue::push_read`].
    pub(super) unsafe fn push_read(&mut self, io: ReadIo) -> Result<(), QueueFull> {
        let (start, len) = (io.offset_bytes, u64::from(io.len_bytes));
        if self.plan.io_errors.iter().any(|r| overlaps(r, start, len)) {
            self.ready.push_back(Completion { tag: io.tag, result: -libc::EIO });
        } else {
            // SAFETY: forwarded contract.
            unsafe { self.inner.push_read(io) }?;
            self.reads.insert(io.tag, io);
        }
        if let Ok(mut pushed) = self.pushed.lock() {
            pushed.push(start);
        }
        self.in_flight_peak.fetch_max(self.in_flight(), Ordering::Relaxed);
        Ok(())
    }

    pub(super) fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }

    pub(super) fn reap(&mut self, out: &mut Vec<Completion>, max: usize) -> usize {
        let now = Instant::now();
        let mut reaped = 0;
        while reaped < max {
            if let Some(done) = self.ready.pop_front() {
                out.push(done);
            } else if self.delayed.front().is_some_and(|(due, _)| *due <= now) {
                if let Some((_, done)) = self.delayed.pop_front() {
                    out.push(done);
                }
            } else {
                break;
            }
            reaped += 1;
        }
        self.scratch.clear();
        self.inner.reap(&mut self.scratch, max - reaped);
        for completion in std::mem::take(&mut self.scratch) {
            let Some(io) = self.reads.remove(&completion.tag) else {
                out.push(completion);
                reaped += 1;
                continue;
            };
            if completion.result > 0 {
                self.corrupt(&io, completion.result as u64);
            }
            let delay = self.plan.delays.iter().find(|(r, _)| overlaps(r, io.offset_bytes, u64::from(io.len_bytes)));
            match delay {
                Some((_, by)) => {
                    // Delays differ by range: keep the queue in due order.
                    let due = now + *by;
                    let at = self.delayed.partition_point(|(held_until, _)| *held_until <= due);
                    self.delayed.insert(at, (due, completion));
                }
                None => {
                    out.push(completion);
                    reaped += 1;
                }
            }
        }
        reaped
    }

    /// Flips every byte of the read that lies in a corruption range.
    fn corrupt(&self, io: &ReadIo, done_bytes: u64) {
        for range in &self.plan.corruptions {
            let from = range.start.max(io.offset_bytes);
            let to = range.end.min(io.offset_bytes + done_bytes);
            for at in from..to {
                let offset = (at - io.offset_bytes) as usize;
                // SAFETY: the read completed and its buffer holds `done_bytes`
                // bytes; until this completion is handed back, nothing else
                // touches it (the push contract).
                unsafe { *io.buf.add(offset) ^= 0xff };
            }
        }
    }

    /// Waits for the inner queue only: a delayed completion is the
    /// caller's to wait for ([`FaultyQueue::completion_due`]), so that a
    /// core sleeping through a delay still serves its connections.
    pub(super) fn wait(&mut self) -> io::Result<()> {
        if self.ready.is_empty() && self.inner.in_flight() > 0 {
            return self.inner.wait();
        }
        Ok(())
    }

    /// The inner queue's completion fd: a delayed completion comes from
    /// [`FaultyQueue::completion_due`] instead.
    pub(super) fn completion_fd(&self) -> Option<std::os::fd::RawFd> {
        self.inner.completion_fd()
    }

    /// Now, if a made-up completion waits for the next reap; else when the
    /// earliest delayed one is due.
    pub(super) fn completion_due(&self) -> Option<Instant> {
        if !self.ready.is_empty() {
            return Some(Instant::now());
        }
        self.delayed.front().map(|(due, _)| *due).filter(|_| !self.plan.delays_unannounced)
    }

    pub(super) fn in_flight(&self) -> u32 {
        self.inner.in_flight() + self.ready.len() as u32 + self.delayed.len() as u32
    }

    pub(super) fn describe(&self) -> String {
        format!("{} with injected faults", self.inner.describe())
    }
}
