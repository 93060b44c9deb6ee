//! The io_uring backend: files and block devices, O_DIRECT by default, with
//! the core's DMA arena registered as a fixed buffer and each namespace as a
//! fixed file, so a read costs one SQE and no per-I/O page pinning.

use std::fs::{File, OpenOptions};
use std::io;
use std::io::{Seek, SeekFrom};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, FileTypeExt, OpenOptionsExt};
use std::path::Path;
use std::sync::Arc;

use io_uring::{opcode, types, IoUring};

use super::{
    BlockDriver, Completion, DriverError, DriverKind, IoMode, IoTarget, Namespace, NamespaceGeometry, NamespaceSpec,
    Queue, QueueFull, ReadIo,
};
use crate::dma::{Arena, IO_ALIGN_BYTES};

/// Size of the sparse fixed-file table of each ring: the most datasets a
/// core can address as registered files; others fall back to plain fds.
const FIXED_FILES_MAX: u32 = 4096;

/// Block size presented for files: every O_DIRECT alignment rule in practice
/// (512 B or 4 KiB logical blocks) is met by 4 KiB.
const FILE_BLOCK_SIZE_BYTES: u32 = IO_ALIGN_BYTES as u32;

pub struct UringDriver {
    io_mode: IoMode,
}

impl UringDriver {
    pub fn new(io_mode: IoMode) -> Self {
        Self { io_mode }
    }

    /// The control descriptor, the hot path's, and whether that one is
    /// O_DIRECT, of a file or block device opened by path.
    fn open_path(&self, path: &Path, create: bool) -> io::Result<(File, File, bool)> {
        let control = OpenOptions::new().read(true).write(true).create(create).truncate(false).open(path)?;
        if self.io_mode == IoMode::Buffered {
            let data = control.try_clone()?;
            return Ok((control, data, false));
        }
        match OpenOptions::new().read(true).custom_flags(libc::O_DIRECT).open(path) {
            Ok(data) => Ok((control, data, true)),
            Err(err) if err.raw_os_error() == Some(libc::EINVAL) => {
                tracing::warn!(
                    "{}: the filesystem refuses O_DIRECT; serving it through the page cache",
                    path.display()
                );
                let data = control.try_clone()?;
                Ok((control, data, false))
            }
            Err(err) => Err(err),
        }
    }

    /// The same from descriptors the node opened at start (duplicated).
    fn dup_held(&self, control: &File, direct: &File) -> io::Result<(File, File, bool)> {
        match self.io_mode {
            IoMode::Direct => Ok((control.try_clone()?, direct.try_clone()?, true)),
            IoMode::Buffered => Ok((control.try_clone()?, control.try_clone()?, false)),
        }
    }
}

impl BlockDriver for UringDriver {
    fn kind(&self) -> DriverKind {
        DriverKind::Uring
    }

    fn open_namespace(&self, spec: &NamespaceSpec) -> Result<Arc<dyn Namespace>, DriverError> {
        let (path, opened) = match spec {
            NamespaceSpec::File { path, create } => (path, self.open_path(path, *create)),
            NamespaceSpec::Held { path, control, direct } => (path, self.dup_held(control, direct)),
            _ => return Err(DriverError::WrongSpec(spec.clone(), DriverKind::Uring)),
        };
        let open_err = |source| DriverError::Open { what: path.display().to_string(), source };
        let (control, data, direct) = opened.map_err(open_err)?;
        let block_device = control.metadata().map_err(open_err)?.file_type().is_block_device();
        Ok(Arc::new(FileNamespace { path: path.display().to_string(), control, data, direct, block_device }))
    }

    fn create_queue(&self, arena: &Arena, depth: u32) -> Result<Queue, DriverError> {
        UringQueue::new(arena, depth).map(Queue::Uring)
    }
}

/// A file or block device as a namespace. Two descriptors: a buffered one
/// for the control path and the one the hot path reads (O_DIRECT unless the
/// node runs buffered or the filesystem refuses it).
struct FileNamespace {
    path: String,
    control: File,
    data: File,
    direct: bool,
    /// A whole NVMe namespace (or other block device): fixed capacity,
    /// discarded with BLKDISCARD.
    block_device: bool,
}

