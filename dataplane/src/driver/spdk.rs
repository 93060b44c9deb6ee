//! The SPDK backend: SPDK's user-space NVMe driver owns the controllers
//! (bound to vfio-pci), each core gets one I/O queue pair per controller and
//! polls it for completions, and reads land straight in the core's DMA
//! arena, which is registered with SPDK (and, on RDMA nodes, with the NIC:
//! one arena, both registrations).
//!
//! Everything here is the FFI boundary: raw SPDK handles live only in this
//! module, and every call into SPDK is an `unsafe` block saying why it holds.

use std::ffi::{c_void, CStr, CString};
use std::io;
use std::ptr::NonNull;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use spdk_sys as sys;

use super::{
    BlockDriver, Completion, DriverError, DriverKind, IoTarget, Namespace, NamespaceGeometry, NamespaceSpec, NvmeAdmin,
    NvmeNamespace, Queue, QueueFull, ReadIo,
};
use crate::dma::Arena;
use crate::nvme_spec::{self as spec, ControllerInfo, NamespaceInfo};

/// Bounce buffer of a namespace's control path (ingest, seal, copies).
const CONTROL_BUFFER_BYTES: usize = 1 << 20;
/// Longest a synchronous SPDK command may take before it is an error.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(30);
/// NVMe Dataset Management attribute: deallocate.
const DSM_ATTR_DEALLOCATE: u32 = 1 << 2;
/// Identify data (and every admin page) is one NVMe page.
const IDENTIFY_BYTES: usize = spec::PAGE_BYTES;

/// SPDK's env (DPDK) is process-wide and starts once.
static ENV: OnceLock<Result<(), String>> = OnceLock::new();

fn start_env(name: &str) -> Result<(), DriverError> {
    let started = ENV.get_or_init(|| {
        let name = CString::new(name).map_err(|e| e.to_string())?;
        let mut opts = sys::spdk_env_opts::default();
        // SAFETY: `opts` is a valid, writable spdk_env_opts.
        unsafe { sys::spdk_env_opts_init(&mut opts) };
        #[cfg(spdk_env_opts_size)]
        {
            opts.opts_size = std::mem::size_of::<sys::spdk_env_opts>();
        }
        // The name must outlive the env: leak it (once per process).
        opts.name = name.into_raw();
        // SAFETY: `opts` was initialised by spdk_env_opts_init and its
        // strings live for the process.
        let rc = unsafe { sys::spdk_env_init(&opts) };
        if rc < 0 {
            return Err(format!(
                "spdk_env_init failed ({}): are hugepages reserved (vm.nr_hugepages) and is this root?",
                io::Error::from_raw_os_error(-rc)
            ));
        }
        Ok(())
    });
    started.clone().map_err(DriverError::Spdk)
}

/// An NVMe status as sluice reports it: type, code and SPDK's words.
fn status_text(cpl: &sys::spdk_nvme_cpl) -> String {
    // SAFETY: reading the raw view of the status union is always valid.
    let raw = unsafe { cpl.__bindgen_anon_1.status_raw };
    let (sct, sc) = ((raw >> 9) & 0x7, (raw >> 1) & 0xff);
    // SAFETY: SPDK returns a static string for any completion.
    let words = unsafe { CStr::from_ptr(sys::spdk_nvme_cpl_get_status_string(&cpl.__bindgen_anon_1.status)) };
    format!("NVMe status type {sct:#x} code {sc:#04x} ({})", words.to_string_lossy())
}

fn cpl_ok(cpl: &sys::spdk_nvme_cpl) -> bool {
    // SAFETY: as in `status_text`.
    let raw = unsafe { cpl.__bindgen_anon_1.status_raw };
    (raw >> 1) & 0x7ff == 0
}

/// A controller SPDK attached.
struct Controller {
    pci: String,
    ctrlr: NonNull<sys::spdk_nvme_ctrlr>,
    /// Admin commands and the control path's queue pairs are made one at a
    /// time per controller.
    admin: Mutex<()>,
}

/// SPDK's NVMe driver on the controllers at the PCI addresses given.
pub struct SpdkDriver {
    controllers: Vec<Controller>,
}

// SAFETY: SPDK controller handles may be used from any thread for admin
// commands (SPDK serialises them with the controller's own lock, and this
// driver also holds `admin`); I/O queue pairs are never shared: each belongs
// to one core's `SpdkQueue` or one namespace's control path under a mutex.
unsafe impl Send for SpdkDriver {}
// SAFETY: as above.
unsafe impl Sync for SpdkDriver {}

unsafe extern "C" fn probe_any(
    _ctx: *mut c_void,
    _trid: *const sys::spdk_nvme_transport_id,
    _opts: *mut sys::spdk_nvme_ctrlr_opts,
) -> bool {
    true
}

