//! Python bindings of the sluice client (`sluice._native`). The Python
//! package `sluice` wraps these into NumPy arrays and the PyTorch adapter.
//! Every call that waits on the network releases the GIL.

use std::sync::Arc;

use pyo3::exceptions::{PyIOError, PyStopIteration, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyBytes;
use sluice_client::loader::{WindowLoader as RustLoader, WindowLoaderConfig};
use sluice_client::sampler::SamplerState;
use sluice_client::{OpenOptions, RangeStatus, ReadRange};

fn io_err(err: impl std::fmt::Display) -> PyErr {
    PyIOError::new_err(err.to_string())
}

type Runtime = Arc<tokio::runtime::Runtime>;

/// A connection to one node, found through its control API.
#[pyclass(module = "sluice._native")]
struct Client {
    runtime: Runtime,
    inner: Arc<sluice_client::Client>,
}

#[pymethods]
impl Client {
    /// `transport`: "auto" (RDMA when possible), "rdma" or "tcp"; when
    /// omitted, `SLUICE_TRANSPORT` or "auto". `ca_file` (PEM) is the CA an
    /// `https://` node's certificate chains to, `cert_file` and `key_file`
    /// this client's certificate for mTLS; when omitted, `SLUICE_CA_FILE`,
    /// `SLUICE_CERT_FILE` and `SLUICE_KEY_FILE`.
    #[new]
    #[pyo3(signature = (endpoint, transport = None, ca_file = None, cert_file = None, key_file = None))]
    fn new(
        py: Python<'_>,
        endpoint: String,
        transport: Option<String>,
        ca_file: Option<std::path::PathBuf>,
        cert_file: Option<std::path::PathBuf>,
        key_file: Option<std::path::PathBuf>,
    ) -> PyResult<Self> {
        let choice = transport
            .map(|t| t.parse::<sluice_client::TransportChoice>())
            .transpose()
            .map_err(pyo3::exceptions::PyValueError::new_err)?;
        let mut tls = sluice_client::http::tls_files_from_env().map_err(pyo3::exceptions::PyValueError::new_err)?;
        if ca_file.is_some() {
            tls.ca = ca_file;
        }
        match (cert_file, key_file) {
            (Some(cert), Some(key)) => tls.identity = Some((cert, key)),
            (None, None) => {}
            _ => return Err(pyo3::exceptions::PyValueError::new_err("cert_file and key_file go together")),
        }
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("sluice-client")
            .enable_all()
            .build()
            .map_err(io_err)?;
        let connect = async {
            let choice = match choice {
                Some(choice) => choice,
                None => match std::env::var(sluice_client::TRANSPORT_ENV) {
                    Ok(value) if !value.is_empty() => value.parse().map_err(sluice_client::ClientError::Rdma)?,
                    _ => sluice_client::TransportChoice::Auto,
                },
            };
            sluice_client::Client::connect_tls(&endpoint, choice, tls).await
        };
        let inner = py.allow_threads(|| runtime.block_on(connect)).map_err(io_err)?;
        Ok(Self { runtime: Arc::new(runtime), inner: Arc::new(inner) })
    }

    #[getter]
    fn transport(&self) -> &'static str {
        self.inner.transport()
    }

    /// Why that transport (the RDMA device used, or why not RDMA).
    #[getter]
    fn transport_reason(&self) -> String {
        self.inner.transport_reason().to_string()
    }

    #[pyo3(signature = (name, verify_chunks = false, token = None))]
    fn open(&self, py: Python<'_>, name: String, verify_chunks: bool, token: Option<String>) -> PyResult<Dataset> {
        let client = Arc::clone(&self.inner);
        let options = OpenOptions { verify_chunks, token };
        let inner = py.allow_threads(|| self.runtime.block_on(client.open_with(&name, options))).map_err(io_err)?;
        Ok(Dataset { runtime: Arc::clone(&self.runtime), inner: Arc::new(inner), name })
    }
}

/// An open, sealed dataset.
#[pyclass(module = "sluice._native")]
struct Dataset {
    runtime: Runtime,
    inner: Arc<sluice_client::Dataset>,
    name: String,
}

#[pymethods]
impl Dataset {
    #[getter]
    fn name(&self) -> &str {
        &self.name
    }

