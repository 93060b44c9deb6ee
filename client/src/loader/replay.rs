//! Replaying a step from a saved state without reading it: which samples,
//! at which bytes (the record-of-death workflow).

use crate::sampler::{rank_slice, window_domain, IndexSampler, SamplerKind, SamplerState};

use super::LoaderError;

/// One sample of a replayed step.
#[derive(Clone, Debug, serde::Serialize)]
pub struct ReplaySample {
    pub step: u64,
    pub position: u64,
    pub global_sample: u64,
    pub epoch: u64,
    /// Token start (windows) or record number (records).
    pub index: u64,
    pub byte_offset: u64,
    pub len_bytes: u64,
}

/// The samples of global step `step` of the sequence `state` describes,
/// in global batch order (rank 0's slice first): the record-of-death
/// workflow. Record samplers need the dataset's record index.
pub fn replay_step(
    state: &SamplerState,
    step: u64,
    record_index: Option<&[(u64, u64)]>,
) -> Result<Vec<ReplaySample>, LoaderError> {
    let domain = match state.kind {
        SamplerKind::Window => window_domain(state.domain_len, u64::from(state.window))?,
        SamplerKind::Record => state.domain_len,
    };
    let mut sampler = IndexSampler::new(domain, state.samples_per_epoch, state.seed)?;
    let slice = rank_slice(step, state.global_batch, 0, 1)?;
    let window_bytes = u64::from(state.window) * u64::from(state.element_bytes);
    let mut out = Vec::with_capacity(state.global_batch as usize);
    for (position, global) in slice.enumerate() {
        let index = sampler.index(global);
        let (byte_offset, len_bytes) = match (state.kind, record_index) {
            (SamplerKind::Window, _) => (index * u64::from(state.element_bytes), window_bytes),
            (SamplerKind::Record, Some(entries)) => {
                *entries.get(index as usize).ok_or(LoaderError::Index { index, records: entries.len() as u64 })?
            }
            (SamplerKind::Record, None) => return Err(LoaderError::Index { index, records: 0 }),
        };
        out.push(ReplaySample {
            step,
            position: position as u64,
            global_sample: global,
            epoch: global / state.samples_per_epoch,
            index,
            byte_offset,
            len_bytes,
        });
    }
    Ok(out)
}
