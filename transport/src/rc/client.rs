//! Training-host side of the RDMA transport: one driver task owns the
//! queue pair; callers hand it requests and wait for their replies.

use std::collections::{HashMap, VecDeque};
use std::mem::ManuallyDrop;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sluice_proto::RangeStatus;
use tokio::io::unix::AsyncFd;
use tokio::sync::{mpsc, oneshot, Semaphore};
use zerocopy::FromBytes;

use super::{
    parse_message, readiness, CONTROL_MESSAGES_MAX, RDMA_CREDITS_MAX, REQUEST_SLOT_BYTES, RESPONSE_SLOT_BYTES,
};
use super::{ACK_TIMEOUT_EXPONENT, RESOLVE_TIMEOUT_MS, WR_RECV, WR_SEND, WR_TAG_MASK};
use crate::frame::control_frame;
use crate::poll::{polling, PollWindow};
use crate::session::{self, open_request, opened, NodeLimits};
use crate::tcp::TransportError;
use crate::verbs::{
    Access, CmEventKind, CmId, CompletionQueue, EventChannel, MemoryRegion, MessageSlots, ProtectionDomain, QueueCaps,
    QueuePair, SendOp, SendWr, VerbsError,
};
use sluice_proto::codec::{self, ControlMessage, ErrorCode, OpenInfo};
use sluice_proto::wire::le::{U32, U64};
use sluice_proto::wire::{self, BatchResponseHeader, FrameKind, RangeDescriptor, RdmaBatchRequestHeader};

/// How long connection setup may take once the route is known.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(15);
/// A batch unanswered this long means the node or the link is stuck: the
/// connection is given up (the node ends it after its own write timeout).
const RESPONSE_TIMEOUT: Duration = Duration::from_secs(30);

fn rdma(err: VerbsError) -> TransportError {
    TransportError::Rdma(err.to_string())
}

/// Memory the node may RDMA-WRITE into: a `Vec` registered with the
/// connection's device for remote write. Registration pins it, so it is
/// made once per buffer, not per read. Its bytes are reachable only while
/// it is owned; for reads it is [`shared`](Self::shared) into an opaque
/// [`InFlightBuffer`] and reclaimed after.
pub struct RegisteredBuffer {
    /// Dropped by hand, before the memory.
    region: ManuallyDrop<MemoryRegion>,
    bytes: ManuallyDrop<Vec<u8>>,
}

impl RegisteredBuffer {
    /// Registers `bytes` with `client`'s device; on failure the bytes
    /// come back with the error.
    pub fn new(client: &RdmaClient, mut bytes: Vec<u8>) -> Result<Self, (TransportError, Vec<u8>)> {
        if bytes.capacity() == 0 {
            bytes.reserve(1);
        }
        // SAFETY: the Vec is owned by the result and never reallocated (no
        // method grows it); its bytes are reachable only while the buffer is
        // owned, never while shared with reads (`InFlightBuffer` is opaque).
        let region = unsafe { client.pd.register(bytes.as_mut_ptr(), bytes.capacity(), Access::RemoteWrite) };
        match region {
            Ok(region) => Ok(Self { region: ManuallyDrop::new(region), bytes: ManuallyDrop::new(bytes) }),
            Err(err) => Err((rdma(err), bytes)),
        }
    }

    /// Whether the buffer is registered with `client`'s connection (a
    /// buffer's key means nothing to another).
    pub fn belongs_to(&self, client: &RdmaClient) -> bool {
        self.region.is_in(&client.pd)
    }

    pub fn len(&self) -> usize {
        self.bytes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }

    pub fn as_slice(&self) -> &[u8] {
        &self.bytes
    }

    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        &mut self.bytes
    }

    /// Hands the buffer to reads; no byte is reachable until it is
    /// reclaimed.
    pub fn shared(self) -> InFlightBuffer {
        InFlightBuffer(Arc::new(self))
    }

    /// Deregisters the buffer and gives its bytes back.
    pub fn into_vec(mut self) -> Vec<u8> {
        // SAFETY: taken once; `self` is forgotten right after, so Drop does
        // not take them again.
        let (region, bytes) = unsafe { (ManuallyDrop::take(&mut self.region), ManuallyDrop::take(&mut self.bytes)) };
        std::mem::forget(self);
        drop(region);
        bytes
    }
}

impl Drop for RegisteredBuffer {
    fn drop(&mut self) {
        // SAFETY: each dropped once, the registration before the memory.
        unsafe {
            ManuallyDrop::drop(&mut self.region);
            ManuallyDrop::drop(&mut self.bytes);
        }
    }
}

