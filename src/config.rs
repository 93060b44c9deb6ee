//! Node configuration: command-line flags over an optional TOML file over
//! these defaults.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use serde::Deserialize;

/// Default control API address; `sluicectl` looks here unless told otherwise.
pub const DEFAULT_CONTROL_ADDR: &str = "127.0.0.1:7070";
/// Default data-plane (TCP transport) address.
pub const DEFAULT_DATA_ADDR: &str = "127.0.0.1:7071";

#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DriverChoice {
    Uring,
    Mem,
    /// SPDK's user-space NVMe driver on the controllers in `nvme` (a build
    /// with `--features spdk`).
    Spdk,
}

/// How plain-TCP connections move their bytes: see
/// [`sluice_serve::SocketIo`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SocketIoChoice {
    /// The core's socket ring (io_uring), falling back to readiness where
    /// the kernel gives no io_uring.
    Uring,
    /// Readiness (epoll) and a syscall per read or write: the default,
    /// measured faster at queue depth 1 while the socket ring is a ring
    /// of its own beside the block queue's.
    #[default]
    Readiness,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum IoModeChoice {
    Direct,
    Buffered,
}

/// Everything a node is started with. Field names are the TOML keys.
#[derive(Clone, Debug, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct NodeConfig {
    pub data_dir: PathBuf,
    /// Data-plane TCP address.
    pub listen: SocketAddr,
    /// Control API address.
    pub control: SocketAddr,
    /// RDMA transport address: an IP of an RDMA device (rdma_cm port).
    /// Off when unset; needs a build with the `rdma` feature.
    pub rdma_listen: Option<SocketAddr>,
    pub name: String,
    pub driver: DriverChoice,
    /// O_DIRECT (`direct`) or page cache (`buffered`) for file namespaces.
    pub io_mode: IoModeChoice,
    /// Block devices (NVMe namespaces such as `/dev/nvme0n2`) this node owns:
    /// each new dataset gets a whole one while one is free, then a file
    /// under `data_dir`. Their contents are the node's to overwrite.
    pub namespace_devices: Vec<PathBuf>,
    /// NVMe controllers (`/dev/nvme0`) whose detached namespaces the node
    /// attaches, one per dataset, once no namespace device is free; delete
    /// detaches them again.
    pub nvme_controllers: Vec<PathBuf>,
    /// PCI addresses (`0000:00:05.0`) of the NVMe controllers the SPDK
    /// driver owns (bound to vfio-pci); each dataset takes a whole
    /// namespace of one.
    pub nvme: Vec<String>,
    /// Data-plane cores; each owns a queue pair and a DMA arena.
    pub cores: usize,
    /// DMA slots (128 KiB each) per core.
    pub slots_per_core: usize,
    /// io_uring submission queue depth per core.
    pub queue_depth: u32,
    /// Batches one connection may have in flight.
    pub credits: u32,
    /// Verify every read against the block checksums of the 4 KiB blocks it covers.
    pub verify_chunks: bool,
    /// Accepted for old configs and otherwise ignored: every read is now
    /// verified per 4 KiB block.
    pub verify_all_reads: bool,
    /// A client that does not read a response within this is dropped.
    pub write_timeout_ms: u64,
    /// Data-plane connections served at once; more are refused.
    pub connections_max: usize,
    /// Data-plane connections one source address may hold at once.
    pub connections_per_source_max: usize,
    /// A data-plane connection must say Hello and open a dataset within
    /// this, or it is closed.
    pub handshake_timeout_ms: u64,
    /// A data-plane connection with nothing in flight that sends nothing
    /// for this long is closed.
    pub idle_timeout_s: u64,
    /// A response must drain at least this fast, or its connection is
    /// dropped and its DMA slots come back.
    pub drain_bytes_per_s_min: u64,
    /// Drop root for this user once devices and ports are open.
    pub user: Option<String>,
    /// Attach the eBPF trace and the steering policy to this node's probes,
    /// and steer the data port with sk_reuseport (needs root).
    pub ebpf: bool,
    /// With `ebpf`, also time the node's io_uring requests on the kernel's
    /// tracepoints (one in 8; the tracepoints fire for every request).
    pub ebpf_kernel_trace: bool,
    /// Without a policy decision, batches asking for at most this many
    /// bytes take the latency lane; 0 puts every batch in the bulk lane
    /// (one FIFO lane: the baseline of the steering benchmark).
    pub latency_lane_max_bytes: u64,
    /// Microseconds a data-plane core that just did work keeps polling
    /// (its queue, its inbox and its connections' sockets) before it
    /// sleeps, so a queue-depth-1 client's next batch finds it awake
    /// instead of paying a wake-up; while its reads are at the device it
    /// polls as long as its batches have lately taken (at most 1 ms); an
    /// idle core still sleeps. 0 sleeps at once, reads out or not.
    /// Default [`sluice_dataplane::POLL_WINDOW_US_DEFAULT`] (where the
    /// choice is measured).
    pub poll_window_us: u64,
    /// Bytes of bulk-lane reads a data-plane core keeps at the device at
    /// once; more wait in the core, behind the latency lane, instead of in
    /// the kernel's queues where a small read would wait behind them. 0
    /// bounds them only by three quarters of the queue. Default
    /// [`sluice_dataplane::BULK_IN_FLIGHT_BYTES_DEFAULT`] (where the choice
    /// is measured).
    pub bulk_in_flight_bytes: u64,
    /// How plain-TCP connections' sockets are driven (`readiness`, the
    /// default, or `uring`).
    pub socket_io: SocketIoChoice,
    /// Source-backed datasets: how long one request to an object store,
    /// body included, may take before it is cut off and retried (a stalled
    /// response).
    pub source_timeout_ms: u64,
    /// Source-backed datasets: retries of a failed fetch (a 5xx, a reset,
    /// a timeout, a short body) before its ranges fail as unavailable.
    pub source_retries: u32,
    /// Source-backed datasets: ranged GETs in flight at once, node-wide.
    pub source_fetches_max: usize,
    /// Source-backed datasets: what the node fetches from, as schemes
    /// (`s3://`) or URL prefixes (`s3://corpus/tokenized/`,
    /// `https://data.example.com/sets/`, `file:///srv/datasets/`),
    /// checked on every fetch whoever wrote the dataset's record. Unset:
    /// the object stores (`s3`, `gs`, `az` and Azure's other schemes);
    /// `http`, `https` and `file` sources must be listed. See
    /// `sluice_control::source::allow`.
    pub source_allow: Option<Vec<String>>,
    /// Source-backed datasets: bytes of their chunks the node keeps at
    /// most (0: no budget). A fill past it evicts the coldest chunks of
    /// unpinned source-backed datasets; ingested datasets are not counted
    /// and never evicted.
    pub cache_bytes_max: u64,
    /// No access control at all: the control API checks no credential and
    /// any client reaching the data port reads any sealed dataset; listens
    /// off loopback without TLS. Local development only; the node warns.
    pub insecure: bool,
    /// Host names an `insecure` node whose control API listens off
    /// loopback answers requests addressed to, besides IP addresses and
    /// `localhost` (`--insecure-host`; the `advertise` name is answered
    /// as well): a request whose `Host` is another
    /// name is refused, since a web page that rebinds its own name to the
    /// node (DNS rebinding) sends that name. An insecure node on loopback
    /// answers loopback names alone; a node that checks credentials, any.
    pub insecure_hosts: Vec<String>,
    /// Operator tokens, one per line (the token or `blake3:<hex>` of it);
    /// the file must be private (mode 0600). Without it (and without
    /// `insecure`) the node makes `DATA_DIR/admin.token` at first start.
    pub admin_tokens: Option<PathBuf>,
    /// Append the audit records (every control API call that changes
    /// something, every refused call, every refused data-port open: who,
    /// from where, what, the outcome) to this file as JSON lines, besides
    /// the node's log (made 0600; refused if others can read it). See
    /// `sluice_control::audit`.
    pub audit_log: Option<PathBuf>,
    /// The longest lifetime, in seconds, of a grant this node issues: a
    /// grant asked for without a lifetime gets this one, and one asked for
    /// longer is cut to it (as the Kubernetes API server's
    /// `--service-account-max-token-expiration`). None: grants without a
    /// lifetime stand until revoked.
    pub grant_ttl_max_s: Option<u64>,
    /// Serve `GET /metrics`, unauthenticated, on this address of its own
    /// (for a scraper on a monitoring network). With port 0 the kernel
    /// chooses; sluiced prints the bound address
    /// (`sluiced: metrics on http://ADDR/metrics`).
    pub metrics_listen: Option<SocketAddr>,
    /// Bearer tokens (a file like `admin_tokens`) that may read
    /// `GET /metrics` on the control API and nothing else.
    pub metrics_tokens: Option<PathBuf>,
    /// PEM certificate chain and key: the control API serves HTTPS.
    pub tls_cert: Option<PathBuf>,
    pub tls_key: Option<PathBuf>,
    /// PEM CA whose client certificates identify their holder (mTLS): an
    /// operator by `operator_cert_names`, a reader by a grant's `cert_name`.
    pub tls_client_ca: Option<PathBuf>,
    /// The TCP data port speaks TLS too, with the same certificate.
    pub data_tls: bool,
    /// Client-certificate CNs that are operators.
    pub operator_cert_names: Vec<String>,
    /// Operators may swap the steering policy at run time (`PUT
    /// /v1/policy`). Off by default: a policy runs in the kernel.
    pub policy_load: bool,
    /// With `policy_load`, only objects with these sha256 digests
    /// (`sha256:<hex>` or bare hex) may be loaded.
    pub policy_allowlist: Vec<String>,
    /// Take the catalog as the truth where the data directory belongs to
    /// another (`--adopt`, once; never from a config file).
    #[serde(skip)]
    pub adopt: bool,
    /// Namespace devices to use although something else's signature is on
    /// them (`--claim-device`, for one start; never from a config file).
    #[serde(skip)]
    pub claim_devices: Vec<PathBuf>,
    /// Fault injection for tests and drills (never in production).
    pub faults: Option<FaultsConfig>,
    /// etcd client endpoint (`http://host:2379`): keep the catalog there,
    /// shared with every node started with the same endpoint and prefix,
    /// instead of the local redb file.
    pub etcd: Option<String>,
    /// Key prefix of this cluster in etcd.
    pub etcd_prefix: String,
    /// CA (PEM) etcd's server certificate chains to (`https://` endpoint).
    pub etcd_ca: Option<PathBuf>,
    /// Client certificate and key (PEM) for etcd's `--client-cert-auth`.
    pub etcd_cert: Option<PathBuf>,
    pub etcd_key: Option<PathBuf>,
    /// etcd user this node signs in as (etcd authentication enabled); its
    /// role should allow only this node's own keys (deploy/README.md).
    pub etcd_user: Option<String>,
    /// File holding that user's password (one line).
    pub etcd_password_file: Option<PathBuf>,
    /// This node's id in the cluster; the node `name` when unset.
    pub node_id: Option<String>,
    /// Nodes that hold a copy of each dataset (cluster only).
    pub replicas: usize,
    /// Host or IP clients and peers reach this node at; the listening
    /// address's IP when unset (set it when listening on 0.0.0.0).
    pub advertise: Option<String>,
    /// Seconds a node's membership outlives its last renewal: how soon a
    /// killed node leaves the cluster.
    pub member_ttl_s: u64,
    /// Seconds a dataset may have fewer than `replicas` live placed nodes
    /// before a live node takes a copy in the dead one's place.
    pub repair_after_s: u64,
}

