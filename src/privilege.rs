//! Giving up root once everything that needs it is held.
//!
//! A node starts as root to open its namespace devices (exclusively), pin
//! DMA memory, attach BPF programs and bind its ports; then, before it
//! serves its first request, [`drop_to`] hands the data directory to the
//! service user and takes that user's ids, keeping the open descriptors
//! and no capability at all. The deploy unit (`deploy/sluiced.service`)
//! adds what a process cannot do to itself for all its threads at once:
//! `NoNewPrivileges=`, a capability bounding set, a read-only system.

use std::ffi::CStr;
use std::os::fd::AsRawFd;
use std::path::Path;

use nix::dir::{Dir, Type};
use nix::fcntl::{AtFlags, OFlag};
use nix::sys::stat::Mode;
use nix::unistd::{Gid, Uid};

/// Deepest directory the hand-over walks (the data directory is two deep).
const DEPTH_MAX: usize = 8;
/// Most entries the hand-over changes: datasets are bounded, so is this.
const ENTRIES_MAX: usize = 1 << 20;

/// Drops to `user` (ids from the account database), first handing
/// `data_dir` over to it; fails, with the process still root, if any step
/// does; after it, no thread of the process has a capability.
pub fn drop_to(user: &str, data_dir: &Path) -> Result<(), String> {
    use nix::unistd::{setgid, setgroups, setuid, User};
    if !Uid::effective().is_root() {
        return Err(format!("--user {user} needs root; running as uid {}", Uid::effective()));
    }
    let account = User::from_name(user)
        .map_err(|e| format!("looking up user {user}: {e}"))?
        .ok_or_else(|| format!("no user named {user}"))?;
    if account.uid.is_root() {
        return Err(format!("--user {user} is root (uid 0): name the unprivileged service user"));
    }
    hand_over(data_dir, account.uid, account.gid)?;
    // Capabilities survive setuid only with keep-caps set; make sure not.
    nix::sys::prctl::set_keepcaps(false).map_err(|e| format!("prctl(PR_SET_KEEPCAPS): {e}"))?;
    drop_bounding_set_except(&[])?;
    setgroups(&[account.gid]).map_err(|e| format!("setgroups: {e}"))?;
    setgid(account.gid).map_err(|e| format!("setgid: {e}"))?;
    // glibc applies setuid to every thread of the process.
    setuid(account.uid).map_err(|e| format!("setuid: {e}"))?;
    nix::sys::prctl::set_no_new_privs().map_err(|e| format!("prctl(PR_SET_NO_NEW_PRIVS): {e}"))?;
    if let Some(held) = capabilities_left() {
        return Err(format!("capabilities left after dropping to {user}: {held}"));
    }
    tracing::info!("running as {user} (uid {}, gid {}), no capabilities", account.uid, account.gid);
    Ok(())
}

/// Empties this thread's capability bounding set but for `keep`, so
/// nothing it runs could gain another capability back (the deploy unit's
/// `CapabilityBoundingSet=` does this for the whole process). It walks
/// every number the kernel knows, not a list of names, so a capability
/// newer than this build goes too.
pub fn drop_bounding_set_except(keep: &[u8]) -> Result<(), String> {
    for cap in (0..64u8).filter(|cap| !keep.contains(cap)) {
        // SAFETY: PR_CAPBSET_DROP takes a capability number and reads no
        // memory; numbers past the kernel's last capability fail EINVAL.
        let rc = unsafe { libc::prctl(libc::PR_CAPBSET_DROP, cap as libc::c_ulong, 0, 0, 0) };
        if rc != 0 {
            let err = std::io::Error::last_os_error();
            if err.raw_os_error() == Some(libc::EINVAL) {
                break;
            }
            return Err(format!("prctl(PR_CAPBSET_DROP, {cap}): {err}"));
        }
    }
    Ok(())
}

/// The capability sets of any thread that still has one.
fn capabilities_left() -> Option<String> {
    let mut left = Vec::new();
    for task in std::fs::read_dir("/proc/self/task").into_iter().flatten().flatten() {
        let Ok(status) = std::fs::read_to_string(task.path().join("status")) else { continue };
        for line in status.lines() {
            let Some((field, value)) = line.split_once(':') else { continue };
            if matches!(field, "CapPrm" | "CapEff" | "CapAmb") && u64::from_str_radix(value.trim(), 16) != Ok(0) {
                left.push(format!("thread {}: {field} {}", task.file_name().to_string_lossy(), value.trim()));
            }
        }
    }
    (!left.is_empty()).then(|| left.join(", "))
}

