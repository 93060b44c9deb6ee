//! Serving the control API on a listener, plain or TLS, and telling the
//! API who is at the other end of a connection (the CN of a client
//! certificate, over mTLS).
//!
//! TLS handshakes run on tasks of their own, at most
//! [`TLS_HANDSHAKES_MAX`] at once and each within
//! [`TLS_HANDSHAKE_TIMEOUT`], so a peer that opens connections and never
//! finishes a handshake holds neither the accept loop nor more than one
//! handshake slot, and only for a while.
//!
//! Connections are bounded as requests are ([`ConnectionLimits`]): at
//! most [`CONNECTIONS_MAX`] open at once (more wait in the kernel's
//! backlog), and an HTTP/1 request's head must arrive within
//! [`HEADER_READ_TIMEOUT`], which also ends a kept-alive connection idle
//! that long. So a peer that opens connections and trickles a header, or
//! opens them and says nothing, holds a bounded number of descriptors for
//! a bounded time, where it held one per connection for ever (axum's
//! `serve` gives hyper no timer, and hyper then waits without end).
//!
//! And per peer address: one address holds at most
//! [`PEER_CONNECTIONS_MAX`] connections and [`PEER_HANDSHAKES_MAX`]
//! handshakes under way; a connection past either is closed as it is
//! accepted. So a single host that opens connections as fast as it can
//! takes a quarter of the connections and a sixteenth of the handshake
//! slots, and the others' calls still find room.

use std::collections::HashMap;
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::connect_info::ConnectInfo;
use axum::serve::Listener;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use sluice_serve::Peer;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch, OwnedSemaphorePermit, Semaphore};
use tokio_rustls::server::TlsStream;
use tower::ServiceExt;

/// Handshakes under way at once; more connections wait in the kernel's
/// backlog.
pub const TLS_HANDSHAKES_MAX: usize = 256;
/// How long a client may take to finish its TLS handshake.
pub const TLS_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Connections the control API holds open at once.
pub const CONNECTIONS_MAX: usize = 1024;
/// How long a client has to send an HTTP/1 request's head, and how long a
/// kept-alive connection waits for its next request.
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(30);
/// Connections one peer address holds open at once: a quarter of
/// [`CONNECTIONS_MAX`], room for a host of many data loader workers each
/// with its own keep-alive connection.
pub const PEER_CONNECTIONS_MAX: usize = CONNECTIONS_MAX / 4;
/// TLS handshakes one peer address has under way at once.
pub const PEER_HANDSHAKES_MAX: usize = TLS_HANDSHAKES_MAX / 16;
/// How often an HTTP/2 connection pings its peer, and how long it waits
/// for the answer before closing: a vanished client's connection goes.
const HTTP2_KEEP_ALIVE: Duration = Duration::from_secs(20);

/// The bounds on the control API's connections.
#[derive(Clone, Copy, Debug)]
pub struct ConnectionLimits {
    pub connections_max: usize,
    pub peer_connections_max: usize,
    pub header_read_timeout: Duration,
}

impl Default for ConnectionLimits {
    fn default() -> Self {
        Self {
            connections_max: CONNECTIONS_MAX,
            peer_connections_max: PEER_CONNECTIONS_MAX,
            header_read_timeout: HEADER_READ_TIMEOUT,
        }
    }
}

/// How many of something (connections, handshakes) each peer address
/// holds, bounded per address. The control API's accept path only: a
/// lock per connection accepted and closed.
struct PerPeer {
    held: Mutex<HashMap<IpAddr, usize>>,
    max: usize,
}

/// One peer's share of a [`PerPeer`], given back when dropped.
struct PeerShare {
    of: Arc<PerPeer>,
    ip: IpAddr,
}

impl PerPeer {
    fn new(max: usize) -> Arc<Self> {
        assert!(max > 0, "a peer may hold at least one");
        Arc::new(Self { held: Mutex::new(HashMap::new()), max })
    }

