//! One RDMA connection: its queue pair, message slots and send queue, and
//! the loop that turns completions into session events and batch results
//! into WRITEs and a SEND.

use super::*;

impl From<VerbsError> for Fatal {
    fn from(err: VerbsError) -> Self {
        Self::Link(err.to_string())
    }
}

/// A request, copied out of its receive slot so the slot can be reposted.
enum Incoming {
    Control(ControlMessage),
    Batch { batch_id: u64, handle: u32, target: Target, ranges: Vec<ByteRange>, fits: bool },
}

/// Where a batch's bytes go in the client's memory.
struct Target {
    remote_addr: u64,
    rkey: u32,
    /// Per range, its offset in the client's buffer.
    dests: Vec<u64>,
}

/// A batch the data plane finished (or refused), ready to go out.
struct Completed {
    batch_id: u64,
    range_count: u32,
    target: Target,
    outcome: Result<BatchResult, BatchStatus>,
}

// One per response, moved from the reading set to the send queue: the size
// difference costs a copy, not memory.
#[allow(clippy::large_enum_variant)]
enum Outgoing {
    Control(Vec<u8>),
    Batch(Completed),
}

/// A posted SEND and what it keeps alive until it completes.
struct InFlight {
    /// Send-queue entries it and the WRITEs before it take.
    work_requests: u32,
    /// Whether it answers a batch (which holds a credit until then).
    is_batch: bool,
    posted: Instant,
    /// The DMA slots the WRITEs read from, for batches.
    _batch: Option<BatchResult>,
}

/// A batch on the data plane: what its response needs besides the
/// outcome, which comes back on the connection's completion queue.
struct Reading {
    batch_id: u64,
    range_count: u32,
    target: Target,
    counters: Arc<DatasetCounters>,
    submitted: Instant,
}

/// The connection's batches on the data plane, by the tag their outcomes
/// come back under: no channel or task of its own a batch.
struct Batches {
    queue: mpsc::UnboundedSender<BatchCompletion>,
    /// By tag; the connection numbers them, so a fast hash is safe.
    reading: FxHashMap<u64, Reading>,
    next_tag: u64,
}

/// One client connection. Owns its queue pair; declared first, it is
/// destroyed before the slots it posts from and the batches it writes from.
pub(super) struct Connection<R> {
    qp: QueuePair,
    recv: MessageSlots,
    send: MessageSlots,
    in_flight: Vec<Option<InFlight>>,
    free_send: Vec<u32>,
    send_queue_free: u32,
    batches_in_flight: u32,
    waiting: VecDeque<Outgoing>,
    device: Arc<Device>,
    resolver: Arc<R>,
    config: ServerConfig,
    client_id: u32,
    /// The core whose event loop runs this connection (and polls its
    /// completion queue), where its batches go unless that core is loaded.
    placement: Placement,
    session: Session,
    /// Held until the first dataset opens: the place in the small pool of
    /// connections that have not authenticated.
    pre_auth: Option<tokio::sync::OwnedSemaphorePermit>,
    /// A response's bytes before they go to its send slot.
    scratch: Vec<u8>,
    /// Kept from one response to the next, so a response allocates none:
    /// its WRITEs' SGEs and groups ([`plan_writes`]), its range statuses,
    /// and its work requests (empty between responses).
    sges: Vec<Sge>,
    writes: Vec<(usize, usize, u64)>,
    statuses: Vec<u8>,
    spare_requests: Vec<SendWr<'static>>,
    /// Destination lists of answered batches, for the next requests' (at
    /// most one a credit).
    spare_dests: Vec<Vec<u64>>,
}

/// How long a closing connection waits for its QP, in the error state, to
/// flush the SENDs of its responses before leaving their slots to the
/// teardown.
const FLUSH_WAIT: Duration = Duration::from_secs(5);

/// How long a closing connection waits for the client to acknowledge why
/// it closes: the queue pair's own retries of a lost packet, and a margin
/// for a busy client.
const FAREWELL_WAIT: Duration = LOST_PACKET_GIVE_UP.saturating_add(Duration::from_secs(1));

