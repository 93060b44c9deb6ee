//! The window and record loaders: deterministic shuffles with prefetch,
//! exact resume from a saved state, and a step schedule, so each DataLoader
//! worker reads its own steps (`w, w + W, ...`) of its rank's sequence.

use std::sync::Arc;

use pyo3::exceptions::{PyStopIteration, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyBytes;
use sluice_client::loader::{
    Loader, LoaderError, RecordBatch, RecordLoader as RustRecords, RecordLoaderConfig, StepBatch, StepSchedule,
    TokenBatch, WindowLoader as RustWindows, WindowLoaderConfig,
};
use sluice_client::sampler::SamplerState;

use crate::errors;
use crate::process::ProcessLocal;
use crate::{Dataset, Runtime};

fn schedule(first: u64, stride: u64, end: Option<u64>) -> PyResult<StepSchedule> {
    if stride == 0 {
        return Err(PyValueError::new_err("a schedule's stride is at least 1"));
    }
    Ok(StepSchedule { first, stride, end })
}

fn parse_state(text: &str) -> PyResult<SamplerState> {
    SamplerState::from_json(text).map_err(|e| errors::StateMismatch::new_err(e.to_string()))
}

fn end_error(err: LoaderError) -> PyErr {
    match err {
        LoaderError::End(_) => PyStopIteration::new_err("the schedule has ended"),
        other => errors::loader(other),
    }
}

/// A loader and the runtime its reads run on: what each Python loader
/// class holds, in the process that made it.
struct Held<B> {
    runtime: Runtime,
    loader: Loader<B>,
}

impl<B: StepBatch> Held<B> {
    fn new(runtime: Runtime, make: impl FnOnce() -> Result<Loader<B>, LoaderError>) -> PyResult<ProcessLocal<Self>> {
        let loader = {
            let _guard = runtime.enter();
            make().map_err(errors::loader)?
        };
        Ok(ProcessLocal::new(Self { runtime, loader }))
    }

    /// The next step's batch, read with the GIL released.
    fn next(&mut self, py: Python<'_>) -> PyResult<B> {
        let runtime = Arc::clone(&self.runtime);
        let loader = &mut self.loader;
        py.allow_threads(|| runtime.block_on(loader.next_batch())).map_err(end_error)
    }

    fn set_schedule(&mut self, first: u64, stride: u64, end: Option<u64>) -> PyResult<()> {
        let schedule = schedule(first, stride, end)?;
        let _guard = self.runtime.enter();
        self.loader.set_schedule(schedule);
        Ok(())
    }

    fn state_json(&self) -> PyResult<String> {
        self.loader.state().to_json().map_err(|e| PyValueError::new_err(e.to_string()))
    }

    /// Continues exactly where the state was saved, at this loader's rank
    /// and world size (the state's global batch wins).
    fn load_state_json(&mut self, text: &str) -> PyResult<()> {
        let state = parse_state(text)?;
        let _guard = self.runtime.enter();
        self.loader.resume(state).map_err(errors::loader)
    }
}

/// Deterministic random windows with prefetch and exact resume.
#[pyclass(module = "sluice._native")]
pub struct WindowLoader {
    inner: ProcessLocal<Held<TokenBatch>>,
    last_starts: Vec<u64>,
    token_bytes: u32,
    window: u32,
}

#[pymethods]
impl WindowLoader {
    #[new]
    #[pyo3(signature = (dataset, window, batch_size, seed, rank = 0, world_size = 1, prefetch = 4, samples_per_epoch = None, stride_ratio = None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        dataset: &Dataset,
        window: u32,
        batch_size: u64,
        seed: u64,
        rank: u32,
        world_size: u32,
        prefetch: usize,
        samples_per_epoch: Option<u64>,
        stride_ratio: Option<f64>,
    ) -> PyResult<Self> {
        let config = WindowLoaderConfig {
            window_tokens: window,
            global_batch: batch_size * u64::from(world_size),
            rank,
            world: world_size,
            seed,
            samples_per_epoch,
            stride_ratio,
            prefetch,
        };
        let (runtime, dataset) = dataset.parts()?;
        let inner = Held::new(runtime, || RustWindows::new(dataset, &config))?;
        let token_bytes = inner.get()?.loader.state().element_bytes;
        Ok(Self { inner, last_starts: Vec::new(), token_bytes, window })
    }

    /// The next step: `(step, tokens as little-endian bytes, rows)`.
    fn next_batch<'py>(&mut self, py: Python<'py>) -> PyResult<(u64, Bound<'py, PyBytes>, usize)> {
        let batch = self.inner.get_mut()?.next(py)?;
        let rows = batch.starts.len();
        self.last_starts = batch.starts;
        Ok((batch.step, PyBytes::new(py, &batch.data), rows))
    }

    /// The next step's tokens written into the `length` bytes at `address`
    /// (a preallocated, possibly pinned, array the Python side holds for the
    /// call): `(step, rows)`. Raises if they do not fit.
    fn next_into(&mut self, py: Python<'_>, address: usize, length: usize) -> PyResult<(u64, usize)> {
        let batch = self.inner.get_mut()?.next(py)?;
        crate::write_to_address(py, address, length, &batch.data)?;
        let rows = batch.starts.len();
        self.last_starts = batch.starts;
        Ok((batch.step, rows))
    }

    /// Reads the steps `first, first + stride, ...` before `end` from now on.
    #[pyo3(signature = (first, stride = 1, end = None))]
    fn set_schedule(&mut self, first: u64, stride: u64, end: Option<u64>) -> PyResult<()> {
        self.inner.get_mut()?.set_schedule(first, stride, end)
    }

    /// Whether every step of the schedule has been returned.
    #[getter]
    fn finished(&self) -> PyResult<bool> {
        Ok(self.inner.get()?.loader.finished())
    }

    #[getter]
    fn last_starts(&self) -> Vec<u64> {
        self.last_starts.clone()
    }

    #[getter]
    fn token_bytes(&self) -> u32 {
        self.token_bytes
    }

    #[getter]
    fn window(&self) -> u32 {
        self.window
    }

    /// The sampler state as JSON: resume with `load_state_json`.
    fn state_json(&self) -> PyResult<String> {
        self.inner.get()?.state_json()
    }

    /// The 92-byte binary state.
    fn state_bytes<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyBytes>> {
        let state = self.inner.get()?.loader.state();
        let bytes = state.encode().map_err(|e| PyValueError::new_err(e.to_string()))?;
        Ok(PyBytes::new(py, &bytes))
    }

    /// Continues exactly where the state was saved (at this loader's rank
    /// and world size; the state's global batch wins).
    fn load_state_json(&mut self, text: &str) -> PyResult<()> {
        self.inner.get_mut()?.load_state_json(text)
    }

    /// Tells the node the ranges of the next `steps` steps as the loader
    /// goes, so a source-backed dataset fills them before they are read.
    fn set_prefetch_steps(&mut self, steps: usize) -> PyResult<()> {
        self.inner.get_mut()?.loader.set_prefetch_steps(steps);
        Ok(())
    }
}