/// Faults injected by the driver, by namespace byte range `[start, end)`.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct FaultsConfig {
    pub io_errors: Vec<[u64; 2]>,
    pub corruptions: Vec<[u64; 2]>,
    /// `[start, end, milliseconds]`.
    pub delays: Vec<[u64; 3]>,
}

impl Default for NodeConfig {
    fn default() -> Self {
        let cores = std::thread::available_parallelism().map(|n| n.get().clamp(1, 8)).unwrap_or(2);
        Self {
            data_dir: PathBuf::from("sluice-data"),
            listen: DEFAULT_DATA_ADDR.parse().expect("valid default address"),
            control: DEFAULT_CONTROL_ADDR.parse().expect("valid default address"),
            rdma_listen: None,
            name: hostname(),
            driver: DriverChoice::Uring,
            io_mode: IoModeChoice::Direct,
            namespace_devices: Vec::new(),
            nvme_controllers: Vec::new(),
            nvme: Vec::new(),
            cores,
            slots_per_core: 512,
            queue_depth: 256,
            credits: 64,
            verify_chunks: true,
            verify_all_reads: false,
            write_timeout_ms: 30_000,
            connections_max: 4096,
            connections_per_source_max: 512,
            handshake_timeout_ms: 5000,
            idle_timeout_s: 600,
            drain_bytes_per_s_min: 1 << 20,
            user: None,
            ebpf: false,
            ebpf_kernel_trace: true,
            latency_lane_max_bytes: 512 * 1024,
            poll_window_us: sluice_dataplane::POLL_WINDOW_US_DEFAULT,
            bulk_in_flight_bytes: sluice_dataplane::BULK_IN_FLIGHT_BYTES_DEFAULT,
            socket_io: SocketIoChoice::default(),
            source_timeout_ms: 30_000,
            source_retries: 4,
            source_fetches_max: 16,
            source_allow: None,
            cache_bytes_max: 0,
            insecure: false,
            insecure_hosts: Vec::new(),
            admin_tokens: None,
            audit_log: None,
            grant_ttl_max_s: None,
            metrics_listen: None,
            metrics_tokens: None,
            tls_cert: None,
            tls_key: None,
            tls_client_ca: None,
            data_tls: false,
            operator_cert_names: Vec::new(),
            policy_load: false,
            policy_allowlist: Vec::new(),
            adopt: false,
            claim_devices: Vec::new(),
            faults: None,
            etcd: None,
            etcd_prefix: "/sluice".into(),
            etcd_ca: None,
            etcd_cert: None,
            etcd_key: None,
            etcd_user: None,
            etcd_password_file: None,
            node_id: None,
            replicas: 2,
            advertise: None,
            member_ttl_s: 3,
            repair_after_s: 60,
        }
    }
}

