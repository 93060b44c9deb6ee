//! The per-core engines and the [`DataPlane`] that fronts them. This file
//! is the handle (start, attach, submit, stop); a core's loop, admission
//! and lanes, in-flight table and completion are in `core`, the result
//! a transport holds in `result`.
//!
//! Each core is one thread that owns a queue pair per device, a DMA arena and
//! a table of attached datasets; nothing on its path takes a lock. The
//! thread runs an event loop of its own (a current-thread tokio runtime)
//! whose first task is the core's engine: a transport places a connection
//! on a core by spawning its tasks there ([`DataPlane::core_runtime`]), so
//! that connection's batches are received, read and answered on one thread,
//! every hand-off between its tasks a local wake-up rather than a
//! cross-thread one. Others reach a core by message (a bounded channel), and
//! it replies per batch with a [`BatchResult`] whose bytes stay in its DMA
//! slots until the transport drops it. A core waits for its queue's
//! completions in the same event loop as its sockets (the io_uring's fd is
//! one of its readiness sources) and sleeps there when idle, so an idle node
//! burns no CPU.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use tokio::sync::{mpsc, oneshot};

use crate::blocks::VERIFY_BLOCK_BYTES;
use crate::dataset::{ByteRange, DatasetView};
use crate::dma::{Arena, SlotLease, SlotPool};
use crate::driver::{BlockDriver, Completion, DriverError, Queue, ReadIo};
use crate::plan::{plan_batch_into, BatchPlan, PlanGeometry};
use crate::probe::{
    monotonic_ns, size_bucket, sluice_probe_batch_complete, sluice_probe_batch_submit, sluice_probe_lane_select,
    BatchProbe, LANE_BY_POLICY, LANE_BY_THRESHOLD,
};
use crate::steer::{
    Flow, FlowLease, FlowTable, LaneDecisions, DECISION_BULK, DECISION_LATENCY, DECISION_NONE, FLOWS_MAX,
};
use sluice_proto::{Lane, RangeStatus};

mod core;
mod load;
mod reply;
mod result;
#[cfg(test)]
mod tests;

use self::core::{CoreEngine, CoreShared, PollerSlots};
use self::load::CoreLoad;
pub use load::CoreLoadSnapshot;
pub use reply::{BatchCompletion, Outcome, Reply};
pub use result::{spare_ranges, BatchResult};

/// Most datasets attached to one node at once.
pub const DATASET_SLOTS_MAX: u32 = 4096;
/// Most messages a core takes from its inbox per loop turn, so completions
/// are reaped regularly under a flood of requests.
const INBOX_DRAIN_MAX: usize = 64;
/// Most completions reaped per loop turn.
const REAP_MAX: usize = 256;
/// A connection's batches stay on its own core while that core holds
/// fewer than this many batches (in its inbox, waiting or being read); past
/// it they spill to the core holding the fewest, if that one holds fewer by
/// [`SPILL_MARGIN`]. Shallow queues never leave the thread; deep ones from
/// a single connection still use every core.
const SPILL_AT: usize = 2;
const SPILL_MARGIN: usize = 1;
/// Where a batch of a connection placed as `placement` goes, given the
/// batches each core holds.
fn spill_target(placement: &Placement, held: impl Fn(usize) -> usize) -> usize {
    let core = placement.core;
    let here = held(core);
    if here < SPILL_AT {
        return core;
    }
    let (least, least_held) =
        (placement.spill_to.clone()).map(|other| (other, held(other))).min_by_key(|&(_, n)| n).unwrap_or((core, here));
    if least_held + SPILL_MARGIN <= here {
        least
    } else {
        core
    }
}

/// Cores of one data plane that serve one kind of connection (a listener
/// group: the latency lane's core, or the bulk cores). Made by
/// [`DataPlane::core_group`], which checks the cores exist, so a
/// [`Placement`] made from it names real cores.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CoreGroup(std::ops::Range<usize>);

