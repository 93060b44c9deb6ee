//! The per-core engines and the [`DataPlane`] that fronts them.
//!
//! Each core is one thread that owns a queue pair per device, a DMA arena and
//! a table of attached datasets; nothing on its path takes a lock. Transports
//! reach it only by message (a bounded channel), and it replies per batch
//! with a [`BatchResult`] whose bytes stay in its DMA slots until the
//! transport drops it. Cores poll while I/O is in flight and block on their
//! inbox when idle, so an idle node burns no CPU.

use std::collections::VecDeque;
use std::io::IoSlice;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use tokio::sync::{mpsc, oneshot};

use crate::blocks::VERIFY_BLOCK_BYTES;
use crate::dataset::{ByteRange, DatasetView};
use crate::dma::{Arena, SlotLease, SlotPool};
use crate::driver::{BlockDriver, Completion, DriverError, Queue, ReadIo};
use crate::plan::{plan_batch, BatchPlan, PlanGeometry};
use crate::probe::{
    monotonic_ns, size_bucket, sluice_probe_batch_complete, sluice_probe_batch_submit, sluice_probe_lane_select,
    BatchProbe, LANE_BULK, LANE_BY_POLICY, LANE_BY_THRESHOLD, LANE_LATENCY,
};
use crate::steer::{
    Flow, FlowLease, FlowTable, LaneDecisions, DECISION_BULK, DECISION_LATENCY, DECISION_NONE, FLOWS_MAX,
};
use sluice_proto::RangeStatus;

/// Most datasets attached to one node at once.
pub const DATASET_SLOTS_MAX: u32 = 4096;
/// Most messages a core takes from its inbox per loop turn, so completions
/// are reaped regularly under a flood of requests.
const INBOX_DRAIN_MAX: usize = 64;
/// Most completions reaped per loop turn.
const REAP_MAX: usize = 256;
const LATENCY_LANE: usize = 0;
const BULK_LANE: usize = 1;
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

/// A batch of reads of one dataset.
pub struct ReadBatch {
    pub dataset: DatasetSlot,
    /// Which connection sent it (reported to probes).
    pub client_id: u32,
    /// The flow (dataset on a connection) whose steering decision picks the
    /// lane; [`Flow::UNSTEERED`] leaves it to the size threshold.
    pub flow: Flow,
    pub ranges: Vec<ByteRange>,
    pub reply: oneshot::Sender<Result<BatchResult, SubmitError>>,
}

/// The outcome of a batch. Its bytes live in the core's DMA slots until it
/// is dropped.
pub struct BatchResult {
    plan: BatchPlan,
    lease: SlotLease,
    lane: u8,
}

impl BatchResult {
    /// The lane the batch was served in (by the policy's decision or the
    /// size threshold), for the transports' counters.
    pub fn lane(&self) -> sluice_proto::Lane {
        if self.lane == LANE_LATENCY {
            sluice_proto::Lane::Latency
        } else {
            sluice_proto::Lane::Bulk
        }
    }

    pub fn statuses(&self) -> &[RangeStatus] {
        &self.plan.statuses
    }

    /// Bytes of every `Ok` range, in request order.
    pub fn payload_bytes(&self) -> u64 {
        (0..self.plan.statuses.len())
            .filter(|&i| self.plan.statuses[i] == RangeStatus::Ok)
            .map(|i| self.plan.pieces_of(i).iter().map(|p| u64::from(p.len_bytes)).sum::<u64>())
            .sum()
    }

    /// The pieces of range `index`'s bytes in order, each contiguous in a
    /// DMA region (none unless its status is `Ok`); RDMA writes from them.
    pub fn range_pieces(&self, index: usize) -> impl Iterator<Item = &[u8]> {
        let pieces = if self.plan.statuses[index] == RangeStatus::Ok { self.plan.pieces_of(index) } else { &[] };
        pieces.iter().map(|piece| self.piece_bytes(piece))
    }

    /// The bytes of every `Ok` range in order, for one vectored send.
    pub fn io_slices(&self) -> Vec<IoSlice<'_>> {
        let mut slices = Vec::with_capacity(self.plan.pieces.len());
        for (index, status) in self.plan.statuses.iter().enumerate() {
            if *status == RangeStatus::Ok {
                slices.extend(self.plan.pieces_of(index).iter().map(|p| IoSlice::new(self.piece_bytes(p))));
            }
        }
        slices
    }

    fn piece_bytes(&self, piece: &crate::plan::Piece) -> &[u8] {
        let unit = self.plan.units[piece.unit as usize];
        let slot = self.lease.slot(unit.lease_slot as usize);
        let offset = unit.slot_offset_bytes as usize + piece.unit_offset_bytes as usize;
        // SAFETY: the lease owns the slot and every I/O of this batch has
        // completed before a BatchResult exists, so no device writes it.
        unsafe { self.lease.arena().slot_bytes(slot, offset, piece.len_bytes as usize) }
    }
}

enum CoreMsg {
    Batch(ReadBatch),
    Decisions(Arc<dyn LaneDecisions>),
    Attach(DatasetSlot, Arc<DatasetView>),
    Detach(u32, oneshot::Sender<()>),
    /// Slots came back while the core was parked.
    Wake,
    Shutdown,
}

struct CoreHandle {
    inbox: mpsc::Sender<CoreMsg>,
    thread: Option<JoinHandle<()>>,
}

