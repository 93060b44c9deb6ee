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
use sluice_serve::tcp::{DatasetResolver, OpenError, Opened};

use crate::auth::AccessPolicy;
use crate::catalog::{Catalog, CatalogError, CatalogStore, DatasetRecord, DatasetState, NamespaceRecord};
use crate::checksums::ChecksumFiles;
use crate::cluster::{EtcdCatalog, Membership, REMOTE_KIND};
use crate::grants::{self, GrantRecord, GrantView};
use crate::index::IndexFile;
use crate::ingest::{Appended, Appender, IngestError, IngestFormat, RecordRule};
use sluice_proto::api::DatasetKind;

mod ownership;
mod replication;
mod user_space;

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
    /// The same catalog when it is etcd's: replicas and membership.
    cluster: Option<Arc<EtcdCatalog>>,
    /// Copies of each dataset a cluster keeps.
    replication: usize,
    /// How long a dataset may have fewer than `replication` live placed
    /// nodes before a live node adds itself to its placement.
    repair_after: std::time::Duration,
    /// When each dataset was first seen short of live placed nodes.
    short_since: Mutex<HashMap<String, std::time::Instant>>,
    membership: Mutex<Option<Membership>>,
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
    trace: RwLock<Option<TraceSource>>,
    policy: RwLock<Option<Arc<dyn PolicyControl>>>,
    policy_rules: RwLock<PolicyRules>,
    /// Grants by token hash, mirrored from the catalog.
    grants: RwLock<HashMap<String, GrantRecord>>,
    /// Bumped at every revocation; sessions re-check their grants.
    revocations: tokio::sync::watch::Sender<u64>,
    /// Who may call what (operator tokens and certificates, `--insecure`).
    access: RwLock<Arc<AccessPolicy>>,
    /// Grant-table refreshes made for unknown tokens (in a cluster) in the
    /// current one-second window, so a stream of bad tokens costs etcd at
    /// most [`UNKNOWN_TOKEN_REFRESHES_PER_S_MAX`] reads a second.
    unknown_token_refreshes: Mutex<(std::time::Instant, u32)>,
    /// Serving counters per dataset name, shared with the transports.
    serving: Mutex<HashMap<String, Arc<DatasetCounters>>>,
}

/// The smallest candidate of at least `need` bytes (best fit), or the
/// first candidate when nothing is asked.
fn best_fit<T: Clone>(candidates: &[(T, u64)], need: Option<u64>) -> Option<(T, u64)> {
    match need {
        None => candidates.first().cloned(),
        Some(need) => candidates.iter().filter(|(_, capacity)| *capacity >= need).min_by_key(|(_, c)| *c).cloned(),
    }
}

