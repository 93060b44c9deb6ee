//! A secured etcd on loopback for the cluster tests (Debian's etcd-server
//! and etcd-client), and nodes that keep their catalog in it.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use serde_json::Value;

use sluice_control::etcd::{Etcd, EtcdAccess};

use super::{eventually, NodeProcess};

/// An etcd server on loopback ports, killed when dropped: TLS with
/// client-certificate auth and etcd authentication on, as a deployment
/// runs it; certificates made here. Nodes sign in as users whose role
/// allows their own keys only (`deploy/etcd-roles.sh`).
pub struct EtcdServer {
    child: Child,
    pub endpoint: String,
    pub pki: PathBuf,
    pub ca: PathBuf,
    pub authority: super::pki::Authority,
}

impl Drop for EtcdServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub const ROOT_PASSWORD: &str = "root-password-for-tests";

impl EtcdServer {
    pub fn etcdctl(&self, user: Option<&str>) -> Command {
        let (cert, key) = self.client_cert("root");
        let mut command = Command::new("etcdctl");
        command
            .env("ETCDCTL_API", "3")
            .env("ETCDCTL_ENDPOINTS", &self.endpoint)
            .env("ETCDCTL_CACERT", &self.ca)
            .env("ETCDCTL_CERT", cert)
            .env("ETCDCTL_KEY", key)
            .env("ETCDCTL_DIAL_TIMEOUT", "5s");
        if let Some(user) = user {
            command.env("ETCDCTL_USER", user);
        }
        command
    }

    /// A client certificate (no CN: the gateway refuses one with a CN)
    /// in files named after `cn`, made once.
    pub fn client_cert(&self, cn: &str) -> (PathBuf, PathBuf) {
        let (cert, key) = (self.pki.join(format!("{cn}.pem")), self.pki.join(format!("{cn}.key")));
        if !cert.exists() {
            super::pki::issue_without_cn(&self.pki, &self.authority, cn);
        }
        (cert, key)
    }

