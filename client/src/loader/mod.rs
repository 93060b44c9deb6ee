//! The loaders a training loop iterates: each step yields this rank's
//! slice of the global batch, token windows ([`WindowLoader`]) or records
//! ([`RecordLoader`]), with `prefetch` steps already in flight so the loop
//! never waits on I/O it could have issued earlier. Both are one
//! [`Loader`] over a different [`StepBatch`]. A [`Mixture`] steps loaders of
//! several datasets together, each dataset's share fixed in every step.

mod mixture;
mod records;
mod replay;
mod steps;
mod windows;

use std::sync::Arc;

use crate::sampler::{rank_slice, window_domain, IndexSampler, SamplerError, SamplerKind, SamplerState};
use crate::{ClientError, Dataset, RangeStatus, ReadRange};
pub use mixture::Mixture;
pub use records::{RecordBatch, RecordLoaderConfig};
pub use replay::{replay_step, ReplaySample};
pub use steps::StepSchedule;
use steps::Steps;
pub use windows::{TokenBatch, WindowLoaderConfig};

/// Most steps a loader keeps in flight.
pub const PREFETCH_MAX: usize = 64;

/// Most steps ahead a loader tells the node of.
pub const PREFETCH_STEPS_MAX: usize = 1024;

#[derive(Debug, thiserror::Error)]
pub enum LoaderError {
    #[error("{0}")]
    Sampler(#[from] SamplerError),
    #[error("{0}")]
    Client(#[from] ClientError),
    #[error("dataset kind {0} has no tokens to window")]
    Kind(String),
    #[error("the state is for dataset {state}, this dataset is {dataset}")]
    WrongDataset { state: String, dataset: String },
    #[error("the state is not a window sampler state")]
    WrongSampler,
    #[error("step {step}: sample at token {start} failed: {status}")]
    Read { step: u64, start: u64, status: &'static str },
    #[error("prefetch task failed: {0}")]
    Task(String),
    #[error("record {index} is not in the dataset's index of {records} records")]
    Index { index: u64, records: u64 },
    #[error("the loader's schedule ends before step {0}")]
    End(u64),
    #[error("samples_per_epoch is at least 1")]
    EmptyEpoch,
    #[error("a mixture needs at least one dataset")]
    EmptyMixture,
    #[error("a mixture's datasets must stand at one step: one is at step {first}, another at {other}")]
    MixtureSteps { first: u64, other: u64 },
    #[error("a mixture's datasets must be read for one rank: (rank, world) {first:?} and {other:?}")]
    MixtureRanks { first: (u32, u32), other: (u32, u32) },
    #[error("the state is of {states} datasets, the mixture mixes {streams}")]
    MixtureStates { states: usize, streams: usize },
}

/// What a sample is in the dataset's bytes.
#[derive(Clone)]
enum Samples {
    /// Token windows: sample `s` is the state's `window` elements from
    /// element `s`.
    Windows,
    /// Records: sample `s` is entry `s` of the dataset's record index.
    Records(Arc<[(u64, u64)]>),
}

/// What a loader reads from and for whom; a resumed loader keeps it.
#[derive(Clone)]
struct Where {
    dataset: Arc<Dataset>,
    samples: Samples,
    rank: u32,
    world: u32,
    prefetch: usize,
}

/// The batch a loader makes of one step: the rank's samples of that step,
/// read back to back into one buffer by one batch read.
pub trait StepBatch: Send + Sized + 'static {
    /// The sampler state this batch's loader keeps.
    const KIND: SamplerKind;

    /// The batch of `step`: sample `samples[i]` is
    /// `data[offsets[i]..offsets[i + 1]]`.
    fn assemble(step: u64, samples: Vec<u64>, offsets: Vec<usize>, data: Vec<u8>, state: &SamplerState) -> Self;

    /// The step it was read for.
    fn step(&self) -> u64;
}

/// A deterministic shuffle of a dataset's samples read a step at a time,
/// with `prefetch` steps in flight, a step schedule, hints to the node of
/// the steps ahead, and a state that resumes it exactly. The window and
/// record loaders differ only in what a sample is ([`StepBatch`]).
pub struct Loader<B> {
    place: Where,
    sampler: IndexSampler,
    state: SamplerState,
    steps: Steps<B>,
}

/// Random token windows: each step, this rank's slice of the global batch
/// as one contiguous `(batch, window)` token array.
pub type WindowLoader = Loader<TokenBatch>;

/// Shuffled records of a `records`, `wds` or `mds` dataset with the same keyed
/// bijection, state and prefetch as the [`WindowLoader`]: one batch read
/// per step, whatever the records' sizes.
pub type RecordLoader = Loader<RecordBatch>;

/// Token windows of several datasets in fixed shares per step.
pub type WindowMixture = Mixture<TokenBatch>;

/// Records of several datasets in fixed shares per step.
pub type RecordMixture = Mixture<RecordBatch>;

impl<B: StepBatch> Loader<B> {
    fn build(place: Where, state: SamplerState) -> Result<Self, LoaderError> {
        if state.kind != B::KIND {
            return Err(LoaderError::WrongSampler);
        }
        let records = match &place.samples {
            Samples::Records(index) => Some(index.len() as u64),
            Samples::Windows => None,
        };
        let dataset_hash = &place.dataset.info().content_hash;
        if state.content_hash != *dataset_hash || records.is_some_and(|records| records != state.domain_len) {
            return Err(LoaderError::WrongDataset { state: state.content_hash.clone(), dataset: dataset_hash.clone() });
        }
        rank_slice(0, state.global_batch, place.rank, place.world)?;
        let domain = match place.samples {
            Samples::Windows => {
                if state.window.checked_mul(state.element_bytes).is_none() {
                    let window = u64::from(state.window);
                    return Err(SamplerError::WindowTooLong { window, tokens: state.domain_len }.into());
                }
                window_domain(state.domain_len, u64::from(state.window))?
            }
            Samples::Records(_) => state.domain_len,
        };
        let sampler = IndexSampler::new(domain, state.samples_per_epoch, state.seed)?;
        let steps = Steps::new(state.step(), place.prefetch);
        Ok(Self { place, sampler, state, steps })
    }

    /// Continues exactly where `state` was saved, on the same dataset, rank,
    /// world size, read-ahead depth and `prefetch_steps`; what was read
    /// ahead is dropped. On error the loader is unchanged.
    pub fn resume(&mut self, state: SamplerState) -> Result<(), LoaderError> {
        let hint_steps = self.steps.hint_steps;
        *self = Self::build(self.place.clone(), state)?;
        self.steps.hint_steps = hint_steps;
        Ok(())
    }

    /// Reads the steps of `schedule` from now on; what was read ahead is
    /// dropped.
    pub fn set_schedule(&mut self, schedule: StepSchedule) {
        self.steps.set(schedule);
    }

    /// Whether every step of the schedule has been returned.
    pub fn finished(&self) -> bool {
        self.steps.finished()
    }

    /// The state after the last batch returned: saving it and building a
    /// loader from it yields the next batch next.
    pub fn state(&self) -> SamplerState {
        self.state.clone()
    }

    /// Tells the node, as the loader goes, which ranges the next `steps`
    /// steps will read (`prefetch_steps`): a source-backed dataset then
    /// fills them from its source ahead of the reads. The loader knows
    /// every future step's samples; no shard-level guess is needed.
    pub fn set_prefetch_steps(&mut self, steps: usize) {
        self.steps.hint_steps = steps.min(PREFETCH_STEPS_MAX);
    }

    /// The next step's batch. Keeps `prefetch` steps in flight.
    pub async fn next_batch(&mut self) -> Result<B, LoaderError> {
        self.issue_ahead()?;
        let batch = self.steps.next().await?;
        advance(&mut self.state, batch.step());
        Ok(batch)
    }

    /// Issues the steps the read-ahead depth allows, then tells the node of
    /// the steps beyond them.
    fn issue_ahead(&mut self) -> Result<(), LoaderError> {
        while let Some(step) = self.steps.to_issue() {
            self.issue(step)?;
        }
        // After the reads it waits on, so they fetch first.
        self.hint_ahead()
    }

    /// The samples of this rank's part of `step`, in batch order.
    fn samples_of_step(&mut self, step: u64) -> Result<Vec<u64>, LoaderError> {
        let slice = rank_slice(step, self.state.global_batch, self.place.rank, self.place.world)?;
        Ok(slice.map(|global| self.sampler.index(global)).collect())
    }

    /// Where sample `sample` lies in the dataset.
    fn extent(&self, sample: u64) -> Result<(u64, u32), LoaderError> {
        match &self.place.samples {
            Samples::Windows => {
                // `build` checked that a window's bytes fit a u32.
                let len = self.state.window * self.state.element_bytes;
                Ok((sample * u64::from(self.state.element_bytes), len))
            }
            Samples::Records(index) => {
                let records = index.len() as u64;
                let &(offset, len) = index.get(sample as usize).ok_or(LoaderError::Index { index: sample, records })?;
                let len = u32::try_from(len).map_err(|_| LoaderError::Index { index: sample, records })?;
                Ok((offset, len))
            }
        }
    }

    fn issue(&mut self, step: u64) -> Result<(), LoaderError> {
        let samples = self.samples_of_step(step)?;
        let mut ranges = Vec::with_capacity(samples.len());
        let mut offsets = Vec::with_capacity(samples.len() + 1);
        let mut dest = 0u64;
        for &sample in &samples {
            let (offset, len) = self.extent(sample)?;
            offsets.push(dest as usize);
            ranges.push(ReadRange { offset, len, dest });
            dest += u64::from(len);
        }
        offsets.push(dest as usize);
        let dataset = Arc::clone(&self.place.dataset);
        let state = self.state.clone();
        let task = tokio::spawn(async move {
            let mut data = vec![0u8; dest as usize];
            let statuses = dataset.read_batch(&ranges, &mut data).await?;
            if let Some(bad) = statuses.iter().position(|s| *s != RangeStatus::Ok) {
                return Err(LoaderError::Read { step, start: samples[bad], status: statuses[bad].name() });
            }
            Ok(B::assemble(step, samples, offsets, data, &state))
        });
        self.steps.issued(step, task);
        Ok(())
    }

    fn hint_ahead(&mut self) -> Result<(), LoaderError> {
        let mut ranges = Vec::new();
        for step in self.steps.take_hint() {
            for sample in self.samples_of_step(step)? {
                ranges.push(self.extent(sample)?);
            }
        }
        self.place.dataset.prefetch_hint(ranges);
        Ok(())
    }
}

/// Moves a state past `step`.
fn advance(state: &mut SamplerState, step: u64) {
    state.next_sample = (step + 1) * state.global_batch;
    state.epoch = state.next_sample / state.samples_per_epoch;
}
