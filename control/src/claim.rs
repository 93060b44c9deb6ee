//! Taking a block device (an NVMe namespace) for datasets.
//!
//! A namespace device named in the config is opened once, at start, while
//! the node still has root: exclusively (`O_EXCL`), so the open fails while
//! a filesystem is mounted on it or md, dm or another sluiced holds it, and
//! nothing can mount or claim it while the node runs. The node keeps these
//! descriptors for its life and never opens the path again, so it can run
//! as an unprivileged `--user` afterwards.
//!
//! A device that no dataset record owns is also checked for someone else's
//! data before the allocator may write it: partitions, holders in sysfs,
//! and the signatures `blkid` would find first (filesystems, partition
//! tables, LVM, LUKS, swap, RAID). Such a device is left untouched and
//! reported unless the operator names it in `--claim-device` for that start.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Bytes read from a device's start to look for signatures: past btrfs's
/// superblock at 64 KiB.
pub const SIGNATURE_SCAN_BYTES: usize = 68 << 10;

/// A namespace device the node holds open.
#[derive(Clone, Debug)]
pub struct HeldDevice {
    pub path: PathBuf,
    /// Read-write, the exclusive claim itself.
    pub control: Arc<File>,
    /// Read-only O_DIRECT, for the hot path.
    pub direct: Arc<File>,
    /// Its size at open, measured while the node could still open it.
    pub capacity_bytes: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum ClaimError {
    #[error("{path}: a namespace device must be a block device (e.g. /dev/nvme0n2)")]
    NotBlock { path: String },
    #[error(
        "{path} is in use (mounted, or held by md, dm or another process with O_EXCL); \
         the node leaves it alone: unmount or release it, or drop it from namespace_devices"
    )]
    Busy { path: String },
    #[error("{path}: {source}")]
    Open {
        path: String,
        #[source]
        source: io::Error,
    },
}

impl HeldDevice {
    /// Opens `path` exclusively for the node's life.
    pub fn open(path: &Path) -> Result<Self, ClaimError> {
        let shown = || path.display().to_string();
        let is_block = std::fs::metadata(path).map(|m| m.file_type().is_block_device());
        if !matches!(is_block, Ok(true)) {
            return Err(ClaimError::NotBlock { path: shown() });
        }
        let control =
            OpenOptions::new().read(true).write(true).custom_flags(libc::O_EXCL).open(path).map_err(|source| {
                if source.raw_os_error() == Some(libc::EBUSY) {
                    ClaimError::Busy { path: shown() }
                } else {
                    ClaimError::Open { path: shown(), source }
                }
            })?;
        // A second O_EXCL open would conflict with the first: the claim is
        // the control descriptor's; this one only reads.
        let direct = OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECT)
            .open(path)
            .map_err(|source| ClaimError::Open { path: shown(), source })?;
        let capacity_bytes = io::Seek::seek(&mut &control, io::SeekFrom::End(0))
            .map_err(|source| ClaimError::Open { path: shown(), source })?;
        Ok(Self { path: path.to_path_buf(), control: Arc::new(control), direct: Arc::new(direct), capacity_bytes })
    }

    /// What else uses or has data on this device, if anything: partitions
    /// or holders in sysfs, or a signature at its start.
    pub fn foreign_use(&self) -> Option<String> {
        if let Some(what) = sysfs_users(&self.path) {
            return Some(what);
        }
        let mut head = vec![0u8; SIGNATURE_SCAN_BYTES];
        let read = read_head(&self.control, &mut head);
        match read {
            Ok(n) => signature(&head[..n]).map(|what| format!("it carries {what} signature")),
            Err(err) => Some(format!("its first bytes are unreadable ({err})")),
        }
    }
}

fn read_head(file: &File, buf: &mut [u8]) -> io::Result<usize> {
    let mut filled = 0;
    while filled < buf.len() {
        match file.read_at(&mut buf[filled..], filled as u64)? {
            0 => break,
            n => filled += n,
        }
    }
    Ok(filled)
}

