//! NVMe admin commands through the kernel driver (`/dev/nvmeX` passthrough
//! ioctls): what the namespace allocator needs to create a namespace of a
//! dataset's size (Namespace Management) or take one from a controller's
//! pool of detached ones, and to give it back: the kernel's implementation
//! of [`NvmeAdmin`], the trait SPDK-owned controllers implement too, over
//! the same Identify parsing (`sluice_dataplane::nvme_spec`).
//!
//! The allocator reaches these commands through [`KernelAdmin`]: in the
//! node's own process while it runs as root ([`Passthrough`]), or through a
//! small privileged helper process once the node has dropped to `--user`
//! (the commands need `CAP_SYS_ADMIN`, and each namespace attached at run
//! time is a new device node only root opens).

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use sluice_dataplane::nvme_spec::{
    self as spec, ControllerInfo, NamespaceInfo, CNS_ACTIVE_NSIDS, CNS_ALLOCATED_NAMESPACE, CNS_ALLOCATED_NSIDS,
    CNS_CONTROLLER, CNS_NAMESPACE, NSID_ALL, NS_ATTACH, NS_DETACH, NS_MANAGEMENT_CREATE, NS_MANAGEMENT_DELETE,
    OPCODE_IDENTIFY, OPCODE_NS_ATTACHMENT, OPCODE_NS_MANAGEMENT, PAGE_BYTES,
};

use sluice_dataplane::{NvmeAdmin, NvmeNamespace};

use crate::claim::HeldDevice;

/// `struct nvme_passthru_cmd` from `<linux/nvme_ioctl.h>` (72 bytes).
#[repr(C)]
#[derive(Default)]
struct PassthruCmd {
    opcode: u8,
    flags: u8,
    rsvd1: u16,
    nsid: u32,
    cdw2: u32,
    cdw3: u32,
    metadata: u64,
    addr: u64,
    metadata_len: u32,
    data_len: u32,
    cdw10: u32,
    cdw11: u32,
    cdw12: u32,
    cdw13: u32,
    cdw14: u32,
    cdw15: u32,
    timeout_ms: u32,
    result: u32,
}

const _: () = assert!(std::mem::size_of::<PassthruCmd>() == 72);

nix::ioctl_readwrite!(nvme_admin_cmd, b'N', 0x41, PassthruCmd);
nix::ioctl_none!(nvme_rescan, b'N', 0x46);

/// A controller's admin queue, through its character device.
pub struct Controller {
    path: PathBuf,
    file: File,
}

impl Controller {
    pub fn open(path: &Path) -> io::Result<Self> {
        let file = std::fs::OpenOptions::new().read(true).write(true).open(path)?;
        Ok(Self { path: path.to_path_buf(), file })
    }

    /// Runs an admin command with a one-page data buffer; its result
    /// (completion dword 0).
    fn admin(&self, cmd: &mut PassthruCmd, page: &mut [u8; PAGE_BYTES]) -> io::Result<u32> {
        cmd.addr = page.as_mut_ptr() as u64;
        cmd.data_len = PAGE_BYTES as u32;
        // SAFETY: `cmd` is a valid nvme_passthru_cmd whose data buffer
        // (`page`, PAGE_BYTES long) outlives the call; the descriptor is an
        // open NVMe controller character device.
        let status = unsafe { nvme_admin_cmd(self.file.as_raw_fd(), cmd) }.map_err(io::Error::from)?;
        if status != 0 {
            return Err(io::Error::other(format!(
                "{}: admin opcode {:#04x} failed with NVMe status {status:#06x}",
                self.path.display(),
                cmd.opcode
            )));
        }
        Ok(cmd.result)
    }

    fn identify(&self, cns: u32, nsid: u32) -> io::Result<Box<[u8; PAGE_BYTES]>> {
        let mut page = Box::new([0u8; PAGE_BYTES]);
        let mut cmd = PassthruCmd { opcode: OPCODE_IDENTIFY, nsid, cdw10: cns, ..PassthruCmd::default() };
        self.admin(&mut cmd, &mut page)?;
        Ok(page)
    }

    fn controller_info(&self) -> io::Result<ControllerInfo> {
        ControllerInfo::parse(&self.identify(CNS_CONTROLLER, 0)?[..]).map_err(io::Error::other)
    }

    fn namespace_info(&self, nsid: u32) -> io::Result<NamespaceInfo> {
        NamespaceInfo::parse(&self.identify(CNS_ALLOCATED_NAMESPACE, nsid)?[..]).map_err(io::Error::other)
    }

    /// This controller's id (CNTLID), which attachment names.
    pub fn controller_id(&self) -> io::Result<u16> {
        Ok(self.controller_info()?.controller_id)
    }

    /// Whether the controller supports Namespace Management (OACS bit 3).
    /// Some advertise it and still refuse create: callers fall back.
    pub fn manages_namespaces(&self) -> io::Result<bool> {
        Ok(self.controller_info()?.manages_namespaces)
    }

