//! The transports a node serves (TCP data port, RDMA, the control API) and
//! the SPDK driver, each with the stand-in a build without its feature gets.

use super::*;

#[cfg(feature = "rdma")]
pub(super) type RdmaListener = sluice_serve::rc::RdmaListener;
#[cfg(not(feature = "rdma"))]
pub(super) type RdmaListener = std::convert::Infallible;

/// Binds the RDMA transport and registers the data plane's arenas with its
/// device.
#[cfg(feature = "rdma")]
pub(super) fn bind_rdma(addr: SocketAddr, plane: &Arc<DataPlane>) -> Result<RdmaListener, NodeError> {
    let listener = RdmaListener::bind(addr, Arc::clone(plane))
        .map_err(|err| NodeError::Rdma { addr, message: err.to_string() })?;
    tracing::info!("RDMA transport on {addr} ({})", listener.device_name());
    Ok(listener)
}

#[cfg(not(feature = "rdma"))]
pub(super) fn bind_rdma(addr: SocketAddr, _plane: &Arc<DataPlane>) -> Result<RdmaListener, NodeError> {
    Err(NodeError::Rdma { addr, message: "this build has no RDMA support (build with `--features rdma`)".into() })
}

/// Accepts RDMA connections, each placed on the cores of `group` in turn.
#[cfg(feature = "rdma")]
pub(super) fn serve_rdma(
    listener: RdmaListener,
    resolver: Arc<Resolver>,
    config: ServerConfig,
    group: CoreGroup,
    shutdown: watch::Receiver<bool>,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        if let Err(err) = listener.serve(resolver, config, group, shutdown).await {
            tracing::error!("RDMA transport stopped: {err}");
        }
    })
}

#[cfg(not(feature = "rdma"))]
pub(super) fn serve_rdma(
    listener: RdmaListener,
    _resolver: Arc<Resolver>,
    _config: ServerConfig,
    _group: CoreGroup,
    _shutdown: watch::Receiver<bool>,
) -> JoinHandle<()> {
    match listener {}
}

#[cfg(feature = "spdk")]
pub(super) fn spdk_driver(nvme: &[String]) -> Result<Arc<dyn BlockDriver>, NodeError> {
    let driver = sluice_dataplane::driver::SpdkDriver::start(nvme).map_err(NodeError::Driver)?;
    Ok(Arc::new(Arc::new(driver)))
}

#[cfg(not(feature = "spdk"))]
pub(super) fn spdk_driver(_nvme: &[String]) -> Result<Arc<dyn BlockDriver>, NodeError> {
    Err(NodeError::Driver(sluice_dataplane::driver::DriverError::Spdk(
        "this build has no SPDK driver: build with `--features spdk` against an SPDK install pkg-config finds".into(),
    )))
}

/// Serves a control API router on `listener` (HTTPS with `tls`) until
/// shutdown, on the control runtime, telling handlers who each
/// connection's peer is.
pub(super) fn serve_control(
    runtime: &tokio::runtime::Handle,
    listener: TcpListener,
    tls: Option<Arc<rustls::ServerConfig>>,
    router: axum::Router,
    mut shutdown: watch::Receiver<bool>,
) -> JoinHandle<()> {
    use sluice_control::serve::{serve, ConnectionLimits, TlsListener};
    // Re-registered with the control runtime's reactor, so its sockets
    // are driven there too.
    let listener = listener.into_std();
    runtime.spawn(async move {
        let listener = match listener.and_then(TcpListener::from_std) {
            Ok(listener) => listener,
            Err(err) => {
                tracing::error!("control API listener: {err}");
                return;
            }
        };
        let stop = async move {
            let _ = shutdown.changed().await;
        };
        let limits = ConnectionLimits::default();
        match tls {
            None => serve(listener, router, limits, stop).await,
            Some(config) => match TlsListener::new(listener, config) {
                Ok(listener) => serve(listener, router, limits, stop).await,
                Err(err) => tracing::error!("control API: {err}"),
            },
        }
    })
}
