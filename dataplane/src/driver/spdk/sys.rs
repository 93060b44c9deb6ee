//! Every call the SPDK driver makes into SPDK, and the only module that
//! names `spdk_sys`. The driver's logic (env, controllers, admin, control
//! path, queues) reaches SPDK through these items alone, so under
//! `cfg(test)` `fake.rs` stands in with the same names and signatures and
//! that logic runs in unit tests on machines without SPDK.
//!
//! Handles are SPDK's own pointers, copied freely; what keeps them valid
//! (a controller attached, a queue pair not yet freed) is the caller's
//! contract, so the calls taking them are `unsafe fn`s that say it.

use std::ffi::{c_void, CStr, CString};
use std::io;
use std::ptr::NonNull;

use spdk_sys as ffi;

use super::{Direction, Sectors};
use crate::nvme_spec::{OPCODE_IDENTIFY, PAGE_BYTES};

/// An attached controller.
pub type Ctrlr = NonNull<ffi::spdk_nvme_ctrlr>;
/// An active namespace of an attached controller.
pub type Ns = NonNull<ffi::spdk_nvme_ns>;
/// An I/O queue pair.
pub type Qpair = NonNull<ffi::spdk_nvme_qpair>;
/// A completion queue entry, as a callback sees it.
pub type Cpl = ffi::spdk_nvme_cpl;
/// What SPDK calls when a command completes, from inside the poll that
/// reaps it, on the polling thread.
pub type Callback = unsafe extern "C" fn(arg: *mut c_void, cpl: *const Cpl);

/// Starts SPDK's env (DPDK: hugepages, the PCI bus) under `name`. Once per
/// process; the caller keeps it so.
pub fn env_init(name: &str) -> Result<(), String> {
    let name = CString::new(name).map_err(|e| e.to_string())?;
    let mut opts = ffi::spdk_env_opts::default();
    // SAFETY: `opts` is a valid, writable spdk_env_opts.
    unsafe { ffi::spdk_env_opts_init(&mut opts) };
    #[cfg(spdk_env_opts_size)]
    {
        opts.opts_size = std::mem::size_of::<ffi::spdk_env_opts>();
    }
    // The name must outlive the env: leak it (once per process).
    opts.name = name.into_raw();
    // SAFETY: `opts` was initialised by spdk_env_opts_init and its strings
    // live for the process.
    let rc = unsafe { ffi::spdk_env_init(&opts) };
    if rc < 0 {
        return Err(format!(
            "spdk_env_init failed ({}): are hugepages reserved (vm.nr_hugepages) and is this root?",
            io::Error::from_raw_os_error(-rc)
        ));
    }
    Ok(())
}

unsafe extern "C" fn probe_any(
    _ctx: *mut c_void,
    _trid: *const ffi::spdk_nvme_transport_id,
    _opts: *mut ffi::spdk_nvme_ctrlr_opts,
) -> bool {
    true
}

unsafe extern "C" fn attached(
    ctx: *mut c_void,
    _trid: *const ffi::spdk_nvme_transport_id,
    ctrlr: *mut ffi::spdk_nvme_ctrlr,
    _opts: *const ffi::spdk_nvme_ctrlr_opts,
) {
    // SAFETY: `ctx` is the `Vec` that `probe` passed to spdk_nvme_probe,
    // alive and unaliased for the call.
    let found = unsafe { &mut *ctx.cast::<Vec<*mut ffi::spdk_nvme_ctrlr>>() };
    found.push(ctrlr);
}

/// Attaches the PCIe controller at `address` (`0000:00:05.0`).
pub fn probe(address: &str) -> Result<Ctrlr, String> {
    let spec =
        CString::new(format!("trtype:PCIe traddr:{address}")).map_err(|_| format!("bad PCI address {address:?}"))?;
    let mut trid = ffi::spdk_nvme_transport_id::default();
    // SAFETY: `trid` is writable; `spec` is a NUL-terminated string.
    if unsafe { ffi::spdk_nvme_transport_id_parse(&mut trid, spec.as_ptr()) } != 0 {
        return Err(format!("bad PCI address {address:?}"));
    }
    let mut found: Vec<*mut ffi::spdk_nvme_ctrlr> = Vec::new();
    // SAFETY: the callbacks match SPDK's signatures; `found` outlives the
    // synchronous probe, which calls them on this thread.
    let rc = unsafe {
        ffi::spdk_nvme_probe(
            &trid,
            (&mut found as *mut Vec<*mut ffi::spdk_nvme_ctrlr>).cast(),
            Some(probe_any),
            Some(attached),
            None,
        )
    };
    match (rc, found.first().copied().and_then(NonNull::new)) {
        (0, Some(ctrlr)) => Ok(ctrlr),
        _ => Err(format!("no NVMe controller attached at {address} (probe returned {rc}): is it bound to vfio-pci?")),
    }
}

