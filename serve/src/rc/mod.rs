//! Node side of the RDMA transport: a listener on rdma_cm, and one task per
//! connection that owns its queue pair (no locks on the I/O path). Each
//! connection is placed on a data-plane core in turn and runs on that
//! core's event loop, which waits on the connection's completion channel
//! beside its own queue and sockets: a batch is received, read and written
//! back on one thread, as over TCP.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rustc_hash::FxHashMap;
use sluice_dataplane::{
    spare_ranges, BatchCompletion, BatchResult, ByteRange, CoreGroup, DataPlane, Placement, ReadBatch, Reply,
};
use sluice_proto::RangeStatus;
use tokio::sync::{mpsc, watch, Semaphore};

use crate::config::ServerConfig;
use crate::metrics::{settle_outcome, DatasetCounters};
use crate::session::{Admission, ControlAction, DatasetResolver, Fatal, Peer, Session};

mod connection;
mod writes;

use connection::{Connection, PRE_AUTH_SESSIONS_MAX};
use sluice_proto::codec::{self, ControlMessage};
use sluice_proto::wire::{self, BatchStatus, FrameKind};
use sluice_transport::frame::control_frame;
use sluice_transport::rc::{
    parse_message, readiness, CONTROL_MESSAGES_MAX, RDMA_CREDITS_MAX, REQUEST_SLOT_BYTES, RESPONSE_SLOT_BYTES,
};
use sluice_transport::rc::{ACK_TIMEOUT_EXPONENT, LOST_PACKET_GIVE_UP, WR_RECV, WR_SEND, WR_TAG_MASK, WR_WRITE};
use sluice_transport::verbs::{
    Access, CmEventKind, CmId, CompletionQueue, DeviceLimits, EventChannel, MemoryRegion, MessageSlots,
    ProtectionDomain, QueueCaps, QueuePair, SendOp, SendWr, Sge, VerbsError, WorkCompletion, RNR_RETRY_ENDLESS,
};
use writes::plan_writes;

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

    /// Accepts connections until `shutdown` turns true, placing each on
    /// the cores of `group` in turn (see [`DataPlane::core_runtime`]).
    pub async fn serve<R: DatasetResolver>(
        self,
        resolver: Arc<R>,
        config: ServerConfig,
        group: CoreGroup,
        mut shutdown: watch::Receiver<bool>,
    ) -> Result<(), VerbsError> {
        let mut accepted = 0usize;
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
                        // The request sets how often this node's sends retry
                        // a receiver-not-ready NAK; without end, a client that
                        // stops posting receives would hold the response's
                        // DMA slots until the write timeout.
                        if event.rnr_retry_asked == Some(RNR_RETRY_ENDLESS) {
                            tracing::warn!(
                                "refusing an RDMA connection that asks the node's sends to retry \
                                 receiver-not-ready without end (rnr_retry_count {RNR_RETRY_ENDLESS})"
                            );
                            let _ = id.reject();
                            continue;
                        }
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
                        let placement = group.place(group.nth_wrapping(accepted));
                        accepted = accepted.wrapping_add(1);
                        let runtime = self.device.plane.core_runtime(placement.core());
                        let session = Connection::setup(id, Arc::clone(&self.device), Arc::clone(&resolver), config.clone(), next_client_id, placement)
                            .map(|session| session.before_authentication(pre_auth));
                        // Its completion channel is registered with the
                        // core's reactor when it starts there.
                        runtime.spawn(async move {
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
