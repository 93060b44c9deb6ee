//! Client side of the TCP transport: one task reads responses and places each
//! range's bytes straight into the destination buffer its batch named.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sluice_proto::RangeStatus;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, BufReader};
use tokio::net::TcpStream;
use tokio::sync::{oneshot, Semaphore};
use zerocopy::FromBytes;

use super::low_water::{LowWaterRead, Owed};
use crate::frame::{control_frame, read_frame_header, write_all_flushed};
use crate::poll::{polling, PollWindow, POLL_WINDOW_DEFAULT};
pub use crate::session::NodeLimits;
use crate::session::{self, open_request, opened};
use sluice_proto::codec::{self, ControlMessage, ErrorCode, OpenInfo};
use sluice_proto::wire::{self, BatchResponseHeader, BatchStatus, FrameHeader, FrameKind, RangeDescriptor};

/// The buffer a batch's bytes land in. Shared by the sub-batches of one
/// caller batch; only the connection's reader task writes it.
pub type ReadSink = Arc<tokio::sync::Mutex<Vec<u8>>>;

#[derive(Debug, thiserror::Error)]
pub enum TransportError {
    #[error("connecting to {addr}: {source}")]
    Connect {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("TLS with the data port at {addr}: {message}")]
    Tls { addr: SocketAddr, message: String },
    #[error("connection: {0}")]
    Io(#[from] std::io::Error),
    #[error("{0}")]
    Frame(#[from] wire::FrameError),
    #[error("{0}")]
    Codec(#[from] codec::CodecError),
    #[error("node refused: {message} ({code:?})")]
    Refused { code: ErrorCode, message: String },
    #[error("batch failed on the node: {0:?}")]
    Batch(BatchStatus),
    #[error("connection lost: {0}")]
    Lost(String),
    #[error("protocol: {0}")]
    Protocol(String),
    #[error("RDMA: {0}")]
    Rdma(String),
}

struct Pending {
    dests: Vec<(u64, u32)>,
    sink: ReadSink,
    done: oneshot::Sender<Result<Vec<RangeStatus>, TransportError>>,
}

impl Pending {
    /// Gives the batch's outcome to its caller, having first let go of the
    /// sink: the caller takes its buffer back by unwrapping the sink's
    /// `Arc`, which must then be the last one, or it would copy the whole
    /// buffer to get its bytes out.
    fn finish(self, outcome: Result<Vec<RangeStatus>, TransportError>) {
        let Self { dests, sink, done } = self;
        drop((dests, sink));
        let _ = done.send(outcome);
    }
}

#[derive(Default)]
struct Shared {
    pending: HashMap<u64, Pending>,
    control_reply: Option<oneshot::Sender<ControlMessage>>,
    /// Set once the connection is gone: why.
    lost: Option<String>,
}

/// The writing half of a connection, plain or TLS.
type Writer = Box<dyn AsyncWrite + Send + Unpin>;

/// How to reach a node whose data port speaks TLS.
#[derive(Clone)]
pub struct TlsConnect {
    pub config: Arc<rustls::ClientConfig>,
    /// The name the node's certificate must carry (its host or IP).
    pub server_name: rustls::pki_types::ServerName<'static>,
}

/// One connection to a node's data plane.
pub struct TcpClient {
    writer: tokio::sync::Mutex<Writer>,
    control: tokio::sync::Mutex<()>,
    shared: Arc<Mutex<Shared>>,
    credits: Arc<Semaphore>,
    next_batch_id: AtomicU64,
    limits: NodeLimits,
    reader: tokio::task::JoinHandle<()>,
}

impl TcpClient {
    /// Connects and shakes hands.
    pub async fn connect(addr: SocketAddr, client_name: &str) -> Result<Self, TransportError> {
        Self::connect_from(addr, None, client_name).await
    }

    /// Connects from local address `source` (any port), or the one the
    /// route picks when `None`, and shakes hands.
    pub async fn connect_from(
        addr: SocketAddr,
        source: Option<std::net::IpAddr>,
        client_name: &str,
    ) -> Result<Self, TransportError> {
        Self::connect_secured(addr, source, client_name, None, POLL_WINDOW_DEFAULT).await
    }

    /// As [`TcpClient::connect_from`], over TLS when `tls` is given; the
    /// connection polls for `poll_window` after each response before its
    /// thread may sleep (see [`crate::poll`]).
    pub async fn connect_secured(
        addr: SocketAddr,
        source: Option<std::net::IpAddr>,
        client_name: &str,
        tls: Option<&TlsConnect>,
        poll_window: Duration,
    ) -> Result<Self, TransportError> {
        let connect_error = |source| TransportError::Connect { addr, source };
        let stream = match source {
            None => TcpStream::connect(addr).await.map_err(connect_error)?,
            Some(local) => {
                let socket =
                    if addr.is_ipv4() { tokio::net::TcpSocket::new_v4() } else { tokio::net::TcpSocket::new_v6() };
                let socket = socket.map_err(connect_error)?;
                socket.bind(SocketAddr::new(local, 0)).map_err(connect_error)?;
                socket.connect(addr).await.map_err(connect_error)?
            }
        };
        stream.set_nodelay(true)?;
        let shared = Arc::new(Mutex::new(Shared::default()));
        let poll = PollWindow::new(poll_window);
        let (reader, writer): (_, Writer) = match tls {
            None => {
                let (reader, writer) = stream.into_split();
                (tokio::spawn(read_loop(LowWaterRead::new(reader), Arc::clone(&shared), poll)), Box::new(writer))
            }
            Some(tls) => {
                let connector = tokio_rustls::TlsConnector::from(Arc::clone(&tls.config));
                let stream = connector.connect(tls.server_name.clone(), stream).await.map_err(|source| {
                    TransportError::Tls { addr, message: crate::tls::handshake_error_words(&source) }
                })?;
                let (reader, writer) = tokio::io::split(stream);
                (tokio::spawn(read_loop(reader, Arc::clone(&shared), poll)), Box::new(writer))
            }
        };
        let mut client = Self {
            writer: tokio::sync::Mutex::new(writer),
            control: tokio::sync::Mutex::new(()),
            shared,
            credits: Arc::new(Semaphore::new(1)),
            next_batch_id: AtomicU64::new(1),
            limits: NodeLimits::BEFORE_HELLO,
            reader,
        };
        client.limits = session::limits(client.control_request(&session::hello(client_name)).await?, u32::MAX)?;
        client.credits = Arc::new(Semaphore::new(client.limits.credits as usize));
        Ok(client)
    }

    pub fn limits(&self) -> NodeLimits {
        self.limits
    }

    /// Opens a dataset by name; returns its handle on this connection.
    pub async fn open(&self, name: &str, token: Option<String>) -> Result<(u32, OpenInfo), TransportError> {
        opened(self.control_request(&open_request(name, token)).await?)
    }

    pub async fn close(&self, handle: u32) -> Result<(), TransportError> {
        let frame = control_frame(&ControlMessage::Close { handle });
        write_all_flushed(&mut *self.writer.lock().await, &frame).await?;
        Ok(())
    }

    /// One request, one reply; requests are serialized.
    async fn control_request(&self, message: &ControlMessage) -> Result<ControlMessage, TransportError> {
        let _serial = self.control.lock().await;
        let (tx, rx) = oneshot::channel();
        {
            let mut shared = self.shared.lock().map_err(|_| poisoned())?;
            if let Some(why) = &shared.lost {
                return Err(TransportError::Lost(why.clone()));
            }
            shared.control_reply = Some(tx);
        }
        write_all_flushed(&mut *self.writer.lock().await, &control_frame(message)).await?;
        session::reply(rx.await.map_err(|_| self.lost_error())?)
    }

    fn lost_error(&self) -> TransportError {
        let why = self.shared.lock().ok().and_then(|s| s.lost.clone());
        TransportError::Lost(why.unwrap_or_else(|| "connection closed".into()))
    }

    /// Reads one wire batch (within the node's limits) into `sink` at each
    /// range's `dest`; waits for a credit first.
    pub async fn read_batch(
        &self,
        handle: u32,
        ranges: &[RangeDescriptor],
        sink: ReadSink,
    ) -> Result<Vec<RangeStatus>, TransportError> {
        self.limits.check_batch(ranges.len())?;
        let _credit = self.credits.acquire().await.map_err(|_| self.lost_error())?;
        let batch_id = self.next_batch_id.fetch_add(1, Ordering::Relaxed);
        let (done, rx) = oneshot::channel();
        let dests = ranges.iter().map(|r| (r.dest.get(), r.len.get())).collect();
        {
            let mut shared = self.shared.lock().map_err(|_| poisoned())?;
            if let Some(why) = &shared.lost {
                return Err(TransportError::Lost(why.clone()));
            }
            shared.pending.insert(batch_id, Pending { dests, sink, done });
        }
        let mut frame = Vec::with_capacity(FrameHeader::SIZE + 16 + ranges.len() * RangeDescriptor::SIZE);
        wire::encode_batch_request(&mut frame, batch_id, handle, ranges);
        let sent = write_all_flushed(&mut *self.writer.lock().await, &frame).await;
        if let Err(err) = sent {
            if let Ok(mut shared) = self.shared.lock() {
                shared.pending.remove(&batch_id);
            }
            return Err(err.into());
        }
        rx.await.map_err(|_| self.lost_error())?
    }
}

impl Drop for TcpClient {
    fn drop(&mut self) {
        self.reader.abort();
    }
}

fn poisoned() -> TransportError {
    TransportError::Protocol("client state lock poisoned".into())
}

/// The receive buffer: a response's head, statuses and small ranges come
/// out of one `recv` together (a batch of 32 × 4 KiB reads took 36 before,
/// one per range); a range at least this large is read straight into its
/// destination.
const RECEIVE_BUFFER_BYTES: usize = 128 << 10;

/// Reads frames until the connection ends, then fails whatever is pending.
async fn read_loop<Rd: AsyncRead + Owed + Unpin>(reader: Rd, shared: Arc<Mutex<Shared>>, poll: PollWindow) {
    let mut reader = BufReader::with_capacity(RECEIVE_BUFFER_BYTES, reader);
    let why = match read_frames(&mut reader, &shared, poll).await {
        Ok(()) => "node closed the connection".to_string(),
        Err(err) => err.to_string(),
    };
    let Ok(mut shared) = shared.lock() else { return };
    shared.lost = Some(why.clone());
    shared.control_reply = None;
    for (_, pending) in shared.pending.drain() {
        pending.finish(Err(TransportError::Lost(why.clone())));
    }
}

async fn read_frames<Rd: AsyncRead + Owed + Unpin>(
    reader: &mut BufReader<Rd>,
    shared: &Mutex<Shared>,
    mut poll: PollWindow,
) -> Result<(), TransportError> {
    let mut statuses = Vec::new();
    loop {
        let until = poll.open_until(Instant::now());
        let Some(header) = polling(read_frame_header(reader), until).await? else { return Ok(()) };
        let (kind, len) = wire::parse_frame_header(&header, true)?;
        match kind {
            FrameKind::Control => {
                let mut payload = vec![0u8; len as usize];
                reader.read_exact(&mut payload).await?;
                let message = codec::decode(&payload)?;
                let waiter = shared.lock().map_err(|_| poisoned())?.control_reply.take();
                let Some(waiter) = waiter else { return Err(session::unsolicited(message)) };
                let _ = waiter.send(message);
            }
            FrameKind::BatchResponse => {
                read_response(reader, shared, len, &mut statuses).await?;
                poll.heard(Instant::now());
            }
            FrameKind::BatchRequest | FrameKind::RdmaBatchRequest | FrameKind::RdmaBatchResponse => {
                return Err(TransportError::Protocol(format!("node sent a {kind:?} frame on TCP")))
            }
        }
    }
}

async fn read_response<Rd: AsyncRead + Owed + Unpin>(
    reader: &mut BufReader<Rd>,
    shared: &Mutex<Shared>,
    payload_len: u32,
    statuses: &mut Vec<u8>,
) -> Result<(), TransportError> {
    let mut head = [0u8; BatchResponseHeader::SIZE];
    reader.read_exact(&mut head).await?;
    let head = BatchResponseHeader::read_from_bytes(&head).map_err(|_| wire::FrameError::Short)?;
    let batch_id = head.batch_id.get();
    let padded = wire::status_bytes_padded(head.range_count.get());
    let data_len = head.data_len.get();
    if u64::from(payload_len) != BatchResponseHeader::SIZE as u64 + padded as u64 + data_len {
        return Err(TransportError::Protocol(format!("response {batch_id} has inconsistent lengths")));
    }
    let pending = shared.lock().map_err(|_| poisoned())?.pending.remove(&batch_id);
    let Some(pending) = pending else {
        return Err(TransportError::Protocol(format!("response for unknown batch {batch_id}")));
    };
    statuses.resize(padded, 0);
    reader.read_exact(statuses).await?;
    let decoded = match session::batch_outcome(&head, statuses, pending.dests.len())? {
        Ok(decoded) => decoded,
        Err(_) if data_len != 0 => return Err(TransportError::Protocol("failed batch carries data".into())),
        Err(status) => {
            pending.finish(Err(TransportError::Batch(status)));
            return Ok(());
        }
    };
    let expected: u64 = (decoded.iter().zip(&pending.dests))
        .filter(|(status, _)| **status == RangeStatus::Ok)
        .map(|(_, (_, len))| u64::from(*len))
        .sum();
    if expected != data_len {
        return Err(TransportError::Protocol(format!("response {batch_id}: {data_len} bytes for {expected}")));
    }
    {
        let mut sink = pending.sink.lock().await;
        let buffered = reader.buffer().len() as u64;
        reader.get_mut().owe(data_len.saturating_sub(buffered));
        for (index, status) in decoded.iter().enumerate() {
            if *status != RangeStatus::Ok {
                continue;
            }
            let (dest, len) = pending.dests[index];
            let dest = dest as usize;
            let Some(target) = sink.get_mut(dest..dest + len as usize) else {
                return Err(TransportError::Protocol("destination outside the buffer".into()));
            };
            reader.read_exact(target).await?;
        }
        reader.get_mut().owe(0);
    }
    pending.finish(Ok(decoded));
    Ok(())
}
