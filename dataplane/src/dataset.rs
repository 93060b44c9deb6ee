//! What the data plane knows about a dataset: where its bytes live, how long
//! it is, and the chunk checksums its reads are verified against.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use crate::driver::Namespace;

/// A byte range of a dataset, as a client asks for it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ByteRange {
    pub offset_bytes: u64,
    pub len_bytes: u32,
}

/// A sealed dataset as the data plane serves it: immutable, shared by cores.
pub struct DatasetView {
    /// Catalog id, reported to probes.
    pub dataset_id: u64,
    pub namespace: Arc<dyn Namespace>,
    /// Byte offset of the dataset's first byte inside the namespace; a
    /// multiple of the namespace's block size.
    pub base_offset_bytes: u64,
    pub length_bytes: u64,
    /// CRC32C of each [`crate::blocks::VERIFY_BLOCK_BYTES`] block; the last
    /// may be short. Every read covers whole blocks and every block it
    /// covers is verified; empty means "not verified by the data plane".
    pub block_crcs: BlockCrcs,
}

/// A dataset's block checksums, shared by the cores that verify reads and,
/// for a source-backed dataset, the fill that writes a chunk's entries
/// when its bytes arrive.
///
/// A source-backed chunk's entries are written before the chunk is marked
/// present (a release store in the cache's bitmap) and a batch reaches a
/// core only after its chunks were seen present (an acquire load, then the
/// core's inbox), so a core never verifies against an entry still being
/// written; the entries themselves need no ordering of their own.
#[derive(Clone)]
pub struct BlockCrcs(Arc<[AtomicU32]>);

impl BlockCrcs {
    /// `count` entries of 0, to be set as chunks are filled.
    pub fn zeroed(count: usize) -> Self {
        Self((0..count).map(|_| AtomicU32::new(0)).collect())
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn get(&self, block: usize) -> Option<u32> {
        self.0.get(block).map(|crc| crc.load(Ordering::Relaxed))
    }

    /// Sets the entries from block `first` on (a filled chunk's).
    pub fn set(&self, first: usize, crcs: &[u32]) {
        assert!(first + crcs.len() <= self.0.len(), "block checksums past the dataset's end");
        for (entry, &crc) in self.0[first..].iter().zip(crcs) {
            entry.store(crc, Ordering::Relaxed);
        }
    }

    /// The entries as they are now.
    pub fn to_vec(&self) -> Vec<u32> {
        self.0.iter().map(|crc| crc.load(Ordering::Relaxed)).collect()
    }
}

impl From<Vec<u32>> for BlockCrcs {
    fn from(crcs: Vec<u32>) -> Self {
        Self(crcs.into_iter().map(AtomicU32::new).collect())
    }
}

impl From<&[u32]> for BlockCrcs {
    fn from(crcs: &[u32]) -> Self {
        Self(crcs.iter().map(|&crc| AtomicU32::new(crc)).collect())
    }
}

impl DatasetView {
    /// The first `length_bytes` of `namespace` as dataset `dataset_id`,
    /// with no chunk checksums (the data plane verifies nothing): for
    /// tools and tests that read a namespace directly.
    pub fn unverified(dataset_id: u64, namespace: Arc<dyn Namespace>, length_bytes: u64) -> Self {
        Self { dataset_id, namespace, base_offset_bytes: 0, length_bytes, block_crcs: BlockCrcs::from(Vec::new()) }
    }
}

impl std::fmt::Debug for DatasetView {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DatasetView")
            .field("base_offset_bytes", &self.base_offset_bytes)
            .field("length_bytes", &self.length_bytes)
            .field("blocks", &self.block_crcs.len())
            .finish()
    }
}