// BLKDISCARD from <linux/fs.h>: `_IO(0x12, 119)`, taking `[start, len]` in bytes.
nix::ioctl_write_ptr_bad!(blkdiscard, 0x1277, [u64; 2]);

impl Namespace for FileNamespace {
    fn geometry(&self) -> NamespaceGeometry {
        let capacity_bytes = if self.block_device {
            // A block device's length is where a seek to its end lands.
            (&self.control).seek(SeekFrom::End(0)).unwrap_or(0)
        } else {
            self.control.metadata().map(|m| m.len()).unwrap_or(0)
        };
        NamespaceGeometry { block_size_bytes: FILE_BLOCK_SIZE_BYTES, capacity_bytes, fixed_capacity: self.block_device }
    }

    fn write_at(&self, offset_bytes: u64, data: &[u8]) -> io::Result<()> {
        self.control.write_all_at(data, offset_bytes)
    }

    fn read_at(&self, offset_bytes: u64, buf: &mut [u8]) -> io::Result<()> {
        self.control.read_exact_at(buf, offset_bytes)
    }

    fn sync(&self) -> io::Result<()> {
        self.control.sync_all()
    }

    fn truncate(&self, len_bytes: u64) -> io::Result<()> {
        if self.block_device {
            return Ok(());
        }
        self.control.set_len(len_bytes.next_multiple_of(u64::from(FILE_BLOCK_SIZE_BYTES)))
    }

    fn discard(&self, offset_bytes: u64, len_bytes: u64) -> io::Result<()> {
        let block = u64::from(FILE_BLOCK_SIZE_BYTES);
        let start = offset_bytes.next_multiple_of(block);
        let end = offset_bytes.saturating_add(len_bytes) / block * block;
        if end <= start {
            return Ok(());
        }
        if self.block_device {
            let range = [start, end - start];
            // SAFETY: BLKDISCARD reads two u64 from the pointer, which points
            // at `range`, alive for the call; the descriptor is ours and open.
            unsafe { blkdiscard(self.control.as_raw_fd(), &range) }.map_err(io::Error::from)?;
            return Ok(());
        }
        let flags = nix::fcntl::FallocateFlags::FALLOC_FL_PUNCH_HOLE | nix::fcntl::FallocateFlags::FALLOC_FL_KEEP_SIZE;
        let (start, len) =
            (i64::try_from(start).map_err(io::Error::other)?, i64::try_from(end - start).map_err(io::Error::other)?);
        nix::fcntl::fallocate(self.control.as_raw_fd(), flags, start, len).map_err(io::Error::from)
    }

    fn target(&self) -> IoTarget {
        IoTarget::Fd(self.data.as_raw_fd())
    }

    fn describe(&self) -> String {
        let mode = if self.direct { "O_DIRECT" } else { "page cache" };
        format!("file {} ({mode})", self.path)
    }
}

/// One core's io_uring.
pub struct UringQueue {
    ring: IoUring,
    depth: u32,
    in_flight: u32,
    unsubmitted: u32,
    /// The arena is registered as fixed buffer 0 when the kernel allowed it.
    fixed_buffer: Option<(usize, usize)>,
    fixed_files: bool,
    /// Per namespace index: the raw fd, and whether it is a fixed file.
    files: Vec<Option<(std::os::fd::RawFd, bool)>>,
}