unsafe extern "C" fn attached(
    ctx: *mut c_void,
    _trid: *const sys::spdk_nvme_transport_id,
    ctrlr: *mut sys::spdk_nvme_ctrlr,
    _opts: *const sys::spdk_nvme_ctrlr_opts,
) {
    // SAFETY: `ctx` is the `Vec` that `SpdkDriver::start` passed to
    // spdk_nvme_probe, alive and unaliased for the call.
    let found = unsafe { &mut *ctx.cast::<Vec<*mut sys::spdk_nvme_ctrlr>>() };
    found.push(ctrlr);
}

impl SpdkDriver {
    /// Starts SPDK's env and attaches the NVMe controllers at `pci`
    /// (`0000:00:05.0`), which must be bound to vfio-pci (or uio).
    pub fn start(pci: &[String]) -> Result<Self, DriverError> {
        if pci.is_empty() {
            return Err(DriverError::Spdk("no NVMe controller given (--nvme PCI_ADDRESS,...)".into()));
        }
        start_env("sluiced")?;
        let mut controllers = Vec::with_capacity(pci.len());
        for address in pci {
            let spec = CString::new(format!("trtype:PCIe traddr:{address}"))
                .map_err(|_| DriverError::Spdk(format!("bad PCI address {address:?}")))?;
            let mut trid = sys::spdk_nvme_transport_id::default();
            // SAFETY: `trid` is writable; `spec` is a NUL-terminated string.
            if unsafe { sys::spdk_nvme_transport_id_parse(&mut trid, spec.as_ptr()) } != 0 {
                return Err(DriverError::Spdk(format!("bad PCI address {address:?}")));
            }
            let mut found: Vec<*mut sys::spdk_nvme_ctrlr> = Vec::new();
            // SAFETY: the callbacks match SPDK's signatures; `found` outlives
            // the synchronous probe, which calls them on this thread.
            let rc = unsafe {
                sys::spdk_nvme_probe(
                    &trid,
                    (&mut found as *mut Vec<*mut sys::spdk_nvme_ctrlr>).cast(),
                    Some(probe_any),
                    Some(attached),
                    None,
                )
            };
            let ctrlr = match (rc, found.first().copied().and_then(NonNull::new)) {
                (0, Some(ctrlr)) => ctrlr,
                _ => {
                    return Err(DriverError::Spdk(format!(
                        "no NVMe controller attached at {address} (probe returned {rc}): is it bound to vfio-pci?"
                    )))
                }
            };
            tracing::info!("SPDK attached the NVMe controller at {address}");
            controllers.push(Controller { pci: address.clone(), ctrlr, admin: Mutex::new(()) });
        }
        Ok(Self { controllers })
    }

    fn controller(&self, pci: &str) -> io::Result<&Controller> {
        self.controllers
            .iter()
            .find(|c| c.pci == pci)
            .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, format!("no SPDK controller at {pci}")))
    }

    fn controller_index(&self, pci: &str) -> io::Result<usize> {
        self.controllers
            .iter()
            .position(|c| c.pci == pci)
            .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, format!("no SPDK controller at {pci}")))
    }

    /// Identify Controller bytes (SPDK keeps a copy).
    fn controller_data(&self, controller: &Controller) -> &[u8] {
        // SAFETY: SPDK returns a pointer to the controller's cached 4 KiB
        // Identify Controller data, valid while the controller is attached
        // (for the life of `self`).
        unsafe {
            let data = sys::spdk_nvme_ctrlr_get_data(controller.ctrlr.as_ptr());
            std::slice::from_raw_parts(data.cast::<u8>(), IDENTIFY_BYTES)
        }
    }

    /// Runs an Identify admin command synchronously.
    fn identify(&self, controller: &Controller, cns: u32, nsid: u32) -> io::Result<Vec<u8>> {
        let _admin = controller.admin.lock().map_err(|_| io::Error::other("admin lock poisoned"))?;
        let buffer = DmaBuffer::new(IDENTIFY_BYTES)?;
        let mut cmd = sys::spdk_nvme_cmd::default();
        cmd.set_opc(u16::from(spec::OPCODE_IDENTIFY));
        cmd.nsid = nsid;
        cmd.__bindgen_anon_1.cdw10 = cns;
        let done = Waiter::default();
        // SAFETY: `cmd` and `buffer` (DMA memory of IDENTIFY_BYTES) outlive
        // the command: we poll until its callback ran; `done` likewise.
        let rc = unsafe {
            sys::spdk_nvme_ctrlr_cmd_admin_raw(
                controller.ctrlr.as_ptr(),
                &mut cmd,
                buffer.ptr.as_ptr().cast(),
                IDENTIFY_BYTES as u32,
                Some(Waiter::complete),
                done.arg(),
            )
        };
        if rc != 0 {
            return Err(io::Error::other(format!("{}: identify submit failed ({rc})", controller.pci)));
        }
        done.wait(|| {
            // SAFETY: the controller is attached; admin completions are
            // processed under `admin`.
            unsafe { sys::spdk_nvme_ctrlr_process_admin_completions(controller.ctrlr.as_ptr()) };
        })
        .map_err(|e| io::Error::other(format!("{}: identify: {e}", controller.pci)))?;
        Ok(buffer.bytes().to_vec())
    }

    fn controller_info(&self, controller: &Controller) -> io::Result<ControllerInfo> {
        ControllerInfo::parse(self.controller_data(controller)).map_err(io::Error::other)
    }

    /// A Controller List of one, this controller, for Namespace Attachment.
    fn ctrlr_list(&self, controller: &Controller) -> io::Result<sys::spdk_nvme_ctrlr_list> {
        let mut list = sys::spdk_nvme_ctrlr_list { ctrlr_count: 1, ..Default::default() };
        list.ctrlr_list[0] = self.controller_info(controller)?.controller_id;
        Ok(list)
    }
}

