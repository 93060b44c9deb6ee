//! The one namespace allocator over NVMe controllers, whichever stack
//! issues the admin commands ([`NvmeAdmin`]: SPDK on the controllers it
//! owns, or the kernel's passthrough in the node or its helper). For a new
//! dataset it takes, in order: a free active namespace (only where the
//! stack owns its controllers whole: the kernel's active namespaces may be
//! the host's own), a namespace created for the dataset's size (Namespace
//! Management), or the smallest detached namespace of the pool that holds
//! it. A namespace shared with other controllers (NMIC) is never taken:
//! another host may write it. What the stack does to take a namespace
//! (record it, attach it, find its block device) is the caller's `attach`.

use std::collections::HashSet;

use sluice_dataplane::NvmeAdmin;

use super::allocator::{best_fit, hint_words};

/// How a namespace was found, and what taking it returned (`attach`'s
/// value: the kernel's block device, nothing for SPDK).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Found<T> {
    /// Active already, and no dataset holds it: nothing was done to take it.
    Free,
    /// Created for the dataset, then attached: delete gives it back.
    Created(T),
    /// Attached from the detached pool: delete detaches it again.
    Attached(T),
}

/// A namespace taken for a dataset.
#[derive(Debug)]
pub(super) struct Taken<T> {
    pub controller: String,
    pub nsid: u32,
    pub found: Found<T>,
    /// Why this one, in words for `dataset stat`.
    pub reason: String,
}

/// One NVMe admin stack as the allocator uses it.
pub(super) struct Stack<'a, T> {
    pub admin: &'a dyn NvmeAdmin,
    /// Said after "a whole NVMe namespace" in reasons (" (SPDK)").
    pub label: &'static str,
    /// Active namespaces held by datasets, by `CONTROLLER/NSID`
    /// ([`nvme_path`]); `None` where active namespaces are never offered.
    pub active_in_use: Option<&'a HashSet<String>>,
    /// Takes `nsid` of `controller` for the dataset (`true`: it was just
    /// created); an error leaves it untaken.
    pub attach: &'a dyn Fn(&str, u32, bool) -> Result<T, String>,
}

/// `CONTROLLER/NSID`, how a record names a namespace of a user-space
/// driver's controller.
pub(super) fn nvme_path(controller: &str, nsid: u32) -> String {
    format!("{controller}/{nsid}")
}

pub(super) fn parse_nvme_path(path: &str) -> Option<(String, u32)> {
    let (controller, nsid) = path.rsplit_once('/')?;
    Some((controller.to_string(), nsid.parse().ok()?))
}

/// A `(controller, nsid)` and its capacity in bytes.
type Candidate = ((String, u32), u64);

/// What the stack's controllers offer a new dataset.
struct Pool {
    /// Active namespaces no dataset holds (where offered).
    free: Vec<Candidate>,
    /// Namespaces of the subsystems not attached to their controller.
    detached: Vec<Candidate>,
    /// Controllers that could not be asked, and shared namespaces passed.
    why_not: Vec<String>,
}