/// Partitions and holders (dm, md, bcache) of a block device, from sysfs.
fn sysfs_users(path: &Path) -> Option<String> {
    let name = std::fs::canonicalize(path).ok()?.file_name()?.to_str()?.to_string();
    let sys = Path::new("/sys/class/block").join(&name);
    let holders: Vec<String> = std::fs::read_dir(sys.join("holders"))
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    if !holders.is_empty() {
        return Some(format!("it is held by {}", holders.join(", ")));
    }
    let partitions: Vec<String> = std::fs::read_dir(&sys)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with(&name) && e.path().join("partition").exists())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    if !partitions.is_empty() {
        return Some(format!("it has partitions ({})", partitions.join(", ")));
    }
    None
}

/// The first known signature in a device's first bytes: (offset, magic,
/// what). Offsets from util-linux's libblkid probes.
const SIGNATURES: &[(usize, &[u8], &str)] = &[
    (0, b"XFSB", "an XFS"),
    (0, b"LUKS\xba\xbe", "a LUKS"),
    (0, b"SKL1", "a SKL1"),
    (0x438, &[0x53, 0xef], "an ext2/3/4"),
    (0x200, b"EFI PART", "a GPT partition table"),
    (0x218, b"LVM2 001", "an LVM2 physical volume"),
    (0x1000, &[0xfc, 0x4e, 0x2b, 0xa9], "a Linux RAID (md 1.2)"),
    (0xff6, b"SWAPSPACE2", "a swap"),
    (0xff6, b"SWAP-SPACE", "a swap"),
    (0x10040, b"_BHRfS_M", "a btrfs"),
    (0x3, b"NTFS    ", "an NTFS"),
    (0x52, b"FAT32   ", "a FAT32"),
    (0x36, b"FAT16   ", "a FAT"),
    (0x1fe, &[0x55, 0xaa], "a DOS partition table (MBR)"),
];

/// What kind of someone else's data `head` (a device's first bytes) shows,
/// if any. Zeros, and bytes that match no signature, are free.
pub fn signature(head: &[u8]) -> Option<&'static str> {
    SIGNATURES
        .iter()
        .find(|(offset, magic, _)| head.get(*offset..offset + magic.len()) == Some(*magic))
        .map(|(_, _, what)| *what)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(offset: usize, magic: &[u8]) -> Vec<u8> {
        let mut head = vec![0u8; SIGNATURE_SCAN_BYTES];
        head[offset..offset + magic.len()].copy_from_slice(magic);
        head
    }

    #[test]
    fn zeros_and_short_reads_are_free() {
        assert_eq!(signature(&vec![0u8; SIGNATURE_SCAN_BYTES]), None);
        assert_eq!(signature(&[]), None);
        assert_eq!(signature(&[0x53]), None);
    }

    #[test]
    fn each_signature_is_found_at_its_offset() {
        for (offset, magic, what) in SIGNATURES {
            assert_eq!(signature(&with(*offset, magic)), Some(*what), "{what}");
            if *offset > 0 {
                assert_ne!(signature(&with(offset - 1, magic)), Some(*what), "{what} one byte early");
            }
        }
    }

    /// An ext4 image written by mkfs is found (a real superblock, not just
    /// the magic), when mkfs is there to make one.
    #[test]
    fn a_real_ext4_image_is_found() {
        let dir = tempfile::tempdir().expect("tempdir");
        let image = dir.path().join("fs.img");
        std::fs::write(&image, vec![0u8; 8 << 20]).expect("image");
        let made = std::process::Command::new("mkfs.ext4").args(["-q", "-F"]).arg(&image).status();
        if !made.is_ok_and(|s| s.success()) {
            let why = "SKIP: mkfs.ext4 (e2fsprogs) is not installed; the magic-only cases above still ran";
            assert!(std::env::var_os("CI").is_none(), "{why}");
            eprintln!("{why}");
            return;
        }
        let mut head = vec![0u8; SIGNATURE_SCAN_BYTES];
        let n = read_head(&File::open(&image).expect("open"), &mut head).expect("read");
        assert_eq!(signature(&head[..n]), Some("an ext2/3/4"));
    }

    #[test]
    fn a_regular_file_is_not_a_namespace_device() {
        let file = tempfile::NamedTempFile::new().expect("file");
        assert!(matches!(HeldDevice::open(file.path()), Err(ClaimError::NotBlock { .. })));
    }
}
