//! Choosing a namespace for a new dataset: a free namespace device, else a
//! namespace of a configured controller ([`nvme_pool`], the allocator both
//! NVMe admin stacks share), else a file; one allocator lock and this
//! node's copy records decide what is in use.

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
    pub(in crate::plane) fn namespaces_in_use(&self) -> Result<HashSet<String>, ControlError> {
        Ok(match self.cluster.etcd() {
            Some(cluster) => cluster.own_replicas()?.into_values().map(|r| r.namespace.path).collect(),
            None => self.catalog.list()?.into_iter().map(|r| r.namespace.path).collect(),
        })
    }

    /// Why a free namespace device may not take a dataset: someone else's
    /// data on it, unless the operator claimed it for this start.
    pub(in crate::plane) fn device_refusal(&self, device: &crate::claim::HeldDevice) -> Option<String> {
        if self.storage.claimed_devices.contains(&device.path) {
            return None;
        }
        let why = device.foreign_use()?;
        Some(format!("{why}; --claim-device {} uses it anyway", device.path.display()))
    }

    /// Says once, at start, which free namespace devices the allocator
    /// will leave alone and why (`devices ls` says it again on asking).
    pub(in crate::plane) fn warn_refused_devices(&self) {
        let Ok(used) = self.namespaces_in_use() else { return };
        for device in self.storage.namespace_devices.iter().filter(|d| !used.contains(&d.path.display().to_string())) {
            if let Some(why) = self.device_refusal(device) {
                tracing::warn!("{} is not used for datasets: {why}", device.path.display());
            }
        }
    }

    pub(in crate::plane) fn held_device(&self, path: &Path) -> Option<&crate::claim::HeldDevice> {
        self.storage.namespace_devices.iter().find(|d| d.path == path)
    }

    /// Chooses where a new dataset lives. With the uring driver: a whole
    /// namespace device while one is free; else a namespace attached from a
    /// configured controller's detached pool; else a file per dataset in the
    /// node's namespace directory. With a size hint, only namespaces that
    /// hold it count, and the smallest of those is taken (best fit, so big
    /// namespaces stay free for big datasets). The caller holds [`ControlPlane::allocator`] until the choice is
    /// recorded, so two creates, or a create and a copy, never pick the
    /// same namespace.
    pub(in crate::plane) fn allocate_namespace(&self, id: u64, size_hint: Option<u64>) -> NamespaceRecord {
        let file = |reason: String| {
            NamespaceRecord::new(NamespaceKind::File, self.file_namespace_path(id).display().to_string(), reason)
        };
        match self.storage.driver.kind() {
            DriverKind::Mem => {
                return NamespaceRecord::new(
                    NamespaceKind::Mem,
                    format!("mem:{id}"),
                    "memory driver: a namespace in RAM, gone at restart",
                )
            }
            DriverKind::Uring if self.storage.namespace_devices.is_empty() && !self.storage.has_controllers() => {
                return file("no NVMe namespace configured: a file per dataset under the data directory".into())
            }
            DriverKind::Spdk => match self.storage.driver.nvme_admin() {
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
            .storage
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
                    self.storage.namespace_devices.len(),
                    hint_words(size_hint),
                ),
            );
        }
        let mut why_not = Vec::new();
        if !free.is_empty() {
            why_not.push(format!("no free namespace device holds {} bytes", size_hint.unwrap_or(0)));
        }
        if self.storage.has_controllers() {
            match self.take_from_controllers(size_hint) {
                Ok(record) => return record,
                Err(why) => why_not.extend(why),
            }
        }
        file(format!(
            "no free NVMe namespace ({} namespace devices in use{}{}): a file under the data directory",
            self.storage.namespace_devices.len() - free.len(),
            if why_not.is_empty() { "" } else { "; " },
            why_not.join("; ")
        ))
    }

    /// A namespace of the configured controllers, through the kernel's
    /// admin stack: created for the size where the controller allows it,
    /// else the smallest detached one of their pools that holds it
    /// ([`nvme_pool::take`]); attached and recorded as this node's.
    fn take_from_controllers(&self, size_hint: Option<u64>) -> Result<NamespaceRecord, Vec<String>> {
        let attach = |controller: &str, nsid: u32, created: bool| self.attach_recorded(controller, nsid, created);
        let stack =
            nvme_pool::Stack { admin: &*self.storage.kernel_admin, label: "", active_in_use: None, attach: &attach };
        let taken = nvme_pool::take(&stack, size_hint)?;
        let (device, created) = match taken.found {
            nvme_pool::Found::Created(device) => (device, true),
            nvme_pool::Found::Attached(device) => (device, false),
            // `active_in_use: None` offers no free namespace.
            nvme_pool::Found::Free => return Err(vec!["the kernel's active namespaces are not offered".to_string()]),
        };
        tracing::info!("took namespace {} of {} as {}", taken.nsid, taken.controller, device.display());
        let label = crate::nvme::attachment_label(Path::new(&taken.controller), taken.nsid);
        Ok(NamespaceRecord::new(NamespaceKind::Device, device.display().to_string(), taken.reason)
            .attached_as(label, created))
    }

    /// Attaches `nsid`, first writing it into the ledger of namespaces
    /// this node attached (so a crash right after leaves it owned): its
    /// block device.
    pub(in crate::plane) fn attach_recorded(
        &self,
        controller: &str,
        nsid: u32,
        created: bool,
    ) -> Result<PathBuf, String> {
        let admin = &*self.storage.kernel_admin;
        let label = crate::nvme::attachment_label(Path::new(controller), nsid);
        let identity = admin.namespace_identity(controller, nsid).map_err(|e| format!("identifying {label}: {e}"))?;
        if crate::nvme::identity_is_blank(&identity) {
            tracing::warn!("{label} reports no NGUID or EUI64: only its NSID identifies it before a detach");
        }
        self.storage
            .attach_ledger
            .insert(ownership::Attachment { label: label.clone(), identity, created })
            .map_err(|e| format!("recording the attachment of {label}: {e}"))?;
        admin.attach(controller, nsid).and_then(|()| admin.block_device(controller, nsid)).map_err(|e| {
            if let Err(forget) = self.storage.attach_ledger.remove(&label) {
                tracing::warn!("forgetting the failed attachment of {label}: {forget}");
            }
            e.to_string()
        })
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