/// Shuffled records of a `records`, `wds` or `mds` dataset, one batch read per step.
#[pyclass(module = "sluice._native")]
pub struct RecordLoader {
    inner: ProcessLocal<Held<RecordBatch>>,
}

#[pymethods]
impl RecordLoader {
    #[new]
    #[pyo3(signature = (dataset, batch_size, seed, rank = 0, world_size = 1, prefetch = 4, samples_per_epoch = None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        dataset: &Dataset,
        batch_size: u64,
        seed: u64,
        rank: u32,
        world_size: u32,
        prefetch: usize,
        samples_per_epoch: Option<u64>,
    ) -> PyResult<Self> {
        let (runtime, native) = dataset.parts()?;
        let kind = native.info().kind.clone();
        if !matches!(kind.as_str(), "records" | "wds" | "mds") {
            return Err(errors::WrongKind::new_err(format!(
                "dataset {} is {kind}: records are read from records, wds and mds datasets",
                dataset.name
            )));
        }
        let index: Arc<[(u64, u64)]> =
            py.allow_threads(|| runtime.block_on(native.record_index())).map_err(errors::client)?.into();
        let config = RecordLoaderConfig {
            global_batch: batch_size * u64::from(world_size),
            rank,
            world: world_size,
            seed,
            samples_per_epoch,
            prefetch,
        };
        let inner = Held::new(runtime, || RustRecords::new(native, index, &config))?;
        Ok(Self { inner })
    }

    /// The next step: `(step, bytes, offsets, record numbers)`, sample `i`
    /// being `bytes[offsets[i]:offsets[i + 1]]`.
    #[allow(clippy::type_complexity)]
    fn next_batch<'py>(&mut self, py: Python<'py>) -> PyResult<(u64, Bound<'py, PyBytes>, Vec<usize>, Vec<u64>)> {
        let batch = self.inner.get_mut()?.next(py)?;
        Ok((batch.step, PyBytes::new(py, &batch.data), batch.offsets, batch.records))
    }

    /// As `WindowLoader.set_schedule`.
    #[pyo3(signature = (first, stride = 1, end = None))]
    fn set_schedule(&mut self, first: u64, stride: u64, end: Option<u64>) -> PyResult<()> {
        self.inner.get_mut()?.set_schedule(first, stride, end)
    }

    #[getter]
    fn finished(&self) -> PyResult<bool> {
        Ok(self.inner.get()?.loader.finished())
    }

    #[getter]
    fn records(&self) -> PyResult<usize> {
        Ok(self.inner.get()?.loader.records())
    }

    fn state_json(&self) -> PyResult<String> {
        self.inner.get()?.state_json()
    }

    fn load_state_json(&mut self, text: &str) -> PyResult<()> {
        self.inner.get_mut()?.load_state_json(text)
    }

    /// As `WindowLoader.set_prefetch_steps`.
    fn set_prefetch_steps(&mut self, steps: usize) -> PyResult<()> {
        self.inner.get_mut()?.loader.set_prefetch_steps(steps);
        Ok(())
    }
}
