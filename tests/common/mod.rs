//! Helpers for tests that run real `sluiced` processes.

#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use rand::{Rng, SeedableRng};

pub mod azure;
pub mod etcd;
pub mod gcs;
#[path = "../../ebpf/tests/hostile/compile.rs"]
mod hostile;
pub mod loopdev;
pub mod pki;
pub mod reads;
pub mod s3;
pub mod stores;

/// Prefixes of the environment variables a node reads where its object
/// stores are and which credentials reach them: `object_store`'s
/// `from_env` takes every variable starting with one of these.
const OBJECT_STORE_ENV_PREFIXES: [&str; 3] = ["AWS_", "AZURE_", "GOOGLE_"];

/// The test process's object-store settings, which its nodes must not
/// inherit: a developer's real account (an exported
/// `AWS_ACCESS_KEY_ID`, `AZURE_STORAGE_ACCOUNT_NAME` or
/// `GOOGLE_SERVICE_ACCOUNT`) would otherwise be what a test's node reaches
/// wherever the test's own settings do not override it. A test gives its
/// node the settings it means (`env`).
fn object_store_settings() -> Vec<std::ffi::OsString> {
    std::env::vars_os()
        .map(|(name, _)| name)
        .filter(|name| name.to_str().is_some_and(|name| OBJECT_STORE_ENV_PREFIXES.iter().any(|p| name.starts_with(p))))
        .collect()
}

/// A `sluiced` child process, killed when dropped.
pub struct NodeProcess {
    pub child: Child,
    pub endpoint: String,
    pub data_addr: String,
    /// The token-free metrics listener's address, when `metrics_listen`
    /// asked for one (as bound, so a config may give port 0).
    pub metrics_addr: Option<String>,
    pub data_dir: PathBuf,
    /// The operator token a secure node made for itself, if it did.
    pub admin_token: Option<String>,
}

impl NodeProcess {
    /// Starts a node on ephemeral loopback ports and waits for it to say
    /// where it serves. Grants are off (`--insecure`) unless a test is about
    /// them: see [`NodeProcess::start_secure`].
    pub fn start(data_dir: &Path) -> Self {
        Self::start_with(data_dir, &[])
    }

    pub fn start_with(data_dir: &Path, extra: &[&str]) -> Self {
        Self::spawn(data_dir, &[&["--insecure"], extra].concat())
    }

    /// A node that checks access grants.
    pub fn start_secure(data_dir: &Path) -> Self {
        Self::spawn(data_dir, &[])
    }

    /// A node that checks access grants, with more flags.
    pub fn start_secure_with(data_dir: &Path, extra: &[&str]) -> Self {
        Self::spawn(data_dir, extra)
    }

    /// A node that checks access, with more flags and `env` in its
    /// environment.
    pub fn start_secure_with_env(data_dir: &Path, extra: &[&str], env: &[(String, String)]) -> Self {
        Self::spawn_env(data_dir, extra, Stdio::inherit(), None, env)
    }

    /// A node that checks access, its log (stderr) written to `log`.
    pub fn start_secure_logged(data_dir: &Path, extra: &[&str], log: &Path) -> Self {
        let file = std::fs::File::create(log).expect("log file");
        Self::spawn_to(data_dir, extra, Stdio::from(file), Some("debug"))
    }

    fn spawn(data_dir: &Path, extra: &[&str]) -> Self {
        Self::spawn_to(data_dir, extra, Stdio::inherit(), None)
    }

    /// A node without access control whose environment has `env` too
    /// (an object store's endpoint and credentials).
    pub fn start_with_env(data_dir: &Path, extra: &[&str], env: &[(String, String)]) -> Self {
        Self::spawn_env(data_dir, &[&["--insecure"], extra].concat(), Stdio::inherit(), None, env)
    }

    fn spawn_to(data_dir: &Path, extra: &[&str], stderr: Stdio, log_filter: Option<&str>) -> Self {
        Self::spawn_env(data_dir, extra, stderr, log_filter, &[])
    }

