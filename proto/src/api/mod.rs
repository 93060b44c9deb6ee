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

pub use cluster::{ClusterStatus, CopyStatus, DatasetPlacement, ForeignDataset, Member};
pub use dataset::{
    Appended, CacheReport, DatasetKind, DatasetRecord, DatasetSource, DatasetState, NamespaceKind, NamespaceRecord,
    ScrubReport, SourceObject,
};
pub use devices::{DeviceReport, OrphanFile, Purged};
pub use grants::{grant_ttl_in_bounds, GrantRequest, GrantView, GRANT_TTL_S_MAX};
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
/// The operations whose length is their work's (an upload; a seal or a
/// scrub reads every byte before it answers), as `(method, route)`: the
/// node bounds them by [`UPLOAD_IDLE_TIMEOUT`] instead of
/// [`REQUEST_TIMEOUT`], and clients wait for them without a deadline.
pub const LONG_OPERATIONS: &[(&str, &str)] = &[
    ("POST", "/v1/datasets/{name}/ingest"),
    ("POST", "/v1/datasets/{name}/seal"),
    ("POST", "/v1/datasets/{name}/scrub"),
];

/// Whether `method` on `path` (a request's path, `{name}` filled in, any
/// query after `?`) is one of the [`LONG_OPERATIONS`].
pub fn is_long_operation(method: &str, path: &str) -> bool {
    let path = path.split_once('?').map_or(path, |(path, _)| path);
    LONG_OPERATIONS.iter().any(|&(long_method, route)| {
        long_method == method
            && route.split('/').count() == path.split('/').count()
            && route.split('/').zip(path.split('/')).all(|(r, p)| r == p || (r.starts_with('{') && !p.is_empty()))
    })
}

#[cfg(test)]
mod tests {
    use super::is_long_operation;

    #[test]
    fn long_operations_are_matched_by_route() {
        assert!(is_long_operation("POST", "/v1/datasets/tokens/ingest"));
        assert!(is_long_operation("POST", "/v1/datasets/tokens/ingest?format=npy"));
        assert!(is_long_operation("POST", "/v1/datasets/t/seal"));
        assert!(is_long_operation("POST", "/v1/datasets/t/scrub"));
        assert!(!is_long_operation("GET", "/v1/datasets/t/ingest"));
        assert!(!is_long_operation("POST", "/v1/datasets/t/pin"));
        assert!(!is_long_operation("POST", "/v1/datasets//ingest"));
        assert!(!is_long_operation("POST", "/v1/datasets/t/ingest/more"));
    }
}

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
