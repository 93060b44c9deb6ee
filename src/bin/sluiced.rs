//! `sluiced`: one storage node — data plane and control API in one process.

use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use sluice::config::{DriverChoice, IoModeChoice, SocketIoChoice};
use sluice::{Node, NodeConfig};

#[derive(Parser, Debug)]
#[command(name = "sluiced", version, about = "Serve training datasets from NVMe to training hosts")]
struct Args {
    /// Directory holding the catalog and file-backed namespaces.
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// Data-plane (TCP transport) address [default: 127.0.0.1:7071].
    #[arg(long)]
    listen: Option<SocketAddr>,
    /// Control API (HTTP) address [default: 127.0.0.1:7070].
    #[arg(long)]
    control: Option<SocketAddr>,
    /// RDMA transport address: an IP of the RDMA device, with the rdma_cm
    /// port (e.g. 192.168.1.10:7072). Needs a build with `--features rdma`.
    #[arg(long)]
    rdma_listen: Option<SocketAddr>,
    /// TOML file with any NodeConfig keys; flags override it.
    #[arg(long)]
    config: Option<PathBuf>,
    /// Block driver: uring (files and block devices), mem, or spdk (SPDK's
    /// user-space NVMe driver on the --nvme controllers; a build with
    /// `--features spdk`).
    #[arg(long, value_parser = ["uring", "mem", "spdk"])]
    driver: Option<String>,
    /// PCI addresses of the NVMe controllers the spdk driver owns, bound to
    /// vfio-pci (e.g. 0000:00:05.0,0000:00:06.0).
    #[arg(long, value_name = "PCI,...", value_delimiter = ',')]
    nvme: Vec<String>,
    /// direct (O_DIRECT) or buffered (page cache).
    #[arg(long, value_parser = ["direct", "buffered"])]
    io_mode: Option<String>,
    /// Data-plane cores.
    #[arg(long)]
    cores: Option<usize>,
    /// A block device (NVMe namespace) new datasets may take whole;
    /// repeat for several. Its contents will be overwritten.
    #[arg(long = "namespace-device", value_name = "DEVICE")]
    namespace_devices: Vec<PathBuf>,
    /// Use this namespace device although it carries a filesystem,
    /// partition table or other signature (its contents will be lost);
    /// for this start only, repeatable.
    #[arg(long = "claim-device", value_name = "DEVICE")]
    claim_devices: Vec<PathBuf>,
    /// An NVMe controller (`/dev/nvmeX`) whose detached namespaces new
    /// datasets may take (attached through admin commands); repeatable.
    #[arg(long = "nvme-controller", value_name = "CONTROLLER")]
    nvme_controllers: Vec<PathBuf>,
    /// Run as this user once devices, memory and ports are set up (root).
    #[arg(long)]
    user: Option<String>,
    /// Trace small-read traffic with eBPF and steer it into the latency
    /// lane (needs root; `sluicectl top`, `sluicectl policy`).
    #[arg(long)]
    ebpf: bool,
    /// With --ebpf, leave the io_uring tracepoints alone (the kernel-side
    /// latency in `sluicectl top`).
    #[arg(long)]
    no_kernel_trace: bool,
    /// Batches of at most this many bytes take the latency lane where no
    /// policy decides; 0 for a single (bulk) lane.
    #[arg(long, value_name = "BYTES")]
    latency_lane_max_bytes: Option<u64>,
    /// Microseconds a data-plane core that just did work polls before it
    /// sleeps (default 100; while its reads are at the device, as long as
    /// its batches have lately taken, at most 1 ms); 0 sleeps at once.
    #[arg(long, value_name = "MICROSECONDS")]
    poll_window_us: Option<u64>,
    /// Bytes of bulk-lane reads a data-plane core keeps at the device at
    /// once (default 2 MiB); the rest wait in the node behind small reads.
    /// 0: bounded only by the queue.
    #[arg(long, value_name = "BYTES")]
    bulk_in_flight_bytes: Option<u64>,
    /// How plain-TCP connections' sockets are driven: `readiness` (epoll
    /// and a syscall each, the default) or `uring` (the core's socket
    /// ring).
    #[arg(long, value_parser = ["uring", "readiness"])]
    socket_io: Option<String>,
    /// No access control (local development only): the control API checks
    /// no credential, any client that reaches the data port reads any
    /// sealed dataset, and listeners off loopback need no TLS.
    #[arg(long)]
    insecure: bool,
    /// Operator tokens, one per line (a token or blake3:{HEX}), in a file
    /// only the node's user can read [default: DATA_DIR/admin.token, made
    /// at first start].
    #[arg(long, value_name = "FILE")]
    admin_tokens: Option<PathBuf>,
    /// PEM certificate chain: the control API serves HTTPS.
    #[arg(long, value_name = "FILE", requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// PEM private key of --tls-cert.
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// PEM CA of client certificates (mTLS): their CN names an operator
    /// (operator_cert_names) or the holder of a bound grant.
    #[arg(long, value_name = "FILE")]
    tls_client_ca: Option<PathBuf>,
    /// Serve TLS on the TCP data port too, with --tls-cert.
    #[arg(long)]
    data_tls: bool,
    /// Let operators swap the steering policy at run time (PUT /v1/policy).
    #[arg(long)]
    policy_load: bool,
    /// Take the catalog as the truth where the data directory belongs to
    /// another catalog: files it does not list are moved to
    /// DATA_DIR/orphans/ (never deleted).
    #[arg(long)]
    adopt: bool,
    /// Serve GET /metrics, unauthenticated, on this address of its own.
    #[arg(long, value_name = "HOST:PORT")]
    metrics_listen: Option<SocketAddr>,
    /// Keep the catalog in etcd at this endpoint (e.g. http://127.0.0.1:2379),
    /// shared with the other nodes of the cluster.
    #[arg(long, value_name = "URL")]
    etcd: Option<String>,
    /// Key prefix of the cluster in etcd [default: /sluice].
    #[arg(long, value_name = "PREFIX")]
    etcd_prefix: Option<String>,
    /// CA (PEM) of etcd's server certificate (an https:// --etcd).
    #[arg(long, value_name = "FILE")]
    etcd_ca: Option<PathBuf>,
    /// Client certificate (PEM) for etcd's --client-cert-auth.
    #[arg(long, value_name = "FILE", requires = "etcd_key")]
    etcd_cert: Option<PathBuf>,
    /// Its key (PEM).
    #[arg(long, value_name = "FILE", requires = "etcd_cert")]
    etcd_key: Option<PathBuf>,
    /// etcd user to sign in as (etcd with authentication enabled).
    #[arg(long, value_name = "USER", requires = "etcd_password_file")]
    etcd_user: Option<String>,
    /// File holding the etcd user's password.
    #[arg(long, value_name = "FILE", requires = "etcd_user")]
    etcd_password_file: Option<PathBuf>,
    /// This node's id in the cluster [default: the node name].
    #[arg(long, value_name = "ID")]
    node_id: Option<String>,
    /// Copies of each dataset the cluster keeps [default: 2].
    #[arg(long, value_name = "R")]
    replicas: Option<usize>,
    /// Host or IP clients and peers reach this node at [default: the
    /// listening IP].
    #[arg(long, value_name = "HOST")]
    advertise: Option<String>,
    /// Seconds a dataset may lack a live copy holder before another node
    /// takes a copy [default: 60].
    #[arg(long, value_name = "SECONDS")]
    repair_after_s: Option<u64>,
    /// Append the audit records (changes and refusals) to this file as
    /// JSON lines.
    #[arg(long, value_name = "FILE")]
    audit_log: Option<PathBuf>,
    /// The longest lifetime of a grant this node issues: grants asked for
    /// without one, or a longer one, get this [default: none].
    #[arg(long, value_name = "SECONDS")]
    grant_ttl_max_s: Option<u64>,
    /// A host name an --insecure node off loopback answers requests
    /// addressed to, besides IP addresses and localhost; repeat for more
    /// (replaces the config's `insecure_hosts`).
    #[arg(long = "insecure-host", value_name = "NAME")]
    insecure_hosts: Vec<String>,
    /// What source-backed datasets may be fetched from: schemes (s3://)
    /// or URL prefixes (https://host/path/, file:///dir/), replacing the
    /// config's list [default: s3://, gs://, az:// and Azure's other
    /// schemes; http, https and file sources must be listed].
    #[arg(long, value_name = "URL", value_delimiter = ',')]
    source_allow: Vec<String>,
}

