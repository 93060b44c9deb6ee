//! Turns a batch of byte ranges into block I/O: covering blocks for unaligned
//! ranges, adjacent ranges merged, extents split into I/O units that fit a DMA
//! slot, and for each range the pieces of unit data that make up its bytes.
//!
//! Pure and allocation-bounded by the batch size, so it is tested
//! exhaustively with proptest without any device.

use crate::dataset::ByteRange;
use crate::dma::IO_ALIGN_BYTES;
use sluice_proto::RangeStatus;

/// The geometry a plan is made for.
#[derive(Clone, Copy, Debug)]
pub struct PlanGeometry {
    /// Logical block size of the namespace; a power of two ≤ 4096.
    pub block_size_bytes: u32,
    /// Largest single I/O, equal to the DMA slot size; a multiple of 4096.
    pub unit_bytes_max: u32,
    /// Where the dataset starts in its namespace (block-aligned).
    pub base_offset_bytes: u64,
    pub length_bytes: u64,
    /// When non-zero, every read is widened to whole granules of this many
    /// bytes (the checksum block), so that every byte served is verified.
    pub widen_to_bytes: u64,
}

/// One block I/O of the plan.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IoUnit {
    /// Namespace byte offset; block-aligned.
    pub offset_bytes: u64,
    /// A multiple of the block size, ≤ `unit_bytes_max`.
    pub len_bytes: u32,
    /// Fewer bytes than `len_bytes` may come back at the end of the
    /// namespace; this many are needed.
    pub needed_bytes: u32,
    /// Which slot of the batch's lease, and where in it.
    pub lease_slot: u32,
    pub slot_offset_bytes: u32,
}

/// Part of a range's bytes inside one unit's data.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Piece {
    pub unit: u32,
    pub unit_offset_bytes: u32,
    pub len_bytes: u32,
}

/// The block I/O for one batch and how to cut the ranges back out of it.
/// Planned again with [`plan_batch_into`], a plan keeps its vectors'
/// capacity, so a core that recycles its plans allocates none per batch.
#[derive(Debug, Default)]
pub struct BatchPlan {
    /// Per range, in request order; changed only through
    /// [`BatchPlan::fail`], which keeps `ok_bytes` with them.
    statuses: Vec<RangeStatus>,
    pub units: Vec<IoUnit>,
    pub pieces: Vec<Piece>,
    /// Per range, in request order: `(first piece, piece count)`.
    pub range_pieces: Vec<(u32, u32)>,
    pub slots_needed: u32,
    /// Bytes of the ranges whose status is `Ok`: what a response carries.
    /// Kept as statuses change ([`BatchPlan::fail`]), so a response never
    /// walks its pieces to size itself.
    ok_bytes: u64,
    /// Planning's scratch, kept for the next batch: the ranges with bytes
    /// to read as [`OrderKey`]s, narrow where they fit (nearly always).
    live_narrow: Vec<u64>,
    live_wide: Vec<u128>,
}

impl BatchPlan {
    pub fn pieces_of(&self, range_index: usize) -> &[Piece] {
        let (first, count) = self.range_pieces[range_index];
        &self.pieces[first as usize..(first + count) as usize]
    }

    /// Each range's status, in request order.
    pub fn statuses(&self) -> &[RangeStatus] {
        &self.statuses
    }

    /// Bytes of the ranges whose status is `Ok`.
    pub fn ok_bytes(&self) -> u64 {
        self.ok_bytes
    }

    /// Fails range `index` with `status`; its bytes are no longer served.
    pub fn fail(&mut self, index: usize, status: RangeStatus) {
        assert_ne!(status, RangeStatus::Ok, "failing a range with Ok");
        if self.statuses[index] == RangeStatus::Ok {
            let bytes: u64 = self.pieces_of(index).iter().map(|p| u64::from(p.len_bytes)).sum();
            self.ok_bytes -= bytes;
        }
        self.statuses[index] = status;
    }

