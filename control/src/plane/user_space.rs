//! Namespaces on controllers a user-space driver (SPDK) owns: the kernel
//! has no block devices for them, so the allocator asks the driver. Each
//! dataset takes a whole namespace: a free active one, else one created for
//! its size, else one attached from the detached pool; with nothing left
//! the create fails (an SPDK node has no files to fall back to).

use sluice_dataplane::NvmeAdmin;

use super::*;

/// The namespace kind of one on a user-space driver's controller; its path
/// is `PCI_ADDRESS/NSID`.
pub(super) const NVME_KIND: &str = "nvme";
/// The kind of a record whose dataset got no namespace: create undoes it.
pub(super) const UNPLACED_KIND: &str = "unplaced";

pub(super) fn nvme_path(controller: &str, nsid: u32) -> String {
    format!("{controller}/{nsid}")
}

pub(super) fn parse_nvme_path(path: &str) -> Option<(String, u32)> {
    let (controller, nsid) = path.rsplit_once('/')?;
    Some((controller.to_string(), nsid.parse().ok()?))
}

impl ControlPlane {
    pub(super) fn allocate_user_space(&self, admin: &dyn NvmeAdmin, size_hint: Option<u64>) -> NamespaceRecord {
        let record = |controller: &str, nsid: u32, reason: String, attached: bool, created: bool| {
            let record = NamespaceRecord::new(NVME_KIND, nvme_path(controller, nsid), reason);
            if attached {
                record.attached_as(nvme_path(controller, nsid), created)
            } else {
                record
            }
        };
        let used = match self.namespaces_in_use() {
            Ok(used) => used,
            Err(err) => return unplaced(format!("the catalog could not say which namespaces are in use: {err}")),
        };
        let mut why_not = Vec::new();
        let mut free = Vec::new();
        let mut detached = Vec::new();
        for controller in admin.controllers() {
            match admin.namespaces(&controller) {
                Ok(namespaces) => {
                    for ns in namespaces {
                        let entry = ((controller.clone(), ns.nsid), ns.capacity_bytes);
                        if !ns.attached {
                            detached.push(entry);
                        } else if !used.contains(&nvme_path(&controller, ns.nsid)) {
                            free.push(entry);
                        }
                    }
                }
                Err(err) => why_not.push(format!("{controller}: {err}")),
            }
        }
        if let Some(((controller, nsid), capacity)) = best_fit(&free, size_hint) {
            let reason = format!(
                "a whole NVMe namespace (SPDK): namespace {nsid} of {controller}, {capacity} bytes ({} were free{})",
                free.len(),
                hint_words(size_hint)
            );
            return record(&controller, nsid, reason, false, false);
        }
        if let Some(bytes) = size_hint {
            for controller in admin.controllers() {
                let created = match admin.manages_namespaces(&controller) {
                    Ok(true) => admin.create(&controller, bytes),
                    Ok(false) => Err(std::io::Error::other("no namespace management")),
                    Err(err) => Err(err),
                };
                match created.and_then(|nsid| admin.attach(&controller, nsid).map(|()| nsid)) {
                    Ok(nsid) => {
                        let reason = format!(
                            "a whole NVMe namespace created for it (SPDK): namespace {nsid} of {controller}, {bytes} bytes asked"
                        );
                        return record(&controller, nsid, reason, true, true);
                    }
                    Err(err) => why_not.push(format!("namespace create on {controller} refused ({err})")),
                }
            }
        }
        let Some(((controller, nsid), capacity)) = best_fit(&detached, size_hint) else {
            why_not.push(format!(
                "{} detached namespaces, none holding {} bytes",
                detached.len(),
                size_hint.unwrap_or(0)
            ));
            return unplaced(format!("no free NVMe namespace on the SPDK controllers: {}", why_not.join("; ")));
        };
        match admin.attach(&controller, nsid) {
            Ok(()) => {
                tracing::info!("attached namespace {nsid} of {controller} through SPDK");
                let reason = format!(
                    "a whole NVMe namespace attached for it (SPDK): namespace {nsid} of {controller}, {capacity} bytes ({} were detached{}){}",
                    detached.len(),
                    hint_words(size_hint),
                    if why_not.is_empty() { String::new() } else { format!("; {}", why_not.join("; ")) }
                );
                record(&controller, nsid, reason, true, false)
            }
            Err(err) => unplaced(format!("attaching namespace {nsid} of {controller}: {err}")),
        }
    }

    /// Gives a user-space driver's namespace back: detached if it was
    /// attached for the dataset, deleted if it was created for it.
    pub(super) fn release_user_space(&self, record: &DatasetRecord) {
        let Some(admin) = self.driver.nvme_admin() else { return };
        let Some((controller, nsid)) = record.namespace.attached.as_deref().and_then(parse_nvme_path) else {
            return;
        };
        match admin.detach(&controller, nsid) {
            Ok(()) => tracing::info!("detached namespace {nsid} of {controller} through SPDK"),
            Err(err) => {
                tracing::warn!("detaching namespace {nsid} of {controller}: {err}");
                return;
            }
        }
        if record.namespace.created {
            if let Err(err) = admin.delete(&controller, nsid) {
                tracing::warn!("deleting namespace {nsid} of {controller}: {err}");
            }
        }
    }
}

fn unplaced(reason: String) -> NamespaceRecord {
    NamespaceRecord::new(UNPLACED_KIND, "", reason)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nvme_paths_round_trip() {
        assert_eq!(nvme_path("0000:00:05.0", 3), "0000:00:05.0/3");
        assert_eq!(parse_nvme_path("0000:00:05.0/3"), Some(("0000:00:05.0".to_string(), 3)));
        assert_eq!(parse_nvme_path("0000:00:05.0"), None);
        assert_eq!(parse_nvme_path("0000:00:05.0/x"), None);
    }
}