impl UringQueue {
    fn new(arena: &Arena, depth: u32) -> Result<Self, DriverError> {
        let depth = depth.clamp(1, 4096).next_power_of_two();
        // A kernel before 6.0 refuses these flags: it gets a plain ring,
        // and `describe` says so.
        let ring = IoUring::builder()
            .setup_single_issuer()
            .setup_coop_taskrun()
            .build(depth)
            .or_else(|_| IoUring::new(depth))
            .map_err(DriverError::RingSetup)?;
        let iovec = libc::iovec { iov_base: arena.base_ptr().cast(), iov_len: arena.len_bytes() };
        // SAFETY: the iovec covers the arena mapping, which outlives the ring
        // (the owning core drops its queue before its arena reference, and
        // in-flight reads are drained first).
        let fixed_buffer = match unsafe { ring.submitter().register_buffers(&[iovec]) } {
            Ok(()) => Some((arena.base_ptr() as usize, arena.len_bytes())),
            Err(err) => {
                tracing::warn!("io_uring buffer registration refused ({err}); using plain reads");
                None
            }
        };
        let fixed_files = ring.submitter().register_files_sparse(FIXED_FILES_MAX).is_ok();
        Ok(Self { ring, depth, in_flight: 0, unsubmitted: 0, fixed_buffer, fixed_files, files: Vec::new() })
    }

    pub(super) fn register_namespace(&mut self, index: u32, target: &IoTarget) {
        let IoTarget::Fd(fd) = *target else {
            panic!("io_uring queue given a non-file namespace");
        };
        let slot = index as usize;
        if self.files.len() <= slot {
            self.files.resize(slot + 1, None);
        }
        let fixed = self.fixed_files
            && index < FIXED_FILES_MAX
            && self.ring.submitter().register_files_update(index, &[fd]).is_ok();
        self.files[slot] = Some((fd, fixed));
    }

    pub(super) fn unregister_namespace(&mut self, index: u32) {
        if let Some(Some((_, true))) = self.files.get(index as usize) {
            if let Err(err) = self.ring.submitter().register_files_update(index, &[-1]) {
                tracing::warn!("unregistering fixed file {index}: {err}");
            }
        }
        if let Some(entry) = self.files.get_mut(index as usize) {
            *entry = None;
        }
    }

    /// # Safety
    /// See [`Queue::push_read`].
    pub(super) unsafe fn push_read(&mut self, io: ReadIo) -> Result<(), QueueFull> {
        if self.in_flight >= self.depth {
            return Err(QueueFull);
        }
        let Some(Some((fd, fixed))) = self.files.get(io.namespace_index as usize).copied() else {
            panic!("read for unregistered namespace {}", io.namespace_index);
        };
        let in_arena = self.fixed_buffer.is_some_and(|(base, len)| {
            let at = io.buf as usize;
            at >= base && at + io.len_bytes as usize <= base + len
        });
        let entry = match (fixed, in_arena) {
            (true, true) => opcode::ReadFixed::new(types::Fixed(io.namespace_index), io.buf, io.len_bytes, 0)
                .offset(io.offset_bytes)
                .build(),
            (false, true) => {
                opcode::ReadFixed::new(types::Fd(fd), io.buf, io.len_bytes, 0).offset(io.offset_bytes).build()
            }
            (true, false) => opcode::Read::new(types::Fixed(io.namespace_index), io.buf, io.len_bytes)
                .offset(io.offset_bytes)
                .build(),
            (false, false) => opcode::Read::new(types::Fd(fd), io.buf, io.len_bytes).offset(io.offset_bytes).build(),
        };
        let entry = entry.user_data(io.tag);
        // SAFETY: the buffer stays valid and untouched until this tag's completion
        // is reaped (caller's contract); the fd stays open while registered, and
        // a namespace is unregistered only with no I/O in flight for it.
        let pushed = unsafe { self.ring.submission().push(&entry) };
        pushed.map_err(|_| QueueFull)?;
        self.in_flight += 1;
        self.unsubmitted += 1;
        Ok(())
    }

    /// Submits what was pushed. The kernel may take fewer entries than
    /// there are (it stops at an entry it refuses before issuing it, or
    /// when it cannot allocate): the rest stay in the submission queue and
    /// count as unsubmitted, so the next flush or wait submits them rather
    /// than the core waiting for completions of reads never issued.
    pub(super) fn flush(&mut self) -> io::Result<()> {
        if self.unsubmitted == 0 {
            return Ok(());
        }
        let submitted = self.ring.submit();
        self.unsubmitted = self.ring.submission().len() as u32;
        submitted.map(drop)
    }