    /// Bytes the plan's vectors hold allocated, whatever their length.
    pub fn capacity_bytes(&self) -> usize {
        self.statuses.capacity() * size_of::<RangeStatus>()
            + self.units.capacity() * size_of::<IoUnit>()
            + self.pieces.capacity() * size_of::<Piece>()
            + self.range_pieces.capacity() * size_of::<(u32, u32)>()
            + self.live_narrow.capacity() * size_of::<u64>()
            + self.live_wide.capacity() * size_of::<u128>()
    }
}

/// Plans `ranges` against `geometry`.
pub fn plan_batch(ranges: &[ByteRange], geometry: PlanGeometry) -> BatchPlan {
    let mut plan = BatchPlan::default();
    plan_batch_into(ranges, geometry, &mut plan);
    plan
}

/// Plans `ranges` against `geometry` into `plan`, replacing what it held
/// and reusing its vectors.
///
/// Written for the served path's cost (it runs once per range on the
/// core): sizes are powers of two, so rounding is masking; the ranges are
/// sorted as one integer key each (`OrderKey`: a `u64` unless the
/// dataset's blocks and the batch's ranges need more bits), not as tuples;
/// and an extent that fits one unit, as every small read's does, is cut
/// into pieces without dividing.
pub fn plan_batch_into(ranges: &[ByteRange], geometry: PlanGeometry, plan: &mut BatchPlan) {
    let block = u64::from(geometry.block_size_bytes);
    let unit_max = u64::from(geometry.unit_bytes_max);
    let granule = geometry.widen_to_bytes;
    assert!(block.is_power_of_two() && block <= IO_ALIGN_BYTES as u64, "block size {block}");
    assert!(unit_max.is_multiple_of(IO_ALIGN_BYTES as u64) && unit_max >= block, "unit size {unit_max}");
    assert!(granule == 0 || granule.is_power_of_two(), "widening to {granule} bytes");
    assert!(geometry.base_offset_bytes.is_multiple_of(block), "dataset base not block-aligned");
    assert!(ranges.len() <= u32::MAX as usize, "{} ranges in a batch", ranges.len());

    plan.statuses.clear();
    plan.statuses.resize(ranges.len(), RangeStatus::Ok);
    plan.range_pieces.clear();
    plan.range_pieces.resize(ranges.len(), (0, 0));
    plan.units.clear();
    plan.pieces.clear();
    plan.ok_bytes = 0;
    if ranges.len() as u64 <= block {
        let mut live = std::mem::take(&mut plan.live_narrow);
        plan_in_order(ranges, geometry, plan, &mut live);
        plan.live_narrow = live;
    } else {
        let mut live = std::mem::take(&mut plan.live_wide);
        plan_in_order(ranges, geometry, plan, &mut live);
        plan.live_wide = live;
    }
}

/// A range's place in I/O order as one integer: the block-aligned start
/// of its I/O (from the dataset's base) with its index in the batch below
/// it, so sorted keys are in I/O order and name their range.
trait OrderKey: Copy + Ord {
    fn pack(aligned_start: u64, index: usize) -> Self;
    fn aligned_start(self, block_mask: u64) -> u64;
    fn index(self, block_mask: u64) -> usize;
}

/// For a batch of no more ranges than a block has bytes (every batch the
/// wire allows, on 4 KiB blocks): the index fills the start's low bits,
/// which are zero, so neither packing nor unpacking shifts.
impl OrderKey for u64 {
    fn pack(aligned_start: u64, index: usize) -> Self {
        aligned_start | index as u64
    }

    fn aligned_start(self, block_mask: u64) -> u64 {
        self & !block_mask
    }

    fn index(self, block_mask: u64) -> usize {
        (self & block_mask) as usize
    }
}

/// For any batch: the start above a 32-bit index.
impl OrderKey for u128 {
    fn pack(aligned_start: u64, index: usize) -> Self {
        (u128::from(aligned_start) << 32) | index as u128
    }

    fn aligned_start(self, _: u64) -> u64 {
        (self >> 32) as u64
    }

    fn index(self, _: u64) -> usize {
        self as u32 as usize
    }
}