impl CoreGroup {
    /// A connection placed on `core` of this group.
    ///
    /// # Panics
    /// If `core` is not in the group: a caller's bug.
    pub fn place(&self, core: usize) -> Placement {
        assert!(self.0.contains(&core), "core {core} is not one of the group's {:?}", self.0);
        Placement { core, spill_to: self.0.clone() }
    }

    /// The `n`th core of the group, wrapping: connections placed in turn.
    pub fn nth_wrapping(&self, n: usize) -> usize {
        self.0.start + n % self.0.len()
    }

    pub fn cores(&self) -> std::ops::Range<usize> {
        self.0.clone()
    }
}

/// Where a connection lives: the core whose event loop serves it, and the
/// cores its batches may spill to when that one is loaded (the cores of the
/// connection's listener group: a bulk connection never spills onto the
/// latency lane's core). Made by [`CoreGroup::place`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Placement {
    core: usize,
    spill_to: std::ops::Range<usize>,
}

impl Placement {
    /// The core whose event loop serves the connection.
    pub fn core(&self) -> usize {
        self.core
    }
}

/// How long a data-plane core polls after its last work before sleeping.
/// Since a connection lives on its core, polling runs the connection's
/// tasks too, so a queue-depth-1 client's next request is read without a
/// wake-up. Measured on a 2-vCPU VM with the client on the same host
/// (`sluicectl bench read`, 64 MiB, alternating runs): 0 → 100 µs took
/// 1 × 1 page-cache reads from 10–13 k to 22–24 k IOPS, 1 × 1 O_DIRECT from
/// 6.0 k to 8.0–8.7 k, 32 × 1 page cache from 171–185 k to 228–281 k; 8 × 4
/// O_DIRECT and 64 × 4 stayed within the noise. 30 µs missed most of the
/// gain (the client's turnaround is longer than that) and 200 µs gave no
/// more. Before connections lived on cores, polling took the CPU their
/// tasks needed and lost. Cores poll on at most one fewer than the node's
/// CPUs at once (see `core::poll`).
pub const POLL_WINDOW_US_DEFAULT: u64 = 100;

/// Bytes of bulk-lane reads a core keeps at the device by default. A read
/// the node has handed to the kernel waits there in arrival order, so a
/// small read waits behind whatever bulk bytes went before it, at the
/// device's rate; kept in the core instead, bulk reads wait behind the
/// latency lane. Enough for a device's full rate is about its rate times a
/// large read's latency (7 GB/s × 100 µs ≈ 0.7 MB for a fast NVMe drive);
/// 2 MiB a core leaves margin. Measured on a 2-vCPU VM's virtio disk
/// (O_DIRECT, 2 cores, 2026-12-05; `SLUICED_FLAGS="--bulk-in-flight-bytes
/// N" IO_MODE=direct bench/steering.sh 2 4` and `bench/ab.sh`):
/// a 4 KiB × 16 reader's p99 beside two 1 MiB readers was 36–41 ms
/// unbounded (up to 192 reads of 128 KiB a core), 37–43 ms at 16 MiB,
/// 8.7–9.0 ms at 4 MiB, 4.7 ms at 2 MiB and 2.7 ms at 1 MiB, against
/// 0.5 ms alone. Bulk rates did not suffer: 1 MiB sequential reads, 16 in
/// flight, were level with unbounded at 4 MiB (1.06), 2 MiB (1.05 of
/// 4 MiB) and 1 MiB (1.03 of 2 MiB); the steering benchmark's two bulk
/// readers (batches of 4 × 1 MiB, 4 in flight each), three alternating
/// rounds of 4 s, did 1.14–1.36 GB/s unbounded, 1.30–1.51 at 1 MiB and
/// 1.38–1.80 at 2 MiB: this disk reads faster with fewer reads at once.
/// 2 MiB, not 1, for a faster device's sake.
pub const BULK_IN_FLIGHT_BYTES_DEFAULT: u64 = 2 << 20;

