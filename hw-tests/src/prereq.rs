//! What the rig needs from the machine, and what a test does when it is
//! missing: skip with the exact reason, or fail where skipping is not allowed
//! (`SLUICE_RIG_REQUIRE=1`, which `.ci/run` sets).

use std::path::{Path, PathBuf};

use crate::rig::RigError;

/// Something the rig needs that this machine lacks, in words a person can act on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Missing(pub String);

impl std::fmt::Display for Missing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// Unwraps a rig result for a test. A [`RigError::Missing`] skips the test
/// (printing what is missing) unless `SLUICE_RIG_REQUIRE=1`, where it fails;
/// any other error fails the test.
pub fn require<T>(result: Result<T, RigError>) -> Option<T> {
    match result {
        Ok(value) => Some(value),
        Err(RigError::Missing(missing)) if !skipping_forbidden() => {
            eprintln!("SKIPPED: {missing}");
            None
        }
        Err(RigError::Missing(missing)) => {
            panic!("rig test cannot run and SLUICE_RIG_REQUIRE=1 forbids skipping: {missing}")
        }
        Err(err) => panic!("{err}"),
    }
}

fn skipping_forbidden() -> bool {
    std::env::var("SLUICE_RIG_REQUIRE").is_ok_and(|v| v == "1")
}

/// The full path of `program` on `PATH`, or what to install to get it.
pub fn find_program(program: &str, debian_package: &str) -> Result<PathBuf, Missing> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain([PathBuf::from("/usr/sbin"), PathBuf::from("/sbin")])
        .map(|dir| dir.join(program))
        .find(|candidate| is_executable(candidate))
        .ok_or_else(|| Missing(format!("`{program}` is not installed (Debian package {debian_package})")))
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    path.metadata().is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// A statically linked busybox for the initramfs (Debian's `busybox-static`).
pub fn static_busybox() -> Result<PathBuf, Missing> {
    let busybox = find_program("busybox", "busybox-static")?;
    let bytes = std::fs::read(&busybox).map_err(|e| Missing(format!("reading {}: {e}", busybox.display())))?;
    if elf_has_interpreter(&bytes) {
        return Err(Missing(format!(
            "{} is dynamically linked; the initramfs needs a static one (Debian package busybox-static)",
            busybox.display()
        )));
    }
    Ok(busybox)
}

/// Whether an ELF64 little-endian file names a program interpreter
/// (`PT_INTERP`), i.e. is dynamically linked.
fn elf_has_interpreter(elf: &[u8]) -> bool {
    const PT_INTERP: u32 = 3;
    let read_u16 = |at: usize| elf.get(at..at + 2).map(|b| u16::from_le_bytes([b[0], b[1]]));
    let read_u32 = |at: usize| elf.get(at..at + 4).map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]));
    let read_u64 =
        |at: usize| elf.get(at..at + 8).map(|b| u64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]));
    if elf.get(..4) != Some(b"\x7fELF") {
        return false;
    }
    let (Some(phoff), Some(phentsize), Some(phnum)) = (read_u64(0x20), read_u16(0x36), read_u16(0x38)) else {
        return false;
    };
    (0..usize::from(phnum))
        .filter_map(|i| usize::try_from(phoff).ok().map(|off| off + i * usize::from(phentsize)))
        .any(|header| read_u32(header) == Some(PT_INTERP))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tells_static_from_dynamic_binaries() {
        // This test binary itself is dynamically linked.
        let me = std::fs::read(std::env::current_exe().expect("current exe")).expect("read self");
        assert!(elf_has_interpreter(&me));
        assert!(!elf_has_interpreter(b"not an elf at all"));
        assert!(!elf_has_interpreter(b"\x7fELF"));
    }

    #[test]
    fn names_the_package_of_a_missing_program() {
        let missing = find_program("sluice-no-such-program", "sluice-pkg").expect_err("absent");
        assert!(missing.0.contains("sluice-pkg"), "{missing}");
    }
}
