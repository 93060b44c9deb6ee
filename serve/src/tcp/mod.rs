//! The TCP transport's server: each connection is served on the event loop
//! of the data-plane core its listener belongs to, where one task reads its
//! frames and hands batches to that core, and one writes responses as they
//! complete; the core's engine runs beside them on the same thread.
//!
//! A batch allocates nothing once a connection is warm: its ranges go in
//! a vector the core kept from an earlier batch ([`spare_ranges`]), its
//! outcome comes back on the connection's completion queue under a tag
//! (not a channel of its own), and the writer keeps its buffers.

mod ring;
#[cfg(test)]
mod ring_tests;
mod sink;
mod socket;

use std::collections::HashMap;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ring::SocketRing;
use rustc_hash::FxHashMap;
use sink::{FrameSink, StreamSink};
use sluice_dataplane::steer::peer_key;
use sluice_dataplane::timer;
use sluice_dataplane::{spare_ranges, BatchCompletion, ByteRange, CoreGroup, DataPlane, Placement, ReadBatch, Reply};
use socket::Socket;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch, OwnedSemaphorePermit, Semaphore};

use crate::config::{ServerConfig, SocketIo};
use crate::deadline;
use crate::metrics::{settle_outcome, DatasetCounters};
use crate::read_through;
use crate::session::DatasetResolver;
use crate::session::{Admission, ControlAction, Fatal, Peer, Session};
use sluice_proto::codec::{self, ControlMessage, ErrorCode};
use sluice_proto::wire::{self, BatchStatus, FrameKind};
use sluice_transport::frame::{control_frame, read_frame_header};

/// How long a TLS client may take over its handshake.
const TLS_HANDSHAKE_TIMEOUT_DEFAULT: Duration = Duration::from_secs(10);
/// TCP keepalive: probes after this much silence, then every
/// [`KEEPALIVE_INTERVAL`], so a vanished peer's connection is found dead.
const KEEPALIVE_IDLE: Duration = Duration::from_secs(60);
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(10);

/// Bytes of requests read ahead per connection.
const REQUEST_BUFFER_BYTES: usize = 64 << 10;

/// Connections held per source address; a guard gives its place back.
type SourceCounts = Arc<std::sync::Mutex<HashMap<std::net::IpAddr, usize>>>;

struct SourceGuard {
    counts: SourceCounts,
    source: std::net::IpAddr,
}

impl SourceGuard {
    /// A place for one more connection from `source`, if it has one left.
    fn take(counts: &SourceCounts, source: std::net::IpAddr, max: usize) -> Option<Self> {
        let mut map = counts.lock().ok()?;
        let held = map.entry(source).or_insert(0);
        if *held >= max {
            return None;
        }
        *held += 1;
        Some(Self { counts: Arc::clone(counts), source })
    }
}

impl Drop for SourceGuard {
    fn drop(&mut self) {
        if let Ok(mut map) = self.counts.lock() {
            if let Some(held) = map.get_mut(&self.source) {
                *held -= 1;
                if *held == 0 {
                    map.remove(&self.source);
                }
            }
        }
    }
}

/// Tells a refused peer why (best effort, briefly) and closes.
fn refuse(mut stream: TcpStream, message: String) {
    let frame = control_frame(&ControlMessage::Error { code: ErrorCode::Busy, message });
    tokio::spawn(async move {
        let _ = timer::timeout(Duration::from_secs(1), stream.write_all(&frame)).await;
    });
}

/// One data port's connections: the limits they share (connections in
/// all, per source address) whichever core serves them, and the cores they
/// are served on.
pub struct TcpServer<R> {
    plane: Arc<DataPlane>,
    /// The cores this server's listeners are served on; a connection's
    /// batches spill only among them.
    group: CoreGroup,
    resolver: Arc<R>,
    config: ServerConfig,
    slots: Arc<Semaphore>,
    sources: SourceCounts,
    next_client_id: std::sync::atomic::AtomicU32,
}