impl Drop for SpdkDriver {
    fn drop(&mut self) {
        for controller in &self.controllers {
            // SAFETY: every queue pair of this controller was freed with the
            // queues and namespaces that held it (they hold the driver).
            let rc = unsafe { sys::spdk_nvme_detach(controller.ctrlr.as_ptr()) };
            if rc != 0 {
                tracing::warn!("SPDK detach of {} returned {rc}", controller.pci);
            } else {
                tracing::info!("SPDK detached the NVMe controller at {}", controller.pci);
            }
        }
    }
}

/// Waits on one SPDK command's callback by polling. The callback reaches
/// it through a shared pointer, so its state is in cells.
#[derive(Default)]
struct Waiter {
    done: std::cell::Cell<bool>,
    outcome: std::cell::RefCell<Option<Result<u32, String>>>,
}

impl Waiter {
    fn arg(&self) -> *mut c_void {
        (self as *const Waiter).cast_mut().cast()
    }

    unsafe extern "C" fn complete(arg: *mut c_void, cpl: *const sys::spdk_nvme_cpl) {
        // SAFETY: `arg` is the Waiter the submitter passed and keeps alive
        // until `done`, reached only through shared references; `cpl` is
        // valid for the callback.
        let (waiter, cpl) = unsafe { (&*arg.cast_const().cast::<Waiter>(), &*cpl) };
        let outcome = if cpl_ok(cpl) { Ok(cpl.cdw0) } else { Err(status_text(cpl)) };
        *waiter.outcome.borrow_mut() = Some(outcome);
        waiter.done.set(true);
    }

    /// Polls until the callback ran: its completion dword 0, or the status.
    fn wait(&self, mut poll: impl FnMut()) -> Result<u32, String> {
        let deadline = Instant::now() + COMMAND_TIMEOUT;
        loop {
            poll();
            if self.done.get() {
                return self.outcome.borrow().clone().unwrap_or_else(|| Err("no outcome".into()));
            }
            if Instant::now() > deadline {
                return Err(format!("no completion within {COMMAND_TIMEOUT:?}"));
            }
        }
    }
}

/// DMA memory from SPDK (hugepages, registered for the device).
struct DmaBuffer {
    ptr: NonNull<u8>,
    len: usize,
}

impl DmaBuffer {
    fn new(len: usize) -> io::Result<Self> {
        // SAFETY: plain allocation call; a null return is handled.
        let ptr = unsafe {
            sys::spdk_zmalloc(len, 4096, std::ptr::null_mut(), sys::SPDK_ENV_SOCKET_ID_ANY, sys::SPDK_MALLOC_DMA)
        };
        NonNull::new(ptr.cast::<u8>())
            .map(|ptr| Self { ptr, len })
            .ok_or_else(|| io::Error::new(io::ErrorKind::OutOfMemory, "spdk_zmalloc: no DMA memory (hugepages)"))
    }