/// The plan proper, past the checks and resets of [`plan_batch_into`]:
/// statuses, the sorted keys in `live`, then extents, units and pieces.
fn plan_in_order<K: OrderKey>(ranges: &[ByteRange], geometry: PlanGeometry, plan: &mut BatchPlan, live: &mut Vec<K>) {
    let block_mask = u64::from(geometry.block_size_bytes) - 1;
    let unit_max = u64::from(geometry.unit_bytes_max);
    let span = Spans {
        base: geometry.base_offset_bytes,
        length: geometry.length_bytes,
        granule_mask: geometry.widen_to_bytes.saturating_sub(1),
    };
    live.clear();
    live.reserve(ranges.len());
    let mut ok_bytes = 0;
    for (index, range) in ranges.iter().enumerate() {
        let len = u64::from(range.len_bytes);
        match range.offset_bytes.checked_add(len) {
            Some(end) if end <= geometry.length_bytes => {
                ok_bytes += len;
                if len > 0 {
                    live.push(K::pack(span.io_start_within(range) & !block_mask, index));
                }
            }
            _ => plan.statuses[index] = RangeStatus::OutOfBounds,
        }
    }
    plan.ok_bytes = ok_bytes;
    live.sort_unstable();
    let extent_start_of = |key: K| span.base + key.aligned_start(block_mask);

    let namespace_end = geometry.base_offset_bytes + geometry.length_bytes;
    let mut packer = SlotPacker::new(geometry.unit_bytes_max);
    let mut cursor = 0;
    while cursor < live.len() {
        // Grow one extent over every range whose blocks touch it.
        let extent_start = extent_start_of(live[cursor]);
        let mut extent_end = round_up(span.io_end(&ranges[live[cursor].index(block_mask)]), block_mask);
        let mut last = cursor + 1;
        while last < live.len() && extent_start_of(live[last]) <= extent_end {
            extent_end = extent_end.max(round_up(span.io_end(&ranges[live[last].index(block_mask)]), block_mask));
            last += 1;
        }
        let first_unit = plan.units.len() as u32;
        let mut unit = |offset: u64, len: u64| {
            let needed = len.min(namespace_end.saturating_sub(offset));
            let (lease_slot, slot_offset_bytes) = packer.place(len as u32);
            IoUnit {
                offset_bytes: offset,
                len_bytes: len as u32,
                needed_bytes: needed as u32,
                lease_slot,
                slot_offset_bytes,
            }
        };
        if extent_end - extent_start <= unit_max {
            // One unit, as every small read's extent is: each range one
            // piece of it, cut without dividing.
            plan.units.push(unit(extent_start, extent_end - extent_start));
            for &key in &live[cursor..last] {
                let index = key.index(block_mask);
                let (start, end) = span.bytes(&ranges[index]);
                plan.range_pieces[index] = (plan.pieces.len() as u32, 1);
                let unit_offset_bytes = (start - extent_start) as u32;
                plan.pieces.push(Piece { unit: first_unit, unit_offset_bytes, len_bytes: (end - start) as u32 });
            }
        } else {
            let mut offset = extent_start;
            while offset < extent_end {
                let len = (extent_end - offset).min(unit_max);
                plan.units.push(unit(offset, len));
                offset += len;
            }
            for &key in &live[cursor..last] {
                let index = key.index(block_mask);
                let (start, end) = span.bytes(&ranges[index]);
                let first_piece = plan.pieces.len() as u32;
                let mut at = start;
                while at < end {
                    let within = at - extent_start;
                    let unit = first_unit + (within / unit_max) as u32;
                    let unit_offset = within % unit_max;
                    let len = (end - at).min(unit_max - unit_offset);
                    plan.pieces.push(Piece { unit, unit_offset_bytes: unit_offset as u32, len_bytes: len as u32 });
                    at += len;
                }
                plan.range_pieces[index] = (first_piece, plan.pieces.len() as u32 - first_piece);
            }
        }
        cursor = last;
    }
    plan.slots_needed = packer.slots_used();
}