impl NodeConfig {
    /// The control API's TLS files, when it serves HTTPS.
    pub fn control_tls(&self) -> Result<Option<sluice_transport::tls::ServerTlsFiles>, String> {
        match (&self.tls_cert, &self.tls_key) {
            (Some(cert), Some(key)) => Ok(Some(sluice_transport::tls::ServerTlsFiles {
                cert: cert.clone(),
                key: key.clone(),
                client_ca: self.tls_client_ca.clone(),
            })),
            (None, None) if self.tls_client_ca.is_none() && !self.data_tls => Ok(None),
            (None, None) => Err("tls_client_ca and data_tls need tls_cert and tls_key".into()),
            _ => Err("tls_cert and tls_key go together: set both or neither".into()),
        }
    }

    /// How the node reaches and signs in to etcd, from the `etcd_*` keys.
    pub fn etcd_access(&self) -> Result<sluice_control::etcd::EtcdAccess, String> {
        let identity = match (&self.etcd_cert, &self.etcd_key) {
            (Some(cert), Some(key)) => Some((cert.clone(), key.clone())),
            (None, None) => None,
            _ => return Err("etcd_cert and etcd_key go together: set both or neither".into()),
        };
        let user = match (&self.etcd_user, &self.etcd_password_file) {
            (Some(user), Some(file)) => Some((user.clone(), sluice_control::etcd::read_password_file(file)?)),
            (None, None) => None,
            _ => return Err("etcd_user and etcd_password_file go together: set both or neither".into()),
        };
        // Set only with a user: the match above refuses a file without one.
        let password_file = self.etcd_password_file.clone();
        Ok(sluice_control::etcd::EtcdAccess { ca: self.etcd_ca.clone(), identity, user, password_file })
    }

