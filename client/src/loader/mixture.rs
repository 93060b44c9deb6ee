//! Several datasets mixed in fixed shares per step, Mosaic Streaming's
//! `batching_method="stratified"`: step `s` of a [`Mixture`] is step `s` of
//! each dataset's own loader, so its share is that loader's global batch in
//! every step, exactly.
//!
//! Each loader's sequence runs on past its epoch, into the next epoch's
//! order, so a dataset whose share reads it faster is simply read again
//! sooner; nothing is rescaled and no sample of a step depends on another
//! dataset. What one loader promises therefore holds for the mixture
//! unchanged: a worker schedule ([`StepSchedule`]) reads the same steps of
//! every dataset, the order does not depend on the worker count, and the
//! state is each loader's state.
//!
//! The same mixture in Python is `sluice.torch.MixtureDataset`.
//!
//! ```no_run
//! # async fn mix() -> Result<(), Box<dyn std::error::Error>> {
//! use std::sync::Arc;
//!
//! use sluice_client::loader::{RecordLoader, RecordLoaderConfig, RecordMixture};
//!
//! let client = sluice_client::Client::connect("http://127.0.0.1:7070").await?;
//! let mut loaders = Vec::new();
//! // Six `web` records and two `code` records in every step.
//! for (name, share) in [("web", 6), ("code", 2)] {
//!     let dataset = Arc::new(client.open(name).await?);
//!     let index = dataset.record_index().await?.into();
//!     let config =
//!         RecordLoaderConfig { global_batch: share, rank: 0, world: 1, seed: 8, samples_per_epoch: None, prefetch: 4 };
//!     loaders.push(RecordLoader::new(dataset, index, &config)?);
//! }
//! let mut mixture = RecordMixture::new(loaders)?;
//! let batches = mixture.next_batch().await?;
//! assert_eq!((batches[0].records.len(), batches[1].records.len()), (6, 2));
//! let saved = mixture.state(); // one `SamplerState` per dataset
//! mixture.resume(saved)?; // where a restarted job goes on: step 1
//! # Ok(())
//! # }
//! ```

use super::{advance, Loader, LoaderError, StepBatch, StepSchedule};
use crate::sampler::SamplerState;

/// Loaders of several datasets stepped together: each step yields one batch
/// per dataset, in the order given.
pub struct Mixture<B> {
    streams: Vec<Loader<B>>,
}

impl<B: StepBatch> Mixture<B> {
    /// Mixes `streams`, which stand at the same step and read for the same
    /// rank of the same world size. Their batch sizes are the shares. Their
    /// schedules become the mixture's: every step from the one they stand
    /// at, until [`Mixture::set_schedule`].
    pub fn new(mut streams: Vec<Loader<B>>) -> Result<Self, LoaderError> {
        let first = one_step(streams.iter().map(|s| &s.state))?;
        let (rank, world) = (streams[0].place.rank, streams[0].place.world);
        if let Some(other) = streams.iter().find(|s| (s.place.rank, s.place.world) != (rank, world)) {
            return Err(LoaderError::MixtureRanks {
                first: (rank, world),
                other: (other.place.rank, other.place.world),
            });
        }
        for stream in &mut streams {
            stream.set_schedule(StepSchedule::from(first));
        }
        Ok(Self { streams })
    }

    /// The next step's batches, one per dataset in the mixture's order.
    /// Every dataset's reads of the coming steps are issued before the
    /// mixture waits on any of them.
    ///
    /// An error leaves the state where the last batches returned left it:
    /// a mixture built from [`Mixture::state`] reads the failed step again.
    pub async fn next_batch(&mut self) -> Result<Vec<B>, LoaderError> {
        for stream in &mut self.streams {
            stream.issue_ahead()?;
        }
        let mut batches = Vec::with_capacity(self.streams.len());
        for stream in &mut self.streams {
            batches.push(stream.steps.next().await?);
        }
        // Advanced only once every dataset's batch is in: the states never
        // stand at different steps.
        for (stream, batch) in self.streams.iter_mut().zip(&batches) {
            assert_eq!(batch.step(), batches[0].step(), "the streams read one step");
            advance(&mut stream.state, batch.step());
        }
        Ok(batches)
    }

    /// One state per dataset, in the mixture's order: the state after the
    /// last batches returned.
    pub fn state(&self) -> Vec<SamplerState> {
        self.streams.iter().map(Loader::state).collect()
    }

    /// Continues exactly where `states` (from [`Mixture::state`]) were
    /// saved: one per dataset, in the same order, at one step. What was
    /// read ahead is dropped, and the schedule is every step from there.
    /// On error the mixture is unchanged.
    pub fn resume(&mut self, states: Vec<SamplerState>) -> Result<(), LoaderError> {
        if states.len() != self.streams.len() {
            return Err(LoaderError::MixtureStates { states: states.len(), streams: self.streams.len() });
        }
        // The rank and world size stay the streams' own, checked in `new`.
        one_step(states.iter())?;
        let resumed = states
            .into_iter()
            .zip(&self.streams)
            .map(|(state, stream)| {
                let mut resumed = Loader::build(stream.place.clone(), state)?;
                resumed.steps.hint_steps = stream.steps.hint_steps;
                Ok(resumed)
            })
            .collect::<Result<Vec<_>, LoaderError>>()?;
        self.streams = resumed;
        Ok(())
    }

    /// Reads the steps of `schedule` of every dataset from now on; what was
    /// read ahead is dropped.
    pub fn set_schedule(&mut self, schedule: StepSchedule) {
        for stream in &mut self.streams {
            stream.set_schedule(schedule);
        }
    }

    /// Tells the node the ranges of every dataset's next `steps` steps
    /// ([`Loader::set_prefetch_steps`]).
    pub fn set_prefetch_steps(&mut self, steps: usize) {
        for stream in &mut self.streams {
            stream.set_prefetch_steps(steps);
        }
    }

    /// Whether every step of the schedule has been returned.
    pub fn finished(&self) -> bool {
        // Set together and advanced together: one stream speaks for all.
        self.streams[0].finished()
    }
}

/// The one step a mixture's states stand at: there is at least one state,
/// and all stand at the same step.
fn one_step<'a>(mut states: impl Iterator<Item = &'a SamplerState>) -> Result<u64, LoaderError> {
    let first = states.next().ok_or(LoaderError::EmptyMixture)?.step();
    match states.find(|state| state.step() != first) {
        Some(other) => Err(LoaderError::MixtureSteps { first, other: other.step() }),
        None => Ok(first),
    }
}
