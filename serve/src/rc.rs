//! Node side of the RDMA transport: a listener on rdma_cm, and one task per
//! connection that owns its queue pair (no locks on the I/O path).

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::stream::{FuturesUnordered, StreamExt};
use sluice_dataplane::{BatchResult, ByteRange, DataPlane, DatasetSlot, FlowLease, ReadBatch};
use sluice_proto::RangeStatus;
use tokio::sync::{oneshot, watch, Semaphore};

use crate::metrics::{settle, DatasetCounters};
use crate::tcp::{DatasetResolver, Opened, ServerConfig};
use sluice_proto::codec::{self, ControlMessage, ErrorCode};
use sluice_proto::wire::{self, BatchStatus, FrameKind};
use sluice_transport::frame::control_frame;
use sluice_transport::rc::{
    parse_message, readiness, CONTROL_MESSAGES_MAX, RDMA_CREDITS_MAX, REQUEST_SLOT_BYTES, RESPONSE_SLOT_BYTES,
};
use sluice_transport::rc::{ACK_TIMEOUT_EXPONENT, WR_RECV, WR_SEND, WR_TAG_MASK, WR_WRITE};
use sluice_transport::verbs::{
    Access, CmEventKind, CmId, CompletionQueue, DeviceLimits, EventChannel, MemoryRegion, MessageSlots,
    ProtectionDomain, QueueCaps, QueuePair, SendOp, SendWr, Sge, VerbsError, WorkCompletion,
};

/// Most datasets one connection holds open.
const HANDLES_PER_CONNECTION_MAX: usize = 1024;
const PROTOCOL: u32 = 1;
/// Send-queue entries per connection, if the device allows that many. It
/// also paces a connection: at most this many WRITEs are in flight, the
/// next batch's wait for room.
const SEND_QUEUE_DEPTH: u32 = 1024;
/// Send-queue entries a batch may need beyond one per range: ranges that
/// span more DMA pieces than a WRITE takes SGEs (the 8 MiB footprint bound
/// keeps them few), and its SEND.
const SEND_QUEUE_SLACK: u32 = 128;
/// Scatter-gather entries per RDMA WRITE, if the device allows that many.
const SEND_SGE_MAX: u32 = 16;

/// The device side shared by every connection: one protection domain and
/// the data plane's arenas registered in it once.
struct Device {
    // Deregistered (dropped) before the plane that maps the arenas.
    arenas: Vec<MemoryRegion>,
    pd: ProtectionDomain,
    plane: Arc<DataPlane>,
    limits: DeviceLimits,
    name: String,
}

impl Device {
    /// The local key of the arena holding `[addr, addr + len)`.
    fn lkey_of(&self, addr: u64, len: u64) -> Option<u32> {
        self.arenas.iter().find(|mr| mr.contains(addr, len)).map(MemoryRegion::lkey)
    }
}

/// Accepts RDMA connections on one address of one RDMA device.
pub struct RdmaListener {
    // The id before its channel: destroyed first.
    _id: CmId,
    channel: Arc<EventChannel>,
    device: Arc<Device>,
    local_addr: SocketAddr,
}

