//! The memory backend: namespaces are byte vectors, reads complete at
//! submission. For tests and for nodes without a disk; it takes a lock per
//! read, which the real backends never do.

use std::collections::VecDeque;
use std::io;
use std::sync::{Arc, RwLock};

use super::{
    BlockDriver, Completion, DriverError, DriverKind, IoTarget, Namespace, NamespaceGeometry, NamespaceSpec, Queue,
    QueueFull, ReadIo,
};
use crate::dma::Arena;

const MEM_BLOCK_SIZE_BYTES: u32 = 512;

#[derive(Default)]
pub struct MemDriver;

impl BlockDriver for MemDriver {
    fn kind(&self) -> DriverKind {
        DriverKind::Mem
    }

    fn open_namespace(&self, spec: &NamespaceSpec) -> Result<Arc<dyn Namespace>, DriverError> {
        match spec {
            NamespaceSpec::Mem => Ok(Arc::new(MemNamespace { store: Arc::new(MemStore::default()) })),
            other => Err(DriverError::WrongSpec(other.clone(), DriverKind::Mem)),
        }
    }

    fn create_queue(&self, _arena: &Arena, depth: u32) -> Result<Queue, DriverError> {
        Ok(Queue::Mem(MemQueue { depth, done: VecDeque::new(), stores: Vec::new() }))
    }
}

/// Bytes of one in-memory namespace.
#[derive(Default)]
pub struct MemStore {
    bytes: RwLock<Vec<u8>>,
}

struct MemNamespace {
    store: Arc<MemStore>,
}

fn poisoned() -> io::Error {
    io::Error::other("memory namespace lock poisoned")
}

impl Namespace for MemNamespace {
    fn geometry(&self) -> NamespaceGeometry {
        let len = self.store.bytes.read().map(|b| b.len()).unwrap_or(0);
        NamespaceGeometry { block_size_bytes: MEM_BLOCK_SIZE_BYTES, capacity_bytes: len as u64, fixed_capacity: false }
    }

    fn write_at(&self, offset_bytes: u64, data: &[u8]) -> io::Result<()> {
        let mut bytes = self.store.bytes.write().map_err(|_| poisoned())?;
        let start = usize::try_from(offset_bytes).map_err(io::Error::other)?;
        let end = start + data.len();
        if bytes.len() < end {
            bytes.resize(end, 0);
        }
        bytes[start..end].copy_from_slice(data);
        Ok(())
    }

    fn read_at(&self, offset_bytes: u64, buf: &mut [u8]) -> io::Result<()> {
        let bytes = self.store.bytes.read().map_err(|_| poisoned())?;
        let start = usize::try_from(offset_bytes).map_err(io::Error::other)?;
        let src = bytes.get(start..start + buf.len()).ok_or_else(|| io::Error::from(io::ErrorKind::UnexpectedEof))?;
        buf.copy_from_slice(src);
        Ok(())
    }

    fn sync(&self) -> io::Result<()> {
        Ok(())
    }

    fn truncate(&self, len_bytes: u64) -> io::Result<()> {
        let mut bytes = self.store.bytes.write().map_err(|_| poisoned())?;
        bytes.resize(usize::try_from(len_bytes).map_err(io::Error::other)?, 0);
        Ok(())
    }

    fn discard(&self, offset_bytes: u64, len_bytes: u64) -> io::Result<()> {
        let mut bytes = self.store.bytes.write().map_err(|_| poisoned())?;
        let start = usize::try_from(offset_bytes).map_err(io::Error::other)?.min(bytes.len());
        let end = usize::try_from(offset_bytes.saturating_add(len_bytes)).unwrap_or(usize::MAX).min(bytes.len());
        bytes[start..end].fill(0);
        Ok(())
    }

    fn target(&self) -> IoTarget {
        IoTarget::Mem(Arc::clone(&self.store))
    }

    fn describe(&self) -> String {
        "memory".to_string()
    }
}

pub struct MemQueue {
    depth: u32,
    done: VecDeque<Completion>,
    stores: Vec<Option<Arc<MemStore>>>,
}

impl MemQueue {
    pub(super) fn register_namespace(&mut self, index: u32, target: &IoTarget) {
        let IoTarget::Mem(store) = target else {
            panic!("memory queue given a non-memory namespace");
        };
        let slot = index as usize;
        if self.stores.len() <= slot {
            self.stores.resize(slot + 1, None);
        }
        self.stores[slot] = Some(Arc::clone(store));
    }

    pub(super) fn unregister_namespace(&mut self, index: u32) {
        if let Some(entry) = self.stores.get_mut(index as usize) {
            *entry = None;
        }
    }

    /// # Safety
    /// See [`Queue::push_read`].
    pub(super) unsafe fn push_read(&mut self, io: ReadIo) -> Result<(), QueueFull> {
        if self.done.len() as u32 >= self.depth {
            return Err(QueueFull);
        }
        let Some(Some(store)) = self.stores.get(io.namespace_index as usize) else {
            panic!("read for unregistered namespace {}", io.namespace_index);
        };
        let result = match store.bytes.read() {
            Ok(bytes) => {
                let start = usize::try_from(io.offset_bytes).unwrap_or(usize::MAX).min(bytes.len());
                let len = (io.len_bytes as usize).min(bytes.len() - start);
                // SAFETY: the caller guarantees `buf` holds `len_bytes` bytes
                // nobody else touches; `len <= len_bytes`.
                unsafe { std::ptr::copy_nonoverlapping(bytes[start..].as_ptr(), io.buf, len) };
                len as i32
            }
            Err(_) => -libc::EIO,
        };
        self.done.push_back(Completion { tag: io.tag, result });
        Ok(())
    }

    pub(super) fn reap(&mut self, out: &mut Vec<Completion>, max: usize) -> usize {
        let count = max.min(self.done.len());
        out.extend(self.done.drain(..count));
        count
    }

    pub(super) fn in_flight(&self) -> u32 {
        self.done.len() as u32
    }
}
