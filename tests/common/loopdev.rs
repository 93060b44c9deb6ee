//! Loop devices as namespace devices: real block devices (O_EXCL, O_DIRECT,
//! BLKDISCARD, sysfs) on a machine without NVMe.

use std::path::{Path, PathBuf};
use std::process::Command;

/// A loop device over a file, detached when dropped.
pub struct LoopDevice {
    pub path: PathBuf,
}

impl LoopDevice {
    /// A loop device of `bytes` over a file in `dir`, or why there can be
    /// none here (`None`, a failure under `CI`: the rig and CI run as root).
    pub fn new(dir: &Path, name: &str, bytes: u64) -> Option<Self> {
        let backing = dir.join(format!("{name}.img"));
        let file = std::fs::File::create(&backing).expect("backing file");
        file.set_len(bytes).expect("size the backing file");
        drop(file);
        let out = Command::new("losetup").args(["--find", "--show"]).arg(&backing).output();
        match out {
            Ok(out) if out.status.success() => {
                let path = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
                Some(Self { path })
            }
            other => {
                let why = format!(
                    "SKIP: no loop device ({}); these tests need root and /dev/loop-control",
                    match other {
                        Ok(out) => String::from_utf8_lossy(&out.stderr).trim().to_string(),
                        Err(err) => err.to_string(),
                    }
                );
                assert!(std::env::var_os("CI").is_none(), "{why}");
                eprintln!("{why}");
                None
            }
        }
    }

    pub fn path_str(&self) -> &str {
        self.path.to_str().expect("utf-8 device path")
    }
}

impl Drop for LoopDevice {
    fn drop(&mut self) {
        let _ = Command::new("losetup").arg("-d").arg(&self.path).status();
    }
}