    #[getter]
    fn kind(&self) -> &str {
        &self.inner.info().kind
    }

    #[getter]
    fn length_bytes(&self) -> u64 {
        self.inner.len_bytes()
    }

    #[getter]
    fn content_hash(&self) -> &str {
        &self.inner.info().content_hash
    }

    /// Reads `(offset, len)` ranges in one batch; returns their bytes
    /// concatenated in order. Raises if any range fails, naming it.
    fn read_batch<'py>(&self, py: Python<'py>, ranges: Vec<(u64, u32)>) -> PyResult<Bound<'py, PyBytes>> {
        let mut dest = 0u64;
        let ranges: Vec<ReadRange> = ranges
            .into_iter()
            .map(|(offset, len)| {
                let range = ReadRange { offset, len, dest };
                dest += u64::from(len);
                range
            })
            .collect();
        let dataset = Arc::clone(&self.inner);
        let mut buf = vec![0u8; dest as usize];
        let statuses =
            py.allow_threads(|| self.runtime.block_on(dataset.read_batch(&ranges, &mut buf))).map_err(io_err)?;
        if let Some(bad) = statuses.iter().position(|s| *s != RangeStatus::Ok) {
            let r = ranges[bad];
            return Err(PyValueError::new_err(format!(
                "range {bad} ({} bytes at {}): {}",
                r.len,
                r.offset,
                statuses[bad].name()
            )));
        }
        Ok(PyBytes::new(py, &buf))
    }
}

/// Deterministic random windows with prefetch and exact resume.
#[pyclass(module = "sluice._native")]
struct WindowLoader {
    runtime: Runtime,
    dataset: Arc<sluice_client::Dataset>,
    inner: Option<RustLoader>,
    rank: u32,
    world: u32,
    prefetch: usize,
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
        let _guard = dataset.runtime.enter();
        let inner =
            RustLoader::new(Arc::clone(&dataset.inner), &config).map_err(|e| PyValueError::new_err(e.to_string()))?;
        let token_bytes = inner.state().element_bytes;
        Ok(Self {
            runtime: Arc::clone(&dataset.runtime),
            dataset: Arc::clone(&dataset.inner),
            inner: Some(inner),
            rank,
            world: world_size,
            prefetch,
            last_starts: Vec::new(),
            token_bytes,
            window,
        })
    }

    /// The next step: `(step, tokens as little-endian bytes, rows)`.
    fn next_batch<'py>(&mut self, py: Python<'py>) -> PyResult<(u64, Bound<'py, PyBytes>, usize)> {
        let loader = self.inner.as_mut().ok_or_else(|| PyStopIteration::new_err("loader closed"))?;
        let runtime = Arc::clone(&self.runtime);
        let batch = py.allow_threads(|| runtime.block_on(loader.next_batch())).map_err(io_err)?;
        let rows = batch.starts.len();
        self.last_starts = batch.starts;
        Ok((batch.step, PyBytes::new(py, &batch.data), rows))
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
        let loader = self.inner.as_ref().ok_or_else(|| PyValueError::new_err("loader closed"))?;
        loader.state().to_json().map_err(|e| PyValueError::new_err(e.to_string()))
    }

    /// The 92-byte binary state.
    fn state_bytes<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyBytes>> {
        let loader = self.inner.as_ref().ok_or_else(|| PyValueError::new_err("loader closed"))?;
        let bytes = loader.state().encode().map_err(|e| PyValueError::new_err(e.to_string()))?;
        Ok(PyBytes::new(py, &bytes))
    }

    /// Continues exactly where the state was saved (at this loader's rank
    /// and world size; the state's global batch wins).
    fn load_state_json(&mut self, text: &str) -> PyResult<()> {
        let state = SamplerState::from_json(text).map_err(|e| PyValueError::new_err(e.to_string()))?;
        let _guard = self.runtime.enter();
        let loader = RustLoader::from_state(Arc::clone(&self.dataset), state, self.rank, self.world, self.prefetch)
            .map_err(|e| PyValueError::new_err(e.to_string()))?;
        self.inner = Some(loader);
        Ok(())
    }
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Client>()?;
    m.add_class::<Dataset>()?;
    m.add_class::<WindowLoader>()?;
    Ok(())
}
