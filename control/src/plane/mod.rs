//! The control plane of one node: owns the catalog, allocates a namespace
//! per dataset, runs ingest and seal, and attaches sealed datasets to the
//! data plane when a client opens them.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{SystemTime, UNIX_EPOCH};

use sluice_dataplane::driver::DriverKind;
use sluice_dataplane::{BlockDriver, DataPlane, DatasetSlot, DatasetView, Namespace, NamespaceSpec};
use sluice_proto::CHUNK_SIZE_BYTES;
use sluice_proto::{ErrorCode, NodeInfo, OpenInfo};
use sluice_serve::metrics::DatasetCounters;
use sluice_serve::{DatasetResolver, OpenError, Opened};

use crate::auth::AccessPolicy;
use crate::catalog::{
    Catalog, CatalogError, CatalogStore, DatasetRecord, DatasetState, NamespaceKind, NamespaceRecord,
};
use crate::checksums::ChecksumFiles;
use crate::cluster::{EtcdCatalog, Membership};
use crate::grants::{self, GrantRecord, GrantView};
use crate::index::IndexFile;
use crate::ingest::{Appended, Appender, IngestError, IngestFormat, RecordRule};
use sluice_proto::api::DatasetKind;

mod access;
mod allocator;
mod datasets;
mod namespaces;
mod nvme_pool;
mod orphans;
mod ownership;
mod policy;
mod reads;
mod replication;
mod reports;
mod sources;
mod user_space;

pub use datasets::{IndexSource, IngestSession};
pub use policy::{PolicyControl, PolicyRules, TraceSource, POLICY_OBJECT_BYTES_MAX};
pub use reads::Resolver;
pub use sources::SourceSpec;

pub use replication::{CatalogChoice, ReplicaJob, ReplicaTarget};
pub use sluice_proto::api::{ClusterStatus, DeviceReport, ScrubReport};

/// Bytes read per step when sealing.
const SEAL_READ_BYTES: usize = 4 << 20;
/// Largest staged record index (offsets file) accepted.
pub const STAGED_INDEX_BYTES_MAX: usize = 512 << 20;

