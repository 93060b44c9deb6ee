//! Blocking forms of [`Client`](crate::Client) and [`Dataset`](crate::Dataset)
//! for code without an async runtime (data-loader workers, scripts). Each
//! client runs a one-thread runtime of its own.

use std::sync::Arc;

use crate::{ClientError, NodeInfo, OpenOptions, RangeStatus, ReadBuffer, ReadRange, TransportChoice};

pub struct Client {
    runtime: Arc<tokio::runtime::Runtime>,
    inner: crate::Client,
}

impl Client {
    /// See [`crate::Client::connect`].
    pub fn connect(endpoint: &str) -> Result<Self, ClientError> {
        Self::build(endpoint, None, None)
    }

    /// See [`crate::Client::connect_with`].
    pub fn connect_with(endpoint: &str, choice: TransportChoice) -> Result<Self, ClientError> {
        Self::build(endpoint, Some(choice), None)
    }

    /// See [`crate::Client::connect_tls`].
    pub fn connect_tls(
        endpoint: &str,
        choice: TransportChoice,
        tls_files: crate::ClientTlsFiles,
    ) -> Result<Self, ClientError> {
        Self::build(endpoint, Some(choice), Some(tls_files))
    }

    fn build(
        endpoint: &str,
        choice: Option<TransportChoice>,
        tls_files: Option<crate::ClientTlsFiles>,
    ) -> Result<Self, ClientError> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("sluice-client")
            .enable_all()
            .build()
            .map_err(|e| ClientError::Control {
                endpoint: endpoint.to_string(),
                message: format!("runtime: {e}"),
                status: None,
            })?;
        let inner = runtime.block_on(async {
            match (choice, tls_files) {
                (Some(choice), Some(files)) => crate::Client::connect_tls(endpoint, choice, files).await,
                (Some(choice), None) => crate::Client::connect_with(endpoint, choice).await,
                (None, _) => crate::Client::connect(endpoint).await,
            }
        })?;
        Ok(Self { runtime: Arc::new(runtime), inner })
    }

    pub fn node(&self) -> &NodeInfo {
        self.inner.node()
    }

    pub fn transport(&self) -> &'static str {
        self.inner.transport()
    }

    /// See [`crate::Client::transport_reason`].
    pub fn transport_reason(&self) -> &str {
        self.inner.transport_reason()
    }

    /// See [`crate::Client::buffer`].
    pub fn buffer(&self, len: usize) -> Result<ReadBuffer, ClientError> {
        self.inner.buffer(len)
    }

    pub fn open(&self, name: &str) -> Result<Dataset, ClientError> {
        self.open_with(name, OpenOptions::default())
    }

    pub fn open_with(&self, name: &str, options: OpenOptions) -> Result<Dataset, ClientError> {
        let inner = self.runtime.block_on(self.inner.open_with(name, options))?;
        Ok(Dataset { runtime: Arc::clone(&self.runtime), inner })
    }
}

pub struct Dataset {
    runtime: Arc<tokio::runtime::Runtime>,
    inner: crate::Dataset,
}

impl Dataset {
    pub fn info(&self) -> &sluice_proto::OpenInfo {
        self.inner.info()
    }

    pub fn len_bytes(&self) -> u64 {
        self.inner.len_bytes()
    }

    /// See [`crate::Dataset::endpoint`].
    pub fn endpoint(&self) -> String {
        self.inner.endpoint()
    }

    /// See [`crate::Dataset::failovers`].
    pub fn failovers(&self) -> u64 {
        self.inner.failovers()
    }

    /// See [`crate::Dataset::read_batch`].
    pub fn read_batch(&self, ranges: &[ReadRange], buf: &mut Vec<u8>) -> Result<Vec<RangeStatus>, ClientError> {
        self.runtime.block_on(self.inner.read_batch(ranges, buf))
    }

    /// See [`crate::Dataset::read_into`].
    pub fn read_into(&self, ranges: &[ReadRange], buf: &mut ReadBuffer) -> Result<Vec<RangeStatus>, ClientError> {
        self.runtime.block_on(self.inner.read_into(ranges, buf))
    }

    /// See [`crate::Dataset::record_index`].
    pub fn record_index(&self) -> Result<Vec<(u64, u64)>, ClientError> {
        self.runtime.block_on(self.inner.record_index())
    }
}
