//! sluice in the rig: its binaries, files shared with the guests, and a
//! `sluiced` started on the storage host.

use super::*;

/// The Python the guests run: Debian's, by its path. The guests share this
/// machine's root but not its login environment, so a `python3` that a
/// version manager (pyenv) puts first on this `PATH` is not theirs, and
/// NumPy is checked here in the interpreter they will run.
pub const GUEST_PYTHON: &str = "/usr/bin/python3";

impl Rig {
    /// A binary of the sluice workspace at a path every guest sees too (the
    /// host's root is theirs): from `SLUICE_BIN_DIR` when it is set (CI
    /// names the build its workspace tests made, `--features rdma`
    /// included), else the release build, made once per test process.
    pub fn sluice_binary(&self, name: &str) -> Result<String, RigError> {
        if let Some(dir) = std::env::var_os("SLUICE_BIN_DIR") {
            let path = PathBuf::from(dir).join(name);
            if !path.is_file() {
                return Err(RigError::Missing(Missing(format!("{} (SLUICE_BIN_DIR has no {name})", path.display()))));
            }
            return Ok(path.display().to_string());
        }
        static BUILT: OnceLock<Result<(), String>> = OnceLock::new();
        let built = BUILT.get_or_init(|| {
            crate::cargo()
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

    /// The Python package with the RDMA build of its native module
    /// (`cargo build --release --features rdma`, once per test process),
    /// assembled as a directory to put on `PYTHONPATH` in a guest: the
    /// package's sources beside `sluice/_native_rdma.abi3.so`. The guests
    /// run this machine's Debian `python3` ([`GUEST_PYTHON`]), which needs
    /// NumPy (`python3-numpy`).
    pub fn sluice_python(&self) -> Result<String, RigError> {
        static BUILT: OnceLock<Result<(), String>> = OnceLock::new();
        let numpy = Command::new(GUEST_PYTHON).args(["-c", "import numpy"]).status();
        if !numpy.is_ok_and(|s| s.success()) {
            return Err(RigError::Missing(Missing(format!(
                "{GUEST_PYTHON} with NumPy (apt-get install python3 python3-numpy)"
            ))));
        }
        let crate_dir = workspace_root().join("client").join("python");
        let built = BUILT.get_or_init(|| {
            crate::cargo()
                .args(["build", "--release", "--features", "rdma", "--manifest-path"])
                .arg(crate_dir.join("Cargo.toml"))
                .arg("--target-dir")
                .arg(crate_dir.join("target"))
                .status()
                .map_err(|e| e.to_string())
                .and_then(|s| if s.success() { Ok(()) } else { Err(format!("cargo build: {s}")) })
        });
        built.clone().map_err(|e| RigError::Command {
            what: "building the Python module".into(),
            status: -1,
            stderr: e,
        })?;
        let package = target_dir().join("rig-python").join("sluice");
        let copying = |e| RigError::io("assembling the Python package", e);
        if package.exists() {
            std::fs::remove_dir_all(&package).map_err(copying)?;
        }
        std::fs::create_dir_all(&package).map_err(copying)?;
        for entry in std::fs::read_dir(crate_dir.join("python").join("sluice")).map_err(copying)? {
            let path = entry.map_err(copying)?.path();
            if path.extension().is_some_and(|e| e == "py") {
                std::fs::copy(&path, package.join(path.file_name().unwrap_or_default())).map_err(copying)?;
            }
        }
        let module = crate_dir.join("target").join("release").join("lib_native.so");
        std::fs::copy(&module, package.join("_native_rdma.abi3.so")).map_err(copying)?;
        Ok(target_dir().join("rig-python").display().to_string())
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
}
