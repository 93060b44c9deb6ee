//! Block drivers: what owns the storage devices and moves blocks between them
//! and DMA buffers.
//!
//! A [`BlockDriver`] opens namespaces (a linear LBA space with a block size)
//! and makes one [`Queue`] per data-plane core. The control path (ingest,
//! seal, scrub) uses the [`Namespace`]'s synchronous calls; the hot path only
//! the queues, which are owned by one core each and dispatched by enum.

mod faulty;
mod mem;
#[cfg(any(feature = "spdk", test))]
mod spdk;
mod uring;

use std::fmt;
use std::io;
use std::path::PathBuf;
use std::sync::Arc;

pub use faulty::{FaultPlan, FaultyDriver, FaultyQueue};
pub use mem::{MemDriver, MemQueue};
#[cfg(any(feature = "spdk", test))]
pub use spdk::{SpdkDriver, SpdkQueue, SpdkTarget};
pub use uring::{UringDriver, UringQueue};

use crate::dma::Arena;

/// Which backend a node runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DriverKind {
    /// io_uring on files and block devices; works everywhere.
    Uring,
    /// Memory only; for tests and demos without a disk.
    Mem,
    /// SPDK's user-space NVMe driver owns the controllers (feature `spdk`).
    Spdk,
}

impl fmt::Display for DriverKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Uring => "uring",
            Self::Mem => "mem",
            Self::Spdk => "spdk",
        })
    }
}

/// Whether file-backed namespaces bypass the page cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IoMode {
    /// O_DIRECT: reads go to the device, as with SPDK.
    Direct,
    /// Through the page cache.
    Buffered,
}

/// A namespace's shape.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NamespaceGeometry {
    pub block_size_bytes: u32,
    pub capacity_bytes: u64,
    /// A block device (an NVMe namespace) cannot grow past its capacity; a
    /// file or memory namespace grows as it is written.
    pub fixed_capacity: bool,
}

/// How to find a namespace.
#[derive(Clone, Debug)]
pub enum NamespaceSpec {
    /// A file or block device, created when `create` is set.
    File { path: PathBuf, create: bool },
    /// A block device the node opened itself before it gave up root
    /// (exclusively: see `sluice_control::claim`): its descriptors are
    /// duplicated, the path is never opened again. `direct` is opened
    /// O_DIRECT, for a node that reads around the page cache.
    Held { path: PathBuf, control: Arc<std::fs::File>, direct: Arc<std::fs::File> },
    /// A fresh in-memory namespace.
    Mem,
    /// Namespace `nsid` of the NVMe controller at PCI address `controller`,
    /// owned by a user-space driver (SPDK).
    Nvme { controller: String, nsid: u32 },
}

/// What a queue submits I/O to.
#[derive(Clone)]
pub enum IoTarget {
    Fd(std::os::fd::RawFd),
    Mem(Arc<mem::MemStore>),
    #[cfg(any(feature = "spdk", test))]
    Spdk(SpdkTarget),
}

/// Control-path access to a namespace: synchronous, for ingest and seal.
pub trait Namespace: Send + Sync {
    fn geometry(&self) -> NamespaceGeometry;
    /// Writes `data` at `offset_bytes`, growing a file-backed namespace.
    fn write_at(&self, offset_bytes: u64, data: &[u8]) -> io::Result<()>;
    fn read_at(&self, offset_bytes: u64, buf: &mut [u8]) -> io::Result<()>;
    /// Makes every write so far durable.
    fn sync(&self) -> io::Result<()>;
    /// Cuts the namespace to `len_bytes`, rounded up to the block size.
    /// A fixed-capacity namespace keeps its size; the catalog's committed
    /// length is what bounds reads there.
    fn truncate(&self, len_bytes: u64) -> io::Result<()>;
    /// Tells the device the bytes in `[offset, offset + len)` are free
    /// (TRIM / NVMe deallocate on block devices, a hole in files).
    fn discard(&self, offset_bytes: u64, len_bytes: u64) -> io::Result<()>;
    /// What the hot path submits to.
    fn target(&self) -> IoTarget;
    fn describe(&self) -> String;
}

