//! The lane-steering policy as `GET|PUT|DELETE /v1/policy` show it.

use serde::{Deserialize, Serialize};

/// A policy object attached to the node's probes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct PolicyInfo {
    /// The name it was loaded under (the file name, or `default`).
    pub name: String,
    /// blake3 of the object, to tell two files of one name apart.
    pub object_hash: String,
    pub object_bytes: u64,
    /// Seconds since the Unix epoch when it was attached.
    pub loaded_at_unix_s: u64,
}

/// The steering now (`GET /v1/policy`), or why there is none.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct PolicyReport {
    pub available: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The policy attached; none: lanes by batch size.
    #[serde(default)]
    pub policy: Option<PolicyInfo>,
    /// Policies loaded since start.
    #[serde(default)]
    pub swaps: u64,
    #[serde(default)]
    pub flows: FlowDecisions,
    #[serde(default)]
    pub connections: WorkerConnections,
}

impl PolicyReport {
    /// No steering, and why.
    pub fn unavailable(reason: impl Into<String>) -> Self {
        Self { available: false, reason: Some(reason.into()), ..Self::default() }
    }
}

/// Flows (a dataset on a connection) open, and the lane the policy chose
/// for each.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct FlowDecisions {
    pub open: u64,
    pub undecided: u64,
    pub latency: u64,
    pub bulk: u64,
}

/// Connections the kernel's `sk_reuseport` choice sent to each lane's
/// workers.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct WorkerConnections {
    pub latency_workers: u64,
    pub bulk_workers: u64,
}

/// What `DELETE /v1/policy` detached, if anything.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Unloaded {
    pub unloaded: Option<PolicyInfo>,
}
