//! rdma_cm: event channels and connection identifiers.

use std::ffi::CStr;
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, RawFd};
use std::ptr;
use std::sync::Arc;

use nix::fcntl::{fcntl, FcntlArg, OFlag};
use rdma_sys::{rdma_cm_event_type as ev, rdma_cm_id, rdma_conn_param, rdma_event_channel};

use super::VerbsError;

/// An rdma_cm event channel. Its fd is non-blocking, for `tokio::io::unix::AsyncFd`.
pub struct EventChannel {
    raw: *mut rdma_event_channel,
}

// SAFETY: librdmacm's calls are thread-safe; the channel is only read
// through them.
unsafe impl Send for EventChannel {}
// SAFETY: as above.
unsafe impl Sync for EventChannel {}

impl EventChannel {
    pub fn new() -> Result<Arc<Self>, VerbsError> {
        // SAFETY: no arguments; NULL means failure with errno set.
        let raw = unsafe { rdma_sys::rdma_create_event_channel() };
        if raw.is_null() {
            return Err(VerbsError::last("rdma_create_event_channel"));
        }
        let channel = Arc::new(Self { raw });
        set_nonblocking(channel.as_raw_fd(), "rdma event channel")?;
        Ok(channel)
    }

    /// The next event, or `None` when none is pending. A connect request
    /// comes with its new id already moved to a channel of its own, so each
    /// connection sees only its own events.
    pub fn next_event(self: &Arc<Self>) -> Result<Option<CmEvent>, VerbsError> {
        let mut event = ptr::null_mut();
        // SAFETY: `raw` is a live channel; `event` is a valid out-pointer.
        if unsafe { rdma_sys::rdma_get_cm_event(self.raw, &mut event) } != 0 {
            let err = VerbsError::last("rdma_get_cm_event");
            return if err.would_block() { Ok(None) } else { Err(err) };
        }
        // SAFETY: a successful get returns a valid event until acked; a
        // connect request's parameters are its `conn` member.
        let (kind, status, id, peer_rnr_retry) =
            unsafe { ((*event).event, (*event).status, (*event).id, (*event).param.conn.rnr_retry_count) };
        // SAFETY: acked exactly once; nothing of the event is read after.
        unsafe { rdma_sys::rdma_ack_cm_event(event) };
        let kind = CmEventKind::from_raw(kind);
        let new_id = if kind == CmEventKind::ConnectRequest {
            let channel = EventChannel::new()?;
            // SAFETY: `id` is the new connection's id, ours from now on; its
            // only event (this one) is acked, so migration cannot block.
            if unsafe { rdma_sys::rdma_migrate_id(id, channel.raw) } != 0 {
                let err = VerbsError::last("rdma_migrate_id");
                // SAFETY: the id is ours and has no QP; destroyed once.
                unsafe { rdma_sys::rdma_destroy_id(id) };
                return Err(err);
            }
            Some(CmId { raw: id, channel })
        } else {
            None
        };
        let rnr_retry_asked = new_id.is_some().then_some(peer_rnr_retry);
        Ok(Some(CmEvent { kind, status, new_id, rnr_retry_asked }))
    }
}

impl AsRawFd for EventChannel {
    fn as_raw_fd(&self) -> RawFd {
        // SAFETY: `raw` is live for the life of `self`.
        unsafe { (*self.raw).fd }
    }
}

impl Drop for EventChannel {
    fn drop(&mut self) {
        // SAFETY: every id on this channel holds an Arc of it, so none is
        // left; destroyed once.
        unsafe { rdma_sys::rdma_destroy_event_channel(self.raw) };
    }
}