/// # Safety
/// `ctrlr` is attached, and none of its queue pairs is still allocated.
pub unsafe fn detach(ctrlr: Ctrlr) -> i32 {
    // SAFETY: forwarded contract.
    unsafe { ffi::spdk_nvme_detach(ctrlr.as_ptr()) }
}

/// SPDK's cached Identify Controller page.
///
/// # Safety
/// `ctrlr` is attached, and stays so while the slice is used.
pub unsafe fn controller_data<'a>(ctrlr: Ctrlr) -> &'a [u8] {
    // SAFETY: SPDK returns a pointer to the controller's cached 4 KiB
    // Identify Controller data, valid while it is attached (the contract).
    unsafe {
        let data = ffi::spdk_nvme_ctrlr_get_data(ctrlr.as_ptr());
        std::slice::from_raw_parts(data.cast::<u8>(), PAGE_BYTES)
    }
}

/// Submits Identify (`cns`, for namespace `nsid`) into `page`; `callback`
/// runs from a later [`process_admin_completions`].
///
/// # Safety
/// `ctrlr` is attached; `page` is DMA memory of [`PAGE_BYTES`] and `arg` is
/// what `callback` expects, both alive until the callback ran.
pub unsafe fn identify(ctrlr: Ctrlr, cns: u32, nsid: u32, page: *mut u8, callback: Callback, arg: *mut c_void) -> i32 {
    let mut cmd = ffi::spdk_nvme_cmd::default();
    cmd.set_opc(u16::from(OPCODE_IDENTIFY));
    cmd.nsid = nsid;
    cmd.__bindgen_anon_1.cdw10 = cns;
    // SAFETY: forwarded contract; SPDK copies `cmd` before returning.
    unsafe {
        ffi::spdk_nvme_ctrlr_cmd_admin_raw(
            ctrlr.as_ptr(),
            &mut cmd,
            page.cast(),
            PAGE_BYTES as u32,
            Some(callback),
            arg,
        )
    }
}

/// # Safety
/// `ctrlr` is attached; its admin completions are processed by one thread
/// at a time.
pub unsafe fn process_admin_completions(ctrlr: Ctrlr) -> i32 {
    // SAFETY: forwarded contract.
    unsafe { ffi::spdk_nvme_ctrlr_process_admin_completions(ctrlr.as_ptr()) }
}

fn controller_list(controller_id: u16) -> ffi::spdk_nvme_ctrlr_list {
    let mut list = ffi::spdk_nvme_ctrlr_list { ctrlr_count: 1, ..Default::default() };
    list.ctrlr_list[0] = controller_id;
    list
}

/// Namespace Attachment of `nsid` to the controller `controller_id` names
/// (this one), synchronously.
///
/// # Safety
/// `ctrlr` is attached; admin commands on it are issued one at a time.
pub unsafe fn attach_ns(ctrlr: Ctrlr, nsid: u32, controller_id: u16) -> i32 {
    let mut list = controller_list(controller_id);
    // SAFETY: forwarded contract; `list` outlives the synchronous call.
    unsafe { ffi::spdk_nvme_ctrlr_attach_ns(ctrlr.as_ptr(), nsid, &mut list) }
}

/// # Safety
/// As [`attach_ns`].
pub unsafe fn detach_ns(ctrlr: Ctrlr, nsid: u32, controller_id: u16) -> i32 {
    let mut list = controller_list(controller_id);
    // SAFETY: forwarded contract; `list` outlives the synchronous call.
    unsafe { ffi::spdk_nvme_ctrlr_detach_ns(ctrlr.as_ptr(), nsid, &mut list) }
}

