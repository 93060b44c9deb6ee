//! One core: the thread that owns a queue pair, a DMA slot pool and a
//! table of attached datasets, and its loop (inbox, admission, push, reap,
//! park), run as the first task of the core's event loop. Nothing here
//! takes a lock.

mod admission;
mod complete;
mod inflight;
mod poll;
mod recheck;

use std::future::Future;
use std::os::fd::{AsRawFd, RawFd};
use std::task::Poll;

use tokio::io::unix::AsyncFd;
use tokio::io::Interest;

use super::load::PassLoad;
use super::*;
use inflight::ActiveBatch;
use poll::PollWindow;
pub(super) use poll::PollerSlots;
use recheck::{WaitWatch, COMPLETIONS_RECHECK};

/// A dataset attached to this core, with what planning needs of its
/// namespace read once at attach (asking the namespace is a syscall for a
/// file).
#[derive(Clone)]
struct AttachedView {
    generation: u32,
    view: Arc<DatasetView>,
    block_size_bytes: u32,
}

/// The queue's completion fd as the event loop watches it. The queue owns
/// the fd and outlives the watch (dropped at the end of [`CoreEngine::run`]).
struct CompletionFd(RawFd);

impl AsRawFd for CompletionFd {
    fn as_raw_fd(&self) -> RawFd {
        self.0
    }
}

/// What ended a core's wait for completions.
enum Woken {
    /// The queue's fd turned readable (its readiness now cleared), or
    /// watching it failed.
    Completions(std::io::Result<()>),
    Message(Option<CoreMsg>),
    /// The time the queue named for a held-back completion came.
    Due,
}

/// What a core shares with the rest of its data plane.
pub(super) struct CoreShared {
    /// Raised while the core sleeps with batches waiting for slots, so a
    /// returned slot wakes it.
    pub(super) parked: Arc<AtomicBool>,
    /// Where the core tells submitters and metrics its load.
    pub(super) load: Arc<CoreLoad>,
    /// The cores' places to poll (see [`PollerSlots`]).
    pub(super) pollers: Arc<PollerSlots>,
    /// The core's own inbox, for its recheck to nudge it; weak, so that
    /// the inbox closes when the data plane's senders are gone.
    pub(super) nudge: mpsc::WeakSender<CoreMsg>,
}

pub(super) struct CoreEngine {
    id: usize,
    queue: Queue,
    pool: SlotPool,
    inbox: mpsc::Receiver<CoreMsg>,
    /// A weak sender to `inbox`, for the recheck ([`recheck::watch`]).
    nudge: mpsc::WeakSender<CoreMsg>,
    parked: Arc<AtomicBool>,
    /// Where this core tells submitters and metrics its load.
    load: Arc<CoreLoad>,
    datasets: Vec<Option<AttachedView>>,
    /// Batches in flight per dataset slot, so a detach waits for them.
    slot_batches: Vec<u32>,
    detaching: Vec<(u32, oneshot::Sender<()>)>,
    /// Waiting batches per lane, with their probes: latency first, then bulk.
    waiting: [VecDeque<(ReadBatch, BatchProbe)>; 2],
    latency_batch_bytes_max: u64,
    /// Submission queue depth; bulk batches use at most 3/4 of it.
    queue_depth: u32,
    /// Bytes of bulk-lane reads at the device, and their bound (0: none
    /// but the queue's share).
    bulk_in_flight_bytes: u64,
    bulk_in_flight_bytes_max: u64,
    /// The steering policy's per-flow decisions, once steering starts.
    decisions: Option<Arc<dyn LaneDecisions>>,
    active: Vec<Option<ActiveBatch>>,
    active_free: Vec<usize>,
    /// Per lane, latency first: the active batches with units or block
    /// retries still to push, in admission order, so pushing visits only
    /// them. Each holds at most one entry a batch slot (`pushing`).
    to_push: [VecDeque<usize>; 2],
    /// Per-unit state vectors (failed, retries left) of finished batches,
    /// kept for the next: at most one pair per active batch slot.
    spare_unit_state: Vec<(Vec<bool>, Vec<u32>)>,
    completions: Vec<Completion>,
    batches_waiting_max: usize,
    unit_bytes_max: u32,
    verify_chunks: bool,
    /// Origin of probe timestamps.
    clock: std::time::Instant,
    poll: PollWindow,
    stopping: bool,
}

