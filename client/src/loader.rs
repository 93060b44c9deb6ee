//! The window loader a training loop iterates: each step it yields this
//! rank's slice of the global batch as one contiguous `(batch, window)`
//! token array, with `prefetch` steps already in flight so the loop never
//! waits on I/O it could have issued earlier.

use std::collections::VecDeque;
use std::sync::Arc;

use tokio::task::JoinHandle;

use crate::sampler::{rank_slice, window_domain, IndexSampler, SamplerError, SamplerKind, SamplerState};
use crate::{ClientError, Dataset, RangeStatus, ReadRange};

/// Most steps a loader keeps in flight.
pub const PREFETCH_MAX: usize = 64;

/// Most steps ahead a loader tells the node of.
pub const PREFETCH_STEPS_MAX: usize = 1024;

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
}

/// Which steps a loader reads: `first`, `first + stride`, ... up to (not
/// including) `end`. DataLoader worker `w` of `W` reads steps `w, w + W,
/// ...`: the workers' batches taken in worker order, as a DataLoader takes
/// them, are the steps in order, so no step is read twice or skipped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StepSchedule {
    pub first: u64,
    pub stride: u64,
    pub end: Option<u64>,
}

impl StepSchedule {
    /// Every step from `first` on.
    pub fn from(first: u64) -> Self {
        Self { first, stride: 1, end: None }
    }

    fn after(&self, step: u64) -> u64 {
        step.saturating_add(self.stride.max(1))
    }

    fn includes(&self, step: u64) -> bool {
        self.end.is_none_or(|end| step < end)
    }
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

pub struct WindowLoader {
    dataset: Arc<Dataset>,
    sampler: IndexSampler,
    state: SamplerState,
    rank: u32,
    world: u32,
    steps: Steps<TokenBatch>,
}

impl WindowLoader {
    /// A loader starting at step 0 of epoch 0.
    pub fn new(dataset: Arc<Dataset>, config: &WindowLoaderConfig) -> Result<Self, LoaderError> {
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
        if state.kind != SamplerKind::Window {
            return Err(LoaderError::WrongSampler);
        }
        if state.content_hash != dataset.info().content_hash {
            return Err(LoaderError::WrongDataset {
                state: state.content_hash.clone(),
                dataset: dataset.info().content_hash.clone(),
            });
        }
        rank_slice(0, state.global_batch, rank, world)?;
        let domain = window_domain(state.domain_len, u64::from(state.window))?;
        let sampler = IndexSampler::new(domain, state.samples_per_epoch, state.seed)?;
        let steps = Steps::new(state.step(), prefetch);
        Ok(Self { dataset, sampler, state, rank, world, steps })
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

    /// Token starts of this rank's part of `step`.
    pub fn starts_of_step(&mut self, step: u64) -> Result<Vec<u64>, LoaderError> {
        let slice = rank_slice(step, self.state.global_batch, self.rank, self.world)?;
        Ok(slice.map(|g| self.sampler.index(g)).collect())
    }

    fn issue(&mut self, step: u64) -> Result<(), LoaderError> {
        let starts = self.starts_of_step(step)?;
        let token_bytes = self.state.element_bytes;
        let window_tokens = self.state.window;
        let len = window_tokens * token_bytes;
        let dataset = Arc::clone(&self.dataset);
        let task = tokio::spawn(async move {
            let ranges: Vec<ReadRange> = starts
                .iter()
                .enumerate()
                .map(|(i, &s)| ReadRange { offset: s * u64::from(token_bytes), len, dest: i as u64 * u64::from(len) })
                .collect();
            let mut data = vec![0u8; ranges.len() * len as usize];
            let statuses = dataset.read_batch(&ranges, &mut data).await?;
            if let Some(bad) = statuses.iter().position(|s| *s != RangeStatus::Ok) {
                return Err(LoaderError::Read { step, start: starts[bad], status: statuses[bad].name() });
            }
            Ok(TokenBatch { step, starts, data, window_tokens, token_bytes })
        });
        self.steps.issued(step, task);
        Ok(())
    }

    /// Tells the node, as the loader goes, which ranges the next `steps`
    /// steps will read (`prefetch_steps`): a source-backed dataset then
    /// fills them from its source ahead of the reads. The loader knows
    /// every future step's samples; no shard-level guess is needed.
    pub fn set_prefetch_steps(&mut self, steps: usize) {
        self.steps.hint_steps = steps.min(PREFETCH_STEPS_MAX);
    }

    fn hint_ahead(&mut self) -> Result<(), LoaderError> {
        let len = self.state.window * self.state.element_bytes;
        let mut ranges = Vec::new();
        for step in self.steps.take_hint() {
            let starts = self.starts_of_step(step)?;
            ranges.extend(starts.iter().map(|&s| (s * u64::from(self.state.element_bytes), len)));
        }
        self.dataset.prefetch_hint(ranges);
        Ok(())
    }

    /// The next step's batch. Keeps `prefetch` steps in flight.
    pub async fn next_batch(&mut self) -> Result<TokenBatch, LoaderError> {
        while let Some(step) = self.steps.to_issue() {
            self.issue(step)?;
        }
        // After the reads it waits on, so they fetch first.
        self.hint_ahead()?;
        let batch = self.steps.next().await?;
        advance(&mut self.state, batch.step);
        Ok(batch)
    }
}

/// Moves a state past `step`.
fn advance(state: &mut SamplerState, step: u64) {
    state.next_sample = (step + 1) * state.global_batch;
    state.epoch = state.next_sample / state.samples_per_epoch;
}

/// Where a loader's schedule stands: the next step to read and the steps
/// read ahead. Both loaders keep one.
struct Steps<T> {
    schedule: StepSchedule,
    next_issue: u64,
    in_flight: Prefetch<T>,
    /// Steps ahead of the next read whose ranges are told to the node.
    hint_steps: usize,
    /// Steps before this were hinted already.
    hinted_to: u64,
}

impl<T> Steps<T> {
    fn new(first: u64, prefetch: usize) -> Self {
        Self {
            schedule: StepSchedule::from(first),
            next_issue: first,
            in_flight: Prefetch::new(prefetch),
            hint_steps: 0,
            hinted_to: first,
        }
    }