impl<R: DatasetResolver> TcpServer<R> {
    /// A server whose listeners will be served on the cores of `group`
    /// (see [`TcpServer::serve_on_core`]).
    pub fn new(plane: Arc<DataPlane>, group: CoreGroup, resolver: Arc<R>, config: ServerConfig) -> Arc<Self> {
        Arc::new(Self {
            group,
            slots: Arc::new(Semaphore::new(config.connections_max.max(1))),
            sources: SourceCounts::default(),
            next_client_id: std::sync::atomic::AtomicU32::new(0),
            plane,
            resolver,
            config,
        })
    }

    /// Serves `listener` on core `core`'s event loop (see
    /// [`DataPlane::core_runtime`]) until `shutdown` turns true.
    ///
    /// # Panics
    /// If `core` is not one of this server's group.
    pub fn serve_on_core(
        self: &Arc<Self>,
        listener: std::net::TcpListener,
        core: usize,
        shutdown: watch::Receiver<bool>,
    ) -> tokio::task::JoinHandle<()> {
        let placement = self.group.place(core);
        let server = Arc::clone(self);
        self.plane.core_runtime(core).spawn(async move {
            let listener = listener.set_nonblocking(true).and_then(|()| TcpListener::from_std(listener));
            match listener {
                Ok(listener) => server.serve(listener, placement, shutdown).await,
                Err(err) => tracing::error!(core, "data-port listener: {err}"),
            }
        })
    }

    /// Accepts connections until `shutdown` turns true, on the event loop
    /// of `placement`'s core; each is served there.
    async fn serve(self: Arc<Self>, listener: TcpListener, placement: Placement, mut shutdown: watch::Receiver<bool>) {
        let config = &self.config;
        let ring = match (config.socket_io, &config.tls) {
            (SocketIo::Uring, None) => match SocketRing::start() {
                Ok(ring) => Some(ring),
                Err(err) => {
                    tracing::warn!(
                        core = placement.core(),
                        "no socket ring ({err}); connections use readiness and syscalls"
                    );
                    None
                }
            },
            // TLS records are sealed and opened by rustls over a byte
            // stream; they stay on the event loop's readiness path.
            (SocketIo::Uring, Some(_)) | (SocketIo::Readiness, _) => None,
        };
        loop {
            tokio::select! {
                accepted = listener.accept() => match accepted {
                    Ok((stream, peer)) => {
                        let Ok(slot) = Arc::clone(&self.slots).try_acquire_owned() else {
                            tracing::warn!(%peer, "refusing a connection: {} are open", config.connections_max);
                            refuse(stream, format!("the node serves at most {} connections", config.connections_max));
                            continue;
                        };
                        let Some(source) = SourceGuard::take(&self.sources, peer.ip(), config.connections_per_source_max) else {
                            tracing::warn!(%peer, "refusing a connection: its address holds {}", config.connections_per_source_max);
                            refuse(stream, format!(
                                "the node serves at most {} connections per source address",
                                config.connections_per_source_max
                            ));
                            continue;
                        };
                        let keepalive = socket2::TcpKeepalive::new().with_time(KEEPALIVE_IDLE).with_interval(KEEPALIVE_INTERVAL);
                        let _ = socket2::SockRef::from(&stream).set_tcp_keepalive(&keepalive);
                        let client_id = self.next_client_id.fetch_add(1, std::sync::atomic::Ordering::Relaxed).wrapping_add(1);
                        config.accepted.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        let connection = Connection {
                            client_id,
                            plane: Arc::clone(&self.plane),
                            resolver: Arc::clone(&self.resolver),
                            config: config.clone(),
                            peer,
                            placement: placement.clone(),
                        };
                        let ring = ring.clone();
                        tokio::spawn(async move {
                            connection.run(stream, ring).await;
                            drop(source);
                            drop(slot);
                        });
                        // The new connection's task (and every other task of
                        // this core) runs before the next accept: a flood of
                        // connections waits in the kernel's backlog, not as
                        // accepted connections no task has looked at yet.
                        tokio::task::yield_now().await;
                    }
                    Err(err) => {
                        tracing::warn!("accept: {err}");
                        timer::sleep(Duration::from_millis(10)).await;
                    }
                },
                _ = shutdown.changed() => return,
            }
        }
    }
}

/// What the reader sends the writer besides batches, whose outcomes come
/// on the connection's completion queue (see [`InFlightTable`]).
enum Outgoing {
    Control(Vec<u8>),
    /// A batch answered with this status, without reaching the data plane
    /// (already counted).
    Refused {
        batch_id: u64,
        range_count: u32,
        status: BatchStatus,
        permit: OwnedSemaphorePermit,
    },
}