    /// A share for `ip`, or `None` when it holds its most already.
    fn take(self: &Arc<Self>, ip: IpAddr) -> Option<PeerShare> {
        let mut held = self.held.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let count = held.entry(ip).or_insert(0);
        if *count >= self.max {
            return None;
        }
        *count += 1;
        Some(PeerShare { of: Arc::clone(self), ip })
    }
}

impl Drop for PeerShare {
    fn drop(&mut self) {
        let mut held = self.of.held.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let std::collections::hash_map::Entry::Occupied(mut count) = held.entry(self.ip) {
            *count.get_mut() -= 1;
            if *count.get() == 0 {
                count.remove();
            }
        }
    }
}

/// A connection the control API serves: bytes both ways, and the CN of
/// the client certificate it presented, if any.
pub trait ControlIo: AsyncRead + AsyncWrite + Unpin + Send + 'static {
    fn cert_name(&self) -> Option<String>;
}

impl ControlIo for TcpStream {
    fn cert_name(&self) -> Option<String> {
        None
    }
}

impl ControlIo for TlsStream<TcpStream> {
    fn cert_name(&self) -> Option<String> {
        sluice_transport::tls::peer_name(self.get_ref().1.peer_certificates())
    }
}

/// Serves `router` on `listener` until `stop`, within `limits`; then lets
/// each open connection finish the requests it has under way and returns
/// once all are closed. Handlers find the peer as
/// `ConnectInfo<Peer>` (the same `Peer` the data port's sessions have).
pub async fn serve<L>(mut listener: L, router: axum::Router, limits: ConnectionLimits, stop: impl Future<Output = ()>)
where
    L: Listener<Addr = SocketAddr>,
    L::Io: ControlIo,
{
    assert!(limits.connections_max > 0 && limits.connections_max <= u32::MAX as usize);
    let slots = Arc::new(Semaphore::new(limits.connections_max));
    let per_peer = PerPeer::new(limits.peer_connections_max);
    let (closing, closing_rx) = watch::channel(false);
    let mut stop = std::pin::pin!(stop);
    loop {
        let slot = tokio::select! {
            slot = Arc::clone(&slots).acquire_owned() => slot,
            () = &mut stop => break,
        };
        let Ok(slot) = slot else { break };
        let (io, remote) = tokio::select! {
            accepted = listener.accept() => accepted,
            () = &mut stop => break,
        };
        let Some(share) = per_peer.take(remote.ip()) else {
            tracing::debug!(peer = %remote, "control API connection closed: its address holds {} already", per_peer.max);
            continue;
        };
        let peer = Peer { addr: Some(remote), cert_name: io.cert_name() };
        tokio::spawn(serve_connection(io, peer, router.clone(), limits, closing_rx.clone(), (slot, share)));
    }
    drop(listener);
    let _ = closing.send(true);
    // Every connection holds a slot until it is closed.
    let _ = slots.acquire_many(limits.connections_max as u32).await;
}

