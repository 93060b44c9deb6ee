//! SPDK as the driver's unit tests see it: the items of `sys.rs`, with the
//! same names and signatures, over controllers, namespaces and queue pairs
//! kept in memory on the test's thread. As in SPDK, a command's callback
//! runs only from the poll that reaps it, so the driver's waiting, context
//! recycling and teardown order are what the tests exercise. Identify pages
//! come from [`crate::nvme_spec`]'s builders, the inverse of the parsers the
//! driver uses.
//!
//! Tests set a controller up with [`install`], break things with
//! [`faults`], and read what happened with [`ledger`] and [`namespace_bytes`].

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::ffi::c_void;
use std::ptr::NonNull;

use super::{Direction, Sectors};
use crate::nvme_spec::{self as spec, ControllerInfo, NamespaceInfo, PAGE_BYTES};

/// A controller a test installed.
pub struct FakeCtrlr {
    info: ControllerInfo,
    namespaces: RefCell<BTreeMap<u32, Box<FakeNs>>>,
    admin_pending: RefCell<Vec<Pending>>,
    identify_controller: Box<[u8; PAGE_BYTES]>,
    qpairs: Cell<usize>,
    attached: Cell<bool>,
}

pub struct FakeNs {
    sector_bytes: u32,
    active: Cell<bool>,
    shared: bool,
    nguid: [u8; 16],
    data: RefCell<Vec<u8>>,
}

pub struct FakeQpair {
    ctrlr: NonNull<FakeCtrlr>,
    pending: RefCell<VecDeque<Pending>>,
}

struct Pending {
    callback: Callback,
    arg: *mut c_void,
    cpl: Cpl,
}

pub type Ctrlr = NonNull<FakeCtrlr>;
pub type Ns = NonNull<FakeNs>;
pub type Qpair = NonNull<FakeQpair>;
pub type Callback = unsafe extern "C" fn(arg: *mut c_void, cpl: *const Cpl);

/// A completion: dword 0 and the NVMe status field (bit 0 the phase, 8:1
/// the code, 11:9 the type).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct Cpl {
    cdw0: u32,
    status: u16,
}

impl Cpl {
    fn ok(cdw0: u32) -> Self {
        Self { cdw0, status: 0 }
    }

    fn error(sct: u16, sc: u16) -> Self {
        Self { cdw0: 0, status: (sct << 9) | (sc << 1) }
    }
}

/// Block size of every fake controller's LBA format 0 (what a created
/// namespace gets).
const FORMAT0_BLOCK_BYTES: u32 = 512;
/// NVMe generic status: Invalid Namespace or Format.
const SC_INVALID_NAMESPACE: u16 = 0x0b;
/// NVMe generic status: LBA Out of Range.
const SC_LBA_OUT_OF_RANGE: u16 = 0x80;

/// One namespace of an installed controller.
pub struct NamespaceSetup {
    pub nsid: u32,
    pub bytes: u64,
    pub sector_bytes: u32,
    pub active: bool,
    pub shared: bool,
}

/// What the next calls do wrong, set by a test.
#[derive(Default)]
pub struct Faults {
    /// The next I/O submission returns this instead of queueing.
    pub submit_rc: Option<i32>,
    /// The next I/O completion carries this status (type, code).
    pub completion_status: Option<(u16, u16)>,
    /// Queue pairs left to allocate, across controllers.
    pub qpairs_left: Option<usize>,
    /// `mem_register` returns this.
    pub mem_register_rc: i32,
}

/// What the fake saw: for checking that the driver gave back all it took.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Ledger {
    pub qpairs_live: usize,
    pub dma_live: usize,
    pub registered: Vec<(usize, usize)>,
    pub detached: Vec<String>,
    /// A controller detached while it still had queue pairs.
    pub detached_busy: Vec<String>,
}

#[derive(Default)]
struct World {
    controllers: HashMap<String, Box<FakeCtrlr>>,
    faults: Faults,
    ledger: Ledger,
    dma: HashMap<usize, usize>,
}

thread_local! {
    static WORLD: RefCell<World> = RefCell::new(World::default());
}

fn world<T>(f: impl FnOnce(&mut World) -> T) -> T {
    WORLD.with(|w| f(&mut w.borrow_mut()))
}