    fn spawn_env(
        data_dir: &Path,
        extra: &[&str],
        stderr: Stdio,
        log_filter: Option<&str>,
        env: &[(String, String)],
    ) -> Self {
        let log_filter = log_filter
            .map(str::to_string)
            .unwrap_or_else(|| std::env::var("SLUICE_TEST_LOG").unwrap_or_else(|_| "warn,sluice::node=error".into()));
        // Loopback ports the kernel picks, unless `extra` names the
        // control API's address.
        let control: &[&str] = if extra.contains(&"--control") { &[] } else { &["--control", "127.0.0.1:0"] };
        let mut command = Command::new(env!("CARGO_BIN_EXE_sluiced"));
        for name in object_store_settings() {
            command.env_remove(name);
        }
        let mut child = command
            .args(["--data-dir", data_dir.to_str().expect("utf-8 path")])
            .args(["--listen", "127.0.0.1:0", "--cores", "2"])
            .args(control)
            .args(extra)
            .envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .env("SLUICE_LOG", log_filter)
            .stdout(Stdio::piped())
            .stderr(stderr)
            .spawn()
            .expect("spawn sluiced");
        let stdout = child.stdout.take().expect("stdout");
        let mut lines = BufReader::new(stdout).lines();
        let (mut endpoint, mut data_addr, mut metrics_addr) = (None, None, None);
        // The node announces its addresses, then what it runs and where its
        // data lives ("… ; data in DIR"), last.
        loop {
            let line = lines.next().expect("sluiced exited before announcing its addresses").expect("read");
            if let Some(url) = line.strip_prefix("sluiced: control API on ") {
                endpoint = Some(url.trim().to_string());
            }
            if let Some(addr) = line.strip_prefix("sluiced: data plane (tcp) on ") {
                data_addr = Some(addr.trim().to_string());
            }
            if let Some(url) = line.strip_prefix("sluiced: metrics on http://") {
                metrics_addr = url.trim().strip_suffix("/metrics").map(str::to_string);
            }
            if line.starts_with("sluiced: ") && line.contains(" ; data in ") {
                break;
            }
        }
        // Keep draining stdout so the node never blocks on a full pipe.
        std::thread::spawn(move || for _ in lines {});
        let admin_token = std::fs::read_to_string(data_dir.join("admin.token")).ok().map(|t| t.trim().to_string());
        Self {
            child,
            endpoint: endpoint.expect("endpoint"),
            data_addr: data_addr.expect("data address"),
            metrics_addr,
            data_dir: data_dir.to_path_buf(),
            admin_token,
        }
    }

    /// Runs sluicectl as the operator (with the node's own operator token
    /// when it made one).
    pub fn ctl(&self, args: &[&str]) -> Output {
        self.ctl_command(args).output().expect("run sluicectl")
    }

    /// The sluicectl command [`NodeProcess::ctl`] runs, to be spawned.
    pub fn ctl_command(&self, args: &[&str]) -> Command {
        let mut command = Command::new(env!("CARGO_BIN_EXE_sluicectl"));
        command.args(["--endpoint", &self.endpoint]).env_remove("SLUICE_TOKEN").env_remove("SLUICE_ADMIN_TOKEN");
        if let Some(token) = &self.admin_token {
            command.env("SLUICE_ADMIN_TOKEN", token);
        }
        command.args(args);
        command
    }

    /// Runs sluicectl with no operator credential.
    pub fn ctl_anonymous(&self, args: &[&str]) -> Output {
        Command::new(env!("CARGO_BIN_EXE_sluicectl"))
            .args(["--endpoint", &self.endpoint])
            .env_remove("SLUICE_TOKEN")
            .env_remove("SLUICE_ADMIN_TOKEN")
            .args(args)
            .output()
            .expect("run sluicectl")
    }

    /// `GET path` on the control API as the operator.
    pub fn get(&self, path: &str) -> Result<ureq::Response, Box<ureq::Error>> {
        let request = ureq::get(&format!("{}{path}", self.endpoint));
        let request = match &self.admin_token {
            Some(token) => request.set("Authorization", &format!("Bearer {token}")),
            None => request,
        };
        request.call().map_err(Box::new)
    }