/// A teardown slower than this is worth a warning: it held the
/// connection's id (and, before [`Connection::release_slots`], its slots).
const CLOSE_SLOW: Duration = Duration::from_secs(2);

/// RDMA connections set up (queue pair, registered message slots) that
/// have not yet opened a dataset; more are rejected until one does or is
/// closed at the handshake deadline.
pub(super) const PRE_AUTH_SESSIONS_MAX: usize = 32;

impl<R: DatasetResolver> Connection<R> {
    /// Creates the queue pair and message slots, posts every receive, and
    /// accepts. On failure the request is rejected.
    pub(super) fn setup(
        id: CmId,
        device: Arc<Device>,
        resolver: Arc<R>,
        config: ServerConfig,
        client_id: u32,
        placement: Placement,
    ) -> Result<Self, VerbsError> {
        let credits = config.credits.clamp(1, RDMA_CREDITS_MAX);
        let messages = credits + CONTROL_MESSAGES_MAX;
        let send_wr = SEND_QUEUE_DEPTH.min(device.limits.max_qp_wr).max(messages + 1);
        let caps = QueueCaps { send_wr, recv_wr: messages, send_sge: SEND_SGE_MAX.min(device.limits.max_sge).max(1) };
        let built = (|| {
            let cq = CompletionQueue::new(&id, (send_wr + messages).min(device.limits.max_cqe))?;
            Ok::<_, VerbsError>(cq)
        })();
        let cq = match built {
            Ok(cq) => cq,
            Err(err) => {
                let _ = id.reject();
                return Err(err);
            }
        };
        let mut qp = QueuePair::create(id, &device.pd, &cq, caps)?;
        let slots =
            MessageSlots::new(&device.pd, messages as usize, REQUEST_SLOT_BYTES, Access::LocalWrite).and_then(|recv| {
                Ok((recv, MessageSlots::new(&device.pd, messages as usize, RESPONSE_SLOT_BYTES, Access::LocalRead)?))
            });
        let (recv, send) = match slots {
            Ok(slots) => slots,
            Err(err) => {
                let _ = qp.id().reject();
                return Err(err);
            }
        };
        for slot in 0..messages as usize {
            // SAFETY: the receive slots are registered for local write and
            // live until after the QP (field order in `Session`); nothing
            // touches a posted slot until its completion is polled.
            if let Err(err) = unsafe { qp.post_recv(WR_RECV | slot as u64, recv.sge(slot, REQUEST_SLOT_BYTES)) } {
                let _ = qp.id().reject();
                return Err(err);
            }
        }
        if let Err(err) = qp.id().set_ack_timeout(ACK_TIMEOUT_EXPONENT).and_then(|()| qp.id().accept()) {
            let _ = qp.id().reject();
            return Err(err);
        }
        let send_queue_free = qp.caps().send_wr;
        // Every batch's WRITEs must fit the send queue at once.
        let ranges_max = config.ranges_per_batch_max.min(send_queue_free.saturating_sub(SEND_QUEUE_SLACK).max(1));
        let session = Session::new(config.session_limits(ranges_max, credits), Instant::now());
        Ok(Self {
            qp,
            recv,
            in_flight: (0..messages).map(|_| None).collect(),
            free_send: (0..messages).rev().collect(),
            send,
            send_queue_free,
            batches_in_flight: 0,
            waiting: VecDeque::new(),
            device,
            resolver,
            config,
            client_id,
            placement,
            session,
            pre_auth: None,
            scratch: Vec::with_capacity(RESPONSE_SLOT_BYTES),
            sges: Vec::new(),
            writes: Vec::new(),
            statuses: Vec::new(),
            spare_requests: Vec::new(),
            spare_dests: Vec::with_capacity(credits as usize),
        })
    }

    /// This session holds `permit` of the pre-authentication pool until it
    /// opens a dataset.
    pub(super) fn before_authentication(mut self, permit: tokio::sync::OwnedSemaphorePermit) -> Self {
        self.pre_auth = Some(permit);
        self
    }