    /// Why this config must not start: a listener off loopback with no
    /// TLS (and no `insecure`), which would send tokens and data in clear
    /// to whoever is on the network.
    pub fn exposure(&self) -> Option<String> {
        if self.insecure {
            return None;
        }
        let control_tls = self.tls_cert.is_some();
        if !self.control.ip().is_loopback() && !control_tls {
            return Some(format!(
                "the control API would listen on {} (not loopback) without TLS: set tls_cert and tls_key \
                 (--tls-cert, --tls-key), or --insecure on a network you trust",
                self.control
            ));
        }
        if !self.listen.ip().is_loopback() && !self.data_tls {
            return Some(format!(
                "the data port would listen on {} (not loopback) without TLS: set data_tls = true (--data-tls) \
                 with tls_cert and tls_key, or --insecure on a network you trust",
                self.listen
            ));
        }
        None
    }

    /// `source_allow` as the list the sources check, or its default.
    pub fn source_allow_list(&self) -> Result<sluice_control::source::allow::SourceAllowList, String> {
        match &self.source_allow {
            None => Ok(sluice_control::source::allow::SourceAllowList::default()),
            Some(entries) => sluice_control::source::allow::SourceAllowList::parse(entries),
        }
    }

    /// `policy_allowlist` as digests.
    pub fn policy_digests(&self) -> Result<Option<Vec<[u8; 32]>>, String> {
        if self.policy_allowlist.is_empty() {
            return Ok(None);
        }
        let parse = |text: &str| sluice_control::hex::decode_32(text.strip_prefix("sha256:").unwrap_or(text));
        self.policy_allowlist
            .iter()
            .map(|entry| parse(entry).ok_or_else(|| format!("policy_allowlist entry {entry:?} is not sha256:<64 hex>")))
            .collect::<Result<Vec<_>, _>>()
            .map(Some)
    }