    fn bytes(&self) -> &[u8] {
        // SAFETY: `len` bytes owned by this buffer; no command is using it
        // when this is called (commands are synchronous).
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as above, and `&mut self` makes it unique.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for DmaBuffer {
    fn drop(&mut self) {
        // SAFETY: allocated by spdk_zmalloc, freed once.
        unsafe { sys::spdk_free(self.ptr.as_ptr().cast()) };
    }
}

// SAFETY: DMA memory is plain memory; users synchronise access.
unsafe impl Send for DmaBuffer {}

/// What the hot path needs of a namespace: its handle, its controller's
/// position (for the core's queue pair) and its sector size.
#[derive(Clone, Copy, Debug)]
pub struct SpdkTarget {
    ns: NonNull<sys::spdk_nvme_ns>,
    controller_index: usize,
    sector_bytes: u32,
}

// SAFETY: a namespace handle is a stable pointer into its controller,
// valid while the controller is attached; submitting I/O on it is safe from
// any thread that owns the queue pair used.
unsafe impl Send for SpdkTarget {}
// SAFETY: as above.
unsafe impl Sync for SpdkTarget {}

/// A namespace's control path: one queue pair of its own and a bounce
/// buffer, used one call at a time.
struct SpdkNamespace {
    _driver: Arc<SpdkDriver>,
    label: String,
    target: SpdkTarget,
    capacity_bytes: u64,
    control: Mutex<ControlPath>,
}

struct ControlPath {
    qpair: NonNull<sys::spdk_nvme_qpair>,
    buffer: DmaBuffer,
}

// SAFETY: the queue pair is used only under the namespace's mutex.
unsafe impl Send for ControlPath {}

impl Drop for ControlPath {
    fn drop(&mut self) {
        // SAFETY: no command is outstanding (every call waits for its own).
        unsafe { sys::spdk_nvme_ctrlr_free_io_qpair(self.qpair.as_ptr()) };
    }
}

impl SpdkNamespace {
    /// Runs one command on the control queue pair and waits for it.
    fn command(
        &self,
        path: &mut ControlPath,
        submit: impl FnOnce(*mut sys::spdk_nvme_qpair, *mut c_void) -> i32,
    ) -> io::Result<()> {
        let done = Waiter::default();
        let rc = submit(path.qpair.as_ptr(), done.arg());
        if rc != 0 {
            return Err(io::Error::other(format!(
                "{}: submit failed ({})",
                self.label,
                io::Error::from_raw_os_error(-rc)
            )));
        }
        let qpair = path.qpair.as_ptr();
        done.wait(|| {
            // SAFETY: the queue pair is ours under the mutex.
            unsafe { sys::spdk_nvme_qpair_process_completions(qpair, 0) };
        })
        .map(drop)
        .map_err(|e| io::Error::other(format!("{}: {e}", self.label)))
    }

    /// Reads or writes whole sectors `[lba, lba + count)` through the
    /// bounce buffer (its first `count * sector` bytes).
    fn sectors(&self, path: &mut ControlPath, write: bool, lba: u64, count: u32) -> io::Result<()> {
        let ns = self.target.ns.as_ptr();
        let buf = path.buffer.ptr.as_ptr().cast::<c_void>();
        self.command(path, |qpair, arg| {
            // SAFETY: the bounce buffer is DMA memory of at least `count`
            // sectors, alive and untouched until the command completes (we
            // wait for it); `arg` is the Waiter `command` keeps alive.
            unsafe {
                if write {
                    sys::spdk_nvme_ns_cmd_write(ns, qpair, buf, lba, count, Some(Waiter::complete), arg, 0)
                } else {
                    sys::spdk_nvme_ns_cmd_read(ns, qpair, buf, lba, count, Some(Waiter::complete), arg, 0)
                }
            }
        })
    }

    fn check_range(&self, offset_bytes: u64, len: usize) -> io::Result<()> {
        match offset_bytes.checked_add(len as u64) {
            Some(end) if end <= self.capacity_bytes => Ok(()),
            _ => Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{}: {len} bytes at {offset_bytes} pass its {} bytes", self.label, self.capacity_bytes),
            )),
        }
    }

    /// Reads, or with `write` read-modify-writes, any byte range a bounce
    /// buffer at a time, whole sectors underneath: `step` gets each piece
    /// of the bounce buffer and its offset in the range.
    fn transfer(
        &self,
        offset_bytes: u64,
        len: usize,
        write: bool,
        mut step: impl FnMut(&mut [u8], usize),
    ) -> io::Result<()> {
        self.check_range(offset_bytes, len)?;
        let sector = u64::from(self.target.sector_bytes);
        let mut path = self.control.lock().map_err(|_| io::Error::other("control path lock poisoned"))?;
        let mut done = 0usize;
        while done < len {
            let at = offset_bytes + done as u64;
            let first_lba = at / sector;
            let skip = (at - first_lba * sector) as usize;
            let piece = (len - done).min(CONTROL_BUFFER_BYTES - skip);
            let count = ((skip + piece) as u64).div_ceil(sector) as u32;
            let span = count as usize * sector as usize;
            // A write of whole sectors needs no read first.
            if !write || skip != 0 || piece != span {
                self.sectors(&mut path, false, first_lba, count)?;
            }
            step(&mut path.buffer.bytes_mut()[skip..skip + piece], done);
            if write {
                self.sectors(&mut path, true, first_lba, count)?;
            }
            done += piece;
        }
        Ok(())
    }
}

impl Namespace for SpdkNamespace {
    fn geometry(&self) -> NamespaceGeometry {
        NamespaceGeometry {
            block_size_bytes: self.target.sector_bytes,
            capacity_bytes: self.capacity_bytes,
            fixed_capacity: true,
        }
    }

    fn write_at(&self, offset_bytes: u64, data: &[u8]) -> io::Result<()> {
        self.transfer(offset_bytes, data.len(), true, |bounce, at| {
            bounce.copy_from_slice(&data[at..at + bounce.len()]);
        })
    }