/// A registered buffer that reads may be writing. Opaque: the bytes come
/// back with [`reclaim`](Self::reclaim) once no read holds it.
pub struct InFlightBuffer(Arc<RegisteredBuffer>);

impl InFlightBuffer {
    /// The buffer, unless a read (one whose caller stopped waiting, with
    /// the node still writing) holds it.
    pub fn reclaim(self) -> Result<RegisteredBuffer, Self> {
        Arc::try_unwrap(self.0).map_err(Self)
    }
}

enum Command {
    Control { frame: Vec<u8>, reply: Option<oneshot::Sender<ControlMessage>> },
    Batch { frame: Vec<u8>, batch_id: u64, pending: Pending },
}

struct Pending {
    range_count: u32,
    asked: std::time::Instant,
    /// Kept until the reply (or teardown): the node writes into it.
    target: InFlightBuffer,
    done: oneshot::Sender<Result<Vec<RangeStatus>, TransportError>>,
}

impl Pending {
    /// Lets go of the buffer, then wakes the caller, who may reclaim it.
    fn finish(self, result: Result<Vec<RangeStatus>, TransportError>) {
        let Self { target, done, .. } = self;
        drop(target);
        let _ = done.send(result);
    }
}

/// One RDMA connection to a node's data plane.
pub struct RdmaClient {
    commands: mpsc::Sender<Command>,
    control: tokio::sync::Mutex<()>,
    credits: Arc<Semaphore>,
    limits: NodeLimits,
    pd: ProtectionDomain,
    next_batch_id: AtomicU64,
    lost: Arc<Mutex<Option<String>>>,
    device: String,
    driver: tokio::task::JoinHandle<()>,
}

/// Waits for the event `want` on a connecting id's channel.
async fn expect(
    events: &AsyncFd<Arc<EventChannel>>,
    want: CmEventKind,
    addr: SocketAddr,
) -> Result<(), TransportError> {
    loop {
        match events.get_ref().next_event().map_err(rdma)? {
            Some(event) if event.kind == want => return Ok(()),
            Some(event) if event.kind == CmEventKind::Rejected => {
                return Err(TransportError::Refused {
                    code: ErrorCode::Busy,
                    message: format!("{addr} rejected the RDMA connection (status {})", event.status),
                })
            }
            Some(event) => {
                return Err(TransportError::Rdma(format!(
                    "connecting to {addr}: {} (status {})",
                    event.kind, event.status
                )))
            }
            // Cleared before the next read: an event after it wakes us.
            None => events.readable().await.map_err(TransportError::Io)?.clear_ready(),
        }
    }
}

impl RdmaClient {
    /// Connects to a node's RDMA endpoint and shakes hands. The connection
    /// polls its completion queue for `poll_window` after each completion
    /// before its thread may sleep (see [`crate::poll`]).
    pub async fn connect(addr: SocketAddr, client_name: &str, poll_window: Duration) -> Result<Self, TransportError> {
        let channel = EventChannel::new().map_err(rdma)?;
        let id = CmId::new(&channel).map_err(rdma)?;
        let events = readiness(Arc::clone(&channel), "registering the rdma_cm channel").map_err(rdma)?;
        let setup = async {
            id.resolve_addr(addr, RESOLVE_TIMEOUT_MS).map_err(rdma)?;
            expect(&events, CmEventKind::AddrResolved, addr).await?;
            id.resolve_route(RESOLVE_TIMEOUT_MS).map_err(rdma)?;
            expect(&events, CmEventKind::RouteResolved, addr).await
        };
        tokio::time::timeout(CONNECT_TIMEOUT, setup).await.map_err(|_| timed_out(addr))??;
        let limits = id.device_limits().map_err(rdma)?;
        let device = id.device_name();
        let pd = ProtectionDomain::new(&id).map_err(rdma)?;
        let messages = RDMA_CREDITS_MAX + CONTROL_MESSAGES_MAX;
        let cq = CompletionQueue::new(&id, (2 * messages + 8).min(limits.max_cqe)).map_err(rdma)?;
        let caps = QueueCaps { send_wr: messages, recv_wr: messages, send_sge: 1 };
        let mut qp = QueuePair::create(id, &pd, &cq, caps).map_err(rdma)?;
        let recv = MessageSlots::new(&pd, messages as usize, RESPONSE_SLOT_BYTES, Access::LocalWrite).map_err(rdma)?;
        let send = MessageSlots::new(&pd, messages as usize, REQUEST_SLOT_BYTES, Access::LocalRead).map_err(rdma)?;
        for slot in 0..messages as usize {
            // SAFETY: receive slots registered for local write, owned by the
            // driver after the QP (dropped later); untouched while posted.
            unsafe { qp.post_recv(WR_RECV | slot as u64, recv.sge(slot, RESPONSE_SLOT_BYTES)) }.map_err(rdma)?;
        }
        qp.id().set_ack_timeout(ACK_TIMEOUT_EXPONENT).map_err(rdma)?;
        qp.id().connect().map_err(rdma)?;
        tokio::time::timeout(CONNECT_TIMEOUT, expect(&events, CmEventKind::Established, addr))
            .await
            .map_err(|_| timed_out(addr))??;

        let (commands, rx) = mpsc::channel(64);
        let lost = Arc::new(Mutex::new(None));
        let driver = Driver {
            qp,
            recv,
            send,
            free_send: (0..messages).rev().collect(),
            queued: VecDeque::new(),
            pending: HashMap::new(),
            control_replies: VecDeque::new(),
        };
        let driver = tokio::spawn(driver.run(rx, events, Arc::clone(&lost), PollWindow::new(poll_window)));
        let mut client = Self {
            commands,
            control: tokio::sync::Mutex::new(()),
            credits: Arc::new(Semaphore::new(1)),
            limits: NodeLimits::BEFORE_HELLO,
            pd,
            next_batch_id: AtomicU64::new(1),
            lost,
            device,
            driver,
        };
        let reply = client.control_request(&session::hello(client_name)).await?;
        client.limits = session::limits(reply, RDMA_CREDITS_MAX)?;
        client.credits = Arc::new(Semaphore::new(client.limits.credits as usize));
        Ok(client)
    }

