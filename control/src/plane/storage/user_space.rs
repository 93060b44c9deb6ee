//! Namespaces on controllers a user-space driver (SPDK) owns: the kernel
//! has no block devices for them, so the allocator ([`nvme_pool`]) asks the
//! driver's admin stack, and free active namespaces count too (the driver
//! owns the controllers whole). With nothing left the create fails: an
//! SPDK node has no files to fall back to.

use sluice_dataplane::NvmeAdmin;

use super::nvme_pool::{self, nvme_path, parse_nvme_path, Found};
use super::*;

impl ControlPlane {
    pub(in crate::plane) fn allocate_user_space(
        &self,
        admin: &dyn NvmeAdmin,
        size_hint: Option<u64>,
    ) -> NamespaceRecord {
        let used = match self.namespaces_in_use() {
            Ok(used) => used,
            Err(err) => return unplaced(format!("the catalog could not say which namespaces are in use: {err}")),
        };
        let attach = |controller: &str, nsid: u32, _created: bool| {
            admin.attach(controller, nsid).map_err(|e| e.to_string())?;
            tracing::info!("attached namespace {nsid} of {controller} through SPDK");
            Ok(())
        };
        let stack = nvme_pool::Stack { admin, label: " (SPDK)", active_in_use: Some(&used), attach: &attach };
        match nvme_pool::take(&stack, size_hint) {
            Ok(taken) => {
                let path = nvme_path(&taken.controller, taken.nsid);
                let record = NamespaceRecord::new(NamespaceKind::Nvme, path.clone(), taken.reason);
                match taken.found {
                    Found::Free => record,
                    Found::Created(()) => record.attached_as(path, true),
                    Found::Attached(()) => record.attached_as(path, false),
                }
            }
            Err(why) => unplaced(format!("no free NVMe namespace on the SPDK controllers: {}", why.join("; "))),
        }
    }

    /// Gives a user-space driver's namespace back: detached if it was
    /// attached for the dataset, deleted if it was created for it.
    pub(in crate::plane) fn release_user_space(&self, record: &DatasetRecord) {
        let Some(admin) = self.storage.driver.nvme_admin() else { return };
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
    NamespaceRecord::new(NamespaceKind::Unplaced, "", reason)
}