    /// The steps of the next `hint_steps` not hinted yet.
    fn take_hint(&mut self) -> Vec<u64> {
        let mut steps = Vec::new();
        let mut step = self.next_issue;
        for _ in 0..self.hint_steps {
            if !self.schedule.includes(step) {
                break;
            }
            if step >= self.hinted_to {
                steps.push(step);
            }
            step = self.schedule.after(step);
        }
        self.hinted_to = self.hinted_to.max(step);
        steps
    }

    fn set(&mut self, schedule: StepSchedule) {
        self.in_flight.clear();
        self.schedule = schedule;
        self.next_issue = schedule.first;
        self.hinted_to = schedule.first;
    }

    fn finished(&self) -> bool {
        self.in_flight.is_empty() && !self.schedule.includes(self.next_issue)
    }

    /// The next step to read, if the schedule has one and the read-ahead
    /// depth allows it.
    fn to_issue(&self) -> Option<u64> {
        (self.in_flight.wants_more() && self.schedule.includes(self.next_issue)).then_some(self.next_issue)
    }

    fn issued(&mut self, step: u64, task: JoinHandle<Result<T, LoaderError>>) {
        self.in_flight.push(task);
        self.next_issue = self.schedule.after(step);
    }

    /// The oldest step read ahead; `End` once the schedule is done.
    async fn next(&mut self) -> Result<T, LoaderError> {
        if self.in_flight.is_empty() {
            return Err(LoaderError::End(self.next_issue));
        }
        self.in_flight.next().await
    }
}

/// Steps read ahead, in order; aborted when dropped.
struct Prefetch<T> {
    depth: usize,
    tasks: VecDeque<JoinHandle<Result<T, LoaderError>>>,
}

impl<T> Prefetch<T> {
    fn new(depth: usize) -> Self {
        let depth = depth.clamp(1, PREFETCH_MAX);
        Self { depth, tasks: VecDeque::with_capacity(depth) }
    }

    fn wants_more(&self) -> bool {
        self.tasks.len() < self.depth
    }

    fn is_empty(&self) -> bool {
        self.tasks.is_empty()
    }

    /// Drops (aborts) every step read ahead.
    fn clear(&mut self) {
        for task in self.tasks.drain(..) {
            task.abort();
        }
    }

    fn push(&mut self, task: JoinHandle<Result<T, LoaderError>>) {
        assert!(self.tasks.len() < self.depth, "prefetch beyond its depth");
        self.tasks.push_back(task);
    }