#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    #[error(transparent)]
    Catalog(#[from] CatalogError),
    #[error("{0}")]
    Ingest(#[from] IngestError),
    #[error("dataset {name:?} is {state}; {action} needs it {needed}")]
    State { name: String, state: DatasetState, action: &'static str, needed: &'static str },
    #[error("dataset {0:?} is busy with another ingest, seal or delete")]
    Busy(String),
    #[error("namespace of {name:?}: {message}")]
    Namespace { name: String, message: String },
    #[error("seal of {name:?} found chunk {chunk} changed since ingest")]
    Corrupt { name: String, chunk: u64 },
    #[error("dataset {0:?} is empty; ingest something before sealing")]
    Empty(String),
    #[error("the data plane refused: {0}")]
    DataPlane(String),
    #[error("{0}")]
    Records(String),
    #[error("{0}")]
    BadGrant(String),
    #[error("no grant {0}")]
    UnknownGrant(u64),
    #[error("{0}")]
    Steering(String),
    #[error("policy refused: {0}")]
    BadPolicy(String),
    #[error("loading steering policies is off on this node (start it with policy_load = true in its config)")]
    PolicyLoadOff,
    #[error("dataset {name:?} has no complete copy on this node; read it from {}", if elsewhere.is_empty() { "a node that holds it (none is live now)".to_string() } else { elsewhere.join(", ") })]
    Elsewhere { name: String, elsewhere: Vec<String> },
    #[error("{0}")]
    Cluster(String),
    #[error(transparent)]
    Identity(#[from] crate::identity::IdentityError),
    /// A source URL, listing or fetch failed, or its objects do not fit
    /// the dataset's kind.
    #[error("{0}")]
    Source(String),
}

impl ControlError {
    /// Stable code for API clients.
    pub fn code(&self) -> &'static str {
        match self {
            Self::Catalog(CatalogError::Unknown(_)) => "unknown_dataset",
            Self::Catalog(CatalogError::Exists(_)) => "dataset_exists",
            Self::Catalog(CatalogError::BadName(_)) => "bad_name",
            Self::Catalog(CatalogError::Full) => "catalog_full",
            Self::Catalog(CatalogError::GrantsFull) => "grants_full",
            Self::BadGrant(_) => "bad_input",
            Self::UnknownGrant(_) => "unknown_grant",
            Self::Steering(_) => "steering_off",
            Self::BadPolicy(_) => "bad_policy",
            Self::PolicyLoadOff => "policy_load_off",
            Self::Catalog(_) => "catalog",
            Self::Ingest(IngestError::NoSpace { .. }) => "no_space",
            Self::Ingest(_) => "bad_input",
            Self::State { .. } => "wrong_state",
            Self::Busy(_) => "busy",
            Self::Namespace { .. } => "namespace",
            Self::Corrupt { .. } => "corrupt",
            Self::Empty(_) => "empty",
            Self::DataPlane(_) => "data_plane",
            Self::Records(_) => "bad_input",
            Self::Elsewhere { .. } => "elsewhere",
            Self::Cluster(_) => "cluster",
            Self::Identity(_) => "identity",
            Self::Source(_) => "source",
        }
    }
}

struct Attached {
    slot: DatasetSlot,
    info: OpenInfo,
}

pub struct ControlPlane {
    catalog: Arc<dyn CatalogStore>,
    /// Where files no record owns are quarantined until an operator
    /// purges them.
    orphan_dir: PathBuf,
    /// Membership, placement and replication when the catalog is etcd's.
    cluster: replication::ClusterState,
    namespace_dir: PathBuf,
    /// Whole block devices (NVMe namespaces) given to this node, one per
    /// dataset, held open exclusively since start; datasets beyond them get
    /// files under `namespace_dir`.
    namespace_devices: Vec<crate::claim::HeldDevice>,
    /// Devices the operator claimed for this start although they carry
    /// someone else's signature (`--claim-device`).
    claimed_devices: Vec<PathBuf>,
    /// Namespaces this node attached from its controllers.
    attach_ledger: ownership::AttachLedger,
    /// Held while a namespace is chosen and recorded, so two creates, or a
    /// create and a copy, never take the same one.
    allocator: Mutex<()>,
    /// NVMe controllers (`/dev/nvmeX`) whose detached namespaces the node
    /// may attach, one per dataset, when no namespace device is free.
    nvme_controllers: Vec<PathBuf>,
    /// How the admin commands for those controllers are issued: here, or
    /// by the privileged helper when the node runs as `--user`.
    kernel_admin: Arc<dyn crate::nvme::KernelAdmin>,
    /// Namespaces attached from the controllers, held open exclusively
    /// from their first use until they are detached, by attachment label.
    attached_devices: Mutex<HashMap<String, crate::claim::HeldDevice>>,
    index_dir: PathBuf,
    /// Each sealed dataset's block checksums, beside the data.
    checksums: ChecksumFiles,
    staged_offsets: Mutex<HashMap<String, Vec<u64>>>,
    driver: Arc<dyn BlockDriver>,
    plane: Arc<DataPlane>,
    namespaces: Mutex<HashMap<u64, Arc<dyn Namespace>>>,
    attached: tokio::sync::Mutex<HashMap<String, Attached>>,
    busy: Mutex<HashSet<String>>,
    info: RwLock<NodeInfo>,
    steering: policy::Steering,
    access: access::Access,
    /// Serving counters per dataset name, shared with the transports.
    serving: Mutex<HashMap<String, Arc<DatasetCounters>>>,
    data_dir: PathBuf,
    /// Object stores, and the caches of the datasets backed by them.
    source_tier: sources::SourceTier,
}

/// Where a node may put datasets besides files in its data directory.
#[derive(Clone, Default)]
pub struct NamespacePool {
    /// Block devices (NVMe namespaces) to give whole to datasets.
    pub devices: Vec<PathBuf>,
    /// Controllers whose detached namespaces may be attached for datasets.
    pub controllers: Vec<PathBuf>,
    /// Who issues the controllers' admin commands; this process
    /// ([`crate::nvme::Passthrough`]) when not given.
    pub admin: Option<Arc<dyn crate::nvme::KernelAdmin>>,
    /// Devices to use although they carry a signature (`--claim-device`).
    pub claim: Vec<PathBuf>,
}

/// Index entries sent per piece of `GET .../index` (1 MiB).
pub const INDEX_PIECE_ENTRIES: u64 = 65_536;

/// Marks a dataset busy for the life of one ingest, seal or delete.
pub struct BusyGuard<'a> {
    plane: &'a ControlPlane,
    name: String,
}

impl Drop for BusyGuard<'_> {
    fn drop(&mut self) {
        if let Ok(mut busy) = self.plane.busy.lock() {
            busy.remove(&self.name);
        }
    }
}

fn now_unix_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

impl ControlPlane {
    /// Opens the catalog under `data_dir` and finishes what a crash left
    /// half done: interrupted deletes complete, orphaned namespace files go,
    /// ingests roll back to their last committed file. `namespace_devices`
    /// are block devices (NVMe namespaces) the node may give to datasets.
    pub fn open(
        data_dir: &Path,
        driver: Arc<dyn BlockDriver>,
        plane: Arc<DataPlane>,
        pool: NamespacePool,
    ) -> Result<Self, ControlError> {
        Self::open_with(data_dir, driver, plane, pool, CatalogChoice::Local, false)
    }