#[derive(Debug, thiserror::Error)]
pub enum ListenError {
    #[error("{0}")]
    Verbs(#[from] VerbsError),
    #[error("{0} is not an address of an RDMA device (bind the RDMA listener to the device's own IP)")]
    NoDevice(SocketAddr),
}

impl RdmaListener {
    /// Binds and listens on `addr`, which must be an IP of an RDMA device,
    /// and registers the data plane's arenas with that device (local access
    /// only: the node never exposes its memory to peers).
    pub fn bind(addr: SocketAddr, plane: Arc<DataPlane>) -> Result<Self, ListenError> {
        let channel = EventChannel::new()?;
        let id = CmId::new(&channel)?;
        id.bind(addr)?;
        if !id.has_device() {
            return Err(ListenError::NoDevice(addr));
        }
        id.listen(128)?;
        let pd = ProtectionDomain::new(&id)?;
        let mut arenas = Vec::with_capacity(plane.dma_regions().len());
        for region in plane.dma_regions() {
            // The arenas stay mapped as long as the data plane, which `Device`
            // holds after these regions (so dropped later); the device only
            // reads them, as the sources of RDMA WRITEs of completed batches.
            // SAFETY: mapped for the regions' lifetime, read-only to the NIC.
            arenas.push(unsafe { pd.register(region.base as *mut u8, region.len_bytes, Access::LocalRead) }?);
        }
        let device = Device { arenas, pd, plane, limits: id.device_limits()?, name: id.device_name() };
        Ok(Self { _id: id, channel, device: Arc::new(device), local_addr: addr })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    pub fn device_name(&self) -> &str {
        &self.device.name
    }

    /// Accepts connections until `shutdown` turns true.
    pub async fn serve<R: DatasetResolver>(
        self,
        resolver: Arc<R>,
        config: ServerConfig,
        mut shutdown: watch::Receiver<bool>,
    ) -> Result<(), VerbsError> {
        let events = readiness(Arc::clone(&self.channel), "registering the rdma_cm channel")?;
        let slots = Arc::new(Semaphore::new(config.connections_max.max(1)));
        // Connections that have not yet opened a dataset hold a queue pair
        // and message slots: only this many at once.
        let unauthenticated = Arc::new(Semaphore::new(PRE_AUTH_SESSIONS_MAX));
        let mut next_client_id = 1u32 << 31;
        loop {
            tokio::select! {
                ready = events.readable() => {
                    // Readiness is cleared before draining, so an event that
                    // lands after the drain wakes this loop again.
                    ready.map_err(|source| VerbsError { op: "waiting for rdma_cm", source })?.clear_ready();
                    loop {
                        let event = match self.channel.next_event() {
                            Ok(Some(event)) => event,
                            Ok(None) => break,
                            Err(err) => { tracing::warn!("rdma_cm: {err}"); break; }
                        };
                        let Some(id) = event.new_id else {
                            tracing::debug!("rdma listener event {}", event.kind);
                            continue;
                        };
                        let Ok(slot) = Arc::clone(&slots).try_acquire_owned() else {
                            tracing::warn!("refusing an RDMA connection: {} are open", config.connections_max);
                            let _ = id.reject();
                            continue;
                        };
                        let Ok(pre_auth) = Arc::clone(&unauthenticated).try_acquire_owned() else {
                            tracing::warn!("refusing an RDMA connection: {PRE_AUTH_SESSIONS_MAX} have not opened a dataset yet");
                            let _ = id.reject();
                            continue;
                        };
                        next_client_id = next_client_id.wrapping_add(1) | (1 << 31);
                        let session = Session::setup(id, Arc::clone(&self.device), Arc::clone(&resolver), config.clone(), next_client_id)
                            .map(|session| session.before_authentication(pre_auth));
                        tokio::spawn(async move {
                            match session {
                                Ok(session) => session.run().await,
                                Err(err) => tracing::warn!("setting up an RDMA connection: {err}"),
                            }
                            drop(slot);
                        });
                    }
                }
                _ = shutdown.changed() => return Ok(()),
            }
        }
    }
}

/// Why a connection is closed by the node.
#[derive(Debug, thiserror::Error)]
enum Fatal {
    #[error("{0}")]
    Frame(#[from] wire::FrameError),
    #[error("{0}")]
    Codec(#[from] codec::CodecError),
    #[error("protocol: {0}")]
    Protocol(String),
    #[error("{0}")]
    Verbs(#[from] VerbsError),
    #[error("work request failed: {0}")]
    Completion(String),
    #[error("the grant this session opened {0} under was revoked")]
    Revoked(String),
}

impl Fatal {
    fn code(&self) -> ErrorCode {
        match self {
            Self::Frame(wire::FrameError::Oversized { .. }) => ErrorCode::OversizedFrame,
            Self::Frame(_) | Self::Codec(_) => ErrorCode::MalformedFrame,
            Self::Protocol(_) | Self::Verbs(_) | Self::Completion(_) => ErrorCode::Protocol,
            Self::Revoked(_) => ErrorCode::AccessDenied,
        }
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

type Reading = Pin<Box<dyn Future<Output = Completed> + Send>>;

/// One client connection. Owns its queue pair; declared first, it is
/// destroyed before the slots it posts from and the batches it writes from.
struct Session<R> {
    qp: QueuePair,
    recv: MessageSlots,
    send: MessageSlots,
    in_flight: Vec<Option<InFlight>>,
    free_send: Vec<u32>,
    send_queue_free: u32,
    batches_in_flight: u32,
    credits: u32,
    waiting: VecDeque<Outgoing>,
    device: Arc<Device>,
    resolver: Arc<R>,
    config: ServerConfig,
    client_id: u32,
    handles: HashMap<u32, (DatasetSlot, Arc<DatasetCounters>, FlowLease)>,
    next_handle: u32,
    greeted: bool,
    /// Held until the first dataset opens: the place in the small pool of
    /// connections that have not authenticated.
    pre_auth: Option<tokio::sync::OwnedSemaphorePermit>,
    /// When the connection was set up, for the handshake deadline.
    started: Instant,
    granted: Vec<(u64, String)>,
    scratch: Vec<u8>,
}

/// RDMA connections set up (queue pair, registered message slots) that
/// have not yet opened a dataset; more are rejected until one does or is
/// closed at the handshake deadline.
const PRE_AUTH_SESSIONS_MAX: usize = 32;

impl<R: DatasetResolver> Session<R> {
    /// Creates the queue pair and message slots, posts every receive, and
    /// accepts. On failure the request is rejected.
    fn setup(
        id: CmId,
        device: Arc<Device>,
        resolver: Arc<R>,
        config: ServerConfig,
        client_id: u32,
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
        Ok(Self {
            qp,
            recv,
            in_flight: (0..messages).map(|_| None).collect(),
            free_send: (0..messages).rev().collect(),
            send,
            send_queue_free,
            batches_in_flight: 0,
            credits,
            waiting: VecDeque::new(),
            device,
            resolver,
            config,
            client_id,
            handles: HashMap::new(),
            next_handle: 1,
            greeted: false,
            pre_auth: None,
            started: Instant::now(),
            granted: Vec::new(),
            scratch: Vec::with_capacity(RESPONSE_SLOT_BYTES),
        })
    }

    /// The most ranges a batch may have on this connection, as announced at
    /// Hello: every batch's WRITEs must fit the send queue at once.
    fn ranges_per_batch_max(&self) -> u32 {
        self.config.ranges_per_batch_max.min(self.qp.caps().send_wr.saturating_sub(SEND_QUEUE_SLACK).max(1))
    }

    /// This session holds `permit` of the pre-authentication pool until it
    /// opens a dataset.
    fn before_authentication(mut self, permit: tokio::sync::OwnedSemaphorePermit) -> Self {
        self.pre_auth = Some(permit);
        self
    }

    async fn run(mut self) {
        let outcome = self.serve().await;
        match outcome {
            Ok(()) => tracing::debug!(client = self.client_id, "RDMA client disconnected"),
            Err(fatal) => {
                tracing::info!(client = self.client_id, "closing RDMA connection: {fatal}");
                if !matches!(fatal, Fatal::Completion(_)) {
                    self.farewell(&fatal).await;
                }
            }
        }
        // Dropping `self` disconnects and destroys the QP, then returns the
        // DMA slots of every batch still in flight. Destroying the id of a
        // connection whose peer is gone can block for the CM's disconnect
        // timeout (tens of seconds): off the async threads, so other
        // connections and their watchdogs keep running.
        tokio::task::spawn_blocking(move || drop(self));
    }

    /// Sends the reason a connection closes, and waits briefly for it to go.
    async fn farewell(&mut self, fatal: &Fatal) {
        let message = ControlMessage::Error { code: fatal.code(), message: fatal.to_string() };
        self.waiting.push_front(Outgoing::Control(control_frame(&message)));
        if self.flush().is_err() {
            return;
        }
        let deadline = Instant::now() + Duration::from_secs(1);
        let mut completions = Vec::new();
        while Instant::now() < deadline && self.free_send.len() < self.in_flight.len() {
            completions.clear();
            if self.qp.cq().poll(&mut completions, 64).is_err() || completions.iter().any(|wc| !wc.is_ok()) {
                return;
            }
            for wc in &completions {
                if wc.wr_id & WR_TAG_MASK == WR_SEND {
                    self.send_completed(wc.wr_id as u32);
                }
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    async fn serve(&mut self) -> Result<(), Fatal> {
        let cq = readiness(Arc::clone(self.qp.cq()), "registering the completion channel")?;
        let cm = readiness(Arc::clone(self.qp.id().channel()), "registering the rdma_cm channel")?;
        let mut revocations = self.resolver.revocations();
        let mut reading: FuturesUnordered<Reading> = FuturesUnordered::new();
        let mut completions = Vec::with_capacity(64);
        // A response whose SEND never completes (a client that stopped
        // posting receives is cut off by the RNR limit; a wedged link is
        // not) must not hold its DMA slots for ever: as on TCP, the write
        // timeout ends the connection.
        let mut watchdog = tokio::time::interval(Duration::from_secs(1));
        watchdog.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
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
                            self.completed(wc, &mut reading).await?;
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
                Some(done) = reading.next(), if !reading.is_empty() => {
                    tracing::trace!(client = self.client_id, batch = done.batch_id, "batch read");
                    self.waiting.push_back(Outgoing::Batch(done));
                    self.flush()?;
                }
                _ = watchdog.tick() => {
                    if self.pre_auth.is_some() && self.started.elapsed() > self.config.handshake_timeout {
                        return Err(Fatal::Protocol(
                            "no Hello and Open within the handshake deadline".into(),
                        ));
                    }
                    let oldest = self.in_flight.iter().flatten().map(|f| f.posted).min();
                    if let Some(posted) = oldest.filter(|p| p.elapsed() > self.config.write_timeout) {
                        return Err(Fatal::Completion(format!(
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
                    if let Some((_, name)) = self.granted.iter().find(|(grant, _)| !self.resolver.grant_live(*grant)) {
                        return Err(Fatal::Revoked(name.clone()));
                    }
                }
            }
        }
    }

    /// Handles one work completion.
    async fn completed(&mut self, wc: WorkCompletion, reading: &mut FuturesUnordered<Reading>) -> Result<(), Fatal> {
        if !wc.is_ok() {
            let kind = match wc.wr_id & WR_TAG_MASK {
                WR_RECV => "receive",
                WR_SEND => "send",
                WR_WRITE => "RDMA write",
                _ => "work request",
            };
            return Err(Fatal::Completion(format!("{kind}: {}", wc.status_text())));
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
                    decode(&bytes[..len])
                };
                // SAFETY: as in `setup`; the slot's bytes were copied out.
                unsafe {
                    self.qp.post_recv(WR_RECV | u64::from(slot), self.recv.sge(slot as usize, REQUEST_SLOT_BYTES))
                }?;
                self.handle(incoming?, reading).await
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

    async fn handle(&mut self, incoming: Incoming, reading: &mut FuturesUnordered<Reading>) -> Result<(), Fatal> {
        match incoming {
            Incoming::Control(message) => {
                if let Some(reply) = self.control(message).await? {
                    self.waiting.push_back(Outgoing::Control(control_frame(&reply)));
                }
            }
            Incoming::Batch { batch_id, handle, target, ranges, fits } => {
                tracing::trace!(client = self.client_id, batch = batch_id, ranges = ranges.len(), "batch requested");
                if !self.greeted {
                    return Err(Fatal::Protocol("the first message must be Hello".into()));
                }
                if self.batches_in_flight >= self.credits {
                    return Err(Fatal::Protocol(format!("more than {} batches in flight", self.credits)));
                }
                self.batches_in_flight += 1;
                let range_count = ranges.len() as u32;
                // The limits announced at Hello hold: a batch over them
                // costs the core nothing.
                let lens = ranges.iter().map(|r| r.len_bytes);
                let too_large = !sluice_proto::geometry::batch_fits(
                    lens,
                    self.ranges_per_batch_max(),
                    self.config.batch_footprint_max_bytes,
                );
                let refused = match self.handles.get(&handle) {
                    None => Some(BatchStatus::UnknownHandle),
                    Some((_, counters, _)) if too_large => {
                        counters.record_failed_batch();
                        Some(BatchStatus::TooLarge)
                    }
                    Some((_, counters, _)) if !fits => {
                        counters.record_failed_batch();
                        Some(BatchStatus::BadDestination)
                    }
                    Some(_) => None,
                };
                let (Some((slot, counters, flow)), None) = (self.handles.get(&handle), refused) else {
                    let status = refused.unwrap_or(BatchStatus::UnknownHandle);
                    let completed = Completed { batch_id, range_count, target, outcome: Err(status) };
                    self.waiting.push_back(Outgoing::Batch(completed));
                    return Ok(());
                };
                let counters = Arc::clone(counters);
                let (reply, result) = oneshot::channel();
                let batch = ReadBatch { dataset: *slot, client_id: self.client_id, flow: flow.flow(), ranges, reply };
                if self.device.plane.submit(batch).await.is_err() {
                    counters.record_failed_batch();
                    let completed =
                        Completed { batch_id, range_count, target, outcome: Err(BatchStatus::ShuttingDown) };
                    self.waiting.push_back(Outgoing::Batch(completed));
                    return Ok(());
                }
                let submitted = Instant::now();
                reading.push(Box::pin(async move {
                    let outcome = settle(result, &counters, submitted).await;
                    Completed { batch_id, range_count, target, outcome }
                }));
            }
        }
        Ok(())
    }

    /// Answers a control message; `None` for those without a reply.
    async fn control(&mut self, message: ControlMessage) -> Result<Option<ControlMessage>, Fatal> {
        let reply = match message {
            ControlMessage::Hello { protocol, .. } if protocol == PROTOCOL => {
                self.greeted = true;
                ControlMessage::HelloOk {
                    node: self.config.node_name.clone(),
                    ranges_per_batch_max: self.ranges_per_batch_max(),
                    batch_footprint_max_bytes: self.config.batch_footprint_max_bytes,
                    credits: self.credits,
                }
            }
            ControlMessage::Hello { protocol, .. } => {
                return Err(Fatal::Protocol(format!("client protocol {protocol}, node speaks {PROTOCOL}")))
            }
            _ if !self.greeted => return Err(Fatal::Protocol("the first message must be Hello".into())),
            ControlMessage::Open { name, token } => {
                if self.handles.len() >= HANDLES_PER_CONNECTION_MAX {
                    ControlMessage::Error {
                        code: ErrorCode::Protocol,
                        message: format!("more than {HANDLES_PER_CONNECTION_MAX} datasets open"),
                    }
                } else {
                    match self
                        .resolver
                        .open(name.clone(), token.map(sluice_proto::codec::Secret::into_inner), None)
                        .await
                    {
                        Ok(Opened { slot, info, grant, counters }) => {
                            let handle = self.next_handle;
                            self.next_handle = self.next_handle.wrapping_add(1).max(1);
                            // The peer's address is not taken from the CM id: the
                            // sk_reuseport steering it feeds is for TCP listeners.
                            let flow = self.device.plane.open_flow([0; 16]);
                            self.handles.insert(handle, (slot, counters, flow));
                            if let Some(grant) = grant {
                                if !self.granted.iter().any(|(g, _)| *g == grant) {
                                    self.granted.push((grant, name));
                                }
                            }
                            // Authenticated: its place in the small pool goes.
                            self.pre_auth = None;
                            ControlMessage::Opened { handle, info }
                        }
                        Err(err) => ControlMessage::Error { code: err.code, message: err.message },
                    }
                }
            }
            ControlMessage::Close { handle } => {
                self.handles.remove(&handle);
                return Ok(None);
            }
            other => return Err(Fatal::Protocol(format!("unexpected message {other:?}"))),
        };
        Ok(Some(reply))
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
        let mut sges = Vec::new();
        let mut writes: Vec<(usize, usize, u64)> = Vec::new();
        match outgoing {
            Outgoing::Control(ref frame) => {
                if self.send_queue_free < 1 {
                    return Ok(Err(outgoing));
                }
                self.scratch.clear();
                self.scratch.extend_from_slice(frame);
            }
            Outgoing::Batch(ref completed) => {
                let (status, statuses, written) = match &completed.outcome {
                    Ok(batch) => {
                        let written = self.gather(batch, &completed.target, &mut sges, &mut writes);
                        (BatchStatus::Ok, batch.statuses().iter().map(|s| *s as u8).collect(), written)
                    }
                    Err(status) => (*status, vec![RangeStatus::IoError as u8; completed.range_count as usize], Some(0)),
                };
                let Some(written) = written else {
                    return Err(Fatal::Protocol("a batch's bytes lie outside the registered arenas".into()));
                };
                let needed = writes.len() as u32 + 1;
                if needed > self.qp.caps().send_wr {
                    tracing::warn!(client = self.client_id, "batch needs {needed} work requests; refusing it");
                    let Outgoing::Batch(completed) = outgoing else { unreachable!("matched above") };
                    let refused = Completed { outcome: Err(BatchStatus::TooLarge), ..completed };
                    return self.post(Outgoing::Batch(refused));
                }
                if needed > self.send_queue_free {
                    return Ok(Err(outgoing));
                }
                wire::encode_rdma_batch_response(&mut self.scratch, completed.batch_id, status, &statuses, written);
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
        let mut requests: Vec<SendWr<'_>> = writes
            .iter()
            .map(|&(first, count, dest)| SendWr {
                wr_id: WR_WRITE | u64::from(slot),
                op: SendOp::Write { remote_addr: remote_addr + dest, rkey },
                sges: &sges[first..first + count],
                signaled: false,
            })
            .collect();
        requests.push(SendWr { wr_id: WR_SEND | u64::from(slot), op: SendOp::Send, sges: &message, signaled: true });
        let work_requests = requests.len() as u32;
        // The WRITEs read DMA slots of the batch's result, registered in
        // `Device::arenas` and kept in `in_flight` until this SEND completes
        // (RC completes in order) or the QP is destroyed; the SEND reads a
        // send slot that is ours until then. Remote addresses lie inside the
        // buffer the client named with its rkey (`destinations_fit`).
        // SAFETY: every SGE stays valid until completion; see above.
        unsafe { self.qp.post_send(&requests) }?;
        self.send_queue_free -= work_requests;
        tracing::trace!(client = self.client_id, slot, work_requests, free = self.send_queue_free, "posted");
        let (is_batch, batch) = match outgoing {
            Outgoing::Batch(completed) => (true, completed.outcome.ok()),
            Outgoing::Control(_) => (false, None),
        };
        self.in_flight[slot as usize] =
            Some(InFlight { work_requests, is_batch, posted: Instant::now(), _batch: batch });
        Ok(Ok(()))
    }

    /// The WRITEs of a batch's `Ok` ranges; see [`plan_writes`].
    fn gather(
        &self,
        batch: &BatchResult,
        target: &Target,
        sges: &mut Vec<Sge>,
        writes: &mut Vec<(usize, usize, u64)>,
    ) -> Option<u64> {
        let ranges = (0..batch.statuses().len())
            .filter(|&index| batch.statuses()[index] == RangeStatus::Ok)
            .map(|index| (target.dests[index], batch.range_pieces(index)));
        let per_write = self.qp.caps().send_sge.max(1) as usize;
        plan_writes(ranges, per_write, |addr, len| self.device.lkey_of(addr, len), sges, writes)
    }
}

/// Lists the SGEs of each range's pieces and groups them into WRITEs
/// `(first SGE, count, offset in the client's buffer)` of at most
/// `per_write` SGEs, each landing where the last one ended. Returns the
/// bytes written, or `None` if a piece lies outside every registered arena.
fn plan_writes<'a>(
    ranges: impl Iterator<Item = (u64, impl Iterator<Item = &'a [u8]>)>,
    per_write: usize,
    lkey_of: impl Fn(u64, u64) -> Option<u32>,
    sges: &mut Vec<Sge>,
    writes: &mut Vec<(usize, usize, u64)>,
) -> Option<u64> {
    assert!(per_write > 0, "a WRITE takes at least one SGE");
    let mut written = 0u64;
    for (mut dest, pieces) in ranges {
        let mut first = sges.len();
        let mut first_dest = dest;
        for piece in pieces.filter(|p| !p.is_empty()) {
            if sges.len() - first == per_write {
                writes.push((first, per_write, first_dest));
                first = sges.len();
                first_dest = dest;
            }
            let (addr, len) = (piece.as_ptr() as u64, piece.len() as u64);
            sges.push(Sge { addr, len: piece.len() as u32, lkey: lkey_of(addr, len)? });
            dest += len;
            written += len;
        }
        if sges.len() > first {
            writes.push((first, sges.len() - first, first_dest));
        }
    }
    Some(written)
}

/// Decodes a received message into a request the node acts on.
fn decode(bytes: &[u8]) -> Result<Incoming, Fatal> {
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
                    dests: descriptors.iter().map(|d| d.dest.get()).collect(),
                },
                ranges: descriptors
                    .iter()
                    .map(|d| ByteRange { offset_bytes: d.offset.get(), len_bytes: d.len.get() })
                    .collect(),
                fits,
            })
        }
        FrameKind::BatchRequest => Err(Fatal::Protocol("TCP batch on an RDMA connection".into())),
        FrameKind::BatchResponse | FrameKind::RdmaBatchResponse => {
            Err(Fatal::Protocol("clients do not send responses".into()))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Pieces become SGEs in order; a range's pieces share WRITEs of at
    /// most `per_write` SGEs, each WRITE landing where the previous ended;
    /// empty pieces are skipped; memory outside the arenas is refused.
    #[test]
    fn writes_group_pieces_and_land_contiguously() {
        let arena = vec![7u8; 1000];
        let pieces: [&[u8]; 5] =
            [&arena[0..100], &arena[200..250], &arena[300..300], &arena[400..410], &arena[500..501]];
        let base = arena.as_ptr() as u64;
        let inside = |addr: u64, len: u64| (addr >= base && addr + len <= base + 1000).then_some(42);
        let (mut sges, mut writes) = (Vec::new(), Vec::new());
        let second: Vec<&[u8]> = vec![&arena[600..700]];
        let ranges = vec![(5000u64, pieces.iter().copied()), (9000u64, second.iter().copied())];
        let written = plan_writes(ranges.into_iter(), 2, inside, &mut sges, &mut writes);
        assert_eq!(written, Some(100 + 50 + 10 + 1 + 100));
        assert_eq!(sges.len(), 5, "the empty piece has no SGE");
        assert!(sges.iter().all(|s| s.lkey == 42));
        assert_eq!(writes, vec![(0, 2, 5000), (2, 2, 5150), (4, 1, 9000)]);
        assert_eq!((sges[2].len, sges[3].len), (10, 1));

        let outside = [0u8; 8];
        let stray = vec![(0u64, [&outside[..]].into_iter())];
        assert_eq!(plan_writes(stray.into_iter(), 2, inside, &mut Vec::new(), &mut Vec::new()), None);
    }
}