fn hint_words(size_hint: Option<u64>) -> String {
    size_hint.map(|bytes| format!("; the smallest that holds the {bytes} bytes asked")).unwrap_or_default()
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

/// Produces the eBPF trace snapshot `GET /v1/trace` serves.
pub type TraceSource = Arc<dyn Fn() -> serde_json::Value + Send + Sync>;

/// The node's lane-steering policy as the control API manages it; the BPF
/// side lives with the node binary, which sets this at start with `--ebpf`.
pub trait PolicyControl: Send + Sync {
    /// The policy attached now, decision counts, swaps so far.
    fn show(&self) -> serde_json::Value;
    /// Loads `object` (a BPF ELF object) as the policy, replacing the one
    /// attached; on error the old one stays.
    fn load(&self, name: &str, object: &[u8]) -> Result<serde_json::Value, String>;
    /// Detaches the policy; the size threshold decides again.
    fn unload(&self) -> Result<serde_json::Value, String>;
}

/// Largest policy object `PUT /v1/policy` takes.
pub const POLICY_OBJECT_BYTES_MAX: usize = 4 << 20;

/// Index entries sent per piece of `GET .../index` (1 MiB).
pub const INDEX_PIECE_ENTRIES: u64 = 65_536;

/// A dataset's sample index, to read a piece at a time.
pub enum IndexSource {
    /// Fixed-size records: the entries follow from the size.
    Fixed {
        size: u64,
        count: u64,
    },
    File {
        file: IndexFile,
        count: u64,
    },
}

impl IndexSource {
    pub fn entries(&self) -> u64 {
        match self {
            Self::Fixed { count, .. } | Self::File { count, .. } => *count,
        }
    }

    /// `count` entries from entry `first`, as raw bytes.
    pub fn read(&self, first: u64, count: u64) -> std::io::Result<Vec<u8>> {
        match self {
            Self::Fixed { size, .. } => Ok((first..first + count)
                .flat_map(|i| (i * size).to_le_bytes().into_iter().chain(size.to_le_bytes()))
                .collect()),
            Self::File { file, .. } => file.read_raw_range(first, count),
        }
    }
}

/// Most grant-table refreshes a second that unknown tokens may cause.
const UNKNOWN_TOKEN_REFRESHES_PER_S_MAX: u32 = 8;

/// Whether policies may be loaded through the API, and which.
#[derive(Clone, Debug, Default)]
pub struct PolicyRules {
    /// `policy_load = true`: operators may swap the policy at run time.
    pub load_enabled: bool,
    /// `policy_allowlist`: the sha256 of every object that may be loaded;
    /// any object passing the checks when `None`.
    pub allowlist: Option<Vec<[u8; 32]>>,
}
const STEERING_OFF: &str = "lane steering is off: start sluiced with --ebpf (as root)";

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
        let kernel_admin = admin.unwrap_or_else(|| Arc::new(crate::nvme::Passthrough));
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
        let (catalog, cluster, replication, repair_after): (Arc<dyn CatalogStore>, _, _, _) = match choice {
            CatalogChoice::Local => {
                (Arc::new(Catalog::open(&data_dir.join("catalog.redb"))?), None, 1, std::time::Duration::MAX)
            }
            CatalogChoice::Etcd { endpoint, access, prefix, node, replicas, repair_after } => {
                let etcd = Arc::new(EtcdCatalog::connect_with(&endpoint, &access, &prefix, &node)?);
                (Arc::clone(&etcd) as Arc<dyn CatalogStore>, Some(etcd), replicas.max(1), repair_after)
            }
        };
        crate::identity::reconcile(data_dir, &*catalog, node_id.as_deref(), adopt)?;
        let orphan_dir = data_dir.join("orphans");
        let control = Self {
            catalog,
            orphan_dir,
            cluster,
            replication,
            repair_after,
            short_since: Mutex::new(HashMap::new()),
            membership: Mutex::new(None),
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
            trace: RwLock::new(None),
            policy: RwLock::new(None),
            grants: RwLock::new(HashMap::new()),
            revocations: tokio::sync::watch::Sender::new(0),
            access: RwLock::new(Arc::new(AccessPolicy::default())),
            policy_rules: RwLock::new(PolicyRules::default()),
            unknown_token_refreshes: Mutex::new((std::time::Instant::now(), 0)),
            serving: Mutex::new(HashMap::new()),
        };
        control.recover()?;
        control.warn_refused_devices();
        let grants = control.catalog.grants()?;
        if let Ok(mut map) = control.grants.write() {
            map.extend(grants.into_iter().map(|g| (g.token_hash.clone(), g)));
        }
        Ok(control)
    }

    fn recover(&self) -> Result<(), ControlError> {
        let records = self.catalog.list()?;
        let mut known = HashSet::new();
        for record in &records {
            match record.state {
                DatasetState::Deleting => {
                    tracing::info!("finishing the interrupted delete of {}", record.name);
                    self.remove_namespace(record);
                    self.catalog.remove(record)?;
                    continue;
                }
                DatasetState::Ingesting | DatasetState::Creating if record.namespace.kind == "file" => {
                    // Bytes past the committed length belong to an ingest
                    // that never finished.
                    let ns = self.namespace(record)?;
                    ns.truncate(record.namespace.base_offset_bytes + record.length_bytes)
                        .map_err(|e| self.ns_error(record, e))?;
                }
                _ => {}
            }
            if record.kind.has_records() && record.record_size_bytes.is_none() {
                // Index entries past the committed count belong to an ingest
                // that never finished.
                self.index_file(record)?.truncate(record.record_count).map_err(|e| self.ns_error(record, e))?;
            }
            known.insert(PathBuf::from(&record.namespace.path));
            known.insert(self.index_path(record));
            known.insert(self.checksums.path(record.id));
        }
        for dir in [&self.namespace_dir, &self.index_dir, &self.checksums.dir().to_path_buf()] {
            for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
                let path = entry.path();
                if !known.contains(&path) {
                    self.quarantine(&path)?;
                }
            }
        }
        Ok(())
    }

    /// Moves a file no record owns into `orphans/`, under a name that says
    /// where it was; never deletes it.
    fn quarantine(&self, path: &Path) -> Result<(), ControlError> {
        let failed =
            |e: std::io::Error| ControlError::Namespace { name: path.display().to_string(), message: e.to_string() };
        std::fs::create_dir_all(&self.orphan_dir).map_err(failed)?;
        let from =
            path.parent().and_then(|p| p.file_name()).map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        let mut target = self.orphan_dir.join(format!("{from}-{name}"));
        let mut n = 1;
        while target.exists() {
            target = self.orphan_dir.join(format!("{from}-{name}.{n}"));
            n += 1;
        }
        std::fs::rename(path, &target).map_err(failed)?;
        tracing::warn!(
            "quarantined {} as {}: no record owns it (`sluicectl orphans purge` deletes quarantined files)",
            path.display(),
            target.display()
        );
        Ok(())
    }

    /// The files quarantined in `orphans/`: (path, bytes).
    pub fn orphans(&self) -> Vec<(String, u64)> {
        let mut files: Vec<(String, u64)> = std::fs::read_dir(&self.orphan_dir)
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| Some((e.path().display().to_string(), e.metadata().ok()?.len())))
            .collect();
        files.sort();
        files
    }

    /// Deletes every quarantined file, on an operator's word: (files, bytes).
    pub fn purge_orphans(&self) -> Result<(u64, u64), ControlError> {
        let (mut files, mut bytes) = (0, 0);
        for (path, len) in self.orphans() {
            std::fs::remove_file(&path)
                .map_err(|e| ControlError::Namespace { name: path.clone(), message: e.to_string() })?;
            tracing::warn!("purged quarantined file {path} ({len} bytes)");
            files += 1;
            bytes += len;
        }
        Ok((files, bytes))
    }

    pub fn set_info(&self, update: impl FnOnce(&mut NodeInfo)) {
        if let Ok(mut info) = self.info.write() {
            update(&mut info);
        }
    }

    /// Sets where trace snapshots come from (the node's eBPF tracer).
    pub fn set_trace_source(&self, source: TraceSource) {
        if let Ok(mut trace) = self.trace.write() {
            *trace = Some(source);
        }
    }

    /// Sets what manages the steering policy (the node's eBPF steering).
    pub fn set_policy_control(&self, control: Arc<dyn PolicyControl>) {
        if let Ok(mut policy) = self.policy.write() {
            *policy = Some(control);
        }
    }

    fn policy_control(&self) -> Result<Arc<dyn PolicyControl>, ControlError> {
        self.policy.read().ok().and_then(|p| p.clone()).ok_or_else(|| ControlError::Steering(STEERING_OFF.into()))
    }

    /// The steering policy now, or why there is none.
    pub fn policy(&self) -> serde_json::Value {
        match self.policy_control() {
            Ok(control) => control.show(),
            Err(err) => serde_json::json!({ "available": false, "reason": err.to_string() }),
        }
    }

    /// Whether operators may load policies at run time, and which objects.
    pub fn set_policy_rules(&self, rules: PolicyRules) {
        if let Ok(mut current) = self.policy_rules.write() {
            *current = rules;
        }
    }

    /// Swaps in the policy in `object`: only where the config allows
    /// loading, only an object on the allowlist when there is one; the
    /// steering side then checks what the object would do in the kernel.
    pub fn load_policy(&self, name: &str, object: &[u8]) -> Result<serde_json::Value, ControlError> {
        let rules = self.policy_rules.read().map(|r| r.clone()).unwrap_or_default();
        if !rules.load_enabled {
            return Err(ControlError::PolicyLoadOff);
        }
        if object.is_empty() || object.len() > POLICY_OBJECT_BYTES_MAX {
            return Err(ControlError::BadPolicy(format!(
                "a policy object is 1 to {POLICY_OBJECT_BYTES_MAX} bytes; got {}",
                object.len()
            )));
        }
        if let Some(allowed) = &rules.allowlist {
            use sha2::Digest;
            let digest: [u8; 32] = sha2::Sha256::digest(object).into();
            if !allowed.contains(&digest) {
                return Err(ControlError::BadPolicy(format!(
                    "object sha256:{} is not on this node's policy_allowlist",
                    crate::hex::encode(&digest)
                )));
            }
        }
        let loaded = self.policy_control()?.load(name, object).map_err(ControlError::BadPolicy)?;
        tracing::warn!(policy = name, "steering policy loaded through the control API");
        Ok(loaded)
    }

    /// Detaches the steering policy.
    pub fn unload_policy(&self) -> Result<serde_json::Value, ControlError> {
        self.policy_control()?.unload().map_err(ControlError::Steering)
    }

    /// The current trace snapshot, or why there is none.
    pub fn trace_snapshot(&self) -> serde_json::Value {
        match self.trace.read().ok().and_then(|t| t.clone()) {
            Some(source) => source(),
            None => serde_json::json!({
                "available": false,
                "reason": "eBPF tracing is off: start sluiced with --ebpf (as root)",
            }),
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

    /// Every namespace path this node's records use. In a cluster, this
    /// node's copy records are the whole of it: every dataset it holds has
    /// one, and so has a copy of a dataset deleted elsewhere that the reaper
    /// has not released yet.
    fn namespaces_in_use(&self) -> Result<HashSet<String>, ControlError> {
        Ok(match self.cluster.as_deref() {
            Some(cluster) => cluster.own_replicas()?.into_values().map(|r| r.namespace.path).collect(),
            None => self.catalog.list()?.into_iter().map(|r| r.namespace.path).collect(),
        })
    }

    /// Why a free namespace device may not take a dataset: someone else's
    /// data on it, unless the operator claimed it for this start.
    fn device_refusal(&self, device: &crate::claim::HeldDevice) -> Option<String> {
        if self.claimed_devices.contains(&device.path) {
            return None;
        }
        let why = device.foreign_use()?;
        Some(format!("{why}; --claim-device {} uses it anyway", device.path.display()))
    }

    /// Says once, at start, which free namespace devices the allocator
    /// will leave alone and why (`devices ls` says it again on asking).
    fn warn_refused_devices(&self) {
        let Ok(used) = self.namespaces_in_use() else { return };
        for device in self.namespace_devices.iter().filter(|d| !used.contains(&d.path.display().to_string())) {
            if let Some(why) = self.device_refusal(device) {
                tracing::warn!("{} is not used for datasets: {why}", device.path.display());
            }
        }
    }

    fn held_device(&self, path: &Path) -> Option<&crate::claim::HeldDevice> {
        self.namespace_devices.iter().find(|d| d.path == path)
    }

    /// Chooses where a new dataset lives. With the uring driver: a whole
    /// namespace device while one is free; else a namespace attached from a
    /// configured controller's detached pool; else a file per dataset in the
    /// node's namespace directory. With a size hint, only namespaces that
    /// hold it count, and the smallest of those is taken (best fit, so big
    /// namespaces stay free for big datasets). The caller holds [`ControlPlane::allocator`] until the choice is
    /// recorded, so two creates, or a create and a copy, never pick the
    /// same namespace.
    fn allocate_namespace(&self, id: u64, size_hint: Option<u64>) -> NamespaceRecord {
        let file =
            |reason: String| NamespaceRecord::new("file", self.file_namespace_path(id).display().to_string(), reason);
        match self.driver.kind() {
            DriverKind::Mem => {
                return NamespaceRecord::new(
                    "mem",
                    format!("mem:{id}"),
                    "memory driver: a namespace in RAM, gone at restart",
                )
            }
            DriverKind::Uring if self.namespace_devices.is_empty() && self.nvme_controllers.is_empty() => {
                return file("no NVMe namespace configured: a file per dataset under the data directory".into())
            }
            DriverKind::Spdk => match self.driver.nvme_admin() {
                Some(admin) => return self.allocate_user_space(admin, size_hint),
                None => return file("the SPDK driver offers no namespace management".into()),
            },
            DriverKind::Uring => {}
        }
        let used = match self.namespaces_in_use() {
            Ok(used) => used,
            // Unknown use: claim no device rather than risk sharing one.
            Err(_) => return file("the catalog could not say which namespaces are in use: a file".into()),
        };
        let free: Vec<(&PathBuf, u64)> = self
            .namespace_devices
            .iter()
            .filter(|d| !used.contains(&d.path.display().to_string()))
            .filter(|d| self.device_refusal(d).is_none())
            .map(|d| (&d.path, d.capacity_bytes))
            .collect();
        if let Some((device, capacity_bytes)) = best_fit(&free, size_hint) {
            return NamespaceRecord::new(
                "device",
                device.display().to_string(),
                format!(
                    "a whole NVMe namespace: {} of {capacity_bytes} bytes ({} of {} namespace devices were free{})",
                    device.display(),
                    free.len(),
                    self.namespace_devices.len(),
                    hint_words(size_hint),
                ),
            );
        }
        let mut why_not = Vec::new();
        if !free.is_empty() {
            why_not.push(format!("no free namespace device holds {} bytes", size_hint.unwrap_or(0)));
        }
        for path in &self.nvme_controllers {
            match self.attach_from(path, size_hint) {
                Ok(record) => return record,
                Err(err) => why_not.push(err),
            }
        }
        file(format!(
            "no free NVMe namespace ({} namespace devices in use{}{}): a file under the data directory",
            self.namespace_devices.len() - free.len(),
            if why_not.is_empty() { "" } else { "; " },
            why_not.join("; ")
        ))
    }

    /// A namespace of the controller at `path` for a new dataset. With a
    /// size: a namespace of exactly that size, created through Namespace
    /// Management where the controller allows it. Otherwise, or when the
    /// controller refuses create: a detached namespace of its pool, the
    /// smallest that holds the size, or the first without one.
    fn attach_from(&self, path: &Path, size_hint: Option<u64>) -> Result<NamespaceRecord, String> {
        let admin = &*self.kernel_admin;
        let mut create_refused = String::new();
        if let Some(bytes) = size_hint {
            match admin.manages_namespaces(path) {
                Ok(true) => match self.create_on(path, bytes) {
                    Ok(record) => return Ok(record),
                    Err(err) => create_refused = format!("; namespace create refused ({err})"),
                },
                Ok(false) => create_refused = "; the controller has no namespace management".into(),
                Err(err) => create_refused = format!("; namespace management unknown ({err})"),
            }
        }
        let detached: Vec<(u32, u64)> = admin
            .namespaces(path)
            .map_err(|e| format!("{}: {e}", path.display()))?
            .into_iter()
            .filter(|ns| !ns.attached && !ns.shared)
            .map(|ns| (ns.nsid, ns.capacity_bytes))
            .collect();
        if detached.is_empty() {
            return Err(format!(
                "{} has no detached namespace that is not shared with other controllers (NMIC){create_refused}",
                path.display()
            ));
        }
        let (nsid, capacity_bytes) = best_fit(&detached, size_hint).ok_or_else(|| {
            format!(
                "no detached namespace of {} holds {} bytes{create_refused}",
                path.display(),
                size_hint.unwrap_or(0)
            )
        })?;
        let device = self.attach_recorded(path, nsid, false)?;
        tracing::info!("attached namespace {nsid} of {} as {}", path.display(), device.display());
        let reason = format!(
            "a whole NVMe namespace attached for it: namespace {nsid} of {}, {capacity_bytes} bytes ({} were detached{}){create_refused}",
            path.display(),
            detached.len(),
            hint_words(size_hint),
        );
        Ok(NamespaceRecord::new("device", device.display().to_string(), reason)
            .attached_as(crate::nvme::attachment_label(path, nsid), false))
    }

    /// Creates a namespace of `bytes` on `controller` and attaches it; a
    /// namespace made but not attached is deleted again.
    fn create_on(&self, path: &Path, bytes: u64) -> Result<NamespaceRecord, String> {
        let admin = &*self.kernel_admin;
        let nsid = admin.create_namespace(path, bytes).map_err(|e| e.to_string())?;
        let device = match self.attach_recorded(path, nsid, true) {
            Ok(device) => device,
            Err(err) => {
                if let Err(cleanup) = admin.delete_namespace(path, nsid) {
                    tracing::warn!("deleting namespace {nsid} of {} after a failed attach: {cleanup}", path.display());
                }
                return Err(err);
            }
        };
        tracing::info!("created namespace {nsid} of {} ({bytes} bytes) as {}", path.display(), device.display());
        let reason = format!(
            "a whole NVMe namespace created for it: namespace {nsid} of {}, {bytes} bytes asked",
            path.display()
        );
        Ok(NamespaceRecord::new("device", device.display().to_string(), reason)
            .attached_as(crate::nvme::attachment_label(path, nsid), true))
    }

    /// Attaches `nsid`, first writing it into the ledger of namespaces
    /// this node attached (so a crash right after leaves it owned).
    fn attach_recorded(&self, controller: &Path, nsid: u32, created: bool) -> Result<PathBuf, String> {
        let admin = &*self.kernel_admin;
        let label = crate::nvme::attachment_label(controller, nsid);
        let identity = admin.namespace_identity(controller, nsid).map_err(|e| format!("identifying {label}: {e}"))?;
        if crate::nvme::identity_is_blank(&identity) {
            tracing::warn!("{label} reports no NGUID or EUI64: only its NSID identifies it before a detach");
        }
        self.attach_ledger
            .insert(ownership::Attachment { label: label.clone(), identity, created })
            .map_err(|e| format!("recording the attachment of {label}: {e}"))?;
        admin.attach(controller, nsid).map_err(|e| {
            if let Err(forget) = self.attach_ledger.remove(&label) {
                tracing::warn!("forgetting the failed attachment of {label}: {forget}");
            }
            e.to_string()
        })
    }

    fn namespace(&self, record: &DatasetRecord) -> Result<Arc<dyn Namespace>, ControlError> {
        let mut namespaces = self.namespaces.lock().map_err(|_| self.ns_error(record, "lock poisoned"))?;
        if let Some(ns) = namespaces.get(&record.id) {
            return Ok(Arc::clone(ns));
        }
        self.check_owned(record.id, &record.namespace)?;
        let spec = match record.namespace.kind.as_str() {
            "file" => NamespaceSpec::File { path: PathBuf::from(&record.namespace.path), create: true },
            "device" => self.device_spec(&record.namespace).map_err(|e| self.ns_error(record, e))?,
            user_space::NVME_KIND => {
                let (controller, nsid) = user_space::parse_nvme_path(&record.namespace.path)
                    .ok_or_else(|| self.ns_error(record, "an nvme namespace path is PCI_ADDRESS/NSID"))?;
                NamespaceSpec::Nvme { controller, nsid }
            }
            "mem" => NamespaceSpec::Mem,
            other => return Err(self.ns_error(record, format!("unknown namespace kind {other}"))),
        };
        let ns = self.driver.open_namespace(&spec).map_err(|e| self.ns_error(record, e))?;
        namespaces.insert(record.id, Arc::clone(&ns));
        Ok(ns)
    }

    /// A device namespace by the descriptors held since start, or (one
    /// attached from a controller) by those held since its first use.
    fn device_spec(&self, namespace: &NamespaceRecord) -> Result<NamespaceSpec, String> {
        let held_spec = |held: &crate::claim::HeldDevice| NamespaceSpec::Held {
            path: held.path.clone(),
            control: Arc::clone(&held.control),
            direct: Arc::clone(&held.direct),
        };
        if let Some(held) = self.held_device(Path::new(&namespace.path)) {
            return Ok(held_spec(held));
        }
        let label = namespace.attached.as_deref().ok_or("not a namespace device of this node")?;
        let (controller, nsid) =
            crate::nvme::parse_attachment_label(label).ok_or_else(|| format!("{label} is not CONTROLLER:NSID"))?;
        let mut attached = self.attached_devices.lock().map_err(|_| "attached devices lock poisoned")?;
        if let Some(held) = attached.get(label) {
            return Ok(held_spec(held));
        }
        let held = self.kernel_admin.open_namespace(&controller, nsid).map_err(|e| format!("opening {label}: {e}"))?;
        if held.path != Path::new(&namespace.path) {
            return Err(format!("{label} is {}, not {}", held.path.display(), namespace.path));
        }
        let spec = held_spec(&held);
        attached.insert(label.to_string(), held);
        Ok(spec)
    }

    fn index_path(&self, record: &DatasetRecord) -> PathBuf {
        self.index_dir.join(format!("{:016x}.idx", record.id))
    }

    fn index_file(&self, record: &DatasetRecord) -> Result<IndexFile, ControlError> {
        IndexFile::open(&self.index_path(record)).map_err(|e| self.ns_error(record, e))
    }

    /// Where a `records` or `wds` dataset's sample index is read from, a
    /// piece at a time.
    pub fn record_index_source(&self, name: &str) -> Result<IndexSource, ControlError> {
        let record = self.catalog.require(name)?;
        if !record.kind.has_records() {
            return Err(ControlError::Records(format!("{name} is {}, which has no record index", record.kind)));
        }
        Ok(match record.record_size_bytes {
            Some(size) => IndexSource::Fixed { size, count: record.record_count },
            None => IndexSource::File { file: self.index_file(&record)?, count: record.record_count },
        })
    }

    /// Holds the offsets (`n + 1` u64, from 0 to the file's length) of the
    /// next `records` file ingested into `name`.
    pub fn stage_offsets(&self, name: &str, bytes: &[u8], format: IngestFormat) -> Result<u64, ControlError> {
        let record = self.catalog.require(name)?;
        if record.kind != DatasetKind::Records || record.record_size_bytes.is_some() {
            return Err(ControlError::Records(format!(
                "{name} takes no offsets index (kind {}, fixed size {:?})",
                record.kind, record.record_size_bytes
            )));
        }
        let data = match format {
            IngestFormat::Raw => bytes,
            IngestFormat::Npy => {
                let header =
                    sluice_proto::npy::parse_header(bytes).map_err(|e| ControlError::Records(e.to_string()))?;
                if !matches!(header.descr.as_str(), "<u8" | "<i8") {
                    return Err(ControlError::Records(format!("offsets must be <u8 or <i8, not {}", header.descr)));
                }
                let data = &bytes[header.data_offset_bytes..];
                if Some(data.len() as u64) != header.data_len_bytes() {
                    return Err(ControlError::Records("truncated offsets .npy".into()));
                }
                data
            }
        };
        if data.len() % 8 != 0 || data.len() < 8 {
            return Err(ControlError::Records(format!("{} bytes of offsets is not a list of u64", data.len())));
        }
        let offsets: Vec<u64> =
            data.chunks_exact(8).map(|c| u64::from_le_bytes(c.try_into().unwrap_or([0; 8]))).collect();
        let count = offsets.len() as u64 - 1;
        self.staged_offsets.lock().map_err(|_| ControlError::Busy(name.into()))?.insert(name.to_string(), offsets);
        Ok(count)
    }

    fn record_rule(&self, record: &DatasetRecord) -> Result<RecordRule, ControlError> {
        Ok(match (record.kind, record.record_size_bytes) {
            (DatasetKind::Records, Some(size)) => RecordRule::Fixed(size),
            (DatasetKind::Records, None) => {
                let staged = self
                    .staged_offsets
                    .lock()
                    .map_err(|_| ControlError::Busy(record.name.clone()))?
                    .remove(&record.name);
                RecordRule::Offsets(staged.ok_or_else(|| {
                    ControlError::Records(format!(
                        "{} is a records dataset: send its offsets first (sluicectl dataset ingest {} FILE --index OFFSETS)",
                        record.name, record.name
                    ))
                })?)
            }
            (DatasetKind::Wds, _) => RecordRule::Tar(Box::default()),
            _ => RecordRule::None,
        })
    }

    /// Gives a dataset's namespace back: discards the bytes it used,
    /// detaches (and deletes) a namespace this node attached, removes a
    /// file namespace. Only a namespace [`ControlPlane::check_owned`]
    /// accepts; any other is left as it is.
    fn remove_namespace(&self, record: &DatasetRecord) {
        let _ = std::fs::remove_file(self.index_path(record));
        self.checksums.remove(record.id);
        if let Ok(mut namespaces) = self.namespaces.lock() {
            namespaces.remove(&record.id);
        }
        if self.check_owned(record.id, &record.namespace).is_err() {
            return;
        }
        if record.namespace.kind == "device" || record.namespace.kind == user_space::NVME_KIND {
            // The device goes back to the pool; tell it the bytes are free,
            // and no more than the dataset used.
            let used = record.length_bytes.next_multiple_of(CHUNK_SIZE_BYTES);
            let spec = match user_space::parse_nvme_path(&record.namespace.path) {
                Some((controller, nsid)) if record.namespace.kind == user_space::NVME_KIND => {
                    Ok(NamespaceSpec::Nvme { controller, nsid })
                }
                _ => self.device_spec(&record.namespace),
            };
            match spec.and_then(|spec| self.driver.open_namespace(&spec).map_err(|e| e.to_string())) {
                Ok(ns) => {
                    if let Err(err) = ns.discard(record.namespace.base_offset_bytes, used) {
                        tracing::warn!("discarding {} bytes of {}: {err}", used, record.namespace.path);
                    }
                }
                Err(err) => tracing::warn!("releasing {}: {err}", record.namespace.path),
            }
        }
        if record.namespace.kind == user_space::NVME_KIND {
            self.release_user_space(record);
        } else if let Some(label) = record.namespace.attached.as_deref() {
            self.detach_recorded(label);
        }
        if record.namespace.kind == "file" {
            if let Err(err) = std::fs::remove_file(&record.namespace.path) {
                if err.kind() != std::io::ErrorKind::NotFound {
                    tracing::warn!("removing {}: {err}", record.namespace.path);
                }
            }
        }
    }

    /// Detaches a namespace this node attached, back to the controller's
    /// pool, and deletes it when this node created it (the ledger says,
    /// not the record).
    fn detach_recorded(&self, label: &str) {
        let (Some((controller, nsid)), Some(entry)) =
            (crate::nvme::parse_attachment_label(label), self.attach_ledger.get(label))
        else {
            return;
        };
        // Our descriptors go first: the device node goes with the detach.
        if let Ok(mut attached) = self.attached_devices.lock() {
            attached.remove(label);
        }
        let admin = &*self.kernel_admin;
        match admin.detach(&controller, nsid) {
            Ok(()) => {
                tracing::info!("detached namespace {nsid} of {}", controller.display());
                // One created for the dataset goes back to unallocated
                // capacity; one from the pool stays in the pool.
                if entry.created {
                    match admin.delete_namespace(&controller, nsid) {
                        Ok(()) => tracing::info!("deleted namespace {nsid} of {}", controller.display()),
                        Err(err) => tracing::warn!("deleting namespace {nsid} of {}: {err}", controller.display()),
                    }
                }
                if let Err(err) = self.attach_ledger.remove(label) {
                    tracing::warn!("forgetting the attachment of {label}: {err}");
                }
            }
            Err(err) => tracing::warn!("detaching namespace {nsid} of {}: {err}", controller.display()),
        }
    }

    pub fn create(&self, name: &str, kind: DatasetKind) -> Result<DatasetRecord, ControlError> {
        self.create_with(name, kind, None, None)
    }

    /// Creates a dataset; `record_size` makes a `records` dataset of fixed
    /// size records (no index needed); `size_hint` (the bytes it will hold)
    /// makes placement take only a namespace that holds them.
    pub fn create_with(
        &self,
        name: &str,
        kind: DatasetKind,
        record_size: Option<u64>,
        size_hint: Option<u64>,
    ) -> Result<DatasetRecord, ControlError> {
        if record_size.is_some() && kind != DatasetKind::Records {
            return Err(ControlError::Records("--record-size applies to records datasets only".into()));
        }
        if record_size == Some(0) {
            return Err(ControlError::Records("record size must be at least 1 byte".into()));
        }
        let allocating = self.allocator.lock().map_err(|_| ControlError::Busy(name.to_string()))?;
        let mut record =
            self.catalog.create(name, kind, now_unix_ms(), &mut |id| self.allocate_namespace(id, size_hint))?;
        drop(allocating);
        if record.namespace.kind == user_space::UNPLACED_KIND {
            self.catalog.remove(&record)?;
            return Err(ControlError::Namespace { name: name.into(), message: record.namespace.reason });
        }
        let placement = self.place_replicas();
        if record_size.is_some() || !placement.is_empty() {
            record.record_size_bytes = record_size;
            record.placement = placement;
            self.catalog.update(&record, None)?;
        }
        self.namespace(&record)?;
        Ok(record)
    }

    pub fn get(&self, name: &str) -> Result<DatasetRecord, ControlError> {
        Ok(self.catalog.require(name)?)
    }

    pub fn list(&self) -> Result<Vec<DatasetRecord>, ControlError> {
        Ok(self.catalog.list()?)
    }

    pub fn chunk_crcs(&self, name: &str) -> Result<Vec<u32>, ControlError> {
        let record = self.catalog.require(name)?;
        Ok(self.catalog.chunk_crcs(record.id)?)
    }

    /// Starts appending one file to `name`.
    pub fn begin_ingest(&self, name: &str, format: IngestFormat) -> Result<IngestSession<'_>, ControlError> {
        let guard = self.busy(name)?;
        let record = self.catalog.require(name)?;
        if record.namespace.kind == REMOTE_KIND {
            return Err(ControlError::Cluster(format!(
                "{name} was created on node {}: ingest it there",
                record.placement.first().map(String::as_str).unwrap_or("another node")
            )));
        }
        if !matches!(record.state, DatasetState::Creating | DatasetState::Ingesting) {
            return Err(ControlError::State {
                name: name.into(),
                state: record.state,
                action: "ingest",
                needed: "creating or ingesting",
            });
        }
        let crcs = self.catalog.chunk_crcs(record.id)?;
        let ns = self.namespace(&record)?;
        let rule = self.record_rule(&record)?;
        let appender =
            Appender::new(ns, record.kind, format, record.namespace.base_offset_bytes, record.length_bytes, crcs, rule);
        Ok(IngestSession { control: self, _guard: guard, record, appender })
    }

    /// Verifies every chunk against the checksums taken at ingest, hashes the
    /// content and makes the dataset immutable. Blocking: reads it all.
    pub fn seal(&self, name: &str) -> Result<DatasetRecord, ControlError> {
        let _guard = self.busy(name)?;
        let mut record = self.catalog.require(name)?;
        match record.state {
            DatasetState::Sealed => return Ok(record),
            DatasetState::Ingesting if record.kind.has_records() && record.record_count == 0 => {
                return Err(ControlError::Empty(name.into()))
            }
            DatasetState::Ingesting => {}
            DatasetState::Creating => return Err(ControlError::Empty(name.into())),
            state => return Err(ControlError::State { name: name.into(), state, action: "seal", needed: "ingesting" }),
        }
        let crcs = self.catalog.chunk_crcs(record.id)?;
        let ns = self.namespace(&record)?;
        let mut hasher = blake3::Hasher::new();
        let mut block_crcs = Vec::with_capacity(sluice_dataplane::blocks::block_count(record.length_bytes) as usize);
        let mut buf = vec![0u8; SEAL_READ_BYTES];
        let mut at = 0u64;
        while at < record.length_bytes {
            let len = (record.length_bytes - at).min(SEAL_READ_BYTES as u64) as usize;
            let piece = &mut buf[..len];
            ns.read_at(record.namespace.base_offset_bytes + at, piece).map_err(|e| self.ns_error(&record, e))?;
            for (i, chunk) in piece.chunks(CHUNK_SIZE_BYTES as usize).enumerate() {
                let index = at / CHUNK_SIZE_BYTES + i as u64;
                let crc = sluice_dataplane::blocks::chunk_crc_and_blocks(chunk, &mut block_crcs);
                if crcs.get(index as usize) != Some(&crc) {
                    return Err(ControlError::Corrupt { name: name.into(), chunk: index });
                }
            }
            hasher.update(piece);
            at += len as u64;
        }
        ns.truncate(record.namespace.base_offset_bytes + record.length_bytes)
            .and_then(|()| ns.sync())
            .map_err(|e| self.ns_error(&record, e))?;
        // The block checksums every read is verified by, durable before
        // the dataset is readable.
        self.checksums.write(record.id, &block_crcs).map_err(|e| self.ns_error(&record, e))?;
        record.state = DatasetState::Sealed;
        record.content_hash = Some(format!("blake3:{}", hasher.finalize().to_hex()));
        record.sealed_unix_ms = Some(now_unix_ms());
        self.catalog.update(&record, None)?;
        Ok(record)
    }

    /// Removes a dataset: new opens fail at once, open handles fail their
    /// next batch, and its namespace is released.
    pub async fn delete(&self, name: &str) -> Result<(), ControlError> {
        let _guard = self.busy(name)?;
        let mut record = self.catalog.require(name)?;
        // Its grants go first, which also closes the sessions reading it.
        let doomed: Vec<u64> = self
            .grants
            .read()
            .map(|g| g.values().filter(|g| g.dataset_id == record.id).map(|g| g.id).collect())
            .unwrap_or_default();
        for id in doomed {
            match self.revoke_grant(id) {
                // Revoked on another node since this one last looked.
                Ok(()) | Err(ControlError::UnknownGrant(_)) => {}
                Err(err) => return Err(err),
            }
        }
        record.state = DatasetState::Deleting;
        self.catalog.update(&record, None)?;
        let attached = self.attached.lock().await.remove(name);
        if let Some(attached) = attached {
            self.plane.detach(attached.slot).await;
        }
        self.remove_namespace(&record);
        self.catalog.remove(&record)?;
        if let Ok(mut serving) = self.serving.lock() {
            serving.remove(name);
        }
        Ok(())
    }

    /// The serving counters of `name`, made at its first open.
    fn counters(&self, name: &str) -> Arc<DatasetCounters> {
        match self.serving.lock() {
            Ok(mut serving) => Arc::clone(serving.entry(name.to_string()).or_default()),
            Err(_) => Arc::new(DatasetCounters::default()),
        }
    }

    /// What each place datasets live holds: every namespace device given to
    /// the node, and the data directory's filesystem for file namespaces.
    pub fn devices(&self) -> Vec<DeviceReport> {
        let records = self.catalog.list().unwrap_or_default();
        let mut out = Vec::new();
        for device in &self.namespace_devices {
            let path = device.path.display().to_string();
            let capacity_bytes = device.capacity_bytes;
            let datasets: Vec<String> =
                records.iter().filter(|r| r.namespace.path == path).map(|r| r.name.clone()).collect();
            let used_bytes = records.iter().filter(|r| r.namespace.path == path).map(|r| r.length_bytes).sum();
            let refused = if datasets.is_empty() { self.device_refusal(device) } else { None };
            out.push(DeviceReport {
                kind: "nvme_namespace".into(),
                path,
                capacity_bytes,
                used_bytes,
                datasets,
                refused,
            });
        }
        for controller in &self.nvme_controllers {
            out.extend(self.controller_pool(controller, &records));
        }
        let (capacity_bytes, available_bytes) = nix::sys::statvfs::statvfs(&self.namespace_dir)
            .map(|s| (s.blocks() * s.fragment_size(), s.blocks_available() * s.fragment_size()))
            .unwrap_or((0, 0));
        let in_files: Vec<&DatasetRecord> = records.iter().filter(|r| r.namespace.kind == "file").collect();
        out.push(DeviceReport {
            kind: "data_dir".into(),
            path: self.namespace_dir.display().to_string(),
            capacity_bytes,
            used_bytes: capacity_bytes.saturating_sub(available_bytes),
            datasets: in_files.iter().map(|r| r.name.clone()).collect(),
            refused: None,
        });
        for (path, bytes) in self.orphans() {
            out.push(DeviceReport {
                kind: "orphan".into(),
                path,
                capacity_bytes: 0,
                used_bytes: bytes,
                datasets: Vec::new(),
                refused: None,
            });
        }
        out
    }

    /// The namespaces a configured controller can attach: `nvme_attached`
    /// (with the dataset the node attached it for, or none when something
    /// else did) or `nvme_detached` (free for the next dataset). A
    /// controller that does not answer is reported with its error as kind.
    fn controller_pool(&self, controller: &std::path::Path, records: &[DatasetRecord]) -> Vec<DeviceReport> {
        let namespaces = self.kernel_admin.namespaces(controller);
        let namespaces = match namespaces {
            Ok(namespaces) => namespaces,
            Err(err) => {
                tracing::warn!("listing the namespaces of {}: {err}", controller.display());
                return vec![DeviceReport {
                    kind: "nvme_controller_unreadable".into(),
                    path: controller.display().to_string(),
                    capacity_bytes: 0,
                    used_bytes: 0,
                    datasets: Vec::new(),
                    refused: Some(err.to_string()),
                }];
            }
        };
        namespaces
            .into_iter()
            .map(|ns| {
                let label = crate::nvme::attachment_label(controller, ns.nsid);
                let held: Vec<&DatasetRecord> =
                    records.iter().filter(|r| r.namespace.attached.as_deref() == Some(label.as_str())).collect();
                let refused = if ns.shared {
                    Some("shared with other controllers (NMIC): another host may write it".to_string())
                } else if ns.attached && held.is_empty() {
                    Some("attached, and no dataset record owns it: the node leaves it alone".to_string())
                } else {
                    None
                };
                DeviceReport {
                    kind: if ns.attached { "nvme_attached" } else { "nvme_detached" }.into(),
                    path: label,
                    capacity_bytes: ns.capacity_bytes,
                    used_bytes: held.iter().map(|r| r.length_bytes).sum(),
                    datasets: held.iter().map(|r| r.name.clone()).collect(),
                    refused,
                }
            })
            .collect()
    }

    /// The Prometheus exposition of this node.
    pub fn metrics_text(&self) -> String {
        use crate::metrics::{render, DatasetSample, Gauge};
        let serving: Vec<(String, Arc<DatasetCounters>)> = self
            .serving
            .lock()
            .map(|s| s.iter().map(|(k, v)| (k.clone(), Arc::clone(v))).collect())
            .unwrap_or_default();
        let samples: Vec<DatasetSample<'_>> =
            serving.iter().map(|(name, counters)| DatasetSample { dataset: name, counters }).collect();
        let records = self.catalog.list().unwrap_or_default();
        let mut by_state: HashMap<String, f64> = HashMap::new();
        for record in &records {
            *by_state.entry(record.state.to_string()).or_default() += 1.0;
        }
        let mut gauges = vec![
            Gauge {
                name: "sluice_datasets",
                help: "Datasets in the catalog, by state.",
                samples: by_state.into_iter().map(|(state, n)| (vec![("state", state)], n)).collect(),
            },
            Gauge {
                name: "sluice_grants",
                help: "Access grants standing.",
                samples: vec![(vec![], self.grants.read().map(|g| g.len()).unwrap_or(0) as f64)],
            },
        ];
        // Capacity comes from the same report `GET /v1/devices` serves.
        let (orphans, devices): (Vec<DeviceReport>, Vec<DeviceReport>) =
            self.devices().into_iter().partition(|d| d.kind == "orphan");
        gauges.push(Gauge {
            name: "sluice_orphaned_files",
            help: "Files no record owns, quarantined in DATA_DIR/orphans/ until an operator purges them.",
            samples: vec![(vec![], orphans.len() as f64)],
        });
        gauges.push(Gauge {
            name: "sluice_orphaned_bytes",
            help: "Bytes of the quarantined files.",
            samples: vec![(vec![], orphans.iter().map(|o| o.used_bytes).sum::<u64>() as f64)],
        });
        let (data_dirs, namespaces): (Vec<DeviceReport>, Vec<DeviceReport>) =
            devices.into_iter().partition(|d| d.kind == "data_dir");
        let per_device = |value: fn(&DeviceReport) -> u64| -> Vec<(Vec<(&'static str, String)>, f64)> {
            namespaces.iter().map(|d| (vec![("device", d.path.clone())], value(d) as f64)).collect()
        };
        gauges.push(Gauge {
            name: "sluice_namespace_device_capacity_bytes",
            help: "Capacity of each namespace device given to the node.",
            samples: per_device(|d| d.capacity_bytes),
        });
        gauges.push(Gauge {
            name: "sluice_namespace_device_used_bytes",
            help: "Bytes of datasets on each namespace device.",
            samples: per_device(|d| d.used_bytes),
        });
        let (leased, total) = self.plane.dma_slots();
        gauges.push(Gauge {
            name: "sluice_dma_slots",
            help: "DMA slots of the data plane's cores.",
            samples: vec![(vec![], total as f64)],
        });
        gauges.push(Gauge {
            name: "sluice_dma_slots_leased",
            help: "DMA slots held by batches in flight and responses not yet sent.",
            samples: vec![(vec![], leased as f64)],
        });
        for dir in data_dirs.iter().filter(|d| d.capacity_bytes > 0) {
            gauges.push(Gauge {
                name: "sluice_data_dir_capacity_bytes",
                help: "Size of the filesystem holding file namespaces.",
                samples: vec![(vec![], dir.capacity_bytes as f64)],
            });
            gauges.push(Gauge {
                name: "sluice_data_dir_available_bytes",
                help: "Free space for file namespaces.",
                samples: vec![(vec![], (dir.capacity_bytes - dir.used_bytes) as f64)],
            });
        }
        render(&samples, &gauges)
    }

    /// Who may call what. With `insecure`, every client that reaches the
    /// data port reads every sealed dataset and the control API checks no
    /// credential: for local development; the node says so.
    pub fn set_access(&self, policy: AccessPolicy) {
        if let Ok(mut access) = self.access.write() {
            *access = Arc::new(policy);
        }
    }

    pub fn access(&self) -> Arc<AccessPolicy> {
        self.access.read().map(|a| Arc::clone(&a)).unwrap_or_default()
    }

    pub fn insecure(&self) -> bool {
        self.access().insecure
    }

    /// The live grant `token` is, if any. In a cluster a token unknown here
    /// may have been issued on another node: the table is refreshed, a
    /// bounded number of times a second for unknown tokens.
    pub fn grant_for_token(&self, token: &str) -> Option<GrantRecord> {
        let hash = grants::token_hash(token);
        let lookup = || self.grants.read().ok().and_then(|g| g.get(&hash).cloned());
        if let Some(grant) = lookup() {
            return Some(grant);
        }
        if self.cluster.is_none() || !token.starts_with(grants::TOKEN_PREFIX) {
            return None;
        }
        let due = self.unknown_token_refreshes.lock().is_ok_and(|mut window| {
            if window.0.elapsed() >= std::time::Duration::from_secs(1) {
                *window = (std::time::Instant::now(), 0);
            }
            window.1 += 1;
            window.1 <= UNKNOWN_TOKEN_REFRESHES_PER_S_MAX
        });
        if due {
            self.refresh_grants();
        }
        lookup()
    }

    /// Issues a grant of `dataset` to `client`, optionally bound to the
    /// client certificate named `cert_name`; the answer carries the token,
    /// which the node does not keep and cannot show again.
    pub fn issue_grant(&self, dataset: &str, client: &str, cert_name: Option<&str>) -> Result<GrantView, ControlError> {
        if !grants::valid_client(client) {
            return Err(ControlError::BadGrant(format!(
                "invalid client identity {client:?}: 1-{} printable characters, no spaces",
                grants::CLIENT_BYTES_MAX
            )));
        }
        if let Some(name) = cert_name.filter(|n| !grants::valid_client(n)) {
            return Err(ControlError::BadGrant(format!(
                "invalid certificate name {name:?}: 1-{} printable characters, no spaces",
                grants::CLIENT_BYTES_MAX
            )));
        }
        let record = self.catalog.require(dataset)?;
        if record.state == DatasetState::Deleting {
            return Err(ControlError::State {
                name: dataset.into(),
                state: record.state,
                action: "granting",
                needed: "not being deleted",
            });
        }
        let token = grants::new_token();
        let grant = self.catalog.add_grant(&mut |id| GrantRecord {
            id,
            client: client.to_string(),
            dataset: record.name.clone(),
            dataset_id: record.id,
            token_hash: grants::token_hash(&token),
            created_unix_ms: now_unix_ms(),
            cert_name: cert_name.map(str::to_string),
        })?;
        tracing::info!(grant = grant.id, client, dataset, "grant issued");
        let mut view = GrantView::from(&grant);
        view.token = Some(sluice_proto::codec::Secret::new(token));
        if let Ok(mut map) = self.grants.write() {
            map.insert(grant.token_hash.clone(), grant);
        }
        Ok(view)
    }

    pub fn list_grants(&self) -> Vec<GrantView> {
        let mut views: Vec<GrantView> =
            self.grants.read().map(|g| g.values().map(GrantView::from).collect()).unwrap_or_default();
        views.sort_by_key(|v| v.id);
        views
    }

    /// Revokes a grant: new opens with its token fail from now on, and the
    /// sessions opened with it are closed.
    pub fn revoke_grant(&self, id: u64) -> Result<(), ControlError> {
        let existed = self.catalog.remove_grant(id)?;
        // Gone from the catalog either way; in a cluster this node's copy
        // of the table may still hold one revoked elsewhere: drop it, and
        // close its sessions, all the same.
        let held = self.grants.write().map(|mut map| {
            let before = map.len();
            map.retain(|_, g| g.id != id);
            map.len() != before
        });
        if existed || held.unwrap_or(false) {
            self.revocations.send_modify(|epoch| *epoch += 1);
        }
        if !existed {
            return Err(ControlError::UnknownGrant(id));
        }
        tracing::info!(grant = id, "grant revoked");
        Ok(())
    }

    /// Whether grant `id` still stands.
    pub fn grant_live(&self, id: u64) -> bool {
        self.grants.read().is_ok_and(|g| g.values().any(|g| g.id == id))
    }

    /// The grant `token` gives for `dataset` (checked against the dataset's
    /// id, not only its name), or why there is none. An unknown dataset
    /// and one the grant does not cover get the same answer, so a grant
    /// holder cannot probe which names exist.
    fn check_grant(
        &self,
        dataset: &str,
        token: Option<&str>,
        peer_name: Option<&str>,
    ) -> Result<Option<u64>, OpenError> {
        if self.insecure() {
            return Ok(None);
        }
        let denied = |message: String| OpenError { code: ErrorCode::AccessDenied, message };
        let Some(token) = token else {
            return Err(denied(format!(
                "reading {dataset} needs a grant: this node checks access (issue one with \
                 `sluicectl grant create {dataset} --client ID` and pass its token, e.g. SLUICE_TOKEN)"
            )));
        };
        let Some(grant) = self.grant_for_token(token) else {
            return Err(denied(format!(
                "the token given for {dataset} is not a grant on this node (revoked or never issued)"
            )));
        };
        if let Some(bound) = grant.cert_name.as_deref().filter(|bound| peer_name != Some(*bound)) {
            return Err(denied(format!(
                "this grant is bound to the client certificate {bound:?}; connect over TLS with that certificate"
            )));
        }
        let covered = self.catalog.get(dataset).ok().flatten().is_some_and(|record| record.id == grant.dataset_id);
        if !covered {
            return Err(denied(format!("this grant does not cover a dataset named {dataset:?}")));
        }
        tracing::debug!(grant = grant.id, client = grant.client, dataset, "open granted");
        Ok(Some(grant.id))
    }

    /// A sealed dataset's block checksums: its file, if it folds into the
    /// catalog's chunk CRCs; else made again from the data (and kept), with
    /// any chunk that disagrees with the catalog made unreadable.
    fn block_checksums(
        &self,
        record: &DatasetRecord,
        ns: &dyn Namespace,
        chunk_crcs: &[u32],
    ) -> Result<Vec<u32>, ControlError> {
        use sluice_dataplane::blocks::chunks_disagreeing;
        let loaded = self.checksums.load(record.id, record.length_bytes).map_err(|e| self.ns_error(record, e))?;
        if let Some(block_crcs) = loaded {
            if chunks_disagreeing(&block_crcs, record.length_bytes, chunk_crcs).is_empty() {
                return Ok(block_crcs);
            }
            tracing::warn!(dataset = record.name, "block checksums disagree with the catalog; making them again");
        }
        let rebuilt =
            crate::checksums::rebuild(ns, record.namespace.base_offset_bytes, record.length_bytes, chunk_crcs)
                .map_err(|e| self.ns_error(record, e))?;
        if !rebuilt.bad_chunks.is_empty() {
            tracing::error!(
                dataset = record.name,
                chunks = ?rebuilt.bad_chunks,
                "chunks disagree with the catalog; their reads fail as checksum mismatches"
            );
        }
        self.checksums.write(record.id, &rebuilt.block_crcs).map_err(|e| self.ns_error(record, e))?;
        Ok(rebuilt.block_crcs)
    }

    /// Attaches a sealed dataset to the data plane (once) for reading.
    ///
    /// The node-wide table of attached datasets is locked only to look and
    /// to insert, never across the catalog reads and checksum I/O between.
    pub async fn open_for_read(&self, name: &str) -> Result<(DatasetSlot, OpenInfo), ControlError> {
        if let Some(entry) = self.attached.lock().await.get(name) {
            return Ok((entry.slot, entry.info.clone()));
        }
        let record = self.catalog.require(name)?;
        if record.state != DatasetState::Sealed {
            return Err(ControlError::State {
                name: name.into(),
                state: record.state,
                action: "reading",
                needed: "sealed",
            });
        }
        if !self.holds_ready_copy(&record)? {
            return Err(ControlError::Elsewhere { name: name.into(), elsewhere: self.replica_endpoints(name) });
        }
        let namespace = self.namespace(&record)?;
        let chunk_crcs = self.catalog.chunk_crcs(record.id)?;
        let block_crcs = self.block_checksums(&record, &*namespace, &chunk_crcs)?;
        let view = DatasetView {
            dataset_id: record.id,
            namespace,
            base_offset_bytes: record.namespace.base_offset_bytes,
            length_bytes: record.length_bytes,
            block_crcs: block_crcs.into(),
        };
        let mut attached = self.attached.lock().await;
        if let Some(entry) = attached.get(name) {
            // Attached by a concurrent open meanwhile.
            return Ok((entry.slot, entry.info.clone()));
        }
        let slot = self.plane.attach(Arc::new(view)).await.map_err(|e| ControlError::DataPlane(e.to_string()))?;
        let info = OpenInfo {
            kind: record.kind.to_string(),
            length_bytes: record.length_bytes,
            content_hash: record.content_hash.clone().unwrap_or_default(),
            chunk_size_bytes: record.chunk_size_bytes,
            replicas: Vec::new(),
        };
        attached.insert(name.to_string(), Attached { slot, info: info.clone() });
        drop(attached);
        // A delete marks the record before it detaches what is attached:
        // if one ran while this open was preparing, undo the attach.
        let current = self.catalog.get(name)?;
        if current.as_ref().is_none_or(|r| r.id != record.id || r.state != DatasetState::Sealed) {
            let mut attached = self.attached.lock().await;
            if attached.get(name).is_some_and(|entry| entry.slot == slot) {
                attached.remove(name);
                drop(attached);
                self.plane.detach(slot).await;
            }
            return Err(ControlError::Catalog(CatalogError::Unknown(name.to_string())));
        }
        Ok((slot, info))
    }
}

/// Chunks read per scrub batch.
const SCRUB_CHUNKS_PER_BATCH: u64 = 64;

impl ControlPlane {
    /// Reads every chunk of a sealed dataset through the data plane, which
    /// verifies each against the manifest, and reports the ones that fail.
    pub async fn scrub(&self, name: &str) -> Result<ScrubReport, ControlError> {
        let (slot, info) = self.open_for_read(name).await?;
        let chunk = info.chunk_size_bytes;
        let chunks = info.length_bytes.div_ceil(chunk);
        let mut bad_chunks = Vec::new();
        let mut first = 0;
        while first < chunks {
            let last = (first + SCRUB_CHUNKS_PER_BATCH).min(chunks);
            let ranges: Vec<sluice_dataplane::ByteRange> = (first..last)
                .map(|c| sluice_dataplane::ByteRange {
                    offset_bytes: c * chunk,
                    len_bytes: (chunk.min(info.length_bytes - c * chunk)) as u32,
                })
                .collect();
            let result = self.plane.read(slot, ranges).await.map_err(|e| ControlError::DataPlane(e.to_string()))?;
            for (i, status) in result.statuses().iter().enumerate() {
                if *status != sluice_proto::RangeStatus::Ok {
                    bad_chunks.push((first + i as u64, status.name().to_string()));
                }
            }
            first = last;
        }
        Ok(ScrubReport { name: name.to_string(), chunks, bytes: info.length_bytes, bad_chunks })
    }
}

/// One file being appended; commits only through [`IngestSession::finish`].
pub struct IngestSession<'a> {
    control: &'a ControlPlane,
    _guard: BusyGuard<'a>,
    record: DatasetRecord,
    appender: Appender,
}