    /// Creates a namespace of at least `bytes` in LBA format 0, private to
    /// the subsystem's controllers (not shared): its NSID. It starts
    /// detached.
    pub fn create_namespace(&self, bytes: u64) -> io::Result<u32> {
        // Format 0's block size from the common namespace capabilities;
        // 512 B when the controller does not report them.
        let common = self.identify(CNS_NAMESPACE, NSID_ALL).ok();
        let block_bytes = spec::format0_block_bytes(common.as_deref().map(|p| &p[..]));
        let mut page = spec::create_namespace_page(bytes, block_bytes);
        let mut cmd =
            PassthruCmd { opcode: OPCODE_NS_MANAGEMENT, cdw10: NS_MANAGEMENT_CREATE, ..PassthruCmd::default() };
        let nsid = self.admin(&mut cmd, &mut page)?;
        if nsid == 0 || nsid == NSID_ALL {
            return Err(io::Error::other(format!("{}: namespace create returned NSID {nsid:#x}", self.path.display())));
        }
        Ok(nsid)
    }

    /// Deletes a (detached) namespace; its capacity returns to the
    /// controller's unallocated pool.
    pub fn delete_namespace(&self, nsid: u32) -> io::Result<()> {
        let mut page = Box::new([0u8; PAGE_BYTES]);
        let mut cmd =
            PassthruCmd { opcode: OPCODE_NS_MANAGEMENT, nsid, cdw10: NS_MANAGEMENT_DELETE, ..PassthruCmd::default() };
        self.admin(&mut cmd, &mut page).map(drop)
    }

    fn nsid_list(&self, cns: u32) -> io::Result<Vec<u32>> {
        let page = self.identify(cns, 0)?;
        spec::nsid_list(&page[..]).map_err(|e| io::Error::other(format!("{}: {e}", self.path.display())))
    }

    /// Every namespace of the subsystem this controller can attach: its
    /// id, whether it is attached here, and its size.
    pub fn namespaces(&self) -> io::Result<Vec<NvmeNamespace>> {
        let active = self.nsid_list(CNS_ACTIVE_NSIDS)?;
        let mut out = Vec::new();
        for nsid in self.nsid_list(CNS_ALLOCATED_NSIDS)? {
            let info = self.namespace_info(nsid)?;
            out.push(NvmeNamespace {
                nsid,
                attached: active.contains(&nsid),
                capacity_bytes: info.capacity_bytes(),
                shared: info.shared,
            });
        }
        Ok(out)
    }

    fn attachment(&self, nsid: u32, detach: bool) -> io::Result<()> {
        let cntlid = self.controller_id()?;
        let mut page = spec::controller_list_page(cntlid);
        let select = if detach { NS_DETACH } else { NS_ATTACH };
        let mut cmd = PassthruCmd { opcode: OPCODE_NS_ATTACHMENT, nsid, cdw10: select, ..PassthruCmd::default() };
        self.admin(&mut cmd, &mut page)?;
        // SAFETY: NVME_IOCTL_RESCAN takes no argument; the descriptor is an
        // open NVMe controller character device.
        unsafe { nvme_rescan(self.file.as_raw_fd()) }.map_err(io::Error::from)?;
        Ok(())
    }

    /// Attaches `nsid` to this controller and waits for its block device.
    pub fn attach(&self, nsid: u32) -> io::Result<PathBuf> {
        self.attachment(nsid, false)?;
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            if let Some(device) = block_device(&self.path, nsid) {
                return Ok(device);
            }
            if Instant::now() > deadline {
                return Err(io::Error::other(format!(
                    "{}: namespace {nsid} attached but no block device appeared",
                    self.path.display()
                )));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// What identifies namespace `nsid` whatever its number: its NGUID and
    /// EUI64 as hex (`NGUID-EUI64`). Where the controller reports either, a
    /// namespace deleted and another made under the same NSID differs here,
    /// so a record naming the NSID alone cannot make the node detach or
    /// delete the wrong one; where it reports neither (all zeros), only the
    /// NSID and the attach ledger tell them apart.
    pub fn namespace_identity(&self, nsid: u32) -> io::Result<String> {
        Ok(self.namespace_info(nsid)?.identity())
    }

    /// Detaches `nsid` from this controller; it returns to the pool.
    pub fn detach(&self, nsid: u32) -> io::Result<()> {
        self.attachment(nsid, true)
    }
}

/// The kernel's NVMe admin stack: the shared [`NvmeAdmin`] commands by
/// controller path (one of the node's `nvme_controllers`), and what only
/// the kernel has: a namespace attached at run time is a new block device,
/// which the node must find and open.
pub trait KernelAdmin: NvmeAdmin {
    /// Opens the block device of attached namespace `nsid` exclusively,
    /// as a namespace device is opened at start.
    fn open_namespace(&self, controller: &str, nsid: u32) -> io::Result<HeldDevice>;

    /// The block device of attached namespace `nsid`, from sysfs (which
    /// anyone may read; [`NvmeAdmin::attach`] returns once it exists).
    fn block_device(&self, controller: &str, nsid: u32) -> io::Result<PathBuf> {
        block_device(Path::new(controller), nsid).ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::NotFound,
                format!("namespace {nsid} of {controller} has no block device (not attached)"),
            )
        })
    }
}

