//! Transports between training hosts and storage nodes: the wire format, the
//! control-message codec, and the TCP transport (the fallback, and the
//! default where no RDMA NIC exists). RDMA verbs join behind the same batch
//! semantics.

pub mod metrics;
#[cfg(feature = "rdma")]
pub mod rc;
pub mod tcp;
pub mod tls;
#[cfg(feature = "rdma")]
pub mod verbs;