impl CoreEngine {
    pub(super) fn new(
        id: usize,
        queue: Queue,
        pool: SlotPool,
        inbox: mpsc::Receiver<CoreMsg>,
        shared: CoreShared,
        config: &DataPlaneConfig,
    ) -> Self {
        let CoreShared { parked, load, pollers, nudge } = shared;
        let active_max = config.batches_in_flight_max.max(1);
        Self {
            id,
            queue,
            unit_bytes_max: u32::try_from(config.slot_size_bytes).expect("slot size fits u32"),
            pool,
            inbox,
            nudge,
            parked,
            load,
            datasets: vec![None; DATASET_SLOTS_MAX as usize],
            slot_batches: vec![0; DATASET_SLOTS_MAX as usize],
            detaching: Vec::new(),
            waiting: [
                VecDeque::with_capacity(config.batches_waiting_max),
                VecDeque::with_capacity(config.batches_waiting_max),
            ],
            latency_batch_bytes_max: config.latency_batch_bytes_max,
            queue_depth: config.queue_depth.max(1),
            bulk_in_flight_bytes: 0,
            bulk_in_flight_bytes_max: config.bulk_in_flight_bytes_max,
            decisions: None,
            active: (0..active_max).map(|_| None).collect(),
            active_free: (0..active_max).rev().collect(),
            to_push: [VecDeque::with_capacity(active_max), VecDeque::with_capacity(active_max)],
            spare_unit_state: Vec::with_capacity(active_max),
            completions: Vec::with_capacity(REAP_MAX),
            batches_waiting_max: config.batches_waiting_max.max(1),
            verify_chunks: config.verify_chunks,
            clock: std::time::Instant::now(),
            poll: PollWindow::new(config.poll_window, pollers),
            stopping: false,
        }
    }

    /// The core's engine, the first task of its event loop. Every pass
    /// ends by yielding or awaiting, so the connections placed on this core
    /// run between passes on the same thread.
    pub(super) async fn run(mut self) {
        tracing::debug!(core = self.id, "data-plane core started");
        let completions = self.queue.completion_fd().map(|fd| {
            // SAFETY: the fd is the queue's own (its io_uring), open for as
            // long as `self.queue` lives, and the watch is dropped before
            // this function returns and so before the queue.
            let registered = unsafe { AsyncFd::register_with_interest(CompletionFd(fd), Interest::READABLE) };
            registered.map_err(|err| err.into_parts().1)
        });
        let completions = match completions {
            None => None,
            Some(Ok(watched)) => Some(watched),
            Some(Err(err)) => {
                tracing::warn!(core = self.id, "watching the queue's completions: {err}; waiting on the queue instead");
                None
            }
        };
        let waits = Arc::new(WaitWatch::default());
        tokio::spawn(recheck::watch(Arc::clone(&waits), self.nudge.clone()));
        let mut rechecked = false;
        loop {
            self.pool.reclaim();
            let handled = self.drain_inbox();
            self.admit_waiting();
            self.push_units();
            if let Err(err) = self.queue.flush() {
                tracing::error!(core = self.id, "submitting I/O: {err}");
            }
            let reaped = self.reap();
            if std::mem::take(&mut rechecked) && reaped > 0 {
                self.completion_found_late(reaped);
            }
            self.finish_detaches();
            let active = self.active.len() - self.active_free.len();
            self.load.store(PassLoad {
                batches: self.waiting_count() + active,
                batches_to_push: self.to_push.iter().map(VecDeque::len).sum(),
                reads_at_device: self.queue.in_flight() as usize,
                bulk_bytes_at_device: self.bulk_in_flight_bytes,
            });
            let in_flight = self.queue.in_flight() > 0;
            if self.stopping && !in_flight && self.active_free.len() == self.active.len() {
                break;
            }
            let now = std::time::Instant::now();
            if handled + reaped > 0 {
                self.poll.worked(now);
            }
            if self.more_work_now(handled, reaped) {
                // Look again after the connections on this core had a turn.
                tokio::task::yield_now().await;
                continue;
            }
            if self.poll.keep_polling(now, in_flight) && !self.stopping {
                // Busy a moment ago, or reads at the device that answer
                // about now: look again rather than sleep.
                tokio::task::yield_now().await;
                continue;
            }
            if in_flight {
                match (&completions, self.queue.completion_due()) {
                    (None, None) => {
                        if let Err(err) = self.queue.wait() {
                            tracing::error!(core = self.id, "waiting for completions: {err}");
                        }
                        tokio::task::yield_now().await;
                    }
                    (watched, due) => {
                        waits.enter();
                        self.await_completion_or_message(watched.as_ref(), due).await;
                        rechecked = waits.leave();
                    }
                }
            } else if self.units_to_push() {
                // The queue drained with units still to push (batches with
                // more units than the queue is deep): push them now; parking
                // would wait for a message that may never come.
                tokio::task::yield_now().await;
            } else if !self.stopping {
                self.park().await;
            }
        }
        drop(completions);
        for (batch, _) in self.waiting.iter_mut().flat_map(|lane| lane.drain(..)) {
            let _ = batch.reply.send(Err(SubmitError::Shutdown));
        }
        tracing::debug!(core = self.id, "data-plane core stopped");
    }

