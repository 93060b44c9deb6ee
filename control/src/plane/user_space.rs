//! Namespaces on controllers a user-space driver (SPDK) owns: the kernel
//! has no block devices for them, so the allocator asks the driver. Each
//! dataset takes a whole namespace: a free active one, else one created for
//! its size, else one attached from the detached pool; with nothing left
//! the create fails (an SPDK node has no files to fall back to).

use sluice_dataplane::NvmeAdmin;

use super::*;

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
            let record = NamespaceRecord::new(NamespaceKind::Nvme, nvme_path(controller, nsid), reason);
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
        let Pool { free, detached, mut why_not } = Pool::of(admin, &used);
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

/// A `(controller, nsid)` and its capacity in bytes.
type Candidate = ((String, u32), u64);

/// What the user-space driver's controllers offer a new dataset.
struct Pool {
    /// Active namespaces no dataset holds.
    free: Vec<Candidate>,
    /// Namespaces of the subsystems not attached to their controller.
    detached: Vec<Candidate>,
    /// Controllers that could not be asked, and shared namespaces passed.
    why_not: Vec<String>,
}

impl Pool {
    /// Every namespace of every controller, less those `used` names and
    /// those shared with other controllers (NMIC): another host may write
    /// a shared namespace, so it never holds a dataset, as on the kernel
    /// path (`allocator.rs`, the admin helper).
    fn of(admin: &dyn NvmeAdmin, used: &HashSet<String>) -> Self {
        let mut pool = Self { free: Vec::new(), detached: Vec::new(), why_not: Vec::new() };
        for controller in admin.controllers() {
            let namespaces = match admin.namespaces(&controller) {
                Ok(namespaces) => namespaces,
                Err(err) => {
                    pool.why_not.push(format!("{controller}: {err}"));
                    continue;
                }
            };
            let mut shared = 0;
            for ns in namespaces {
                let entry = ((controller.clone(), ns.nsid), ns.capacity_bytes);
                if ns.shared {
                    shared += 1;
                } else if !ns.attached {
                    pool.detached.push(entry);
                } else if !used.contains(&nvme_path(&controller, ns.nsid)) {
                    pool.free.push(entry);
                }
            }
            if shared > 0 {
                pool.why_not.push(format!("{controller}: {shared} shared with other controllers (NMIC), never taken"));
            }
        }
        pool
    }
}

fn unplaced(reason: String) -> NamespaceRecord {
    NamespaceRecord::new(NamespaceKind::Unplaced, "", reason)
}

#[cfg(test)]
mod tests {
    use sluice_dataplane::NvmeNamespace;

    use super::*;

    /// One controller's namespaces, as SPDK would list them.
    struct Listed(Vec<NvmeNamespace>);

    impl NvmeAdmin for Listed {
        fn controllers(&self) -> Vec<String> {
            vec!["0000:00:05.0".into()]
        }
        fn namespaces(&self, _: &str) -> std::io::Result<Vec<NvmeNamespace>> {
            Ok(self.0.clone())
        }
        fn namespace_identity(&self, _: &str, _: u32) -> std::io::Result<String> {
            unreachable!("the pool identifies nothing")
        }
        fn attach(&self, _: &str, _: u32) -> std::io::Result<()> {
            unreachable!("the pool attaches nothing")
        }
        fn detach(&self, _: &str, _: u32) -> std::io::Result<()> {
            unreachable!("the pool detaches nothing")
        }
        fn manages_namespaces(&self, _: &str) -> std::io::Result<bool> {
            Ok(false)
        }
        fn create(&self, _: &str, _: u64) -> std::io::Result<u32> {
            unreachable!("the pool creates nothing")
        }
        fn delete(&self, _: &str, _: u32) -> std::io::Result<()> {
            unreachable!("the pool deletes nothing")
        }
    }

    /// A namespace another controller may attach (NMIC bit 0) is neither
    /// free nor in the detached pool, attached or not, and the reason says
    /// so; a held one is not free; the rest are offered.
    #[test]
    fn shared_and_held_namespaces_are_never_offered() {
        let ns = |nsid, attached, shared| NvmeNamespace { nsid, attached, capacity_bytes: 1 << 20, shared };
        let admin = Listed(vec![
            ns(1, true, false),
            ns(2, true, true),
            ns(3, false, true),
            ns(4, false, false),
            ns(5, true, false),
        ]);
        let used = HashSet::from([nvme_path("0000:00:05.0", 5)]);
        let pool = Pool::of(&admin, &used);
        let nsids = |c: &[Candidate]| c.iter().map(|((_, nsid), _)| *nsid).collect::<Vec<_>>();
        assert_eq!(nsids(&pool.free), [1]);
        assert_eq!(nsids(&pool.detached), [4]);
        assert_eq!(pool.why_not, ["0000:00:05.0: 2 shared with other controllers (NMIC), never taken"]);
    }

    #[test]
    fn nvme_paths_round_trip() {
        assert_eq!(nvme_path("0000:00:05.0", 3), "0000:00:05.0/3");
        assert_eq!(parse_nvme_path("0000:00:05.0/3"), Some(("0000:00:05.0".to_string(), 3)));
        assert_eq!(parse_nvme_path("0000:00:05.0"), None);
        assert_eq!(parse_nvme_path("0000:00:05.0/x"), None);
    }
}