pub(super) fn set_nonblocking(fd: RawFd, what: &'static str) -> Result<(), VerbsError> {
    let flags = fcntl(fd, FcntlArg::F_GETFL).map_err(|e| VerbsError::code(what, e as i32))?;
    fcntl(fd, FcntlArg::F_SETFL(OFlag::from_bits_truncate(flags) | OFlag::O_NONBLOCK))
        .map_err(|e| VerbsError::code(what, e as i32))?;
    Ok(())
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CmEventKind {
    AddrResolved,
    RouteResolved,
    ConnectRequest,
    Established,
    Disconnected,
    Rejected,
    /// Address, route or connect errors, unreachable peer, device removal.
    Failed(u32),
    Other(u32),
}

impl CmEventKind {
    fn from_raw(raw: u32) -> Self {
        match raw {
            ev::RDMA_CM_EVENT_ADDR_RESOLVED => Self::AddrResolved,
            ev::RDMA_CM_EVENT_ROUTE_RESOLVED => Self::RouteResolved,
            ev::RDMA_CM_EVENT_CONNECT_REQUEST => Self::ConnectRequest,
            ev::RDMA_CM_EVENT_ESTABLISHED => Self::Established,
            ev::RDMA_CM_EVENT_DISCONNECTED => Self::Disconnected,
            ev::RDMA_CM_EVENT_REJECTED => Self::Rejected,
            ev::RDMA_CM_EVENT_ADDR_ERROR
            | ev::RDMA_CM_EVENT_ROUTE_ERROR
            | ev::RDMA_CM_EVENT_CONNECT_ERROR
            | ev::RDMA_CM_EVENT_UNREACHABLE
            | ev::RDMA_CM_EVENT_DEVICE_REMOVAL => Self::Failed(raw),
            other => Self::Other(other),
        }
    }
}

impl std::fmt::Display for CmEventKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let raw = match self {
            Self::Failed(raw) | Self::Other(raw) => *raw,
            other => return write!(f, "{other:?}"),
        };
        // SAFETY: returns a static string for any value.
        let name = unsafe { CStr::from_ptr(rdma_sys::rdma_event_str(raw)) };
        f.write_str(&name.to_string_lossy())
    }
}

/// One rdma_cm event, copied out and acked.
pub struct CmEvent {
    pub kind: CmEventKind,
    pub status: i32,
    /// For `ConnectRequest`: the new connection's id, on its own channel.
    pub new_id: Option<CmId>,
    /// For `ConnectRequest`: how often the peer asks this side's sends to
    /// retry a receiver-not-ready NAK ([`RNR_RETRY_ENDLESS`]: without end).
    /// The CM programs this side's queue pair with it; accepting cannot
    /// change it, only refusing can.
    pub rnr_retry_asked: Option<u8>,
}

/// The receiver-not-ready retry count that means "retry for ever".
pub const RNR_RETRY_ENDLESS: u8 = 7;
/// Receiver-not-ready retries the client asks of the node's sends: with the
/// CM's receiver-not-ready timer (655 ms) a client that stops posting
/// receives loses its connection in about four seconds, and the node's
/// buffers come back.
pub const RNR_RETRY_OF_NODE_SENDS: u8 = 6;

/// What the device behind an id can hold.
#[derive(Clone, Copy, Debug)]
pub struct DeviceLimits {
    pub max_qp_wr: u32,
    pub max_sge: u32,
    pub max_cqe: u32,
}

/// An rdma_cm id (RC port space): a listener or one side of a connection.
pub struct CmId {
    raw: *mut rdma_cm_id,
    channel: Arc<EventChannel>,
}

// SAFETY: rdma_cm ids may be used from any thread; sluice drives each from
// one task at a time.
unsafe impl Send for CmId {}
// SAFETY: shared references only read the id's fields or call thread-safe
// librdmacm functions.
unsafe impl Sync for CmId {}

fn check(op: &'static str, ret: i32) -> Result<(), VerbsError> {
    if ret == 0 {
        Ok(())
    } else {
        Err(VerbsError::last(op))
    }
}

/// A socket address as the `sockaddr` rdma_cm takes.
struct RawAddr(nix::sys::socket::SockaddrStorage);

impl RawAddr {
    fn new(addr: SocketAddr) -> Self {
        Self(nix::sys::socket::SockaddrStorage::from(addr))
    }

    fn as_mut_ptr(&mut self) -> *mut nix::libc::sockaddr {
        nix::sys::socket::SockaddrLike::as_ptr(&self.0).cast_mut().cast()
    }
}

/// Times a queue pair sends a packet again that the peer did not
/// acknowledge before it fails the work request (the most the verbs
/// allow), one ACK timeout apart.
pub const TRANSPORT_RETRIES: u8 = 7;