    /// As [`ControlPlane::open`], with the catalog where `choice` says.
    /// The data directory must belong to that catalog
    /// ([`crate::identity`]); `adopt` takes the catalog as the truth.
    pub fn open_with(
        data_dir: &Path,
        driver: Arc<dyn BlockDriver>,
        plane: Arc<DataPlane>,
        pool: NamespacePool,
        choice: CatalogChoice,
        adopt: bool,
    ) -> Result<Self, ControlError> {
        let NamespacePool { devices, controllers: nvme_controllers, admin, claim: claimed_devices } = pool;
        let kernel_admin = admin.unwrap_or_else(|| Arc::new(crate::nvme::Passthrough::new(nvme_controllers.clone())));
        let mut namespace_devices = Vec::with_capacity(devices.len());
        for device in &devices {
            let held = crate::claim::HeldDevice::open(device)
                .map_err(|e| ControlError::Namespace { name: device.display().to_string(), message: e.to_string() })?;
            namespace_devices.push(held);
        }
        let attach_ledger = ownership::AttachLedger::open(data_dir).map_err(|e| ControlError::Namespace {
            name: data_dir.join("attached.json").display().to_string(),
            message: e.to_string(),
        })?;
        let namespace_dir = data_dir.join("namespaces");
        std::fs::create_dir_all(&namespace_dir).map_err(|e| ControlError::Namespace {
            name: namespace_dir.display().to_string(),
            message: e.to_string(),
        })?;
        let index_dir = data_dir.join("indexes");
        std::fs::create_dir_all(&index_dir)
            .map_err(|e| ControlError::Namespace { name: index_dir.display().to_string(), message: e.to_string() })?;
        let checksums = ChecksumFiles::open(data_dir).map_err(|e| ControlError::Namespace {
            name: data_dir.join("checksums").display().to_string(),
            message: e.to_string(),
        })?;
        let node_id = match &choice {
            CatalogChoice::Etcd { node, .. } => Some(node.clone()),
            CatalogChoice::Local => None,
        };
        let (catalog, cluster): (Arc<dyn CatalogStore>, _) = match choice {
            CatalogChoice::Local => {
                (Arc::new(Catalog::open(&data_dir.join("catalog.redb"))?), replication::ClusterState::single())
            }
            CatalogChoice::Etcd { endpoint, access, prefix, node, replicas, repair_after } => {
                let etcd = Arc::new(EtcdCatalog::connect_with(&endpoint, &access, &prefix, &node)?);
                let cluster = replication::ClusterState::new(Some(Arc::clone(&etcd)), replicas, repair_after);
                (etcd as Arc<dyn CatalogStore>, cluster)
            }
        };
        crate::identity::reconcile(data_dir, &*catalog, node_id.as_deref(), adopt)?;
        let orphan_dir = data_dir.join("orphans");
        let control = Self {
            catalog,
            orphan_dir,
            cluster,
            namespace_dir,
            namespace_devices,
            claimed_devices,
            attach_ledger,
            allocator: Mutex::new(()),
            nvme_controllers,
            kernel_admin,
            attached_devices: Mutex::new(HashMap::new()),
            index_dir,
            checksums,
            staged_offsets: Mutex::new(HashMap::new()),
            driver,
            plane,
            namespaces: Mutex::new(HashMap::new()),
            attached: tokio::sync::Mutex::new(HashMap::new()),
            busy: Mutex::new(HashSet::new()),
            info: RwLock::new(NodeInfo { data_dir: data_dir.display().to_string(), ..NodeInfo::default() }),
            steering: policy::Steering::default(),
            access: access::Access::new(),
            serving: Mutex::new(HashMap::new()),
            data_dir: data_dir.to_path_buf(),
            source_tier: sources::SourceTier::default(),
        };
        control.recover()?;
        control.warn_refused_devices();
        control.access.replace_grants(control.catalog.grants()?);
        Ok(control)
    }

    pub fn set_info(&self, update: impl FnOnce(&mut NodeInfo)) {
        if let Ok(mut info) = self.info.write() {
            update(&mut info);
        }
    }

    pub fn info(&self) -> NodeInfo {
        self.info.read().map(|i| i.clone()).unwrap_or_default()
    }

    pub fn catalog(&self) -> &dyn CatalogStore {
        &*self.catalog
    }

    fn ns_error(&self, record: &DatasetRecord, err: impl std::fmt::Display) -> ControlError {
        ControlError::Namespace { name: record.name.clone(), message: err.to_string() }
    }

    fn busy(&self, name: &str) -> Result<BusyGuard<'_>, ControlError> {
        let mut busy = self.busy.lock().map_err(|_| ControlError::Busy(name.to_string()))?;
        if !busy.insert(name.to_string()) {
            return Err(ControlError::Busy(name.to_string()));
        }
        Ok(BusyGuard { plane: self, name: name.to_string() })
    }
}

#[cfg(test)]
mod tests {
    use super::allocator::best_fit;

    /// With a size, the smallest candidate that holds it; none when none
    /// does; without one, the first (the order the operator listed them).
    #[test]
    fn placement_is_best_fit() {
        let free = [("a", 64u64 << 20), ("b", 16 << 30), ("c", 1 << 30)];
        assert_eq!(best_fit(&free, Some(100 << 20)), Some(("c", 1 << 30)));
        assert_eq!(best_fit(&free, Some(2 << 30)), Some(("b", 16 << 30)));
        assert_eq!(best_fit(&free, Some(64 << 20)), Some(("a", 64 << 20)));
        assert_eq!(best_fit(&free, Some(32 << 30)), None);
        assert_eq!(best_fit(&free, None), Some(("a", 64 << 20)));
        assert_eq!(best_fit::<&str>(&[], None), None);
    }
}
