//! `devices ls`: every place datasets live on this node, what each holds,
//! and why a free one is passed over.

use super::*;

impl ControlPlane {
    /// What each place datasets live holds: every namespace device given to
    /// the node, and the data directory's filesystem for file namespaces.
    pub fn devices(&self) -> Vec<DeviceReport> {
        let records = self.catalog.list().unwrap_or_default();
        let mut out = Vec::new();
        for device in &self.storage.namespace_devices {
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
        for controller in self.storage.kernel_admin.controllers() {
            out.extend(self.controller_pool(&controller, &records));
        }
        let (capacity_bytes, available_bytes) = nix::sys::statvfs::statvfs(&self.storage.namespace_dir)
            .map(|s| (s.blocks() * s.fragment_size(), s.blocks_available() * s.fragment_size()))
            .unwrap_or((0, 0));
        let in_files: Vec<&DatasetRecord> =
            records.iter().filter(|r| r.namespace.kind == NamespaceKind::File).collect();
        out.push(DeviceReport {
            kind: "data_dir".into(),
            path: self.storage.namespace_dir.display().to_string(),
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
    fn controller_pool(&self, controller: &str, records: &[DatasetRecord]) -> Vec<DeviceReport> {
        let namespaces = self.storage.kernel_admin.namespaces(controller);
        let namespaces = match namespaces {
            Ok(namespaces) => namespaces,
            Err(err) => {
                tracing::warn!("listing the namespaces of {controller}: {err}");
                return vec![DeviceReport {
                    kind: "nvme_controller_unreadable".into(),
                    path: controller.to_string(),
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
                let label = crate::nvme::attachment_label(Path::new(controller), ns.nsid);
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
}
