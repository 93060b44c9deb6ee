//! Python bindings of the sluice client (`sluice._native`). The Python
//! package `sluice` wraps these into NumPy arrays, plain iterators and the
//! PyTorch datasets. Every call that waits on the network releases the GIL,
//! and every object is [`ProcessLocal`]: after a fork the child connects
//! again instead of touching its parent's runtime.

mod errors;
mod loaders;
mod process;

use std::sync::Arc;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyBytes;
use sluice_client::{OpenOptions, RangeStatus, ReadRange};

use process::ProcessLocal;

type Runtime = Arc<tokio::runtime::Runtime>;

/// A connection to one node, found through its control API.
#[pyclass(module = "sluice._native")]
struct Client {
    inner: ProcessLocal<(Runtime, Arc<sluice_client::Client>)>,
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
            .map_err(PyValueError::new_err)?;
        let mut tls = sluice_client::http::tls_files_from_env().map_err(PyValueError::new_err)?;
        if ca_file.is_some() {
            tls.ca = ca_file;
        }
        match (cert_file, key_file) {
            (Some(cert), Some(key)) => tls.identity = Some((cert, key)),
            (None, None) => {}
            _ => return Err(PyValueError::new_err("cert_file and key_file go together")),
        }
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("sluice-client")
            .enable_all()
            .build()
            .map_err(|err| errors::SluiceError::new_err(err.to_string()))?;
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
        let inner = py.allow_threads(|| runtime.block_on(connect)).map_err(errors::client)?;
        Ok(Self { inner: ProcessLocal::new((Arc::new(runtime), Arc::new(inner))) })
    }

    #[getter]
    fn transport(&self) -> PyResult<&'static str> {
        Ok(self.inner.get()?.1.transport())
    }

    /// Why that transport (the RDMA device used, or why not RDMA).
    #[getter]
    fn transport_reason(&self) -> PyResult<String> {
        Ok(self.inner.get()?.1.transport_reason().to_string())
    }

    #[pyo3(signature = (name, verify_chunks = false, token = None))]
    fn open(&self, py: Python<'_>, name: String, verify_chunks: bool, token: Option<String>) -> PyResult<Dataset> {
        let (runtime, client) = self.inner.get()?;
        let options = OpenOptions { verify_chunks, token };
        let inner = py.allow_threads(|| runtime.block_on(client.open_with(&name, options))).map_err(errors::client)?;
        Ok(Dataset { inner: ProcessLocal::new((Arc::clone(runtime), Arc::new(inner))), name })
    }
}

/// An open, sealed dataset.
#[pyclass(module = "sluice._native")]
struct Dataset {
    inner: ProcessLocal<(Runtime, Arc<sluice_client::Dataset>)>,
    name: String,
}

impl Dataset {
    fn parts(&self) -> PyResult<(Runtime, Arc<sluice_client::Dataset>)> {
        let (runtime, dataset) = self.inner.get()?;
        Ok((Arc::clone(runtime), Arc::clone(dataset)))
    }

    /// Reads `(offset, len)` ranges laid end to end into a new buffer of
    /// their total size, failing on the first range that did not read.
    fn read_contiguous(&self, py: Python<'_>, ranges: Vec<(u64, u32)>) -> PyResult<Vec<u8>> {
        let mut dest = 0u64;
        let ranges: Vec<ReadRange> = ranges
            .into_iter()
            .map(|(offset, len)| {
                let range = ReadRange { offset, len, dest };
                dest += u64::from(len);
                range
            })
            .collect();
        let (runtime, dataset) = self.parts()?;
        let mut buf = vec![0u8; dest as usize];
        let statuses =
            py.allow_threads(|| runtime.block_on(dataset.read_batch(&ranges, &mut buf))).map_err(errors::client)?;
        if let Some(bad) = statuses.iter().position(|s| *s != RangeStatus::Ok) {
            let r = ranges[bad];
            return Err(errors::ReadFailed::new_err(format!(
                "range {bad} ({} bytes at {}) of {}: {}",
                r.len,
                r.offset,
                self.name,
                statuses[bad].name()
            )));
        }
        Ok(buf)
    }
}

#[pymethods]
impl Dataset {
    #[getter]
    fn name(&self) -> &str {
        &self.name
    }

    #[getter]
    fn kind(&self) -> PyResult<String> {
        Ok(self.inner.get()?.1.info().kind.clone())
    }

    #[getter]
    fn length_bytes(&self) -> PyResult<u64> {
        Ok(self.inner.get()?.1.len_bytes())
    }

    #[getter]
    fn content_hash(&self) -> PyResult<String> {
        Ok(self.inner.get()?.1.info().content_hash.clone())
    }

