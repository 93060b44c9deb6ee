//! The rig API tests use: build, boot, run commands in hosts, tear down.

use std::io::Write;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use crate::guest::Guest;
use crate::prereq::{find_program, Missing};
use crate::{initramfs, kernel};

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
    Guests { guests: Vec<Guest>, share: PathBuf },
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

    fn boot_guests(spec: RigBuilder) -> Result<Self, RigError> {
        let qemu = find_program("qemu-system-x86_64", "qemu-system-x86")?;
        let root = rig_root();
        let cache = root.join("cache");
        let (kernel, initrd) = {
            // Tests boot rigs in parallel; one of them fills the cache.
            let _lock = lock_cache(&cache)?;
            let kernel = kernel::fetch(&cache)?;
            let initrd = initramfs::build(&kernel, &cache)?;
            (kernel, initrd)
        };
        let run_dir = new_run_dir(&root, &spec.test)?;
        let share = run_dir.join("share");
        for host in [Host::Storage, Host::Training].into_iter().take(spec.hosts) {
            let dir = share.join(host.name());
            for sub in ["req", "run", "out"] {
                std::fs::create_dir_all(dir.join(sub)).map_err(|e| RigError::io("creating the share", e))?;
            }
            let mut env = String::new();
            if spec.hosts > 1 {
                env += &format!("RIG_ADDR={}\n", host.wire_addr());
                let peer = if host == Host::Storage { Host::Training } else { Host::Storage };
                env += &format!("RIG_PEER_ADDR={}\nRIG_PEER_MAC={}\n", peer.wire_addr(), peer.wire_mac());
            }
            if spec.rdma {
                env += "RIG_RDMA=1\n";
            }
            if host == Host::Storage && spec.hugepages > 0 {
                env += &format!("RIG_HUGEPAGES={}\n", spec.hugepages);
            }
            std::fs::write(dir.join("env"), env).map_err(|e| RigError::io("writing a guest env", e))?;
        }
        std::fs::write(share.join("agent.sh"), include_str!("../guest/agent.sh"))
            .map_err(|e| RigError::io("writing the agent", e))?;

        let wire_port = if spec.hosts > 1 { free_port()? } else { 0 };
        let mut guests = Vec::new();
        for host in [Host::Storage, Host::Training].into_iter().take(spec.hosts) {
            let args = qemu_args(&spec, host, &kernel, &initrd, &run_dir, &share, wire_port)?;
            guests.push(Guest::spawn(host.name(), &qemu, &args, &run_dir.join(format!("{}.console", host.name())))?);
            if host == Host::Storage && spec.hosts > 1 {
                // The training guest connects to the storage guest's end of
                // the wire, which must be listening first.
                wait_listening(wire_port, &mut guests[0], spec.boot_timeout)?;
            }
        }
        let mut rig = Self {
            spec,
            backend: Backend::Guests { guests, share: share.clone() },
            run_dir,
            controllers: Vec::new(),
            next_request: AtomicU64::new(0),
        };
        rig.wait_ready(&share)?;
        rig.controllers = rig.find_controllers()?;
        Ok(rig)
    }

    fn wait_ready(&mut self, share: &Path) -> Result<(), RigError> {
        let started = Instant::now();
        let Backend::Guests { guests, .. } = &mut self.backend else { return Ok(()) };
        for guest in guests.iter_mut() {
            let ready = share.join(&guest.name).join("ready");
            while !ready.exists() {
                let waited = started.elapsed();
                let failure = match guest.exited() {
                    Some(status) => Some(format!("QEMU exited: {status}")),
                    None if waited > self.spec.boot_timeout => Some("no answer from the agent".to_string()),
                    None => None,
                };
                if let Some(reason) = failure {
                    return Err(RigError::Boot {
                        host: guest.name.clone(),
                        seconds: waited.as_secs(),
                        reason,
                        log: guest.console_log.display().to_string(),
                    });
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        }
        Ok(())
    }

    /// Finds the storage host's controllers by the serials the rig gave them.
    fn find_controllers(&self) -> Result<Vec<NvmeController>, RigError> {
        if self.spec.nvme_controllers == 0 {
            return Ok(Vec::new());
        }
        let listing = self.sh(
            Host::Storage,
            "for c in /sys/class/nvme/nvme*; do \
               echo \"$(basename $c) $(cat $c/serial) $(basename $(readlink -f $c/device))\"; done",
        )?;
        let mut controllers = Vec::new();
        for i in 0..self.spec.nvme_controllers {
            let serial = format!("sluice{i}");
            let line = listing.lines().find(|l| l.split_whitespace().nth(1) == Some(serial.as_str()));
            let Some(line) = line else {
                return Err(RigError::Command {
                    what: "finding the rig's NVMe controllers".into(),
                    status: 0,
                    stderr: format!("no controller with serial {serial} in:\n{listing}"),
                });
            };
            let fields: Vec<&str> = line.split_whitespace().collect();
            controllers.push(NvmeController { name: fields[0].to_string(), pci: fields[2].to_string() });
        }
        Ok(controllers)
    }

    fn local(spec: RigBuilder, hw: Hardware) -> Result<Self, RigError> {
        let run_dir = new_run_dir(&rig_root(), &spec.test)?;
        let mut controllers = Vec::new();
        for pci in &hw.nvme {
            let dir = PathBuf::from("/sys/bus/pci/devices").join(pci).join("nvme");
            let name = std::fs::read_dir(&dir)
                .map_err(|e| RigError::io(&format!("SLUICE_HW_NVME names {pci}, which has no {}", dir.display()), e))?
                .flatten()
                .filter_map(|entry| entry.file_name().to_str().map(str::to_string))
                .next()
                .ok_or_else(|| RigError::Missing(Missing(format!("{pci} is not bound to the nvme driver"))))?;
            controllers.push(NvmeController { pci: pci.clone(), name });
        }
        if controllers.len() < spec.nvme_controllers {
            return Err(RigError::Missing(Missing(format!(
                "the test needs {} NVMe controllers; SLUICE_HW_NVME names {}",
                spec.nvme_controllers,
                controllers.len()
            ))));
        }
        if spec.rdma && hw.rdma.is_none() {
            return Err(RigError::Missing(Missing("the test needs RDMA; SLUICE_HW_RDMA names no device".into())));
        }
        Ok(Self { spec, backend: Backend::Local(hw), run_dir, controllers, next_request: AtomicU64::new(0) })
    }

    /// A release binary of the sluice workspace (built once per test
    /// process), at a path every guest sees too: the host's root is theirs.
    pub fn sluice_binary(&self, name: &str) -> Result<String, RigError> {
        static BUILT: OnceLock<Result<(), String>> = OnceLock::new();
        let built = BUILT.get_or_init(|| {
            let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
            Command::new(cargo)
                .args(["build", "--release", "-p", "sluice", "--bins", "--features", "rdma"])
                .current_dir(workspace_root())
                .status()
                .map_err(|e| e.to_string())
                .and_then(|s| if s.success() { Ok(()) } else { Err(format!("cargo build: {s}")) })
        });
        built.clone().map_err(|e| RigError::Command { what: "building sluice".into(), status: -1, stderr: e })?;
        let path = target_dir().join("release").join(name);
        if !path.is_file() {
            return Err(RigError::Missing(Missing(format!("{} was not built", path.display()))));
        }
        Ok(path.display().to_string())
    }

    /// The directory both this process and the hosts see (`/rig` in the
    /// guests): as a path here, and as the hosts name it.
    pub fn shared_dir(&self) -> (PathBuf, String) {
        match &self.backend {
            Backend::Guests { share, .. } => (share.clone(), "/rig".to_string()),
            Backend::Local(_) => (self.run_dir.clone(), self.run_dir.display().to_string()),
        }
    }

    /// Writes a file into the shared directory; returns its path in the hosts.
    pub fn share_file(&self, name: &str, bytes: &[u8]) -> Result<String, RigError> {
        let (here, there) = self.shared_dir();
        std::fs::write(here.join(name), bytes).map_err(|e| RigError::io("writing a shared file", e))?;
        Ok(format!("{there}/{name}"))
    }

    /// A scratch directory on a host's own (non-shared) filesystem.
    /// Starts `sluiced` on the storage host (one core, data under its
    /// scratch directory, log `sluiced.log` in the shared directory, pid in
    /// `<scratch>/sluiced.pid`) serving on `addr` with the ports in
    /// [`SLUICE_DATA_PORT`] and [`SLUICE_CONTROL_PORT`], and waits until its
    /// control API is up.
    pub fn start_sluiced(&self, addr: &str, args: &str) -> Result<(), RigError> {
        self.start_sluiced_binary(&self.sluice_binary("sluiced")?, addr, args)
    }

    /// As [`Rig::start_sluiced`], with a `sluiced` built some other way
    /// (another feature set).
    pub fn start_sluiced_binary(&self, sluiced: &str, addr: &str, args: &str) -> Result<(), RigError> {
        let (_, shared) = self.shared_dir();
        let scratch = self.scratch_dir(Host::Storage);
        self.sh(
            Host::Storage,
            &format!(
                "mkdir -p {scratch}/data; setsid {sluiced} --data-dir {scratch}/data --cores 1 \
                 --listen {addr}:{SLUICE_DATA_PORT} --control {addr}:{SLUICE_CONTROL_PORT} {args} \
                 > {shared}/sluiced.log 2>&1 & echo $! > {scratch}/sluiced.pid"
            ),
        )?;
        let ready = self.exec_with(
            Host::Storage,
            &format!(
                "while kill -0 $(cat {scratch}/sluiced.pid) 2>/dev/null; do \
                   grep -q 'control API on' {shared}/sluiced.log && exit 0; sleep 0.2; done; \
                 cat {shared}/sluiced.log; exit 1"
            ),
            Duration::from_secs(120),
        )?;
        if !ready.success() {
            return Err(RigError::Command { what: "starting sluiced".into(), status: 1, stderr: ready.stdout });
        }
        Ok(())
    }

    pub fn scratch_dir(&self, host: Host) -> String {
        match &self.backend {
            Backend::Guests { .. } => format!("/root/rig-{}", host.name()),
            Backend::Local(_) => self.run_dir.join(format!("scratch-{}", host.name())).display().to_string(),
        }
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
        if std::thread::panicking() {
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

fn qemu_args(
    spec: &RigBuilder,
    host: Host,
    kernel: &kernel::Kernel,
    initrd: &Path,
    run_dir: &Path,
    share: &Path,
    wire_port: u16,
) -> Result<Vec<String>, RigError> {
    let mut args: Vec<String> = Vec::new();
    let mut push = |parts: &[&str]| args.extend(parts.iter().map(|s| s.to_string()));
    let storage_with_nvme = host == Host::Storage && spec.nvme_controllers > 0;
    push(&["-accel", "tcg,thread=multi", "-cpu", "max", "-smp", "1", "-nographic", "-no-reboot"]);
    push(&["-m", &format!("{}M", spec.memory_mib)]);
    let mut cmdline = format!("console=ttyS0 panic=-1 quiet rig.host={}", host.name());
    if storage_with_nvme {
        // A virtual IOMMU so vfio-pci (SPDK) can own a controller.
        push(&["-machine", "q35,kernel-irqchip=split"]);
        push(&["-device", "intel-iommu,intremap=on,caching-mode=on,aw-bits=48"]);
        cmdline += " intel_iommu=on";
    }
    push(&["-kernel", &kernel.vmlinuz.display().to_string(), "-initrd", &initrd.display().to_string()]);
    push(&["-append", &cmdline]);
    push(&["-fsdev", "local,id=hr,path=/,security_model=none,readonly=on,multidevs=remap"]);
    push(&["-device", "virtio-9p-pci,fsdev=hr,mount_tag=hostroot"]);
    push(&["-fsdev", &format!("local,id=rs,path={},security_model=none", share.display())]);
    push(&["-device", "virtio-9p-pci,fsdev=rs,mount_tag=rigshare"]);
    if spec.hosts > 1 {
        let end = match host {
            Host::Storage => format!("listen=127.0.0.1:{wire_port}"),
            Host::Training => format!("connect=127.0.0.1:{wire_port}"),
        };
        push(&["-netdev", &format!("socket,id=wire,{end}")]);
        push(&["-device", &format!("virtio-net-pci,netdev=wire,mac={}", host.wire_mac())]);
    }
    if storage_with_nvme {
        let images = run_dir.join("images");
        std::fs::create_dir_all(&images).map_err(|e| RigError::io("creating the NVMe images directory", e))?;
        for c in 0..spec.nvme_controllers {
            push(&["-device", &format!("nvme-subsys,id=subsys{c},nqn=nqn.2026-11.io.sluice:subsys{c}")]);
            push(&["-device", &format!("nvme,serial=sluice{c},id=nvme{c},subsys=subsys{c}")]);
            for n in 1..=spec.namespaces_each {
                let image = images.join(format!("c{c}n{n}.img"));
                let file = std::fs::File::create(&image).map_err(|e| RigError::io("creating an NVMe image", e))?;
                // Sparse: the image costs only what the guest writes.
                file.set_len(spec.namespace_mib << 20).map_err(|e| RigError::io("sizing an NVMe image", e))?;
                let detached = n + spec.detached_each > spec.namespaces_each;
                push(&["-drive", &format!("file={},if=none,id=c{c}n{n},format=raw,discard=unmap", image.display())]);
                push(&[
                    "-device",
                    &format!(
                        // shared=off: a namespace of this host alone (NMIC 0),
                        // which is all the node will attach.
                        "nvme-ns,drive=c{c}n{n},bus=nvme{c},nsid={n},shared=off{}",
                        if detached { ",detached=on" } else { "" }
                    ),
                ]);
            }
        }
    }
    Ok(args)
}

/// Waits until QEMU listens on `port` (read from /proc/net/tcp, so no probe
/// connection takes the one the other guest needs).
fn wait_listening(port: u16, guest: &mut Guest, limit: Duration) -> Result<(), RigError> {
    let started = Instant::now();
    let needle = format!(":{port:04X} 00000000:0000 0A");
    loop {
        let table = std::fs::read_to_string("/proc/net/tcp").unwrap_or_default();
        if table.lines().any(|line| line.contains(&needle)) {
            return Ok(());
        }
        let reason = match guest.exited() {
            Some(status) => Some(format!("QEMU exited: {status}")),
            None if started.elapsed() > limit => Some(format!("QEMU never listened on port {port}")),
            None => None,
        };
        if let Some(reason) = reason {
            return Err(RigError::Boot {
                host: guest.name.clone(),
                seconds: started.elapsed().as_secs(),
                reason,
                log: guest.console_log.display().to_string(),
            });
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// An exclusive lock on the cache, across threads and processes (flock
/// locks belong to each open of the file).
fn lock_cache(cache: &Path) -> Result<nix::fcntl::Flock<std::fs::File>, RigError> {
    std::fs::create_dir_all(cache).map_err(|e| RigError::io("creating the rig cache", e))?;
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(cache.join("lock"))
        .map_err(|e| RigError::io("opening the cache lock", e))?;
    nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusive)
        .map_err(|(_, errno)| RigError::io("locking the rig cache", errno.into()))
}

fn free_port() -> Result<u16, RigError> {
    let listener = TcpListener::bind("127.0.0.1:0").map_err(|e| RigError::io("finding a free port", e))?;
    listener.local_addr().map(|a| a.port()).map_err(|e| RigError::io("finding a free port", e))
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
