//! The storage node's data plane: block drivers, DMA buffers, and the per-core
//! engines that turn batches of byte ranges into block reads.
//!
//! It knows nothing of transports or the catalog: a transport hands a
//! [`ReadBatch`] to a core through [`DataPlane::submit`] and gets a
//! [`BatchResult`] back whose bytes still live in the core's DMA buffers, so
//! the transport can send them without a copy.
//!
//! Of sluice's crates it depends on `sluice-proto` alone (statuses, chunk
//! geometry, the lane type); transports, catalog and API sit above it.

pub mod blocks;
pub mod dataset;
pub mod dma;
pub mod driver;
pub mod engine;
pub mod nvme_spec;
pub mod plan;
pub mod probe;
pub mod steer;
pub mod timer;

pub use blocks::VERIFY_BLOCK_BYTES;
pub use dataset::{BlockCrcs, ByteRange, DatasetView};
pub use dma::{Arena, SlotLease};
pub use driver::{
    BlockDriver, DriverKind, IoMode, Namespace, NamespaceGeometry, NamespaceSpec, NvmeAdmin, NvmeNamespace,
};
pub use engine::{
    spare_ranges, AttachError, BatchCompletion, BatchResult, CoreGroup, CoreLoadSnapshot, DataPlane, DataPlaneConfig,
    DatasetSlot, DmaRegion, Hold, Outcome, Placement, ReadBatch, Reply, SubmitError, BULK_IN_FLIGHT_BYTES_DEFAULT,
    POLL_WINDOW_US_DEFAULT,
};
pub use steer::{Flow, FlowLease, LaneDecisions};
