//! Protection domains, memory regions, and registered message slots.

use std::sync::Arc;

use rdma_sys::{ibv_access_flags, ibv_mr, ibv_pd};

use super::{CmId, VerbsError};

/// What a peer or the device may do to registered memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    /// The local device only reads it (the sources of SEND and RDMA WRITE).
    LocalRead,
    /// The local device writes it (receive buffers).
    LocalWrite,
    /// The peer may RDMA-WRITE into it (a client's destination buffers).
    RemoteWrite,
}

impl Access {
    fn flags(self) -> i32 {
        let flags = match self {
            Self::LocalRead => ibv_access_flags(0),
            Self::LocalWrite => ibv_access_flags::IBV_ACCESS_LOCAL_WRITE,
            Self::RemoteWrite => ibv_access_flags::IBV_ACCESS_LOCAL_WRITE | ibv_access_flags::IBV_ACCESS_REMOTE_WRITE,
        };
        flags.0 as i32
    }
}

struct PdInner {
    raw: *mut ibv_pd,
}

// SAFETY: verbs objects are thread-safe; the pointer is only passed to verbs.
unsafe impl Send for PdInner {}
// SAFETY: as above.
unsafe impl Sync for PdInner {}

impl Drop for PdInner {
    fn drop(&mut self) {
        // SAFETY: every MR and QP of this PD holds an Arc of it, so none is
        // left; deallocated once.
        let ret = unsafe { rdma_sys::ibv_dealloc_pd(self.raw) };
        if ret != 0 {
            tracing::warn!("ibv_dealloc_pd: {}", std::io::Error::from_raw_os_error(ret));
        }
    }
}

/// A protection domain on the device of a cm id. Cheap to clone.
#[derive(Clone)]
pub struct ProtectionDomain(Arc<PdInner>);

impl ProtectionDomain {
    /// Allocates a PD on the device `id` is bound to.
    pub fn new(id: &CmId) -> Result<Self, VerbsError> {
        let context = id.context();
        if context.is_null() {
            return Err(VerbsError::code("ibv_alloc_pd", nix::libc::ENODEV));
        }
        // SAFETY: a live device context (librdmacm keeps it open).
        let raw = unsafe { rdma_sys::ibv_alloc_pd(context) };
        if raw.is_null() {
            return Err(VerbsError::last("ibv_alloc_pd"));
        }
        Ok(Self(Arc::new(PdInner { raw })))
    }

    pub(super) fn raw(&self) -> *mut ibv_pd {
        self.0.raw
    }

    /// Whether this PD belongs to the device `id` is on.
    pub fn serves(&self, id: &CmId) -> bool {
        // SAFETY: a live PD's context field.
        let context = unsafe { (*self.0.raw).context };
        !context.is_null() && context == id.context()
    }

    /// Registers `len` bytes at `addr`.
    ///
    /// # Safety
    /// The memory must stay mapped until the region is dropped and, while any
    /// work request using it is outstanding, must not be reached through
    /// Rust references that conflict with the device's access.
    pub unsafe fn register(&self, addr: *mut u8, len: usize, access: Access) -> Result<MemoryRegion, VerbsError> {
        // SAFETY: live PD; the memory contract is the caller's.
        let raw = unsafe { rdma_sys::ibv_reg_mr(self.0.raw, addr.cast(), len, access.flags()) };
        if raw.is_null() {
            return Err(VerbsError::last("ibv_reg_mr"));
        }
        Ok(MemoryRegion { raw, addr: addr as u64, len: len as u64, _pd: self.clone() })
    }
}

/// Registered memory. Dropping it deregisters the memory, not frees it.
pub struct MemoryRegion {
    raw: *mut ibv_mr,
    addr: u64,
    len: u64,
    _pd: ProtectionDomain,
}

// SAFETY: the MR handle is only passed to verbs, which are thread-safe.
unsafe impl Send for MemoryRegion {}
// SAFETY: as above; keys and bounds are plain reads.
unsafe impl Sync for MemoryRegion {}

impl MemoryRegion {
    pub fn lkey(&self) -> u32 {
        // SAFETY: a live MR's field.
        unsafe { (*self.raw).lkey }
    }