impl Pool {
    fn of(admin: &dyn NvmeAdmin, active_in_use: Option<&HashSet<String>>) -> Self {
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
                } else if active_in_use.is_some_and(|used| !used.contains(&nvme_path(&controller, ns.nsid))) {
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

/// Takes a namespace for a dataset of about `size_hint` bytes, or says
/// why none: each controller's and each attempt's reason.
pub(super) fn take<T>(stack: &Stack<'_, T>, size_hint: Option<u64>) -> Result<Taken<T>, Vec<String>> {
    let label = stack.label;
    let Pool { free, detached, mut why_not } = Pool::of(stack.admin, stack.active_in_use);
    if let Some(((controller, nsid), capacity)) = best_fit(&free, size_hint) {
        let reason = format!(
            "a whole NVMe namespace{label}: namespace {nsid} of {controller}, {capacity} bytes ({} were free{})",
            free.len(),
            hint_words(size_hint)
        );
        return Ok(Taken { controller, nsid, found: Found::Free, reason });
    }
    if let Some(bytes) = size_hint {
        for controller in stack.admin.controllers() {
            match created(stack, &controller, bytes) {
                Ok((nsid, attached)) => {
                    let reason = format!(
                        "a whole NVMe namespace created for it{label}: namespace {nsid} of {controller}, {bytes} bytes asked"
                    );
                    return Ok(Taken { controller, nsid, found: Found::Created(attached), reason });
                }
                Err(err) => why_not.push(err),
            }
        }
    }
    let Some(((controller, nsid), capacity)) = best_fit(&detached, size_hint) else {
        why_not.push(if detached.is_empty() {
            "no detached namespace that is not shared with other controllers (NMIC)".to_string()
        } else {
            format!("no detached namespace holds {} bytes ({} detached)", size_hint.unwrap_or(0), detached.len())
        });
        return Err(why_not);
    };
    match (stack.attach)(&controller, nsid, false) {
        Ok(attached) => {
            let reason = format!(
                "a whole NVMe namespace attached for it{label}: namespace {nsid} of {controller}, {capacity} bytes ({} were detached{}){}",
                detached.len(),
                hint_words(size_hint),
                if why_not.is_empty() { String::new() } else { format!("; {}", why_not.join("; ")) }
            );
            Ok(Taken { controller, nsid, found: Found::Attached(attached), reason })
        }
        Err(err) => {
            why_not.push(format!("attaching namespace {nsid} of {controller}: {err}"));
            Err(why_not)
        }
    }
}

/// Creates a namespace of `bytes` on `controller` and takes it; one made
/// but not taken is deleted again.
fn created<T>(stack: &Stack<'_, T>, controller: &str, bytes: u64) -> Result<(u32, T), String> {
    let admin = stack.admin;
    match admin.manages_namespaces(controller) {
        Ok(true) => {}
        Ok(false) => return Err(format!("{controller} has no namespace management")),
        Err(err) => return Err(format!("namespace management of {controller} unknown ({err})")),
    }
    let nsid =
        admin.create(controller, bytes).map_err(|e| format!("namespace create refused on {controller} ({e})"))?;
    match (stack.attach)(controller, nsid, true) {
        Ok(attached) => Ok((nsid, attached)),
        Err(err) => {
            if let Err(cleanup) = admin.delete(controller, nsid) {
                tracing::warn!("deleting namespace {nsid} of {controller} after a failed attach: {cleanup}");
            }
            Err(format!("namespace {nsid} created on {controller} but not attached ({err}); deleted again"))
        }
    }
}

#[cfg(test)]
mod tests {
    use std::io;
    use std::sync::Mutex;

    use sluice_dataplane::NvmeNamespace;

    use super::*;

    const C: &str = "/dev/nvme0";

    /// One controller's namespaces and what was done to them.
    struct Listed {
        namespaces: Mutex<Vec<NvmeNamespace>>,
        manages: bool,
        log: Mutex<Vec<String>>,
    }

    fn listed(manages: bool, namespaces: &[(u32, bool, u64, bool)]) -> Listed {
        let namespaces = namespaces
            .iter()
            .map(|&(nsid, attached, capacity_bytes, shared)| NvmeNamespace { nsid, attached, capacity_bytes, shared })
            .collect();
        Listed { namespaces: Mutex::new(namespaces), manages, log: Mutex::new(Vec::new()) }
    }

    impl Listed {
        fn note(&self, what: String) {
            self.log.lock().expect("log").push(what);
        }
        fn log(&self) -> Vec<String> {
            self.log.lock().expect("log").clone()
        }
    }

    impl NvmeAdmin for Listed {
        fn controllers(&self) -> Vec<String> {
            vec![C.into()]
        }
        fn namespaces(&self, _: &str) -> io::Result<Vec<NvmeNamespace>> {
            Ok(self.namespaces.lock().expect("namespaces").clone())
        }
        fn namespace_identity(&self, _: &str, nsid: u32) -> io::Result<String> {
            Ok(format!("id-{nsid}"))
        }
        fn attach(&self, _: &str, nsid: u32) -> io::Result<()> {
            self.note(format!("attach {nsid}"));
            Ok(())
        }
        fn detach(&self, _: &str, nsid: u32) -> io::Result<()> {
            self.note(format!("detach {nsid}"));
            Ok(())
        }
        fn manages_namespaces(&self, _: &str) -> io::Result<bool> {
            Ok(self.manages)
        }
        fn create(&self, _: &str, bytes: u64) -> io::Result<u32> {
            if !self.manages {
                return Err(io::Error::other("NVMe status 0x2"));
            }
            self.note(format!("create {bytes}"));
            Ok(9)
        }
        fn delete(&self, _: &str, nsid: u32) -> io::Result<()> {
            self.note(format!("delete {nsid}"));
            Ok(())
        }
    }

    fn stack<'a>(
        admin: &'a Listed,
        active_in_use: Option<&'a HashSet<String>>,
        attach: &'a dyn Fn(&str, u32, bool) -> Result<String, String>,
    ) -> Stack<'a, String> {
        Stack { admin, label: "", active_in_use, attach }
    }

    fn attach_ok(controller: &str, nsid: u32, created: bool) -> Result<String, String> {
        Ok(format!("{controller}n{nsid}{}", if created { " (new)" } else { "" }))
    }

