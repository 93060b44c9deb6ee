//! Admission: which lane a batch takes (the policy's decision for its
//! flow, else the size threshold) and when it may start (latency first,
//! a reserve of slots kept for it).

use super::*;

impl CoreEngine {
    /// The probe of a batch that just arrived: its sizes and its flow.
    pub(super) fn probe_of(&self, batch: &ReadBatch) -> BatchProbe {
        let dataset_id = match self.datasets.get(batch.dataset.index as usize) {
            Some(Some(attached)) if attached.generation == batch.dataset.generation => attached.view.dataset_id,
            _ => 0,
        };
        let mut probe = BatchProbe {
            dataset_id,
            client_id: batch.client_id,
            ranges: batch.ranges.len() as u32,
            flow: batch.flow.index,
            flow_generation: batch.flow.generation,
            peer: batch.flow.peer,
            ..BatchProbe::default()
        };
        for range in &batch.ranges {
            probe.bytes += u64::from(range.len_bytes);
            probe.size_hist[size_bucket(range.len_bytes)] += 1;
        }
        probe
    }

    /// The policy's decision for the batch's flow where there is one (one
    /// load from the decision array), else the size threshold.
    pub(super) fn choose_lane(&self, probe: &mut BatchProbe) -> Lane {
        let decision = match &self.decisions {
            Some(decisions) if probe.flow < FLOWS_MAX => decisions.decision(probe.flow),
            _ => DECISION_NONE,
        };
        let (lane, source) = match decision {
            DECISION_LATENCY => (Lane::Latency, LANE_BY_POLICY),
            DECISION_BULK => (Lane::Bulk, LANE_BY_POLICY),
            _ if probe.bytes <= self.latency_batch_bytes_max => (Lane::Latency, LANE_BY_THRESHOLD),
            _ => (Lane::Bulk, LANE_BY_THRESHOLD),
        };
        probe.lane = lane as u8;
        probe.lane_source = source;
        lane
    }

    pub(super) fn waiting_count(&self) -> usize {
        self.waiting.iter().map(VecDeque::len).sum()
    }

    /// Starts waiting batches whose slots are free: the latency lane first,
    /// then bulk batches as long as they leave the latency reserve free.
    pub(super) fn admit_waiting(&mut self) {
        self.admit_lane(Lane::Latency, 0);
        let reserve = self.pool.capacity() / LATENCY_RESERVE_DIVISOR;
        self.admit_lane(Lane::Bulk, reserve);
    }

    /// Admits batches of `lane` in order while `reserve` slots stay free.
    pub(super) fn admit_lane(&mut self, lane: Lane, reserve: usize) {
        let lane = lane.index();
        while let Some((batch, _)) = self.waiting[lane].front() {
            if batch.reply.is_closed() {
                // Nobody waits for it any more: do not read it.
                self.waiting[lane].pop_front();
                continue;
            }
            let attached = self.datasets.get(batch.dataset.index as usize).cloned().flatten();
            let Some(AttachedView { view, block_size_bytes, .. }) =
                attached.filter(|attached| attached.generation == batch.dataset.generation)
            else {
                if let Some((batch, _)) = self.waiting[lane].pop_front() {
                    let _ = batch.reply.send(Err(SubmitError::UnknownDataset));
                }
                continue;
            };
            let Some(&active_index) = self.active_free.last() else { return };
            let geometry = PlanGeometry {
                block_size_bytes,
                unit_bytes_max: self.unit_bytes_max,
                base_offset_bytes: view.base_offset_bytes,
                length_bytes: view.length_bytes,
                widen_to_bytes: self.widen_for(&view),
            };
            let mut plan = result::SparePlan::take();
            plan_batch_into(&batch.ranges, geometry, &mut plan);
            // What this lane may ever use: a bulk batch never takes the
            // latency lane's reserve, so one that needs it is too large
            // (the transports' limits keep batches well under it).
            let capacity = (self.pool.capacity() - reserve) as u32;
            if plan.slots_needed > capacity {
                if let Some((batch, _)) = self.waiting[lane].pop_front() {
                    let slots_needed = plan.slots_needed;
                    let _ = batch.reply.send(Err(SubmitError::TooLarge { slots_needed, capacity }));
                }
                continue;
            }
            let lease = if self.pool.free_count() < plan.slots_needed as usize + reserve {
                None
            } else {
                self.pool.take(plan.slots_needed as usize)
            };
            // Without one, planned again once slots come back.
            let Some(lease) = lease else { return };
            let Some((batch, mut probe)) = self.waiting[lane].pop_front() else { return };
            let ReadBatch { dataset, ranges, reply, hold, .. } = batch;
            result::keep_spare_ranges(ranges);
            self.active_free.pop();
            self.slot_batches[dataset.index as usize] += 1;
            let units = plan.units.len();
            let (mut unit_failed, mut retries_left) = self.spare_unit_state.pop().unwrap_or_default();
            unit_failed.clear();
            unit_failed.resize(units, false);
            retries_left.clear();
            retries_left.resize(units, 0);
            let block_size_bytes = geometry.block_size_bytes;
            probe.submit_ns = monotonic_ns(self.clock);
            sluice_probe_batch_submit(&probe);
            self.active[active_index] = Some(ActiveBatch {
                slot: dataset.index,
                view,
                plan,
                lease,
                units_pushed: 0,
                units_done: 0,
                pushing: false,
                unit_failed,
                retries: VecDeque::new(),
                retries_left,
                bad_ranges: Vec::new(),
                block_size_bytes,
                probe,
                reply,
                hold,
            });
            if units == 0 {
                self.complete(active_index);
            } else {
                self.queue_to_push(active_index);
            }
        }
    }
}