/// Where a batch's outcome is counted, and from when.
struct Tally {
    counters: Arc<DatasetCounters>,
    submitted: std::time::Instant,
}

struct Connection<R> {
    client_id: u32,
    plane: Arc<DataPlane>,
    resolver: Arc<R>,
    config: ServerConfig,
    peer: SocketAddr,
    /// The core whose event loop serves this connection and reads its
    /// batches, and where they may spill.
    placement: Placement,
}

impl<R: DatasetResolver> Connection<R> {
    async fn run(self, stream: TcpStream, ring: Option<SocketRing>) {
        let _ = stream.set_nodelay(true);
        let Some(tls) = self.config.tls.clone() else {
            let Some(ring) = ring else {
                let (reader, writer) = stream.into_split();
                let reader = tokio::io::BufReader::with_capacity(REQUEST_BUFFER_BYTES, reader);
                return self.serve(reader, StreamSink::new(writer), None).await;
            };
            let socket = match stream.into_std().and_then(Socket::new) {
                Ok(socket) => socket,
                Err(err) => return tracing::warn!(peer = %self.peer, "taking a connection onto the socket ring: {err}"),
            };
            let reader = socket::Reader::new(ring.clone(), Arc::clone(&socket), REQUEST_BUFFER_BYTES);
            return self.serve(reader, socket::Writer::new(ring, socket), None).await;
        };
        let handshake = tokio_rustls::TlsAcceptor::from(tls).accept(stream);
        let within = self.config.handshake_timeout.min(TLS_HANDSHAKE_TIMEOUT_DEFAULT);
        match timer::timeout(within, handshake).await {
            Ok(Ok(stream)) => {
                let cert_name = sluice_transport::tls::peer_name(stream.get_ref().1.peer_certificates());
                let (reader, writer) = tokio::io::split(stream);
                let reader = tokio::io::BufReader::with_capacity(REQUEST_BUFFER_BYTES, reader);
                self.serve(reader, StreamSink::new(writer), cert_name).await;
            }
            Ok(Err(err)) => tracing::info!(peer = %self.peer, "TLS handshake failed: {err}"),
            Err(_) => tracing::info!(peer = %self.peer, "no TLS handshake within {within:?}"),
        }
    }

    /// Serves one connection's frames once its transport (plain or TLS)
    /// is up; `cert_name` is the client certificate's CN, if any. The
    /// reader is buffered: a request's frame header and its descriptors
    /// (and the next requests a client pipelined) come out of one `recv`.
    async fn serve<Rd, Sk>(self, mut reader: Rd, writer: Sk, cert_name: Option<String>)
    where
        Rd: AsyncRead + Unpin,
        Sk: FrameSink,
    {
        let credits = self.config.credits.max(1);
        let (out_tx, out_rx) = mpsc::channel(credits as usize + 8);
        // Unbounded, but never holds more than the batches the credits let
        // in flight.
        let (completions_tx, completions_rx) = mpsc::unbounded_channel();
        let drain =
            Drain { write_timeout: self.config.write_timeout, bytes_per_s_min: self.config.drain_bytes_per_s_min };
        let in_flight = InFlightTable::with_capacity(credits as usize);
        let queues = Queues { outgoing: out_rx, completions: completions_rx, in_flight: in_flight.clone() };
        let to_writer = ToWriter { out: out_tx, completions: completions_tx, in_flight };
        let mut writer = tokio::spawn(write_loop(writer, queues, drain, self.peer));
        let semaphore = Arc::new(Semaphore::new(credits as usize));
        let limits = self.config.session_limits(self.config.ranges_per_batch_max, credits);
        let mut session = Session::new(limits, Instant::now());
        // The writer ends first when the client stops draining: then the
        // whole connection goes, not only its writing half.
        let mut writer_done = false;
        let outcome = tokio::select! {
            outcome = self.read_loop(&mut reader, &to_writer, &semaphore, &mut session, cert_name) => outcome,
            _ = &mut writer => {
                writer_done = true;
                Err(Fatal::Link("the client did not drain its responses".into()))
            }
        };
        match outcome {
            Ok(()) => tracing::debug!(peer = %self.peer, "client closed the connection"),
            Err(Fatal::Link(err)) => tracing::debug!(peer = %self.peer, "connection lost: {err}"),
            Err(fatal) => {
                tracing::info!(peer = %self.peer, "closing connection: {fatal}");
                let _ = to_writer.out.send(Outgoing::Control(control_frame(&fatal.farewell()))).await;
            }
        }
        drop(to_writer);
        if !writer_done {
            let _ = writer.await;
        }
    }

