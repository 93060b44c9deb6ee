//! Batches in flight: the table of active batches, the completion tags
//! that name a batch's unit or block retry, and pushing units to and
//! reaping completions from the queue.

use super::*;

/// A batch a core is reading.
pub(super) struct ActiveBatch {
    pub(super) slot: u32,
    pub(super) view: Arc<DatasetView>,
    pub(super) plan: result::SparePlan,
    pub(super) lease: SlotLease,
    pub(super) units_pushed: usize,
    pub(super) units_done: usize,
    /// In its lane's [`CoreEngine::to_push`] queue.
    pub(super) pushing: bool,
    /// Units that did not read back whole; their chunks are not verified.
    pub(super) unit_failed: Vec<bool>,
    /// Single-block reads that isolate the bad blocks of failed units.
    pub(super) retries: VecDeque<(u32, u32)>,
    pub(super) retries_left: Vec<u32>,
    /// Namespace byte ranges that could not be read.
    pub(super) bad_ranges: Vec<(u64, u64)>,
    pub(super) block_size_bytes: u32,
    pub(super) probe: BatchProbe,
    pub(super) reply: Reply,
    pub(super) hold: Option<Hold>,
}

/// Completion tags: batch slot, whether a block retry, block, unit.
const TAG_RETRY: u64 = 1 << 47;

fn unit_tag(active: usize, unit: usize) -> u64 {
    ((active as u64) << 48) | unit as u64
}

fn retry_tag(active: usize, unit: u32, block: u32) -> u64 {
    ((active as u64) << 48) | TAG_RETRY | (u64::from(block) << 32) | u64::from(unit)
}

impl CoreEngine {
    /// Pushes block retries and units of active batches while the queue
    /// has room: latency-lane batches first, then bulk ones only while they
    /// leave a quarter of the queue to the latency lane and hold no more
    /// than their bytes' bound at the device, so a small read never waits
    /// behind a device queue full of bulk reads.
    pub(super) fn push_units(&mut self) {
        self.push_lane_units(Lane::Latency, u32::MAX);
        let bulk_in_flight_max = self.queue_depth - self.queue_depth / LATENCY_RESERVE_DIVISOR as u32;
        self.push_lane_units(Lane::Bulk, bulk_in_flight_max.max(1));
    }

    /// Pushes the units of `lane`'s batches that have some to push, in
    /// admission order, while fewer than `in_flight_max` reads are in the
    /// queue and, for the bulk lane, while its bytes at the device stay
    /// within their bound (one read always goes, however large). Only
    /// those batches are visited ([`CoreEngine::to_push`]), not the whole
    /// active table.
    pub(super) fn push_lane_units(&mut self, lane: Lane, in_flight_max: u32) {
        let to_push = &mut self.to_push[lane.index()];
        // Counted here rather than asked of the queue a read.
        let mut room = in_flight_max.saturating_sub(self.queue.in_flight());
        let bulk = lane == Lane::Bulk;
        let bytes_max =
            if bulk && self.bulk_in_flight_bytes_max > 0 { self.bulk_in_flight_bytes_max } else { u64::MAX };
        let bulk_bytes = &mut self.bulk_in_flight_bytes;
        // Whether a read of `len` bytes may go now.
        let fits =
            |len: u32, bulk_bytes: u64| bulk_bytes == 0 || bulk_bytes.saturating_add(u64::from(len)) <= bytes_max;
        while let Some(&index) = to_push.front() {
            let batch = self.active[index].as_mut().expect("a batch to push is active");
            debug_assert_eq!(batch.probe.lane(), lane, "a batch pushed in another lane's turn");
            while let Some(&(unit_index, block)) = batch.retries.front() {
                if room == 0 || !fits(batch.block_size_bytes, *bulk_bytes) {
                    return;
                }
                let unit = batch.plan.units[unit_index as usize];
                let at = unit.slot_offset_bytes as usize + (block * batch.block_size_bytes) as usize;
                let io = ReadIo {
                    namespace_index: batch.slot,
                    offset_bytes: unit.offset_bytes + u64::from(block * batch.block_size_bytes),
                    len_bytes: batch.block_size_bytes,
                    buf: batch.lease.arena().slot_ptr(batch.lease.slot(unit.lease_slot as usize), at),
                    tag: retry_tag(index, unit_index, block),
                };
                // SAFETY: the block lies inside its unit's part of a slot this
                // batch's lease owns; the failed unit's read has completed, so
                // only this retry writes it until its completion is reaped.
                if unsafe { self.queue.push_read(io) }.is_err() {
                    return;
                }
                batch.retries.pop_front();
                room -= 1;
                if bulk {
                    *bulk_bytes += u64::from(batch.block_size_bytes);
                }
            }
            let units = &batch.plan.units;
            while batch.units_pushed < units.len() {
                let unit_index = batch.units_pushed;
                let unit = units[unit_index];
                if room == 0 || !fits(unit.len_bytes, *bulk_bytes) {
                    return;
                }
                let buf = batch
                    .lease
                    .arena()
                    .slot_ptr(batch.lease.slot(unit.lease_slot as usize), unit.slot_offset_bytes as usize);
                let io = ReadIo {
                    namespace_index: batch.slot,
                    offset_bytes: unit.offset_bytes,
                    len_bytes: unit.len_bytes,
                    buf,
                    tag: unit_tag(index, unit_index),
                };
                // SAFETY: `buf` is inside a slot this batch's lease owns; the
                // plan gives each unit a disjoint, 4096-aligned range of it,
                // and the lease is kept until every unit has completed.
                if unsafe { self.queue.push_read(io) }.is_err() {
                    return;
                }
                batch.units_pushed += 1;
                room -= 1;
                if bulk {
                    *bulk_bytes += u64::from(unit.len_bytes);
                }
            }
            batch.pushing = false;
            to_push.pop_front();
        }
    }