    fn read_at(&self, offset_bytes: u64, buf: &mut [u8]) -> io::Result<()> {
        self.transfer(offset_bytes, buf.len(), false, |bounce, at| {
            buf[at..at + bounce.len()].copy_from_slice(bounce);
        })
    }

    fn sync(&self) -> io::Result<()> {
        let mut path = self.control.lock().map_err(|_| io::Error::other("control path lock poisoned"))?;
        let ns = self.target.ns.as_ptr();
        self.command(&mut path, |qpair, arg| {
            // SAFETY: `arg` is the Waiter `command` keeps alive.
            unsafe { sys::spdk_nvme_ns_cmd_flush(ns, qpair, Some(Waiter::complete), arg) }
        })
    }

    fn truncate(&self, _len_bytes: u64) -> io::Result<()> {
        // A namespace keeps its size; the catalog's length bounds reads.
        Ok(())
    }

    fn discard(&self, offset_bytes: u64, len_bytes: u64) -> io::Result<()> {
        let sector = u64::from(self.target.sector_bytes);
        let start = offset_bytes.div_ceil(sector);
        let end = offset_bytes.saturating_add(len_bytes).min(self.capacity_bytes) / sector;
        let mut path = self.control.lock().map_err(|_| io::Error::other("control path lock poisoned"))?;
        let ns = self.target.ns.as_ptr();
        let mut lba = start;
        while lba < end {
            let count = (end - lba).min(u64::from(u32::MAX)) as u32;
            let range = sys::spdk_nvme_dsm_range { length: count, starting_lba: lba, ..Default::default() };
            self.command(&mut path, |qpair, arg| {
                // SAFETY: SPDK copies the range into the command before it
                // returns; `arg` is the Waiter `command` keeps alive.
                unsafe {
                    sys::spdk_nvme_ns_cmd_dataset_management(
                        ns,
                        qpair,
                        DSM_ATTR_DEALLOCATE,
                        &range,
                        1,
                        Some(Waiter::complete),
                        arg,
                    )
                }
            })?;
            lba += u64::from(count);
        }
        Ok(())
    }

    fn target(&self) -> IoTarget {
        IoTarget::Spdk(self.target)
    }

    fn describe(&self) -> String {
        format!("{} (SPDK, {} B sectors)", self.label, self.target.sector_bytes)
    }
}

/// Namespaces and queues hold the driver, so the controllers stay attached
/// while any of them lives.
impl BlockDriver for Arc<SpdkDriver> {
    fn kind(&self) -> DriverKind {
        DriverKind::Spdk
    }

    fn open_namespace(&self, spec: &NamespaceSpec) -> Result<Arc<dyn Namespace>, DriverError> {
        let NamespaceSpec::Nvme { controller, nsid } = spec else {
            return Err(DriverError::WrongSpec(spec.clone(), DriverKind::Spdk));
        };
        let label = format!("{controller}/{nsid}");
        let open_error = |message: String| DriverError::Open { what: label.clone(), source: io::Error::other(message) };
        let index = self.controller_index(controller).map_err(|e| open_error(e.to_string()))?;
        let ctrlr = self.controllers[index].ctrlr.as_ptr();
        // SAFETY: the controller is attached; an inactive NSID gives null.
        let ns = NonNull::new(unsafe { sys::spdk_nvme_ctrlr_get_ns(ctrlr, *nsid) })
            .filter(|_| {
                // SAFETY: as above.
                unsafe { sys::spdk_nvme_ctrlr_is_active_ns(ctrlr, *nsid) }
            })
            .ok_or_else(|| open_error("no active namespace with that id".into()))?;
        // SAFETY: `ns` is an active namespace of an attached controller.
        let (sector_bytes, capacity_bytes) =
            unsafe { (sys::spdk_nvme_ns_get_sector_size(ns.as_ptr()), sys::spdk_nvme_ns_get_size(ns.as_ptr())) };
        // SAFETY: default options (null, 0); a null return is handled.
        let qpair = NonNull::new(unsafe { sys::spdk_nvme_ctrlr_alloc_io_qpair(ctrlr, std::ptr::null(), 0) })
            .ok_or_else(|| open_error("no I/O queue pair left on the controller".into()))?;
        let buffer =
            DmaBuffer::new(CONTROL_BUFFER_BYTES).map_err(|source| DriverError::Open { what: label.clone(), source })?;
        Ok(Arc::new(SpdkNamespace {
            _driver: Arc::clone(self),
            label,
            target: SpdkTarget { ns, controller_index: index, sector_bytes },
            capacity_bytes,
            control: Mutex::new(ControlPath { qpair, buffer }),
        }))
    }

    fn create_queue(&self, arena: &Arena, depth: u32) -> Result<Queue, DriverError> {
        SpdkQueue::new(Arc::clone(self), arena, depth).map(Queue::Spdk)
    }

