//! What this node may act on. A catalog record, local or from etcd, names
//! the namespace a dataset lives in; the node did not write every record
//! it reads (a peer did, a restored backup did, anyone with etcd write
//! access could), so a record is input to check, not an order. A namespace
//! is opened, written, discarded, detached or deleted only if this node's
//! own configuration and data directory say it is the node's:
//!
//! - a file: exactly `DATA_DIR/namespaces/<dataset id>.ns`, not a link;
//! - a namespace device: one the config lists (held open since start);
//! - a namespace attached from a configured controller: one this node
//!   attached or created, by its entry in `DATA_DIR/attached.json` (kept
//!   beside the data, not in the catalog), whose NGUID and EUI64 still
//!   match before every destructive command;
//! - a namespace of a user-space (SPDK) controller this node drives.
//!
//! Anything else is refused and logged; nothing outside is opened.

use std::path::{Path, PathBuf};
use std::sync::Mutex;

use serde::{Deserialize, Serialize};

use super::{nvme_pool, ControlError, ControlPlane};
use crate::catalog::{NamespaceKind, NamespaceRecord};

/// A namespace this node attached (and maybe created) on a controller.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct Attachment {
    /// `CONTROLLER:NSID`.
    pub label: String,
    /// NGUID-EUI64 at attach ([`crate::nvme::Controller::namespace_identity`]).
    pub identity: String,
    /// Created for the dataset: delete gives its capacity back.
    pub created: bool,
}

/// The namespaces this node attached, persisted in the data directory.
pub(super) struct AttachLedger {
    path: PathBuf,
    entries: Mutex<Vec<Attachment>>,
}

impl AttachLedger {
    pub fn open(data_dir: &Path) -> std::io::Result<Self> {
        let path = data_dir.join("attached.json");
        let entries = match std::fs::read(&path) {
            Ok(bytes) => {
                serde_json::from_slice(&bytes).map_err(|e| std::io::Error::other(format!("{}: {e}", path.display())))?
            }
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => Vec::new(),
            Err(err) => return Err(err),
        };
        Ok(Self { path, entries: Mutex::new(entries) })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn get(&self, label: &str) -> Option<Attachment> {
        self.entries.lock().ok()?.iter().find(|a| a.label == label).cloned()
    }

    pub fn insert(&self, attachment: Attachment) -> std::io::Result<()> {
        self.change(|entries| {
            entries.retain(|a| a.label != attachment.label);
            entries.push(attachment);
        })
    }

    pub fn remove(&self, label: &str) -> std::io::Result<()> {
        self.change(|entries| entries.retain(|a| a.label != label))
    }

    /// Applies `edit` and writes the ledger durably (temp file, fsync,
    /// rename) before the change counts.
    fn change(&self, edit: impl FnOnce(&mut Vec<Attachment>)) -> std::io::Result<()> {
        let mut entries = self.entries.lock().map_err(|_| std::io::Error::other("attach ledger lock poisoned"))?;
        let mut next = entries.clone();
        edit(&mut next);
        let bytes = serde_json::to_vec_pretty(&next).map_err(std::io::Error::other)?;
        let tmp = self.path.with_extension("json.tmp");
        {
            use std::io::Write;
            let mut file = std::fs::File::create(&tmp)?;
            file.write_all(&bytes)?;
            file.sync_all()?;
        }
        std::fs::rename(&tmp, &self.path)?;
        *entries = next;
        Ok(())
    }
}

impl ControlPlane {
    /// Whether this node may act on `namespace` for dataset `id`; why not
    /// as an error (logged) otherwise.
    pub(in crate::plane) fn check_owned(&self, id: u64, namespace: &NamespaceRecord) -> Result<(), ControlError> {
        let refused = |why: String| {
            tracing::error!(
                dataset_id = id,
                kind = namespace.kind.as_str(),
                path = namespace.path,
                "refused a catalog record: {why}; the node leaves that target untouched"
            );
            ControlError::Namespace {
                name: format!("dataset {id}"),
                message: format!("refused: {why} (namespace {} {})", namespace.kind, namespace.path),
            }
        };
        match &namespace.kind {
            NamespaceKind::File => {
                let path = Path::new(&namespace.path);
                let expected = self.file_namespace_path(id);
                let same_dir = path.parent().and_then(|p| p.canonicalize().ok())
                    == expected.parent().and_then(|p| p.canonicalize().ok());
                if !same_dir || path.file_name() != expected.file_name() || namespace.base_offset_bytes != 0 {
                    return Err(refused(format!(
                        "a file namespace must be {} (this node's namespaces directory, named by the dataset id)",
                        expected.display()
                    )));
                }
                if std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_symlink()) {
                    return Err(refused("the namespace file is a symbolic link".into()));
                }
                Ok(())
            }
            NamespaceKind::Device => match &namespace.attached {
                None if self.held_device(Path::new(&namespace.path)).is_some() => Ok(()),
                None => Err(refused("the device is not one of this node's namespace_devices".into())),
                Some(label) => self.check_attachment(label, &namespace.path).map_err(refused),
            },
            NamespaceKind::Nvme => {
                let Some((controller, _)) = nvme_pool::parse_nvme_path(&namespace.path) else {
                    return Err(refused("an nvme namespace path is PCI_ADDRESS/NSID".into()));
                };
                let driven =
                    self.storage.driver.nvme_admin().is_some_and(|admin| admin.controllers().contains(&controller));
                if driven {
                    Ok(())
                } else {
                    Err(refused(format!("controller {controller} is not one this node's driver owns")))
                }
            }
            NamespaceKind::Mem => Ok(()),
            other @ (NamespaceKind::Remote | NamespaceKind::Unplaced | NamespaceKind::Other(_)) => {
                Err(refused(format!("namespace kind {other} is nothing this node can hold")))
            }
        }
    }

    /// A namespace attached from a controller: the controller is
    /// configured, this node's ledger has the attachment, the device is that
    /// namespace's, and its identity is the one recorded at attach.
    fn check_attachment(&self, label: &str, device: &str) -> Result<(), String> {
        let (controller, nsid) =
            crate::nvme::parse_attachment_label(label).ok_or_else(|| format!("{label} is not CONTROLLER:NSID"))?;
        if !self.storage.kernel_admin.controllers().iter().any(|c| Path::new(c) == controller) {
            return Err(format!("{} is not one of this node's nvme_controllers", controller.display()));
        }
        let entry = self.storage.attach_ledger.get(label).ok_or_else(|| {
            format!("this node never attached {label} (it is not in {})", self.storage.attach_ledger.path().display())
        })?;
        if crate::nvme::block_device(&controller, nsid).as_deref() != Some(Path::new(device)) {
            return Err(format!("{device} is not the block device of namespace {nsid} of {}", controller.display()));
        }
        let identity = self
            .storage
            .kernel_admin
            .namespace_identity(&controller.display().to_string(), nsid)
            .map_err(|e| format!("identifying {label}: {e}"))?;
        if identity != entry.identity {
            return Err(format!("namespace {label} is now {identity}, not the {} this node attached", entry.identity));
        }
        Ok(())
    }

    /// Where dataset `id`'s file namespace is, the only file it may use.
    pub(in crate::plane) fn file_namespace_path(&self, id: u64) -> PathBuf {
        self.storage.namespace_dir.join(format!("{id:016x}.ns"))
    }
}