/// Connection parameters: no RDMA READ either way, [`TRANSPORT_RETRIES`]
/// retries on transport errors so a vanished peer is noticed, and `peer_rnr_retry`
/// receiver-not-ready retries for the *peer's* sends: the CM carries each
/// side's value to the other side's queue pair (rdma_cm(7): "a send
/// operation from the remote peer").
fn conn_params(peer_rnr_retry: u8) -> rdma_conn_param {
    rdma_conn_param {
        private_data: ptr::null(),
        private_data_len: 0,
        responder_resources: 0,
        initiator_depth: 0,
        flow_control: 1,
        retry_count: TRANSPORT_RETRIES,
        rnr_retry_count: peer_rnr_retry,
        srq: 0,
        qp_num: 0,
    }
}

impl CmId {
    pub fn new(channel: &Arc<EventChannel>) -> Result<Self, VerbsError> {
        let mut raw = ptr::null_mut();
        // SAFETY: live channel, valid out-pointer, no context pointer.
        check("rdma_create_id", unsafe {
            rdma_sys::rdma_create_id(channel.raw, &mut raw, ptr::null_mut(), rdma_sys::rdma_port_space::RDMA_PS_TCP)
        })?;
        Ok(Self { raw, channel: Arc::clone(channel) })
    }

    /// Sets the local ACK timeout to 4.096 µs × 2^`exponent`: how long a
    /// sent packet waits for its acknowledgement before it is sent again
    /// (seven times, then the work request fails). Before connect/accept.
    pub fn set_ack_timeout(&self, exponent: u8) -> Result<(), VerbsError> {
        // From rdma_cma.h, whose option enums bindgen leaves unnamed.
        const RDMA_OPTION_ID: i32 = 0;
        const RDMA_OPTION_ID_ACK_TIMEOUT: i32 = 3;
        let mut value = exponent;
        // SAFETY: live id; the option is one byte, read during the call.
        check("rdma_set_option(ACK_TIMEOUT)", unsafe {
            rdma_sys::rdma_set_option(
                self.raw,
                RDMA_OPTION_ID,
                RDMA_OPTION_ID_ACK_TIMEOUT,
                (&mut value as *mut u8).cast(),
                1,
            )
        })
    }

    pub fn bind(&self, addr: SocketAddr) -> Result<(), VerbsError> {
        let mut raw_addr = RawAddr::new(addr);
        // SAFETY: live id; the address outlives the call.
        check("rdma_bind_addr", unsafe { rdma_sys::rdma_bind_addr(self.raw, raw_addr.as_mut_ptr()) })
    }

    pub fn listen(&self, backlog: i32) -> Result<(), VerbsError> {
        // SAFETY: live, bound id.
        check("rdma_listen", unsafe { rdma_sys::rdma_listen(self.raw, backlog) })
    }

    pub fn resolve_addr(&self, peer: SocketAddr, timeout_ms: i32) -> Result<(), VerbsError> {
        let mut raw_addr = RawAddr::new(peer);
        // SAFETY: live id; the address outlives the call; no source address.
        check("rdma_resolve_addr", unsafe {
            rdma_sys::rdma_resolve_addr(self.raw, ptr::null_mut(), raw_addr.as_mut_ptr(), timeout_ms)
        })
    }

    pub fn resolve_route(&self, timeout_ms: i32) -> Result<(), VerbsError> {
        // SAFETY: live id with a resolved address.
        check("rdma_resolve_route", unsafe { rdma_sys::rdma_resolve_route(self.raw, timeout_ms) })
    }

    /// Connects, asking the node's sends to give up after
    /// [`RNR_RETRY_OF_NODE_SENDS`] receiver-not-ready retries (the node
    /// refuses a client asking for more).
    pub fn connect(&self) -> Result<(), VerbsError> {
        let mut params = conn_params(RNR_RETRY_OF_NODE_SENDS);
        // SAFETY: live id with a QP; params outlive the call.
        check("rdma_connect", unsafe { rdma_sys::rdma_connect(self.raw, &mut params) })
    }

