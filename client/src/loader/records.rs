//! Records of a `records`, `wds` or `mds` dataset: sample `s` is entry `s` of
//! the dataset's record index.

use std::sync::Arc;

use super::{Loader, LoaderError, Samples, StepBatch, Where};
use crate::sampler::{SamplerKind, SamplerState};
use crate::Dataset;

/// Configuration of a record loader ([`Loader<RecordBatch>`](Loader)).
#[derive(Clone, Debug)]
pub struct RecordLoaderConfig {
    pub global_batch: u64,
    pub rank: u32,
    pub world: u32,
    pub seed: u64,
    /// Samples per epoch; `None` takes every record once.
    pub samples_per_epoch: Option<u64>,
    pub prefetch: usize,
}

/// One step's records for one rank, concatenated.
#[derive(Clone, Debug)]
pub struct RecordBatch {
    pub step: u64,
    /// Record numbers, in batch order.
    pub records: Vec<u64>,
    pub data: Vec<u8>,
    /// `records.len() + 1` offsets of each record's bytes in `data`.
    pub offsets: Vec<usize>,
}

impl RecordBatch {
    pub fn sample(&self, i: usize) -> &[u8] {
        &self.data[self.offsets[i]..self.offsets[i + 1]]
    }
}

impl StepBatch for RecordBatch {
    const KIND: SamplerKind = SamplerKind::Record;

    fn assemble(step: u64, records: Vec<u64>, offsets: Vec<usize>, data: Vec<u8>, _: &SamplerState) -> Self {
        Self { step, records, data, offsets }
    }

    fn step(&self) -> u64 {
        self.step
    }
}

impl Loader<RecordBatch> {
    /// A loader of records at step 0; `index` is the dataset's record index.
    pub fn new(
        dataset: Arc<Dataset>,
        index: Arc<[(u64, u64)]>,
        config: &RecordLoaderConfig,
    ) -> Result<Self, LoaderError> {
        if config.samples_per_epoch == Some(0) {
            return Err(LoaderError::EmptyEpoch);
        }
        let records = index.len() as u64;
        let state = SamplerState {
            content_hash: dataset.info().content_hash.clone(),
            kind: SamplerKind::Record,
            element_bytes: 1,
            domain_len: records,
            window: 1,
            samples_per_epoch: config.samples_per_epoch.unwrap_or(records).min(records),
            seed: config.seed,
            global_batch: config.global_batch,
            epoch: 0,
            next_sample: 0,
        };
        Self::from_state(dataset, index, state, config.rank, config.world, config.prefetch)
    }

    pub fn from_state(
        dataset: Arc<Dataset>,
        index: Arc<[(u64, u64)]>,
        state: SamplerState,
        rank: u32,
        world: u32,
        prefetch: usize,
    ) -> Result<Self, LoaderError> {
        Self::build(Where { dataset, samples: Samples::Records(index), rank, world, prefetch }, state)
    }

    /// Records in the dataset's index.
    pub fn records(&self) -> usize {
        match &self.place.samples {
            Samples::Records(index) => index.len(),
            Samples::Windows => 0,
        }
    }
}
