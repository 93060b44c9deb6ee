//! Where datasets live, and everything that decides it: the namespace
//! devices given to the node, the NVMe controllers whose namespaces it may
//! attach (and the admin stack that reaches them), the ledger of what it
//! attached, and the file namespaces under the data directory. The state
//! is [`Storage`]'s, private to this module and its children: the rest of
//! the plane allocates, opens and releases through the methods these files
//! add to `ControlPlane`, and takes the allocator lock while it records a
//! choice.
//!
//! - `allocator.rs`: choosing a namespace for a new dataset.
//! - `nvme_pool.rs`: the one allocator over an NVMe admin stack.
//! - `user_space.rs`: the SPDK stack's side of it.
//! - `namespaces.rs`: opening a dataset's namespace, giving it back.
//! - `ownership.rs`: which namespaces are this node's (the attach ledger).
//! - `devices.rs`: `devices ls`.

mod allocator;
mod devices;
mod namespaces;
mod nvme_pool;
mod ownership;
mod user_space;

use std::sync::MutexGuard;

use super::*;

/// Where a node may put datasets besides files in its data directory.
#[derive(Clone, Default)]
pub struct NamespacePool {
    /// Block devices (NVMe namespaces) to give whole to datasets.
    pub devices: Vec<PathBuf>,
    /// Controllers whose detached namespaces may be attached for datasets.
    pub controllers: Vec<PathBuf>,
    /// Who issues the controllers' admin commands (the helper, made for the
    /// same controllers); this process ([`crate::nvme::Passthrough`] over
    /// `controllers`) when not given.
    pub admin: Option<Arc<dyn crate::nvme::KernelAdmin>>,
    /// Devices to use although they carry a signature (`--claim-device`).
    pub claim: Vec<PathBuf>,
}

pub(super) struct Storage {
    /// The block driver namespaces are opened through (and, for SPDK,
    /// whose admin stack manages its controllers).
    driver: Arc<dyn BlockDriver>,
    /// File namespaces, one per dataset.
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
    /// The kernel's admin stack over the NVMe controllers (`/dev/nvmeX`)
    /// whose detached namespaces the node may attach, one per dataset, when
    /// no namespace device is free: here, or the privileged helper's when
    /// the node runs as `--user`. Its `controllers()` are the configured
    /// ones.
    kernel_admin: Arc<dyn crate::nvme::KernelAdmin>,
    /// Namespaces attached from the controllers, held open exclusively
    /// from their first use until they are detached, by attachment label.
    attached_devices: Mutex<HashMap<String, crate::claim::HeldDevice>>,
    /// Datasets' namespaces opened so far, by dataset id.
    opened: Mutex<HashMap<u64, Arc<dyn Namespace>>>,
}

fn namespace_error(name: &Path, err: impl std::fmt::Display) -> ControlError {
    ControlError::Namespace { name: name.display().to_string(), message: err.to_string() }
}

impl Storage {
    /// Opens the namespace devices (exclusively), the attach ledger and
    /// the file namespace directory under `data_dir`; namespaces open
    /// through `driver`.
    pub(super) fn open(
        data_dir: &Path,
        driver: Arc<dyn BlockDriver>,
        pool: NamespacePool,
    ) -> Result<Self, ControlError> {
        let NamespacePool { devices, controllers, admin, claim: claimed_devices } = pool;
        let kernel_admin = admin.unwrap_or_else(|| Arc::new(crate::nvme::Passthrough::new(controllers)));
        let mut namespace_devices = Vec::with_capacity(devices.len());
        for device in &devices {
            namespace_devices.push(crate::claim::HeldDevice::open(device).map_err(|e| namespace_error(device, e))?);
        }
        let attach_ledger =
            ownership::AttachLedger::open(data_dir).map_err(|e| namespace_error(&data_dir.join("attached.json"), e))?;
        let namespace_dir = data_dir.join("namespaces");
        std::fs::create_dir_all(&namespace_dir).map_err(|e| namespace_error(&namespace_dir, e))?;
        Ok(Self {
            driver,
            namespace_dir,
            namespace_devices,
            claimed_devices,
            attach_ledger,
            allocator: Mutex::new(()),
            kernel_admin,
            attached_devices: Mutex::new(HashMap::new()),
            opened: Mutex::new(HashMap::new()),
        })
    }

    /// Whether any NVMe controller is configured.
    fn has_controllers(&self) -> bool {
        !self.kernel_admin.controllers().is_empty()
    }

    /// The directory of file namespaces.
    pub(super) fn namespace_dir(&self) -> &Path {
        &self.namespace_dir
    }

    /// Held while a namespace is chosen and its record written.
    pub(super) fn allocating(&self, name: &str) -> Result<MutexGuard<'_, ()>, ControlError> {
        self.allocator.lock().map_err(|_| ControlError::Busy(name.to_string()))
    }
}