    pub fn rkey(&self) -> u32 {
        // SAFETY: a live MR's field.
        unsafe { (*self.raw).rkey }
    }

    pub fn addr(&self) -> u64 {
        self.addr
    }

    /// Whether the region lives in `pd` (its keys mean nothing elsewhere).
    pub fn is_in(&self, pd: &ProtectionDomain) -> bool {
        Arc::ptr_eq(&self._pd.0, &pd.0)
    }

    pub fn len_bytes(&self) -> u64 {
        self.len
    }

    /// Whether `[addr, addr + len)` lies inside the region.
    pub fn contains(&self, addr: u64, len: u64) -> bool {
        addr >= self.addr && addr.checked_add(len).is_some_and(|end| end <= self.addr + self.len)
    }
}

impl Drop for MemoryRegion {
    fn drop(&mut self) {
        // SAFETY: deregistered once; QPs that used it are gone or in error
        // (their owners drop QPs before the MRs they post from).
        let ret = unsafe { rdma_sys::ibv_dereg_mr(self.raw) };
        if ret != 0 {
            tracing::warn!("ibv_dereg_mr: {}", std::io::Error::from_raw_os_error(ret));
        }
    }
}

/// `count` message buffers of `size` bytes in one registered allocation,
/// for SENDs and RECVs. A slot belongs to the device while posted and to
/// the caller otherwise; the caller tracks which by work-request id.
pub struct MessageSlots {
    /// Dropped by hand in `drop`, before the memory is freed.
    region: std::mem::ManuallyDrop<MemoryRegion>,
    memory: *mut [u8],
    size: usize,
}

// SAFETY: the memory is owned; who may touch a slot is the caller's
// bookkeeping, the same on any thread.
unsafe impl Send for MessageSlots {}

impl MessageSlots {
    pub fn new(pd: &ProtectionDomain, count: usize, size: usize, access: Access) -> Result<Self, VerbsError> {
        assert!(count > 0 && size > 0, "message slots need a size");
        let memory = Box::into_raw(vec![0u8; count * size].into_boxed_slice());
        // SAFETY: the allocation lives until `drop`, after the region.
        let region = unsafe { pd.register(memory.cast(), count * size, access) };
        match region {
            Ok(region) => Ok(Self { region: std::mem::ManuallyDrop::new(region), memory, size }),
            Err(err) => {
                // SAFETY: from Box::into_raw above, never registered.
                drop(unsafe { Box::from_raw(memory) });
                Err(err)
            }
        }
    }

    pub fn count(&self) -> usize {
        self.memory.len() / self.size
    }

    pub fn size(&self) -> usize {
        self.size
    }

    /// Slot `index` as a scatter-gather entry of `len` bytes.
    pub fn sge(&self, index: usize, len: usize) -> super::Sge {
        assert!(index < self.count() && len <= self.size, "slot {index} of {len} bytes out of range");
        super::Sge { addr: self.region.addr() + (index * self.size) as u64, len: len as u32, lkey: self.region.lkey() }
    }

    /// The bytes of slot `index`.
    ///
    /// # Safety
    /// The slot must not be posted (no device access in flight).
    pub unsafe fn slot(&self, index: usize) -> &[u8] {
        assert!(index < self.count(), "slot {index} out of range");
        // SAFETY: in bounds; no device writes it per the contract.
        unsafe { std::slice::from_raw_parts(self.memory.cast::<u8>().add(index * self.size), self.size) }
    }

    /// The bytes of slot `index`, to fill before posting it.
    ///
    /// # Safety
    /// The slot must not be posted, and no other reference to it may live.
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn slot_mut(&self, index: usize) -> &mut [u8] {
        assert!(index < self.count(), "slot {index} out of range");
        // SAFETY: in bounds; exclusive per the contract.
        unsafe { std::slice::from_raw_parts_mut(self.memory.cast::<u8>().add(index * self.size), self.size) }
    }
}

impl Drop for MessageSlots {
    fn drop(&mut self) {
        // SAFETY: dropped once, here; the owner dropped the QP posting from
        // these slots before them.
        unsafe { std::mem::ManuallyDrop::drop(&mut self.region) };
        // SAFETY: from Box::into_raw in `new`, now deregistered; freed once.
        drop(unsafe { Box::from_raw(self.memory) });
    }
}
