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
use sluice_serve::{DatasetResolver, OpenError, Opened, Peer};

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
mod datasets;
mod orphans;
mod policy;
mod reads;
mod replication;
mod reports;
mod sources;
mod storage;

pub use datasets::{IndexSource, IngestSession};
pub use policy::{PolicyControl, PolicyRules, TraceSource, POLICY_OBJECT_BYTES_MAX};
pub use reads::Resolver;
pub use sources::SourceSpec;
pub use storage::NamespacePool;

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

/// The control plane of one node. What it holds itself is the datasets'
/// lifecycle (the catalog, the busy set, staged indexes, checksums, the
/// data directory); each other job keeps its state in a struct of its own
/// module, reached only through that module's methods: `storage` (where
/// datasets live), `serving` (the data plane and what is attached to it,
/// in `reads.rs`), `access` (policy and grants), `steering` (`policy.rs`),
/// `cluster` (`replication.rs`) and `source_tier` (`sources.rs`).
pub struct ControlPlane {
    catalog: Arc<dyn CatalogStore>,
    /// Where files no record owns are quarantined until an operator
    /// purges them.
    orphan_dir: PathBuf,
    /// Membership, placement and replication when the catalog is etcd's.
    cluster: replication::ClusterState,
    /// Where datasets live: namespace devices, controllers and their
    /// admin stack, the attach ledger, file namespaces.
    storage: storage::Storage,
    index_dir: PathBuf,
    /// Each sealed dataset's block checksums, beside the data.
    checksums: ChecksumFiles,
    staged_offsets: Mutex<HashMap<String, Vec<u64>>>,
    /// The data plane and the datasets attached to it for reading.
    serving: reads::Serving,
    busy: Mutex<HashSet<String>>,
    info: RwLock<NodeInfo>,
    steering: policy::Steering,
    access: access::Access,
    data_dir: PathBuf,
    /// Object stores, and the caches of the datasets backed by them.
    source_tier: sources::SourceTier,
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

pub(crate) fn now_unix_ms() -> u64 {
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
        // One name for the directory, however it was given (relative, by a
        // symlink): records keep absolute paths under it, and a file is
        // told from an orphan by its path.
        let dir_error = |e: std::io::Error| ControlError::Namespace {
            name: data_dir.display().to_string(),
            message: format!("the data directory: {e}"),
        };
        std::fs::create_dir_all(data_dir).map_err(dir_error)?;
        let data_dir = &std::fs::canonicalize(data_dir).map_err(dir_error)?;
        let storage = storage::Storage::open(data_dir, driver, pool)?;
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
            storage,
            index_dir,
            checksums,
            staged_offsets: Mutex::new(HashMap::new()),
            serving: reads::Serving::new(plane),
            busy: Mutex::new(HashSet::new()),
            info: RwLock::new(NodeInfo { data_dir: data_dir.display().to_string(), ..NodeInfo::default() }),
            steering: policy::Steering::default(),
            access: access::Access::new(),
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
