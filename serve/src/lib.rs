//! The storage node's data port: the servers of the TCP transport and (with
//! the `rdma` feature) the RDMA transport, which take batches off the wire,
//! hand them to the data plane and send the bytes back from its DMA slots;
//! and the per-dataset serving counters both keep. What a session is (its
//! handshake, handles, grants and limits) is written once, without I/O, in
//! [`session`]; the two servers only move bytes for it. A plain-TCP
//! connection's bytes move by readiness (epoll) or, with
//! [`SocketIo::Uring`], through its core's socket ring (io_uring).
//!
//! The client side of each transport is `sluice-transport`; this crate is
//! the node's alone and must not be a dependency of the client.

pub mod config;
pub mod deadline;
pub mod metrics;
#[cfg(feature = "rdma")]
pub mod rc;
pub mod read_through;
pub mod session;
pub mod tcp;

pub use config::{ServerConfig, SocketIo};
pub use read_through::ReadThrough;
pub use session::{DatasetResolver, OpenError, Opened, Peer};