/// Namespace Management create from an Identify Namespace layout page:
/// the new NSID, or 0 where the controller refused.
///
/// # Safety
/// As [`attach_ns`].
pub unsafe fn create_ns(ctrlr: Ctrlr, page: &[u8; PAGE_BYTES]) -> u32 {
    const _: () = assert!(std::mem::size_of::<ffi::spdk_nvme_ns_data>() == PAGE_BYTES);
    let mut data = ffi::spdk_nvme_ns_data::default();
    // SAFETY: spdk_nvme_ns_data is the 4 KiB Identify Namespace layout
    // (asserted above), plain bytes with no invalid values, and `page` is as
    // long.
    unsafe {
        std::ptr::copy_nonoverlapping(
            page.as_ptr(),
            (&mut data as *mut ffi::spdk_nvme_ns_data).cast::<u8>(),
            PAGE_BYTES,
        )
    };
    // SAFETY: forwarded contract; `data` outlives the synchronous call.
    unsafe { ffi::spdk_nvme_ctrlr_create_ns(ctrlr.as_ptr(), &mut data) }
}

/// # Safety
/// As [`attach_ns`].
pub unsafe fn delete_ns(ctrlr: Ctrlr, nsid: u32) -> i32 {
    // SAFETY: forwarded contract.
    unsafe { ffi::spdk_nvme_ctrlr_delete_ns(ctrlr.as_ptr(), nsid) }
}

/// # Safety
/// `ctrlr` is attached.
pub unsafe fn is_active_ns(ctrlr: Ctrlr, nsid: u32) -> bool {
    // SAFETY: forwarded contract.
    unsafe { ffi::spdk_nvme_ctrlr_is_active_ns(ctrlr.as_ptr(), nsid) }
}

/// The namespace `nsid` where it is active on the controller.
///
/// # Safety
/// `ctrlr` is attached.
pub unsafe fn active_ns(ctrlr: Ctrlr, nsid: u32) -> Option<Ns> {
    // SAFETY: forwarded contract; an inactive NSID gives null or is
    // filtered out.
    unsafe {
        if !ffi::spdk_nvme_ctrlr_is_active_ns(ctrlr.as_ptr(), nsid) {
            return None;
        }
        NonNull::new(ffi::spdk_nvme_ctrlr_get_ns(ctrlr.as_ptr(), nsid))
    }
}

/// # Safety
/// `ns` is an active namespace of an attached controller.
pub unsafe fn ns_sector_bytes(ns: Ns) -> u32 {
    // SAFETY: forwarded contract.
    unsafe { ffi::spdk_nvme_ns_get_sector_size(ns.as_ptr()) }
}

/// # Safety
/// As [`ns_sector_bytes`].
pub unsafe fn ns_size_bytes(ns: Ns) -> u64 {
    // SAFETY: forwarded contract.
    unsafe { ffi::spdk_nvme_ns_get_size(ns.as_ptr()) }
}

/// An I/O queue pair with SPDK's default options.
///
/// # Safety
/// `ctrlr` is attached.
pub unsafe fn alloc_io_qpair(ctrlr: Ctrlr) -> Option<Qpair> {
    // SAFETY: forwarded contract; default options are (null, 0).
    NonNull::new(unsafe { ffi::spdk_nvme_ctrlr_alloc_io_qpair(ctrlr.as_ptr(), std::ptr::null(), 0) })
}

/// # Safety
/// `qpair` was allocated and not freed, and no command on it is pending
/// (or its controller is being torn down).
pub unsafe fn free_io_qpair(qpair: Qpair) {
    // SAFETY: forwarded contract.
    unsafe { ffi::spdk_nvme_ctrlr_free_io_qpair(qpair.as_ptr()) };
}

/// Moves `sectors` between the namespace and `buf` (one read or write
/// command).
///
/// # Safety
/// `ns` and `qpair` are live and of one controller, the queue pair used by
/// one thread; `buf` is registered DMA memory of `sectors.count` sectors,
/// untouched until the callback ran; `arg` is what `callback` expects.
pub unsafe fn rw(
    direction: Direction,
    ns: Ns,
    qpair: Qpair,
    buf: *mut u8,
    sectors: Sectors,
    callback: Callback,
    arg: *mut c_void,
) -> i32 {
    let (ns, qpair, buf, Sectors { lba, count }) = (ns.as_ptr(), qpair.as_ptr(), buf.cast(), sectors);
    // SAFETY: forwarded contract.
    unsafe {
        match direction {
            Direction::Read => ffi::spdk_nvme_ns_cmd_read(ns, qpair, buf, lba, count, Some(callback), arg, 0),
            Direction::Write => ffi::spdk_nvme_ns_cmd_write(ns, qpair, buf, lba, count, Some(callback), arg, 0),
        }
    }
}

