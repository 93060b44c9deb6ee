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