/// `value` rounded up to a multiple of `mask + 1` (a power of two);
/// saturating, which only a namespace ending within `mask` of 2^64 meets.
fn round_up(value: u64, mask: u64) -> u64 {
    value.saturating_add(mask) & !mask
}

/// Where a range's bytes and its I/O lie in the namespace: at the
/// dataset's base, the I/O widened to whole granules (a granule mask of
/// zero widens nothing) but never past the dataset's end.
struct Spans {
    base: u64,
    length: u64,
    granule_mask: u64,
}

impl Spans {
    /// The range's bytes, absolute. The range is in bounds.
    fn bytes(&self, range: &ByteRange) -> (u64, u64) {
        let start = self.base + range.offset_bytes;
        (start, start + u64::from(range.len_bytes))
    }

    /// Where the range's I/O starts, from the dataset's base.
    fn io_start_within(&self, range: &ByteRange) -> u64 {
        range.offset_bytes & !self.granule_mask
    }

    fn io_end(&self, range: &ByteRange) -> u64 {
        let end = range.offset_bytes + u64::from(range.len_bytes);
        self.base + round_up(end, self.granule_mask).min(self.length)
    }
}

/// Bump allocation of units into fixed-size slots.
struct SlotPacker {
    slot_size_bytes: u32,
    slots_used: u32,
    used_bytes: u32,
}

impl SlotPacker {
    fn new(slot_size_bytes: u32) -> Self {
        Self { slot_size_bytes, slots_used: 0, used_bytes: 0 }
    }

    fn place(&mut self, len_bytes: u32) -> (u32, u32) {
        let footprint = len_bytes.next_multiple_of(IO_ALIGN_BYTES as u32);
        assert!(footprint <= self.slot_size_bytes, "unit larger than a slot");
        if self.slots_used == 0 || self.used_bytes + footprint > self.slot_size_bytes {
            self.slots_used += 1;
            self.used_bytes = 0;
        }
        let at = (self.slots_used - 1, self.used_bytes);
        self.used_bytes += footprint;
        at
    }

