//! The training-host library: find a node through its control API, open a
//! dataset by name, and read batches of `(offset, len, dest)` ranges into
//! your own buffer in one call.
//!
//! It depends on `sluice-proto` and `sluice-transport` alone of sluice's
//! crates, never on the node's (data plane, control plane, servers): the
//! Python wheel links it, and `scripts/check-layout.sh` fails if it ever
//! links the node.
//!
//! ```no_run
//! # async fn demo() -> Result<(), sluice_client::ClientError> {
//! let client = sluice_client::Client::connect("http://127.0.0.1:7070").await?;
//! let dataset = client.open("wiki-tokens").await?;
//! let mut buf = vec![0u8; 8192];
//! let ranges = [sluice_client::ReadRange { offset: 0, len: 4096, dest: 0 },
//!               sluice_client::ReadRange { offset: 1 << 20, len: 4096, dest: 4096 }];
//! let statuses = dataset.read_batch(&ranges, &mut buf).await?;
//! # Ok(()) }
//! ```

pub mod blocking;
pub mod http;
pub mod loader;
pub use sluice_sampler as sampler;
mod transport;

use std::sync::Arc;

use futures_util::future::join_all;
use http::ControlHttp;
use sluice_proto::geometry::{footprint_bound_bytes, whole_chunks_within};
use sluice_proto::wire::RangeDescriptor;
pub use sluice_proto::NodeInfo;
use sluice_proto::OpenInfo;
/// What [`ClientError::Transport`] carries.
pub use sluice_transport::tcp::TransportError;
pub use sluice_transport::tls::ClientTlsFiles;
use zerocopy_le::{U32, U64};

pub use sluice_proto::{RangeStatus, CHUNK_SIZE_BYTES};
use transport::{Landing, Transport};
pub use transport::{ReadBuffer, TransportChoice, SOURCE_ADDR_ENV, TRANSPORT_ENV};

mod zerocopy_le {
    pub use sluice_proto::wire::le::{U32, U64};
}

/// Ranges longer than this travel as several pieces, so any range fits a
/// wire batch.
const RANGE_PIECE_BYTES_MAX: u32 = 4 << 20;

/// One range of a batch: `len` bytes at dataset byte `offset`, placed at
/// `dest` in the caller's buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReadRange {
    pub offset: u64,
    pub len: u32,
    pub dest: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The control API refused or failed; `status` is its HTTP status
    /// when it answered at all.
    #[error("control API {endpoint}: {message}")]
    Control { endpoint: String, message: String, status: Option<u16> },
    #[error("{0}")]
    Transport(#[from] TransportError),
    #[error("range {index} ({len} bytes at dest {dest}) does not fit the {buf_len}-byte buffer")]
    Destination { index: usize, dest: u64, len: u32, buf_len: usize },
    #[error("node's data address {0:?} is not host:port")]
    BadAddress(String),
    #[error("RDMA unavailable: {0}")]
    Rdma(String),
    /// An environment variable that sets how the client behaves holds
    /// something it cannot use.
    #[error("{0}")]
    Setting(String),
}

#[derive(Clone, Default)]
pub struct OpenOptions {
    /// Check the CRC32C of every whole 64 KiB chunk a read covers against
    /// the dataset's manifest; a mismatch fails that range.
    pub verify_chunks: bool,
    /// The grant's token (`sluicectl grant create`); when `None`, the
    /// `SLUICE_TOKEN` environment variable, if set.
    pub token: Option<String>,
}

impl std::fmt::Debug for OpenOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OpenOptions")
            .field("verify_chunks", &self.verify_chunks)
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .finish()
    }
}

/// Where a job finds its grant's token when the code names none.
pub const TOKEN_ENV: &str = "SLUICE_TOKEN";

/// A connection to one node.
pub struct Client {
    /// Its control API, with the trust this client was given.
    http: ControlHttp,
    tls_files: ClientTlsFiles,
    node: NodeInfo,
    transport: Arc<Transport>,
    transport_reason: String,
    choice: TransportChoice,
}

