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

/// A file no record owns, quarantined in `DATA_DIR/orphans/`
/// (`GET /v1/orphans`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct OrphanFile {
    pub path: String,
    pub bytes: u64,
}

/// What `DELETE /v1/orphans` deleted.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Purged {
    pub files: u64,
    pub bytes: u64,
}