#[derive(Debug, thiserror::Error)]
pub enum DriverError {
    #[error("opening namespace {what}: {source}")]
    Open {
        what: String,
        #[source]
        source: io::Error,
    },
    #[error("setting up an io_uring queue: {0}")]
    RingSetup(#[source] io::Error),
    #[error("namespace {0:?} is not one this {1} driver can open")]
    WrongSpec(NamespaceSpec, DriverKind),
    #[error("SPDK: {0}")]
    Spdk(String),
}

/// A backend. Shared by all cores; each core asks it for its own queue.
pub trait BlockDriver: Send + Sync {
    fn kind(&self) -> DriverKind;
    fn open_namespace(&self, spec: &NamespaceSpec) -> Result<Arc<dyn Namespace>, DriverError>;
    /// A queue pair for one core, reading into `arena`.
    fn create_queue(&self, arena: &Arena, depth: u32) -> Result<Queue, DriverError>;
    /// Namespace management on the controllers this driver owns itself
    /// (SPDK); `None` where the kernel owns them (see `control::nvme`).
    fn nvme_admin(&self) -> Option<&dyn NvmeAdmin> {
        None
    }
}

/// One namespace of a controller's subsystem.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct NvmeNamespace {
    pub nsid: u32,
    /// Attached to (active on) this controller.
    pub attached: bool,
    pub capacity_bytes: u64,
    /// NMIC bit 0: another controller, so another host, may attach and
    /// write it. Never taken for a dataset.
    pub shared: bool,
}

/// NVMe namespace management: what the control plane's one allocator
/// needs to give each dataset a namespace and take it back, whoever issues
/// the admin commands. Two stacks implement it: SPDK on the controllers it
/// owns (named by PCI address) and the kernel's passthrough ioctls
/// (`sluice_control::nvme`, named by `/dev/nvmeX`, in the node or its
/// privileged helper). Identify is parsed by [`crate::nvme_spec`] for both.
pub trait NvmeAdmin: Send + Sync {
    /// The controllers this stack may manage, by the names the other calls
    /// take.
    fn controllers(&self) -> Vec<String>;
    /// Every namespace of the controller's subsystem it can attach.
    fn namespaces(&self, controller: &str) -> io::Result<Vec<NvmeNamespace>>;
    /// `NGUID-EUI64` of namespace `nsid` as hex: what identifies it
    /// whatever its NSID (all zeros where the controller reports neither).
    fn namespace_identity(&self, controller: &str, nsid: u32) -> io::Result<String>;
    fn attach(&self, controller: &str, nsid: u32) -> io::Result<()>;
    fn detach(&self, controller: &str, nsid: u32) -> io::Result<()>;
    /// Whether the controller advertises Namespace Management.
    fn manages_namespaces(&self, controller: &str) -> io::Result<bool>;
    /// Creates a detached namespace of at least `bytes`: its NSID.
    fn create(&self, controller: &str, bytes: u64) -> io::Result<u32>;
    fn delete(&self, controller: &str, nsid: u32) -> io::Result<()>;
}

/// A raw I/O completion: `result` is bytes moved, or a negative errno.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Completion {
    pub tag: u64,
    pub result: i32,
}

/// A full submission queue; the caller retries after reaping.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("submission queue full")]
pub struct QueueFull;

/// One block read, handed to a queue. The buffer belongs to the queue until
/// its completion is reaped.
#[derive(Clone, Copy, Debug)]
pub struct ReadIo {
    /// Index of the namespace in the queue's table (see
    /// [`Queue::register_namespace`]).
    pub namespace_index: u32,
    pub offset_bytes: u64,
    pub len_bytes: u32,
    pub buf: *mut u8,
    pub tag: u64,
}

/// A core's queue pair on one device. Owned by that core (`!Sync` through
/// the raw pointers it holds); every call takes `&mut self`.
#[expect(clippy::large_enum_variant, reason = "one per core, made once and never moved on the hot path")]
pub enum Queue {
    Uring(UringQueue),
    Mem(MemQueue),
    Faulty(Box<FaultyQueue>),
    #[cfg(any(feature = "spdk", test))]
    Spdk(SpdkQueue),
}

impl Queue {
    /// Makes `target` addressable as `index` (registered file where the
    /// backend has them).
    pub fn register_namespace(&mut self, index: u32, target: &IoTarget) {
        match self {
            Self::Uring(q) => q.register_namespace(index, target),
            Self::Mem(q) => q.register_namespace(index, target),
            Self::Faulty(q) => q.register_namespace(index, target),
            #[cfg(any(feature = "spdk", test))]
            Self::Spdk(q) => q.register_namespace(index, target),
        }
    }