    fn slots_used(&self) -> u32 {
        self.slots_used
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn geometry(length_bytes: u64, block_size_bytes: u32) -> PlanGeometry {
        PlanGeometry {
            block_size_bytes,
            unit_bytes_max: 128 * 1024,
            base_offset_bytes: 0,
            length_bytes,
            widen_to_bytes: 0,
        }
    }

    fn range(offset_bytes: u64, len_bytes: u32) -> ByteRange {
        ByteRange { offset_bytes, len_bytes }
    }

    /// Reassembles every range from a simulated read of `data` and checks it.
    fn check_plan(data: &[u8], ranges: &[ByteRange], geometry: PlanGeometry) {
        let plan = plan_batch(ranges, geometry);
        let slot = geometry.unit_bytes_max as usize;
        let mut slots = vec![0u8; plan.slots_needed as usize * slot];
        for unit in &plan.units {
            assert_eq!(unit.offset_bytes % u64::from(geometry.block_size_bytes), 0);
            assert_eq!(unit.len_bytes % geometry.block_size_bytes, 0);
            assert_eq!(unit.slot_offset_bytes as usize % IO_ALIGN_BYTES, 0);
            assert!(unit.slot_offset_bytes + unit.len_bytes <= geometry.unit_bytes_max);
            let at = unit.lease_slot as usize * slot + unit.slot_offset_bytes as usize;
            let from = (unit.offset_bytes - geometry.base_offset_bytes) as usize;
            let have = data.len().saturating_sub(from).min(unit.len_bytes as usize);
            assert!(have >= unit.needed_bytes as usize, "needed bytes beyond the data");
            slots[at..at + have].copy_from_slice(&data[from..from + have]);
        }
        for (index, r) in ranges.iter().enumerate() {
            let in_bounds = r.offset_bytes + u64::from(r.len_bytes) <= data.len() as u64;
            if !in_bounds {
                assert_eq!(plan.statuses[index], RangeStatus::OutOfBounds);
                continue;
            }
            assert_eq!(plan.statuses[index], RangeStatus::Ok);
            let mut got = Vec::new();
            for piece in plan.pieces_of(index) {
                let unit = plan.units[piece.unit as usize];
                assert!(piece.unit_offset_bytes + piece.len_bytes <= unit.len_bytes);
                let at = unit.lease_slot as usize * slot
                    + unit.slot_offset_bytes as usize
                    + piece.unit_offset_bytes as usize;
                got.extend_from_slice(&slots[at..at + piece.len_bytes as usize]);
            }
            let start = r.offset_bytes as usize;
            assert_eq!(got, &data[start..start + r.len_bytes as usize], "range {index}");
        }
    }

    /// Adjacent and overlapping ranges become one I/O.
    #[test]
    fn adjacent_ranges_merge() {
        let plan = plan_batch(&[range(0, 100), range(100, 100), range(50, 4000)], geometry(1 << 20, 4096));
        assert_eq!(plan.units.len(), 1);
        assert_eq!(plan.units[0].len_bytes, 4096);
        let plan = plan_batch(&[range(0, 10), range(8192, 10)], geometry(1 << 20, 4096));
        assert_eq!(plan.units.len(), 2, "a gap of a whole block is not read");
    }

    /// A 1 MiB range is split into slot-sized units.
    #[test]
    fn large_ranges_split_into_units() {
        let plan = plan_batch(&[range(1, 1 << 20)], geometry(4 << 20, 4096));
        assert_eq!(plan.units.len(), 9, "1 MiB + 1 byte spans 257 blocks");
        assert_eq!(plan.pieces_of(0).len(), 9);
        assert_eq!(plan.slots_needed, 9);
    }

    /// Out-of-bounds and overflowing ranges fail alone.
    #[test]
    fn bad_ranges_fail_alone() {
        let plan = plan_batch(&[range(10, 10), range(u64::MAX, 2), range(999, 2)], geometry(1000, 512));
        assert_eq!(plan.statuses, vec![RangeStatus::Ok, RangeStatus::OutOfBounds, RangeStatus::OutOfBounds]);
        assert_eq!(plan.units.len(), 1);
    }

    /// The tail block of a dataset whose length is not block-aligned needs
    /// only the bytes that exist.
    #[test]
    fn tail_needs_only_existing_bytes() {
        let plan = plan_batch(&[range(4000, 100)], geometry(4100, 4096));
        assert_eq!(plan.units.len(), 1);
        assert_eq!(plan.units[0].len_bytes, 8192);
        assert_eq!(plan.units[0].needed_bytes, 4100);
        check_plan(&vec![7u8; 4100], &[range(4000, 100)], geometry(4100, 4096));
    }

    /// Two plans alike in all but their scratch.
    fn same_plan(a: &BatchPlan, b: &BatchPlan) -> Result<(), proptest::test_runner::TestCaseError> {
        prop_assert_eq!(&a.statuses, &b.statuses);
        prop_assert_eq!(&a.units, &b.units);
        prop_assert_eq!(&a.pieces, &b.pieces);
        prop_assert_eq!(&a.range_pieces, &b.range_pieces);
        prop_assert_eq!(a.slots_needed, b.slots_needed);
        prop_assert_eq!(a.ok_bytes, b.ok_bytes);
        Ok(())
    }

    /// A plan of `ranges` made with keys of type `K`.
    fn plan_with_keys<K: OrderKey>(ranges: &[ByteRange], geometry: PlanGeometry) -> BatchPlan {
        let mut plan = BatchPlan::default();
        plan.statuses.resize(ranges.len(), RangeStatus::Ok);
        plan.range_pieces.resize(ranges.len(), (0, 0));
        plan_in_order(ranges, geometry, &mut plan, &mut Vec::<K>::new());
        plan
    }

    /// A batch of more ranges than a block has bytes plans with wide keys,
    /// byte-exact.
    #[test]
    fn batches_of_more_ranges_than_block_bytes_plan_exactly() {
        let data: Vec<u8> = (0..40_000).map(|i| (i * 7 % 253) as u8).collect();
        let ranges: Vec<ByteRange> = (0..600).map(|i| range((i * 7919) % 39_000, (i % 50) as u32 + 1)).collect();
        check_plan(&data, &ranges, geometry(data.len() as u64, 512));
    }

    proptest! {
        /// Wide keys plan exactly as narrow ones do.
        #[test]
        fn key_widths_plan_alike(
            len in 1u64..(1 << 40),
            block_shift in 9u32..=12,
            widen in prop_oneof![Just(0u64), Just(4096u64)],
            raw in proptest::collection::vec((any::<u64>(), 0u32..300_000), 1..40),
        ) {
            let ranges: Vec<ByteRange> = raw.iter().map(|&(o, l)| range(o % (len + 100), l)).collect();
            let geometry = PlanGeometry { widen_to_bytes: widen, ..geometry(len, 1 << block_shift) };
            same_plan(&plan_with_keys::<u64>(&ranges, geometry), &plan_with_keys::<u128>(&ranges, geometry))?;
        }

        /// Any batch reassembles byte-exact, whatever the block size.
        #[test]
        fn plans_reassemble_exactly(
            len in 1usize..600_000,
            block_shift in 9u32..=12,
            raw in proptest::collection::vec((any::<u64>(), 0u32..300_000), 1..40),
        ) {
            let data: Vec<u8> = (0..len).map(|i| (i * 31 % 251) as u8).collect();
            let ranges: Vec<ByteRange> = raw.iter().map(|&(o, l)| {
                // Mostly in bounds, sometimes past the end.
                let offset = o % (len as u64 + 100);
                range(offset, l.min(len as u32))
            }).collect();
            check_plan(&data, &ranges, geometry(len as u64, 1 << block_shift));
            let widened = PlanGeometry { widen_to_bytes: 65_536, ..geometry(len as u64, 1 << block_shift) };
            check_plan(&data, &ranges, widened);
            // A dataset that starts deep in its namespace plans the same.
            let placed = PlanGeometry { base_offset_bytes: (1 << 40) + 3 * 4096, ..widened };
            check_plan(&data, &ranges, placed);
        }

        /// A plan planned again over what an earlier batch left in it is the
        /// plan a fresh one makes: nothing of the earlier batch remains.
        #[test]
        fn a_reused_plan_is_a_fresh_plan(
            len in 1usize..600_000,
            batches in proptest::collection::vec(
                proptest::collection::vec((any::<u64>(), 0u32..300_000), 0..40), 1..5),
        ) {
            let geometry = PlanGeometry { widen_to_bytes: 4096, ..geometry(len as u64, 512) };
            let mut reused = BatchPlan::default();
            for raw in &batches {
                let ranges: Vec<ByteRange> =
                    raw.iter().map(|&(o, l)| range(o % (len as u64 + 100), l.min(len as u32))).collect();
                plan_batch_into(&ranges, geometry, &mut reused);
                same_plan(&reused, &plan_batch(&ranges, geometry))?;
                let ok_pieces: u64 = (0..ranges.len())
                    .filter(|&i| reused.statuses[i] == RangeStatus::Ok)
                    .flat_map(|i| reused.pieces_of(i))
                    .map(|p| u64::from(p.len_bytes))
                    .sum();
                prop_assert_eq!(reused.ok_bytes, ok_pieces);
            }
        }

        /// A batch within the client's footprint budget fits twice its
        /// budget in slots, whatever the offsets.
        #[test]
        fn footprint_bound_holds(
            raw in proptest::collection::vec((any::<u64>(), 1u32..(4 << 20)), 1..64),
        ) {
            let length = 1u64 << 40;
            let ranges: Vec<ByteRange> = raw.iter().map(|&(o, l)| range(o % (length - (4 << 20)), l)).collect();
            let budget: u64 = ranges.iter().map(|r| sluice_proto::geometry::footprint_bound_bytes(r.len_bytes)).sum();
            let plan = plan_batch(&ranges, geometry(length, 4096));
            let slot = 128 * 1024u64;
            prop_assert!(u64::from(plan.slots_needed) * slot <= 2 * budget + slot);
        }
    }
}