    #[inline]
    pub(super) fn reap(&mut self, out: &mut Vec<Completion>, max: usize) -> usize {
        let mut reaped = 0;
        for cqe in self.ring.completion().take(max) {
            out.push(Completion { tag: cqe.user_data(), result: cqe.result() });
            reaped += 1;
        }
        assert!(reaped as u32 <= self.in_flight, "more completions than submissions");
        self.in_flight -= reaped as u32;
        reaped
    }

    /// The ring's own fd: it polls readable while its completion queue
    /// holds entries.
    pub(super) fn completion_fd(&self) -> std::os::fd::RawFd {
        use std::os::fd::AsRawFd;
        self.ring.as_raw_fd()
    }

    pub(super) fn wait(&mut self) -> io::Result<()> {
        if self.in_flight == 0 {
            return Ok(());
        }
        let waited = loop {
            match self.ring.submit_and_wait(1) {
                Err(err) if err.raw_os_error() == Some(libc::EINTR) => continue,
                waited => break waited,
            }
        };
        self.unsubmitted = self.ring.submission().len() as u32;
        waited.map(drop)
    }

    pub(super) fn in_flight(&self) -> u32 {
        self.in_flight
    }

    pub(super) fn describe(&self) -> String {
        format!(
            "io_uring depth {} (fixed buffers: {}, fixed files: {}, single issuer and cooperative task work: {})",
            self.depth,
            self.fixed_buffer.is_some(),
            self.fixed_files,
            // Asked for together with cooperative task work, so a ring
            // that has the one has the other.
            self.ring.params().is_setup_single_issuer()
        )
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::os::fd::AsRawFd;

    use super::*;

    /// The kernel stops taking entries at one it refuses before issuing
    /// it; the reads pushed after it must still go at the next flush, as
    /// the core flushes on every pass and waits on the ring's fd, never
    /// entering the kernel otherwise.
    #[test]
    fn entries_the_kernel_left_in_the_queue_go_at_the_next_flush() {
        let mut file = tempfile::tempfile().expect("temp file");
        file.write_all(&[7u8; 8192]).expect("write");
        let arena = Arena::new(2, 64 * 1024).expect("arena");
        let mut queue = UringQueue::new(&arena, 8).expect("io_uring");
        queue.register_namespace(0, &IoTarget::Fd(file.as_raw_fd()));

        // A fixed-buffer read may not select a provided buffer: refused at
        // submission, before it is issued.
        let refused = opcode::ReadFixed::new(types::Fd(file.as_raw_fd()), arena.slot_ptr(1, 0), 4096, 0)
            .build()
            .flags(io_uring::squeue::Flags::BUFFER_SELECT)
            .user_data(1);
        // SAFETY: the kernel refuses the entry before touching its buffer.
        unsafe { queue.ring.submission().push(&refused) }.expect("room");
        queue.in_flight += 1;
        queue.unsubmitted += 1;
        let read = ReadIo { namespace_index: 0, offset_bytes: 0, len_bytes: 4096, buf: arena.slot_ptr(0, 0), tag: 2 };
        // SAFETY: slot 0 of the arena is this test's alone until reaped.
        unsafe { queue.push_read(read) }.expect("room");

        let mut done = Vec::new();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while done.len() < 2 && std::time::Instant::now() < deadline {
            queue.flush().expect("submit");
            queue.reap(&mut done, 8);
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        let refused = done.iter().find(|c| c.tag == 1).expect("the refused entry completes");
        assert!(refused.result < 0, "refused with an error: {}", refused.result);
        let read = done.iter().find(|c| c.tag == 2).expect("the read after it was submitted and completed");
        assert_eq!(read.result, 4096);
        // SAFETY: the read completed; nothing else writes slot 0.
        assert!(unsafe { arena.slot_bytes(0, 0, 4096) }.iter().all(|&b| b == 7));
    }
}