fn main() -> ExitCode {
    // The NVMe admin helper a `--user` node starts is this executable too.
    if let Some(exit) = sluice::admin_helper::serve_if_asked() {
        return exit;
    }
    // Everything the node creates (namespaces, catalog, indexes, tokens)
    // is its own: files 0600, directories 0700.
    nix::sys::stat::umask(nix::sys::stat::Mode::from_bits_truncate(0o077));
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_env("SLUICE_LOG").unwrap_or_else(|_| "info".into()))
        .with_writer(std::io::stderr)
        .init();
    let args = Args::parse();
    let mut config = match &args.config {
        Some(path) => match NodeConfig::from_file(path) {
            Ok(config) => config,
            Err(err) => {
                eprintln!("sluiced: {err}");
                return ExitCode::from(2);
            }
        },
        None => NodeConfig::default(),
    };
    if let Some(dir) = args.data_dir {
        config.data_dir = dir;
    }
    if let Some(addr) = args.listen {
        config.listen = addr;
    }
    if let Some(addr) = args.control {
        config.control = addr;
    }
    given(&mut config.rdma_listen, args.rdma_listen);
    if let Some(cores) = args.cores {
        config.cores = cores;
    }
    config.ebpf |= args.ebpf;
    if args.no_kernel_trace {
        config.ebpf_kernel_trace = false;
    }
    if let Some(bytes) = args.latency_lane_max_bytes {
        config.latency_lane_max_bytes = bytes;
    }
    if let Some(us) = args.poll_window_us {
        config.poll_window_us = us;
    }
    if let Some(bytes) = args.bulk_in_flight_bytes {
        config.bulk_in_flight_bytes = bytes;
    }
    match args.socket_io.as_deref() {
        Some("uring") => config.socket_io = SocketIoChoice::Uring,
        Some("readiness") => config.socket_io = SocketIoChoice::Readiness,
        _ => {}
    }
    if args.audit_log.is_some() {
        config.audit_log = args.audit_log;
    }
    if args.grant_ttl_max_s.is_some() {
        config.grant_ttl_max_s = args.grant_ttl_max_s;
    }
    if !args.source_allow.is_empty() {
        config.source_allow = Some(args.source_allow);
    }
    config.insecure |= args.insecure;
    if !args.insecure_hosts.is_empty() {
        config.insecure_hosts = args.insecure_hosts;
    }
    config.data_tls |= args.data_tls;
    config.policy_load |= args.policy_load;
    config.adopt = args.adopt;
    config.claim_devices = args.claim_devices;
    given(&mut config.admin_tokens, args.admin_tokens);
    if given(&mut config.tls_cert, args.tls_cert) {
        config.tls_key = args.tls_key;
    }
    given(&mut config.tls_client_ca, args.tls_client_ca);
    given(&mut config.metrics_listen, args.metrics_listen);
    given(&mut config.etcd, args.etcd);
    if let Some(prefix) = args.etcd_prefix {
        config.etcd_prefix = prefix;
    }
    given(&mut config.node_id, args.node_id);
    given(&mut config.etcd_ca, args.etcd_ca);
    if given(&mut config.etcd_cert, args.etcd_cert) {
        config.etcd_key = args.etcd_key;
    }
    if given(&mut config.etcd_user, args.etcd_user) {
        config.etcd_password_file = args.etcd_password_file;
    }
    if let Some(replicas) = args.replicas {
        config.replicas = replicas;
    }
    given(&mut config.advertise, args.advertise);
    if let Some(seconds) = args.repair_after_s {
        config.repair_after_s = seconds;
    }
    if !args.namespace_devices.is_empty() {
        config.namespace_devices = args.namespace_devices;
    }
    if !args.nvme.is_empty() {
        config.nvme = args.nvme;
    }
    if !args.nvme_controllers.is_empty() {
        config.nvme_controllers = args.nvme_controllers;
    }
    given(&mut config.user, args.user);
    match args.driver.as_deref() {
        Some("mem") => config.driver = DriverChoice::Mem,
        Some("uring") => config.driver = DriverChoice::Uring,
        Some("spdk") => config.driver = DriverChoice::Spdk,
        _ => {}
    }
    match args.io_mode.as_deref() {
        Some("buffered") => config.io_mode = IoModeChoice::Buffered,
        Some("direct") => config.io_mode = IoModeChoice::Direct,
        _ => {}
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(err) => {
            eprintln!("sluiced: starting the runtime: {err}");
            return ExitCode::FAILURE;
        }
    };
    runtime.block_on(run(config))
}