async fn serve_connection<I: ControlIo>(
    io: I,
    peer: Peer,
    router: axum::Router,
    limits: ConnectionLimits,
    mut closing: watch::Receiver<bool>,
    _held: (OwnedSemaphorePermit, PeerShare),
) {
    let remote = peer.addr;
    let service = hyper::service::service_fn(move |mut request: hyper::Request<hyper::body::Incoming>| {
        request.extensions_mut().insert(ConnectInfo(peer.clone()));
        router.clone().oneshot(request.map(axum::body::Body::new))
    });
    let mut builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
    builder.http1().timer(TokioTimer::new()).header_read_timeout(limits.header_read_timeout);
    builder.http2().timer(TokioTimer::new()).keep_alive_interval(HTTP2_KEEP_ALIVE).keep_alive_timeout(HTTP2_KEEP_ALIVE);
    let connection = builder.serve_connection_with_upgrades(TokioIo::new(io), service);
    let mut connection = std::pin::pin!(connection);
    let told_to_close = async move {
        let _ = closing.wait_for(|closing| *closing).await;
    };
    let finished = tokio::select! {
        finished = connection.as_mut() => finished,
        () = told_to_close => {
            connection.as_mut().graceful_shutdown();
            connection.await
        }
    };
    if let Err(err) = finished {
        tracing::debug!(peer = ?remote, "control API connection: {err}");
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
    let per_peer = PerPeer::new(PEER_HANDSHAKES_MAX);
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
        let Some(share) = per_peer.take(peer.ip()) else {
            tracing::debug!(%peer, "control API connection closed: its address has {PEER_HANDSHAKES_MAX} handshakes under way");
            continue;
        };
        let (acceptor, ready) = (acceptor.clone(), ready.clone());
        tokio::spawn(async move {
            match tokio::time::timeout(TLS_HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
                Ok(Ok(stream)) => {
                    drop((slot, share));
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

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// Serves `router` within `limits` on a loopback port: its address,
    /// the sender that stops it, and the serving task.
    async fn serving(
        router: axum::Router,
        limits: ConnectionLimits,
    ) -> (SocketAddr, tokio::sync::oneshot::Sender<()>, tokio::task::JoinHandle<()>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(serve(listener, router, limits, async move {
            let _ = stopped.await;
        }));
        (addr, stop, server)
    }

    /// A peer that trickles a request head is cut off at the head timeout,
    /// and connections past the bound wait until one closes; a whole
    /// request is answered, its handler told the peer's address.
    #[tokio::test]
    async fn slow_heads_are_cut_off_and_connections_are_bounded() {
        let router = axum::Router::new().route(
            "/peer",
            axum::routing::get(|ConnectInfo(peer): ConnectInfo<Peer>| async move {
                peer.addr.map(|r| r.to_string()).unwrap_or_default()
            }),
        );
        let limits = ConnectionLimits {
            connections_max: 2,
            peer_connections_max: 2,
            header_read_timeout: Duration::from_millis(500),
        };
        let (addr, stop, server) = serving(router, limits).await;

        let started = std::time::Instant::now();
        let mut slow = Vec::new();
        for _ in 0..2 {
            let mut stream = TcpStream::connect(addr).await.expect("connect");
            stream.write_all(b"GET /peer HTTP/1.1\r\nHost: x\r\n").await.expect("half a head");
            slow.push(stream);
        }
        // The third waits for a slot: answered only once the slow ones
        // are cut off.
        let mut whole = TcpStream::connect(addr).await.expect("connect");
        let local = whole.local_addr().expect("local");
        whole.write_all(b"GET /peer HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").await.expect("request");
        let mut answer = String::new();
        tokio::time::timeout(Duration::from_secs(10), whole.read_to_string(&mut answer))
            .await
            .expect("answered once a slot frees")
            .expect("read");
        assert!(started.elapsed() >= Duration::from_millis(500), "answered before a slot freed");
        assert!(answer.starts_with("HTTP/1.1 200") && answer.ends_with(&local.to_string()), "{answer}");
        for mut stream in slow {
            let mut rest = Vec::new();
            let read = tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut rest)).await;
            assert!(read.is_ok(), "a trickled head is cut off");
        }
        let _ = stop.send(());
        tokio::time::timeout(Duration::from_secs(10), server).await.expect("stops").expect("joined");
    }

    /// One address with its share of TLS handshakes under way (peers that
    /// connect and say nothing) gets the next connection closed at once,
    /// not held until the handshake timeout; another address completes
    /// its handshake meanwhile.
    #[tokio::test]
    async fn one_address_holds_at_most_its_share_of_handshakes() {
        let dir = tempfile::tempdir().expect("tempdir");
        let certified = rcgen::generate_simple_self_signed(vec!["127.0.0.1".to_string()]).expect("certificate");
        let (cert, key) = (dir.path().join("node.pem"), dir.path().join("node.key"));
        std::fs::write(&cert, certified.cert.pem()).expect("cert");
        std::fs::write(&key, certified.key_pair.serialize_pem()).expect("key");
        let files = sluice_transport::tls::ServerTlsFiles { cert: cert.clone(), key, client_ca: None };
        let config = sluice_transport::tls::server_config(&files).expect("server config");
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let _tls = TlsListener::new(listener, config).expect("listener");

        let mut silent = Vec::new();
        for _ in 0..PEER_HANDSHAKES_MAX {
            silent.push(connect_from("127.0.0.1", addr).await);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
        let mut one_more = connect_from("127.0.0.1", addr).await;
        let mut byte = [0u8; 1];
        let closed = tokio::time::timeout(TLS_HANDSHAKE_TIMEOUT / 2, one_more.read(&mut byte)).await;
        assert!(matches!(closed, Ok(Ok(0) | Err(_))), "closed at once, not held for a handshake: {closed:?}");

        let client = sluice_transport::tls::ClientTlsFiles { ca: Some(cert), identity: None };
        let connector =
            tokio_rustls::TlsConnector::from(sluice_transport::tls::client_config(&client).expect("client"));
        let name = sluice_transport::tls::server_name("127.0.0.1").expect("name");
        let other = connector.connect(name, connect_from("127.0.0.2", addr).await).await;
        assert!(other.is_ok(), "another address completes its handshake: {:?}", other.err());
        drop(silent);
    }

    /// Connects from `local` (a loopback address of its own) to `addr`.
    async fn connect_from(local: &str, addr: SocketAddr) -> TcpStream {
        let socket = tokio::net::TcpSocket::new_v4().expect("socket");
        socket.bind(format!("{local}:0").parse().expect("addr")).expect("bind");
        socket.connect(addr).await.expect("connect")
    }

    /// One address that holds its share of connections gets the next one
    /// closed at once, while another address is served; once one of the
    /// first's closes, it is served again.
    #[tokio::test]
    async fn one_address_holds_at_most_its_share_of_connections() {
        let router = axum::Router::new().route("/", axum::routing::get(|| async { "ok" }));
        let limits = ConnectionLimits {
            connections_max: 8,
            peer_connections_max: 2,
            header_read_timeout: Duration::from_secs(30),
        };
        let (addr, stop, server) = serving(router, limits).await;
        let request = b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
        let answered = |mut stream: TcpStream| async move {
            // A refused connection may be reset before this write lands.
            let _ = stream.write_all(request).await;
            let mut answer = String::new();
            let read = tokio::time::timeout(Duration::from_secs(10), stream.read_to_string(&mut answer)).await;
            read.expect("answered or closed within the bound").map(|_| answer).unwrap_or_default()
        };

        let mut held = Vec::new();
        for _ in 0..2 {
            let mut stream = connect_from("127.0.0.1", addr).await;
            stream.write_all(b"GET / HTTP/1.1\r\n").await.expect("half a head");
            held.push(stream);
        }
        // Give the server a moment to have accepted both.
        tokio::time::sleep(Duration::from_millis(200)).await;
        let third = answered(connect_from("127.0.0.1", addr).await).await;
        assert_eq!(third, "", "a third connection from the same address is closed unanswered");
        let other = answered(connect_from("127.0.0.2", addr).await).await;
        assert!(other.starts_with("HTTP/1.1 200"), "another address is served: {other}");

        drop(held.pop());
        let mut again = String::new();
        for _ in 0..100 {
            again = answered(connect_from("127.0.0.1", addr).await).await;
            if !again.is_empty() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert!(again.starts_with("HTTP/1.1 200"), "served once one of its own closed: {again:?}");
        let _ = stop.send(());
        drop(held);
        tokio::time::timeout(Duration::from_secs(10), server).await.expect("stops").expect("joined");
    }
}
