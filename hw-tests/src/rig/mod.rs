//! The rig API tests use: build, boot, run commands in hosts, tear down.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use crate::guest::Guest;
use crate::prereq::{find_program, Missing};
use crate::{initramfs, kernel};

mod boot;
mod qmp;
mod sluice;
pub use sluice::GUEST_PYTHON;

/// Ports `Rig::start_sluiced` gives the node's data plane and control API.
pub const SLUICE_DATA_PORT: u16 = 7071;
pub const SLUICE_CONTROL_PORT: u16 = 7070;

/// The two roles a rig has. One host gets only the storage node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Host {
    /// Runs `sluiced` and owns the NVMe controllers.
    Storage,
    /// Runs the training-side client.
    Training,
}

impl Host {
    fn index(self) -> usize {
        match self {
            Self::Storage => 0,
            Self::Training => 1,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::Storage => "storage",
            Self::Training => "training",
        }
    }

    /// The host's address on the rig's virtual wire.
    fn wire_addr(self) -> &'static str {
        match self {
            Self::Storage => "10.77.0.1",
            Self::Training => "10.77.0.2",
        }
    }

    /// The MAC of the host's wire interface (QEMU's `virtio-net-pci,mac=`).
    fn wire_mac(self) -> String {
        format!("52:54:00:77:00:{:02x}", self.index() + 1)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum RigError {
    #[error("{0}")]
    Missing(Missing),
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{what} failed with status {status}: {stderr}")]
    Command { what: String, status: i32, stderr: String },
    #[error("guest {host} did not boot within {seconds} s ({reason}); console log: {log}")]
    Boot { host: String, seconds: u64, reason: String, log: String },
    #[error("`{command}` on {host} ran past {seconds} s")]
    Timeout { host: String, command: String, seconds: u64 },
}

impl RigError {
    pub(crate) fn io(what: &str, source: std::io::Error) -> Self {
        Self::Io { what: what.to_string(), source }
    }
}

impl From<Missing> for RigError {
    fn from(missing: Missing) -> Self {
        Self::Missing(missing)
    }
}

/// What a command run in a host left behind.
#[derive(Clone, Debug)]
pub struct RigOutput {
    /// Exit status; 137 when the time limit killed it.
    pub status: i32,
    pub stdout: String,
    pub stderr: String,
}

impl RigOutput {
    pub fn success(&self) -> bool {
        self.status == 0
    }
}

/// An NVMe controller of the storage host as the guest's kernel sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NvmeController {
    /// PCI address, e.g. `0000:00:04.0`.
    pub pci: String,
    /// Kernel name, e.g. `nvme0`; its admin device is `/dev/nvme0`.
    pub name: String,
}

/// How a rig is to be made.
#[derive(Clone, Debug)]
pub struct RigBuilder {
    test: String,
    hosts: usize,
    nvme_controllers: usize,
    namespaces_each: usize,
    detached_each: usize,
    namespace_mib: u64,
    rdma: bool,
    memory_mib: u64,
    hugepages: u32,
    boot_timeout: Duration,
}

impl RigBuilder {
    /// Guests: 1 (storage only) or 2 (storage and training).
    pub fn hosts(mut self, hosts: usize) -> Self {
        assert!((1..=2).contains(&hosts), "a rig has one or two hosts");
        self.hosts = hosts;
        self
    }

    /// NVMe controllers on the storage host, each in its own subsystem with
    /// `namespaces_each` namespaces (nsid 1..).
    pub fn nvme(mut self, controllers: usize, namespaces_each: usize) -> Self {
        assert!(controllers <= 8 && namespaces_each <= 16, "bounded rig");
        self.nvme_controllers = controllers;
        self.namespaces_each = namespaces_each;
        self
    }

    /// The last `detached` namespaces of each controller start detached, a
    /// pool for the control plane to attach.
    pub fn detached(mut self, detached: usize) -> Self {
        self.detached_each = detached;
        self
    }

    /// Size of each namespace (sparse images).
    pub fn namespace_mib(mut self, mib: u64) -> Self {
        self.namespace_mib = mib;
        self
    }

    /// soft-RoCE (`rxe0`) on each guest's wire interface.
    pub fn rdma(mut self, rdma: bool) -> Self {
        self.rdma = rdma;
        self
    }