/// Installs a controller at `address`, to be found by [`probe`].
pub fn install(address: &str, controller_id: u16, manages_namespaces: bool, namespaces: &[NamespaceSetup]) {
    let info = ControllerInfo { controller_id, manages_namespaces };
    let map = namespaces
        .iter()
        .map(|ns| {
            let fake = FakeNs {
                sector_bytes: ns.sector_bytes,
                active: Cell::new(ns.active),
                shared: ns.shared,
                nguid: [ns.nsid as u8; 16],
                data: RefCell::new(vec![0u8; ns.bytes as usize]),
            };
            (ns.nsid, Box::new(fake))
        })
        .collect();
    let ctrlr = FakeCtrlr {
        info,
        namespaces: RefCell::new(map),
        admin_pending: RefCell::new(Vec::new()),
        identify_controller: info.page(),
        qpairs: Cell::new(0),
        attached: Cell::new(false),
    };
    world(|w| w.controllers.insert(address.to_string(), Box::new(ctrlr)));
}

pub fn faults(f: impl FnOnce(&mut Faults)) {
    world(|w| f(&mut w.faults));
}

pub fn ledger() -> Ledger {
    world(|w| w.ledger.clone())
}

/// The bytes of namespace `nsid` of the controller at `address`.
pub fn namespace_bytes(address: &str, nsid: u32) -> Vec<u8> {
    world(|w| w.controllers[address].namespaces.borrow()[&nsid].data.borrow().clone())
}

/// Whether namespace `nsid` is attached (active) on the controller.
pub fn namespace_active(address: &str, nsid: u32) -> Option<bool> {
    world(|w| w.controllers[address].namespaces.borrow().get(&nsid).map(|ns| ns.active.get()))
}

pub fn env_init(_name: &str) -> Result<(), String> {
    Ok(())
}

pub fn probe(address: &str) -> Result<Ctrlr, String> {
    world(|w| match w.controllers.get(address) {
        Some(ctrlr) if !ctrlr.attached.get() => {
            ctrlr.attached.set(true);
            Ok(NonNull::from(&**ctrlr))
        }
        _ => Err(format!("no NVMe controller attached at {address} (probe returned -1): is it bound to vfio-pci?")),
    })
}

/// # Safety
/// `ctrlr` came from [`probe`] on this thread.
pub unsafe fn detach(ctrlr: Ctrlr) -> i32 {
    // SAFETY: installed controllers live as long as the thread's world.
    let c = unsafe { ctrlr.as_ref() };
    c.attached.set(false);
    world(|w| {
        let address = w.controllers.iter().find(|(_, v)| std::ptr::eq(&***v, c)).map(|(k, _)| k.clone());
        let address = address.unwrap_or_default();
        if c.qpairs.get() > 0 {
            w.ledger.detached_busy.push(address.clone());
        }
        w.ledger.detached.push(address);
    });
    0
}

/// # Safety
/// As [`detach`].
pub unsafe fn controller_data<'a>(ctrlr: Ctrlr) -> &'a [u8] {
    // SAFETY: installed controllers live as long as the thread's world.
    unsafe { &ctrlr.as_ref().identify_controller[..] }
}

/// # Safety
/// As [`detach`]; `page` holds [`PAGE_BYTES`] writable bytes.
pub unsafe fn identify(ctrlr: Ctrlr, cns: u32, nsid: u32, page: *mut u8, callback: Callback, arg: *mut c_void) -> i32 {
    // SAFETY: as the contract says.
    let c = unsafe { ctrlr.as_ref() };
    let namespaces = c.namespaces.borrow();
    let answer = match cns {
        spec::CNS_ALLOCATED_NSIDS => Some(spec::nsid_list_page(&namespaces.keys().copied().collect::<Vec<_>>())),
        spec::CNS_ACTIVE_NSIDS => Some(spec::nsid_list_page(
            &namespaces.iter().filter(|(_, ns)| ns.active.get()).map(|(&id, _)| id).collect::<Vec<_>>(),
        )),
        spec::CNS_NAMESPACE if nsid == spec::NSID_ALL => Some(
            NamespaceInfo {
                size_blocks: 0,
                block_bytes: Some(u64::from(FORMAT0_BLOCK_BYTES)),
                shared: false,
                nguid: [0; 16],
                eui64: [0; 8],
            }
            .page(),
        ),
        spec::CNS_ALLOCATED_NAMESPACE => namespaces.get(&nsid).map(|ns| ns.info().page()),
        _ => None,
    };
    let cpl = match answer {
        Some(answer) => {
            // SAFETY: `page` holds PAGE_BYTES writable bytes (contract).
            unsafe { std::ptr::copy_nonoverlapping(answer.as_ptr(), page, PAGE_BYTES) };
            Cpl::ok(0)
        }
        None => Cpl::error(0, SC_INVALID_NAMESPACE),
    };
    c.admin_pending.borrow_mut().push(Pending { callback, arg, cpl });
    0
}