    /// Runs `work`, unless a grant one of the session's datasets was opened
    /// under is revoked first: then the session ends, whatever it waited for.
    async fn unless_revoked<T>(
        &self,
        session: &Session,
        revocations: &mut watch::Receiver<u64>,
        work: impl Future<Output = T>,
    ) -> Result<T, Fatal> {
        tokio::pin!(work);
        loop {
            tokio::select! {
                // The work first: most is ready at once (a frame already
                // buffered, a credit free, room in the writer's queue, the
                // core's inbox), and then the revocations are not polled.
                biased;
                done = &mut work => return Ok(done),
                changed = revocations.changed() => {
                    if changed.is_err() {
                        // The control plane is gone; the node is stopping.
                        return Ok(work.await);
                    }
                    if let Some(name) = session.revoked(|grant| self.resolver.grant_live(grant)) {
                        return Err(Fatal::Revoked(name.to_string()));
                    }
                }
            }
        }
    }

    async fn read_loop<Rd: AsyncRead + Unpin>(
        &self,
        reader: &mut Rd,
        to_writer: &ToWriter,
        semaphore: &Arc<Semaphore>,
        session: &mut Session,
        cert_name: Option<String>,
    ) -> Result<(), Fatal> {
        let peer = Peer { addr: Some(self.peer), cert_name };
        let mut revocations = self.resolver.revocations();
        let mut payload = Vec::new();
        let credits = self.config.credits.max(1) as usize;
        let mut next_tag = 0u64;
        // One timer for every wait for a request (see `deadline::Lazy`).
        let mut frame_deadline = deadline::Lazy::default();
        loop {
            let deadline = session.deadline(semaphore.available_permits() == credits);
            let frame = async {
                let Some(header) = read_frame_header(reader).await? else { return Ok(None) };
                let (kind, len) = wire::parse_frame_header(&header, false)?;
                payload.resize(len as usize, 0);
                reader.read_exact(&mut payload).await?;
                Ok::<_, Fatal>(Some(kind))
            };
            let frame = async {
                match deadline {
                    // The deadline bounds the whole frame, a slow trickle included.
                    Some((at, why)) => frame_deadline.until(at, frame).await.ok_or(Fatal::Deadline(why))?,
                    None => frame.await,
                }
            };
            let Some(kind) = self.unless_revoked(session, &mut revocations, frame).await?? else { return Ok(()) };
            session.heard(Instant::now());
            match kind {
                FrameKind::Control => {
                    let reply = match session.control(codec::decode(&payload)?)? {
                        ControlAction::Reply(reply) => reply,
                        ControlAction::Silent => continue,
                        ControlAction::Resolve { name, token } => {
                            let asked = self.resolver.open(name.clone(), token, peer.clone());
                            let outcome = self.unless_revoked(session, &mut revocations, asked).await?;
                            session.opened(name, outcome, || self.plane.open_flow(peer_key(self.peer.ip())))
                        }
                    };
                    let sent = to_writer.out.send(Outgoing::Control(control_frame(&reply)));
                    self.unless_revoked(session, &mut revocations, sent).await?.map_err(|_| closed())?;
                }
                FrameKind::BatchRequest => {
                    let (request, descriptors) = wire::parse_batch_request(&payload)?;
                    let batch_id = request.batch_id.get();
                    let range_count = request.range_count.get();
                    let lens = descriptors.iter().map(|d| d.len.get());
                    let admission = session.admit(request.handle.get(), lens, true)?;
                    let acquire = Arc::clone(semaphore).acquire_owned();
                    let permit =
                        self.unless_revoked(session, &mut revocations, acquire).await?.map_err(|_| closed())?;
                    let (slot, flow, counters, through) = match admission {
                        Admission::Refused(status) => {
                            let refused = Outgoing::Refused { batch_id, range_count, status, permit };
                            self.unless_revoked(session, &mut revocations, to_writer.out.send(refused))
                                .await?
                                .map_err(|_| closed())?;
                            continue;
                        }
                        Admission::Admitted { slot, flow, counters, read_through } => {
                            (slot, flow, counters, read_through)
                        }
                    };
                    let mut ranges = spare_ranges();
                    ranges.extend(
                        descriptors.iter().map(|d| ByteRange { offset_bytes: d.offset.get(), len_bytes: d.len.get() }),
                    );
                    next_tag += 1;
                    let tag = next_tag;
                    let tally = Tally { counters, submitted: Instant::now() };
                    // Entered before it is submitted, so its outcome finds it.
                    to_writer.in_flight.enter(tag, InFlight { batch_id, range_count, permit, tally });
                    let reply = Reply::queued(to_writer.completions.clone(), tag);
                    let batch = ReadBatch { dataset: slot, client_id: self.client_id, flow, ranges, reply, hold: None };
                    // A batch the data plane refuses drops its reply, which
                    // answers `ShuttingDown` on the queue.
                    let submitted = read_through::submit(&self.plane, Some(&self.placement), batch, through.as_ref());
                    let _ = self.unless_revoked(session, &mut revocations, submitted).await?;
                }
                other => return Err(Fatal::unexpected_frame(other, FrameKind::BatchRequest)),
            }
        }
    }
}

