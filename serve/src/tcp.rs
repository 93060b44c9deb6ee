//! The TCP transport's server: one task reads a connection's frames and
//! hands batches to the data plane, one writes responses as they complete.

use std::collections::HashMap;
use std::future::Future;
use std::io::IoSlice;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use futures_util::stream::{FuturesUnordered, StreamExt};
use sluice_dataplane::steer::peer_key;
use sluice_dataplane::{BatchResult, ByteRange, DataPlane, DatasetSlot, FlowLease, ReadBatch, SubmitError};
use sluice_proto::geometry::batch_fits;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, oneshot, watch, OwnedSemaphorePermit, Semaphore};

use crate::metrics::{settle, DatasetCounters};
use sluice_proto::codec::{self, ControlMessage, ErrorCode, OpenInfo};
use sluice_proto::wire::{self, BatchStatus, FrameKind};
use sluice_transport::frame::{control_frame, read_frame_header, write_all_flushed, write_all_vectored};

/// Most datasets one connection holds open.
const HANDLES_PER_CONNECTION_MAX: usize = 1024;
const PROTOCOL: u32 = 1;

/// Resolves dataset names for `Open` and decides access: the catalog's side
/// of the server.
pub trait DatasetResolver: Send + Sync + 'static {
    /// Opens `name` for a client that gave `token` and, over TLS with a
    /// client certificate, is `peer_name` (the certificate's CN).
    fn open(
        &self,
        name: String,
        token: Option<String>,
        peer_name: Option<String>,
    ) -> impl Future<Output = Result<Opened, OpenError>> + Send;
    /// Whether the grant an open was made under still stands.
    fn grant_live(&self, grant: u64) -> bool;
    /// Changes whenever a grant is revoked.
    fn revocations(&self) -> watch::Receiver<u64>;
}

/// A dataset opened for a client.
#[derive(Clone, Debug)]
pub struct Opened {
    pub slot: DatasetSlot,
    pub info: OpenInfo,
    /// The grant the open was made under; `None` on a node without grants.
    pub grant: Option<u64>,
    /// Where this dataset's serving counters go.
    pub counters: Arc<DatasetCounters>,
}

/// Why an open failed; sent to that client only.
#[derive(Clone, Debug)]
pub struct OpenError {
    pub code: ErrorCode,
    pub message: String,
}

#[derive(Clone, Debug)]
pub struct ServerConfig {
    pub node_name: String,
    /// Batches one connection may have in flight.
    pub credits: u32,
    /// A response not written within this is taken as a dead client.
    pub write_timeout: Duration,
    /// Connections served at once; the next is told so and closed.
    pub connections_max: usize,
    /// Batch limits announced to clients, which split their batches to fit.
    pub ranges_per_batch_max: u32,
    pub batch_footprint_max_bytes: u64,
    /// Counts connections this listener accepted (shared with whoever
    /// reports on the listener: the node's steering, per worker socket).
    pub accepted: Arc<std::sync::atomic::AtomicU64>,
    /// Serve TLS on this listener (rustls): every byte, statuses and data
    /// alike, is encrypted and a client certificate names its holder.
    pub tls: Option<Arc<rustls::ServerConfig>>,
    /// A connection must say Hello and open a dataset within this, or it is
    /// closed: a peer that has not authenticated holds nothing for long.
    pub handshake_timeout: Duration,
    /// A connection with nothing in flight that sends nothing for this long
    /// is closed.
    pub idle_timeout: Duration,
    /// Connections one source address may hold at once; more are refused
    /// with `Busy`, so one host cannot take the node's whole limit.
    pub connections_per_source_max: usize,
    /// A response must drain at least this fast (its bytes over this rate,
    /// and at least a second, bound its write; never more than
    /// `write_timeout`): a reader that stops reading loses its connection
    /// and its DMA slots come back.
    pub drain_bytes_per_s_min: u64,
}

/// How long a TLS client may take over its handshake.
const TLS_HANDSHAKE_TIMEOUT_DEFAULT: Duration = Duration::from_secs(10);
/// TCP keepalive: probes after this much silence, then every
/// [`KEEPALIVE_INTERVAL`], so a vanished peer's connection is found dead.
const KEEPALIVE_IDLE: Duration = Duration::from_secs(60);
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(10);

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            node_name: "sluice".into(),
            credits: 64,
            write_timeout: Duration::from_secs(30),
            connections_max: 4096,
            ranges_per_batch_max: wire::RANGES_PER_BATCH_MAX,
            batch_footprint_max_bytes: wire::BATCH_FOOTPRINT_MAX_BYTES,
            accepted: Arc::default(),
            tls: None,
            handshake_timeout: Duration::from_secs(5),
            idle_timeout: Duration::from_secs(600),
            connections_per_source_max: 512,
            drain_bytes_per_s_min: 1 << 20,
        }
    }
}

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
        let _ = tokio::time::timeout(Duration::from_secs(1), stream.write_all(&frame)).await;
    });
}

