//! One client session's protocol state, without I/O: what both transports
//! agree on, written once.
//!
//! A session says Hello, opens datasets (each a handle bound to a data-plane
//! slot, its serving counters and its steering flow), sends batches against
//! those handles, and closes them. The state machine here checks the order
//! of messages, keeps the handle table and the grants the handles were
//! opened under, applies the limits announced at Hello, and turns every
//! refusal into the status or error the client reads. It reads no socket
//! and posts no work request: the TCP and RDMA drivers move bytes, ask the
//! catalog when [`ControlAction::Resolve`] says so, and hand the data plane
//! what [`Admission::Admitted`] names. Flow control stays with the drivers,
//! because it is a transport's own: TCP stops reading when its credits are
//! out, RDMA has already posted the receives and so counts an excess as a
//! protocol error.

use rustc_hash::FxHashMap;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use sluice_dataplane::{DatasetSlot, Flow, FlowLease};
use sluice_proto::codec::{self, ControlMessage, ErrorCode, OpenInfo};
use sluice_proto::geometry::batch_fits;
use sluice_proto::wire::{self, BatchStatus, FrameKind};
use tokio::sync::watch;

use crate::metrics::DatasetCounters;
use crate::read_through::ReadThrough;

/// The protocol version both ends speak.
pub const PROTOCOL: u32 = 1;
/// Most datasets one session holds open.
pub const HANDLES_PER_SESSION_MAX: usize = 1024;

/// Resolves dataset names for `Open` and decides access: the catalog's side
/// of the server.
pub trait DatasetResolver: Send + Sync + 'static {
    /// Opens `name` for `peer`, a client that gave `token`.
    fn open(
        &self,
        name: String,
        token: Option<String>,
        peer: Peer,
    ) -> impl Future<Output = Result<Opened, OpenError>> + Send;
    /// Whether the grant an open was made under still stands.
    fn grant_live(&self, grant: u64) -> bool;
    /// Changes whenever a grant is revoked.
    fn revocations(&self) -> watch::Receiver<u64>;
}

/// Who is at the other end of a session, as far as its transport knows:
/// what the access check and a refusal's audit record need.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Peer {
    /// Where the connection comes from.
    pub addr: Option<std::net::SocketAddr>,
    /// Over TLS with a client certificate, the certificate's CN.
    pub cert_name: Option<String>,
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
    /// A source-backed dataset's cache, which fills missing chunks before
    /// a batch is read; `None` for an ingested dataset.
    pub read_through: Option<Arc<dyn ReadThrough>>,
}

/// Why an open failed; sent to that client only.
#[derive(Clone, Debug)]
pub struct OpenError {
    pub code: ErrorCode,
    pub message: String,
}