/// Fetches a whole binary body off the async threads.
async fn http_get_bytes(http: &ControlHttp, path: String) -> Result<Vec<u8>, ClientError> {
    let http = http.clone();
    let endpoint = http.endpoint().to_string();
    tokio::task::spawn_blocking(move || http.get_bytes(&path).map_err(|e| control_error(http.endpoint(), e)))
        .await
        .map_err(|e| ClientError::Control { endpoint, message: e.to_string(), status: None })?
}

fn control_error(endpoint: &str, failure: http::ApiFailure) -> ClientError {
    ClientError::Control { endpoint: endpoint.to_string(), status: failure.status, message: failure.to_string() }
}

impl Client {
    /// Asks the control API at `endpoint` (e.g. `http://127.0.0.1:7070`) for
    /// the node's data addresses and connects over the transport that
    /// `SLUICE_TRANSPORT` names (`auto`, `rdma`, `tcp`; `auto` when unset).
    pub async fn connect(endpoint: &str) -> Result<Self, ClientError> {
        let choice = match std::env::var(TRANSPORT_ENV) {
            Ok(value) if !value.is_empty() => value.parse().map_err(ClientError::Rdma)?,
            _ => TransportChoice::Auto,
        };
        Self::connect_with(endpoint, choice).await
    }

    /// As [`Client::connect`], with the transport chosen in code. TLS
    /// trust (for `https://` endpoints and TLS data ports) comes from
    /// `SLUICE_CA_FILE`, `SLUICE_CERT_FILE` and `SLUICE_KEY_FILE`.
    pub async fn connect_with(endpoint: &str, choice: TransportChoice) -> Result<Self, ClientError> {
        let tls_files = http::tls_files_from_env().map_err(|message| ClientError::Control {
            endpoint: endpoint.to_string(),
            message,
            status: None,
        })?;
        Self::connect_tls(endpoint, choice, tls_files).await
    }

    /// As [`Client::connect_with`], with the TLS files named in code.
    pub async fn connect_tls(
        endpoint: &str,
        choice: TransportChoice,
        tls_files: ClientTlsFiles,
    ) -> Result<Self, ClientError> {
        let endpoint = endpoint.trim_end_matches('/').to_string();
        let http = ControlHttp::new(&endpoint, &tls_files).map_err(|e| control_error(&endpoint, e))?;
        let asking = http.clone();
        let node: NodeInfo = tokio::task::spawn_blocking(move || {
            asking.get_json("/v1/node").map_err(|e| control_error(asking.endpoint(), e))
        })
        .await
        .map_err(|e| ClientError::Control {
            endpoint: endpoint.clone(),
            message: e.to_string(),
            status: None,
        })??;
        let name = format!("sluice-client/{} pid {}", env!("CARGO_PKG_VERSION"), std::process::id());
        let data_tls = if node.data_tls {
            Some(transport::data_tls(&node, &tls_files).map_err(|e| control_error(&endpoint, e))?)
        } else {
            None
        };
        let (transport, transport_reason) = Transport::connect(&node, choice, &name, data_tls.as_ref()).await?;
        tracing::debug!("connected to {} over {} ({transport_reason})", node.name, transport.name());
        Ok(Self { http, tls_files, node, transport: Arc::new(transport), transport_reason, choice })
    }

    pub fn node(&self) -> &NodeInfo {
        &self.node
    }