    pub(super) async fn run(mut self) {
        let outcome = self.serve().await;
        match outcome {
            Ok(()) => tracing::debug!(client = self.client_id, "RDMA client disconnected"),
            Err(fatal) => {
                tracing::info!(client = self.client_id, "closing RDMA connection: {fatal}");
                if !matches!(fatal, Fatal::Link(_)) {
                    self.farewell(&fatal).await;
                }
            }
        }
        self.release_slots().await;
        // Destroying the id of a connection whose peer is gone can block
        // for the CM's disconnect timeout (tens of seconds): off the async
        // threads, so other connections and their watchdogs keep running.
        tokio::task::spawn_blocking(move || {
            let started = Instant::now();
            let client = self.client_id;
            self.close();
            if started.elapsed() > CLOSE_SLOW {
                tracing::warn!(client, "tearing down an RDMA connection took {:?}", started.elapsed());
            }
        });
    }

    /// Gives back the DMA slots of every response before the teardown,
    /// which may block: those never posted at once, and those posted once
    /// the QP, moved to the error state, has flushed their SENDs (RC
    /// completes in order, so their WRITEs are done too). A peer that
    /// vanished with responses in flight once kept their slots while
    /// `close` waited on the CM (`hw-tests`' killed client: 16 slots for
    /// over 45 s). What does not flush within [`FLUSH_WAIT`] goes back
    /// when the QP is destroyed, as before.
    async fn release_slots(&mut self) {
        self.waiting.clear();
        if self.in_flight.iter().all(Option::is_none) {
            return;
        }
        if let Err(err) = self.qp.to_error() {
            tracing::warn!(client = self.client_id, "{err}; its responses' slots come back at the teardown");
            return;
        }
        self.await_sends(FLUSH_WAIT, false).await;
    }

    /// Disconnects and destroys the QP, returns the DMA slots of every
    /// response still in flight or waiting, then drops the rest, the cm id
    /// last. The slots go back as soon as the device can no longer read
    /// them, not after the id's destruction, which may block.
    fn close(mut self) {
        self.qp.destroy();
        self.in_flight.clear();
        self.waiting.clear();
    }

    /// Sends the reason a connection closes, and waits until the client
    /// has it: for a free send slot when every one is in flight, then for
    /// the SEND's completion (RC: the client acknowledged it). A lossy link
    /// may need the queue pair's every retry of a lost packet, so the wait
    /// lasts longer than those ([`FAREWELL_WAIT`]); a vanished client ends
    /// it sooner with a failed completion. A farewell cut short by a
    /// teardown left the client with only the disconnect, or, when that
    /// was lost too, its own response timeout 30 s later.
    async fn farewell(&mut self, fatal: &Fatal) {
        self.waiting.push_front(Outgoing::Control(control_frame(&fatal.farewell())));
        let unsent = self.waiting.len();
        let deadline = Instant::now() + FAREWELL_WAIT;
        loop {
            if self.flush().is_err() {
                return;
            }
            // The farewell is first in line: it went if the line shrank.
            let posted = self.waiting.len() < unsent;
            if !posted && self.in_flight.iter().all(Option::is_none) {
                // No completion to come would free room for it.
                tracing::debug!(client = self.client_id, "no room to send why the connection closes");
                return;
            }
            self.await_sends(deadline.saturating_duration_since(Instant::now()), true).await;
            if posted || Instant::now() >= deadline {
                return;
            }
        }
    }

    /// Polls the completion queue, outside the serve loop, until every
    /// posted response's SEND has completed or `within` has passed; each
    /// completed SEND frees its slot and the batch's DMA slots. With
    /// `stop_on_error`, a failed completion ends the wait (the QP is dead).
    async fn await_sends(&mut self, within: Duration, stop_on_error: bool) {
        let deadline = Instant::now() + within;
        let mut completions = Vec::new();
        while Instant::now() < deadline && self.in_flight.iter().any(Option::is_some) {
            completions.clear();
            if self.qp.cq().poll(&mut completions, 64).is_err()
                || (stop_on_error && completions.iter().any(|wc| !wc.is_ok()))
            {
                return;
            }
            for wc in &completions {
                if wc.wr_id & WR_TAG_MASK == WR_SEND {
                    self.send_completed(wc.wr_id as u32);
                }
            }
            if completions.is_empty() {
                sluice_dataplane::timer::sleep(Duration::from_millis(5)).await;
            }
        }
    }