    /// A namespace another controller may attach (NMIC bit 0) is neither
    /// free nor in the detached pool, attached or not, and the reason says
    /// so; a held one is not free; the rest are offered.
    #[test]
    fn shared_and_held_namespaces_are_never_offered() {
        let admin = listed(
            false,
            &[
                (1, true, 1 << 20, false),
                (2, true, 1 << 20, true),
                (3, false, 1 << 20, true),
                (4, false, 1 << 20, false),
            ],
        );
        let used = HashSet::from([nvme_path(C, 5)]);
        let pool = Pool::of(&admin, Some(&used));
        let nsids = |c: &[Candidate]| c.iter().map(|((_, nsid), _)| *nsid).collect::<Vec<_>>();
        assert_eq!(nsids(&pool.free), [1]);
        assert_eq!(nsids(&pool.detached), [4]);
        assert_eq!(pool.why_not, [format!("{C}: 2 shared with other controllers (NMIC), never taken")]);
        let held = HashSet::from([nvme_path(C, 1)]);
        assert!(Pool::of(&admin, Some(&held)).free.is_empty());
        assert!(Pool::of(&admin, None).free.is_empty(), "the kernel's active namespaces are never offered");
    }

    #[test]
    fn a_free_namespace_is_taken_without_an_admin_command() {
        let admin = listed(true, &[(1, true, 8 << 20, false), (2, true, 2 << 20, false)]);
        let used = HashSet::new();
        let taken = take(&stack(&admin, Some(&used), &attach_ok), Some(1 << 20)).expect("taken");
        assert_eq!((taken.nsid, taken.found), (2, Found::Free), "the smallest that holds it");
        assert!(taken.reason.contains("2 were free"), "{}", taken.reason);
        assert!(admin.log().is_empty());
    }

    #[test]
    fn with_a_size_a_namespace_is_created_before_the_pool_is_touched() {
        let admin = listed(true, &[(4, false, 64 << 20, false)]);
        let taken = take(&stack(&admin, None, &attach_ok), Some(1_000_000)).expect("taken");
        assert_eq!((taken.nsid, taken.found), (9, Found::Created("/dev/nvme0n9 (new)".to_string())));
        assert!(taken.reason.contains("created for it") && taken.reason.contains("1000000 bytes asked"));
        assert_eq!(admin.log(), ["create 1000000"]);
    }

    #[test]
    fn a_created_namespace_that_cannot_be_taken_is_deleted_and_the_pool_is_next() {
        let admin = listed(true, &[(4, false, 64 << 20, false)]);
        let attach = |controller: &str, nsid, created| {
            if created {
                Err("no block device appeared".to_string())
            } else {
                attach_ok(controller, nsid, created)
            }
        };
        let taken = take(&stack(&admin, None, &attach), Some(1_000_000)).expect("taken");
        assert_eq!((taken.nsid, taken.found), (4, Found::Attached("/dev/nvme0n4".to_string())));
        assert_eq!(admin.log(), ["create 1000000", "delete 9"]);
        assert!(taken.reason.contains("not attached (no block device appeared); deleted again"), "{}", taken.reason);
    }

    /// Without namespace management, the pool's smallest namespace that
    /// holds the size; the refusal is in the reason.
    #[test]
    fn a_refused_create_falls_back_to_the_best_fit_of_the_pool() {
        let admin =
            listed(false, &[(2, false, 64 << 20, false), (3, false, 16 << 20, false), (5, false, 1 << 20, false)]);
        let taken = take(&stack(&admin, None, &attach_ok), Some(2 << 20)).expect("taken");
        assert_eq!((taken.nsid, taken.found), (3, Found::Attached("/dev/nvme0n3".to_string())));
        assert!(taken.reason.contains(&format!("{} bytes (3 were detached", 16 << 20)), "{}", taken.reason);
        assert!(taken.reason.contains("has no namespace management"), "{}", taken.reason);
        let none = take(&stack(&admin, None, &attach_ok), Some(128 << 20)).expect_err("none holds it");
        assert!(none.iter().any(|why| why.contains(&format!("holds {} bytes", 128 << 20))), "{none:?}");
    }

    #[test]
    fn an_empty_pool_or_a_failed_attach_says_why() {
        let admin = listed(false, &[(1, true, 1 << 20, false)]);
        let why = take(&stack(&admin, None, &attach_ok), None).expect_err("empty");
        assert_eq!(why, ["no detached namespace that is not shared with other controllers (NMIC)"]);
        let admin = listed(false, &[(4, false, 1 << 20, false)]);
        let refuse = |_: &str, _: u32, _: bool| Err::<String, _>("busy".to_string());
        let why = take(&stack(&admin, None, &refuse), None).expect_err("refused");
        assert_eq!(why, [format!("attaching namespace 4 of {C}: busy")]);
    }

    #[test]
    fn nvme_paths_round_trip() {
        assert_eq!(nvme_path("0000:00:05.0", 3), "0000:00:05.0/3");
        assert_eq!(parse_nvme_path("0000:00:05.0/3"), Some(("0000:00:05.0".to_string(), 3)));
        assert_eq!(parse_nvme_path("0000:00:05.0"), None);
        assert_eq!(parse_nvme_path("0000:00:05.0/x"), None);
    }
}