/// The connection's writer is gone (it ended the connection).
fn closed() -> Fatal {
    Fatal::Link("the connection's writer stopped".into())
}

/// How long a response may take to write: its bytes at the minimum drain
/// rate, at least a second, at most the write timeout.
#[derive(Clone, Copy)]
struct Drain {
    write_timeout: Duration,
    bytes_per_s_min: u64,
}

impl Drain {
    fn within(&self, bytes: u64) -> Duration {
        let at_rate = Duration::from_secs_f64(bytes as f64 / self.bytes_per_s_min.max(1) as f64);
        at_rate.max(Duration::from_secs(1)).min(self.write_timeout)
    }
}

/// What a connection's writer reads: replies and batches from its reader,
/// outcomes from the data plane.
/// The reader's ways to its writer: replies and refusals in order on
/// `out`; batches through the in-flight table, their outcomes coming on
/// the completion queue.
struct ToWriter {
    out: mpsc::Sender<Outgoing>,
    completions: mpsc::UnboundedSender<BatchCompletion>,
    in_flight: InFlightTable,
}

struct Queues {
    outgoing: mpsc::Receiver<Outgoing>,
    completions: mpsc::UnboundedReceiver<BatchCompletion>,
    in_flight: InFlightTable,
}

/// A connection's batches on the data plane, by tag: the reader enters
/// each before it submits it, the writer takes it out when its outcome
/// comes back on the completion queue. Both are tasks of the connection's
/// core, so the lock is never contended, and it costs less than the
/// message a batch it replaces (and the writer's wake-up for it). The
/// credits bound the batches it holds. The reader numbers the tags, so no
/// client chooses a key and a fast hash (not a keyed one) is safe.
#[derive(Clone)]
struct InFlightTable(Arc<std::sync::Mutex<FxHashMap<u64, InFlight>>>);

impl InFlightTable {
    fn with_capacity(credits: usize) -> Self {
        Self(Arc::new(std::sync::Mutex::new(FxHashMap::with_capacity_and_hasher(credits, Default::default()))))
    }

    /// The table. Never held across an await, and nothing is left
    /// half-done while it is held, so a poisoned lock is taken as is.
    fn table(&self) -> std::sync::MutexGuard<'_, FxHashMap<u64, InFlight>> {
        self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn enter(&self, tag: u64, batch: InFlight) {
        let replaced = self.table().insert(tag, batch);
        assert!(replaced.is_none(), "tag {tag} entered twice");
    }

    fn take(&self, tag: u64) -> Option<InFlight> {
        self.table().remove(&tag)
    }

    fn is_empty(&self) -> bool {
        self.table().is_empty()
    }
}