/// A quarter of each core's slots is kept for the latency lane, so small
/// reads still run while bulk responses wait on slow clients.
const LATENCY_RESERVE_DIVISOR: usize = 4;

/// Sizes of everything the data plane allocates at start-up.
#[derive(Clone, Debug)]
pub struct DataPlaneConfig {
    /// Data-plane cores (threads), each with its own queue pair.
    pub cores: usize,
    /// DMA slots per core; with `slot_size_bytes` this bounds the bytes a
    /// core holds for batches in flight and responses being sent.
    pub slots_per_core: usize,
    /// Slot size, which is also the largest single I/O.
    pub slot_size_bytes: usize,
    /// Submission queue depth of each queue pair.
    pub queue_depth: u32,
    /// Batches a core works on at once.
    pub batches_in_flight_max: usize,
    /// Batches waiting for slots before the inbox applies back-pressure.
    pub batches_waiting_max: usize,
    /// Batches asking for at most this many bytes take the latency lane:
    /// admitted before bulk batches, with a reserve of slots bulk batches
    /// cannot take. The fallback steering when no policy is loaded.
    pub latency_batch_bytes_max: u64,
    /// Depth of each core's inbox.
    pub inbox_depth: usize,
    /// Verify every read: each 4 KiB block it covers against the dataset's
    /// block checksums.
    pub verify_chunks: bool,
    /// How long a core that did work keeps polling its inbox and queue
    /// before it sleeps, stretched while its reads are at the device (see
    /// `core::poll`); zero parks at once. The
    /// connections placed on the core run while it polls, so their next
    /// requests are read without a wake-up (see
    /// [`POLL_WINDOW_US_DEFAULT`]).
    pub poll_window: std::time::Duration,
    /// Bytes of bulk-lane reads a core keeps at the device at once (at
    /// least one read, whatever its size); 0 bounds them only by the
    /// queue's bulk share. Reads beyond it wait in the core, where the
    /// lanes order them, rather than in the kernel, where a small read
    /// that comes later waits behind all of them (see
    /// [`BULK_IN_FLIGHT_BYTES_DEFAULT`]).
    pub bulk_in_flight_bytes_max: u64,
}

impl Default for DataPlaneConfig {
    fn default() -> Self {
        Self {
            cores: 2,
            slots_per_core: 512,
            slot_size_bytes: 128 * 1024,
            queue_depth: 256,
            batches_in_flight_max: 64,
            batches_waiting_max: 256,
            latency_batch_bytes_max: 512 * 1024,
            inbox_depth: 1024,
            verify_chunks: true,
            poll_window: std::time::Duration::from_micros(POLL_WINDOW_US_DEFAULT),
            bulk_in_flight_bytes_max: BULK_IN_FLIGHT_BYTES_DEFAULT,
        }
    }
}

/// Handle of a dataset attached to the data plane. The generation tells a
/// reused slot from the dataset that held it before, so a stale handle can
/// never read another dataset's bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct DatasetSlot {
    pub index: u32,
    pub generation: u32,
}

/// Why a whole batch failed (ranges failing alone are in the statuses).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SubmitError {
    #[error("dataset is not attached to the data plane")]
    UnknownDataset,
    #[error("batch needs {slots_needed} DMA slots but a core has {capacity}")]
    TooLarge { slots_needed: u32, capacity: u32 },
    #[error("the data plane is shutting down")]
    Shutdown,
}

/// Why a dataset could not be attached.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum AttachError {
    #[error("{attached_max} datasets are attached, the most the data plane holds at once")]
    Full { attached_max: u32 },
    #[error("the data plane is shutting down")]
    Shutdown,
}

