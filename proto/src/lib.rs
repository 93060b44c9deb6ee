//! sluice's shared vocabulary: what the client, `sluicectl`, the node's
//! transports, its data plane and its control API must agree on. Range and
//! batch statuses, chunk geometry and the DMA footprint rule, limits and
//! the protocol version, the admission lane, the hot-path wire frames, the
//! control-message codec, and the HTTP API's types.
//!
//! It does no I/O and depends on nothing of sluice's: a training host links
//! it without linking the storage node.

pub mod api;
pub mod codec;
pub mod geometry;
pub mod lane;
pub mod litdata;
pub mod mds;
pub mod npy;
pub mod sample_index;
pub mod status;
pub mod tar;
pub mod wire;

pub use api::NodeInfo;
pub use codec::{ControlMessage, ErrorCode, OpenInfo, Secret};
pub use geometry::CHUNK_SIZE_BYTES;
pub use lane::Lane;
pub use status::RangeStatus;
pub use wire::{BatchStatus, RangeDescriptor};