    /// Reads a TOML file; keys absent from it keep their defaults.
    pub fn from_file(path: &Path) -> Result<Self, String> {
        let text = std::fs::read_to_string(path).map_err(|e| format!("reading {}: {e}", path.display()))?;
        toml::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))
    }
}

fn hostname() -> String {
    nix::unistd::gethostname().ok().and_then(|h| h.into_string().ok()).unwrap_or_else(|| "sluice".to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A partial file keeps defaults; unknown keys are refused, not ignored.
    #[test]
    fn config_file_overrides_defaults() {
        let config: NodeConfig = toml::from_str("cores = 3\nio_mode = \"buffered\"\n").expect("parse");
        assert_eq!(config.cores, 3);
        assert_eq!(config.io_mode, IoModeChoice::Buffered);
        assert_eq!(config.credits, NodeConfig::default().credits);
        assert!(toml::from_str::<NodeConfig>("coress = 3").is_err());
    }

    /// `source_allow` replaces the default list of object-store schemes;
    /// an entry that names no prefix stops the start with its name.
    #[test]
    fn source_allow_replaces_the_object_stores_default() {
        let permits = |config: &NodeConfig, url: &str| {
            config.source_allow_list().expect("list").permits(&url::Url::parse(url).expect("url"))
        };
        let default = NodeConfig::default();
        assert!(permits(&default, "s3://bucket/key") && !permits(&default, "file:///etc/passwd"));
        let config: NodeConfig = toml::from_str("source_allow = [\"file:///srv/data/\"]\n").expect("parse");
        assert!(permits(&config, "file:///srv/data/a.bin"));
        assert!(!permits(&config, "s3://bucket/key"), "the list replaces the default");
        let bad: NodeConfig = toml::from_str("source_allow = [\"s3:\"]\n").expect("parse");
        assert!(bad.source_allow_list().expect_err("bad entry").contains("\"s3:\""));
    }

    /// A listener off loopback needs TLS unless the node is insecure; the
    /// refusal names the setting.
    #[test]
    fn exposed_listeners_need_tls() {
        let mut config = NodeConfig { control: "0.0.0.0:7070".parse().expect("addr"), ..NodeConfig::default() };
        assert!(config.exposure().is_some_and(|why| why.contains("tls_cert")));
        config.tls_cert = Some("c.pem".into());
        config.tls_key = Some("k.pem".into());
        assert_eq!(config.exposure(), None);
        config.listen = "0.0.0.0:7071".parse().expect("addr");
        assert!(config.exposure().is_some_and(|why| why.contains("data_tls")));
        config.data_tls = true;
        assert_eq!(config.exposure(), None);
        let open =
            NodeConfig { control: "0.0.0.0:7070".parse().expect("addr"), insecure: true, ..NodeConfig::default() };
        assert_eq!(open.exposure(), None);
    }

    /// The node's etcd access names the password file, which the client
    /// reads again at each sign-in (`tests/catalog_store.rs` rotates it);
    /// the password is the file's first line, and an empty one is refused.
    #[test]
    fn etcd_access_reads_the_password_file_and_keeps_its_name() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("etcd.password");
        std::fs::write(&file, "s3cret\r\n").expect("write");
        let config = NodeConfig {
            etcd_user: Some("n1".into()),
            etcd_password_file: Some(file.clone()),
            ..NodeConfig::default()
        };
        let access = config.etcd_access().expect("access");
        assert_eq!(access.password_file.as_deref(), Some(file.as_path()));
        let (user, password) = access.user.expect("a user");
        assert_eq!((user.as_str(), password.expose()), ("n1", "s3cret"));
        std::fs::write(&file, "\n").expect("write");
        assert!(config.etcd_access().is_err_and(|why| why.contains("is empty")));
        assert!(NodeConfig::default().etcd_access().expect("no user").password_file.is_none());
    }

    #[test]
    fn allowlist_entries_are_digests() {
        let hex = "ab".repeat(32);
        let config =
            NodeConfig { policy_allowlist: vec![format!("sha256:{hex}"), hex.clone()], ..NodeConfig::default() };
        assert_eq!(config.policy_digests().expect("parse").map(|d| d.len()), Some(2));
        let bad = NodeConfig { policy_allowlist: vec!["sha256:xyz".into()], ..NodeConfig::default() };
        assert!(bad.policy_digests().is_err());
    }

    /// The configs shipped in deploy/ parse.
    #[test]
    fn deploy_configs_parse() {
        for (name, text) in [
            ("sluiced.toml", include_str!("../deploy/sluiced.toml")),
            ("sluiced-cluster.toml", include_str!("../deploy/sluiced-cluster.toml")),
        ] {
            let config: NodeConfig = toml::from_str(text).unwrap_or_else(|e| panic!("deploy/{name}: {e}"));
            assert_eq!(config.data_dir, PathBuf::from("/var/lib/sluice"), "deploy/{name}");
            assert_eq!(config.exposure(), None, "deploy/{name} would be refused at start");
            assert!(config.control_tls().is_ok_and(|tls| tls.is_some()), "deploy/{name} serves TLS");
        }
        let cluster: NodeConfig = toml::from_str(include_str!("../deploy/sluiced-cluster.toml")).expect("parse");
        assert_eq!((cluster.replicas, cluster.node_id.as_deref()), (2, Some("storage-01")));
    }
}