/// Accepts connections until `shutdown` turns true.
pub async fn serve<R: DatasetResolver>(
    listener: TcpListener,
    plane: Arc<DataPlane>,
    resolver: Arc<R>,
    config: ServerConfig,
    mut shutdown: watch::Receiver<bool>,
) {
    let slots = Arc::new(Semaphore::new(config.connections_max.max(1)));
    let sources = SourceCounts::default();
    let mut next_client_id = 0u32;
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) => {
                    let Ok(slot) = Arc::clone(&slots).try_acquire_owned() else {
                        tracing::warn!(%peer, "refusing a connection: {} are open", config.connections_max);
                        refuse(stream, format!("the node serves at most {} connections", config.connections_max));
                        continue;
                    };
                    let Some(source) = SourceGuard::take(&sources, peer.ip(), config.connections_per_source_max) else {
                        tracing::warn!(%peer, "refusing a connection: its address holds {}", config.connections_per_source_max);
                        refuse(stream, format!(
                            "the node serves at most {} connections per source address",
                            config.connections_per_source_max
                        ));
                        continue;
                    };
                    let keepalive = socket2::TcpKeepalive::new().with_time(KEEPALIVE_IDLE).with_interval(KEEPALIVE_INTERVAL);
                    let _ = socket2::SockRef::from(&stream).set_tcp_keepalive(&keepalive);
                    next_client_id = next_client_id.wrapping_add(1);
                    config.accepted.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let connection = Connection {
                        client_id: next_client_id,
                        plane: Arc::clone(&plane),
                        resolver: Arc::clone(&resolver),
                        config: config.clone(),
                        peer,
                    };
                    tokio::spawn(async move {
                        connection.run(stream).await;
                        drop(source);
                        drop(slot);
                    });
                }
                Err(err) => {
                    tracing::warn!("accept: {err}");
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            },
            _ = shutdown.changed() => return,
        }
    }
}

enum Outgoing {
    Control(Vec<u8>),
    Batch {
        batch_id: u64,
        range_count: u32,
        result: oneshot::Receiver<Result<BatchResult, SubmitError>>,
        permit: OwnedSemaphorePermit,
        tally: Tally,
    },
    Failed {
        batch_id: u64,
        range_count: u32,
        status: BatchStatus,
        permit: OwnedSemaphorePermit,
        counters: Option<Arc<DatasetCounters>>,
    },
}

/// Where a batch's outcome is counted, and from when.
struct Tally {
    counters: Arc<DatasetCounters>,
    submitted: std::time::Instant,
}

