//! Which transport a client speaks, and the buffers reads land in.
//!
//! RDMA is picked when this build has it, the host has a usable RDMA device
//! and the node names an RDMA endpoint; TCP otherwise. The choice, and why,
//! is reported by [`crate::Client::transport`] and
//! [`crate::Client::transport_reason`].

use std::fmt;
use std::ops::{Deref, DerefMut};
use std::str::FromStr;

use sluice_proto::{NodeInfo, OpenInfo};
#[cfg(feature = "rdma")]
use sluice_transport::rc::{RdmaClient, RegisteredBuffer};
use sluice_transport::tcp::{NodeLimits, TcpClient, TlsConnect, TransportError};
use sluice_transport::tls::ClientTlsFiles;

use crate::ClientError;

/// Where a job finds its transport choice when the code names none.
pub const TRANSPORT_ENV: &str = "SLUICE_TRANSPORT";
/// The local address a TCP data connection leaves from, on hosts with more
/// than one (`SLUICE_SOURCE_ADDR=10.0.0.7`). The node's steering decides
/// per peer address which workers a new connection lands on.
pub const SOURCE_ADDR_ENV: &str = "SLUICE_SOURCE_ADDR";

/// Which transport to use.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum TransportChoice {
    /// RDMA when possible, else TCP.
    #[default]
    Auto,
    /// RDMA or fail, saying why it is not possible.
    Rdma,
    Tcp,
}

impl FromStr for TransportChoice {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "auto" => Ok(Self::Auto),
            "rdma" => Ok(Self::Rdma),
            "tcp" => Ok(Self::Tcp),
            other => Err(format!("transport {other:?}: expected auto, rdma or tcp")),
        }
    }
}

impl fmt::Display for TransportChoice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Auto => "auto",
            Self::Rdma => "rdma",
            Self::Tcp => "tcp",
        })
    }
}

/// A connection over one transport.
pub(crate) enum Transport {
    Tcp(TcpClient),
    #[cfg(feature = "rdma")]
    Rdma(RdmaClient),
}

/// How to reach `node`'s TLS data port: the trust given for its control
/// API, and the data address's host as the name its certificate carries.
pub(crate) fn data_tls(node: &NodeInfo, files: &ClientTlsFiles) -> Result<TlsConnect, crate::http::ApiFailure> {
    let failure = |message: String| crate::http::ApiFailure { status: None, code: None, message };
    let addr: std::net::SocketAddr =
        node.data_addr.parse().map_err(|_| failure(format!("data address {:?} is not host:port", node.data_addr)))?;
    let config = sluice_transport::tls::client_config(files).map_err(|e| failure(e.to_string()))?;
    let server_name = sluice_transport::tls::server_name(&addr.ip().to_string()).map_err(|e| failure(e.to_string()))?;
    Ok(TlsConnect { config, server_name })
}

/// Why RDMA cannot be used from this host to `node`, if it cannot.
fn rdma_unavailable(node: &NodeInfo) -> Option<String> {
    if !cfg!(feature = "rdma") {
        return Some("this build has no RDMA support (built without the `rdma` feature)".into());
    }
    let Some(_) = &node.rdma_addr else {
        return Some(format!("node {} serves no RDMA endpoint", node.name));
    };
    #[cfg(feature = "rdma")]
    if let Err(why) = sluice_transport::verbs::usable_device() {
        return Some(why);
    }
    None
}

impl Transport {
    /// Connects as `choice` says; returns the transport and why it was
    /// picked.
    pub(crate) async fn connect(
        node: &NodeInfo,
        choice: TransportChoice,
        client_name: &str,
        tls: Option<&TlsConnect>,
    ) -> Result<(Self, String), ClientError> {
        let unavailable = rdma_unavailable(node);
        match (choice, unavailable) {
            (TransportChoice::Rdma, Some(why)) => return Err(ClientError::Rdma(why)),
            (TransportChoice::Tcp, _) => return Ok((Self::tcp(node, client_name, tls).await?, "asked for tcp".into())),
            (TransportChoice::Auto, Some(why)) => return Ok((Self::tcp(node, client_name, tls).await?, why)),
            (_, None) => {}
        }
        #[cfg(feature = "rdma")]
        {
            let addr_text = node.rdma_addr.clone().unwrap_or_default();
            let addr = addr_text.parse().map_err(|_| ClientError::BadAddress(addr_text.clone()))?;
            let poll_window = sluice_transport::poll::window_from_env().map_err(ClientError::Setting)?;
            match RdmaClient::connect(addr, client_name, poll_window).await {
                Ok(rdma) => {
                    let why = format!("RDMA device {} reaches {addr}", rdma.device());
                    return Ok((Self::Rdma(rdma), why));
                }
                Err(err) if choice == TransportChoice::Rdma => return Err(err.into()),
                Err(err) => {
                    tracing::warn!("RDMA to {addr} failed, using TCP: {err}");
                    let why = format!("RDMA to {addr} failed: {err}");
                    return Ok((Self::tcp(node, client_name, tls).await?, why));
                }
            }
        }
        #[allow(unreachable_code)]
        Err(ClientError::Rdma("this build has no RDMA support".into()))
    }