    fn nvme_admin(&self) -> Option<&dyn NvmeAdmin> {
        Some(&**self)
    }
}

impl NvmeAdmin for SpdkDriver {
    fn controllers(&self) -> Vec<String> {
        self.controllers.iter().map(|c| c.pci.clone()).collect()
    }

    fn namespaces(&self, controller: &str) -> io::Result<Vec<NvmeNamespace>> {
        let c = self.controller(controller)?;
        let list = self.identify(c, spec::CNS_ALLOCATED_NSIDS, 0)?;
        let nsids = spec::nsid_list(&list).map_err(|e| io::Error::other(format!("{controller}: {e}")))?;
        let mut out = Vec::new();
        for nsid in nsids {
            // SAFETY: the controller is attached.
            let attached = unsafe { sys::spdk_nvme_ctrlr_is_active_ns(c.ctrlr.as_ptr(), nsid) };
            let info = NamespaceInfo::parse(&self.identify(c, spec::CNS_ALLOCATED_NAMESPACE, nsid)?)
                .map_err(io::Error::other)?;
            out.push(NvmeNamespace { nsid, attached, capacity_bytes: info.capacity_bytes(), shared: info.shared });
        }
        Ok(out)
    }

    fn attach(&self, controller: &str, nsid: u32) -> io::Result<()> {
        let c = self.controller(controller)?;
        let mut list = self.ctrlr_list(c)?;
        let _admin = c.admin.lock().map_err(|_| io::Error::other("admin lock poisoned"))?;
        // SAFETY: synchronous admin call on an attached controller; `list`
        // outlives it.
        let rc = unsafe { sys::spdk_nvme_ctrlr_attach_ns(c.ctrlr.as_ptr(), nsid, &mut list) };
        nvme_result(rc, || format!("{controller}: attaching namespace {nsid}"))
    }

    fn detach(&self, controller: &str, nsid: u32) -> io::Result<()> {
        let c = self.controller(controller)?;
        let mut list = self.ctrlr_list(c)?;
        let _admin = c.admin.lock().map_err(|_| io::Error::other("admin lock poisoned"))?;
        // SAFETY: as in `attach`.
        let rc = unsafe { sys::spdk_nvme_ctrlr_detach_ns(c.ctrlr.as_ptr(), nsid, &mut list) };
        nvme_result(rc, || format!("{controller}: detaching namespace {nsid}"))
    }

    fn manages_namespaces(&self, controller: &str) -> io::Result<bool> {
        Ok(self.controller_info(self.controller(controller)?)?.manages_namespaces)
    }

    fn create(&self, controller: &str, bytes: u64) -> io::Result<u32> {
        let c = self.controller(controller)?;
        // Format 0's block size from the common namespace data; 512 B if
        // the controller does not report it.
        let common = self.identify(c, spec::CNS_NAMESPACE, spec::NSID_ALL).ok();
        let page = spec::create_namespace_page(bytes, spec::format0_block_bytes(common.as_deref()));
        let mut data = sys::spdk_nvme_ns_data::default();
        const _: () = assert!(std::mem::size_of::<sys::spdk_nvme_ns_data>() == IDENTIFY_BYTES);
        // SAFETY: spdk_nvme_ns_data is the 4 KiB Identify Namespace layout
        // (asserted above), plain bytes with no invalid values, and `page`
        // is as long.
        unsafe {
            std::ptr::copy_nonoverlapping(
                page.as_ptr(),
                (&mut data as *mut sys::spdk_nvme_ns_data).cast::<u8>(),
                IDENTIFY_BYTES,
            )
        };
        let _admin = c.admin.lock().map_err(|_| io::Error::other("admin lock poisoned"))?;
        // SAFETY: synchronous admin call; `data` outlives it.
        let nsid = unsafe { sys::spdk_nvme_ctrlr_create_ns(c.ctrlr.as_ptr(), &mut data) };
        if nsid == 0 {
            return Err(io::Error::other(format!("{controller}: namespace create refused by the controller")));
        }
        Ok(nsid)
    }

    fn delete(&self, controller: &str, nsid: u32) -> io::Result<()> {
        let c = self.controller(controller)?;
        let _admin = c.admin.lock().map_err(|_| io::Error::other("admin lock poisoned"))?;
        // SAFETY: synchronous admin call on an attached controller.
        let rc = unsafe { sys::spdk_nvme_ctrlr_delete_ns(c.ctrlr.as_ptr(), nsid) };
        nvme_result(rc, || format!("{controller}: deleting namespace {nsid}"))
    }
}

fn nvme_result(rc: i32, what: impl FnOnce() -> String) -> io::Result<()> {
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::other(format!("{}: {}", what(), io::Error::from_raw_os_error(rc.abs()))))
    }
}