    /// Queues active batch `index` to have its units or retries pushed in
    /// its lane's turn, unless it is queued already.
    pub(super) fn queue_to_push(&mut self, index: usize) {
        let batch = self.active[index].as_mut().expect("queueing an idle batch slot");
        if !batch.pushing {
            batch.pushing = true;
            let to_push = &mut self.to_push[batch.probe.lane().index()];
            assert!(to_push.len() < self.active.len(), "more batches to push than batch slots");
            to_push.push_back(index);
        }
    }

    pub(super) fn reap(&mut self) -> usize {
        let mut completions = std::mem::take(&mut self.completions);
        completions.clear();
        let reaped = self.queue.reap(&mut completions, REAP_MAX);
        for completion in &completions {
            let index = (completion.tag >> 48) as usize;
            let unit_index = (completion.tag & u64::from(u32::MAX)) as usize;
            let batch = self.active[index].as_mut().expect("completion for an idle batch slot");
            let unit = batch.plan.units[unit_index];
            let is_retry = completion.tag & TAG_RETRY != 0;
            if batch.probe.lane() == Lane::Bulk {
                let len = u64::from(if is_retry { batch.block_size_bytes } else { unit.len_bytes });
                assert!(len <= self.bulk_in_flight_bytes, "a bulk read completed that was not counted at the device");
                self.bulk_in_flight_bytes -= len;
            }
            let mut retried = false;
            let finished_unit = if is_retry {
                let block = ((completion.tag >> 32) & 0x7fff) as u32;
                let start = unit.offset_bytes + u64::from(block * batch.block_size_bytes);
                let needed = u64::from(unit.needed_bytes).saturating_sub(u64::from(block * batch.block_size_bytes));
                let needed = needed.min(u64::from(batch.block_size_bytes));
                if completion.result < 0 || (completion.result as u64) < needed {
                    batch.bad_ranges.push((start, start + u64::from(batch.block_size_bytes)));
                }
                batch.retries_left[unit_index] -= 1;
                batch.retries_left[unit_index] == 0
            } else if completion.result >= 0 && completion.result as u32 >= unit.needed_bytes {
                true
            } else {
                tracing::warn!(
                    core = self.id,
                    offset = unit.offset_bytes,
                    len = unit.len_bytes,
                    result = completion.result,
                    "read failed; retrying block by block"
                );
                batch.unit_failed[unit_index] = true;
                let blocks = unit.needed_bytes.div_ceil(batch.block_size_bytes).max(1);
                if blocks == 1 {
                    batch.bad_ranges.push((unit.offset_bytes, unit.offset_bytes + u64::from(unit.len_bytes)));
                    true
                } else {
                    batch.retries.extend((0..blocks).map(|b| (unit_index as u32, b)));
                    batch.retries_left[unit_index] = blocks;
                    retried = true;
                    false
                }
            };
            if finished_unit {
                batch.units_done += 1;
                assert!(batch.units_done <= batch.plan.units.len(), "unit completed twice");
                if batch.units_done == batch.plan.units.len() {
                    self.complete(index);
                }
            }
            if retried {
                self.queue_to_push(index);
            }
        }
        self.completions = completions;
        reaped
    }
}
