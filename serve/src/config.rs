//! What the node's data servers are told: limits, timeouts, TLS. Both
//! transports take the same configuration; what a session is held to comes
//! from it as [`SessionLimits`].

use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Duration;

use sluice_proto::wire;

use crate::session::SessionLimits;

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
    pub accepted: Arc<AtomicU64>,
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
    /// How plain-TCP connections move their bytes (TLS connections always
    /// use readiness: rustls seals and opens records over a byte stream).
    pub socket_io: SocketIo,
}

/// How a plain-TCP connection's socket is driven on its core.
///
/// Readiness is the default because it measured faster at queue depth 1
/// on the machines this was built on: the socket ring is a second ring
/// beside the core's block queue, so a read costs an enter on each, plus
/// one to run the receive the kernel deferred (the crate README has the
/// figures). The ring wins once the block queue and the sockets share
/// one ring and one enter per turn.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SocketIo {
    /// Through the core's socket ring (io_uring): receives into the
    /// connection's buffer and `sendmsg` from the DMA slots are
    /// submissions, their completions reaped on the core's thread.
    /// Where the kernel gives no io_uring, readiness instead.
    Uring,
    /// Through the event loop's readiness (epoll) and a `recv` or
    /// `writev` syscall each.
    #[default]
    Readiness,
}

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
            socket_io: SocketIo::default(),
        }
    }
}

impl ServerConfig {
    /// The limits a session announces and enforces, with at most
    /// `ranges_per_batch_max` ranges a batch (a transport may allow fewer
    /// than configured) and `credits` batches in flight.
    pub fn session_limits(&self, ranges_per_batch_max: u32, credits: u32) -> SessionLimits {
        SessionLimits {
            node_name: self.node_name.clone(),
            ranges_per_batch_max: ranges_per_batch_max.max(1),
            batch_footprint_max_bytes: self.batch_footprint_max_bytes,
            credits: credits.max(1),
            handshake_timeout: self.handshake_timeout,
            idle_timeout: self.idle_timeout,
        }
    }
}