/// One in-flight read's context, handed to SPDK as the callback argument.
struct IoContext {
    state: NonNull<QueueState>,
    index: u32,
    tag: u64,
    len: u32,
}

/// What completion callbacks write: they run inside
/// `spdk_nvme_qpair_process_completions`, on the owning core's thread.
struct QueueState {
    done: Vec<Completion>,
    free: Vec<u32>,
    in_flight: u32,
}

/// A core's queue pairs (one per controller), polled for completions.
///
/// The contexts and the state are owned through raw pointers (made from
/// boxes, freed on drop): SPDK's callbacks write them while the queue is
/// borrowed, so no Rust reference to them is held across a poll.
pub struct SpdkQueue {
    _driver: Arc<SpdkDriver>,
    qpairs: Vec<NonNull<sys::spdk_nvme_qpair>>,
    namespaces: Vec<Option<SpdkTarget>>,
    contexts: NonNull<IoContext>,
    depth: u32,
    state: NonNull<QueueState>,
    registered: Option<(NonNull<u8>, usize)>,
}

unsafe extern "C" fn read_done(arg: *mut c_void, cpl: *const sys::spdk_nvme_cpl) {
    // SAFETY: `arg` is a context of the queue that submitted it (which
    // outlives its commands); `cpl` is valid for the call; this runs inside
    // the queue's own poll, while no reference to its state is alive.
    let (ctx, cpl) = unsafe { (&*arg.cast_const().cast::<IoContext>(), &*cpl) };
    // SAFETY: as above.
    let state = unsafe { &mut *ctx.state.as_ptr() };
    let result = if cpl_ok(cpl) {
        ctx.len as i32
    } else {
        tracing::warn!("SPDK read failed: {}", status_text(cpl));
        -libc::EIO
    };
    state.done.push(Completion { tag: ctx.tag, result });
    state.free.push(ctx.index);
    state.in_flight -= 1;
}

impl SpdkQueue {
    fn new(driver: Arc<SpdkDriver>, arena: &Arena, depth: u32) -> Result<Self, DriverError> {
        if !arena.is_hugepage_backed() {
            return Err(DriverError::Spdk(
                "the SPDK driver needs each core's DMA arena in hugepages: reserve them (vm.nr_hugepages)".into(),
            ));
        }
        let base = arena.base_ptr();
        // SAFETY: the arena is 2 MiB-aligned hugepage memory of `len`
        // bytes that outlives this queue (the core drops the queue first).
        let rc = unsafe { sys::spdk_mem_register(base.cast(), arena.len_bytes()) };
        if rc != 0 {
            return Err(DriverError::Spdk(format!("spdk_mem_register of the DMA arena failed ({rc})")));
        }
        let registered = NonNull::new(base).map(|p| (p, arena.len_bytes()));
        let mut qpairs = Vec::with_capacity(driver.controllers.len());
        for controller in &driver.controllers {
            // SAFETY: default options; a null return is handled.
            let qpair = unsafe { sys::spdk_nvme_ctrlr_alloc_io_qpair(controller.ctrlr.as_ptr(), std::ptr::null(), 0) };
            match NonNull::new(qpair) {
                Some(qpair) => qpairs.push(qpair),
                None => {
                    for qpair in qpairs {
                        // SAFETY: just allocated, nothing submitted.
                        unsafe { sys::spdk_nvme_ctrlr_free_io_qpair(qpair.as_ptr()) };
                    }
                    // SAFETY: registered above.
                    unsafe { sys::spdk_mem_unregister(base.cast(), arena.len_bytes()) };
                    return Err(DriverError::Spdk(format!("{}: no I/O queue pair left", controller.pci)));
                }
            }
        }
        let depth = depth.max(1);
        let state = NonNull::from(Box::leak(Box::new(QueueState {
            done: Vec::with_capacity(depth as usize),
            free: (0..depth).rev().collect(),
            in_flight: 0,
        })));
        let contexts: Box<[IoContext]> = (0..depth).map(|index| IoContext { state, index, tag: 0, len: 0 }).collect();
        let contexts = NonNull::from(Box::leak(contexts)).cast::<IoContext>();
        Ok(Self { _driver: driver, qpairs, namespaces: Vec::new(), contexts, depth, state, registered })
    }

    fn state(&mut self) -> &mut QueueState {
        // SAFETY: owned by this queue; callbacks touch it only inside
        // `poll`, and no reference made here outlives a call that polls.
        unsafe { self.state.as_mut() }
    }

    pub fn register_namespace(&mut self, index: u32, target: &IoTarget) {
        let IoTarget::Spdk(target) = target else {
            tracing::error!("an SPDK queue was given a namespace of another driver");
            return;
        };
        let index = index as usize;
        if self.namespaces.len() <= index {
            self.namespaces.resize(index + 1, None);
        }
        self.namespaces[index] = Some(*target);
    }

