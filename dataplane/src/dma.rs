//! DMA-able buffer arena and its per-core slot pool.
//!
//! Each data-plane core owns one arena, carved into fixed-size slots. A batch
//! takes whole slots for the life of its response, so buffers can be handed to
//! a transport for a zero-copy send and come back, when the response is
//! dropped, through a return channel the core drains; nothing is leaked when
//! a peer vanishes. The arena is 2 MiB hugepages when the system has them and
//! 4 KiB-aligned anonymous memory otherwise.

use std::num::NonZeroUsize;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use nix::sys::mman::{mmap_anonymous, munmap, MapFlags, ProtFlags};
// Tokio's channel reuses its blocks of slots where std's frees one every
// 31 messages: a lease's return then allocates nothing.
use tokio::sync::mpsc;

/// Alignment every slot and every I/O inside a slot respects; O_DIRECT and
/// NVMe PRPs both accept it.
pub use sluice_proto::geometry::IO_ALIGN_BYTES;
const HUGEPAGE_BYTES: usize = 2 * 1024 * 1024;

/// Page-aligned memory that devices read into. Never behind a Rust reference
/// while an I/O may write it: callers reach it through raw pointers until the
/// I/O completes.
pub struct Arena {
    base: NonNull<u8>,
    len_bytes: usize,
    slot_size_bytes: usize,
    hugepages: bool,
}

// SAFETY: the arena is plain memory; which thread may touch which slot is
// decided by slot ownership (free list on one core, leases elsewhere), never
// by the arena itself.
unsafe impl Send for Arena {}
// SAFETY: as above; shared references only hand out raw pointers.
unsafe impl Sync for Arena {}

#[derive(Debug, thiserror::Error)]
pub enum ArenaError {
    #[error("DMA arena of {len_bytes} bytes could not be mapped: {source}")]
    Map {
        len_bytes: usize,
        #[source]
        source: nix::Error,
    },
    #[error("slot size {0} must be a non-zero multiple of {IO_ALIGN_BYTES}")]
    SlotSize(usize),
}

impl Arena {
    /// Maps `slot_count` slots of `slot_size_bytes`, hugepage-backed when the
    /// kernel has hugepages to give.
    pub fn new(slot_count: usize, slot_size_bytes: usize) -> Result<Self, ArenaError> {
        if slot_size_bytes == 0 || !slot_size_bytes.is_multiple_of(IO_ALIGN_BYTES) {
            return Err(ArenaError::SlotSize(slot_size_bytes));
        }
        let len_bytes = slot_count.max(1) * slot_size_bytes;
        let len = NonZeroUsize::new(len_bytes).ok_or(ArenaError::SlotSize(0))?;
        let prot = ProtFlags::PROT_READ | ProtFlags::PROT_WRITE;
        let base_flags = MapFlags::MAP_PRIVATE | MapFlags::MAP_POPULATE;
        if len_bytes.is_multiple_of(HUGEPAGE_BYTES) {
            // SAFETY: an anonymous private mapping aliases no existing memory;
            // the kernel picks the address.
            let huge = unsafe { mmap_anonymous(None, len, prot, base_flags | MapFlags::MAP_HUGETLB) };
            if let Ok(ptr) = huge {
                return Ok(Self { base: ptr.cast(), len_bytes, slot_size_bytes, hugepages: true });
            }
        }
        // SAFETY: as above; page-aligned by construction.
        let ptr = unsafe { mmap_anonymous(None, len, prot, base_flags) }
            .map_err(|source| ArenaError::Map { len_bytes, source })?;
        Ok(Self { base: ptr.cast(), len_bytes, slot_size_bytes, hugepages: false })
    }

    pub fn slot_count(&self) -> usize {
        self.len_bytes / self.slot_size_bytes
    }

    pub fn slot_size_bytes(&self) -> usize {
        self.slot_size_bytes
    }

    pub fn len_bytes(&self) -> usize {
        self.len_bytes
    }

    pub fn base_ptr(&self) -> *mut u8 {
        self.base.as_ptr()
    }

    pub fn is_hugepage_backed(&self) -> bool {
        self.hugepages
    }

    /// Raw pointer to `offset_bytes` inside slot `slot`.
    pub fn slot_ptr(&self, slot: u32, offset_bytes: usize) -> *mut u8 {
        let at = slot as usize * self.slot_size_bytes + offset_bytes;
        assert!(at < self.len_bytes, "slot {slot} offset {offset_bytes} outside the arena");
        // SAFETY: `at` is inside the mapping (asserted above).
        unsafe { self.base.as_ptr().add(at) }
    }

    /// Bytes of a slot the caller owns and no I/O is writing.
    ///
    /// # Safety
    /// The caller must own `slot` (through a lease) and no device may be
    /// writing the range while the returned slice lives.
    pub unsafe fn slot_bytes(&self, slot: u32, offset_bytes: usize, len_bytes: usize) -> &[u8] {
        assert!(offset_bytes + len_bytes <= self.slot_size_bytes, "range outside its slot");
        let ptr = self.slot_ptr(slot, offset_bytes);
        // SAFETY: in bounds (asserted); no concurrent writer per the contract.
        unsafe { std::slice::from_raw_parts(ptr, len_bytes) }
    }
}

