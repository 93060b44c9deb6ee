//! What a batch gives back: its statuses and bytes, which stay in the
//! core's DMA slots until the transport drops it. Its plan then goes to
//! the dropping thread's spare plans, where the next batch a core admits
//! on that thread takes it: connections live on their core, so a core
//! plans into the same few plans over and over and allocates none. The
//! vectors a transport hands its batch ranges in come back the same way
//! ([`spare_ranges`]).

use std::cell::RefCell;
use std::thread::LocalKey;

use super::*;

/// Most spares of each kind one thread keeps: a core's batches in flight
/// (64 by default) and as many again.
const SPARES_MAX: usize = 128;
/// A spare grown past this (a batch of thousands of ranges) is freed, not
/// kept, so spares hold at most `SPARES_MAX` × this per thread and kind.
const SPARE_BYTES_MAX: usize = 64 * 1024;

thread_local! {
    static SPARE_PLANS: RefCell<Vec<BatchPlan>> = const { RefCell::new(Vec::new()) };
    static SPARE_RANGES: RefCell<Vec<Vec<ByteRange>>> = const { RefCell::new(Vec::new()) };
}

fn take_spare<T: Default>(spares: &'static LocalKey<RefCell<Vec<T>>>) -> T {
    spares.try_with(|spares| spares.borrow_mut().pop()).ok().flatten().unwrap_or_default()
}

fn keep_spare<T>(spares: &'static LocalKey<RefCell<Vec<T>>>, spare: T, bytes: usize) {
    if bytes > SPARE_BYTES_MAX {
        return;
    }
    // A thread being torn down has no spares left to keep it in.
    let _ = spares.try_with(|spares| {
        let mut spares = spares.borrow_mut();
        if spares.len() < SPARES_MAX {
            spares.push(spare);
        }
    });
}

/// A plan that goes back to the dropping thread's spare plans when it is
/// dropped, whatever path drops it (a batch refused, one waiting for
/// slots, a result sent): nothing returns plans by hand.
pub(super) struct SparePlan(BatchPlan);

impl SparePlan {
    /// A spare plan of this thread's, or a new one, to plan a batch into.
    pub(super) fn take() -> Self {
        Self(take_spare(&SPARE_PLANS))
    }
}

impl std::ops::Deref for SparePlan {
    type Target = BatchPlan;

    fn deref(&self) -> &BatchPlan {
        &self.0
    }
}

impl std::ops::DerefMut for SparePlan {
    fn deref_mut(&mut self) -> &mut BatchPlan {
        &mut self.0
    }
}

impl Drop for SparePlan {
    fn drop(&mut self) {
        let plan = std::mem::take(&mut self.0);
        let bytes = plan.capacity_bytes();
        keep_spare(&SPARE_PLANS, plan, bytes);
    }
}

/// An empty vector to hand a batch's ranges in ([`ReadBatch::ranges`]):
/// one this thread's core kept from an earlier batch once it planned it,
/// or a new one.
pub fn spare_ranges() -> Vec<ByteRange> {
    let mut ranges = take_spare(&SPARE_RANGES);
    ranges.clear();
    ranges
}

/// Keeps a planned batch's `ranges` for a later batch on this thread.
pub(super) fn keep_spare_ranges(ranges: Vec<ByteRange>) {
    let bytes = ranges.capacity() * size_of::<ByteRange>();
    keep_spare(&SPARE_RANGES, ranges, bytes);
}

/// The outcome of a batch. Its bytes live in the core's DMA slots until it
/// is dropped.
pub struct BatchResult {
    pub(super) plan: SparePlan,
    pub(super) lease: SlotLease,
    pub(super) lane: Lane,
    /// Dropped with the result, after its bytes were sent.
    pub(super) _hold: Option<Hold>,
}

impl BatchResult {
    /// The lane the batch was served in (by the policy's decision or the
    /// size threshold), for the transports' counters.
    pub fn lane(&self) -> Lane {
        self.lane
    }

    pub fn statuses(&self) -> &[RangeStatus] {
        self.plan.statuses()
    }

    /// Fails range `index` for a reason found before it was read (a
    /// source-backed chunk that could not be filled): its bytes, if any,
    /// are no longer served.
    pub fn fail_range(&mut self, index: usize, status: RangeStatus) {
        self.plan.fail(index, status);
    }

    /// Bytes of every `Ok` range, in request order.
    pub fn payload_bytes(&self) -> u64 {
        self.plan.ok_bytes()
    }

    /// The pieces of range `index`'s bytes in order, each contiguous in a
    /// DMA region (none unless its status is `Ok`); RDMA writes from them.
    pub fn range_pieces(&self, index: usize) -> impl Iterator<Item = &[u8]> {
        let pieces = if self.plan.statuses()[index] == RangeStatus::Ok { self.plan.pieces_of(index) } else { &[] };
        pieces.iter().map(|piece| self.piece_bytes(piece))
    }

    /// Hands `each` the bytes of every `Ok` range in request order, piece
    /// by piece: what a response sends after its head, in one vectored
    /// send. Plain loops rather than an iterator: under callgrind a zip,
    /// filter and flatten over the ranges, filling a vector through
    /// `extend`, cost the served path a hundred instructions a 4 KiB range
    /// beside the piece lookups; the loops and `push` cost forty-odd.
    pub fn for_each_ok_piece<'a>(&'a self, mut each: impl FnMut(&'a [u8])) {
        let plan = &*self.plan;
        for (status, &(first, count)) in plan.statuses().iter().zip(&plan.range_pieces) {
            if *status == RangeStatus::Ok {
                for piece in &plan.pieces[first as usize..][..count as usize] {
                    each(self.piece_bytes(piece));
                }
            }
        }
    }

    /// How many pieces the ranges' bytes lie in, at most: a bound for the
    /// vectors [`BatchResult::for_each_ok_piece`] fills.
    pub fn pieces_max(&self) -> usize {
        self.plan.pieces.len()
    }

    fn piece_bytes(&self, piece: &crate::plan::Piece) -> &[u8] {
        let unit = self.plan.units[piece.unit as usize];
        let slot = self.lease.slot(unit.lease_slot as usize);
        let offset = unit.slot_offset_bytes as usize + piece.unit_offset_bytes as usize;
        // SAFETY: the lease owns the slot and every I/O of this batch has
        // completed before a BatchResult exists, so no device writes it.
        unsafe { self.lease.arena().slot_bytes(slot, offset, piece.len_bytes as usize) }
    }
}
