//! Serving the control API on a listener, plain or TLS, and telling the
//! API who is at the other end of a connection (the CN of a client
//! certificate, over mTLS).
//!
//! TLS handshakes run on tasks of their own, at most
//! [`TLS_HANDSHAKES_MAX`] at once and each within
//! [`TLS_HANDSHAKE_TIMEOUT`], so a peer that opens connections and never
//! finishes a handshake holds neither the accept loop nor more than one
//! handshake slot, and only for a while.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::connect_info::Connected;
use axum::serve::{IncomingStream, Listener};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, Semaphore};
use tokio_rustls::server::TlsStream;

/// Handshakes under way at once; more connections wait in the kernel's
/// backlog.
pub const TLS_HANDSHAKES_MAX: usize = 256;
/// How long a client may take to finish its TLS handshake.
pub const TLS_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Who is at the other end of a control API connection.
#[derive(Clone, Debug, Default)]
pub struct PeerIdentity {
    pub remote: Option<SocketAddr>,
    /// The CN of the client certificate the peer presented over TLS.
    pub cert_name: Option<String>,
}

impl Connected<IncomingStream<'_, TcpListener>> for PeerIdentity {
    fn connect_info(stream: IncomingStream<'_, TcpListener>) -> Self {
        Self { remote: Some(*stream.remote_addr()), cert_name: None }
    }
}

impl Connected<IncomingStream<'_, TlsListener>> for PeerIdentity {
    fn connect_info(stream: IncomingStream<'_, TlsListener>) -> Self {
        let cert_name = sluice_transport::tls::peer_name(stream.io().get_ref().1.peer_certificates());
        Self { remote: Some(*stream.remote_addr()), cert_name }
    }
}

/// A TCP listener whose connections are TLS streams once their handshake
/// is done.
pub struct TlsListener {
    ready: mpsc::Receiver<(TlsStream<TcpStream>, SocketAddr)>,
    local: SocketAddr,
    acceptor: tokio::task::JoinHandle<()>,
}

impl TlsListener {
    /// `config` as the node has it; the HTTP protocols are offered here
    /// (ALPN), as only this listener speaks HTTP.
    pub fn new(listener: TcpListener, config: Arc<rustls::ServerConfig>) -> std::io::Result<Self> {
        let mut config = (*config).clone();
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        let config = Arc::new(config);
        let local = listener.local_addr()?;
        let (tx, ready) = mpsc::channel(TLS_HANDSHAKES_MAX);
        let acceptor = tokio::spawn(accept_loop(listener, tokio_rustls::TlsAcceptor::from(config), tx));
        Ok(Self { ready, local, acceptor })
    }
}

impl Drop for TlsListener {
    fn drop(&mut self) {
        self.acceptor.abort();
    }
}

async fn accept_loop(
    listener: TcpListener,
    acceptor: tokio_rustls::TlsAcceptor,
    ready: mpsc::Sender<(TlsStream<TcpStream>, SocketAddr)>,
) {
    let slots = Arc::new(Semaphore::new(TLS_HANDSHAKES_MAX));
    loop {
        let Ok(slot) = Arc::clone(&slots).acquire_owned().await else { return };
        let (stream, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(err) => {
                tracing::warn!("control API accept: {err}");
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        let (acceptor, ready) = (acceptor.clone(), ready.clone());
        tokio::spawn(async move {
            match tokio::time::timeout(TLS_HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
                Ok(Ok(stream)) => {
                    drop(slot);
                    let _ = ready.send((stream, peer)).await;
                }
                Ok(Err(err)) => tracing::debug!(%peer, "control API TLS handshake failed: {err}"),
                Err(_) => tracing::debug!(%peer, "control API TLS handshake timed out"),
            }
        });
    }
}

impl Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.ready.recv().await {
            Some(accepted) => accepted,
            // The accept loop ended (its listener failed for good): serve
            // what is open and accept nothing more.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        Ok(self.local)
    }
}
