//! What the data plane knows about a dataset: where its bytes live, how long
//! it is, and the chunk checksums its reads are verified against.

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
    pub block_crcs: Arc<[u32]>,
}

impl DatasetView {
    /// The first `length_bytes` of `namespace` as dataset `dataset_id`,
    /// with no chunk checksums (the data plane verifies nothing): for
    /// tools and tests that read a namespace directly.
    pub fn unverified(dataset_id: u64, namespace: Arc<dyn Namespace>, length_bytes: u64) -> Self {
        Self { dataset_id, namespace, base_offset_bytes: 0, length_bytes, block_crcs: Arc::from([]) }
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