    /// Reads `(offset, len)` ranges in one batch; returns their bytes
    /// concatenated in order. Raises if any range fails, naming it.
    fn read_batch<'py>(&self, py: Python<'py>, ranges: Vec<(u64, u32)>) -> PyResult<Bound<'py, PyBytes>> {
        let buf = self.read_contiguous(py, ranges)?;
        Ok(PyBytes::new(py, &buf))
    }

    /// Reads `(offset, len)` ranges laid end to end into the `length`
    /// writable bytes at `address` (a NumPy array's or a tensor's memory,
    /// found by the Python side, which keeps the buffer alive across the
    /// call). Raises, writing nothing, if they need more than `length`.
    fn read_into_address(
        &self,
        py: Python<'_>,
        ranges: Vec<(u64, u32)>,
        address: usize,
        length: usize,
    ) -> PyResult<usize> {
        let needed: u64 = ranges.iter().map(|(_, len)| u64::from(*len)).sum();
        if needed > length as u64 {
            return Err(PyValueError::new_err(format!("the ranges need {needed} bytes and the buffer has {length}")));
        }
        let buf = self.read_contiguous(py, ranges)?;
        write_to_address(py, address, length, &buf)?;
        Ok(buf.len())
    }

    /// The `(offset, len)` of every sample of a `records`, `wds` or `mds` dataset.
    fn record_index(&self, py: Python<'_>) -> PyResult<Vec<(u64, u64)>> {
        let (runtime, dataset) = self.parts()?;
        py.allow_threads(|| runtime.block_on(dataset.record_index())).map_err(errors::client)
    }
}

/// Copies `bytes` into the `length` bytes at `address`, with the GIL
/// released; refuses, writing nothing, if they do not fit. `address` and
/// `length` come from `sluice._buffers.writable_address`: a live, writable,
/// contiguous host buffer (the buffer protocol, or a tensor's `data_ptr` and
/// `nbytes`) of an object the Python caller holds for the whole call.
fn write_to_address(py: Python<'_>, address: usize, length: usize, bytes: &[u8]) -> PyResult<()> {
    if bytes.len() > length {
        return Err(PyValueError::new_err(format!("{} bytes do not fit: the buffer has {length}", bytes.len())));
    }
    if bytes.is_empty() {
        return Ok(());
    }
    if address == 0 {
        return Err(PyValueError::new_err("a null buffer"));
    }
    // The region is the caller's writable buffer, non-null, at least
    // `bytes.len()` long, and alive until this call returns; a Python thread
    // writing the same buffer meanwhile races as with any GIL-free copy.
    // SAFETY: a valid, writable region of `bytes.len()` bytes (see above).
    let target = unsafe { std::slice::from_raw_parts_mut(address as *mut u8, bytes.len()) };
    py.allow_threads(|| target.copy_from_slice(bytes));
    Ok(())
}

/// The members of one sample of a `wds` dataset (its tar span), as
/// `(key, extension, bytes)`, keyed exactly as ingest keyed the sample
/// (`sluice_proto::tar`). Raises `ValueError` for a span that is not tar.
#[pyfunction]
fn wds_members<'py>(py: Python<'py>, span: &[u8]) -> PyResult<Vec<(String, String, Bound<'py, PyBytes>)>> {
    let members = sluice_proto::tar::keyed_members(span).map_err(|err| PyValueError::new_err(err.to_string()))?;
    Ok(members.into_iter().map(|(key, ext, data)| (key, ext, PyBytes::new(py, data))).collect())
}

/// The TCP-only build, which loads on any host.
#[cfg(not(feature = "rdma"))]
#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    add_everything(m)
}

/// The RDMA build: the same module, linked against rdma-core, so its
/// import fails where libibverbs or librdmacm is missing (and the package
/// then loads the TCP-only build; see `sluice/_backend.py`).
#[cfg(feature = "rdma")]
#[pymodule]
fn _native_rdma(m: &Bound<'_, PyModule>) -> PyResult<()> {
    add_everything(m)
}

fn add_everything(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("RDMA_BUILT", cfg!(feature = "rdma"))?;
    m.add_class::<Client>()?;
    m.add_function(wrap_pyfunction!(wds_members, m)?)?;
    m.add_class::<Dataset>()?;
    m.add_class::<loaders::WindowLoader>()?;
    m.add_class::<loaders::RecordLoader>()?;
    let py = m.py();
    m.add("SluiceError", py.get_type::<errors::SluiceError>())?;
    m.add("AccessDenied", py.get_type::<errors::AccessDenied>())?;
    m.add("UnknownDataset", py.get_type::<errors::UnknownDataset>())?;
    m.add("NodeUnavailable", py.get_type::<errors::NodeUnavailable>())?;
    m.add("WrongKind", py.get_type::<errors::WrongKind>())?;
    m.add("StateMismatch", py.get_type::<errors::StateMismatch>())?;
    m.add("ReadFailed", py.get_type::<errors::ReadFailed>())?;
    m.add("Forked", py.get_type::<errors::Forked>())?;
    Ok(())
}