/// A batch of reads of one dataset.
pub struct ReadBatch {
    pub dataset: DatasetSlot,
    /// Which connection sent it (reported to probes).
    pub client_id: u32,
    /// The flow (dataset on a connection) whose steering decision picks the
    /// lane; [`Flow::UNSTEERED`] leaves it to the size threshold.
    pub flow: Flow,
    pub ranges: Vec<ByteRange>,
    pub reply: Reply,
    /// Kept alive until the batch's result is dropped: what the batch
    /// needs to outlive it (a source-backed dataset's read lease, which
    /// keeps its chunks from being evicted while their bytes are served).
    pub hold: Option<Hold>,
}

/// Anything a batch keeps alive until its result is dropped.
pub type Hold = Box<dyn std::any::Any + Send + Sync>;

enum CoreMsg {
    Batch(ReadBatch),
    Decisions(Arc<dyn LaneDecisions>),
    Attach(DatasetSlot, Arc<DatasetView>),
    Detach(u32, oneshot::Sender<()>),
    /// Slots came back while the core was parked with batches waiting
    /// for them.
    Wake,
    Shutdown,
}

struct CoreHandle {
    inbox: mpsc::Sender<CoreMsg>,
    thread: Option<JoinHandle<()>>,
}

/// What a core thread reports once it is ready: its start-up line, its
/// arena, slot count and lease counter, and its event loop.
type CoreReady = (String, (DmaRegion, usize, Arc<AtomicUsize>), tokio::runtime::Handle);

/// The data plane of one node.
pub struct DataPlane {
    cores: Mutex<Vec<CoreHandle>>,
    senders: Vec<mpsc::Sender<CoreMsg>>,
    /// Each core's event loop, where transports place connections.
    runtimes: Vec<tokio::runtime::Handle>,
    next_core: AtomicUsize,
    /// Per core, its load at the end of its last pass; written by the core
    /// alone.
    loads: Vec<Arc<CoreLoad>>,
    next_generation: std::sync::atomic::AtomicU32,
    slots_in_use: Mutex<Vec<bool>>,
    config: DataPlaneConfig,
    driver_description: String,
    regions: Vec<DmaRegion>,
    slots_total: usize,
    leased_counters: Vec<Arc<AtomicUsize>>,
    flows: Arc<FlowTable>,
}

/// One core's DMA arena as an address range, for a transport to register
/// with its NIC once at start-up (RDMA sends straight from it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DmaRegion {
    pub base: usize,
    pub len_bytes: usize,
}

#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("core {core}: {source}")]
    Driver {
        core: usize,
        #[source]
        source: DriverError,
    },
    #[error("core {core}: {source}")]
    Arena {
        core: usize,
        #[source]
        source: crate::dma::ArenaError,
    },
    #[error("starting core thread: {0}")]
    Thread(#[source] std::io::Error),
}

