//! The moving parts of sluice's two transports that a training host needs:
//! the TCP client and the RDMA client (over the safe verbs wrappers in
//! `verbs`), framing on a byte stream, and TLS set-up. What both ends
//! share lives here too (frame I/O, the RDMA slot sizes, timeouts and
//! work-request tags); the node's servers are `sluice-serve`.
//!
//! It must not depend on the data plane or the control plane: the client
//! crate, and so the Python wheel, links it.

pub mod frame;
pub mod poll;
#[cfg(feature = "rdma")]
pub mod rc;
pub mod session;
pub mod tcp;
pub mod tls;
#[cfg(feature = "rdma")]
pub mod verbs;