async fn run(config: NodeConfig) -> ExitCode {
    let data_dir = config.data_dir.clone();
    let user = config.user.clone();
    let node = match Node::start(config).await {
        Ok(node) => node,
        Err(err) => {
            eprintln!("sluiced: {err}");
            return ExitCode::FAILURE;
        }
    };
    if let Some(user) = user {
        println!("sluiced: running as {user}");
    }
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "sluiced: control API on {}", node.control_url());
    let _ = writeln!(out, "sluiced: data plane (tcp) on {}", node.data_addr);
    if let Some(addr) = node.rdma_addr {
        let _ = writeln!(out, "sluiced: data plane (rdma) on {addr}");
    }
    if let Some(addr) = node.metrics_addr {
        let _ = writeln!(out, "sluiced: metrics on http://{addr}/metrics");
    }
    let _ = writeln!(out, "sluiced: {} ; data in {}", node.describe(), data_dir.display());
    let _ = out.flush();
    drop(out);
    wait_for_signal().await;
    eprintln!("sluiced: stopping");
    node.shutdown().await;
    ExitCode::SUCCESS
}

async fn wait_for_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let Ok(mut term) = signal(SignalKind::terminate()) else {
        let _ = tokio::signal::ctrl_c().await;
        return;
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}

/// Takes a flag given on the command line over the config file's value:
/// whether it was given.
fn given<T>(slot: &mut Option<T>, flag: Option<T>) -> bool {
    let was_given = flag.is_some();
    if was_given {
        *slot = flag;
    }
    was_given
}