    async fn serve(&mut self) -> Result<(), Fatal> {
        let cq = readiness(Arc::clone(self.qp.cq()), "registering the completion channel")?;
        let cm = readiness(Arc::clone(self.qp.id().channel()), "registering the rdma_cm channel")?;
        let mut revocations = self.resolver.revocations();
        let (queue, mut outcomes) = mpsc::unbounded_channel();
        let credits = self.session.limits().credits as usize;
        let mut batches =
            Batches { queue, reading: FxHashMap::with_capacity_and_hasher(credits, Default::default()), next_tag: 0 };
        let mut completions = Vec::with_capacity(64);
        // A response whose SEND never completes (a client that stopped
        // posting receives is cut off by the RNR limit; a wedged link is
        // not) must not hold its DMA slots for ever: as on TCP, the write
        // timeout ends the connection.
        let mut watchdog = sluice_dataplane::timer::interval(Duration::from_secs(1));
        loop {
            tokio::select! {
                ready = cq.readable() => {
                    // Clear, drain and re-arm, then poll: a completion after
                    // the re-arm raises a new event, one before it is polled.
                    ready.map_err(|source| VerbsError { op: "waiting for completions", source })?.clear_ready();
                    self.qp.cq().take_events()?;
                    loop {
                        completions.clear();
                        if self.qp.cq().poll(&mut completions, 64)? == 0 {
                            break;
                        }
                        for wc in completions.drain(..) {
                            self.completed(wc, &mut batches).await?;
                        }
                    }
                    self.flush()?;
                }
                ready = cm.readable() => {
                    ready.map_err(|source| VerbsError { op: "waiting for rdma_cm", source })?.clear_ready();
                    loop {
                        match self.qp.id().channel().next_event()? {
                            Some(event) if event.kind == CmEventKind::Disconnected => return Ok(()),
                            Some(event) if matches!(event.kind, CmEventKind::Failed(_)) => {
                                return Err(Fatal::Protocol(format!("connection failed: {}", event.kind)))
                            }
                            Some(event) => tracing::debug!(client = self.client_id, "rdma_cm event {}", event.kind),
                            None => break,
                        }
                    }
                }
                // `batches` holds a sender: the queue never ends here.
                Some(done) = outcomes.recv() => {
                    let Some(read) = batches.reading.remove(&done.tag) else {
                        tracing::warn!(client = self.client_id, tag = done.tag, "outcome of no batch of this connection");
                        continue;
                    };
                    tracing::trace!(client = self.client_id, batch = read.batch_id, "batch read");
                    let outcome = settle_outcome(done.outcome, &read.counters, read.submitted);
                    let Reading { batch_id, range_count, target, .. } = read;
                    self.waiting.push_back(Outgoing::Batch(Completed { batch_id, range_count, target, outcome }));
                    self.flush()?;
                }
                _ = watchdog.tick() => {
                    let deadline = self.session.deadline(self.batches_in_flight == 0);
                    if let Some((_, why)) = deadline.filter(|(at, _)| Instant::now() > *at) {
                        return Err(Fatal::Deadline(why));
                    }
                    let oldest = self.in_flight.iter().flatten().map(|f| f.posted).min();
                    if let Some(posted) = oldest.filter(|p| p.elapsed() > self.config.write_timeout) {
                        return Err(Fatal::Link(format!(
                            "a response posted {:?} ago has not completed (timeout {:?}): the client or the link is stuck",
                            posted.elapsed(),
                            self.config.write_timeout
                        )));
                    }
                }
                changed = revocations.changed() => {
                    if changed.is_err() {
                        // The control plane is gone; the node is stopping.
                        return Ok(());
                    }
                    if let Some(name) = self.session.revoked(|grant| self.resolver.grant_live(grant)) {
                        return Err(Fatal::Revoked(name.to_string()));
                    }
                }
            }
        }
    }