/// Why a connection is closed by the server.
#[derive(Debug, thiserror::Error)]
enum Fatal {
    #[error("{0}")]
    Frame(#[from] wire::FrameError),
    #[error("{0}")]
    Codec(#[from] codec::CodecError),
    #[error("protocol: {0}")]
    Protocol(String),
    #[error("io: {0}")]
    Io(#[from] std::io::Error),
    #[error("the grant this session opened {0} under was revoked")]
    Revoked(String),
    #[error("{0}")]
    Deadline(String),
}

impl Fatal {
    fn code(&self) -> ErrorCode {
        match self {
            Self::Frame(wire::FrameError::Oversized { .. }) => ErrorCode::OversizedFrame,
            Self::Frame(_) | Self::Codec(_) => ErrorCode::MalformedFrame,
            Self::Protocol(_) | Self::Io(_) | Self::Deadline(_) => ErrorCode::Protocol,
            Self::Revoked(_) => ErrorCode::AccessDenied,
        }
    }
}

struct Connection<R> {
    client_id: u32,
    plane: Arc<DataPlane>,
    resolver: Arc<R>,
    config: ServerConfig,
    peer: SocketAddr,
}

impl<R: DatasetResolver> Connection<R> {
    async fn run(self, stream: TcpStream) {
        let _ = stream.set_nodelay(true);
        let Some(tls) = self.config.tls.clone() else {
            let (reader, writer) = stream.into_split();
            return self.serve(reader, writer, None).await;
        };
        let handshake = tokio_rustls::TlsAcceptor::from(tls).accept(stream);
        let within = self.config.handshake_timeout.min(TLS_HANDSHAKE_TIMEOUT_DEFAULT);
        match tokio::time::timeout(within, handshake).await {
            Ok(Ok(stream)) => {
                let peer_name = sluice_transport::tls::peer_name(stream.get_ref().1.peer_certificates());
                let (reader, writer) = tokio::io::split(stream);
                self.serve(reader, writer, peer_name).await;
            }
            Ok(Err(err)) => tracing::info!(peer = %self.peer, "TLS handshake failed: {err}"),
            Err(_) => tracing::info!(peer = %self.peer, "no TLS handshake within {within:?}"),
        }
    }

    /// Serves one connection's frames once its transport (plain or TLS)
    /// is up; `peer_name` is the client certificate's CN, if any.
    async fn serve<Rd, Wr>(self, mut reader: Rd, writer: Wr, peer_name: Option<String>)
    where
        Rd: AsyncRead + Unpin,
        Wr: AsyncWrite + Unpin + Send + 'static,
    {
        let credits = self.config.credits.max(1);
        let (out_tx, out_rx) = mpsc::channel(credits as usize + 8);
        let drain =
            Drain { write_timeout: self.config.write_timeout, bytes_per_s_min: self.config.drain_bytes_per_s_min };
        let mut writer = tokio::spawn(write_loop(writer, out_rx, drain, self.peer));
        let semaphore = Arc::new(Semaphore::new(credits as usize));
        let granted = std::sync::Mutex::new(Vec::new());
        // The writer ends first when the client stops draining: then the
        // whole connection goes, not only its writing half.
        let mut writer_done = false;
        let outcome = tokio::select! {
            outcome = self.read_loop(&mut reader, &out_tx, &semaphore, &granted, &peer_name) => outcome,
            name = self.revoked(&granted) => Err(Fatal::Revoked(name)),
            _ = &mut writer => {
                writer_done = true;
                Err(Fatal::Io(std::io::ErrorKind::TimedOut.into()))
            }
        };
        match outcome {
            Ok(()) => tracing::debug!(peer = %self.peer, "client closed the connection"),
            Err(Fatal::Io(err)) => tracing::debug!(peer = %self.peer, "connection lost: {err}"),
            Err(fatal) => {
                tracing::info!(peer = %self.peer, "closing connection: {fatal}");
                let message = ControlMessage::Error { code: fatal.code(), message: fatal.to_string() };
                let _ = out_tx.send(Outgoing::Control(control_frame(&message))).await;
            }
        }
        drop(out_tx);
        if !writer_done {
            let _ = writer.await;
        }
    }

    /// Resolves when a grant this connection opened a dataset under is
    /// revoked, with that dataset's name. The read loop is dropped then:
    /// the session ends, whatever it was waiting for.
    async fn revoked(&self, granted: &std::sync::Mutex<Vec<(u64, String)>>) -> String {
        let mut revocations = self.resolver.revocations();
        loop {
            if revocations.changed().await.is_err() {
                // The control plane is gone; the node is stopping.
                return std::future::pending().await;
            }
            let held = granted.lock().map(|g| g.clone()).unwrap_or_default();
            if let Some((_, name)) = held.iter().find(|(grant, _)| !self.resolver.grant_live(*grant)) {
                return name.clone();
            }
        }
    }

    async fn read_loop<Rd: AsyncRead + Unpin>(
        &self,
        reader: &mut Rd,
        out: &mpsc::Sender<Outgoing>,
        semaphore: &Arc<Semaphore>,
        granted: &std::sync::Mutex<Vec<(u64, String)>>,
        peer_name: &Option<String>,
    ) -> Result<(), Fatal> {
        let mut handles: HashMap<u32, (DatasetSlot, Arc<DatasetCounters>, FlowLease)> = HashMap::new();
        let mut next_handle = 1u32;
        let mut greeted = false;
        let mut opened_once = false;
        let mut payload = Vec::new();
        let handshake_deadline = tokio::time::Instant::now() + self.config.handshake_timeout;
        let credits = self.config.credits.max(1) as usize;
        loop {
            // Until the first open, the handshake's deadline bounds every
            // frame (a slow trickle included); after it, an idle one.
            let deadline = if !opened_once {
                Some((handshake_deadline, "no Hello and Open within the handshake deadline"))
            } else if semaphore.available_permits() == credits {
                Some((tokio::time::Instant::now() + self.config.idle_timeout, "idle past the idle timeout"))
            } else {
                None
            };
            let frame = async {
                let Some(header) = read_frame_header(reader).await? else { return Ok(None) };
                let (kind, len) = wire::parse_frame_header(&header, false)?;
                payload.resize(len as usize, 0);
                reader.read_exact(&mut payload).await?;
                Ok::<_, Fatal>(Some(kind))
            };
            let kind = match deadline {
                Some((at, why)) => {
                    tokio::time::timeout_at(at, frame).await.map_err(|_| Fatal::Deadline(why.to_string()))??
                }
                None => frame.await?,
            };
            let Some(kind) = kind else { return Ok(()) };
            match kind {
                FrameKind::Control => {
                    let reply = match codec::decode(&payload)? {
                        ControlMessage::Hello { protocol, .. } if protocol == PROTOCOL => {
                            greeted = true;
                            ControlMessage::HelloOk {
                                node: self.config.node_name.clone(),
                                ranges_per_batch_max: self.config.ranges_per_batch_max,
                                batch_footprint_max_bytes: self.config.batch_footprint_max_bytes,
                                credits: self.config.credits.max(1),
                            }
                        }
                        ControlMessage::Hello { protocol, .. } => {
                            return Err(Fatal::Protocol(format!("client protocol {protocol}, node speaks {PROTOCOL}")))
                        }
                        _ if !greeted => return Err(Fatal::Protocol("the first message must be Hello".into())),
                        ControlMessage::Open { name, token } => {
                            if handles.len() >= HANDLES_PER_CONNECTION_MAX {
                                ControlMessage::Error {
                                    code: ErrorCode::Protocol,
                                    message: format!("more than {HANDLES_PER_CONNECTION_MAX} datasets open"),
                                }
                            } else {
                                match self
                                    .resolver
                                    .open(
                                        name.clone(),
                                        token.map(sluice_proto::codec::Secret::into_inner),
                                        peer_name.clone(),
                                    )
                                    .await
                                {
                                    Ok(Opened { slot, info, grant, counters }) => {
                                        let handle = next_handle;
                                        next_handle = next_handle.wrapping_add(1).max(1);
                                        let flow = self.plane.open_flow(peer_key(self.peer.ip()));
                                        handles.insert(handle, (slot, counters, flow));
                                        if let (Some(grant), Ok(mut granted)) = (grant, granted.lock()) {
                                            // Bounded by the handle limit; a re-open adds no entry.
                                            if !granted.iter().any(|(g, _)| *g == grant) {
                                                granted.push((grant, name));
                                            }
                                        }
                                        opened_once = true;
                                        ControlMessage::Opened { handle, info }
                                    }
                                    Err(err) => ControlMessage::Error { code: err.code, message: err.message },
                                }
                            }
                        }
                        ControlMessage::Close { handle } => {
                            handles.remove(&handle);
                            continue;
                        }
                        other => return Err(Fatal::Protocol(format!("unexpected message {other:?}"))),
                    };
                    out.send(Outgoing::Control(control_frame(&reply))).await.map_err(|_| closed())?;
                }
                FrameKind::BatchRequest => {
                    if !greeted {
                        return Err(Fatal::Protocol("the first message must be Hello".into()));
                    }
                    let (request, descriptors) = wire::parse_batch_request(&payload)?;
                    let batch_id = request.batch_id.get();
                    let range_count = request.range_count.get();
                    let permit = Arc::clone(semaphore).acquire_owned().await.map_err(|_| closed())?;
                    // The limits announced at Hello hold: a batch over them
                    // costs the core nothing.
                    let lens = descriptors.iter().map(|d| d.len.get());
                    if !batch_fits(lens, self.config.ranges_per_batch_max, self.config.batch_footprint_max_bytes) {
                        let counters = handles.get(&request.handle.get()).map(|(_, c, _)| Arc::clone(c));
                        let status = BatchStatus::TooLarge;
                        out.send(Outgoing::Failed { batch_id, range_count, status, permit, counters })
                            .await
                            .map_err(|_| closed())?;
                        continue;
                    }
                    let Some((slot, counters, flow)) = handles.get(&request.handle.get()) else {
                        let failed = Outgoing::Failed {
                            batch_id,
                            range_count,
                            status: BatchStatus::UnknownHandle,
                            permit,
                            counters: None,
                        };
                        out.send(failed).await.map_err(|_| closed())?;
                        continue;
                    };
                    let slot = *slot;
                    let ranges: Vec<ByteRange> = descriptors
                        .iter()
                        .map(|d| ByteRange { offset_bytes: d.offset.get(), len_bytes: d.len.get() })
                        .collect();
                    let tally = Tally { counters: Arc::clone(counters), submitted: std::time::Instant::now() };
                    let (reply, result) = oneshot::channel();
                    let outgoing = match self
                        .plane
                        .submit(ReadBatch {
                            dataset: slot,
                            client_id: self.client_id,
                            flow: flow.flow(),
                            ranges,
                            reply,
                        })
                        .await
                    {
                        Ok(()) => Outgoing::Batch { batch_id, range_count, result, permit, tally },
                        Err(_) => Outgoing::Failed {
                            batch_id,
                            range_count,
                            status: BatchStatus::ShuttingDown,
                            permit,
                            counters: Some(tally.counters),
                        },
                    };
                    out.send(outgoing).await.map_err(|_| closed())?;
                }
                FrameKind::RdmaBatchRequest => return Err(Fatal::Protocol("RDMA batch on a TCP connection".into())),
                FrameKind::BatchResponse | FrameKind::RdmaBatchResponse => {
                    return Err(Fatal::Protocol("clients do not send responses".into()))
                }
            }
        }
    }
}

fn closed() -> Fatal {
    Fatal::Io(std::io::ErrorKind::BrokenPipe.into())
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

type Pending =
    std::pin::Pin<Box<dyn Future<Output = (u64, u32, Result<BatchResult, BatchStatus>, OwnedSemaphorePermit)> + Send>>;

/// Writes control replies in order and batch responses as they complete.
async fn write_loop<Wr: AsyncWrite + Unpin>(
    mut writer: Wr,
    mut rx: mpsc::Receiver<Outgoing>,
    drain: Drain,
    peer: SocketAddr,
) {
    let timeout = drain.write_timeout;
    let mut pending: FuturesUnordered<Pending> = FuturesUnordered::new();
    let mut head = Vec::with_capacity(256);
    let mut open = true;
    while open || !pending.is_empty() {
        let written = tokio::select! {
            next = rx.recv(), if open => match next {
                None => { open = false; Ok(Ok(())) }
                Some(Outgoing::Control(frame)) => tokio::time::timeout(timeout, write_all_flushed(&mut writer, &frame)).await,
                Some(Outgoing::Failed { batch_id, range_count, status, permit, counters }) => {
                    if let Some(counters) = counters {
                        counters.record_failed_batch();
                    }
                    let statuses = vec![sluice_proto::RangeStatus::IoError as u8; range_count as usize];
                    wire::encode_batch_response_head(&mut head, batch_id, status, &statuses, 0);
                    let result = tokio::time::timeout(timeout, write_all_flushed(&mut writer, &head)).await;
                    drop(permit);
                    result
                }
                Some(Outgoing::Batch { batch_id, range_count, result, permit, tally }) => {
                    pending.push(Box::pin(async move {
                        let outcome = settle(result, &tally.counters, tally.submitted).await;
                        (batch_id, range_count, outcome, permit)
                    }));
                    Ok(Ok(()))
                }
            },
            Some((batch_id, range_count, outcome, permit)) = pending.next(), if !pending.is_empty() => {
                let result = match outcome {
                    Ok(batch) => {
                        let payload_bytes = batch.payload_bytes();
                        let statuses: Vec<u8> = batch.statuses().iter().map(|s| *s as u8).collect();
                        wire::encode_batch_response_head(&mut head, batch_id, BatchStatus::Ok, &statuses, payload_bytes);
                        let mut slices = Vec::with_capacity(1 + batch.statuses().len());
                        slices.push(IoSlice::new(&head));
                        slices.extend(batch.io_slices());
                        let within = drain.within(head.len() as u64 + payload_bytes);
                        tokio::time::timeout(within, write_all_vectored(&mut writer, &mut slices)).await
                    }
                    Err(status) => {
                        let statuses = vec![sluice_proto::RangeStatus::IoError as u8; range_count as usize];
                        wire::encode_batch_response_head(&mut head, batch_id, status, &statuses, 0);
                        tokio::time::timeout(timeout, write_all_flushed(&mut writer, &head)).await
                    }
                };
                drop(permit);
                result
            }
        };
        match written {
            Ok(Ok(())) => {}
            Ok(Err(err)) => {
                tracing::debug!(%peer, "writing response: {err}");
                break;
            }
            Err(_) => {
                tracing::info!(%peer, "client did not drain a response in time (at most {timeout:?}); dropping it");
                break;
            }
        }
    }
    // Remaining results drop here, which returns their DMA slots.
    let _ = writer.shutdown().await;
}