/// # Safety
/// As [`detach`]; the pending callbacks' arguments are alive.
pub unsafe fn process_admin_completions(ctrlr: Ctrlr) -> i32 {
    // SAFETY: as the contract says.
    let pending = std::mem::take(&mut *unsafe { ctrlr.as_ref() }.admin_pending.borrow_mut());
    // SAFETY: as the contract says.
    unsafe { complete(pending) }
}

/// Runs the callbacks of `pending`, as SPDK's process calls do: how many.
///
/// # Safety
/// Each callback's argument is alive.
unsafe fn complete(pending: impl IntoIterator<Item = Pending>) -> i32 {
    let mut reaped = 0;
    for p in pending {
        // SAFETY: the submitter keeps `arg` alive until its callback ran.
        unsafe { (p.callback)(p.arg, &p.cpl) };
        reaped += 1;
    }
    reaped
}

impl FakeNs {
    fn info(&self) -> NamespaceInfo {
        NamespaceInfo {
            size_blocks: self.data.borrow().len() as u64 / u64::from(self.sector_bytes),
            block_bytes: Some(u64::from(self.sector_bytes)),
            shared: self.shared,
            nguid: self.nguid,
            eui64: [0; 8],
        }
    }
}

/// # Safety
/// As [`detach`].
unsafe fn attachment(ctrlr: Ctrlr, nsid: u32, controller_id: u16, attach: bool) -> i32 {
    // SAFETY: as the contract says.
    let c = unsafe { ctrlr.as_ref() };
    if controller_id != c.info.controller_id {
        return -libc::EINVAL;
    }
    match c.namespaces.borrow().get(&nsid) {
        None => -libc::ENXIO,
        Some(ns) if ns.active.get() == attach => -libc::EBUSY,
        Some(ns) => {
            ns.active.set(attach);
            0
        }
    }
}

/// # Safety
/// As [`detach`].
pub unsafe fn attach_ns(ctrlr: Ctrlr, nsid: u32, controller_id: u16) -> i32 {
    // SAFETY: forwarded contract.
    unsafe { attachment(ctrlr, nsid, controller_id, true) }
}

/// # Safety
/// As [`detach`].
pub unsafe fn detach_ns(ctrlr: Ctrlr, nsid: u32, controller_id: u16) -> i32 {
    // SAFETY: forwarded contract.
    unsafe { attachment(ctrlr, nsid, controller_id, false) }
}

/// # Safety
/// As [`detach`].
pub unsafe fn create_ns(ctrlr: Ctrlr, page: &[u8; PAGE_BYTES]) -> u32 {
    // SAFETY: as the contract says.
    let c = unsafe { ctrlr.as_ref() };
    let Ok(asked) = NamespaceInfo::parse(page) else { return 0 };
    if !c.info.manages_namespaces {
        return 0;
    }
    let mut namespaces = c.namespaces.borrow_mut();
    let nsid = namespaces.keys().last().map_or(1, |last| last + 1);
    let bytes = asked.size_blocks * u64::from(FORMAT0_BLOCK_BYTES);
    let ns = FakeNs {
        sector_bytes: FORMAT0_BLOCK_BYTES,
        active: Cell::new(false),
        shared: asked.shared,
        nguid: [nsid as u8; 16],
        data: RefCell::new(vec![0u8; bytes as usize]),
    };
    namespaces.insert(nsid, Box::new(ns));
    nsid
}

/// # Safety
/// As [`detach`].
pub unsafe fn delete_ns(ctrlr: Ctrlr, nsid: u32) -> i32 {
    // SAFETY: as the contract says.
    let mut namespaces = unsafe { ctrlr.as_ref() }.namespaces.borrow_mut();
    match namespaces.get(&nsid) {
        None => -libc::ENXIO,
        Some(ns) if ns.active.get() => -libc::EBUSY,
        Some(_) => {
            namespaces.remove(&nsid);
            0
        }
    }
}

