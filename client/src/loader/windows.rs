//! Token windows: sample `s` is `window` tokens from token `s`.

use std::sync::Arc;

use super::{Loader, LoaderError, Samples, StepBatch, Where};
use crate::sampler::{window_domain, SamplerKind, SamplerState};
use crate::Dataset;

#[derive(Clone, Debug)]
pub struct WindowLoaderConfig {
    pub window_tokens: u32,
    /// Samples per step over all ranks; a multiple of `world`.
    pub global_batch: u64,
    pub rank: u32,
    pub world: u32,
    pub seed: u64,
    /// Samples per epoch; `None` takes one per `window_tokens` tokens
    /// (unless `stride_ratio` is set).
    pub samples_per_epoch: Option<u64>,
    /// `c` in m = n / c samples per epoch over n tokens; ignored when
    /// `samples_per_epoch` is set.
    pub stride_ratio: Option<f64>,
    /// Steps read ahead.
    pub prefetch: usize,
}

/// One step's tokens for one rank.
#[derive(Clone, Debug)]
pub struct TokenBatch {
    pub step: u64,
    /// Token offset of each window, in batch order.
    pub starts: Vec<u64>,
    /// `starts.len() * window_tokens` little-endian tokens, row-major.
    pub data: Vec<u8>,
    pub window_tokens: u32,
    pub token_bytes: u32,
}

fn token_bytes(kind: &str) -> Result<u32, LoaderError> {
    match kind {
        "tokens:u16" => Ok(2),
        "tokens:u32" => Ok(4),
        "bytes" => Ok(1),
        other => Err(LoaderError::Kind(other.to_string())),
    }
}

impl StepBatch for TokenBatch {
    const KIND: SamplerKind = SamplerKind::Window;

    fn assemble(step: u64, starts: Vec<u64>, _: Vec<usize>, data: Vec<u8>, state: &SamplerState) -> Self {
        Self { step, starts, data, window_tokens: state.window, token_bytes: state.element_bytes }
    }

    fn step(&self) -> u64 {
        self.step
    }
}

impl Loader<TokenBatch> {
    /// A loader of token windows starting at step 0 of epoch 0.
    pub fn new(dataset: Arc<Dataset>, config: &WindowLoaderConfig) -> Result<Self, LoaderError> {
        if config.samples_per_epoch == Some(0) {
            return Err(LoaderError::EmptyEpoch);
        }
        let token_bytes = token_bytes(&dataset.info().kind)?;
        let tokens = dataset.len_bytes() / u64::from(token_bytes);
        let window = u64::from(config.window_tokens);
        let domain = window_domain(tokens, window)?;
        let by_ratio = config.stride_ratio.filter(|c| *c > 0.0).map(|c| (tokens as f64 / c) as u64);
        let samples_per_epoch = config.samples_per_epoch.or(by_ratio).unwrap_or(tokens / window).clamp(1, domain);
        let state = SamplerState {
            content_hash: dataset.info().content_hash.clone(),
            kind: SamplerKind::Window,
            element_bytes: token_bytes,
            domain_len: tokens,
            window: config.window_tokens,
            samples_per_epoch,
            seed: config.seed,
            global_batch: config.global_batch,
            epoch: 0,
            next_sample: 0,
        };
        Self::from_state(dataset, state, config.rank, config.world, config.prefetch)
    }

    /// A loader that continues exactly where `state` was saved, possibly at
    /// another world size.
    pub fn from_state(
        dataset: Arc<Dataset>,
        state: SamplerState,
        rank: u32,
        world: u32,
        prefetch: usize,
    ) -> Result<Self, LoaderError> {
        Self::build(Where { dataset, samples: Samples::Windows, rank, world, prefetch }, state)
    }

    /// Token starts of this rank's part of `step`.
    pub fn starts_of_step(&mut self, step: u64) -> Result<Vec<u64>, LoaderError> {
        self.samples_of_step(step)
    }
}