    /// Sleeps in the event loop until the queue has completions (its fd
    /// turns readable, or the time it named for one comes) or a message
    /// arrives (handled here; the recheck's nudge is one), whichever is
    /// first.
    async fn await_completion_or_message(
        &mut self,
        watched: Option<&AsyncFd<CompletionFd>>,
        due: Option<std::time::Instant>,
    ) {
        let due = async {
            match due {
                Some(due) => crate::timer::sleep_until(due).await,
                None => std::future::pending().await,
            }
        };
        let mut due = std::pin::pin!(due);
        // One `poll_fn` over the fd's reader slot, the inbox and the time a
        // held-back completion is due. A `readable()` future would enter
        // the fd's list of waiters and leave it again on every wait, and
        // the core waits once for each group of completions.
        let woken = std::future::poll_fn(|cx| {
            // The fd first: completions it announces are not late.
            if let Some(Poll::Ready(ready)) = watched.map(|watched| watched.poll_read_ready(cx)) {
                return Poll::Ready(Woken::Completions(ready.map(|mut guard| guard.clear_ready())));
            }
            if let Poll::Ready(message) = self.inbox.poll_recv(cx) {
                return Poll::Ready(Woken::Message(message));
            }
            due.as_mut().poll(cx).map(|()| Woken::Due)
        })
        .await;
        match woken {
            // Readiness was cleared before the next reap, so a completion
            // that lands after that reap raises it again.
            Woken::Completions(Ok(())) | Woken::Due => {}
            Woken::Completions(Err(err)) => {
                tracing::error!(core = self.id, "waiting for completions: {err}");
                if let Err(err) = self.queue.wait() {
                    tracing::error!(core = self.id, "waiting for completions: {err}");
                }
            }
            Woken::Message(Some(msg)) => self.handle(msg),
            Woken::Message(None) => self.stopping = true,
        }
    }

    /// Notes a pass that found `reaped` completions after the recheck's
    /// nudge, not the completion fd, ended the core's wait: the first time
    /// and every thousandth after, a warning (a wake-up lost between the
    /// kernel and the event loop, or a device slower than
    /// [`COMPLETIONS_RECHECK`]), else a debug line.
    fn completion_found_late(&self, reaped: usize) {
        let times = self.load.completions_found_late();
        if times % 1000 == 1 {
            tracing::warn!(
                core = self.id,
                reaped,
                times,
                "completions found by the {COMPLETIONS_RECHECK:?} recheck, not announced by the queue's fd"
            );
        } else {
            tracing::debug!(core = self.id, reaped, "completions found by the recheck");
        }
    }

    /// Whether this pass left work a second pass could do before anything
    /// new arrives: messages or completions beyond what one pass takes, or
    /// capacity a reap freed for batches still waiting or pushing. Else the
    /// core waits at once: a pass that found nothing would cost a turn of
    /// the event loop (a zero-timeout `epoll_wait` and the timer wheel) for
    /// every group of completions, and the connections on this core run
    /// while it waits as they would after a yield.
    fn more_work_now(&self, handled: usize, reaped: usize) -> bool {
        handled == INBOX_DRAIN_MAX
            || reaped == REAP_MAX
            || (reaped > 0 && (self.waiting_count() > 0 || self.units_to_push()))
    }

    /// Whether an admitted batch still has units or block retries that did
    /// not fit the queue.
    fn units_to_push(&self) -> bool {
        self.to_push.iter().any(|lane| !lane.is_empty())
    }

    /// Sleeps until a message arrives. Slot returns wake it through `Wake`
    /// while batches wait for slots; with none waiting, a returned slot is
    /// taken back on the next pass, and a wake for it would cost a turn of
    /// the event loop per batch for nothing.
    async fn park(&mut self) {
        let wants_slots = self.waiting_count() > 0;
        self.parked.store(wants_slots, Ordering::SeqCst);
        // A slot returned between the last reclaim and `parked` going up
        // sent no wake; with batches waiting, look once more before sleeping.
        let slots_came_back = wants_slots && {
            let free_before = self.pool.free_count();
            self.pool.reclaim();
            self.pool.free_count() != free_before
        };
        if !slots_came_back {
            tracing::debug!(
                core = self.id,
                waiting = self.waiting_count(),
                free_slots = self.pool.free_count(),
                active = self.active.len() - self.active_free.len(),
                "parking"
            );
            match self.inbox.recv().await {
                Some(msg) => self.handle(msg),
                None => self.stopping = true,
            }
        }
        self.parked.store(false, Ordering::SeqCst);
    }

    /// Handles what the inbox holds (a bounded number); returns how many.
    fn drain_inbox(&mut self) -> usize {
        for handled in 0..INBOX_DRAIN_MAX {
            if self.waiting_count() >= self.batches_waiting_max {
                return handled;
            }
            match self.inbox.try_recv() {
                Ok(msg) => self.handle(msg),
                Err(mpsc::error::TryRecvError::Empty) => return handled,
                Err(mpsc::error::TryRecvError::Disconnected) => {
                    self.stopping = true;
                    return handled;
                }
            }
        }
        INBOX_DRAIN_MAX
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
                self.waiting[lane.index()].push_back((batch, probe));
            }
            CoreMsg::Decisions(decisions) => self.decisions = Some(decisions),
            CoreMsg::Attach(slot, view) => {
                self.queue.register_namespace(slot.index, &view.namespace.target());
                let block_size_bytes = view.namespace.geometry().block_size_bytes;
                self.datasets[slot.index as usize] =
                    Some(AttachedView { generation: slot.generation, view, block_size_bytes });
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
}