    /// Accepts; the peer's sends wait for this side's receives without end
    /// (the node reposts each as soon as it has read the request). How
    /// long this side's sends wait was the peer's to ask, in its request
    /// ([`CmEvent::rnr_retry_asked`]).
    pub fn accept(&self) -> Result<(), VerbsError> {
        let mut params = conn_params(RNR_RETRY_ENDLESS);
        // SAFETY: live id of a connect request, with a QP.
        check("rdma_accept", unsafe { rdma_sys::rdma_accept(self.raw, &mut params) })
    }

    pub fn reject(&self) -> Result<(), VerbsError> {
        // SAFETY: live id of a connect request; no private data.
        check("rdma_reject", unsafe { rdma_sys::rdma_reject(self.raw, ptr::null(), 0) })
    }

    pub fn disconnect(&self) -> Result<(), VerbsError> {
        // SAFETY: live id.
        check("rdma_disconnect", unsafe { rdma_sys::rdma_disconnect(self.raw) })
    }

    /// The verbs context of the device this id is bound to (null until an
    /// address is bound or resolved).
    pub(super) fn context(&self) -> *mut rdma_sys::ibv_context {
        // SAFETY: live id; reading a field librdmacm sets.
        unsafe { (*self.raw).verbs }
    }

    /// The event channel this id's events arrive on.
    pub fn channel(&self) -> &Arc<EventChannel> {
        &self.channel
    }

    pub(super) fn raw(&self) -> *mut rdma_cm_id {
        self.raw
    }

    /// Whether this id and `other` sit on the same device (and so can share
    /// a protection domain and its memory regions).
    pub fn same_device(&self, other: &CmId) -> bool {
        !self.context().is_null() && self.context() == other.context()
    }

    /// The peer's address (IPv4 or IPv6), once the id is connected or is a
    /// connect request; `None` for another family or none yet.
    pub fn peer_addr(&self) -> Option<SocketAddr> {
        use nix::sys::socket::SockaddrLike;
        // SAFETY: live id; the address lies in its route, kept while it lives.
        let addr: *const nix::libc::sockaddr = unsafe { rdma_sys::rdma_get_peer_addr(&*self.raw) };
        // SAFETY: without a length, `from_raw` copies a fixed-size address
        // of the family found, within the route's `sockaddr_storage`.
        let storage = unsafe { nix::sys::socket::SockaddrStorage::from_raw(addr, None) }?;
        if let Some(v4) = storage.as_sockaddr_in() {
            return Some(SocketAddr::V4((*v4).into()));
        }
        storage.as_sockaddr_in6().map(|v6| SocketAddr::V6((*v6).into()))
    }

    pub fn has_device(&self) -> bool {
        !self.context().is_null()
    }

    pub fn device_name(&self) -> String {
        let context = self.context();
        if context.is_null() {
            return "(no device)".into();
        }
        // SAFETY: a live context has a device with a static name.
        let name = unsafe { CStr::from_ptr(rdma_sys::ibv_get_device_name((*context).device)) };
        name.to_string_lossy().into_owned()
    }

    pub fn device_limits(&self) -> Result<DeviceLimits, VerbsError> {
        let context = self.context();
        if context.is_null() {
            return Err(VerbsError::code("ibv_query_device", nix::libc::ENODEV));
        }
        // SAFETY: ibv_device_attr is plain data; zero is a valid value.
        let mut attr: rdma_sys::ibv_device_attr = unsafe { std::mem::zeroed() };
        // SAFETY: live context, valid out-pointer.
        let ret = unsafe { rdma_sys::ibv_query_device(context, &mut attr) };
        if ret != 0 {
            return Err(VerbsError::code("ibv_query_device", ret));
        }
        Ok(DeviceLimits {
            max_qp_wr: attr.max_qp_wr.max(0) as u32,
            max_sge: attr.max_sge.max(0) as u32,
            max_cqe: attr.max_cqe.max(0) as u32,
        })
    }
}

impl Drop for CmId {
    fn drop(&mut self) {
        // SAFETY: the QP (if any) was destroyed by its QueuePair, which holds
        // this id; every event of the id was acked when read. Destroyed once.
        unsafe { rdma_sys::rdma_destroy_id(self.raw) };
    }
}
