//! Types of the node's HTTP control API that the client, `sluicectl` and
//! the node all speak. With the `openapi` feature (the node's), each also
//! describes itself for the OpenAPI document.

use serde::{Deserialize, Serialize};

pub mod cluster;
pub mod dataset;
pub mod devices;
pub mod grants;
pub mod policy;
pub mod trace;

pub use cluster::{ClusterStatus, CopyStatus, DatasetPlacement, Member};
pub use dataset::{
    Appended, CacheReport, DatasetKind, DatasetRecord, DatasetSource, DatasetState, NamespaceKind, NamespaceRecord,
    ScrubReport, SourceObject,
};
pub use devices::{DeviceReport, OrphanFile, Purged};
pub use grants::{GrantRequest, GrantView};
pub use policy::{FlowDecisions, PolicyInfo, PolicyReport, Unloaded, WorkerConnections};
pub use trace::{KernelTrace, SlowBatch, TraceEntry, TraceSnapshot};

/// How long the node lets a request take, but for the operations whose
/// length is their work's (an upload, a seal or a scrub reads every byte),
/// which report progress by finishing. Past it the node answers 503
/// `timeout`; a client waits a little longer, to read that answer.
pub const REQUEST_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(60);
/// An upload that sends nothing for this long is cut off by the node (and
/// changes nothing); a client whose send is stuck this long gives up too.
pub const UPLOAD_IDLE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

/// What a node's control API (`GET /v1/node`) says about the node; clients
/// read the data-plane address from it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeInfo {
    pub name: String,
    pub version: String,
    /// `host:port` of the data plane (TCP transport).
    pub data_addr: String,
    pub control_addr: String,
    pub driver: String,
    #[serde(default)]
    pub data_dir: String,
    /// Opens need a grant's token (false on a node started `--insecure`).
    #[serde(default)]
    pub grants_required: bool,
    /// `ip:port` of the RDMA transport (rdma_cm), when the node serves one.
    #[serde(default)]
    pub rdma_addr: Option<String>,
    /// The TCP data port speaks TLS: clients connect with the same trust
    /// (CA file, client certificate) they reach the control API with.
    #[serde(default)]
    pub data_tls: bool,
}