    pub fn memory_mib(mut self, mib: u64) -> Self {
        self.memory_mib = mib;
        self
    }

    /// 2 MiB hugepages reserved in the storage guest (SPDK).
    pub fn hugepages(mut self, pages: u32) -> Self {
        self.hugepages = pages;
        self
    }

    pub fn boot_timeout(mut self, timeout: Duration) -> Self {
        self.boot_timeout = timeout;
        self
    }

    /// Boots the guests (or, in real-hardware mode, checks the named devices)
    /// and waits until every host's agent answers.
    pub fn boot(self) -> Result<Rig, RigError> {
        match hardware_mode() {
            Some(hw) => Rig::local(self, hw),
            None => Rig::boot_guests(self),
        }
    }
}

/// Real devices named by the environment.
#[derive(Clone, Debug)]
struct Hardware {
    nvme: Vec<String>,
    rdma: Option<String>,
    addr: String,
}

fn hardware_mode() -> Option<Hardware> {
    let nvme: Vec<String> = std::env::var("SLUICE_HW_NVME")
        .unwrap_or_default()
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_string)
        .collect();
    let rdma = std::env::var("SLUICE_HW_RDMA").ok().filter(|s| !s.is_empty());
    if nvme.is_empty() && rdma.is_none() {
        return None;
    }
    let addr = std::env::var("SLUICE_HW_ADDR").unwrap_or_else(|_| "127.0.0.1".into());
    Some(Hardware { nvme, rdma, addr })
}

enum Backend {
    /// QEMU guests; `wire_ports` are the storage and training guests' UDP
    /// ports of the wire between them on host loopback (0 with one guest).
    Guests {
        guests: Vec<Guest>,
        share: PathBuf,
        wire_ports: [u16; 2],
    },
    Local(Hardware),
}

/// A booted rig. Dropping it stops every guest; the run directory (console
/// logs, command outputs) is removed after a pass and kept after a failure.
pub struct Rig {
    spec: RigBuilder,
    backend: Backend,
    run_dir: PathBuf,
    controllers: Vec<NvmeController>,
    next_request: AtomicU64,
    /// Keep the run directory when the rig is dropped without a panic
    /// (a test that caught one and goes on).
    keep_logs: bool,
}

impl Rig {
    /// A rig for the test named `test` (names its run directory).
    pub fn builder(test: &str) -> RigBuilder {
        RigBuilder {
            test: test.to_string(),
            hosts: 1,
            nvme_controllers: 0,
            namespaces_each: 0,
            detached_each: 0,
            namespace_mib: 256,
            rdma: false,
            memory_mib: 1024,
            hugepages: 0,
            boot_timeout: Duration::from_secs(300),
        }
    }

    /// Whether the hosts are QEMU guests (not real hardware on this machine).
    pub fn is_emulated(&self) -> bool {
        matches!(self.backend, Backend::Guests { .. })
    }

    /// The address `host` serves on, reachable from the other host.
    pub fn addr(&self, host: Host) -> String {
        match &self.backend {
            Backend::Guests { .. } => host.wire_addr().to_string(),
            Backend::Local(hw) => hw.addr.clone(),
        }
    }

    /// The RDMA device tests use, when the rig has one.
    pub fn rdma_device(&self) -> Option<String> {
        match &self.backend {
            Backend::Guests { .. } => self.spec.rdma.then(|| "rxe0".to_string()),
            Backend::Local(hw) => hw.rdma.clone(),
        }
    }

    /// The storage host's NVMe controllers, in the order the rig made them
    /// (or `SLUICE_HW_NVME` named them).
    pub fn nvme_controllers(&self) -> &[NvmeController] {
        &self.controllers
    }

    /// The attached namespaces of `controller` on the storage host as
    /// `(nsid, block device)`, by nsid. With native multipath the disk is the
    /// subsystem's `nvmeXnY`, not the per-path `nvmeXcZnY`.
    pub fn namespace_devices(&self, controller: &NvmeController) -> Result<Vec<(u32, String)>, RigError> {
        let script = format!(
            "for n in /sys/block/nvme*n*; do name=$(basename $n); case $name in *c*n*) continue;; esac; \
               dev=$(readlink -f $n/device); \
               if [ -e $dev/{ctrl} ] || [ $(basename $dev) = {ctrl} ]; then echo \"$(cat $n/nsid) /dev/$name\"; fi; done",
            ctrl = controller.name
        );
        let listing = self.sh(Host::Storage, &script)?;
        let mut devices: Vec<(u32, String)> = listing
            .lines()
            .filter_map(|line| line.split_once(' '))
            .filter_map(|(nsid, dev)| Some((nsid.trim().parse().ok()?, dev.trim().to_string())))
            .collect();
        devices.sort();
        Ok(devices)
    }