    /// Handles one work completion.
    async fn completed(&mut self, wc: WorkCompletion, batches: &mut Batches) -> Result<(), Fatal> {
        if !wc.is_ok() {
            let kind = match wc.wr_id & WR_TAG_MASK {
                WR_RECV => "receive",
                WR_SEND => "send",
                WR_WRITE => "RDMA write",
                _ => "work request",
            };
            return Err(Fatal::Link(format!("work request failed: {kind}: {}", wc.status_text())));
        }
        let slot = wc.wr_id as u32;
        match wc.wr_id & WR_TAG_MASK {
            WR_SEND => {
                self.send_completed(slot);
                Ok(())
            }
            WR_RECV => {
                let incoming = {
                    // SAFETY: the slot's receive completed and it is not
                    // reposted until after this copy is made.
                    let bytes = unsafe { self.recv.slot(slot as usize) };
                    let len = (wc.byte_len as usize).min(bytes.len());
                    decode(&bytes[..len], &mut self.spare_dests)
                };
                // SAFETY: as in `setup`; the slot's bytes were copied out.
                unsafe {
                    self.qp.post_recv(WR_RECV | u64::from(slot), self.recv.sge(slot as usize, REQUEST_SLOT_BYTES))
                }?;
                self.session.heard(Instant::now());
                self.handle(incoming?, batches).await
            }
            _ => Err(Fatal::Protocol(format!("completion for unknown work request {:#x}", wc.wr_id))),
        }
    }

    fn send_completed(&mut self, slot: u32) {
        let Some(Some(done)) = self.in_flight.get_mut(slot as usize).map(Option::take) else {
            tracing::warn!(client = self.client_id, "completion for idle send slot {slot}");
            return;
        };
        self.send_queue_free += done.work_requests;
        tracing::trace!(client = self.client_id, slot, free = self.send_queue_free, "send completed");
        if done.is_batch {
            self.batches_in_flight -= 1;
        }
        self.free_send.push(slot);
        // `done.batch` drops here: its DMA slots go back to the core.
    }

    async fn handle(&mut self, incoming: Incoming, batches: &mut Batches) -> Result<(), Fatal> {
        match incoming {
            Incoming::Control(message) => {
                if let Some(reply) = self.control(message).await? {
                    self.waiting.push_back(Outgoing::Control(control_frame(&reply)));
                }
            }
            Incoming::Batch { batch_id, handle, target, ranges, fits } => {
                tracing::trace!(client = self.client_id, batch = batch_id, ranges = ranges.len(), "batch requested");
                let admission = self.session.admit(handle, ranges.iter().map(|r| r.len_bytes), fits)?;
                // The receives are posted already: a client past its credits
                // broke the protocol, and nothing can make it wait.
                if self.batches_in_flight >= self.session.limits().credits {
                    return Err(Fatal::Protocol(format!(
                        "more than {} batches in flight",
                        self.session.limits().credits
                    )));
                }
                self.batches_in_flight += 1;
                let range_count = ranges.len() as u32;
                let (slot, flow, counters, through) = match admission {
                    Admission::Refused(status) => {
                        let completed = Completed { batch_id, range_count, target, outcome: Err(status) };
                        self.waiting.push_back(Outgoing::Batch(completed));
                        return Ok(());
                    }
                    Admission::Admitted { slot, flow, counters, read_through } => (slot, flow, counters, read_through),
                };
                batches.next_tag += 1;
                let tag = batches.next_tag;
                let read = Reading { batch_id, range_count, target, counters, submitted: Instant::now() };
                batches.reading.insert(tag, read);
                let batch = ReadBatch {
                    dataset: slot,
                    client_id: self.client_id,
                    flow,
                    ranges,
                    reply: Reply::queued(batches.queue.clone(), tag),
                    hold: None,
                };
                // A batch the data plane refuses drops its reply, which
                // answers `ShuttingDown` on the queue.
                let _ = crate::read_through::submit(&self.device.plane, Some(&self.placement), batch, through.as_ref())
                    .await;
            }
        }
        Ok(())
    }

