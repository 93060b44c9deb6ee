//! The TCP transport's client: the fallback and the default where no RDMA
//! NIC exists. The node's side is `sluice_serve::tcp`.
//!
//! Same batch semantics as RDMA: a client pipelines many batches on one
//! connection, bounded by credits the server grants at handshake; responses
//! come back in completion order, tagged with their batch id. The server
//! writes each response straight from the data plane's DMA slots.

mod client;
mod low_water;

pub use crate::session::NodeLimits;
pub use client::{ReadSink, TcpClient, TlsConnect, TransportError};
