//! The node's control API as `sluicectl` calls it: the client library's
//! HTTP client (one agent, the caller's trust and bearer), and the data
//! path through the client library for reads.

use std::path::Path;

use serde::de::DeserializeOwned;
use sluice_client::http::ControlHttp;
use sluice_client::Client;

use crate::error::{unreadable_answer, CtlError, Result};

pub struct Api {
    pub http: ControlHttp,
    /// The grant token reads open datasets with.
    pub token: Option<String>,
    pub tls_files: sluice_client::ClientTlsFiles,
    pub transport: sluice_client::TransportChoice,
}

impl Api {
    pub async fn connect(&self) -> Result<Client> {
        Ok(Client::connect_tls(self.http.endpoint(), self.transport, self.tls_files.clone()).await?)
    }

    pub fn open_options(&self) -> sluice_client::OpenOptions {
        sluice_client::OpenOptions { token: self.token.clone(), ..Default::default() }
    }

    pub fn call(&self, request: std::result::Result<ureq::Response, ureq::Error>) -> Result<ureq::Response> {
        Ok(self.http.call(request)?)
    }

    /// Sends `request` and reads its JSON answer as `T`.
    pub fn call_json<T: DeserializeOwned>(
        &self,
        request: std::result::Result<ureq::Response, ureq::Error>,
    ) -> Result<T> {
        self.call(request)?.into_json().map_err(unreadable_answer)
    }

    pub fn get_json<T: DeserializeOwned>(&self, path: &str) -> Result<T> {
        Ok(self.http.get_json(path)?)
    }

    pub fn request(&self, method: &str, path: &str) -> ureq::Request {
        self.http.request(method, path)
    }
}

/// A secret given on the command line or in the environment: the value
/// itself, or `@FILE` for the first line of FILE.
pub fn secret(given: Option<&str>, file: Option<&Path>) -> Result<Option<String>> {
    let read = |path: &Path| -> Result<String> {
        let text = std::fs::read_to_string(path).map_err(crate::error::local(path))?;
        let line = text.lines().map(str::trim).find(|l| !l.is_empty() && !l.starts_with('#'));
        line.map(str::to_string).ok_or_else(|| CtlError::Usage(format!("{} holds no token", path.display())))
    };
    match (given, file) {
        (_, Some(path)) => read(path).map(Some),
        (Some(value), None) => match value.strip_prefix('@') {
            Some(path) => read(Path::new(path)).map(Some),
            None => Ok(Some(value.to_string()).filter(|v| !v.is_empty())),
        },
        (None, None) => Ok(None),
    }
}

/// A runtime for the commands that read through the data path.
pub fn runtime() -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| CtlError::Failed(format!("starting a runtime: {e}")))
}

/// A runtime of `workers` threads for a read benchmark's client. With one,
/// a TCP connection's reader task wakes the batch it answers on its own
/// thread rather than another worker's (a futex wake-up each batch, tens
/// of microseconds on a virtual machine): see `sluicectl bench read
/// --client-threads`.
pub fn runtime_with_workers(workers: usize) -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(workers.max(1))
        .enable_all()
        .build()
        .map_err(|e| CtlError::Failed(format!("starting a runtime: {e}")))
}
