//! Choosing a namespace for a new dataset: a free namespace device, else a
//! namespace attached from a configured controller, else a file; one
//! allocator lock and this node's copy records decide what is in use.

use super::*;

/// The smallest candidate of at least `need` bytes (best fit), or the
/// first candidate when nothing is asked.
pub(super) fn best_fit<T: Clone>(candidates: &[(T, u64)], need: Option<u64>) -> Option<(T, u64)> {
    match need {
        None => candidates.first().cloned(),
        Some(need) => candidates.iter().filter(|(_, capacity)| *capacity >= need).min_by_key(|(_, c)| *c).cloned(),
    }
}

pub(super) fn hint_words(size_hint: Option<u64>) -> String {
    size_hint.map(|bytes| format!("; the smallest that holds the {bytes} bytes asked")).unwrap_or_default()
}

impl ControlPlane {
    /// Every namespace path this node's records use. In a cluster, this
    /// node's copy records are the whole of it: every dataset it holds has
    /// one, and so has a copy of a dataset deleted elsewhere that the reaper
    /// has not released yet.
    pub(super) fn namespaces_in_use(&self) -> Result<HashSet<String>, ControlError> {
        Ok(match self.cluster.as_deref() {
            Some(cluster) => cluster.own_replicas()?.into_values().map(|r| r.namespace.path).collect(),
            None => self.catalog.list()?.into_iter().map(|r| r.namespace.path).collect(),
        })
    }

    /// Why a free namespace device may not take a dataset: someone else's
    /// data on it, unless the operator claimed it for this start.
    pub(super) fn device_refusal(&self, device: &crate::claim::HeldDevice) -> Option<String> {
        if self.claimed_devices.contains(&device.path) {
            return None;
        }
        let why = device.foreign_use()?;
        Some(format!("{why}; --claim-device {} uses it anyway", device.path.display()))
    }

    /// Says once, at start, which free namespace devices the allocator
    /// will leave alone and why (`devices ls` says it again on asking).
    pub(super) fn warn_refused_devices(&self) {
        let Ok(used) = self.namespaces_in_use() else { return };
        for device in self.namespace_devices.iter().filter(|d| !used.contains(&d.path.display().to_string())) {
            if let Some(why) = self.device_refusal(device) {
                tracing::warn!("{} is not used for datasets: {why}", device.path.display());
            }
        }
    }

    pub(super) fn held_device(&self, path: &Path) -> Option<&crate::claim::HeldDevice> {
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
    pub(super) fn allocate_namespace(&self, id: u64, size_hint: Option<u64>) -> NamespaceRecord {
        let file = |reason: String| {
            NamespaceRecord::new(NamespaceKind::File, self.file_namespace_path(id).display().to_string(), reason)
        };
        match self.driver.kind() {
            DriverKind::Mem => {
                return NamespaceRecord::new(
                    NamespaceKind::Mem,
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
                NamespaceKind::Device,
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
    pub(super) fn attach_from(&self, path: &Path, size_hint: Option<u64>) -> Result<NamespaceRecord, String> {
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
        Ok(NamespaceRecord::new(NamespaceKind::Device, device.display().to_string(), reason)
            .attached_as(crate::nvme::attachment_label(path, nsid), false))
    }

    /// Creates a namespace of `bytes` on `controller` and attaches it; a
    /// namespace made but not attached is deleted again.
    pub(super) fn create_on(&self, path: &Path, bytes: u64) -> Result<NamespaceRecord, String> {
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
        Ok(NamespaceRecord::new(NamespaceKind::Device, device.display().to_string(), reason)
            .attached_as(crate::nvme::attachment_label(path, nsid), true))
    }

    /// Attaches `nsid`, first writing it into the ledger of namespaces
    /// this node attached (so a crash right after leaves it owned).
    pub(super) fn attach_recorded(&self, controller: &Path, nsid: u32, created: bool) -> Result<PathBuf, String> {
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
}