    pub fn limits(&self) -> NodeLimits {
        self.limits
    }

    /// The local RDMA device the connection runs on.
    pub fn device(&self) -> &str {
        &self.device
    }

    pub async fn open(&self, name: &str, token: Option<String>) -> Result<(u32, OpenInfo), TransportError> {
        opened(self.control_request(&open_request(name, token)).await?)
    }

    pub async fn close(&self, handle: u32) -> Result<(), TransportError> {
        let frame = control_frame(&ControlMessage::Close { handle });
        self.commands.send(Command::Control { frame, reply: None }).await.map_err(|_| self.lost_error())
    }

    async fn control_request(&self, message: &ControlMessage) -> Result<ControlMessage, TransportError> {
        let _serial = self.control.lock().await;
        let (reply, rx) = oneshot::channel();
        let command = Command::Control { frame: control_frame(message), reply: Some(reply) };
        self.commands.send(command).await.map_err(|_| self.lost_error())?;
        session::reply(rx.await.map_err(|_| self.lost_error())?)
    }

    fn lost_error(&self) -> TransportError {
        let why = self.lost.lock().ok().and_then(|l| l.clone());
        TransportError::Lost(why.unwrap_or_else(|| "connection closed".into()))
    }

    /// Reads one wire batch (within the node's limits) into `target` at
    /// each range's `dest`; waits for a credit first.
    pub async fn read_batch(
        &self,
        handle: u32,
        ranges: &[RangeDescriptor],
        target: &InFlightBuffer,
    ) -> Result<Vec<RangeStatus>, TransportError> {
        self.limits.check_batch(ranges.len())?;
        let _credit = self.credits.acquire().await.map_err(|_| self.lost_error())?;
        let batch_id = self.next_batch_id.fetch_add(1, Ordering::Relaxed);
        let header = RdmaBatchRequestHeader {
            batch_id: U64::new(batch_id),
            handle: U32::new(handle),
            range_count: U32::new(ranges.len() as u32),
            rkey: U32::new(target.0.region.rkey()),
            reserved: U32::new(0),
            remote_addr: U64::new(target.0.region.addr()),
            remote_len: U64::new(target.0.len() as u64),
        };
        if !wire::destinations_fit(&header, ranges) {
            return Err(TransportError::Protocol("a destination lies outside the registered buffer".into()));
        }
        let mut frame = Vec::with_capacity(wire::FrameHeader::SIZE + REQUEST_SLOT_BYTES.min(4096));
        wire::encode_rdma_batch_request(&mut frame, &header, ranges);
        let (done, rx) = oneshot::channel();
        let pending = Pending {
            range_count: ranges.len() as u32,
            asked: std::time::Instant::now(),
            target: InFlightBuffer(Arc::clone(&target.0)),
            done,
        };
        self.commands.send(Command::Batch { frame, batch_id, pending }).await.map_err(|_| self.lost_error())?;
        rx.await.map_err(|_| self.lost_error())?
    }
}