impl DataPlane {
    /// Starts `config.cores` engines over `driver`. Each core maps its own
    /// arena and creates its own queue pair on its own thread, since queue
    /// pairs (io_uring with SINGLE_ISSUER, SPDK qpairs) belong to the thread
    /// that made them.
    pub fn start(driver: Arc<dyn BlockDriver>, config: DataPlaneConfig) -> Result<Self, StartError> {
        assert!(config.cores >= 1, "a data plane needs a core");
        let mut cores = Vec::with_capacity(config.cores);
        let mut senders = Vec::with_capacity(config.cores);
        let mut description = String::new();
        let mut regions = Vec::with_capacity(config.cores);
        let mut slots_total = 0;
        let mut leased_counters = Vec::with_capacity(config.cores);
        let mut runtimes = Vec::with_capacity(config.cores);
        let mut loads: Vec<Arc<CoreLoad>> = Vec::with_capacity(config.cores);
        let pollers = PollerSlots::for_cpus(std::thread::available_parallelism().map_or(1, |cpus| cpus.get()));
        for core in 0..config.cores {
            let (tx, rx) = mpsc::channel(config.inbox_depth);
            // Weak: the core's inbox still closes when the plane's senders go.
            let nudge = tx.downgrade();
            let parked = Arc::new(AtomicBool::new(false));
            let wake = {
                let tx = tx.clone();
                let parked = Arc::clone(&parked);
                Arc::new(move || {
                    if parked.load(Ordering::SeqCst) {
                        let _ = tx.try_send(CoreMsg::Wake);
                    }
                }) as Arc<dyn Fn() + Send + Sync>
            };
            let (ready_tx, ready_rx) = std::sync::mpsc::channel::<Result<CoreReady, StartError>>();
            let driver = Arc::clone(&driver);
            let core_config = config.clone();
            let core_load = Arc::new(CoreLoad::default());
            loads.push(Arc::clone(&core_load));
            let pollers = Arc::clone(&pollers);
            let thread = std::thread::Builder::new()
                .name(format!("sluice-core-{core}"))
                .spawn(move || {
                    let setup = Arena::new(core_config.slots_per_core, core_config.slot_size_bytes)
                        .map_err(|source| StartError::Arena { core, source })
                        .and_then(|arena| {
                            let queue = driver
                                .create_queue(&arena, core_config.queue_depth)
                                .map_err(|source| StartError::Driver { core, source })?;
                            // Its reactor, not tokio's timers: the core keeps
                            // its own (see `crate::timer`).
                            let runtime = tokio::runtime::Builder::new_current_thread()
                                .enable_io()
                                .build()
                                .map_err(StartError::Thread)?;
                            crate::timer::install(&runtime).map_err(StartError::Thread)?;
                            Ok((arena, queue, runtime))
                        });
                    match setup {
                        Ok((arena, queue, runtime)) => {
                            let line = format!(
                                "{} driver, {} cores, {} ({} MiB DMA per core{})",
                                driver.kind(),
                                core_config.cores,
                                queue.describe(),
                                arena.len_bytes() >> 20,
                                if arena.is_hugepage_backed() { ", hugepages" } else { "" }
                            );
                            let region = DmaRegion { base: arena.base_ptr() as usize, len_bytes: arena.len_bytes() };
                            let slots = arena.slot_count();
                            let pool = SlotPool::new(Arc::new(arena), wake);
                            let region = (region, slots, pool.leased_counter());
                            let engine = CoreEngine::new(
                                core,
                                queue,
                                pool,
                                rx,
                                CoreShared { parked, load: core_load, pollers, nudge },
                                &core_config,
                            );
                            let _ = ready_tx.send(Ok((line, region, runtime.handle().clone())));
                            runtime.block_on(engine.run());
                            // Connections still placed here end with their
                            // tasks; nothing waits on a blocking pool.
                            runtime.shutdown_background();
                            crate::timer::uninstall();
                        }
                        Err(err) => {
                            let _ = ready_tx.send(Err(err));
                        }
                    }
                })
                .map_err(StartError::Thread)?;
            let line =
                ready_rx.recv().unwrap_or_else(|_| Err(StartError::Thread(std::io::Error::other("core thread died"))));
            let line = match line {
                Ok((line, (region, slots, leased), runtime)) => {
                    runtimes.push(runtime);
                    regions.push(region);
                    slots_total += slots;
                    leased_counters.push(leased);
                    line
                }
                Err(err) => {
                    let _ = thread.join();
                    for started in &cores {
                        let started: &CoreHandle = started;
                        let _ = started.inbox.try_send(CoreMsg::Shutdown);
                    }
                    return Err(err);
                }
            };
            if core == 0 {
                description = line;
            }
            senders.push(tx.clone());
            cores.push(CoreHandle { inbox: tx, thread: Some(thread) });
        }
        Ok(Self {
            cores: Mutex::new(cores),
            senders,
            runtimes,
            next_core: AtomicUsize::new(0),
            loads,
            next_generation: std::sync::atomic::AtomicU32::new(1),
            slots_in_use: Mutex::new(vec![false; DATASET_SLOTS_MAX as usize]),
            config,
            driver_description: description,
            regions,
            slots_total,
            leased_counters,
            flows: Arc::new(FlowTable::new()),
        })
    }

