//! Where datasets live, as `GET /v1/devices` shows it.

use serde::{Deserialize, Serialize};

/// One place datasets live, for `GET /v1/devices`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct DeviceReport {
    /// `nvme_namespace` (a configured namespace device), `nvme_attached` or
    /// `nvme_detached` (a namespace of a configured controller, path
    /// `CONTROLLER:NSID`), `data_dir` (the filesystem holding file
    /// namespaces), or `orphan` (a file no record owned, quarantined in
    /// `DATA_DIR/orphans/` until `sluicectl orphans purge`).
    pub kind: String,
    pub path: String,
    pub capacity_bytes: u64,
    /// Dataset bytes on a namespace device; filesystem use for the data dir.
    pub used_bytes: u64,
    pub datasets: Vec<String>,
    /// Why the allocator will not place a dataset here, when it will not
    /// (someone else's data on a free device, an unreadable device).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refused: Option<String>,
}