    /// The etcd user of node `node` in cluster `prefix`, made once with
    /// the deploy script: its password file.
    pub fn node_user(&self, prefix: &str, node: &str) -> PathBuf {
        let password = self.pki.join(format!("{node}{}.password", prefix.replace('/', "_")));
        if !password.exists() {
            std::fs::write(&password, format!("pw-{node}-{}\n", rand::random::<u64>())).expect("password");
            let etcdctl = self.etcdctl(Some(&format!("root:{ROOT_PASSWORD}")));
            let env: Vec<_> = etcdctl.get_envs().filter_map(|(k, v)| Some((k.to_owned(), v?.to_owned()))).collect();
            let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/etcd-roles.sh");
            let out = Command::new("bash")
                .arg(&script)
                .args([prefix, node])
                .arg(&password)
                .envs(env)
                .output()
                .expect("run deploy/etcd-roles.sh");
            assert!(
                out.status.success(),
                "deploy/etcd-roles.sh {prefix} {node}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        password
    }

    /// How node `node` of cluster `prefix` reaches etcd.
    pub fn access(&self, prefix: &str, node: &str) -> EtcdAccess {
        let password = self.node_user(prefix, node);
        let secret = std::fs::read_to_string(&password).expect("password").trim().to_string();
        EtcdAccess {
            ca: Some(self.ca.clone()),
            identity: Some(self.client_cert(node)),
            user: Some((node.to_string(), sluice_proto::codec::Secret::new(secret))),
            password_file: Some(password),
        }
    }

    /// etcd as its root user.
    pub fn root(&self) -> Etcd {
        let access = EtcdAccess {
            ca: Some(self.ca.clone()),
            identity: Some(self.client_cert("root")),
            user: Some(("root".into(), sluice_proto::codec::Secret::new(ROOT_PASSWORD.into()))),
            password_file: None,
        };
        Etcd::connect(&self.endpoint, &access).expect("etcd as root")
    }

    /// `sluiced` flags for node `node` of cluster `prefix`.
    pub fn node_flags(&self, prefix: &str, node: &str) -> Vec<String> {
        let password = self.node_user(prefix, node);
        let (cert, key) = self.client_cert(node);
        [
            "--etcd",
            &self.endpoint,
            "--etcd-prefix",
            prefix,
            "--etcd-ca",
            path(&self.ca),
            "--etcd-cert",
            path(&cert),
            "--etcd-key",
            path(&key),
            "--etcd-user",
            node,
            "--etcd-password-file",
            path(&password),
        ]
        .map(String::from)
        .to_vec()
    }
}

pub fn path(p: &Path) -> &str {
    p.to_str().expect("utf-8 path")
}

pub fn etcd_binary() -> Option<PathBuf> {
    std::env::var_os("PATH")
        .into_iter()
        .flat_map(|paths| std::env::split_paths(&paths).collect::<Vec<_>>())
        .chain([PathBuf::from("/usr/bin")])
        .map(|dir| dir.join("etcd"))
        .find(|path| path.is_file())
}

/// Starts a secured etcd, or says what is missing and returns `None` (a
/// failure when `SLUICE_ETCD_REQUIRE=1`, as in `.ci/run`).
pub fn start_etcd(dir: &Path) -> Option<EtcdServer> {
    let etcdctl_there = Command::new("etcdctl").arg("version").output().is_ok_and(|o| o.status.success());
    let Some(binary) = etcd_binary().filter(|_| etcdctl_there) else {
        let why = "SKIP: etcd or etcdctl is not installed (apt-get install etcd-server etcd-client); the cluster tests need both";
        assert!(std::env::var("SLUICE_ETCD_REQUIRE").as_deref() != Ok("1"), "{why}");
        eprintln!("{why}");
        return None;
    };
    let pki = dir.join("etcd-pki");
    std::fs::create_dir_all(&pki).expect("pki dir");
    let authority = super::pki::authority(&pki, "etcd-test-ca");
    let (server_cert, server_key) = super::pki::issue(&pki, &authority, "etcd-server", true);
    // Ports are chosen free, then bound by etcd a moment later; another
    // test's listener can take one in that gap and etcd then exits. Such a
    // start is tried again on other ports, in a data directory of its own.
    let ca = authority.pem.clone();
    let spawn = |tries: u32| {
        let (client, peer) = (super::free_port(), super::free_port());
        let client_url = format!("https://127.0.0.1:{client}");
        let peer_url = format!("http://127.0.0.1:{peer}");
        let child = Command::new(&binary)
            .args(["--name", "test", "--data-dir", path(&dir.join(format!("etcd-{tries}")))])
            .args(["--listen-client-urls", &client_url, "--advertise-client-urls", &client_url])
            .args(["--listen-peer-urls", &peer_url, "--initial-advertise-peer-urls", &peer_url])
            .args(["--initial-cluster", &format!("test={peer_url}")])
            .args(["--cert-file", path(&server_cert), "--key-file", path(&server_key)])
            .args(["--trusted-ca-file", path(&ca), "--client-cert-auth"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn etcd");
        (child, client_url)
    };
    let (child, endpoint) = spawn(1);
    let mut server = EtcdServer { child, endpoint, pki, ca: ca.clone(), authority };
    for tries in 1.. {
        let mut exited = false;
        let healthy = eventually(30, || {
            exited = exited || !matches!(server.child.try_wait(), Ok(None));
            exited || server.etcdctl(None).args(["endpoint", "health"]).output().is_ok_and(|o| o.status.success())
        });
        if healthy && !exited {
            break;
        }
        assert!(exited && tries < 5, "etcd did not become healthy at {} (try {tries})", server.endpoint);
        eprintln!("etcd at {} exited before it was healthy; choosing other ports", server.endpoint);
        (server.child, server.endpoint) = spawn(tries + 1);
    }
    for args in [
        vec!["user", "add", "root", &format!("--new-user-password={ROOT_PASSWORD}")],
        vec!["user", "grant-role", "root", "root"],
        vec!["auth", "enable"],
    ] {
        let out = server.etcdctl(None).args(&args).output().expect("etcdctl");
        assert!(out.status.success(), "etcdctl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    }
    Some(server)
}

pub fn start_node(dir: &Path, etcd: &EtcdServer, id: &str) -> NodeProcess {
    start_node_with(dir, etcd, id, &[])
}

pub fn start_node_with(dir: &Path, etcd: &EtcdServer, id: &str, extra: &[&str]) -> NodeProcess {
    start_node_with_env(dir, etcd, id, extra, &[])
}

/// As [`start_node_with`], with `env` in the node's environment (an
/// object store's endpoint and credentials).
pub fn start_node_with_env(
    dir: &Path,
    etcd: &EtcdServer,
    id: &str,
    extra: &[&str],
    env: &[(String, String)],
) -> NodeProcess {
    let mut flags = etcd.node_flags("/sluice-test", id);
    flags.extend(["--node-id", id, "--replicas", "2", "--repair-after-s", "2"].map(String::from));
    flags.extend(extra.iter().map(|s| s.to_string()));
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    NodeProcess::start_secure_with_env(&dir.join(id), &flags, env)
}

/// The nodes holding a copy of `name` that serves.
pub fn ready_copies(node: &NodeProcess, name: &str) -> Vec<String> {
    let status = cluster(node);
    let Some(datasets) = status["datasets"].as_array() else { return Vec::new() };
    datasets
        .iter()
        .filter(|d| d["name"] == name)
        .flat_map(|d| d["copies"].as_array().cloned().unwrap_or_default())
        .filter(|c| c["ready"] == true)
        .filter_map(|c| c["node"].as_str().map(String::from))
        .collect()
}

/// The node's `/v1/cluster` report (`null` if it did not answer).
pub fn cluster(node: &NodeProcess) -> Value {
    match node.get("/v1/cluster") {
        Ok(response) => response.into_json().unwrap_or(Value::Null),
        Err(_) => Value::Null,
    }
}

/// The members the node's cluster report lists as live.
pub fn live_members(node: &NodeProcess) -> Vec<String> {
    cluster(node)["members"]
        .as_array()
        .map(|m| m.iter().filter_map(|m| m["node"].as_str().map(String::from)).collect())
        .unwrap_or_default()
}