    pub fn config(&self) -> &DataPlaneConfig {
        &self.config
    }

    /// Every core's arena. They live as long as the data plane; every
    /// [`BatchResult`]'s bytes lie inside one of them.
    pub fn dma_regions(&self) -> &[DmaRegion] {
        &self.regions
    }

    /// DMA slots of every core, and how many batches and unsent responses
    /// hold now: a leak shows as a count that never comes back down.
    pub fn dma_slots(&self) -> (usize, usize) {
        let leased = self.leased_counters.iter().map(|c| c.load(Ordering::Relaxed)).sum();
        (leased, self.slots_total)
    }

    /// Each core's load as of its last pass, by core.
    pub fn core_loads(&self) -> Vec<CoreLoadSnapshot> {
        self.loads.iter().map(|load| load.snapshot()).collect()
    }

    /// One line on the driver, cores and buffers, for start-up logs.
    pub fn describe(&self) -> &str {
        &self.driver_description
    }

    /// Makes `view` readable on every core.
    pub async fn attach(&self, view: Arc<DatasetView>) -> Result<DatasetSlot, AttachError> {
        let slot = {
            let mut in_use = self.slots_in_use.lock().map_err(|_| AttachError::Shutdown)?;
            let free =
                in_use.iter().position(|used| !used).ok_or(AttachError::Full { attached_max: DATASET_SLOTS_MAX })?;
            in_use[free] = true;
            DatasetSlot { index: free as u32, generation: self.next_generation.fetch_add(1, Ordering::Relaxed) }
        };
        for tx in &self.senders {
            tx.send(CoreMsg::Attach(slot, Arc::clone(&view))).await.map_err(|_| AttachError::Shutdown)?;
        }
        Ok(slot)
    }

    /// Stops serving `slot`; returns once no core reads it any more.
    pub async fn detach(&self, slot: DatasetSlot) {
        let mut acks = Vec::with_capacity(self.senders.len());
        for tx in &self.senders {
            let (ack_tx, ack_rx) = oneshot::channel();
            if tx.send(CoreMsg::Detach(slot.index, ack_tx)).await.is_ok() {
                acks.push(ack_rx);
            }
        }
        for ack in acks {
            let _ = ack.await;
        }
        if let Ok(mut in_use) = self.slots_in_use.lock() {
            in_use[slot.index as usize] = false;
        }
    }

    /// Hands a batch to the next core; waits while that core's inbox is full.
    pub async fn submit(&self, batch: ReadBatch) -> Result<(), SubmitError> {
        let core = self.next_core.fetch_add(1, Ordering::Relaxed) % self.senders.len();
        self.submit_to(core, batch).await
    }

    /// Hands a batch to `core`: a connection placed on a core sends its
    /// batches there, so they never leave its thread.
    ///
    /// # Panics
    /// If there is no core `core`: a caller's bug, not the node stopping.
    pub async fn submit_to(&self, core: usize, batch: ReadBatch) -> Result<(), SubmitError> {
        let inbox =
            self.senders.get(core).unwrap_or_else(|| panic!("no core {core} (the plane has {})", self.senders.len()));
        inbox.send(CoreMsg::Batch(batch)).await.map_err(|_| SubmitError::Shutdown)
    }

    /// Hands a batch of a connection placed as `placement` to its core,
    /// unless that core is loaded and another of `placement.spill_to` much
    /// less so (see `SPILL_AT`): a connection at a shallow queue depth
    /// stays on its thread, and one with many batches in flight is not held
    /// to one core's CPU. The placement's cores were checked when its
    /// group was made ([`DataPlane::core_group`]).
    pub async fn submit_near(&self, placement: &Placement, batch: ReadBatch) -> Result<(), SubmitError> {
        let target = spill_target(placement, |other| self.batches_held(other));
        self.submit_to(target, batch).await
    }