    /// Process ids of the rig's QEMU processes (none on real hardware).
    pub fn qemu_pids(&self) -> Vec<u32> {
        match &self.backend {
            Backend::Guests { guests, .. } => guests.iter().map(Guest::pid).collect(),
            Backend::Local(_) => Vec::new(),
        }
    }

    /// Keeps the run directory when the rig is dropped, as a panic does:
    /// for a test that caught a failure and tries again on a new rig.
    pub fn keep_logs(&mut self) {
        self.keep_logs = true;
    }

    /// Where this rig keeps its logs and scratch files.
    pub fn run_dir(&self) -> &Path {
        &self.run_dir
    }

    /// Runs `script` with `sh` on `host` and waits up to `limit`.
    pub fn exec_with(&self, host: Host, script: &str, limit: Duration) -> Result<RigOutput, RigError> {
        match &self.backend {
            Backend::Guests { share, .. } => self.exec_guest(share, host, script, limit),
            Backend::Local(_) => exec_local(host, script, limit),
        }
    }

    /// Runs `script` on `host` with a 120 s limit.
    pub fn exec(&self, host: Host, script: &str) -> Result<RigOutput, RigError> {
        self.exec_with(host, script, Duration::from_secs(120))
    }

    /// Runs `script` and returns its stdout; a non-zero status is an error
    /// that carries stdout and stderr.
    pub fn sh(&self, host: Host, script: &str) -> Result<String, RigError> {
        let out = self.exec(host, script)?;
        if !out.success() {
            return Err(RigError::Command {
                what: format!("`{script}` on {}", host.name()),
                status: out.status,
                stderr: format!("{}\nstdout: {}", out.stderr.trim(), out.stdout.trim()),
            });
        }
        Ok(out.stdout)
    }