/// # Safety
/// As [`detach`].
pub unsafe fn is_active_ns(ctrlr: Ctrlr, nsid: u32) -> bool {
    // SAFETY: as the contract says.
    unsafe { ctrlr.as_ref() }.namespaces.borrow().get(&nsid).is_some_and(|ns| ns.active.get())
}

/// # Safety
/// As [`detach`].
pub unsafe fn active_ns(ctrlr: Ctrlr, nsid: u32) -> Option<Ns> {
    // SAFETY: as the contract says.
    let namespaces = unsafe { ctrlr.as_ref() }.namespaces.borrow();
    namespaces.get(&nsid).filter(|ns| ns.active.get()).map(|ns| NonNull::from(&**ns))
}

/// # Safety
/// `ns` came from [`active_ns`] and was not deleted since.
pub unsafe fn ns_sector_bytes(ns: Ns) -> u32 {
    // SAFETY: as the contract says.
    unsafe { ns.as_ref() }.sector_bytes
}

/// # Safety
/// As [`ns_sector_bytes`].
pub unsafe fn ns_size_bytes(ns: Ns) -> u64 {
    // SAFETY: as the contract says.
    unsafe { ns.as_ref() }.data.borrow().len() as u64
}

/// # Safety
/// As [`detach`].
pub unsafe fn alloc_io_qpair(ctrlr: Ctrlr) -> Option<Qpair> {
    let allowed = world(|w| match &mut w.faults.qpairs_left {
        Some(0) => false,
        Some(left) => {
            *left -= 1;
            true
        }
        None => true,
    });
    if !allowed {
        return None;
    }
    // SAFETY: as the contract says.
    let c = unsafe { ctrlr.as_ref() };
    c.qpairs.set(c.qpairs.get() + 1);
    world(|w| w.ledger.qpairs_live += 1);
    Some(NonNull::from(Box::leak(Box::new(FakeQpair { ctrlr, pending: RefCell::new(VecDeque::new()) }))))
}

/// # Safety
/// `qpair` came from [`alloc_io_qpair`] and is freed once.
pub unsafe fn free_io_qpair(qpair: Qpair) {
    // SAFETY: as the contract says: made by Box::leak, freed once.
    let qpair = unsafe { Box::from_raw(qpair.as_ptr()) };
    // SAFETY: the controller outlives its queue pairs in the thread's world.
    let c = unsafe { qpair.ctrlr.as_ref() };
    c.qpairs.set(c.qpairs.get() - 1);
    world(|w| w.ledger.qpairs_live -= 1);
}

/// Moves `sectors` between the namespace and `buf` (zeroes them where
/// `buf` is null), or says why not: what a command's completion carries.
///
/// # Safety
/// `buf` is null or holds `sectors.count` sectors.
unsafe fn move_sectors(ns: &FakeNs, direction: Direction, buf: *mut u8, sectors: Sectors) -> Cpl {
    let sector = u64::from(ns.sector_bytes);
    let mut data = ns.data.borrow_mut();
    let (start, len) = (sectors.lba * sector, u64::from(sectors.count) * sector);
    if start + len > data.len() as u64 {
        return Cpl::error(0, SC_LBA_OUT_OF_RANGE);
    }
    let range = &mut data[start as usize..(start + len) as usize];
    match (direction, buf.is_null()) {
        (_, true) => range.fill(0),
        // SAFETY: `buf` holds `len` bytes (contract); the namespace's own
        // vector never overlaps it.
        (Direction::Read, false) => unsafe { std::ptr::copy_nonoverlapping(range.as_ptr(), buf, range.len()) },
        // SAFETY: as above.
        (Direction::Write, false) => unsafe { std::ptr::copy_nonoverlapping(buf, range.as_mut_ptr(), range.len()) },
    }
    Cpl::ok(0)
}

/// Queues a command's completion, or fails its submission, as the faults
/// say.
///
/// # Safety
/// `qpair` is live.
unsafe fn submit(qpair: Qpair, callback: Callback, arg: *mut c_void, run: impl FnOnce() -> Cpl) -> i32 {
    let (rc, status) = world(|w| (w.faults.submit_rc.take(), w.faults.completion_status.take()));
    if let Some(rc) = rc {
        return rc;
    }
    let mut cpl = run();
    if let Some((sct, sc)) = status {
        cpl = Cpl::error(sct, sc);
    }
    // SAFETY: as the contract says.
    unsafe { qpair.as_ref() }.pending.borrow_mut().push_back(Pending { callback, arg, cpl });
    0
}

