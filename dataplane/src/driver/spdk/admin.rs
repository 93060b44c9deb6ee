//! Namespace management on the controllers SPDK owns ([`NvmeAdmin`]):
//! Identify through raw admin commands, parsed by the shared
//! [`crate::nvme_spec`], and SPDK's synchronous attach, detach, create and
//! delete. Admin commands on one controller are issued one at a time.

use std::io;
use std::sync::MutexGuard;

use super::controller::{Controller, SpdkDriver};
use super::env::{DmaBuffer, Waiter};
use super::sys;
use crate::driver::{NvmeAdmin, NvmeNamespace};
use crate::nvme_spec::{self as spec, ControllerInfo, NamespaceInfo, PAGE_BYTES};

impl Controller {
    fn lock_admin(&self) -> io::Result<MutexGuard<'_, ()>> {
        self.admin.lock().map_err(|_| io::Error::other("admin lock poisoned"))
    }

    /// Runs an Identify admin command synchronously: its page.
    fn identify(&self, cns: u32, nsid: u32) -> io::Result<Vec<u8>> {
        let _admin = self.lock_admin()?;
        let buffer = DmaBuffer::new(PAGE_BYTES)?;
        let done = Waiter::default();
        // SAFETY: the controller is attached (for the driver's life);
        // `buffer` (DMA memory of PAGE_BYTES) and `done` outlive the
        // command: we poll until its callback ran.
        let rc = unsafe { sys::identify(self.ctrlr, cns, nsid, buffer.as_mut_ptr(), Waiter::complete, done.arg()) };
        if rc != 0 {
            return Err(io::Error::other(format!("{}: identify submit failed ({rc})", self.pci)));
        }
        done.wait(|| {
            // SAFETY: the controller is attached; admin completions are
            // processed under `admin`.
            unsafe { sys::process_admin_completions(self.ctrlr) };
        })
        .map_err(|e| io::Error::other(format!("{}: identify: {e}", self.pci)))?;
        Ok(buffer.bytes().to_vec())
    }

    /// What Identify Controller says (SPDK keeps a copy).
    fn info(&self) -> io::Result<ControllerInfo> {
        // SAFETY: the controller is attached for the driver's life, and the
        // slice is parsed before this returns.
        ControllerInfo::parse(unsafe { sys::controller_data(self.ctrlr) }).map_err(io::Error::other)
    }
}

fn nvme_result(rc: i32, what: impl FnOnce() -> String) -> io::Result<()> {
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::other(format!("{}: {}", what(), io::Error::from_raw_os_error(rc.abs()))))
    }
}

impl SpdkDriver {
    /// Namespace Attachment of `nsid` to (or, without `attach`, from) the
    /// controller at `controller`.
    fn attachment(&self, controller: &str, nsid: u32, attach: bool) -> io::Result<()> {
        let c = self.controller(controller)?;
        let controller_id = c.info()?.controller_id;
        let _admin = c.lock_admin()?;
        // SAFETY: synchronous admin call on an attached controller, one at
        // a time under `admin`.
        let rc = unsafe {
            if attach {
                sys::attach_ns(c.ctrlr, nsid, controller_id)
            } else {
                sys::detach_ns(c.ctrlr, nsid, controller_id)
            }
        };
        let verb = if attach { "attaching" } else { "detaching" };
        nvme_result(rc, || format!("{controller}: {verb} namespace {nsid}"))
    }
}

impl NvmeAdmin for SpdkDriver {
    fn controllers(&self) -> Vec<String> {
        self.controllers.iter().map(|c| c.pci.clone()).collect()
    }

    fn namespaces(&self, controller: &str) -> io::Result<Vec<NvmeNamespace>> {
        let c = self.controller(controller)?;
        let list = c.identify(spec::CNS_ALLOCATED_NSIDS, 0)?;
        let nsids = spec::nsid_list(&list).map_err(|e| io::Error::other(format!("{controller}: {e}")))?;
        let mut out = Vec::with_capacity(nsids.len());
        for nsid in nsids {
            // SAFETY: the controller is attached.
            let attached = unsafe { sys::is_active_ns(c.ctrlr, nsid) };
            let info =
                NamespaceInfo::parse(&c.identify(spec::CNS_ALLOCATED_NAMESPACE, nsid)?).map_err(io::Error::other)?;
            out.push(NvmeNamespace { nsid, attached, capacity_bytes: info.capacity_bytes(), shared: info.shared });
        }
        Ok(out)
    }

    fn namespace_identity(&self, controller: &str, nsid: u32) -> io::Result<String> {
        let c = self.controller(controller)?;
        let page = c.identify(spec::CNS_ALLOCATED_NAMESPACE, nsid)?;
        Ok(NamespaceInfo::parse(&page).map_err(io::Error::other)?.identity())
    }

    fn attach(&self, controller: &str, nsid: u32) -> io::Result<()> {
        self.attachment(controller, nsid, true)
    }

    fn detach(&self, controller: &str, nsid: u32) -> io::Result<()> {
        self.attachment(controller, nsid, false)
    }

    fn manages_namespaces(&self, controller: &str) -> io::Result<bool> {
        Ok(self.controller(controller)?.info()?.manages_namespaces)
    }

    fn create(&self, controller: &str, bytes: u64) -> io::Result<u32> {
        let c = self.controller(controller)?;
        // Format 0's block size from the common namespace data; 512 B if
        // the controller does not report it.
        let common = c.identify(spec::CNS_NAMESPACE, spec::NSID_ALL).ok();
        let page = spec::create_namespace_page(bytes, spec::format0_block_bytes(common.as_deref()));
        let _admin = c.lock_admin()?;
        // SAFETY: as in `attach`.
        let nsid = unsafe { sys::create_ns(c.ctrlr, &page) };
        if nsid == 0 || nsid == spec::NSID_ALL {
            return Err(io::Error::other(format!("{controller}: namespace create refused by the controller")));
        }
        Ok(nsid)
    }

    fn delete(&self, controller: &str, nsid: u32) -> io::Result<()> {
        let c = self.controller(controller)?;
        let _admin = c.lock_admin()?;
        // SAFETY: as in `attach`.
        let rc = unsafe { sys::delete_ns(c.ctrlr, nsid) };
        nvme_result(rc, || format!("{controller}: deleting namespace {nsid}"))
    }
}