/// Gives `dir` and everything below it to `uid:gid`, through directory
/// descriptors opened with `O_NOFOLLOW`, changing a symbolic link itself
/// (`AT_SYMLINK_NOFOLLOW`) and never what it points at, so a link planted
/// in the data directory cannot hand a root-owned file or directory over.
pub fn hand_over(dir: &Path, uid: Uid, gid: Gid) -> Result<(), String> {
    let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
    let mut root = Dir::open(dir, flags, Mode::empty()).map_err(|e| format!("opening {}: {e}", dir.display()))?;
    nix::unistd::fchown(root.as_raw_fd(), Some(uid), Some(gid)).map_err(|e| format!("chown {}: {e}", dir.display()))?;
    let mut budget = ENTRIES_MAX;
    walk(&mut root, dir, uid, gid, 0, &mut budget)
}

fn walk(dir: &mut Dir, shown: &Path, uid: Uid, gid: Gid, depth: usize, budget: &mut usize) -> Result<(), String> {
    let fd = dir.as_raw_fd();
    let entries: Vec<(std::ffi::CString, Option<Type>)> = dir
        .iter()
        .flatten()
        .filter(|e| !matches!(e.file_name().to_bytes(), b"." | b".."))
        .map(|e| (e.file_name().to_owned(), e.file_type()))
        .collect();
    for (name, kind) in entries {
        *budget =
            budget.checked_sub(1).ok_or_else(|| format!("more than {ENTRIES_MAX} entries under the data directory"))?;
        let path = shown.join(name.to_string_lossy().as_ref());
        nix::unistd::fchownat(Some(fd), name.as_c_str(), Some(uid), Some(gid), AtFlags::AT_SYMLINK_NOFOLLOW)
            .map_err(|e| format!("chown {}: {e}", path.display()))?;
        if kind == Some(Type::Directory) || (kind.is_none() && is_directory(fd, &name)) {
            if depth + 1 >= DEPTH_MAX {
                return Err(format!("{} is deeper than {DEPTH_MAX} levels", path.display()));
            }
            let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
            match Dir::openat(Some(fd), name.as_c_str(), flags, Mode::empty()) {
                Ok(mut child) => walk(&mut child, &path, uid, gid, depth + 1, budget)?,
                // Swapped for a link (or something else) since the listing:
                // not followed.
                Err(nix::errno::Errno::ELOOP | nix::errno::Errno::ENOTDIR) => {}
                Err(err) => return Err(format!("opening {}: {err}", path.display())),
            }
        }
    }
    Ok(())
}

fn is_directory(dirfd: std::os::fd::RawFd, name: &CStr) -> bool {
    nix::sys::stat::fstatat(Some(dirfd), name, AtFlags::AT_SYMLINK_NOFOLLOW)
        .is_ok_and(|st| st.st_mode & libc::S_IFMT == libc::S_IFDIR)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    /// A link planted in the data directory to a directory outside: the
    /// hand-over changes the link and what is really inside, never the
    /// target or what is below it.
    #[test]
    fn a_planted_link_hands_nothing_outside_over() {
        if !Uid::effective().is_root() {
            let why = "SKIP: changing owners needs root (tests/devices.rs covers it end to end, also as root)";
            assert!(std::env::var_os("CI").is_none(), "{why}");
            eprintln!("{why}");
            return;
        }
        let outside = tempfile::tempdir().expect("outside");
        std::fs::write(outside.path().join("secret"), b"x").expect("secret");
        let data = tempfile::tempdir().expect("data");
        std::fs::create_dir(data.path().join("namespaces")).expect("namespaces");
        std::fs::write(data.path().join("namespaces/ns"), b"y").expect("ns");
        std::os::unix::fs::symlink(outside.path(), data.path().join("namespaces/link")).expect("link");
        std::os::unix::fs::symlink(outside.path().join("secret"), data.path().join("file-link")).expect("link");
        let (uid, gid) = (Uid::from_raw(65534), Gid::from_raw(65534));
        hand_over(data.path(), uid, gid).expect("hand over");
        let owner = |p: &Path| std::fs::symlink_metadata(p).expect("stat").uid();
        assert_eq!(owner(&data.path().join("namespaces/ns")), 65534);
        assert_eq!(owner(&data.path().join("namespaces/link")), 65534, "the link itself");
        assert_eq!(owner(outside.path()), 0, "the link's target directory keeps its owner");
        assert_eq!(owner(&outside.path().join("secret")), 0, "nor what is below it");
    }
}