    /// Answers a control message; `None` for those without a reply.
    async fn control(&mut self, message: ControlMessage) -> Result<Option<ControlMessage>, Fatal> {
        match self.session.control(message)? {
            ControlAction::Reply(reply) => Ok(Some(reply)),
            ControlAction::Silent => Ok(None),
            ControlAction::Resolve { name, token } => {
                let peer = Peer { addr: self.qp.id().peer_addr(), cert_name: None };
                let outcome = self.resolver.open(name.clone(), token, peer).await;
                // The flow's key is not the peer's address: the
                // sk_reuseport steering it feeds is for TCP listeners.
                let plane = &self.device.plane;
                let reply = self.session.opened(name, outcome, || plane.open_flow([0; 16]));
                if self.session.authenticated() {
                    // Authenticated: its place in the small pool goes.
                    self.pre_auth = None;
                }
                Ok(Some(reply))
            }
        }
    }

    /// Posts waiting responses in order while send slots and send-queue
    /// entries last; the rest wait for completions.
    fn flush(&mut self) -> Result<(), Fatal> {
        while let Some(next) = self.waiting.pop_front() {
            if let Err(next) = self.post(next)? {
                self.waiting.push_front(next);
                tracing::trace!(
                    client = self.client_id,
                    waiting = self.waiting.len(),
                    slots = self.free_send.len(),
                    free = self.send_queue_free,
                    "responses wait for room"
                );
                break;
            }
        }
        Ok(())
    }

    /// Posts one response; gives it back when there is no room yet.
    fn post(&mut self, outgoing: Outgoing) -> Result<Result<(), Outgoing>, Fatal> {
        let Some(&slot) = self.free_send.last() else { return Ok(Err(outgoing)) };
        self.sges.clear();
        self.writes.clear();
        match outgoing {
            Outgoing::Control(ref frame) => {
                if self.send_queue_free < 1 {
                    return Ok(Err(outgoing));
                }
                self.scratch.clear();
                self.scratch.extend_from_slice(frame);
            }
            Outgoing::Batch(ref completed) => {
                self.statuses.clear();
                let (status, written) = match &completed.outcome {
                    Ok(batch) => {
                        let per_write = self.qp.caps().send_sge.max(1) as usize;
                        let written =
                            gather(batch, &completed.target, per_write, &self.device, &mut self.sges, &mut self.writes);
                        self.statuses.extend(batch.statuses().iter().map(|s| *s as u8));
                        (BatchStatus::Ok, written)
                    }
                    Err(status) => {
                        self.statuses.resize(completed.range_count as usize, RangeStatus::IoError as u8);
                        (*status, Some(0))
                    }
                };
                let Some(written) = written else {
                    return Err(Fatal::Protocol("a batch's bytes lie outside the registered arenas".into()));
                };
                let needed = self.writes.len() as u32 + 1;
                if needed > self.qp.caps().send_wr {
                    tracing::warn!(client = self.client_id, "batch needs {needed} work requests; refusing it");
                    let Outgoing::Batch(completed) = outgoing else { unreachable!("matched above") };
                    let refused = Completed { outcome: Err(BatchStatus::TooLarge), ..completed };
                    return self.post(Outgoing::Batch(refused));
                }
                if needed > self.send_queue_free {
                    return Ok(Err(outgoing));
                }
                wire::encode_rdma_batch_response(
                    &mut self.scratch,
                    completed.batch_id,
                    status,
                    &self.statuses,
                    written,
                );
            }
        }
        assert!(self.scratch.len() <= RESPONSE_SLOT_BYTES, "response larger than its slot");
        self.free_send.pop();
        // SAFETY: the slot is free (taken off the free list), so no posted
        // SEND reads it.
        let bytes = unsafe { self.send.slot_mut(slot as usize) };
        bytes[..self.scratch.len()].copy_from_slice(&self.scratch);
        let message = [self.send.sge(slot as usize, self.scratch.len())];
        let (remote_addr, rkey) = match &outgoing {
            Outgoing::Batch(completed) => (completed.target.remote_addr, completed.target.rkey),
            Outgoing::Control(_) => (0, 0),
        };
        let mut requests = recycled(std::mem::take(&mut self.spare_requests));
        requests.extend(self.writes.iter().map(|&(first, count, dest)| SendWr {
            wr_id: WR_WRITE | u64::from(slot),
            op: SendOp::Write { remote_addr: remote_addr + dest, rkey },
            sges: &self.sges[first..first + count],
            signaled: false,
        }));
        requests.push(SendWr { wr_id: WR_SEND | u64::from(slot), op: SendOp::Send, sges: &message, signaled: true });
        let work_requests = requests.len() as u32;
        // The WRITEs read DMA slots of the batch's result, registered in
        // `Device::arenas` and kept in `in_flight` until this SEND completes
        // (RC completes in order) or the QP is destroyed; the SEND reads a
        // send slot that is ours until then. Remote addresses lie inside the
        // buffer the client named with its rkey (`destinations_fit`).
        // SAFETY: every SGE stays valid until completion; see above.
        let posted = unsafe { self.qp.post_send(&requests) };
        self.spare_requests = recycled(requests);
        posted?;
        self.send_queue_free -= work_requests;
        tracing::trace!(client = self.client_id, slot, work_requests, free = self.send_queue_free, "posted");
        let (is_batch, batch) = match outgoing {
            Outgoing::Batch(completed) => {
                if self.spare_dests.len() < self.session.limits().credits as usize {
                    self.spare_dests.push(completed.target.dests);
                }
                (true, completed.outcome.ok())
            }
            Outgoing::Control(_) => (false, None),
        };
        self.in_flight[slot as usize] =
            Some(InFlight { work_requests, is_batch, posted: Instant::now(), _batch: batch });
        Ok(Ok(()))
    }
}