    fn exec_guest(&self, share: &Path, host: Host, script: &str, limit: Duration) -> Result<RigOutput, RigError> {
        assert!(host.index() < self.spec.hosts, "this rig has no {} host", host.name());
        let dir = share.join(host.name());
        let n = self.next_request.fetch_add(1, Ordering::Relaxed);
        let limit_s = limit.as_secs().max(1);
        let write = |path: PathBuf, text: &str| std::fs::write(path, text).map_err(|e| RigError::io("queueing", e));
        write(dir.join("req").join(format!("{n}.limit")), &limit_s.to_string())?;
        write(dir.join(format!("{n}.sh.partial")), script)?;
        // The agent picks up only whole scripts: publish with a rename.
        std::fs::rename(dir.join(format!("{n}.sh.partial")), dir.join("req").join(format!("{n}.sh")))
            .map_err(|e| RigError::io("queueing", e))?;
        // The agent enforces the limit; allow it a few seconds to report.
        let deadline = Instant::now() + limit + Duration::from_secs(15);
        let rc_path = dir.join("out").join(format!("{n}.rc"));
        loop {
            if let Ok(rc) = std::fs::read_to_string(&rc_path) {
                let read = |ext: &str| std::fs::read_to_string(dir.join("out").join(format!("{n}.{ext}")));
                return Ok(RigOutput {
                    status: rc.trim().parse().unwrap_or(-1),
                    stdout: read("stdout").unwrap_or_default(),
                    stderr: read("stderr").unwrap_or_default(),
                });
            }
            if Instant::now() > deadline {
                return Err(RigError::Timeout { host: host.name().into(), command: script.into(), seconds: limit_s });
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// What the wire between the guests looks like now, for a failure
    /// message when it stopped carrying packets: each guest's interface
    /// counters, neighbours and last kernel lines, and the host's view of
    /// the QEMU sockets that carry the wire (their queues and drops say
    /// which QEMU stopped reading), and QEMU's state of each wire NIC's
    /// queues (whether frames stop in the guest or in QEMU). Taken twice, 5 s apart,
    /// with a ping in between, so the counters show which side still moves.
    pub fn wire_report(&self) -> String {
        let Backend::Guests { wire_ports, .. } = &self.backend else {
            return "real hardware: no rig wire to report on".into();
        };
        let other = |host: Host| match host {
            Host::Storage => Host::Training,
            Host::Training => Host::Storage,
        };
        let mut report = String::new();
        for round in 1..=2 {
            for host in [Host::Storage, Host::Training] {
                let script = format!(
                    "busybox ping -c 2 -W 1 {} 2>&1 | tail -n 2; cat /proc/net/dev; ip -s neigh; \
                     tc -s qdisc show dev eth0 | head -n 8; grep -e input -e output /proc/interrupts; \
                     dmesg | grep -i -A2 -e watchdog -e 'timed out' -e 'cut here' | head -n 12; dmesg | tail -n 4",
                    other(host).wire_addr()
                );
                let text = match self.exec_with(host, &script, Duration::from_secs(30)) {
                    Ok(out) => out.stdout + &out.stderr,
                    Err(e) => format!("(could not ask: {e})"),
                };
                report += &format!("--- {} (round {round}):\n{text}\n", host.name());
                report += &format!(
                    "--- QEMU's view of {}'s wire NIC (round {round}):\n{}",
                    host.name(),
                    qmp::wire_nic_queues(&self.run_dir, host)
                );
            }
            let table = std::fs::read_to_string("/proc/net/udp").unwrap_or_default();
            let sockets: Vec<&str> = table
                .lines()
                .filter(|line| wire_ports.iter().any(|port| line.contains(&format!("0100007F:{port:04X} "))))
                .collect();
            report += &format!(
                "--- host /proc/net/udp for wire ports {wire_ports:?} (tx_queue:rx_queue in column 5, drops last, \
                 round {round}):\n{}\n",
                sockets.join("\n")
            );
            if round == 1 {
                std::thread::sleep(Duration::from_secs(5));
            }
        }
        report
    }

    /// The console output of a guest so far (empty on real hardware).
    pub fn console(&self, host: Host) -> String {
        match &self.backend {
            Backend::Guests { guests, .. } => guests.get(host.index()).map(Guest::console).unwrap_or_default(),
            Backend::Local(_) => String::new(),
        }
    }
}

impl Drop for Rig {
    fn drop(&mut self) {
        if let Backend::Guests { guests, .. } = &mut self.backend {
            guests.clear();
        }
        if std::thread::panicking() || self.keep_logs {
            eprintln!("rig {}: logs kept in {}", self.spec.test, self.run_dir.display());
        } else {
            let _ = std::fs::remove_dir_all(&self.run_dir);
        }
    }
}

fn exec_local(host: Host, script: &str, limit: Duration) -> Result<RigOutput, RigError> {
    let out = Command::new("timeout")
        .args(["-s", "KILL", &limit.as_secs().max(1).to_string(), "sh", "-c", script])
        .env("RIG_HOST", host.name())
        .output()
        .map_err(|e| RigError::io("running a local command", e))?;
    Ok(RigOutput {
        status: out.status.code().unwrap_or(137),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    })
}

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().map(Path::to_path_buf).unwrap_or_default()
}

fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR").map(PathBuf::from).unwrap_or_else(|| workspace_root().join("target"))
}

/// `SLUICE_RIG_DIR`, else `target/rig`: the kernel and initramfs cache and
/// one directory per rig run.
fn rig_root() -> PathBuf {
    std::env::var_os("SLUICE_RIG_DIR").map(PathBuf::from).unwrap_or_else(|| target_dir().join("rig"))
}

fn new_run_dir(root: &Path, test: &str) -> Result<PathBuf, RigError> {
    static SEQ: AtomicU64 = AtomicU64::new(0);
    let dir = root.join("runs").join(format!("{test}-{}-{}", std::process::id(), SEQ.fetch_add(1, Ordering::Relaxed)));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).map_err(|e| RigError::io("creating the run directory", e))?;
    let mut note = std::fs::File::create(dir.join("README")).map_err(|e| RigError::io("writing the run note", e))?;
    let _ = writeln!(note, "Console logs (*.console) and command outputs (share/<host>/out) of rig run {test}.");
    Ok(dir)
}
