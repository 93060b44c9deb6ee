//! The guest's initramfs: a static busybox, the kernel modules the rig needs
//! (with their dependencies) and `guest/init.sh` as `/init`. Built once per
//! kernel and init script, then cached.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::kernel::{run, Kernel};
use crate::prereq::{find_program, static_busybox};
use crate::rig::RigError;

/// Loaded in this order at boot: the virtual hardware (virtio, 9p, NVMe,
/// vfio for SPDK), soft-RoCE (`crc32_generic` first, which rxe's ICRC
/// needs) and the verbs and rdma_cm user interfaces.
pub const MODULES: &[&str] = &[
    "crc32_generic",
    "crc32_pclmul",
    "virtio_pci",
    "virtio_net",
    "9pnet_virtio",
    "9p",
    "overlay",
    "nvme",
    "vfio_pci",
    "vfio_iommu_type1",
    "rdma_rxe",
    "ib_uverbs",
    "rdma_ucm",
    "veth",
];

const INIT: &str = include_str!("../guest/init.sh");

/// The init script with the module list filled in.
fn init_script() -> String {
    INIT.replace("@MODULES@", &MODULES.join(" "))
}

/// Builds (or reuses) the initramfs for `kernel` under `cache`.
pub fn build(kernel: &Kernel, cache: &Path) -> Result<PathBuf, RigError> {
    let init = init_script();
    let key = fingerprint(&[kernel.release.as_bytes(), init.as_bytes()]);
    let image = cache.join(format!("initramfs-{}-{key:016x}.cpio.gz", kernel.release));
    if image.is_file() {
        return Ok(image);
    }
    let busybox = static_busybox()?;
    let modprobe = find_program("modprobe", "kmod")?;
    let cpio = find_program("cpio", "cpio")?;
    find_program("gzip", "gzip")?;

    let staging = cache.join(format!("initramfs-{key:016x}.staging"));
    let _ = std::fs::remove_dir_all(&staging);
    for dir in ["bin", "proc", "sys", "dev", "lower", "ov", "newroot"] {
        std::fs::create_dir_all(staging.join(dir)).map_err(|e| RigError::io("creating the initramfs tree", e))?;
    }
    std::fs::copy(&busybox, staging.join("bin/busybox")).map_err(|e| RigError::io("copying busybox", e))?;
    write_executable(&staging.join("init"), &init)?;

    let modules_rel = PathBuf::from("lib/modules").join(&kernel.release);
    let modules_src = kernel.root.join(&modules_rel);
    let modules_dst = staging.join(&modules_rel);
    std::fs::create_dir_all(&modules_dst).map_err(|e| RigError::io("creating the modules directory", e))?;
    for entry in std::fs::read_dir(&modules_src).map_err(|e| RigError::io("listing modules", e))?.flatten() {
        let name = entry.file_name();
        if name.to_str().is_some_and(|n| n.starts_with("modules.")) {
            std::fs::copy(entry.path(), modules_dst.join(&name)).map_err(|e| RigError::io("copying modules.*", e))?;
        }
    }
    for file in module_closure(&modprobe, kernel)? {
        let rel = file.strip_prefix(&kernel.root).map_err(|_| RigError::Command {
            what: "modprobe --show-depends".into(),
            status: 0,
            stderr: format!("{} is outside the kernel package", file.display()),
        })?;
        let dst = staging.join(rel);
        if let Some(parent) = dst.parent() {
            std::fs::create_dir_all(parent).map_err(|e| RigError::io("creating a module directory", e))?;
        }
        std::fs::copy(&file, &dst).map_err(|e| RigError::io("copying a module", e))?;
    }

    let partial = image.with_extension("partial");
    let script = format!(
        "cd '{}' && find . | '{}' -o -H newc --quiet | gzip -1 > '{}'",
        staging.display(),
        cpio.display(),
        partial.display()
    );
    run(Command::new("sh").args(["-c", &script]), "packing the initramfs")?;
    std::fs::rename(&partial, &image).map_err(|e| RigError::io("moving the initramfs into place", e))?;
    let _ = std::fs::remove_dir_all(&staging);
    Ok(image)
}

/// Every module file [`MODULES`] needs, dependencies included; built-in ones
/// need no file.
fn module_closure(modprobe: &Path, kernel: &Kernel) -> Result<BTreeSet<PathBuf>, RigError> {
    let mut files = BTreeSet::new();
    for module in MODULES {
        let out = run(
            Command::new(modprobe).arg("-d").arg(&kernel.root).args(["-S", &kernel.release, "--show-depends", module]),
            &format!("modprobe --show-depends {module}"),
        )?;
        files.extend(
            out.lines()
                .filter_map(|line| line.trim().strip_prefix("insmod "))
                .map(|rest| PathBuf::from(rest.split_whitespace().next().unwrap_or_default())),
        );
    }
    files.retain(|path| !path.as_os_str().is_empty());
    Ok(files)
}

fn write_executable(path: &Path, text: &str) -> Result<(), RigError> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::write(path, text).map_err(|e| RigError::io("writing a script", e))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755))
        .map_err(|e| RigError::io("making a script executable", e))
}

/// FNV-1a over the parts: a cache key, not a security property.
fn fingerprint(parts: &[&[u8]]) -> u64 {
    parts
        .iter()
        .flat_map(|part| part.iter().chain(&[0xff]))
        .fold(0xcbf2_9ce4_8422_2325, |hash, byte| (hash ^ u64::from(*byte)).wrapping_mul(0x0100_0000_01b3))
}