    /// Runs sluicectl and insists it succeeds.
    pub fn ctl_ok(&self, args: &[&str]) -> String {
        let out = self.ctl(args);
        assert!(
            out.status.success(),
            "sluicectl {args:?} failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// One unlabelled gauge from `GET /metrics`.
    pub fn gauge(&self, name: &str) -> Option<f64> {
        let text = self.get("/metrics").ok()?.into_string().ok()?;
        text.lines().find_map(|line| line.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
    }

    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// SIGTERM, then wait for a clean exit.
    pub fn stop(mut self) -> std::process::ExitStatus {
        let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).expect("SIGTERM");
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(status) = self.child.try_wait().expect("wait") {
                return status;
            }
            assert!(Instant::now() < deadline, "sluiced did not stop on SIGTERM");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for NodeProcess {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Writes `len` seeded random bytes to `path` and returns them.
pub fn random_file(path: &Path, len: usize, seed: u64) -> Vec<u8> {
    let mut rng = rand::rngs::SmallRng::seed_from_u64(seed);
    let mut data = vec![0u8; len];
    rng.fill(&mut data[..]);
    std::fs::write(path, &data).expect("write test file");
    data
}

/// Creates, ingests and seals a `bytes` dataset from `files`.
pub fn sealed_dataset(node: &NodeProcess, name: &str, files: &[&Path]) {
    node.ctl_ok(&["dataset", "create", name, "--kind", "bytes"]);
    let mut args = vec!["dataset", "ingest", name];
    args.extend(files.iter().map(|p| p.to_str().expect("utf-8 path")));
    node.ctl_ok(&args);
    node.ctl_ok(&["dataset", "seal", name]);
}

impl NodeProcess {
    /// (resident KiB, peak resident KiB) of the node process.
    pub fn memory_kib(&self) -> (u64, u64) {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).unwrap_or_default();
        let field = |name: &str| {
            status
                .lines()
                .find(|l| l.starts_with(name))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
                .unwrap_or(0)
        };
        (field("VmRSS:"), field("VmHWM:"))
    }

    /// Open file descriptors of the node process.
    pub fn fd_count(&self) -> usize {
        std::fs::read_dir(format!("/proc/{}/fd", self.child.id())).map(|d| d.count()).unwrap_or(0)
    }

    /// The node's io_uring instances: one block queue per core, and with
    /// `--socket-io uring` a socket ring per core too.
    pub fn io_uring_count(&self) -> usize {
        let Ok(fds) = std::fs::read_dir(format!("/proc/{}/fd", self.child.id())) else { return 0 };
        fds.flatten()
            .filter(|fd| {
                std::fs::read_link(fd.path()).is_ok_and(|target| target.as_os_str() == "anon_inode:[io_uring]")
            })
            .count()
    }
}

/// Checks that a node started with `socket_io` flags serves its TCP
/// connections the way they ask: its two cores (`--cores 2`) each hold a
/// socket ring beside their block queue, or only the block queue.
pub fn assert_socket_io(node: &NodeProcess, socket_io: &[&str]) {
    let rings = if socket_io.contains(&"uring") { 4 } else { 2 };
    // The rings start with their cores' listeners, just after the node
    // says where it serves.
    eventually(10, || node.io_uring_count() == rings);
    assert_eq!(node.io_uring_count(), rings, "io_uring instances of a node started with {socket_io:?}");
}

/// Where a test server's program is: the path in `env_var`, else the
/// suite's own install at `installed` (where `scripts/test.sh` puts it,
/// under the repository's `target/`), else `command` on the PATH.
pub fn program(env_var: &str, installed: Option<PathBuf>, command: &str) -> Option<PathBuf> {
    if let Some(path) = std::env::var_os(env_var) {
        return Some(PathBuf::from(path));
    }
    if let Some(local) = installed.filter(|path| path.exists()) {
        return Some(local);
    }
    let found = Command::new("sh").args(["-c", &format!("command -v {command}")]).output().ok()?;
    let path = String::from_utf8_lossy(&found.stdout).trim().to_string();
    (!path.is_empty()).then(|| PathBuf::from(path))
}

/// `relative` under the repository.
pub fn in_repo(relative: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(relative)
}

/// A node that reads source-backed datasets with `env` (where its object
/// store is, and its credentials), whose fetches give up fast (tests of
/// faults wait on timeouts and retries), with `more` config lines.
pub fn source_node(dir: &Path, env: &[(String, String)], more: &str) -> NodeProcess {
    let config = dir.join("sluiced.toml");
    std::fs::write(&config, format!("source_timeout_ms = 1500\nsource_retries = 4\n{more}")).expect("config");
    NodeProcess::start_with_env(&dir.join("node"), &["--config", config.to_str().expect("utf-8 path")], env)
}

/// A loopback TCP port free now. A server given it binds it a moment
/// later, when another test may have taken it; a slow starter checks that
/// its server serves there and chooses again (`s3.rs`, `etcd.rs`).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("a free port").port()
}

/// Starts a server that is told its port on a port free now: `spawn`
/// starts it on `port` with its stderr going to `log`, and `serves` says
/// whether it answers there as it should. A server that takes a while to
/// bind may lose the port to another test in that gap (it then exits, or a
/// bare connect reaches someone else), so a start counts only when the
/// server still runs and answers as itself, and a lost port is chosen again.
/// After five tries the test fails with `what` and the server's last words.
pub fn start_on_free_port(
    what: &str,
    limit: Duration,
    mut spawn: impl FnMut(u16, Stdio) -> Child,
    serves: impl Fn(u16) -> bool,
) -> (Child, u16) {
    let mut tries = 0;
    loop {
        tries += 1;
        let port = free_port();
        let log = tempfile::NamedTempFile::new().expect("server log");
        let mut child = spawn(port, Stdio::from(log.reopen().expect("server log")));
        let deadline = Instant::now() + limit;
        let why = loop {
            match child.try_wait() {
                Ok(Some(status)) => break format!("it exited ({status})"),
                Err(e) => break e.to_string(),
                Ok(None) => {}
            }
            if serves(port) {
                return (child, port);
            }
            if Instant::now() >= deadline {
                break format!("no answer within {limit:?}");
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        let _ = child.kill();
        let _ = child.wait();
        let said = std::fs::read_to_string(log.path()).unwrap_or_default();
        assert!(tries < 5, "{what} did not serve on a port of its own in {tries} tries; last: {why}\n{said}");
        eprintln!("{what} on port {port}: {why}; choosing another port");
    }
}

/// Waits up to `seconds` for `check` to hold.
pub fn eventually(seconds: u64, mut check: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + Duration::from_secs(seconds);
    while Instant::now() < deadline {
        if check() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    check()
}

/// Compiles the hostile policy `ebpf/tests/hostile/NAME.bpf.c` into `out`;
/// `None` (a failure in CI) when it cannot.
pub fn hostile_policy(name: &str, out: &Path) -> Option<PathBuf> {
    hostile::compile_hostile(&Path::new(env!("CARGO_MANIFEST_DIR")).join("ebpf"), name, out)
}

/// `.npy` bytes of a 1-D little-endian u16 array.
pub fn npy_u16(tokens: &[u8]) -> Vec<u8> {
    let dict = format!("{{'descr': '<u2', 'fortran_order': False, 'shape': ({},), }}", tokens.len() / 2);
    let mut header = dict.into_bytes();
    while (10 + header.len() + 1) % 64 != 0 {
        header.push(b' ');
    }
    header.push(b'\n');
    let mut out = b"\x93NUMPY\x01\x00".to_vec();
    out.extend_from_slice(&(header.len() as u16).to_le_bytes());
    out.extend_from_slice(&header);
    out.extend_from_slice(tokens);
    out
}