/// The data plane of one node.
pub struct DataPlane {
    cores: Mutex<Vec<CoreHandle>>,
    senders: Vec<mpsc::Sender<CoreMsg>>,
    next_core: AtomicUsize,
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
        for core in 0..config.cores {
            let (tx, rx) = mpsc::channel(config.inbox_depth);
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
            let (ready_tx, ready_rx) = std::sync::mpsc::channel();
            let driver = Arc::clone(&driver);
            let core_config = config.clone();
            let thread = std::thread::Builder::new()
                .name(format!("sluice-core-{core}"))
                .spawn(move || {
                    let setup = Arena::new(core_config.slots_per_core, core_config.slot_size_bytes)
                        .map_err(|source| StartError::Arena { core, source })
                        .and_then(|arena| {
                            let queue = driver
                                .create_queue(&arena, core_config.queue_depth)
                                .map_err(|source| StartError::Driver { core, source })?;
                            Ok((arena, queue))
                        });
                    match setup {
                        Ok((arena, queue)) => {
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
                            let engine = CoreEngine::new(core, queue, pool, rx, parked, &core_config);
                            let _ = ready_tx.send(Ok((line, region)));
                            engine.run();
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
                Ok((line, (region, slots, leased))) => {
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
            next_core: AtomicUsize::new(0),
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

    /// One line on the driver, cores and buffers, for start-up logs.
    pub fn describe(&self) -> &str {
        &self.driver_description
    }

    /// Makes `view` readable on every core.
    pub async fn attach(&self, view: Arc<DatasetView>) -> Result<DatasetSlot, SubmitError> {
        let slot = {
            let mut in_use = self.slots_in_use.lock().map_err(|_| SubmitError::Shutdown)?;
            let free = in_use
                .iter()
                .position(|used| !used)
                .ok_or(SubmitError::TooLarge { slots_needed: DATASET_SLOTS_MAX + 1, capacity: DATASET_SLOTS_MAX })?;
            in_use[free] = true;
            DatasetSlot { index: free as u32, generation: self.next_generation.fetch_add(1, Ordering::Relaxed) }
        };
        for tx in &self.senders {
            tx.send(CoreMsg::Attach(slot, Arc::clone(&view))).await.map_err(|_| SubmitError::Shutdown)?;
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
        self.senders[core].send(CoreMsg::Batch(batch)).await.map_err(|_| SubmitError::Shutdown)
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
        self.submit(ReadBatch { dataset, client_id: 0, flow, ranges, reply }).await?;
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

/// A batch a core is reading.
struct ActiveBatch {
    slot: u32,
    view: Arc<DatasetView>,
    plan: BatchPlan,
    lease: SlotLease,
    units_pushed: usize,
    units_done: usize,
    /// Units that did not read back whole; their chunks are not verified.
    unit_failed: Vec<bool>,
    /// Single-block reads that isolate the bad blocks of failed units.
    retries: VecDeque<(u32, u32)>,
    retries_left: Vec<u32>,
    /// Namespace byte ranges that could not be read.
    bad_ranges: Vec<(u64, u64)>,
    block_size_bytes: u32,
    probe: BatchProbe,
    reply: oneshot::Sender<Result<BatchResult, SubmitError>>,
}

/// Completion tags: batch slot, whether a block retry, block, unit.
const TAG_RETRY: u64 = 1 << 47;

fn unit_tag(active: usize, unit: usize) -> u64 {
    ((active as u64) << 48) | unit as u64
}

fn retry_tag(active: usize, unit: u32, block: u32) -> u64 {
    ((active as u64) << 48) | TAG_RETRY | (u64::from(block) << 32) | u64::from(unit)
}

struct CoreEngine {
    id: usize,
    queue: Queue,
    pool: SlotPool,
    inbox: mpsc::Receiver<CoreMsg>,
    parked: Arc<AtomicBool>,
    datasets: Vec<Option<(u32, Arc<DatasetView>)>>,
    /// Batches in flight per dataset slot, so a detach waits for them.
    slot_batches: Vec<u32>,
    detaching: Vec<(u32, oneshot::Sender<()>)>,
    /// Waiting batches per lane, with their probes: latency first, then bulk.
    waiting: [VecDeque<(ReadBatch, BatchProbe)>; 2],
    latency_batch_bytes_max: u64,
    /// Submission queue depth; bulk batches use at most 3/4 of it.
    queue_depth: u32,
    /// The steering policy's per-flow decisions, once steering starts.
    decisions: Option<Arc<dyn LaneDecisions>>,
    active: Vec<Option<ActiveBatch>>,
    active_free: Vec<usize>,
    completions: Vec<Completion>,
    batches_waiting_max: usize,
    unit_bytes_max: u32,
    verify_chunks: bool,
    /// Origin of probe timestamps.
    clock: std::time::Instant,
    stopping: bool,
}

impl CoreEngine {
    fn new(
        id: usize,
        queue: Queue,
        pool: SlotPool,
        inbox: mpsc::Receiver<CoreMsg>,
        parked: Arc<AtomicBool>,
        config: &DataPlaneConfig,
    ) -> Self {
        let active_max = config.batches_in_flight_max.max(1);
        Self {
            id,
            queue,
            unit_bytes_max: u32::try_from(config.slot_size_bytes).expect("slot size fits u32"),
            pool,
            inbox,
            parked,
            datasets: vec![None; DATASET_SLOTS_MAX as usize],
            slot_batches: vec![0; DATASET_SLOTS_MAX as usize],
            detaching: Vec::new(),
            waiting: [
                VecDeque::with_capacity(config.batches_waiting_max),
                VecDeque::with_capacity(config.batches_waiting_max),
            ],
            latency_batch_bytes_max: config.latency_batch_bytes_max,
            queue_depth: config.queue_depth.max(1),
            decisions: None,
            active: (0..active_max).map(|_| None).collect(),
            active_free: (0..active_max).rev().collect(),
            completions: Vec::with_capacity(REAP_MAX),
            batches_waiting_max: config.batches_waiting_max.max(1),
            verify_chunks: config.verify_chunks,
            clock: std::time::Instant::now(),
            stopping: false,
        }
    }

    fn run(mut self) {
        tracing::debug!(core = self.id, "data-plane core started");
        loop {
            self.pool.reclaim();
            self.drain_inbox();
            self.admit_waiting();
            self.push_units();
            if let Err(err) = self.queue.flush() {
                tracing::error!(core = self.id, "submitting I/O: {err}");
            }
            let reaped = self.reap();
            self.finish_detaches();
            let in_flight = self.queue.in_flight() > 0;
            if self.stopping && !in_flight && self.active_free.len() == self.active.len() {
                break;
            }
            if in_flight {
                if reaped == 0 {
                    if let Err(err) = self.queue.wait() {
                        tracing::error!(core = self.id, "waiting for completions: {err}");
                    }
                }
            } else if self.units_to_push() {
                // The queue drained with units still to push (batches with
                // more units than the queue is deep): push them now; parking
                // would wait for a message that may never come.
                continue;
            } else if !self.stopping {
                self.park();
            }
        }
        for (batch, _) in self.waiting.iter_mut().flat_map(|lane| lane.drain(..)) {
            let _ = batch.reply.send(Err(SubmitError::Shutdown));
        }
        tracing::debug!(core = self.id, "data-plane core stopped");
    }

    /// Whether an admitted batch still has units or block retries that did
    /// not fit the queue.
    fn units_to_push(&self) -> bool {
        self.active
            .iter()
            .flatten()
            .any(|batch| batch.units_pushed < batch.plan.units.len() || !batch.retries.is_empty())
    }

    /// Blocks until a message arrives. Slot returns wake it through `Wake`.
    fn park(&mut self) {
        self.parked.store(true, Ordering::SeqCst);
        // A slot returned between the last reclaim and `parked` going up
        // sent no wake; look once more before sleeping.
        let free_before = self.pool.free_count();
        self.pool.reclaim();
        if self.pool.free_count() == free_before {
            tracing::debug!(
                core = self.id,
                waiting = self.waiting_count(),
                free_slots = self.pool.free_count(),
                active = self.active.len() - self.active_free.len(),
                "parking"
            );
            match self.inbox.blocking_recv() {
                Some(msg) => self.handle(msg),
                None => self.stopping = true,
            }
        }
        self.parked.store(false, Ordering::SeqCst);
    }

    fn drain_inbox(&mut self) {
        for _ in 0..INBOX_DRAIN_MAX {
            if self.waiting_count() >= self.batches_waiting_max {
                return;
            }
            match self.inbox.try_recv() {
                Ok(msg) => self.handle(msg),
                Err(mpsc::error::TryRecvError::Empty) => return,
                Err(mpsc::error::TryRecvError::Disconnected) => {
                    self.stopping = true;
                    return;
                }
            }
        }
    }

    fn handle(&mut self, msg: CoreMsg) {
        match msg {
            CoreMsg::Batch(batch) if self.stopping => {
                let _ = batch.reply.send(Err(SubmitError::Shutdown));
            }
            CoreMsg::Batch(batch) => {
                let mut probe = self.probe_of(&batch);
                let lane = self.choose_lane(&mut probe);
                sluice_probe_lane_select(&probe);
                self.waiting[lane].push_back((batch, probe));
            }
            CoreMsg::Decisions(decisions) => self.decisions = Some(decisions),
            CoreMsg::Attach(slot, view) => {
                self.queue.register_namespace(slot.index, &view.namespace.target());
                self.datasets[slot.index as usize] = Some((slot.generation, view));
            }
            CoreMsg::Detach(slot, ack) => {
                self.datasets[slot as usize] = None;
                self.detaching.push((slot, ack));
            }
            CoreMsg::Wake => {}
            CoreMsg::Shutdown => self.stopping = true,
        }
    }

    fn finish_detaches(&mut self) {
        let mut index = 0;
        while index < self.detaching.len() {
            let slot = self.detaching[index].0;
            if self.slot_batches[slot as usize] == 0 {
                let (_, ack) = self.detaching.swap_remove(index);
                self.queue.unregister_namespace(slot);
                let _ = ack.send(());
            } else {
                index += 1;
            }
        }
    }

    /// The probe of a batch that just arrived: its sizes and its flow.
    fn probe_of(&self, batch: &ReadBatch) -> BatchProbe {
        let dataset_id = match self.datasets.get(batch.dataset.index as usize) {
            Some(Some((generation, view))) if *generation == batch.dataset.generation => view.dataset_id,
            _ => 0,
        };
        let mut probe = BatchProbe {
            dataset_id,
            client_id: batch.client_id,
            ranges: batch.ranges.len() as u32,
            flow: batch.flow.index,
            flow_generation: batch.flow.generation,
            peer: batch.flow.peer,
            ..BatchProbe::default()
        };
        for range in &batch.ranges {
            probe.bytes += u64::from(range.len_bytes);
            probe.size_hist[size_bucket(range.len_bytes)] += 1;
        }
        probe
    }

    /// The policy's decision for the batch's flow where there is one (one
    /// load from the decision array), else the size threshold.
    fn choose_lane(&self, probe: &mut BatchProbe) -> usize {
        let decision = match &self.decisions {
            Some(decisions) if probe.flow < FLOWS_MAX => decisions.decision(probe.flow),
            _ => DECISION_NONE,
        };
        let (lane, source) = match decision {
            DECISION_LATENCY => (LATENCY_LANE, LANE_BY_POLICY),
            DECISION_BULK => (BULK_LANE, LANE_BY_POLICY),
            _ if probe.bytes <= self.latency_batch_bytes_max => (LATENCY_LANE, LANE_BY_THRESHOLD),
            _ => (BULK_LANE, LANE_BY_THRESHOLD),
        };
        probe.lane = if lane == LATENCY_LANE { LANE_LATENCY } else { LANE_BULK };
        probe.lane_source = source;
        lane
    }

    fn waiting_count(&self) -> usize {
        self.waiting.iter().map(VecDeque::len).sum()
    }

    /// Starts waiting batches whose slots are free: the latency lane first,
    /// then bulk batches as long as they leave the latency reserve free.
    fn admit_waiting(&mut self) {
        self.admit_lane(LATENCY_LANE, 0);
        let reserve = self.pool.capacity() / LATENCY_RESERVE_DIVISOR;
        self.admit_lane(BULK_LANE, reserve);
    }

    /// Admits batches of `lane` in order while `reserve` slots stay free.
    fn admit_lane(&mut self, lane: usize, reserve: usize) {
        while let Some((batch, _)) = self.waiting[lane].front() {
            if batch.reply.is_closed() {
                // Nobody waits for it any more: do not read it.
                self.waiting[lane].pop_front();
                continue;
            }
            let attached = self.datasets.get(batch.dataset.index as usize).cloned().flatten();
            let Some(view) = attached.filter(|(g, _)| *g == batch.dataset.generation).map(|(_, v)| v) else {
                if let Some((batch, _)) = self.waiting[lane].pop_front() {
                    let _ = batch.reply.send(Err(SubmitError::UnknownDataset));
                }
                continue;
            };
            let Some(&active_index) = self.active_free.last() else { return };
            let geometry = PlanGeometry {
                block_size_bytes: view.namespace.geometry().block_size_bytes,
                unit_bytes_max: self.unit_bytes_max,
                base_offset_bytes: view.base_offset_bytes,
                length_bytes: view.length_bytes,
                widen_to_bytes: self.widen_for(&view),
            };
            let plan = plan_batch(&batch.ranges, geometry);
            // What this lane may ever use: a bulk batch never takes the
            // latency lane's reserve, so one that needs it is too large
            // (the transports' limits keep batches well under it).
            let capacity = (self.pool.capacity() - reserve) as u32;
            if plan.slots_needed > capacity {
                if let Some((batch, _)) = self.waiting[lane].pop_front() {
                    let slots_needed = plan.slots_needed;
                    let _ = batch.reply.send(Err(SubmitError::TooLarge { slots_needed, capacity }));
                }
                continue;
            }
            if self.pool.free_count() < plan.slots_needed as usize + reserve {
                return;
            }
            let Some(lease) = self.pool.take(plan.slots_needed as usize) else { return };
            let Some((batch, mut probe)) = self.waiting[lane].pop_front() else { return };
            self.active_free.pop();
            self.slot_batches[batch.dataset.index as usize] += 1;
            let units = plan.units.len();
            let block_size_bytes = geometry.block_size_bytes;
            probe.submit_ns = monotonic_ns(self.clock);
            sluice_probe_batch_submit(&probe);
            self.active[active_index] = Some(ActiveBatch {
                slot: batch.dataset.index,
                view,
                plan,
                lease,
                units_pushed: 0,
                units_done: 0,
                unit_failed: vec![false; units],
                retries: VecDeque::new(),
                retries_left: vec![0; units],
                bad_ranges: Vec::new(),
                block_size_bytes,
                probe,
                reply: batch.reply,
            });
            if units == 0 {
                self.complete(active_index);
            }
        }
    }

    /// Pushes block retries and units of active batches while the queue
    /// has room: latency-lane batches first, then bulk ones only while they
    /// leave a quarter of the queue to the latency lane, so a small read
    /// never waits behind a device queue full of bulk reads.
    fn push_units(&mut self) {
        self.push_lane_units(LANE_LATENCY, u32::MAX);
        let bulk_in_flight_max = self.queue_depth - self.queue_depth / LATENCY_RESERVE_DIVISOR as u32;
        self.push_lane_units(LANE_BULK, bulk_in_flight_max.max(1));
    }

    /// Pushes the units of `lane`'s active batches while fewer than
    /// `in_flight_max` reads are in the queue.
    fn push_lane_units(&mut self, lane: u8, in_flight_max: u32) {
        for index in 0..self.active.len() {
            let Some(batch) = self.active[index].as_mut() else { continue };
            if batch.probe.lane != lane {
                continue;
            }
            while let Some(&(unit_index, block)) = batch.retries.front() {
                if self.queue.in_flight() >= in_flight_max {
                    return;
                }
                let unit = batch.plan.units[unit_index as usize];
                let at = unit.slot_offset_bytes as usize + (block * batch.block_size_bytes) as usize;
                let io = ReadIo {
                    namespace_index: batch.slot,
                    offset_bytes: unit.offset_bytes + u64::from(block * batch.block_size_bytes),
                    len_bytes: batch.block_size_bytes,
                    buf: batch.lease.arena().slot_ptr(batch.lease.slot(unit.lease_slot as usize), at),
                    tag: retry_tag(index, unit_index, block),
                };
                // SAFETY: the block lies inside its unit's part of a slot this
                // batch's lease owns; the failed unit's read has completed, so
                // only this retry writes it until its completion is reaped.
                if unsafe { self.queue.push_read(io) }.is_err() {
                    return;
                }
                batch.retries.pop_front();
            }
            while batch.units_pushed < batch.plan.units.len() {
                if self.queue.in_flight() >= in_flight_max {
                    return;
                }
                let unit_index = batch.units_pushed;
                let unit = batch.plan.units[unit_index];
                let buf = batch
                    .lease
                    .arena()
                    .slot_ptr(batch.lease.slot(unit.lease_slot as usize), unit.slot_offset_bytes as usize);
                let io = ReadIo {
                    namespace_index: batch.slot,
                    offset_bytes: unit.offset_bytes,
                    len_bytes: unit.len_bytes,
                    buf,
                    tag: unit_tag(index, unit_index),
                };
                // SAFETY: `buf` is inside a slot this batch's lease owns; the
                // plan gives each unit a disjoint, 4096-aligned range of it,
                // and the lease is kept until every unit has completed.
                if unsafe { self.queue.push_read(io) }.is_err() {
                    return;
                }
                batch.units_pushed += 1;
            }
        }
    }

    fn reap(&mut self) -> usize {
        let mut completions = std::mem::take(&mut self.completions);
        completions.clear();
        let reaped = self.queue.reap(&mut completions, REAP_MAX);
        for completion in &completions {
            let index = (completion.tag >> 48) as usize;
            let unit_index = (completion.tag & u64::from(u32::MAX)) as usize;
            let batch = self.active[index].as_mut().expect("completion for an idle batch slot");
            let unit = batch.plan.units[unit_index];
            let finished_unit = if completion.tag & TAG_RETRY != 0 {
                let block = ((completion.tag >> 32) & 0x7fff) as u32;
                let start = unit.offset_bytes + u64::from(block * batch.block_size_bytes);
                let needed = u64::from(unit.needed_bytes).saturating_sub(u64::from(block * batch.block_size_bytes));
                let needed = needed.min(u64::from(batch.block_size_bytes));
                if completion.result < 0 || (completion.result as u64) < needed {
                    batch.bad_ranges.push((start, start + u64::from(batch.block_size_bytes)));
                }
                batch.retries_left[unit_index] -= 1;
                batch.retries_left[unit_index] == 0
            } else if completion.result >= 0 && completion.result as u32 >= unit.needed_bytes {
                true
            } else {
                tracing::warn!(
                    core = self.id,
                    offset = unit.offset_bytes,
                    len = unit.len_bytes,
                    result = completion.result,
                    "read failed; retrying block by block"
                );
                batch.unit_failed[unit_index] = true;
                let blocks = unit.needed_bytes.div_ceil(batch.block_size_bytes).max(1);
                if blocks == 1 {
                    batch.bad_ranges.push((unit.offset_bytes, unit.offset_bytes + u64::from(unit.len_bytes)));
                    true
                } else {
                    batch.retries.extend((0..blocks).map(|b| (unit_index as u32, b)));
                    batch.retries_left[unit_index] = blocks;
                    false
                }
            };
            if finished_unit {
                batch.units_done += 1;
                assert!(batch.units_done <= batch.plan.units.len(), "unit completed twice");
                if batch.units_done == batch.plan.units.len() {
                    self.complete(index);
                }
            }
        }
        self.completions = completions;
        reaped
    }

    /// Whether reads of `view` are verified: it has block checksums and
    /// verification is on.
    fn verifies(&self, view: &DatasetView) -> bool {
        self.verify_chunks && !view.block_crcs.is_empty()
    }

    /// How far reads of `view` are widened: to whole checksum blocks when
    /// they are verified (the covering 4 KiB blocks read anyway).
    fn widen_for(&self, view: &DatasetView) -> u64 {
        if self.verifies(view) {
            VERIFY_BLOCK_BYTES
        } else {
            0
        }
    }

    /// Settles the statuses of a finished batch and replies.
    fn complete(&mut self, index: usize) {
        let mut batch = self.active[index].take().expect("completing an idle batch slot");
        self.active_free.push(index);
        self.slot_batches[batch.slot as usize] -= 1;
        // Bad dataset byte spans: whole blocks.
        let bad_spans = if self.verifies(&batch.view) { verify_blocks(&batch) } else { Vec::new() };
        let plan = &mut batch.plan;
        for range in 0..plan.statuses.len() {
            if plan.statuses[range] != RangeStatus::Ok {
                continue;
            }
            let (first, count) = plan.range_pieces[range];
            let pieces = &plan.pieces[first as usize..(first + count) as usize];
            let Some(head) = pieces.first() else { continue };
            let ns_start = plan.units[head.unit as usize].offset_bytes + u64::from(head.unit_offset_bytes);
            let len: u64 = pieces.iter().map(|p| u64::from(p.len_bytes)).sum();
            if batch.bad_ranges.iter().any(|&(a, b)| a < ns_start + len && ns_start < b) {
                plan.statuses[range] = RangeStatus::IoError;
            } else if !bad_spans.is_empty() {
                let start = ns_start - batch.view.base_offset_bytes;
                if bad_spans.iter().any(|&(a, b)| a < start + len && start < b) {
                    plan.statuses[range] = RangeStatus::ChecksumMismatch;
                }
            }
        }
        batch.probe.complete_ns = monotonic_ns(self.clock);
        batch.probe.failed_ranges = plan.statuses.iter().filter(|s| **s != RangeStatus::Ok).count() as u32;
        sluice_probe_batch_complete(&batch.probe);
        let result = BatchResult { plan: batch.plan, lease: batch.lease, lane: batch.probe.lane };
        // A closed reply means the requester left; dropping the result
        // returns its slots.
        let _ = batch.reply.send(Ok(result));
    }
}

/// Dataset byte spans of the blocks whose CRC32C does not match, among
/// every block the batch's successful units read: units start on block
/// boundaries and cover whole blocks (the plan widens to them), so every
/// byte served is checked.
fn verify_blocks(batch: &ActiveBatch) -> Vec<(u64, u64)> {
    let view = &batch.view;
    let mut bad = Vec::new();
    for (unit_index, unit) in batch.plan.units.iter().enumerate() {
        if batch.unit_failed[unit_index] {
            continue;
        }
        let start = unit.offset_bytes - view.base_offset_bytes;
        assert!(start.is_multiple_of(VERIFY_BLOCK_BYTES), "unit not on a block boundary");
        let end = (start + u64::from(unit.needed_bytes)).min(view.length_bytes);
        let slot = batch.lease.slot(unit.lease_slot as usize);
        // SAFETY: this unit's read completed and the lease owns the slot.
        let data = unsafe {
            batch.lease.arena().slot_bytes(slot, unit.slot_offset_bytes as usize, unit.needed_bytes as usize)
        };
        let mut at = start;
        while at < end {
            let block_end = (at + VERIFY_BLOCK_BYTES).min(view.length_bytes);
            let bytes = &data[(at - start) as usize..(block_end - start) as usize];
            let expected = view.block_crcs.get((at / VERIFY_BLOCK_BYTES) as usize);
            if expected.is_none_or(|&crc| crc != crc32c::crc32c(bytes)) {
                bad.push((at, block_end));
            }
            at = block_end;
        }
    }
    bad
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::driver::{IoMode, MemDriver, NamespaceSpec, UringDriver};
    use rand::{Rng, SeedableRng};
    use sluice_proto::CHUNK_SIZE_BYTES;

    fn small_config() -> DataPlaneConfig {
        DataPlaneConfig { cores: 2, slots_per_core: 64, queue_depth: 32, ..DataPlaneConfig::default() }
    }

    /// The block checksums of `data`, as a sealed dataset's view has them.
    fn blocks(data: &[u8]) -> Arc<[u32]> {
        let mut crcs = Vec::new();
        crate::blocks::extend_block_crcs(&mut crcs, data);
        crcs.into()
    }

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime")
    }

    fn random_ranges(rng: &mut impl Rng, len: u64, count: usize) -> Vec<ByteRange> {
        (0..count)
            .map(|_| {
                let len_bytes = rng.gen_range(1..=300_000u32).min(len as u32);
                let offset_bytes = rng.gen_range(0..=len - u64::from(len_bytes));
                ByteRange { offset_bytes, len_bytes }
            })
            .collect()
    }

    fn assert_batch_exact(data: &[u8], ranges: &[ByteRange], result: &BatchResult) {
        for (index, range) in ranges.iter().enumerate() {
            assert_eq!(result.statuses()[index], RangeStatus::Ok, "range {index}");
            let got: Vec<u8> = result.range_pieces(index).collect::<Vec<_>>().concat();
            let start = range.offset_bytes as usize;
            assert_eq!(got, &data[start..start + range.len_bytes as usize], "range {index}");
        }
    }

    /// Random unaligned batches read back byte-exact through io_uring with
    /// O_DIRECT on a real file, and through the memory backend.
    #[test]
    fn reads_are_byte_exact_on_both_backends() {
        let mut rng = rand::rngs::SmallRng::seed_from_u64(7);
        let data: Vec<u8> = (0..3_000_001).map(|_| rng.gen()).collect();
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("ns");
        let drivers: [(Arc<dyn BlockDriver>, NamespaceSpec); 2] = [
            (Arc::new(UringDriver::new(IoMode::Direct)), NamespaceSpec::File { path, create: true }),
            (Arc::new(MemDriver), NamespaceSpec::Mem),
        ];
        for (driver, spec) in drivers {
            let ns = driver.open_namespace(&spec).expect("namespace");
            ns.write_at(0, &data).expect("write");
            ns.truncate(data.len() as u64).expect("truncate");
            ns.sync().expect("sync");
            let plane = DataPlane::start(Arc::clone(&driver), small_config()).expect("start");
            let view = DatasetView {
                dataset_id: 1,
                namespace: ns,
                base_offset_bytes: 0,
                length_bytes: data.len() as u64,
                block_crcs: blocks(&data),
            };
            runtime().block_on(async {
                let slot = plane.attach(Arc::new(view)).await.expect("attach");
                for _ in 0..20 {
                    let ranges = random_ranges(&mut rng, data.len() as u64, 40);
                    let result = plane.read(slot, ranges.clone()).await.expect("batch");
                    assert_batch_exact(&data, &ranges, &result);
                }
                plane.detach(slot).await;
                let gone = plane.read(slot, vec![ByteRange { offset_bytes: 0, len_bytes: 1 }]).await;
                assert_eq!(gone.err(), Some(SubmitError::UnknownDataset));
            });
            plane.shutdown();
        }
    }

    /// With block checksums every read is verified, however small and
    /// wherever it starts: one flipped byte fails exactly the ranges that
    /// touch its 4 KiB block, and bytes read around it stay served.
    #[test]
    fn small_reads_are_verified_per_block() {
        let len = 3 * CHUNK_SIZE_BYTES as usize + 1000;
        let data: Vec<u8> = (0..len).map(|i| (i * 7 + 3) as u8).collect();
        let ns = MemDriver.open_namespace(&NamespaceSpec::Mem).expect("namespace");
        ns.write_at(0, &data).expect("write");
        let flipped = CHUNK_SIZE_BYTES + 3 * VERIFY_BLOCK_BYTES + 17;
        ns.write_at(flipped, &[!data[flipped as usize]]).expect("corrupt");
        let plane = DataPlane::start(Arc::new(MemDriver), small_config()).expect("start");
        let view = DatasetView {
            dataset_id: 1,
            namespace: ns,
            base_offset_bytes: 0,
            length_bytes: len as u64,
            block_crcs: blocks(&data),
        };
        runtime().block_on(async {
            let slot = plane.attach(Arc::new(view)).await.expect("attach");
            let block = flipped / VERIFY_BLOCK_BYTES * VERIFY_BLOCK_BYTES;
            let ranges = vec![
                ByteRange { offset_bytes: flipped, len_bytes: 1 },
                ByteRange { offset_bytes: block + 4000, len_bytes: 200 },
                ByteRange { offset_bytes: block - 10, len_bytes: 10 },
                ByteRange { offset_bytes: block + VERIFY_BLOCK_BYTES, len_bytes: 4096 },
                ByteRange { offset_bytes: len as u64 - 900, len_bytes: 900 },
                ByteRange { offset_bytes: 5, len_bytes: 2048 },
            ];
            let result = plane.read(slot, ranges.clone()).await.expect("batch");
            let bad = RangeStatus::ChecksumMismatch;
            assert_eq!(
                result.statuses(),
                &[bad, bad, RangeStatus::Ok, RangeStatus::Ok, RangeStatus::Ok, RangeStatus::Ok]
            );
            let served = ranges[2..].to_vec();
            let result = plane.read(slot, served.clone()).await.expect("batch");
            assert_batch_exact(&data, &served, &result);
        });
        plane.shutdown();
    }

    /// A chunk whose bytes no longer match the manifest fails the ranges
    /// that cover it and only those.
    #[test]
    fn corrupt_chunk_fails_only_its_ranges() {
        let data = vec![0xabu8; 4 * CHUNK_SIZE_BYTES as usize];
        let ns = MemDriver.open_namespace(&NamespaceSpec::Mem).expect("namespace");
        ns.write_at(0, &data).expect("write");
        let manifest = blocks(&data);
        ns.write_at(CHUNK_SIZE_BYTES + 5, &[0]).expect("corrupt");
        let plane = DataPlane::start(Arc::new(MemDriver), small_config()).expect("start");
        let view = DatasetView {
            dataset_id: 1,
            namespace: ns,
            base_offset_bytes: 0,
            length_bytes: data.len() as u64,
            block_crcs: manifest,
        };
        runtime().block_on(async {
            let slot = plane.attach(Arc::new(view)).await.expect("attach");
            let whole = |c: u64| ByteRange { offset_bytes: c * CHUNK_SIZE_BYTES, len_bytes: CHUNK_SIZE_BYTES as u32 };
            let ranges =
                vec![whole(0), whole(1), whole(2), ByteRange { offset_bytes: 3 * CHUNK_SIZE_BYTES, len_bytes: 10 }];
            let result = plane.read(slot, ranges).await.expect("batch");
            assert_eq!(
                result.statuses(),
                &[RangeStatus::Ok, RangeStatus::ChecksumMismatch, RangeStatus::Ok, RangeStatus::Ok]
            );
        });
        plane.shutdown();
    }

    /// A batch of more I/O units than the queue is deep completes: when the
    /// queue drains with units still to push, the core pushes them instead
    /// of parking (it once parked there and waited for a message that never
    /// came, on both backends).
    #[test]
    fn batches_of_more_units_than_the_queue_holds_complete() {
        let data: Vec<u8> = (0..(8u32 << 20)).map(|i| (i % 251) as u8).collect();
        let dir = tempfile::tempdir().expect("tempdir");
        let drivers: [(Arc<dyn BlockDriver>, NamespaceSpec); 2] = [
            (
                Arc::new(UringDriver::new(IoMode::Direct)),
                NamespaceSpec::File { path: dir.path().join("ns"), create: true },
            ),
            (Arc::new(MemDriver), NamespaceSpec::Mem),
        ];
        for (driver, spec) in drivers {
            let ns = driver.open_namespace(&spec).expect("namespace");
            ns.write_at(0, &data).expect("write");
            ns.sync().expect("sync");
            let config = DataPlaneConfig { cores: 1, queue_depth: 4, ..small_config() };
            let plane = DataPlane::start(driver, config).expect("start");
            let view = DatasetView::unverified(1, ns, data.len() as u64);
            runtime().block_on(async {
                let slot = plane.attach(Arc::new(view)).await.expect("attach");
                // 100 ranges 64 KiB apart: 100 units for a queue of 4.
                let ranges: Vec<ByteRange> =
                    (0..100u64).map(|i| ByteRange { offset_bytes: i * 65_536 + 7, len_bytes: 3001 }).collect();
                for _ in 0..3 {
                    let read = plane.read(slot, ranges.clone());
                    let result = tokio::time::timeout(std::time::Duration::from_secs(20), read)
                        .await
                        .expect("the batch completes")
                        .expect("batch");
                    assert_batch_exact(&data, &ranges, &result);
                }
            });
            plane.shutdown();
        }
    }

    /// Many batches in flight share a small pool: slots held by unsent
    /// responses come back and later batches proceed.
    #[test]
    fn slots_recycle_under_pressure() {
        let data = vec![1u8; 8 << 20];
        let ns = MemDriver.open_namespace(&NamespaceSpec::Mem).expect("namespace");
        ns.write_at(0, &data).expect("write");
        let config = DataPlaneConfig { cores: 1, slots_per_core: 16, ..small_config() };
        let plane = Arc::new(DataPlane::start(Arc::new(MemDriver), config).expect("start"));
        let view = DatasetView::unverified(1, ns, data.len() as u64);
        runtime().block_on(async {
            let slot = plane.attach(Arc::new(view)).await.expect("attach");
            let big = vec![ByteRange { offset_bytes: 0, len_bytes: 12 * 128 * 1024 }];
            let held = plane.read(slot, big.clone()).await.expect("first");
            let plane2 = Arc::clone(&plane);
            let second = tokio::spawn(async move { plane2.read(slot, big).await });
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            assert!(!second.is_finished(), "second batch must wait for slots");
            drop(held);
            let second = second.await.expect("join").expect("second");
            assert_eq!(second.payload_bytes(), 12 * 128 * 1024);
            let too_big = vec![ByteRange { offset_bytes: 0, len_bytes: 17 * 128 * 1024 }];
            assert!(matches!(plane.read(slot, too_big).await, Err(SubmitError::TooLarge { .. })));
        });
        plane.shutdown();
    }

    /// Latency-lane units go to the queue before bulk ones, and bulk
    /// batches leave room for them: a small read that arrives while a slow
    /// 4 MiB batch (32 units, each delayed 20 ms, queue depth 4) is being
    /// read is pushed before the bulk batch's remaining units, not after.
    #[test]
    fn latency_lane_reads_pass_a_bulk_batch_in_the_queue() {
        use crate::driver::{FaultPlan, FaultyDriver};
        let ns = MemDriver.open_namespace(&NamespaceSpec::Mem).expect("namespace");
        ns.write_at(0, &vec![3u8; 8 << 20]).expect("write");
        let plan =
            FaultPlan { delays: vec![(0..(4 << 20), std::time::Duration::from_millis(20))], ..FaultPlan::default() };
        let driver = Arc::new(FaultyDriver::new(Arc::new(MemDriver), plan));
        let config = DataPlaneConfig { cores: 1, queue_depth: 4, ..small_config() };
        let plane = Arc::new(DataPlane::start(Arc::clone(&driver) as Arc<dyn BlockDriver>, config).expect("start"));
        let view = DatasetView::unverified(1, ns, 8 << 20);
        let small_offset = 6 << 20;
        runtime().block_on(async {
            let slot = plane.attach(Arc::new(view)).await.expect("attach");
            let bulk_plane = Arc::clone(&plane);
            let bulk = tokio::spawn(async move {
                bulk_plane.read(slot, vec![ByteRange { offset_bytes: 0, len_bytes: 4 << 20 }]).await
            });
            tokio::time::sleep(std::time::Duration::from_millis(30)).await;
            let small = plane.read(slot, vec![ByteRange { offset_bytes: small_offset, len_bytes: 4096 }]).await;
            assert_eq!(small.expect("small read").statuses(), &[RangeStatus::Ok]);
            let bulk = bulk.await.expect("join").expect("bulk");
            assert_eq!(bulk.payload_bytes(), 4 << 20);
        });
        plane.shutdown();
        let pushed = driver.pushed_offsets();
        assert_eq!(pushed.len(), 33, "{pushed:?}");
        let small_at = pushed.iter().position(|o| *o == small_offset).expect("small read pushed");
        assert!(small_at < 16, "the small read went to the queue after {small_at} bulk units: {pushed:?}");
    }
}