/// The WRITEs of a batch's `Ok` ranges, at most `per_write` SGEs each; see
/// [`plan_writes`].
fn gather(
    batch: &BatchResult,
    target: &Target,
    per_write: usize,
    device: &Device,
    sges: &mut Vec<Sge>,
    writes: &mut Vec<(usize, usize, u64)>,
) -> Option<u64> {
    let ranges = (0..batch.statuses().len())
        .filter(|&index| batch.statuses()[index] == RangeStatus::Ok)
        .map(|index| (target.dests[index], batch.range_pieces(index)));
    plan_writes(ranges, per_write, |addr, len| device.lkey_of(addr, len), sges, writes)
}

/// `requests` emptied, with its allocation, for requests borrowing from
/// another response: collecting a vector's own iterator reuses its buffer
/// when the element layouts match, as they do here.
fn recycled<'b>(mut requests: Vec<SendWr<'_>>) -> Vec<SendWr<'b>> {
    requests.clear();
    requests.into_iter().map(|_| unreachable!("the vector is empty")).collect()
}

/// Decodes a received message into a request the node acts on.
/// A batch's destination list is one of `spare_dests` where there is one.
fn decode(bytes: &[u8], spare_dests: &mut Vec<Vec<u64>>) -> Result<Incoming, Fatal> {
    let (kind, payload) = parse_message(bytes, false)?;
    match kind {
        FrameKind::Control => Ok(Incoming::Control(codec::decode(payload)?)),
        FrameKind::RdmaBatchRequest => {
            let (header, descriptors) = wire::parse_rdma_batch_request(payload)?;
            let fits = wire::destinations_fit(header, descriptors);
            Ok(Incoming::Batch {
                batch_id: header.batch_id.get(),
                handle: header.handle.get(),
                target: Target {
                    remote_addr: header.remote_addr.get(),
                    rkey: header.rkey.get(),
                    dests: {
                        let mut dests = spare_dests.pop().unwrap_or_default();
                        dests.clear();
                        dests.extend(descriptors.iter().map(|d| d.dest.get()));
                        dests
                    },
                },
                ranges: {
                    // A vector the core kept from an earlier batch: this
                    // runs on the connection's core.
                    let mut ranges = spare_ranges();
                    ranges.extend(
                        descriptors.iter().map(|d| ByteRange { offset_bytes: d.offset.get(), len_bytes: d.len.get() }),
                    );
                    ranges
                },
                fits,
            })
        }
        other => Err(Fatal::unexpected_frame(other, FrameKind::RdmaBatchRequest)),
    }
}