    /// The transport in use: `rdma` or `tcp`.
    pub fn transport(&self) -> &'static str {
        self.transport.name()
    }

    /// Why that transport: the device that reaches the node, or why RDMA
    /// was not possible.
    pub fn transport_reason(&self) -> &str {
        &self.transport_reason
    }

    /// A destination buffer of `len` bytes to reuse across reads; on RDMA
    /// it is registered with the device once, so reads into it
    /// ([`Dataset::read_into`]) land with no per-read registration.
    pub fn buffer(&self, len: usize) -> Result<ReadBuffer, ClientError> {
        ReadBuffer::for_transport(&self.transport, len)
    }

    pub async fn open(&self, name: &str) -> Result<Dataset, ClientError> {
        self.open_with(name, OpenOptions::default()).await
    }

    pub async fn open_with(&self, name: &str, options: OpenOptions) -> Result<Dataset, ClientError> {
        let token = options.token.or_else(|| std::env::var(TOKEN_ENV).ok().filter(|t| !t.is_empty()));
        let (handle, info) = self.transport.open(name, token.clone()).await?;
        let http = self.http.clone().with_bearer(token.as_deref());
        let chunk_crcs = if options.verify_chunks {
            let bytes = http_get_bytes(&http, format!("/v1/datasets/{name}/chunks")).await?;
            Some(bytes.chunks_exact(4).map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect())
        } else {
            None
        };
        let session = Session { transport: Arc::clone(&self.transport), handle, http };
        Ok(Dataset {
            session: std::sync::RwLock::new(Arc::new(session)),
            info,
            chunk_crcs,
            name: name.to_string(),
            token,
            choice: self.choice,
            tls_files: self.tls_files.clone(),
            failovers: std::sync::atomic::AtomicU64::new(0),
        })
    }
}

/// One node's connection and the dataset's handle on it.
struct Session {
    transport: Arc<Transport>,
    handle: u32,
    /// The node's control API, with this dataset's grant as its bearer.
    http: ControlHttp,
}

impl Session {
    fn endpoint(&self) -> &str {
        self.http.endpoint()
    }
}

/// An open dataset. In a cluster it knows every live node holding a copy
/// (from the open) and, when its node or the link to it dies, reopens on
/// the next and repeats the read: reads are idempotent.
pub struct Dataset {
    session: std::sync::RwLock<Arc<Session>>,
    info: OpenInfo,
    chunk_crcs: Option<Arc<[u32]>>,
    name: String,
    token: Option<String>,
    choice: TransportChoice,
    tls_files: ClientTlsFiles,
    failovers: std::sync::atomic::AtomicU64,
}

/// Whether an error means the node or the link is gone (another copy may
/// answer), not that the node refused.
fn is_connection_loss(err: &ClientError) -> bool {
    matches!(
        err,
        ClientError::Transport(
            TransportError::Connect { .. } | TransportError::Io(_) | TransportError::Lost(_) | TransportError::Rdma(_)
        )
    )
}

impl Dataset {
    fn session(&self) -> Arc<Session> {
        match self.session.read() {
            Ok(session) => Arc::clone(&session),
            Err(poisoned) => Arc::clone(&poisoned.into_inner()),
        }
    }

    /// The control endpoint of the node serving this dataset now.
    pub fn endpoint(&self) -> String {
        self.session().endpoint().to_string()
    }

