//! The guest kernel: Debian's own `linux-image-*-amd64` package, downloaded
//! once with `apt-get download`, unpacked and cached. Its modules feed the
//! initramfs.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::prereq::{find_program, Missing};
use crate::rig::RigError;

/// An unpacked kernel package.
#[derive(Clone, Debug)]
pub struct Kernel {
    /// `uname -r` of the guest, e.g. `6.1.0-57-amd64`.
    pub release: String,
    /// Where the package is unpacked (`boot/`, `lib/modules/`).
    pub root: PathBuf,
    pub vmlinuz: PathBuf,
}

/// The kernel package to use: `SLUICE_RIG_KERNEL_PACKAGE`, else what Debian's
/// `linux-image-amd64` depends on now.
fn package_name() -> Result<String, RigError> {
    if let Ok(name) = std::env::var("SLUICE_RIG_KERNEL_PACKAGE") {
        return Ok(name);
    }
    let apt_cache = find_program("apt-cache", "apt")?;
    let out = Command::new(apt_cache)
        .args(["depends", "linux-image-amd64"])
        .output()
        .map_err(|e| RigError::io("running apt-cache", e))?;
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|line| line.trim().strip_prefix("Depends: "))
        .find(|dep| dep.starts_with("linux-image-"))
        .map(str::to_string)
        .ok_or_else(|| {
            RigError::Missing(Missing(
                "no Debian kernel package: `apt-cache depends linux-image-amd64` names none (run apt-get update)"
                    .into(),
            ))
        })
}

/// Downloads (once) and unpacks the guest kernel under `cache`.
pub fn fetch(cache: &Path) -> Result<Kernel, RigError> {
    let package = package_name()?;
    let root = cache.join(&package);
    if let Some(kernel) = unpacked(&root)? {
        return Ok(kernel);
    }
    let apt_get = find_program("apt-get", "apt")?;
    let dpkg_deb = find_program("dpkg-deb", "dpkg")?;
    let depmod = find_program("depmod", "kmod")?;
    let downloads = cache.join("downloads");
    std::fs::create_dir_all(&downloads).map_err(|e| RigError::io("creating the rig cache", e))?;
    run(Command::new(apt_get).arg("download").arg(&package).current_dir(&downloads), "apt-get download").map_err(
        |e| match e {
            RigError::Command { stderr, .. } => RigError::Missing(Missing(format!(
                "cannot download the kernel package {package} (needs Debian's archive): {stderr}"
            ))),
            other => other,
        },
    )?;
    let deb = std::fs::read_dir(&downloads)
        .map_err(|e| RigError::io("listing downloads", e))?
        .flatten()
        .map(|entry| entry.path())
        .find(|path| path.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with(&format!("{package}_"))))
        .ok_or_else(|| RigError::Missing(Missing(format!("apt-get download left no .deb for {package}"))))?;
    let staging = cache.join(format!("{package}.unpacking"));
    let _ = std::fs::remove_dir_all(&staging);
    run(Command::new(dpkg_deb).arg("-x").arg(&deb).arg(&staging), "dpkg-deb -x")?;
    let release = release_of(&staging)?;
    run(Command::new(depmod).arg("-b").arg(&staging).arg(&release), "depmod")?;
    let _ = std::fs::remove_dir_all(&root);
    std::fs::rename(&staging, &root).map_err(|e| RigError::io("moving the unpacked kernel into place", e))?;
    let _ = std::fs::remove_file(&deb);
    unpacked(&root)?.ok_or_else(|| RigError::Missing(Missing(format!("{package} holds no vmlinuz"))))
}

fn unpacked(root: &Path) -> Result<Option<Kernel>, RigError> {
    if !root.join("boot").is_dir() {
        return Ok(None);
    }
    let release = release_of(root)?;
    let vmlinuz = root.join("boot").join(format!("vmlinuz-{release}"));
    Ok(Some(Kernel { release, root: root.to_path_buf(), vmlinuz }))
}

fn release_of(root: &Path) -> Result<String, RigError> {
    std::fs::read_dir(root.join("boot"))
        .map_err(|e| RigError::io("reading the kernel package's boot/", e))?
        .flatten()
        .filter_map(|entry| entry.file_name().to_str().and_then(|n| n.strip_prefix("vmlinuz-")).map(str::to_string))
        .next()
        .ok_or_else(|| RigError::Missing(Missing(format!("no vmlinuz in {}", root.display()))))
}

/// Runs a host command, turning failure into [`RigError::Command`].
pub(crate) fn run(command: &mut Command, what: &str) -> Result<String, RigError> {
    let out = command.output().map_err(|e| RigError::io(what, e))?;
    if !out.status.success() {
        return Err(RigError::Command {
            what: what.to_string(),
            status: out.status.code().unwrap_or(-1),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}