/// [`KernelAdmin`] in this process, on the controllers it was given: it
/// must have `CAP_SYS_ADMIN`.
pub struct Passthrough {
    controllers: Vec<PathBuf>,
}

impl Passthrough {
    pub fn new(controllers: Vec<PathBuf>) -> Self {
        Self { controllers }
    }

    /// One of this stack's controllers; any other is refused.
    fn known(&self, controller: &str) -> io::Result<&Path> {
        self.controllers.iter().find(|c| c.as_os_str() == controller).map(PathBuf::as_path).ok_or_else(|| {
            io::Error::new(io::ErrorKind::NotFound, format!("{controller} is not one of this node's nvme_controllers"))
        })
    }

    fn open(&self, controller: &str) -> io::Result<Controller> {
        Controller::open(self.known(controller)?)
    }
}

impl NvmeAdmin for Passthrough {
    fn controllers(&self) -> Vec<String> {
        self.controllers.iter().map(|c| c.display().to_string()).collect()
    }

    fn manages_namespaces(&self, controller: &str) -> io::Result<bool> {
        self.open(controller)?.manages_namespaces()
    }

    fn create(&self, controller: &str, bytes: u64) -> io::Result<u32> {
        self.open(controller)?.create_namespace(bytes)
    }

    fn delete(&self, controller: &str, nsid: u32) -> io::Result<()> {
        self.open(controller)?.delete_namespace(nsid)
    }

    fn namespaces(&self, controller: &str) -> io::Result<Vec<NvmeNamespace>> {
        self.open(controller)?.namespaces()
    }

    fn namespace_identity(&self, controller: &str, nsid: u32) -> io::Result<String> {
        self.open(controller)?.namespace_identity(nsid)
    }

    fn attach(&self, controller: &str, nsid: u32) -> io::Result<()> {
        self.open(controller)?.attach(nsid).map(drop)
    }

    fn detach(&self, controller: &str, nsid: u32) -> io::Result<()> {
        self.open(controller)?.detach(nsid)
    }
}

impl KernelAdmin for Passthrough {
    fn open_namespace(&self, controller: &str, nsid: u32) -> io::Result<HeldDevice> {
        self.known(controller)?;
        let device = self.block_device(controller, nsid)?;
        HeldDevice::open(&device).map_err(io::Error::other)
    }
}

/// The block device (`/dev/nvmeXnY`) of namespace `nsid` of `controller`,
/// once the kernel made it, from sysfs (which anyone may read). With native
/// multipath the disk hangs off the subsystem, so match by the controller's
/// name below it.
pub fn block_device(controller: &Path, nsid: u32) -> Option<PathBuf> {
    let name = controller.file_name()?.to_str()?.to_string();
    for entry in std::fs::read_dir("/sys/block").ok()?.flatten() {
        let disk = entry.file_name().to_str()?.to_string();
        // Skip per-path devices (nvmeXcYnZ).
        if !disk.starts_with("nvme") || disk.trim_start_matches("nvme").contains('c') {
            continue;
        }
        let sys = entry.path();
        let id: Option<u32> = std::fs::read_to_string(sys.join("nsid")).ok().and_then(|s| s.trim().parse().ok());
        let parent = std::fs::canonicalize(sys.join("device")).ok()?;
        let ours = parent.join(&name).exists() || parent.file_name().and_then(|n| n.to_str()) == Some(name.as_str());
        if ours && id == Some(nsid) {
            return Some(PathBuf::from("/dev").join(disk));
        }
    }
    None
}

pub use spec::identity_is_blank;

/// `CONTROLLER:NSID`, how a dataset's record remembers a namespace the
/// allocator attached (so delete detaches it again).
pub fn attachment_label(controller: &Path, nsid: u32) -> String {
    format!("{}:{nsid}", controller.display())
}

pub fn parse_attachment_label(label: &str) -> Option<(PathBuf, u32)> {
    let (path, nsid) = label.rsplit_once(':')?;
    Some((PathBuf::from(path), nsid.parse().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attachment_labels_round_trip() {
        let label = attachment_label(Path::new("/dev/nvme0"), 7);
        assert_eq!(label, "/dev/nvme0:7");
        assert_eq!(parse_attachment_label(&label), Some((PathBuf::from("/dev/nvme0"), 7)));
        assert_eq!(parse_attachment_label("/dev/nvme0"), None);
        assert_eq!(parse_attachment_label("/dev/nvme0:x"), None);
    }

    #[test]
    fn a_missing_controller_is_an_error_not_a_panic() {
        assert!(Controller::open(Path::new("/dev/sluice-no-such-nvme")).is_err());
    }
}