impl IngestSession<'_> {
    pub fn push(&mut self, bytes: &[u8]) -> Result<(), ControlError> {
        Ok(self.appender.push(bytes)?)
    }

    /// Checks the file arrived whole, makes it durable, then commits the new
    /// length and checksums in one catalog transaction.
    pub fn finish(self) -> Result<Appended, ControlError> {
        let finished = self.appender.finish()?;
        let mut record = self.record;
        if !finished.index_entries.is_empty() {
            let file = self.control.index_file(&record)?;
            file.append(record.record_count, &finished.index_entries).map_err(|e| self.control.ns_error(&record, e))?;
        }
        record.length_bytes = finished.appended.length_bytes;
        record.record_count += finished.appended.records;
        record.files_ingested += 1;
        record.state = DatasetState::Ingesting;
        self.control.catalog.update(&record, Some(&finished.chunk_crcs))?;
        Ok(finished.appended)
    }
}

/// The data-plane transports open datasets through the control plane.
///
/// Opens run on the control side's runtime, not on the threads that serve
/// data connections: the grant check, the catalog, loading block
/// checksums and attaching are control work, and a connection on a data
/// thread only waits for the answer.
pub struct Resolver {
    control: Arc<ControlPlane>,
    runtime: tokio::runtime::Handle,
}