    async fn tcp(node: &NodeInfo, client_name: &str, tls: Option<&TlsConnect>) -> Result<Self, ClientError> {
        let addr = node.data_addr.parse().map_err(|_| ClientError::BadAddress(node.data_addr.clone()))?;
        let source = match std::env::var(SOURCE_ADDR_ENV) {
            Ok(text) => Some(text.parse().map_err(|_| ClientError::BadAddress(format!("{SOURCE_ADDR_ENV}={text}")))?),
            Err(_) => None,
        };
        let poll_window = sluice_transport::poll::window_from_env().map_err(ClientError::Setting)?;
        Ok(Self::Tcp(TcpClient::connect_secured(addr, source, client_name, tls, poll_window).await?))
    }

    pub(crate) fn name(&self) -> &'static str {
        match self {
            Self::Tcp(_) => "tcp",
            #[cfg(feature = "rdma")]
            Self::Rdma(_) => "rdma",
        }
    }

    pub(crate) fn limits(&self) -> NodeLimits {
        match self {
            Self::Tcp(tcp) => tcp.limits(),
            #[cfg(feature = "rdma")]
            Self::Rdma(rdma) => rdma.limits(),
        }
    }

    pub(crate) async fn open(&self, name: &str, token: Option<String>) -> Result<(u32, OpenInfo), TransportError> {
        match self {
            Self::Tcp(tcp) => tcp.open(name, token).await,
            #[cfg(feature = "rdma")]
            Self::Rdma(rdma) => rdma.open(name, token).await,
        }
    }

    pub(crate) async fn close(&self, handle: u32) -> Result<(), TransportError> {
        match self {
            Self::Tcp(tcp) => tcp.close(handle).await,
            #[cfg(feature = "rdma")]
            Self::Rdma(rdma) => rdma.close(handle).await,
        }
    }
}

/// A destination buffer to reuse across reads. Made by
/// [`crate::Client::buffer`], it is registered with the connection's RDMA
/// device once (like a 3FS iov), so reads into it cost no registration;
/// over TCP, or made with [`ReadBuffer::new`], it is plain memory.
pub struct ReadBuffer {
    pub(crate) landing: Landing,
}

pub(crate) enum Landing {
    Plain(Vec<u8>),
    #[cfg(feature = "rdma")]
    Registered(RegisteredBuffer),
}

impl ReadBuffer {
    /// A plain (unregistered) buffer of `len` zero bytes.
    pub fn new(len: usize) -> Self {
        Self { landing: Landing::Plain(vec![0; len]) }
    }

    pub(crate) fn for_transport(transport: &Transport, len: usize) -> Result<Self, ClientError> {
        match transport {
            Transport::Tcp(_) => Ok(Self::new(len)),
            #[cfg(feature = "rdma")]
            Transport::Rdma(rdma) => {
                let buffer = RegisteredBuffer::new(rdma, vec![0; len]).map_err(|(err, _)| err)?;
                Ok(Self { landing: Landing::Registered(buffer) })
            }
        }
    }

    /// Whether the buffer is registered for RDMA.
    pub fn is_registered(&self) -> bool {
        !matches!(self.landing, Landing::Plain(_))
    }

    pub fn into_vec(self) -> Vec<u8> {
        self.landing.into_vec()
    }
}

impl Landing {
    pub(crate) fn into_vec(self) -> Vec<u8> {
        match self {
            Self::Plain(bytes) => bytes,
            #[cfg(feature = "rdma")]
            Self::Registered(buffer) => buffer.into_vec(),
        }
    }

    pub(crate) fn bytes(&self) -> &[u8] {
        match self {
            Self::Plain(bytes) => bytes,
            #[cfg(feature = "rdma")]
            Self::Registered(buffer) => buffer.as_slice(),
        }
    }

    pub(crate) fn take(&mut self) -> Self {
        std::mem::replace(self, Self::Plain(Vec::new()))
    }
}

impl Deref for ReadBuffer {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        self.landing.bytes()
    }
}

impl DerefMut for ReadBuffer {
    fn deref_mut(&mut self) -> &mut [u8] {
        match &mut self.landing {
            Landing::Plain(bytes) => bytes,
            #[cfg(feature = "rdma")]
            Landing::Registered(buffer) => buffer.as_mut_slice(),
        }
    }
}