/// # Safety
/// As `sys::rw`.
pub unsafe fn rw(
    direction: Direction,
    ns: Ns,
    qpair: Qpair,
    buf: *mut u8,
    sectors: Sectors,
    callback: Callback,
    arg: *mut c_void,
) -> i32 {
    // SAFETY: as the contract says.
    unsafe { submit(qpair, callback, arg, || move_sectors(ns.as_ref(), direction, buf, sectors)) }
}

/// # Safety
/// As `sys::flush`.
pub unsafe fn flush(_ns: Ns, qpair: Qpair, callback: Callback, arg: *mut c_void) -> i32 {
    // SAFETY: as the contract says.
    unsafe { submit(qpair, callback, arg, || Cpl::ok(0)) }
}

/// Zeroes the sectors, as a deallocated range of a namespace that reads
/// zeros after deallocate (DLFEAT) would.
///
/// # Safety
/// As `sys::deallocate`.
pub unsafe fn deallocate(ns: Ns, qpair: Qpair, sectors: Sectors, callback: Callback, arg: *mut c_void) -> i32 {
    let zero = std::ptr::null_mut();
    // SAFETY: as the contract says; a null buffer zeroes.
    unsafe { submit(qpair, callback, arg, || move_sectors(ns.as_ref(), Direction::Write, zero, sectors)) }
}

/// # Safety
/// `qpair` is live; the pending callbacks' arguments are alive.
pub unsafe fn process_completions(qpair: Qpair) -> i32 {
    // SAFETY: as the contract says.
    let pending = std::mem::take(&mut *unsafe { qpair.as_ref() }.pending.borrow_mut());
    // SAFETY: as the contract says.
    unsafe { complete(pending) }
}

pub fn cpl_ok(cpl: &Cpl) -> bool {
    (cpl.status >> 1) & 0x7ff == 0
}

pub fn cpl_result(cpl: &Cpl) -> u32 {
    cpl.cdw0
}

pub fn status_text(cpl: &Cpl) -> String {
    let (sct, sc) = ((cpl.status >> 9) & 0x7, (cpl.status >> 1) & 0xff);
    format!("NVMe status type {sct:#x} code {sc:#04x} (fake)")
}

fn dma_layout(len: usize) -> std::alloc::Layout {
    std::alloc::Layout::from_size_align(len.max(1), 4096).expect("a DMA layout")
}

pub fn dma_alloc(len: usize) -> Option<NonNull<u8>> {
    // SAFETY: a layout of non-zero size.
    let ptr = NonNull::new(unsafe { std::alloc::alloc_zeroed(dma_layout(len)) })?;
    world(|w| {
        w.dma.insert(ptr.as_ptr() as usize, len);
        w.ledger.dma_live += 1;
    });
    Some(ptr)
}

/// # Safety
/// `ptr` came from [`dma_alloc`] and is freed once.
pub unsafe fn dma_free(ptr: NonNull<u8>) {
    let len = world(|w| {
        w.ledger.dma_live -= 1;
        w.dma.remove(&(ptr.as_ptr() as usize)).expect("freeing DMA memory this fake did not allocate")
    });
    // SAFETY: allocated above with this layout, freed once (contract).
    unsafe { std::alloc::dealloc(ptr.as_ptr(), dma_layout(len)) };
}

/// # Safety
/// None beyond the real one's; the fake only records the range.
pub unsafe fn mem_register(base: *mut u8, len: usize) -> i32 {
    world(|w| {
        let rc = w.faults.mem_register_rc;
        if rc == 0 {
            w.ledger.registered.push((base as usize, len));
        }
        rc
    })
}

/// # Safety
/// As [`mem_register`].
pub unsafe fn mem_unregister(base: *mut u8, len: usize) -> i32 {
    world(|w| {
        let before = w.ledger.registered.len();
        w.ledger.registered.retain(|&r| r != (base as usize, len));
        if w.ledger.registered.len() == before {
            -libc::EINVAL
        } else {
            0
        }
    })
}
