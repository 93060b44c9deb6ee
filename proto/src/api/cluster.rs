//! The cluster as `GET /v1/cluster` shows it: live members, and each
//! dataset's placement and copies.

use serde::{Deserialize, Serialize};

use super::dataset::DatasetState;

/// A live node as it announces itself.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Member {
    pub node: String,
    /// Control API, `http://host:port`: what clients and peers connect to.
    pub control_endpoint: String,
    pub data_addr: String,
    pub started_unix_ms: u64,
}

/// One copy as the cluster sees it.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct CopyStatus {
    pub node: String,
    pub ready: bool,
    /// The node holding it is a live member.
    pub live: bool,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct DatasetPlacement {
    pub name: String,
    pub state: DatasetState,
    pub placement: Vec<String>,
    pub copies: Vec<CopyStatus>,
}

/// A dataset whose record this node's build cannot read, most often one a
/// newer build wrote during a rolling upgrade (a kind this build does not
/// know). This node neither serves nor reaps it, and its name stays taken;
/// the nodes of the newer build serve it.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ForeignDataset {
    pub name: String,
    pub id: u64,
    /// Why the record did not read, as this build's decoder said it.
    pub why: String,
    pub copies: Vec<CopyStatus>,
}

/// `GET /v1/cluster`: the members and where every dataset is.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ClusterStatus {
    /// This node's id; empty on a single node.
    pub node: String,
    pub catalog: String,
    pub replication: usize,
    pub members: Vec<Member>,
    pub datasets: Vec<DatasetPlacement>,
    /// Datasets in the catalog this node's build cannot read. Absent from
    /// the reports of builds before it (so read as empty).
    #[serde(default)]
    pub foreign_datasets: Vec<ForeignDataset>,
}