    pub fn unregister_namespace(&mut self, index: u32) {
        match self {
            Self::Uring(q) => q.unregister_namespace(index),
            Self::Mem(q) => q.unregister_namespace(index),
            Self::Faulty(q) => q.unregister_namespace(index),
            #[cfg(any(feature = "spdk", test))]
            Self::Spdk(q) => q.unregister_namespace(index),
        }
    }

    /// Queues a read; it reaches the device at the next [`Queue::flush`].
    ///
    /// # Safety
    /// `io.buf` must point to `io.len_bytes` writable bytes, aligned to 4096,
    /// that nothing else reads or writes until the completion for `io.tag`
    /// has been reaped.
    pub unsafe fn push_read(&mut self, io: ReadIo) -> Result<(), QueueFull> {
        match self {
            // SAFETY: forwarded contract.
            Self::Uring(q) => unsafe { q.push_read(io) },
            // SAFETY: forwarded contract.
            Self::Mem(q) => unsafe { q.push_read(io) },
            // SAFETY: forwarded contract.
            Self::Faulty(q) => unsafe { q.push_read(io) },
            // SAFETY: forwarded contract.
            #[cfg(any(feature = "spdk", test))]
            Self::Spdk(q) => unsafe { q.push_read(io) },
        }
    }

    /// Rings the doorbell for everything pushed since the last flush.
    pub fn flush(&mut self) -> io::Result<()> {
        match self {
            Self::Uring(q) => q.flush(),
            Self::Mem(_) => Ok(()),
            Self::Faulty(q) => q.flush(),
            // SPDK rings the doorbell at submission.
            #[cfg(any(feature = "spdk", test))]
            Self::Spdk(_) => Ok(()),
        }
    }

    /// Moves up to `max` completions into `out`; never blocks.
    #[inline]
    pub fn reap(&mut self, out: &mut Vec<Completion>, max: usize) -> usize {
        match self {
            Self::Uring(q) => q.reap(out, max),
            Self::Mem(q) => q.reap(out, max),
            Self::Faulty(q) => q.reap(out, max),
            #[cfg(any(feature = "spdk", test))]
            Self::Spdk(q) => q.reap(out, max),
        }
    }

    /// Blocks until at least one completion is ready (flushing first);
    /// for a completion [`Queue::completion_due`] names, the caller waits
    /// itself.
    pub fn wait(&mut self) -> io::Result<()> {
        match self {
            Self::Uring(q) => q.wait(),
            Self::Mem(_) => Ok(()),
            Self::Faulty(q) => q.wait(),
            #[cfg(any(feature = "spdk", test))]
            Self::Spdk(q) => q.wait(),
        }
    }

    /// A file descriptor that polls readable when completions are ready,
    /// for a core that waits for them in its event loop beside its
    /// sockets; `None` where the backend has none (the core then calls
    /// [`Queue::wait`]: a spin for SPDK, nothing for memory).
    pub fn completion_fd(&self) -> Option<std::os::fd::RawFd> {
        match self {
            Self::Uring(q) => Some(q.completion_fd()),
            Self::Faulty(q) => q.completion_fd(),
            Self::Mem(_) => None,
            #[cfg(any(feature = "spdk", test))]
            Self::Spdk(_) => None,
        }
    }

    /// When a completion the queue holds back will be ready without its
    /// fd or [`Queue::wait`] saying so: a fault plan's delayed read. The
    /// core sleeps in its event loop until then, beside its sockets,
    /// rather than blocking the thread. `None` for every real backend.
    pub fn completion_due(&self) -> Option<std::time::Instant> {
        match self {
            Self::Faulty(q) => q.completion_due(),
            _ => None,
        }
    }

    pub fn in_flight(&self) -> u32 {
        match self {
            Self::Uring(q) => q.in_flight(),
            Self::Mem(q) => q.in_flight(),
            Self::Faulty(q) => q.in_flight(),
            #[cfg(any(feature = "spdk", test))]
            Self::Spdk(q) => q.in_flight(),
        }
    }

    pub fn describe(&self) -> String {
        match self {
            Self::Uring(q) => q.describe(),
            Self::Mem(_) => "mem".to_string(),
            Self::Faulty(q) => q.describe(),
            #[cfg(any(feature = "spdk", test))]
            Self::Spdk(q) => q.describe(),
        }
    }
}
