//! One QEMU process. It dies with the test: killed on drop (also while a
//! test panics) and, should the test process itself be killed, by the kernel
//! through `PR_SET_PDEATHSIG`.

use std::fs::File;
use std::os::fd::RawFd;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use crate::rig::RigError;

pub struct Guest {
    pub name: String,
    /// The guest's serial console.
    pub console_log: PathBuf,
    child: Child,
}

impl Guest {
    /// Starts QEMU with `args`. `inherit` is an fd of this process QEMU
    /// keeps open under the same number (the rig's wire socket); every
    /// other fd this process opened is closed in QEMU, as Rust opens them
    /// close-on-exec.
    pub fn spawn(
        name: &str,
        qemu: &Path,
        args: &[String],
        console_log: &Path,
        inherit: Option<RawFd>,
    ) -> Result<Self, RigError> {
        let log = File::create(console_log).map_err(|e| RigError::io("creating a console log", e))?;
        let log_err = log.try_clone().map_err(|e| RigError::io("cloning a console log", e))?;
        let mut command = Command::new(qemu);
        command.args(args).stdin(Stdio::null()).stdout(log).stderr(log_err);
        // SAFETY: runs in the child between fork and exec: only async-signal-
        // safe calls (`prctl`, `fcntl`) on its own process and fd table.
        unsafe {
            command.pre_exec(move || {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                if let Some(fd) = inherit {
                    if libc::fcntl(fd, libc::F_SETFD, 0) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                }
                Ok(())
            });
        }
        let child = command.spawn().map_err(|e| RigError::io("starting qemu-system-x86_64", e))?;
        Ok(Self { name: name.to_string(), console_log: console_log.to_path_buf(), child })
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The exit status if QEMU has stopped.
    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    pub fn console(&self) -> String {
        std::fs::read_to_string(&self.console_log).unwrap_or_default()
    }
}

impl Drop for Guest {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
