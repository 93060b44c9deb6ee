//! Opening a dataset's namespace (only one this node owns) and giving it
//! back: discard, detach and delete what this node attached.

use super::*;

impl ControlPlane {
    /// The dataset's namespace, which must exist: a file namespace whose
    /// file is gone is an error (the dataset's bytes are lost), never an
    /// empty file that would fail every read as a checksum mismatch.
    pub(in crate::plane) fn namespace(&self, record: &DatasetRecord) -> Result<Arc<dyn Namespace>, ControlError> {
        self.open_namespace(record, false)
    }

    /// The same for a namespace being allocated (a dataset just created,
    /// a copy begun, a create or ingest a crash interrupted): a file
    /// namespace's file is made if missing.
    pub(in crate::plane) fn allocated_namespace(
        &self,
        record: &DatasetRecord,
    ) -> Result<Arc<dyn Namespace>, ControlError> {
        self.open_namespace(record, true)
    }

    fn open_namespace(&self, record: &DatasetRecord, create: bool) -> Result<Arc<dyn Namespace>, ControlError> {
        let mut namespaces = self.storage.opened.lock().map_err(|_| self.ns_error(record, "lock poisoned"))?;
        if let Some(ns) = namespaces.get(&record.id) {
            return Ok(Arc::clone(ns));
        }
        self.check_owned(record.id, &record.namespace)?;
        let spec = match &record.namespace.kind {
            NamespaceKind::File => NamespaceSpec::File { path: PathBuf::from(&record.namespace.path), create },
            NamespaceKind::Device => self.device_spec(&record.namespace).map_err(|e| self.ns_error(record, e))?,
            NamespaceKind::Nvme => {
                let (controller, nsid) = nvme_pool::parse_nvme_path(&record.namespace.path)
                    .ok_or_else(|| self.ns_error(record, "an nvme namespace path is PCI_ADDRESS/NSID"))?;
                NamespaceSpec::Nvme { controller, nsid }
            }
            NamespaceKind::Mem => NamespaceSpec::Mem,
            other @ (NamespaceKind::Remote | NamespaceKind::Unplaced | NamespaceKind::Other(_)) => {
                return Err(self.ns_error(record, format!("namespace kind {other} holds no bytes on this node")))
            }
        };
        let ns = self.storage.driver.open_namespace(&spec).map_err(|e| self.ns_error(record, e))?;
        namespaces.insert(record.id, Arc::clone(&ns));
        Ok(ns)
    }

    /// A device namespace by the descriptors held since start, or (one
    /// attached from a controller) by those held since its first use.
    pub(in crate::plane) fn device_spec(&self, namespace: &NamespaceRecord) -> Result<NamespaceSpec, String> {
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
        let mut attached = self.storage.attached_devices.lock().map_err(|_| "attached devices lock poisoned")?;
        if let Some(held) = attached.get(label) {
            return Ok(held_spec(held));
        }
        let held = self
            .storage
            .kernel_admin
            .open_namespace(&controller.display().to_string(), nsid)
            .map_err(|e| format!("opening {label}: {e}"))?;
        if held.path != Path::new(&namespace.path) {
            return Err(format!("{label} is {}, not {}", held.path.display(), namespace.path));
        }
        let spec = held_spec(&held);
        attached.insert(label.to_string(), held);
        Ok(spec)
    }

    /// Gives a dataset's namespace back: discards the bytes it used,
    /// detaches (and deletes) a namespace this node attached, removes a
    /// file namespace. Only a namespace [`ControlPlane::check_owned`]
    /// accepts; any other is left as it is.
    pub(in crate::plane) fn remove_namespace(&self, record: &DatasetRecord) {
        let _ = std::fs::remove_file(self.index_path(record));
        self.checksums.remove(record.id);
        let (present, crcs) = crate::source::cache::cache_paths(&self.data_dir, record.id);
        let _ = std::fs::remove_file(present);
        let _ = std::fs::remove_file(crcs);
        if let Ok(mut namespaces) = self.storage.opened.lock() {
            namespaces.remove(&record.id);
        }
        if self.check_owned(record.id, &record.namespace).is_err() {
            return;
        }
        if matches!(record.namespace.kind, NamespaceKind::Device | NamespaceKind::Nvme) {
            // The device goes back to the pool; tell it the bytes are free,
            // and no more than the dataset used.
            let used = record.length_bytes.next_multiple_of(CHUNK_SIZE_BYTES);
            let spec = match nvme_pool::parse_nvme_path(&record.namespace.path) {
                Some((controller, nsid)) if record.namespace.kind == NamespaceKind::Nvme => {
                    Ok(NamespaceSpec::Nvme { controller, nsid })
                }
                _ => self.device_spec(&record.namespace),
            };
            match spec.and_then(|spec| self.storage.driver.open_namespace(&spec).map_err(|e| e.to_string())) {
                Ok(ns) => {
                    if let Err(err) = ns.discard(record.namespace.base_offset_bytes, used) {
                        tracing::warn!("discarding {} bytes of {}: {err}", used, record.namespace.path);
                    }
                }
                Err(err) => tracing::warn!("releasing {}: {err}", record.namespace.path),
            }
        }
        if record.namespace.kind == NamespaceKind::Nvme {
            self.release_user_space(record);
        } else if let Some(label) = record.namespace.attached.as_deref() {
            self.detach_recorded(label);
        }
        if record.namespace.kind == NamespaceKind::File {
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
    pub(in crate::plane) fn detach_recorded(&self, label: &str) {
        let (Some((controller, nsid)), Some(entry)) =
            (crate::nvme::parse_attachment_label(label), self.storage.attach_ledger.get(label))
        else {
            return;
        };
        // Our descriptors go first: the device node goes with the detach.
        if let Ok(mut attached) = self.storage.attached_devices.lock() {
            attached.remove(label);
        }
        let admin = &*self.storage.kernel_admin;
        let name = controller.display().to_string();
        match admin.detach(&name, nsid) {
            Ok(()) => {
                tracing::info!("detached namespace {nsid} of {}", controller.display());
                // One created for the dataset goes back to unallocated
                // capacity; one from the pool stays in the pool.
                if entry.created {
                    match admin.delete(&name, nsid) {
                        Ok(()) => tracing::info!("deleted namespace {nsid} of {}", controller.display()),
                        Err(err) => tracing::warn!("deleting namespace {nsid} of {}: {err}", controller.display()),
                    }
                }
                if let Err(err) = self.storage.attach_ledger.remove(label) {
                    tracing::warn!("forgetting the attachment of {label}: {err}");
                }
            }
            Err(err) => tracing::warn!("detaching namespace {nsid} of {}: {err}", controller.display()),
        }
    }
}