    async fn next(&mut self) -> Result<T, LoaderError> {
        let task = self.tasks.pop_front().expect("at least one step in flight");
        task.await.map_err(|e| LoaderError::Task(e.to_string()))?
    }
}

impl<T> Drop for Prefetch<T> {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

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

/// Configuration of a [`RecordLoader`].
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

/// Shuffled records of a `records` or `wds` dataset with the same keyed
/// bijection, state and prefetch as the [`WindowLoader`]: one batch read
/// per step, whatever the records' sizes.
pub struct RecordLoader {
    dataset: Arc<Dataset>,
    index: Arc<[(u64, u64)]>,
    sampler: IndexSampler,
    state: SamplerState,
    rank: u32,
    world: u32,
    steps: Steps<RecordBatch>,
}

impl RecordLoader {
    /// A loader at step 0; `index` is the dataset's record index.
    pub fn new(
        dataset: Arc<Dataset>,
        index: Arc<[(u64, u64)]>,
        config: &RecordLoaderConfig,
    ) -> Result<Self, LoaderError> {
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
        if state.kind != SamplerKind::Record {
            return Err(LoaderError::WrongSampler);
        }
        if state.content_hash != dataset.info().content_hash || state.domain_len != index.len() as u64 {
            return Err(LoaderError::WrongDataset {
                state: state.content_hash.clone(),
                dataset: dataset.info().content_hash.clone(),
            });
        }
        rank_slice(0, state.global_batch, rank, world)?;
        let sampler = IndexSampler::new(state.domain_len, state.samples_per_epoch, state.seed)?;
        let steps = Steps::new(state.step(), prefetch);
        Ok(Self { dataset, index, sampler, state, rank, world, steps })
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

    pub fn state(&self) -> SamplerState {
        self.state.clone()
    }

    fn issue(&mut self, step: u64) -> Result<(), LoaderError> {
        let slice = rank_slice(step, self.state.global_batch, self.rank, self.world)?;
        let records: Vec<u64> = slice.map(|g| self.sampler.index(g)).collect();
        let mut ranges = Vec::with_capacity(records.len());
        let mut offsets = Vec::with_capacity(records.len() + 1);
        let mut dest = 0u64;
        for &record in &records {
            let (offset, len) = self.index[record as usize];
            let len = u32::try_from(len).map_err(|_| LoaderError::Index { index: record, records: 0 })?;
            offsets.push(dest as usize);
            ranges.push(ReadRange { offset, len, dest });
            dest += u64::from(len);
        }
        offsets.push(dest as usize);
        let dataset = Arc::clone(&self.dataset);
        let task = tokio::spawn(async move {
            let mut data = vec![0u8; dest as usize];
            let statuses = dataset.read_batch(&ranges, &mut data).await?;
            if let Some(bad) = statuses.iter().position(|s| *s != RangeStatus::Ok) {
                return Err(LoaderError::Read { step, start: records[bad], status: statuses[bad].name() });
            }
            Ok(RecordBatch { step, records, data, offsets })
        });
        self.steps.issued(step, task);
        Ok(())
    }

    /// As [`WindowLoader::set_prefetch_steps`]: the node fills the records
    /// of the next `steps` steps ahead of their reads.
    pub fn set_prefetch_steps(&mut self, steps: usize) {
        self.steps.hint_steps = steps.min(PREFETCH_STEPS_MAX);
    }

    fn hint_ahead(&mut self) -> Result<(), LoaderError> {
        let mut ranges = Vec::new();
        for step in self.steps.take_hint() {
            let slice = rank_slice(step, self.state.global_batch, self.rank, self.world)?;
            for global in slice {
                let record = self.sampler.index(global);
                let (offset, len) = self.index[record as usize];
                ranges
                    .push((offset, u32::try_from(len).map_err(|_| LoaderError::Index { index: record, records: 0 })?));
            }
        }
        self.dataset.prefetch_hint(ranges);
        Ok(())
    }

    pub async fn next_batch(&mut self) -> Result<RecordBatch, LoaderError> {
        while let Some(step) = self.steps.to_issue() {
            self.issue(step)?;
        }
        // After the reads it waits on, so they fetch first.
        self.hint_ahead()?;
        let batch = self.steps.next().await?;
        advance(&mut self.state, batch.step);
        Ok(batch)
    }
}
