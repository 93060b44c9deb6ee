//! Starting and stopping a node: [`Node::start`] opens everything that
//! needs root in order, drops to `--user`, and serves. The transports and
//! the block driver it starts are in `transports`, the eBPF steering and
//! trace in `steering`.

use std::net::SocketAddr;
use std::sync::Arc;

use sluice_control::{api, CatalogChoice, ControlPlane, Resolver};
use sluice_dataplane::driver::{FaultPlan, FaultyDriver, MemDriver, UringDriver};
use sluice_dataplane::{BlockDriver, CoreGroup, DataPlane, DataPlaneConfig, IoMode};
use sluice_serve::tcp::TcpServer;
use sluice_serve::ServerConfig;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::config::{DriverChoice, IoModeChoice, NodeConfig, SocketIoChoice};

mod steering;
mod transports;

use steering::*;
use transports::*;

/// Why `--user` cannot work with this config, if it cannot: what needs
/// root after start and has no helper. (NVMe controllers have one:
/// [`crate::admin_helper`].)
fn unprivileged_conflict(config: &NodeConfig, user: &str) -> Option<String> {
    if config.policy_load {
        return Some(format!(
            "--user {user} with policy_load: loading a steering policy at run time needs CAP_BPF; \
             run without --user to swap policies, or without policy_load"
        ));
    }
    None
}

/// A running node.
pub struct Node {
    /// The runtime the control API, opens and replication run on.
    control_runtime: Option<tokio::runtime::Runtime>,
    pub control_addr: SocketAddr,
    /// Whether the control API serves HTTPS.
    pub control_tls: bool,
    pub data_addr: SocketAddr,
    /// Where the RDMA transport listens, when it does.
    pub rdma_addr: Option<SocketAddr>,
    /// Where `GET /metrics` is served without a token (`metrics_listen`),
    /// as bound: a configured port 0 is the kernel's choice.
    pub metrics_addr: Option<SocketAddr>,
    pub control: Arc<ControlPlane>,
    plane: Arc<DataPlane>,
    shutdown: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
}