/// # Safety
/// As [`rw`], without a buffer.
pub unsafe fn flush(ns: Ns, qpair: Qpair, callback: Callback, arg: *mut c_void) -> i32 {
    // SAFETY: forwarded contract.
    unsafe { ffi::spdk_nvme_ns_cmd_flush(ns.as_ptr(), qpair.as_ptr(), Some(callback), arg) }
}

/// NVMe Dataset Management attribute: deallocate.
const DSM_ATTR_DEALLOCATE: u32 = 1 << 2;

/// Deallocates `sectors` (Dataset Management, one range).
///
/// # Safety
/// As [`flush`].
pub unsafe fn deallocate(ns: Ns, qpair: Qpair, sectors: Sectors, callback: Callback, arg: *mut c_void) -> i32 {
    let range = ffi::spdk_nvme_dsm_range { length: sectors.count, starting_lba: sectors.lba, ..Default::default() };
    // SAFETY: forwarded contract; SPDK copies the range into the command
    // before it returns.
    unsafe {
        ffi::spdk_nvme_ns_cmd_dataset_management(
            ns.as_ptr(),
            qpair.as_ptr(),
            DSM_ATTR_DEALLOCATE,
            &range,
            1,
            Some(callback),
            arg,
        )
    }
}

/// Reaps every completion the queue pair has, calling their callbacks.
///
/// # Safety
/// `qpair` is live and polled by one thread at a time.
pub unsafe fn process_completions(qpair: Qpair) -> i32 {
    // SAFETY: forwarded contract; 0 means no limit.
    unsafe { ffi::spdk_nvme_qpair_process_completions(qpair.as_ptr(), 0) }
}

fn status_raw(cpl: &Cpl) -> u16 {
    // SAFETY: reading the raw view of the status union is always valid.
    unsafe { cpl.__bindgen_anon_1.status_raw }
}

/// Whether the command succeeded (status code type and code both 0).
pub fn cpl_ok(cpl: &Cpl) -> bool {
    (status_raw(cpl) >> 1) & 0x7ff == 0
}

/// Completion dword 0 (an admin command's result).
pub fn cpl_result(cpl: &Cpl) -> u32 {
    cpl.cdw0
}

/// An NVMe status as sluice reports it: type, code and SPDK's words.
pub fn status_text(cpl: &Cpl) -> String {
    let raw = status_raw(cpl);
    let (sct, sc) = ((raw >> 9) & 0x7, (raw >> 1) & 0xff);
    // SAFETY: SPDK returns a static string for any completion.
    let words = unsafe { CStr::from_ptr(ffi::spdk_nvme_cpl_get_status_string(&cpl.__bindgen_anon_1.status)) };
    format!("NVMe status type {sct:#x} code {sc:#04x} ({})", words.to_string_lossy())
}

/// Zeroed DMA memory (hugepages, registered for the device), 4 KiB
/// aligned.
pub fn dma_alloc(len: usize) -> Option<NonNull<u8>> {
    // SAFETY: plain allocation call; a null return is handled.
    let ptr = unsafe {
        ffi::spdk_zmalloc(len, 4096, std::ptr::null_mut(), ffi::SPDK_ENV_SOCKET_ID_ANY, ffi::SPDK_MALLOC_DMA)
    };
    NonNull::new(ptr.cast::<u8>())
}

/// # Safety
/// `ptr` came from [`dma_alloc`] and is freed once, with no command using
/// it.
pub unsafe fn dma_free(ptr: NonNull<u8>) {
    // SAFETY: forwarded contract.
    unsafe { ffi::spdk_free(ptr.as_ptr().cast()) };
}

/// Registers memory SPDK did not allocate (a core's arena) for DMA.
///
/// # Safety
/// `base` is 2 MiB-aligned hugepage memory of `len` bytes, mapped until
/// [`mem_unregister`].
pub unsafe fn mem_register(base: *mut u8, len: usize) -> i32 {
    // SAFETY: forwarded contract.
    unsafe { ffi::spdk_mem_register(base.cast(), len) }
}

/// # Safety
/// `base` and `len` were registered by [`mem_register`]; the memory is
/// still mapped and no command uses it.
pub unsafe fn mem_unregister(base: *mut u8, len: usize) -> i32 {
    // SAFETY: forwarded contract.
    unsafe { ffi::spdk_mem_unregister(base.cast(), len) }
}