impl Drop for RdmaClient {
    fn drop(&mut self) {
        // The driver sees its command channel close and tears down; abort
        // only covers a driver stuck waiting on the device.
        self.driver.abort();
    }
}

fn timed_out(addr: SocketAddr) -> TransportError {
    TransportError::Rdma(format!("connecting to {addr}: no answer within {CONNECT_TIMEOUT:?}"))
}

/// Owns the queue pair. Declared first, the QP is destroyed before the
/// slots it posts from and the buffers pending batches write into.
/// What one turn of a connection's driver did.
enum Turn {
    /// Handled a command, an event or the watchdog.
    Quiet,
    /// Drained completions from the node.
    Heard,
    /// The client is gone.
    Closed,
}

struct Driver {
    qp: QueuePair,
    recv: MessageSlots,
    send: MessageSlots,
    free_send: Vec<u32>,
    queued: VecDeque<Command>,
    pending: HashMap<u64, Pending>,
    control_replies: VecDeque<oneshot::Sender<ControlMessage>>,
}

impl Driver {
    async fn run(
        mut self,
        mut commands: mpsc::Receiver<Command>,
        events: AsyncFd<Arc<EventChannel>>,
        lost: Arc<Mutex<Option<String>>>,
        poll: PollWindow,
    ) {
        let why = match self.serve(&mut commands, &events, poll).await {
            Ok(()) => "client closed the connection".to_string(),
            Err(err) => err.to_string(),
        };
        tracing::debug!("RDMA connection ends: {why}");
        if let Ok(mut lost) = lost.lock() {
            *lost = Some(why.clone());
        }
        commands.close();
        // The QP goes first: after it no write can land in a target. Its
        // teardown can block (a vanished node's disconnect times out), so
        // it runs off the async threads.
        let teardown = tokio::task::spawn_blocking(move || {
            let Self { qp, pending, control_replies, queued, .. } = self;
            drop(qp);
            drop(control_replies);
            drop(queued);
            for (_, pending) in pending {
                pending.finish(Err(TransportError::Lost(why.clone())));
            }
        });
        let _ = teardown.await;
    }

