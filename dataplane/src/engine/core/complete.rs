//! Completing a batch: verifying every block its reads covered against the
//! dataset's checksums, marking ranges, and replying.

use super::inflight::ActiveBatch;
use super::*;

impl CoreEngine {
    /// Whether reads of `view` are verified: it has block checksums and
    /// verification is on.
    pub(super) fn verifies(&self, view: &DatasetView) -> bool {
        self.verify_chunks && !view.block_crcs.is_empty()
    }

    /// How far reads of `view` are widened: to whole checksum blocks when
    /// they are verified (the covering 4 KiB blocks read anyway).
    pub(super) fn widen_for(&self, view: &DatasetView) -> u64 {
        if self.verifies(view) {
            VERIFY_BLOCK_BYTES
        } else {
            0
        }
    }

    /// Settles the statuses of a finished batch and replies.
    pub(super) fn complete(&mut self, index: usize) {
        let mut batch = self.active[index].take().expect("completing an idle batch slot");
        assert!(!batch.pushing, "a batch completed with reads still to push");
        self.active_free.push(index);
        self.slot_batches[batch.slot as usize] -= 1;
        // Bad dataset byte spans: whole blocks.
        let bad_spans = if self.verifies(&batch.view) { verify_blocks(&batch) } else { Vec::new() };
        let plan = &mut batch.plan;
        // Ranges fail only over bad blocks or unread bytes: without either
        // (nearly every batch) no range needs looking at.
        if !bad_spans.is_empty() || !batch.bad_ranges.is_empty() {
            for range in 0..plan.statuses().len() {
                if plan.statuses()[range] != RangeStatus::Ok {
                    continue;
                }
                let pieces = plan.pieces_of(range);
                let Some(head) = pieces.first() else { continue };
                let ns_start = plan.units[head.unit as usize].offset_bytes + u64::from(head.unit_offset_bytes);
                let len: u64 = pieces.iter().map(|p| u64::from(p.len_bytes)).sum();
                let start = ns_start - batch.view.base_offset_bytes;
                if batch.bad_ranges.iter().any(|&(a, b)| a < ns_start + len && ns_start < b) {
                    plan.fail(range, RangeStatus::IoError);
                } else if bad_spans.iter().any(|&(a, b)| a < start + len && start < b) {
                    plan.fail(range, RangeStatus::ChecksumMismatch);
                }
            }
        }
        // The active table bounds these to one pair a batch slot.
        self.spare_unit_state.push((std::mem::take(&mut batch.unit_failed), std::mem::take(&mut batch.retries_left)));
        batch.probe.complete_ns = monotonic_ns(self.clock);
        self.poll.batch_took(batch.probe.complete_ns.saturating_sub(batch.probe.submit_ns));
        batch.probe.failed_ranges = plan.statuses().iter().filter(|s| **s != RangeStatus::Ok).count() as u32;
        sluice_probe_batch_complete(&batch.probe);
        let result = BatchResult { plan: batch.plan, lease: batch.lease, lane: batch.probe.lane(), _hold: batch.hold };
        // A closed reply means the requester left; dropping the result
        // returns its slots.
        let _ = batch.reply.send(Ok(result));
    }
}

/// Dataset byte spans of the blocks whose CRC32C does not match, among
/// every block the batch's successful units read: units start on block
/// boundaries and cover whole blocks (the plan widens to them), so every
/// byte served is checked.
fn verify_blocks(batch: &ActiveBatch) -> Vec<(u64, u64)> {
    let view = &batch.view;
    let mut bad = Vec::new();
    for (unit_index, unit) in batch.plan.units.iter().enumerate() {
        if batch.unit_failed[unit_index] {
            continue;
        }
        let start = unit.offset_bytes - view.base_offset_bytes;
        assert!(start.is_multiple_of(VERIFY_BLOCK_BYTES), "unit not on a block boundary");
        let end = (start + u64::from(unit.needed_bytes)).min(view.length_bytes);
        let slot = batch.lease.slot(unit.lease_slot as usize);
        // SAFETY: this unit's read completed and the lease owns the slot.
        let data = unsafe {
            batch.lease.arena().slot_bytes(slot, unit.slot_offset_bytes as usize, unit.needed_bytes as usize)
        };
        let mut at = start;
        while at < end {
            let block_end = (at + VERIFY_BLOCK_BYTES).min(view.length_bytes);
            let bytes = &data[(at - start) as usize..(block_end - start) as usize];
            let expected = view.block_crcs.get((at / VERIFY_BLOCK_BYTES) as usize);
            if expected.is_none_or(|crc| crc != crate::blocks::block_crc(bytes)) {
                bad.push((at, block_end));
            }
            at = block_end;
        }
    }
    bad
}