impl Resolver {
    /// A resolver whose opens run on `runtime` (the control runtime).
    pub fn new(control: Arc<ControlPlane>, runtime: tokio::runtime::Handle) -> Self {
        Self { control, runtime }
    }
}

impl ControlPlane {
    async fn open_dataset(
        self: Arc<Self>,
        name: String,
        token: Option<String>,
        peer_name: Option<String>,
    ) -> Result<Opened, OpenError> {
        // Access first: nothing is attached for a client without a grant.
        let grant = self.check_grant(&name, token.as_deref(), peer_name.as_deref())?;
        let (slot, info) = self.open_for_read(&name).await.map_err(|err| {
            let code = match &err {
                ControlError::Catalog(CatalogError::Unknown(_)) => ErrorCode::UnknownDataset,
                ControlError::State { .. } => ErrorCode::NotSealed,
                ControlError::Elsewhere { .. } => ErrorCode::UnknownDataset,
                _ => ErrorCode::Internal,
            };
            OpenError { code, message: err.to_string() }
        })?;
        let mut info = info;
        info.replicas = self.replica_endpoints(&name);
        Ok(Opened { slot, info, grant, counters: self.counters(&name) })
    }
}

impl DatasetResolver for Resolver {
    async fn open(&self, name: String, token: Option<String>, peer_name: Option<String>) -> Result<Opened, OpenError> {
        let opening = Arc::clone(&self.control).open_dataset(name, token, peer_name);
        self.runtime
            .spawn(opening)
            .await
            .map_err(|e| OpenError { code: ErrorCode::Internal, message: format!("open task: {e}") })?
    }

    fn grant_live(&self, grant: u64) -> bool {
        self.control.grant_live(grant)
    }

    fn revocations(&self) -> tokio::sync::watch::Receiver<u64> {
        self.control.revocations.subscribe()
    }
}

#[cfg(test)]
mod tests {
    use super::best_fit;

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