    async fn serve(
        &mut self,
        commands: &mut mpsc::Receiver<Command>,
        events: &AsyncFd<Arc<EventChannel>>,
        mut poll: PollWindow,
    ) -> Result<(), TransportError> {
        let cq = readiness(Arc::clone(self.qp.cq()), "registering the completion channel").map_err(rdma)?;
        let mut completions = Vec::with_capacity(64);
        let mut watchdog = tokio::time::interval(Duration::from_secs(1));
        watchdog.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let until = poll.open_until(Instant::now());
            let turn = async {
                tokio::select! {
                    _ = watchdog.tick() => {
                        if let Some(oldest) = self.pending.values().map(|p| p.asked).min() {
                            if oldest.elapsed() > RESPONSE_TIMEOUT {
                                return Err(TransportError::Lost(format!(
                                    "no response within {RESPONSE_TIMEOUT:?}: the node or the link is stuck"
                                )));
                            }
                        }
                        Ok(Turn::Quiet)
                    }
                    command = commands.recv() => {
                        let Some(command) = command else { return Ok(Turn::Closed) };
                        self.queued.push_back(command);
                        self.flush()?;
                        Ok(Turn::Quiet)
                    }
                    ready = cq.readable() => {
                        // Clear, drain and re-arm, then poll (see the server).
                        ready.map_err(TransportError::Io)?.clear_ready();
                        self.qp.cq().take_events().map_err(rdma)?;
                        self.poll_completions(&mut completions)?;
                        self.flush()?;
                        Ok(Turn::Heard)
                    }
                    ready = events.readable() => {
                        ready.map_err(TransportError::Io)?.clear_ready();
                        loop {
                            match events.get_ref().next_event().map_err(rdma)? {
                                Some(event) if event.kind == CmEventKind::Disconnected => {
                                    // What arrived before the disconnect (a
                                    // reply, or why the node closed) comes first.
                                    self.poll_completions(&mut completions)?;
                                    return Err(TransportError::Lost("node closed the connection".into()))
                                }
                                Some(event) if matches!(event.kind, CmEventKind::Failed(_)) => {
                                    return Err(TransportError::Lost(format!("connection failed: {}", event.kind)))
                                }
                                Some(_) => {}
                                None => break,
                            }
                        }
                        Ok(Turn::Quiet)
                    }
                }
            };
            // Within the window after a completion the thread keeps
            // polling for the next one instead of sleeping (see
            // `crate::poll`).
            match polling(turn, until).await? {
                Turn::Quiet => {}
                Turn::Heard => poll.heard(Instant::now()),
                Turn::Closed => return Ok(()),
            }
        }
    }

    /// Handles every completion the CQ holds.
    fn poll_completions(&mut self, completions: &mut Vec<crate::verbs::WorkCompletion>) -> Result<(), TransportError> {
        loop {
            completions.clear();
            if self.qp.cq().poll(completions, 64).map_err(rdma)? == 0 {
                break;
            }
            for wc in completions.drain(..) {
                if !wc.is_ok() {
                    return Err(TransportError::Lost(format!("work request failed: {}", wc.status_text())));
                }
                let slot = wc.wr_id as u32;
                match wc.wr_id & WR_TAG_MASK {
                    WR_SEND => {
                        tracing::trace!(slot, "request sent");
                        self.free_send.push(slot);
                    }
                    WR_RECV => {
                        // SAFETY: the receive completed; the
                        // slot is reposted only after this.
                        let bytes = unsafe { self.recv.slot(slot as usize) };
                        let len = (wc.byte_len as usize).min(bytes.len());
                        tracing::trace!(slot, len, pending = self.pending.len(), "message received");
                        let outcome = receive(&bytes[..len], &mut self.pending, &mut self.control_replies);
                        // SAFETY: as at connect; the message was
                        // consumed above.
                        unsafe {
                            self.qp
                                .post_recv(WR_RECV | u64::from(slot), self.recv.sge(slot as usize, RESPONSE_SLOT_BYTES))
                        }
                        .map_err(rdma)?;
                        outcome?;
                    }
                    _ => {
                        return Err(TransportError::Protocol(format!(
                            "completion for unknown work request {:#x}",
                            wc.wr_id
                        )))
                    }
                }
            }
        }
        Ok(())
    }

    /// Posts queued requests while send slots last.
    fn flush(&mut self) -> Result<(), TransportError> {
        while let Some(&slot) = self.free_send.last() {
            let Some(command) = self.queued.pop_front() else { break };
            let frame = match &command {
                Command::Control { frame, .. } | Command::Batch { frame, .. } => frame,
            };
            assert!(frame.len() <= REQUEST_SLOT_BYTES, "request larger than its slot");
            self.free_send.pop();
            // SAFETY: the slot is off the free list, so no posted SEND reads it.
            let bytes = unsafe { self.send.slot_mut(slot as usize) };
            bytes[..frame.len()].copy_from_slice(frame);
            let message = [self.send.sge(slot as usize, frame.len())];
            let request = SendWr { wr_id: WR_SEND | u64::from(slot), op: SendOp::Send, sges: &message, signaled: true };
            // SAFETY: the SEND reads a send slot that stays ours until its
            // completion returns it to the free list.
            unsafe { self.qp.post_send(&[request]) }.map_err(rdma)?;
            match command {
                Command::Control { reply: Some(reply), .. } => self.control_replies.push_back(reply),
                Command::Control { reply: None, .. } => {}
                Command::Batch { batch_id, pending, .. } => {
                    self.pending.insert(batch_id, pending);
                }
            }
        }
        Ok(())
    }
}

/// Acts on one message from the node.
fn receive(
    bytes: &[u8],
    pending: &mut HashMap<u64, Pending>,
    control_replies: &mut VecDeque<oneshot::Sender<ControlMessage>>,
) -> Result<(), TransportError> {
    let (kind, payload) = parse_message(bytes, true)?;
    match kind {
        FrameKind::Control => {
            let message = codec::decode(payload)?;
            let Some(waiter) = control_replies.pop_front() else { return Err(session::unsolicited(message)) };
            let _ = waiter.send(message);
            Ok(())
        }
        FrameKind::RdmaBatchResponse => {
            let (head, statuses) =
                BatchResponseHeader::ref_from_prefix(payload).map_err(|_| wire::FrameError::Short)?;
            let batch_id = head.batch_id.get();
            let Some(waiting) = pending.remove(&batch_id) else {
                return Err(TransportError::Protocol(format!("response for unknown batch {batch_id}")));
            };
            match session::batch_outcome(head, statuses, waiting.range_count as usize) {
                Ok(outcome) => {
                    waiting.finish(outcome.map_err(TransportError::Batch));
                    Ok(())
                }
                Err(err) => {
                    waiting.finish(Err(TransportError::Protocol(err.to_string())));
                    Err(err)
                }
            }
        }
        other => Err(TransportError::Protocol(format!("node sent a {other:?} frame on RDMA"))),
    }
}