impl Drop for Arena {
    fn drop(&mut self) {
        // SAFETY: `base`/`len_bytes` are exactly the mapping made in `new`,
        // and every lease holds an `Arc<Arena>`, so nobody uses it any more.
        if let Err(err) = unsafe { munmap(self.base.cast(), self.len_bytes) } {
            tracing::error!("munmap of DMA arena failed: {err}");
        }
    }
}

/// Free slots of one core's arena. Owned by that core; returns from other
/// threads arrive through its return channel (`returns_rx`).
pub struct SlotPool {
    arena: Arc<Arena>,
    free: Vec<u32>,
    returns_rx: mpsc::UnboundedReceiver<Vec<u32>>,
    returns_tx: mpsc::UnboundedSender<Vec<u32>>,
    /// Emptied slot lists of returned leases, for the next leases: one
    /// list a lease at most, so a pool allocates none once warm.
    spare_lists: Vec<Vec<u32>>,
    wake: Arc<dyn Fn() + Send + Sync>,
    leased: Arc<AtomicUsize>,
}

impl SlotPool {
    pub fn new(arena: Arc<Arena>, wake: Arc<dyn Fn() + Send + Sync>) -> Self {
        let slot_count = u32::try_from(arena.slot_count()).expect("slot count fits u32");
        let (returns_tx, returns_rx) = mpsc::unbounded_channel();
        let leased = Arc::new(AtomicUsize::new(0));
        Self {
            arena,
            free: (0..slot_count).rev().collect(),
            returns_rx,
            returns_tx,
            spare_lists: Vec::new(),
            wake,
            leased,
        }
    }

    /// Slots held by leases right now, readable from any thread: what
    /// batches in flight and unsent responses hold.
    pub fn leased_counter(&self) -> Arc<AtomicUsize> {
        Arc::clone(&self.leased)
    }

    pub fn arena(&self) -> &Arc<Arena> {
        &self.arena
    }

    pub fn free_count(&self) -> usize {
        self.free.len()
    }

    pub fn capacity(&self) -> usize {
        self.arena.slot_count()
    }

    /// Takes back every slot released since the last call.
    pub fn reclaim(&mut self) {
        while let Ok(mut slots) = self.returns_rx.try_recv() {
            self.free.extend_from_slice(&slots);
            slots.clear();
            // Every lease holds a slot, so there are never more lists.
            if self.spare_lists.len() < self.capacity() {
                self.spare_lists.push(slots);
            }
        }
        assert!(self.free.len() <= self.capacity(), "a slot was returned twice");
    }

    /// Takes `count` slots, or none when fewer are free.
    pub fn take(&mut self, count: usize) -> Option<SlotLease> {
        if count > self.free.len() {
            return None;
        }
        let mut slots = self.spare_lists.pop().unwrap_or_default();
        slots.extend(self.free.drain(self.free.len() - count..));
        self.leased.fetch_add(count, Ordering::Relaxed);
        Some(SlotLease {
            leased: Arc::clone(&self.leased),
            arena: Arc::clone(&self.arena),
            slots,
            returns: self.returns_tx.clone(),
            wake: Arc::clone(&self.wake),
        })
    }
}

/// Slots owned by one batch. Dropping the lease gives them back to the core
/// that lent them, from whatever thread drops it.
pub struct SlotLease {
    leased: Arc<AtomicUsize>,
    arena: Arc<Arena>,
    slots: Vec<u32>,
    returns: mpsc::UnboundedSender<Vec<u32>>,
    wake: Arc<dyn Fn() + Send + Sync>,
}

impl SlotLease {
    pub fn arena(&self) -> &Arena {
        &self.arena
    }

    /// The arena slot behind the lease's `index`-th slot.
    pub fn slot(&self, index: usize) -> u32 {
        self.slots[index]
    }

    pub fn len(&self) -> usize {
        self.slots.len()
    }

    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }
}

impl Drop for SlotLease {
    fn drop(&mut self) {
        if self.slots.is_empty() {
            return;
        }
        self.leased.fetch_sub(self.slots.len(), Ordering::Relaxed);
        // A closed channel means the core is gone; the arena then lives on
        // through this lease's `Arc` and is unmapped with it.
        if self.returns.send(std::mem::take(&mut self.slots)).is_ok() {
            (self.wake)();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Slots handed out come back when leases drop, from any thread.
    #[test]
    fn leases_return_their_slots() {
        let arena = Arc::new(Arena::new(8, 64 * 1024).expect("arena"));
        let mut pool = SlotPool::new(arena, Arc::new(|| {}));
        let leased = pool.leased_counter();
        let lease = pool.take(5).expect("5 of 8 free");
        assert_eq!(pool.free_count(), 3);
        assert_eq!(leased.load(Ordering::Relaxed), 5);
        assert!(pool.take(4).is_none(), "only 3 left");
        std::thread::spawn(move || drop(lease)).join().expect("thread");
        assert_eq!(leased.load(Ordering::Relaxed), 0);
        pool.reclaim();
        assert_eq!(pool.free_count(), 8);
    }

    /// Slots are aligned for O_DIRECT and distinct.
    #[test]
    fn slots_are_aligned_and_disjoint() {
        let arena = Arena::new(4, 8192).expect("arena");
        for slot in 0..4 {
            assert_eq!(arena.slot_ptr(slot, 0) as usize % IO_ALIGN_BYTES, 0);
        }
        assert_eq!(arena.slot_ptr(1, 0) as usize - arena.slot_ptr(0, 0) as usize, 8192);
        assert!(Arena::new(4, 1000).is_err());
    }
}