/// A batch the writer waits on: what its response needs besides the
/// outcome.
struct InFlight {
    batch_id: u64,
    range_count: u32,
    permit: OwnedSemaphorePermit,
    tally: Tally,
}

/// Writes control replies in order and batch responses as they complete.
async fn write_loop<Sk: FrameSink>(mut sink: Sk, mut queues: Queues, drain: Drain, peer: SocketAddr) {
    let timeout = drain.write_timeout;
    // Kept from one response to the next, so a response allocates none.
    let mut head = Vec::with_capacity(256);
    let mut statuses: Vec<u8> = Vec::new();
    let mut open = true;
    let mut completing = true;
    // Once the reader is gone it enters no more batches: the writer stays
    // for the outcomes of those it entered.
    while open || !queues.in_flight.is_empty() {
        let done = tokio::select! {
            // The reader's replies and refusals first, in its order.
            biased;
            next = queues.outgoing.recv(), if open => match next {
                None => { open = false; None }
                Some(Outgoing::Control(frame)) => {
                    let written = deadline::within(timeout, sink.send_frame(&frame)).await;
                    if !wrote(written, timeout, peer) {
                        break;
                    }
                    None
                }
                Some(Outgoing::Refused { batch_id, range_count, status, permit }) => {
                    let failed = FailedBatch { batch_id, range_count, status };
                    let written = failed.write(&mut sink, &mut head, &mut statuses, timeout).await;
                    drop(permit);
                    if !wrote(written, timeout, peer) {
                        break;
                    }
                    None
                }
            },
            done = queues.completions.recv(), if completing => {
                if done.is_none() {
                    completing = false;
                }
                done
            }
            // Every entered batch's reply answers, so this is never
            // reached with batches in flight.
            else => break,
        };
        let Some(done) = done else { continue };
        let Some(batch) = queues.in_flight.take(done.tag) else {
            // Never: the reader enters a batch before it submits it.
            tracing::warn!(%peer, tag = done.tag, "outcome of no batch of this connection");
            continue;
        };
        let written = match settle_outcome(done.outcome, &batch.tally.counters, batch.tally.submitted) {
            Ok(result) => {
                let payload_bytes = result.payload_bytes();
                statuses.clear();
                statuses.extend(result.statuses().iter().map(|s| *s as u8));
                wire::encode_batch_response_head(&mut head, batch.batch_id, BatchStatus::Ok, &statuses, payload_bytes);
                let within = drain.within(head.len() as u64 + payload_bytes);
                deadline::within(within, sink.send_batch(&head, result)).await
            }
            Err(status) => {
                let failed = FailedBatch { batch_id: batch.batch_id, range_count: batch.range_count, status };
                failed.write(&mut sink, &mut head, &mut statuses, timeout).await
            }
        };
        drop(batch.permit);
        if !wrote(written, timeout, peer) {
            break;
        }
    }
    // Outcomes still queued drop here, which returns their DMA slots.
    sink.close().await;
}

/// A batch answered whole with a failure status: refused before the data
/// plane, or failed there.
struct FailedBatch {
    batch_id: u64,
    range_count: u32,
    status: BatchStatus,
}

impl FailedBatch {
    /// Writes its response (every range `IoError`, no payload) through the
    /// writer's reused `head` and `statuses` buffers.
    async fn write<Sk: FrameSink>(
        &self,
        sink: &mut Sk,
        head: &mut Vec<u8>,
        statuses: &mut Vec<u8>,
        timeout: Duration,
    ) -> Result<std::io::Result<()>, timer::Elapsed> {
        statuses.clear();
        statuses.resize(self.range_count as usize, sluice_proto::RangeStatus::IoError as u8);
        wire::encode_batch_response_head(head, self.batch_id, self.status, statuses, 0);
        deadline::within(timeout, sink.send_frame(head)).await
    }
}

/// Whether a write went through; logs why not.
fn wrote(written: Result<std::io::Result<()>, timer::Elapsed>, timeout: Duration, peer: SocketAddr) -> bool {
    match written {
        Ok(Ok(())) => true,
        Ok(Err(err)) => {
            tracing::debug!(%peer, "writing response: {err}");
            false
        }
        Err(_) => {
            tracing::info!(%peer, "client did not drain a response in time (at most {timeout:?}); dropping it");
            false
        }
    }
}