#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    #[error("data directory {path}: {source}")]
    DataDir {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("starting the data plane: {0}")]
    DataPlane(#[from] sluice_dataplane::engine::StartError),
    #[error("starting the block driver: {0}")]
    Driver(sluice_dataplane::driver::DriverError),
    #[error("opening the catalog: {0}")]
    Control(#[from] sluice_control::ControlError),
    #[error("RDMA transport on {addr}: {message}")]
    Rdma { addr: SocketAddr, message: String },
    #[error("refusing to start: {0}")]
    Exposed(String),
    #[error("access control: {0}")]
    Access(String),
    #[error("config: {0}")]
    Config(String),
    #[error("TLS: {0}")]
    Tls(String),
    #[error("dropping privileges: {0}")]
    Privilege(String),
    #[error("binding {what} on {addr}: {source}")]
    Bind {
        what: &'static str,
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
}

impl Node {
    /// Starts every part of a node and begins serving.
    pub async fn start(config: NodeConfig) -> Result<Self, NodeError> {
        if let Some(why) = config.exposure() {
            return Err(NodeError::Exposed(why));
        }
        let source_allow = config.source_allow_list().map_err(NodeError::Config)?;
        if let Some(why) = config.user.as_deref().and_then(|user| unprivileged_conflict(&config, user)) {
            return Err(NodeError::Privilege(why));
        }
        let control_tls_files = config.control_tls().map_err(NodeError::Tls)?;
        let tls = match &control_tls_files {
            Some(files) => {
                Some(sluice_transport::tls::server_config(files).map_err(|e| NodeError::Tls(e.to_string()))?)
            }
            None => None,
        };
        let data_dir_error = |source| NodeError::DataDir { path: config.data_dir.display().to_string(), source };
        std::fs::create_dir_all(&config.data_dir).map_err(data_dir_error)?;
        // The data directory is the node's alone: datasets, catalog and
        // tokens are readable through it by nobody else.
        std::fs::set_permissions(&config.data_dir, std::os::unix::fs::PermissionsExt::from_mode(0o700))
            .map_err(data_dir_error)?;
        let (access, token_files) = access_policy(&config)?;
        let driver: Arc<dyn BlockDriver> = match config.driver {
            DriverChoice::Uring => Arc::new(UringDriver::new(match config.io_mode {
                IoModeChoice::Direct => IoMode::Direct,
                IoModeChoice::Buffered => IoMode::Buffered,
            })),
            DriverChoice::Mem => Arc::new(MemDriver),
            DriverChoice::Spdk => spdk_driver(&config.nvme)?,
        };
        let driver: Arc<dyn BlockDriver> = match &config.faults {
            Some(faults) => {
                tracing::warn!("fault injection is on: {faults:?}");
                let plan = FaultPlan {
                    io_errors: faults.io_errors.iter().map(|[a, b]| *a..*b).collect(),
                    corruptions: faults.corruptions.iter().map(|[a, b]| *a..*b).collect(),
                    delays: faults
                        .delays
                        .iter()
                        .map(|[a, b, ms]| (*a..*b, std::time::Duration::from_millis(*ms)))
                        .collect(),
                    delays_unannounced: false,
                };
                Arc::new(FaultyDriver::new(driver, plan))
            }
            None => driver,
        };
        let plane_config = DataPlaneConfig {
            cores: config.cores.max(1),
            slots_per_core: config.slots_per_core.max(256),
            queue_depth: config.queue_depth,
            verify_chunks: config.verify_chunks,
            latency_batch_bytes_max: config.latency_lane_max_bytes,
            poll_window: std::time::Duration::from_micros(config.poll_window_us),
            bulk_in_flight_bytes_max: config.bulk_in_flight_bytes,
            ..DataPlaneConfig::default()
        };
        let plane = Arc::new(DataPlane::start(Arc::clone(&driver), plane_config)?);
        let catalog = match &config.etcd {
            Some(endpoint) => CatalogChoice::Etcd {
                endpoint: endpoint.clone(),
                access: Box::new(config.etcd_access().map_err(NodeError::Access)?),
                prefix: config.etcd_prefix.clone(),
                node: config.node_id.clone().unwrap_or_else(|| config.name.clone()),
                replicas: config.replicas.max(1),
                repair_after: std::time::Duration::from_secs(config.repair_after_s),
            },
            None => CatalogChoice::Local,
        };
        // A node that drops to --user leaves its controllers' admin
        // commands to a helper that stays privileged for them alone.
        let kernel_admin = match config.user {
            Some(_) if !config.nvme_controllers.is_empty() => {
                let helper =
                    crate::admin_helper::AdminHelper::spawn(&config.nvme_controllers).map_err(NodeError::Privilege)?;
                Some(Arc::new(helper) as Arc<dyn sluice_control::nvme::KernelAdmin>)
            }
            _ => None,
        };
        let control = Arc::new(ControlPlane::open_with(
            &config.data_dir,
            driver,
            Arc::clone(&plane),
            sluice_control::NamespacePool {
                devices: config.namespace_devices.clone(),
                controllers: config.nvme_controllers.clone(),
                admin: kernel_admin,
                claim: config.claim_devices.clone(),
            },
            catalog,
            config.adopt,
        )?);
        control.set_access(access);
        if let Some(path) = &config.audit_log {
            control.set_audit(sluice_control::audit::AuditLog::open(path).map_err(NodeError::Config)?);
        }
        control.set_source_options(sluice_control::source::SourceOptions {
            request_timeout: std::time::Duration::from_millis(config.source_timeout_ms.max(1)),
            retries: config.source_retries,
            fetches_in_flight_max: config.source_fetches_max.max(1),
            cache_bytes_max: config.cache_bytes_max,
            allowed: source_allow,
            ..sluice_control::source::SourceOptions::default()
        });
        control.set_policy_rules(sluice_control::PolicyRules {
            load_enabled: config.policy_load,
            allowlist: config.policy_digests().map_err(NodeError::Access)?,
        });
        if config.verify_all_reads {
            tracing::warn!("verify_all_reads is no longer needed: every read is verified per 4 KiB block");
        }
        if config.insecure {
            tracing::warn!(
                "access control is OFF (--insecure): the control API checks no credential and any client that \
                 reaches the data port reads any sealed dataset; for local development only"
            );
        }

        let steering = if config.ebpf {
            match start_steering(&plane).await {
                Ok(steering) => Some(steering),
                Err(err) => {
                    tracing::warn!("eBPF steering unavailable, lanes by batch size only: {err}");
                    None
                }
            }
        } else {
            None
        };
        let bind_error = |source| NodeError::Bind { what: "the data plane", addr: config.listen, source };
        // The data port is a SO_REUSEPORT group. Without steering, one
        // listener per core, each served on its core's event loop (the
        // kernel's hash of the connection's addresses picks the core). With
        // steering, two: the sk_reuseport program picks the latency-lane
        // listener, served on core 0, or the bulk one, served on the others.
        let (data_listeners, latency_listener) = match &steering {
            Some(steering) => {
                let (latency, bulk) = sluice_ebpf::steer::reuseport_pair(config.listen, 1024).map_err(bind_error)?;
                steering.attach_listeners(&latency, &bulk).map_err(|e| bind_error(std::io::Error::other(e)))?;
                (vec![bulk], Some(latency))
            }
            None => (
                sluice_ebpf::steer::reuseport_group(config.listen, plane.core_count(), 1024).map_err(bind_error)?,
                None,
            ),
        };
        let control_listener = TcpListener::bind(config.control).await.map_err(|source| NodeError::Bind {
            what: "the control API",
            addr: config.control,
            source,
        })?;
        let rdma_listener = match config.rdma_listen {
            Some(addr) => Some(bind_rdma(addr, &plane)?),
            None => None,
        };
        let data_addr = data_listeners[0].local_addr().unwrap_or(config.listen);
        let control_addr = control_listener.local_addr().unwrap_or(config.control);
        control.set_info(|info| {
            info.name = config.name.clone();
            info.version = env!("CARGO_PKG_VERSION").to_string();
            info.data_addr = data_addr.to_string();
            info.control_addr = control_addr.to_string();
            info.driver = plane.describe().to_string();
            info.grants_required = !config.insecure;
            info.data_tls = config.data_tls;
            info.rdma_addr = config.rdma_listen.map(|addr| addr.to_string());
        });

        let (shutdown, shutdown_rx) = watch::channel(false);
        let server_config = ServerConfig {
            node_name: config.name.clone(),
            credits: config.credits,
            write_timeout: std::time::Duration::from_millis(config.write_timeout_ms.max(1)),
            connections_max: config.connections_max.max(1),
            ranges_per_batch_max: sluice_proto::wire::RANGES_PER_BATCH_MAX,
            batch_footprint_max_bytes: sluice_proto::wire::BATCH_FOOTPRINT_MAX_BYTES,
            accepted: Arc::default(),
            tls: if config.data_tls { tls.clone() } else { None },
            handshake_timeout: std::time::Duration::from_millis(config.handshake_timeout_ms.max(1)),
            idle_timeout: std::time::Duration::from_secs(config.idle_timeout_s.max(1)),
            connections_per_source_max: config.connections_per_source_max.max(1),
            drain_bytes_per_s_min: config.drain_bytes_per_s_min.max(1),
            socket_io: match config.socket_io {
                SocketIoChoice::Uring => sluice_serve::SocketIo::Uring,
                SocketIoChoice::Readiness => sluice_serve::SocketIo::Readiness,
            },
        };
        // Control work (the HTTP API, opens, the catalog, replication) runs
        // on a runtime of its own, so no catalog call, fsync, etcd request
        // or NVMe admin command runs on a thread that serves data.
        let control_runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(CONTROL_THREADS)
            .thread_name("sluice-control")
            .enable_all()
            .build()
            .map_err(|source| NodeError::DataDir { path: "the control runtime".into(), source })?;
        let metrics_listener = match config.metrics_listen {
            Some(addr) => Some(TcpListener::bind(addr).await.map_err(|source| NodeError::Bind {
                what: "the metrics listener",
                addr,
                source,
            })?),
            None => None,
        };
        if config.ebpf {
            let kernel_trace = match config.driver {
                DriverChoice::Uring if config.ebpf_kernel_trace => Ok(()),
                DriverChoice::Uring => Err("kernel-side tracing is off (--no-kernel-trace)"),
                DriverChoice::Mem | DriverChoice::Spdk => Err("the node's driver is not io_uring"),
            };
            match attach_tracer(&control, kernel_trace) {
                Ok(()) => tracing::info!("eBPF trace attached to this node's probes"),
                Err(err) => tracing::warn!("eBPF unavailable, running without probes: {err}"),
            }
        }
        // Everything that needs root is held now; nothing is served yet.
        if let Some(user) = &config.user {
            crate::privilege::drop_to(user, &config.data_dir).map_err(NodeError::Privilege)?;
        }
        let resolver = Arc::new(Resolver::new(Arc::clone(&control), control_runtime.handle().clone()));
        let mut tasks = Vec::with_capacity(4);
        // The two worker sockets share the connection limit: a quarter for
        // the latency lane's, the rest for the bulk lane's.
        let latency_connections_max = (server_config.connections_max / 4).max(1);
        let cores = plane.core_count();
        let mut bulk_cores = 0..cores;
        if let (Some(listener), Some(steering)) = (latency_listener, &steering) {
            let config = ServerConfig {
                accepted: Arc::clone(&steering.latency_connections),
                connections_max: latency_connections_max,
                ..server_config.clone()
            };
            let latency = TcpServer::new(Arc::clone(&plane), plane.core_group(0..1), Arc::clone(&resolver), config);
            tasks.push(latency.serve_on_core(listener, 0, shutdown_rx.clone()));
            if cores > 1 {
                // The latency lane has a core of its own.
                bulk_cores = 1..cores;
            }
        }
        let server_config = match &steering {
            Some(steering) => ServerConfig {
                accepted: Arc::clone(&steering.bulk_connections),
                connections_max: server_config.connections_max.saturating_sub(latency_connections_max).max(1),
                ..server_config
            },
            None => server_config,
        };
        if let Some(listener) = rdma_listener {
            // RDMA connections carry small and bulk batches alike: they are
            // placed on the bulk cores, leaving `--ebpf`'s latency core to
            // the latency lane's TCP connections.
            let group = plane.core_group(bulk_cores.clone());
            tasks.push(serve_rdma(listener, Arc::clone(&resolver), server_config.clone(), group, shutdown_rx.clone()));
        }
        let data_server =
            TcpServer::new(Arc::clone(&plane), plane.core_group(bulk_cores.clone()), resolver, server_config);
        for (listener, core) in listeners_for_cores(data_listeners, bulk_cores).map_err(bind_error)? {
            tasks.push(data_server.serve_on_core(listener, core, shutdown_rx.clone()));
        }
        let metrics_addr = metrics_listener.as_ref().and_then(|listener| listener.local_addr().ok());
        if let Some(listener) = metrics_listener {
            tracing::info!(
                "GET /metrics open to anyone on {} (metrics_listen)",
                metrics_addr.map(|a| a.to_string()).unwrap_or_default()
            );
            let router = api::metrics_router(Arc::clone(&control));
            tasks.push(serve_control(control_runtime.handle(), listener, None, router, shutdown_rx.clone()));
        }
        let router = api::router(Arc::clone(&control));
        let control_task = serve_control(control_runtime.handle(), control_listener, tls.clone(), router, shutdown_rx);
        if let Some(steering) = steering {
            control.set_policy_control(steering);
        }
        tasks.push(control_task);
        if config.etcd.is_some() {
            let host = |addr: SocketAddr| config.advertise.clone().unwrap_or_else(|| addr.ip().to_string());
            control.join_cluster(
                format!(
                    "{}://{}:{}",
                    if tls.is_some() { "https" } else { "http" },
                    host(control_addr),
                    control_addr.port()
                ),
                format!("{}:{}", host(data_addr), data_addr.port()),
                std::time::Duration::from_secs(config.member_ttl_s.max(1)),
            )?;
            tracing::info!("joined the cluster: {}", control.catalog().describe());
            tasks.push(control_runtime.spawn(crate::cluster_loops::run(Arc::clone(&control), shutdown.subscribe())));
            tasks.push(
                control_runtime.spawn(crate::cluster_loops::refresh_grants(Arc::clone(&control), shutdown.subscribe())),
            );
        }
        tasks.push(
            control_runtime.spawn(crate::cluster_loops::expire_grants(Arc::clone(&control), shutdown.subscribe())),
        );
        if let Some(files) = token_files {
            let follow = sluice_control::token_files::follow(Arc::clone(&control), files, shutdown.subscribe());
            tasks.push(control_runtime.spawn(follow));
        }
        {
            // Warms a restart interrupted go on, on the control runtime
            // where their fills belong.
            let control = Arc::clone(&control);
            control_runtime.spawn(async move {
                if let Err(err) = control.resume_warms().await {
                    tracing::error!(%err, "going on with interrupted warms");
                }
            });
        }
        let rdma_addr = config.rdma_listen;
        Ok(Self {
            control_runtime: Some(control_runtime),
            control_addr,
            control_tls: tls.is_some(),
            data_addr,
            rdma_addr,
            metrics_addr,
            control,
            plane,
            shutdown,
            tasks,
        })
    }

    pub fn control_url(&self) -> String {
        format!("{}://{}", if self.control_tls { "https" } else { "http" }, self.control_addr)
    }

    pub fn describe(&self) -> &str {
        self.plane.describe()
    }

    /// Stops accepting, lets the control API finish its requests, and stops
    /// the data-plane cores after their in-flight I/O.
    pub async fn shutdown(mut self) {
        self.control.leave_cluster();
        let _ = self.shutdown.send(true);
        for task in std::mem::take(&mut self.tasks) {
            let _ = task.await;
        }
        let plane = Arc::clone(&self.plane);
        let _ = tokio::task::spawn_blocking(move || plane.shutdown()).await;
        if let Some(runtime) = self.control_runtime.take() {
            runtime.shutdown_background();
        }
    }
}

/// Which core serves each data-port listener: one listener per core as
/// bound, or one listener (the bulk lane's) accepted from by each core.
fn listeners_for_cores(
    listeners: Vec<std::net::TcpListener>,
    cores: std::ops::Range<usize>,
) -> std::io::Result<Vec<(std::net::TcpListener, usize)>> {
    if listeners.len() == cores.len() {
        return Ok(listeners.into_iter().zip(cores).collect());
    }
    let [listener] = <[_; 1]>::try_from(listeners)
        .map_err(|group| std::io::Error::other(format!("{} listeners for {} cores", group.len(), cores.len())))?;
    cores.map(|core| Ok((listener.try_clone()?, core))).collect()
}

/// Who may call what: operator tokens from `admin_tokens`, or the node's
/// own `DATA_DIR/admin.token` made at first start (logged, never printed),
/// operator certificate names, the scraper's metrics tokens; and the token
/// files, to follow as they change (none for `--insecure`).
fn access_policy(
    config: &NodeConfig,
) -> Result<(sluice_control::auth::AccessPolicy, Option<sluice_control::token_files::TokenFiles>), NodeError> {
    use sluice_control::auth::{AccessPolicy, HostCheck, TokenSet};
    let access = |e: sluice_control::auth::AuthSetupError| NodeError::Access(e.to_string());
    let grant_ttl_max = match config.grant_ttl_max_s.map(std::time::Duration::from_secs) {
        Some(max) if !sluice_proto::api::grant_ttl_in_bounds(max) => {
            return Err(NodeError::Config(format!(
                "grant_ttl_max_s = {}: from 1 to {} (ten years)",
                max.as_secs(),
                sluice_proto::api::GRANT_TTL_S_MAX
            )))
        }
        max => max,
    };
    for name in &config.insecure_hosts {
        sluice_control::auth::check_insecure_host(name).map_err(NodeError::Config)?;
    }
    if config.insecure {
        let hosts = if config.control.ip().is_loopback() {
            HostCheck::Loopback
        } else {
            // The name it advertises too: its peers and clients reach it
            // by that name.
            HostCheck::Listed(config.insecure_hosts.iter().chain(config.advertise.as_ref()).cloned().collect())
        };
        return Ok((AccessPolicy { insecure: true, grant_ttl_max, hosts, ..AccessPolicy::default() }, None));
    }
    let (operator_tokens, operators_file) = match &config.admin_tokens {
        Some(path) => (TokenSet::load(path).map_err(access)?, path.clone()),
        None => {
            let (tokens, path, created) = TokenSet::load_or_create(&config.data_dir).map_err(access)?;
            if created {
                tracing::info!(
                    "made an operator token in {} (mode 0600): sluicectl --admin-token-file {} (or \
                     SLUICE_ADMIN_TOKEN); give the node --admin-tokens FILE to manage operators yourself",
                    path.display(),
                    path.display()
                );
            } else {
                tracing::info!("operator token: {}", path.display());
            }
            (tokens, path)
        }
    };
    let metrics_tokens = match &config.metrics_tokens {
        Some(path) => Some(TokenSet::load(path).map_err(access)?),
        None => None,
    };
    if !config.operator_cert_names.is_empty() && config.tls_client_ca.is_none() {
        return Err(NodeError::Access("operator_cert_names needs tls_client_ca to verify client certificates".into()));
    }
    let policy = AccessPolicy {
        insecure: false,
        operator_tokens,
        operator_cert_names: config.operator_cert_names.clone(),
        metrics_tokens,
        grant_ttl_max,
        hosts: HostCheck::Any,
    };
    let files = sluice_control::token_files::TokenFiles::new(operators_file, config.metrics_tokens.clone());
    Ok((policy, Some(files)))
}

/// Worker threads of the control runtime.
const CONTROL_THREADS: usize = 2;

impl Drop for Node {
    fn drop(&mut self) {
        // A runtime may not be dropped from inside another's async context.
        if let Some(runtime) = self.control_runtime.take() {
            runtime.shutdown_background();
        }
    }
}