/// Why the node closes a session.
#[derive(Debug, thiserror::Error)]
pub enum Fatal {
    #[error("{0}")]
    Frame(#[from] wire::FrameError),
    #[error("{0}")]
    Codec(#[from] codec::CodecError),
    #[error("protocol: {0}")]
    Protocol(String),
    #[error("the grant this session opened {0} under was revoked or has ended")]
    Revoked(String),
    #[error("{0}")]
    Deadline(&'static str),
    /// The link itself failed (a socket error, a failed work request): the
    /// driver sends no farewell on it.
    #[error("{0}")]
    Link(String),
}

impl Fatal {
    /// The error code the farewell carries.
    pub fn code(&self) -> ErrorCode {
        match self {
            Self::Frame(wire::FrameError::Oversized { .. }) => ErrorCode::OversizedFrame,
            Self::Frame(_) | Self::Codec(_) => ErrorCode::MalformedFrame,
            Self::Protocol(_) | Self::Deadline(_) | Self::Link(_) => ErrorCode::Protocol,
            Self::Revoked(_) => ErrorCode::AccessDenied,
        }
    }

    /// The message that tells the client why its session ends.
    pub fn farewell(&self) -> ControlMessage {
        ControlMessage::Error { code: self.code(), message: self.to_string() }
    }

    /// A frame of `kind` where a client sends only control messages and
    /// batch requests of the kind `batch` (its transport's).
    pub fn unexpected_frame(kind: FrameKind, batch: FrameKind) -> Self {
        match kind {
            FrameKind::BatchResponse | FrameKind::RdmaBatchResponse => {
                Self::Protocol("clients do not send responses".into())
            }
            FrameKind::RdmaBatchRequest => Self::Protocol("RDMA batch on a TCP connection".into()),
            FrameKind::BatchRequest => Self::Protocol("TCP batch on an RDMA connection".into()),
            FrameKind::Control => Self::Protocol(format!("{kind:?} frame refused where {batch:?} was due")),
        }
    }
}

impl From<std::io::Error> for Fatal {
    fn from(err: std::io::Error) -> Self {
        Self::Link(format!("io: {err}"))
    }
}

/// What the session announces at Hello and then holds the client to.
#[derive(Clone, Debug)]
pub struct SessionLimits {
    pub node_name: String,
    pub ranges_per_batch_max: u32,
    pub batch_footprint_max_bytes: u64,
    /// Batches the client may have in flight.
    pub credits: u32,
    /// Until its first open, a session must have said Hello and opened a
    /// dataset within this.
    pub handshake_timeout: Duration,
    /// A session with nothing in flight that sends nothing for this long
    /// is closed.
    pub idle_timeout: Duration,
}

/// What a driver does with a control message.
#[derive(Debug)]
pub enum ControlAction {
    /// Send this back.
    Reply(ControlMessage),
    /// Ask the catalog (`DatasetResolver::open`), then give its answer to
    /// [`Session::opened`], which gives the reply.
    Resolve { name: String, token: Option<String> },
    /// Nothing to send.
    Silent,
}

/// What a driver does with a batch request.
#[derive(Debug)]
pub enum Admission {
    /// Hand the batch to the data plane; its outcome is counted in
    /// `counters` (by `metrics::settle`, or `record_failed_batch` if the
    /// data plane refuses it).
    Admitted {
        slot: DatasetSlot,
        flow: Flow,
        counters: Arc<DatasetCounters>,
        /// Submit through it ([`crate::read_through::submit`]) when set.
        read_through: Option<Arc<dyn ReadThrough>>,
    },
    /// Answer the batch with this status at once; already counted.
    Refused(BatchStatus),
}

/// A dataset a session holds open.
struct Handle {
    slot: DatasetSlot,
    counters: Arc<DatasetCounters>,
    /// Held while the handle is: its steering flow closes with it.
    flow: FlowLease,
    read_through: Option<Arc<dyn ReadThrough>>,
}

/// One client session's protocol state.
pub struct Session {
    limits: SessionLimits,
    greeted: bool,
    /// By handle. The node numbers handles, so a client chooses no key and
    /// a fast hash (not a keyed one) is safe: this is looked up every batch.
    handles: FxHashMap<u32, Handle>,
    next_handle: u32,
    /// The grants open handles were made under, with a dataset name each
    /// (for the farewell); bounded by the handle limit.
    granted: Vec<(u64, String)>,
    /// When the session began, for the handshake deadline.
    started: Instant,
    /// When the client last sent a frame, for the idle deadline.
    last_heard: Instant,
    /// Whether a dataset was ever opened: the handshake is over.
    authenticated: bool,
}

impl Session {
    pub fn new(limits: SessionLimits, now: Instant) -> Self {
        assert!(limits.credits > 0, "a session holds at least one credit");
        assert!(limits.ranges_per_batch_max > 0, "a batch holds at least one range");
        Self {
            limits,
            greeted: false,
            handles: FxHashMap::default(),
            next_handle: 1,
            granted: Vec::new(),
            started: now,
            last_heard: now,
            authenticated: false,
        }
    }

    pub fn limits(&self) -> &SessionLimits {
        &self.limits
    }

    /// Whether a dataset was ever opened on this session.
    pub fn authenticated(&self) -> bool {
        self.authenticated
    }

    /// Notes that the client sent a frame at `now`.
    pub fn heard(&mut self, now: Instant) {
        self.last_heard = now;
    }

    /// When the session ends for silence, and why: the handshake deadline
    /// until the first open, then the idle timeout while `nothing_in_flight`.
    pub fn deadline(&self, nothing_in_flight: bool) -> Option<(Instant, &'static str)> {
        if !self.authenticated {
            Some((self.started + self.limits.handshake_timeout, "no Hello and Open within the handshake deadline"))
        } else if nothing_in_flight {
            Some((self.last_heard + self.limits.idle_timeout, "idle past the idle timeout"))
        } else {
            None
        }
    }

    /// Acts on a control message from the client.
    pub fn control(&mut self, message: ControlMessage) -> Result<ControlAction, Fatal> {
        match message {
            ControlMessage::Hello { protocol, .. } if protocol == PROTOCOL => {
                self.greeted = true;
                Ok(ControlAction::Reply(ControlMessage::HelloOk {
                    node: self.limits.node_name.clone(),
                    ranges_per_batch_max: self.limits.ranges_per_batch_max,
                    batch_footprint_max_bytes: self.limits.batch_footprint_max_bytes,
                    credits: self.limits.credits,
                }))
            }
            ControlMessage::Hello { protocol, .. } => {
                Err(Fatal::Protocol(format!("client protocol {protocol}, node speaks {PROTOCOL}")))
            }
            _ if !self.greeted => Err(Fatal::Protocol("the first message must be Hello".into())),
            ControlMessage::Open { .. } if self.handles.len() >= HANDLES_PER_SESSION_MAX => {
                Ok(ControlAction::Reply(ControlMessage::Error {
                    code: ErrorCode::Protocol,
                    message: format!("more than {HANDLES_PER_SESSION_MAX} datasets open"),
                }))
            }
            ControlMessage::Open { name, .. } if name.len() > codec::DATASET_NAME_BYTES_MAX => {
                // No dataset has such a name, so saying so tells nothing;
                // the name is not repeated, since it may not fit a reply.
                Ok(ControlAction::Reply(ControlMessage::Error {
                    code: ErrorCode::UnknownDataset,
                    message: format!(
                        "a dataset name is at most {} bytes; this one is {}",
                        codec::DATASET_NAME_BYTES_MAX,
                        name.len()
                    ),
                }))
            }
            ControlMessage::Open { name, token } => {
                Ok(ControlAction::Resolve { name, token: token.map(codec::Secret::into_inner) })
            }
            ControlMessage::Close { handle } => {
                self.handles.remove(&handle);
                Ok(ControlAction::Silent)
            }
            other => Err(Fatal::Protocol(format!("unexpected message {other:?}"))),
        }
    }

    /// Takes the catalog's answer to an open of `name` and gives the reply;
    /// `flow` opens the handle's steering flow.
    pub fn opened(
        &mut self,
        name: String,
        outcome: Result<Opened, OpenError>,
        flow: impl FnOnce() -> FlowLease,
    ) -> ControlMessage {
        let Opened { slot, info, grant, counters, read_through } = match outcome {
            Ok(opened) => opened,
            Err(err) => return ControlMessage::Error { code: err.code, message: err.message },
        };
        if self.handles.len() >= HANDLES_PER_SESSION_MAX {
            // Asked twice at once; the table is full now.
            return ControlMessage::Error {
                code: ErrorCode::Protocol,
                message: format!("more than {HANDLES_PER_SESSION_MAX} datasets open"),
            };
        }
        let handle = self.next_handle;
        self.next_handle = self.next_handle.wrapping_add(1).max(1);
        self.handles.insert(handle, Handle { slot, counters, flow: flow(), read_through });
        if let Some(grant) = grant {
            // A re-open under the same grant adds no entry.
            if !self.granted.iter().any(|(g, _)| *g == grant) {
                self.granted.push((grant, name));
            }
        }
        self.authenticated = true;
        ControlMessage::Opened { handle, info }
    }

    /// Checks a batch of ranges of `lens` bytes against `handle` and the
    /// limits; `destinations_fit` is the transport's own check of where the
    /// bytes go (RDMA: inside the client's registered buffer).
    pub fn admit(
        &mut self,
        handle: u32,
        lens: impl ExactSizeIterator<Item = u32>,
        destinations_fit: bool,
    ) -> Result<Admission, Fatal> {
        if !self.greeted {
            return Err(Fatal::Protocol("the first message must be Hello".into()));
        }
        let Some(held) = self.handles.get(&handle) else { return Ok(Admission::Refused(BatchStatus::UnknownHandle)) };
        // The limits announced at Hello hold: a batch over them costs the
        // data plane nothing.
        let refused = if !batch_fits(lens, self.limits.ranges_per_batch_max, self.limits.batch_footprint_max_bytes) {
            Some(BatchStatus::TooLarge)
        } else if !destinations_fit {
            Some(BatchStatus::BadDestination)
        } else {
            None
        };
        if let Some(status) = refused {
            held.counters.record_failed_batch();
            return Ok(Admission::Refused(status));
        }
        Ok(Admission::Admitted {
            slot: held.slot,
            flow: held.flow.flow(),
            counters: Arc::clone(&held.counters),
            read_through: held.read_through.clone(),
        })
    }

    /// The dataset whose grant no longer stands, if one does not.
    pub fn revoked(&self, live: impl Fn(u64) -> bool) -> Option<&str> {
        self.granted.iter().find(|(grant, _)| !live(*grant)).map(|(_, name)| name.as_str())
    }
}

#[cfg(test)]
mod tests;