    /// Times this dataset moved to another node after losing one.
    pub fn failovers(&self) -> u64 {
        self.failovers.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Moves to the next node holding a copy after `failed` was lost, unless
    /// a concurrent read already did.
    async fn fail_over(&self, failed: &Arc<Session>, cause: &ClientError) -> Result<(), ClientError> {
        if !Arc::ptr_eq(&self.session(), failed) {
            return Ok(());
        }
        let replicas = &self.info.replicas;
        let start = replicas.iter().position(|e| *e == failed.endpoint()).map_or(0, |i| i + 1);
        let mut last = None;
        for endpoint in replicas.iter().cycle().skip(start).take(replicas.len()) {
            if *endpoint == failed.endpoint() {
                continue;
            }
            let reopened = async {
                let client = Client::connect_tls(endpoint, self.choice, self.tls_files.clone()).await?;
                let (handle, info) = client.transport.open(&self.name, self.token.clone()).await?;
                if info.content_hash != self.info.content_hash {
                    return Err(ClientError::Control {
                        endpoint: endpoint.clone(),
                        message: format!("serves other content for {} ({})", self.name, info.content_hash),
                        status: None,
                    });
                }
                let http = client.http.clone().with_bearer(self.token.as_deref());
                Ok(Session { transport: client.transport, handle, http })
            };
            match reopened.await {
                Ok(session) => {
                    tracing::warn!("{}: lost {} ({cause}); reading from {endpoint}", self.name, failed.endpoint());
                    if let Ok(mut current) = self.session.write() {
                        if Arc::ptr_eq(&current, failed) {
                            *current = Arc::new(session);
                            self.failovers.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        }
                    }
                    return Ok(());
                }
                Err(err) => last = Some(err),
            }
        }
        Err(last.unwrap_or_else(|| ClientError::Control {
            endpoint: failed.endpoint().to_string(),
            message: format!("lost ({cause}) and no other node holds {}", self.name),
            status: None,
        }))
    }

    pub fn info(&self) -> &OpenInfo {
        &self.info
    }

    pub fn len_bytes(&self) -> u64 {
        self.info.length_bytes
    }

    /// A reusable destination buffer for this dataset's connection; see
    /// [`Client::buffer`].
    pub fn buffer(&self, len: usize) -> Result<ReadBuffer, ClientError> {
        ReadBuffer::for_transport(&self.session().transport, len)
    }

    /// The transport this dataset is read over.
    pub fn transport(&self) -> &'static str {
        self.session().transport.name()
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// Tells the node which byte ranges coming steps will read, so that a
    /// source-backed dataset fills them ahead of the reads (an ingested
    /// dataset ignores it). Sent in the background; a hint that fails is
    /// only logged: the reads fill what is missing anyway.
    pub fn prefetch_hint(&self, ranges: Vec<(u64, u32)>) {
        if ranges.is_empty() {
            return;
        }
        let http = self.session().http.clone();
        let path = format!("/v1/datasets/{}/prefetch", self.name);
        let body: Vec<u8> =
            ranges.iter().flat_map(|&(o, l)| o.to_le_bytes().into_iter().chain(l.to_le_bytes())).collect();
        tokio::task::spawn_blocking(move || {
            let sent = http.request("POST", &path).set("Content-Type", "application/octet-stream").send_bytes(&body);
            if let Err(err) = http.call(sent) {
                tracing::debug!("prefetch hint to {}: {err:?}", http.endpoint());
            }
        });
    }

    /// The `(offset, len)` of every sample of a `records`, `wds` or `mds` dataset,
    /// from the control API (16 bytes per sample, held by the caller).
    pub async fn record_index(&self) -> Result<Vec<(u64, u64)>, ClientError> {
        let bytes = http_get_bytes(&self.session().http, format!("/v1/datasets/{}/index", self.name)).await?;
        sluice_proto::sample_index::decode(&bytes).map_err(|e| ClientError::Control {
            endpoint: format!("/v1/datasets/{}/index", self.name),
            message: e.to_string(),
            status: None,
        })
    }

    /// Reads every range into `buf` at its `dest`, in as few round trips as
    /// the node's limits allow (batches are split and pipelined). Returns a
    /// status per range; a bad range fails alone.
    ///
    /// `buf` is moved into the transport while the read runs and put back
    /// before this returns, so the bytes land in it without a copy (on RDMA
    /// it is registered for this read; [`Dataset::read_into`] with a
    /// [`Client::buffer`] registers once). If the future is dropped early,
    /// `buf` is left empty.
    pub async fn read_batch(&self, ranges: &[ReadRange], buf: &mut Vec<u8>) -> Result<Vec<RangeStatus>, ClientError> {
        let mut landing = Landing::Plain(std::mem::take(buf));
        let result = self.read_landing(ranges, &mut landing).await;
        *buf = landing.into_vec();
        result
    }

    /// As [`Dataset::read_batch`], into a reusable buffer (registered once
    /// on RDMA when made by [`Client::buffer`]).
    pub async fn read_into(&self, ranges: &[ReadRange], buf: &mut ReadBuffer) -> Result<Vec<RangeStatus>, ClientError> {
        let mut landing = buf.landing.take();
        let result = self.read_landing(ranges, &mut landing).await;
        buf.landing = landing;
        result
    }

    async fn read_landing(&self, ranges: &[ReadRange], landing: &mut Landing) -> Result<Vec<RangeStatus>, ClientError> {
        let buf_len = landing.bytes().len();
        for (index, r) in ranges.iter().enumerate() {
            if r.dest.checked_add(u64::from(r.len)).is_none_or(|end| end > buf_len as u64) {
                return Err(ClientError::Destination { index, dest: r.dest, len: r.len, buf_len });
            }
        }
        let mut attempts = 0;
        loop {
            let session = self.session();
            match self.read_once(&session, ranges, landing).await {
                Err(err)
                    if is_connection_loss(&err)
                        && attempts < self.info.replicas.len()
                        && landing.bytes().len() == buf_len =>
                {
                    attempts += 1;
                    self.fail_over(&session, &err).await?;
                }
                result => return result,
            }
        }
    }

    async fn read_once(
        &self,
        session: &Session,
        ranges: &[ReadRange],
        landing: &mut Landing,
    ) -> Result<Vec<RangeStatus>, ClientError> {
        let batches = split_batches(ranges, session.transport.limits());
        let results = self.transfer(session, &batches, landing).await?;
        let mut statuses = vec![RangeStatus::Ok; ranges.len()];
        for (batch, result) in batches.iter().zip(results) {
            let piece_statuses = result?;
            for ((index, _), status) in batch.iter().zip(piece_statuses) {
                if statuses[*index] == RangeStatus::Ok {
                    statuses[*index] = status;
                }
            }
        }
        if let Some(crcs) = &self.chunk_crcs {
            verify_chunks(crcs, self.info.length_bytes, ranges, landing.bytes(), &mut statuses);
        }
        Ok(statuses)
    }

    /// Runs the wire batches concurrently, landing their bytes in `landing`.
    async fn transfer(
        &self,
        session: &Session,
        batches: &[Vec<(usize, RangeDescriptor)>],
        landing: &mut Landing,
    ) -> Result<Vec<Result<Vec<RangeStatus>, TransportError>>, ClientError> {
        let descriptors: Vec<Vec<RangeDescriptor>> =
            batches.iter().map(|batch| batch.iter().map(|(_, d)| *d).collect()).collect();
        match &*session.transport {
            Transport::Tcp(tcp) => {
                let sink = Arc::new(tokio::sync::Mutex::new(landing.take().into_vec()));
                let results =
                    join_all(descriptors.iter().map(|d| tcp.read_batch(session.handle, d, Arc::clone(&sink)))).await;
                // Every wire batch let go of the sink before it finished
                // (`Pending::finish`), so this is the last `Arc` and the
                // buffer comes back without a copy.
                *landing = Landing::Plain(match Arc::try_unwrap(sink) {
                    Ok(mutex) => mutex.into_inner(),
                    Err(shared) => {
                        tracing::warn!("a finished read still held the buffer; copying it out");
                        shared.lock().await.clone()
                    }
                });
                Ok(results)
            }
            #[cfg(feature = "rdma")]
            Transport::Rdma(rdma) => {
                use sluice_transport::rc::RegisteredBuffer;
                let registered = match landing.take() {
                    Landing::Registered(buffer) if buffer.belongs_to(rdma) => buffer,
                    other => match RegisteredBuffer::new(rdma, other.into_vec()) {
                        Ok(buffer) => buffer,
                        Err((err, bytes)) => {
                            *landing = Landing::Plain(bytes);
                            return Err(err.into());
                        }
                    },
                };
                let shared = registered.shared();
                let results = join_all(descriptors.iter().map(|d| rdma.read_batch(session.handle, d, &shared))).await;
                match shared.reclaim() {
                    Ok(buffer) => *landing = Landing::Registered(buffer),
                    Err(_) => return Err(TransportError::Lost("a read still holds the buffer".into()).into()),
                }
                Ok(results)
            }
        }
    }

    pub async fn close(self) -> Result<(), ClientError> {
        let session = self.session();
        Ok(session.transport.close(session.handle).await?)
    }
}

/// Cuts ranges into wire batches within the node's limits, ranges longer
/// than a piece into several pieces: `(original range index, descriptor)`.
fn split_batches(
    ranges: &[ReadRange],
    limits: sluice_transport::tcp::NodeLimits,
) -> Vec<Vec<(usize, RangeDescriptor)>> {
    let mut batches: Vec<Vec<(usize, RangeDescriptor)>> = Vec::new();
    let mut current = Vec::new();
    let mut footprint = 0u64;
    for (index, range) in ranges.iter().enumerate() {
        let mut done = 0u32;
        loop {
            let len = (range.len - done).min(RANGE_PIECE_BYTES_MAX);
            let need = footprint_bound_bytes(len);
            if current.len() as u32 >= limits.ranges_per_batch_max
                || (!current.is_empty() && footprint + need > limits.batch_footprint_max_bytes)
            {
                batches.push(std::mem::take(&mut current));
                footprint = 0;
            }
            current.push((
                index,
                RangeDescriptor {
                    offset: U64::new(range.offset.saturating_add(u64::from(done))),
                    len: U32::new(len),
                    reserved: U32::new(0),
                    dest: U64::new(range.dest + u64::from(done)),
                },
            ));
            footprint += need;
            done += len;
            if done >= range.len {
                break;
            }
        }
    }
    if !current.is_empty() {
        batches.push(current);
    }
    batches
}

/// Marks ranges whose whole chunks do not match the manifest. The CRC32C
/// is `crc-fast`'s, as the node's block checks are: every verified byte a
/// training host reads passes through it.
fn verify_chunks(crcs: &[u32], length_bytes: u64, ranges: &[ReadRange], buf: &[u8], statuses: &mut [RangeStatus]) {
    for (index, range) in ranges.iter().enumerate() {
        if statuses[index] != RangeStatus::Ok {
            continue;
        }
        for (chunk, start, chunk_end) in whole_chunks_within(range.offset, u64::from(range.len), length_bytes) {
            let at = (range.dest + start - range.offset) as usize;
            let bytes = &buf[at..at + (chunk_end - start) as usize];
            if crcs.get(chunk as usize) != Some(&crc_fast::crc32_iscsi(bytes)) {
                statuses[index] = RangeStatus::ChecksumMismatch;
                break;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_proto::CHUNK_SIZE_BYTES;

    /// Ranges are checked chunk by chunk against CRCs made by the `crc32c`
    /// crate (as the catalog's are): whole chunks that match pass, a range
    /// with no whole chunk passes unchecked, and one changed byte fails
    /// only its own range.
    #[test]
    fn chunks_are_checked_against_the_manifest() {
        let chunk = CHUNK_SIZE_BYTES as usize;
        let length_bytes = 3 * chunk + chunk / 2;
        let data: Vec<u8> =
            (0..length_bytes).map(|i| (i as u32).wrapping_mul(2_654_435_761).to_le_bytes()[3]).collect();
        let crcs: Vec<u32> = data.chunks(chunk).map(crc32c::crc32c).collect();
        // Chunk 1 whole; bytes inside chunk 0; chunk 2 and the short last one.
        let spans = [(chunk, chunk), (100, 1000), (2 * chunk, length_bytes - 2 * chunk)];
        let mut ranges = Vec::new();
        let mut buf = Vec::new();
        for (offset, len) in spans {
            ranges.push(ReadRange { offset: offset as u64, len: len as u32, dest: buf.len() as u64 });
            buf.extend_from_slice(&data[offset..offset + len]);
        }
        let check = |buf: &[u8]| {
            let mut statuses = vec![RangeStatus::Ok; ranges.len()];
            verify_chunks(&crcs, length_bytes as u64, &ranges, buf, &mut statuses);
            statuses
        };
        assert_eq!(check(&buf), [RangeStatus::Ok; 3]);
        for (range, at) in [(0, 5), (1, chunk + 7), (2, buf.len() - 1)] {
            let mut changed = buf.clone();
            changed[at] ^= 0x40;
            let mut expected = [RangeStatus::Ok; 3];
            if range != 1 {
                expected[range] = RangeStatus::ChecksumMismatch;
            }
            assert_eq!(check(&changed), expected, "a byte changed in range {range}");
        }
    }
}