    pub fn unregister_namespace(&mut self, index: u32) {
        if let Some(slot) = self.namespaces.get_mut(index as usize) {
            *slot = None;
        }
    }

    /// # Safety
    /// As [`Queue::push_read`]: `io.buf` holds `io.len_bytes` writable bytes
    /// of this queue's arena, untouched until the completion is reaped.
    pub unsafe fn push_read(&mut self, io: ReadIo) -> Result<(), QueueFull> {
        let fail = |queue: &mut Self, errno: i32| queue.state().done.push(Completion { tag: io.tag, result: -errno });
        let Some(target) = self.namespaces.get(io.namespace_index as usize).copied().flatten() else {
            fail(self, libc::EBADF);
            return Ok(());
        };
        let sector = u64::from(target.sector_bytes);
        if !io.offset_bytes.is_multiple_of(sector)
            || !u64::from(io.len_bytes).is_multiple_of(sector)
            || io.len_bytes == 0
        {
            fail(self, libc::EINVAL);
            return Ok(());
        }
        let Some(index) = self.state().free.pop() else { return Err(QueueFull) };
        debug_assert!(index < self.depth);
        // SAFETY: `index` < depth, a context no command holds (it came off
        // the free list).
        let ctx = unsafe { self.contexts.as_ptr().add(index as usize) };
        // SAFETY: as above; nothing else references it now.
        unsafe {
            (*ctx).tag = io.tag;
            (*ctx).len = io.len_bytes;
        }
        let qpair = self.qpairs[target.controller_index].as_ptr();
        // SAFETY: the caller guarantees the buffer; `ctx` lives as long as
        // the queue and is not reused until its callback frees it.
        let rc = unsafe {
            sys::spdk_nvme_ns_cmd_read(
                target.ns.as_ptr(),
                qpair,
                io.buf.cast(),
                io.offset_bytes / sector,
                (u64::from(io.len_bytes) / sector) as u32,
                Some(read_done),
                ctx.cast(),
                0,
            )
        };
        match rc {
            0 => {
                self.state().in_flight += 1;
                Ok(())
            }
            rc if rc == -libc::ENOMEM => {
                self.state().free.push(index);
                Err(QueueFull)
            }
            rc => {
                self.state().free.push(index);
                fail(self, -rc);
                Ok(())
            }
        }
    }

    fn poll(&mut self) {
        for qpair in &self.qpairs {
            // SAFETY: this core's own queue pair; callbacks touch only this
            // queue's state, to which no reference is alive here.
            let rc = unsafe { sys::spdk_nvme_qpair_process_completions(qpair.as_ptr(), 0) };
            if rc < 0 {
                tracing::error!("SPDK queue pair failed: {}", io::Error::from_raw_os_error(-rc));
            }
        }
    }

    pub fn reap(&mut self, out: &mut Vec<Completion>, max: usize) -> usize {
        self.poll();
        let done = &mut self.state().done;
        let n = done.len().min(max);
        out.extend(done.drain(..n));
        n
    }

    /// Polls until a completion is ready (completions are polled, never
    /// interrupt-driven).
    pub fn wait(&mut self) -> io::Result<()> {
        loop {
            let state = self.state();
            if !state.done.is_empty() || state.in_flight == 0 {
                return Ok(());
            }
            self.poll();
            std::hint::spin_loop();
        }
    }

    pub fn in_flight(&self) -> u32 {
        // SAFETY: a read of state owned by this queue; no callback runs
        // outside `poll`, which needs `&mut self`.
        let state = unsafe { self.state.as_ref() };
        state.in_flight + state.done.len() as u32
    }

    pub fn describe(&self) -> String {
        format!("spdk ({} controllers, polled)", self.qpairs.len())
    }
}

impl Drop for SpdkQueue {
    fn drop(&mut self) {
        let deadline = Instant::now() + COMMAND_TIMEOUT;
        while self.state().in_flight > 0 && Instant::now() < deadline {
            self.poll();
        }
        for qpair in &self.qpairs {
            // SAFETY: nothing is outstanding (or the deadline passed and the
            // controller is being torn down anyway).
            unsafe { sys::spdk_nvme_ctrlr_free_io_qpair(qpair.as_ptr()) };
        }
        if let Some((base, len)) = self.registered {
            // SAFETY: registered in `new`; the arena is still mapped.
            unsafe { sys::spdk_mem_unregister(base.as_ptr().cast(), len) };
        }
        // SAFETY: made by Box::leak in `new` (a boxed slice of `depth`
        // contexts and a box of state); no callback can run any more.
        unsafe {
            drop(Box::from_raw(std::ptr::slice_from_raw_parts_mut(self.contexts.as_ptr(), self.depth as usize)));
            drop(Box::from_raw(self.state.as_ptr()));
        }
    }
}

// SAFETY: a queue moves to its core's thread once, before any I/O; its raw
// pointers are then used only there.
unsafe impl Send for SpdkQueue {}