    /// Batches `core` holds: in its inbox, waiting, or being read (as of
    /// its last pass; a hint, not a count to rely on).
    fn batches_held(&self, core: usize) -> usize {
        let in_inbox = self.config.inbox_depth.saturating_sub(self.senders[core].capacity());
        in_inbox + self.loads[core].batches()
    }

    /// How many cores serve.
    pub fn core_count(&self) -> usize {
        self.senders.len()
    }

    /// The cores `cores` of this plane as one listener group.
    ///
    /// # Panics
    /// If `cores` is empty or names a core this plane does not have.
    pub fn core_group(&self, cores: std::ops::Range<usize>) -> CoreGroup {
        assert!(
            !cores.is_empty() && cores.end <= self.core_count(),
            "cores {cores:?} of a plane with {}",
            self.core_count()
        );
        CoreGroup(cores)
    }

    /// Core `core`'s event loop: a task spawned here runs on that core's
    /// thread, between passes of its engine, and ends when the data plane
    /// stops. A transport places a connection on a core this way; the
    /// task must never block the thread.
    pub fn core_runtime(&self, core: usize) -> &tokio::runtime::Handle {
        &self.runtimes[core]
    }

    /// Submits and waits for the result.
    pub async fn read(&self, dataset: DatasetSlot, ranges: Vec<ByteRange>) -> Result<BatchResult, SubmitError> {
        self.read_in_flow(dataset, Flow::UNSTEERED, ranges).await
    }

    /// Submits a batch of `flow` and waits for the result.
    pub async fn read_in_flow(
        &self,
        dataset: DatasetSlot,
        flow: Flow,
        ranges: Vec<ByteRange>,
    ) -> Result<BatchResult, SubmitError> {
        let (reply, rx) = oneshot::channel();
        self.submit(ReadBatch { dataset, client_id: 0, flow, ranges, reply: Reply::once(reply), hold: None }).await?;
        rx.await.map_err(|_| SubmitError::Shutdown)?
    }

    /// Opens a flow (a dataset opened on a connection from `peer`, see
    /// [`crate::steer::peer_key`]); it closes when the lease drops.
    pub fn open_flow(&self, peer: [u8; 16]) -> FlowLease {
        self.flows.open(peer)
    }

    /// Flows open now.
    pub fn flows_open(&self) -> usize {
        self.flows.open_count()
    }

    /// Makes every core take each batch's lane from `decisions` (written by
    /// a steering policy) where it holds one for the batch's flow. Set once,
    /// when steering starts; a flow without a decision keeps the threshold.
    pub async fn steer_with(&self, decisions: Arc<dyn LaneDecisions>) -> Result<(), SubmitError> {
        self.flows.set_decisions(Arc::clone(&decisions));
        for sender in &self.senders {
            sender.send(CoreMsg::Decisions(Arc::clone(&decisions))).await.map_err(|_| SubmitError::Shutdown)?;
        }
        Ok(())
    }

    /// Stops every core after its in-flight I/O completes.
    pub fn shutdown(&self) {
        let Ok(mut cores) = self.cores.lock() else { return };
        for core in cores.iter() {
            let _ = core.inbox.try_send(CoreMsg::Shutdown);
        }
        for core in cores.iter_mut() {
            if let Some(thread) = core.thread.take() {
                if thread.join().is_err() {
                    tracing::error!("a data-plane core panicked");
                }
            }
        }
    }
}

impl Drop for DataPlane {
    fn drop(&mut self) {
        if let Ok(cores) = self.cores.lock() {
            for core in cores.iter() {
                let _ = core.inbox.try_send(CoreMsg::Shutdown);
            }
        }
    }
}
