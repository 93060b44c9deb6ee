//! The hot-path wire format: fixed-layout little-endian structs read and
//! written in place with `zerocopy`, never serde-encoded.
//!
//! Every frame starts with a [`FrameHeader`]. A batch request is a
//! [`BatchRequestHeader`] and `range_count` [`RangeDescriptor`]s; its response
//! is a [`BatchResponseHeader`], one status byte per range padded to 8, then
//! the bytes of every `Ok` range in request order.

use zerocopy::little_endian::{U16, U32, U64};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

pub const MAGIC: u32 = u32::from_le_bytes(*b"SLCE");
/// 2: `Opened` lists the nodes holding a copy (cluster failover).
pub const PROTOCOL_VERSION: u8 = 2;

/// Most ranges in one wire batch; clients split larger batches.
pub const RANGES_PER_BATCH_MAX: u32 = 4096;
/// Budget of one wire batch in DMA bytes, as
/// `sluice_dataplane::plan::footprint_bound_bytes` counts them; with the
/// packing slack this stays under 16 MiB of a core's slots.
pub const BATCH_FOOTPRINT_MAX_BYTES: u64 = 8 << 20;
/// Largest control message.
pub const CONTROL_PAYLOAD_MAX_BYTES: u32 = 64 * 1024;
/// Largest request frame payload.
pub const REQUEST_PAYLOAD_MAX_BYTES: u32 =
    BatchRequestHeader::SIZE as u32 + RANGES_PER_BATCH_MAX * RangeDescriptor::SIZE as u32;
/// Largest response payload a client accepts: statuses plus at most every
/// range's bytes, which the footprint budget bounds.
pub const RESPONSE_PAYLOAD_MAX_BYTES: u64 =
    BatchResponseHeader::SIZE as u64 + RANGES_PER_BATCH_MAX as u64 + BATCH_FOOTPRINT_MAX_BYTES;
/// Largest RDMA request payload: the header with the destination buffer,
/// then the descriptors.
pub const RDMA_REQUEST_PAYLOAD_MAX_BYTES: u32 =
    RdmaBatchRequestHeader::SIZE as u32 + RANGES_PER_BATCH_MAX * RangeDescriptor::SIZE as u32;
/// Largest RDMA response payload: the bytes went ahead by RDMA WRITE, so
/// only the header and statuses travel.
pub const RDMA_RESPONSE_PAYLOAD_MAX_BYTES: u32 = BatchResponseHeader::SIZE as u32 + RANGES_PER_BATCH_MAX;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum FrameKind {
    Control = 1,
    BatchRequest = 2,
    BatchResponse = 3,
    /// RDMA only: a batch whose bytes the node writes into the client's
    /// registered buffer.
    RdmaBatchRequest = 4,
    /// RDMA only: a batch's statuses; its bytes are already in place.
    RdmaBatchResponse = 5,
}

impl FrameKind {
    pub fn from_u8(value: u8) -> Option<Self> {
        match value {
            1 => Some(Self::Control),
            2 => Some(Self::BatchRequest),
            3 => Some(Self::BatchResponse),
            4 => Some(Self::RdmaBatchRequest),
            5 => Some(Self::RdmaBatchResponse),
            _ => None,
        }
    }
}

#[derive(Clone, Copy, Debug, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct FrameHeader {
    pub magic: U32,
    pub version: u8,
    pub kind: u8,
    pub flags: U16,
    pub payload_len: U32,
    pub reserved: U32,
}

#[derive(Clone, Copy, Debug, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct BatchRequestHeader {
    pub batch_id: U64,
    pub handle: U32,
    pub range_count: U32,
}

/// One range of a batch: `len` bytes at dataset offset `offset`, to land at
/// `dest` in the client's buffer (TCP clients place them; RDMA writes there).
#[derive(Clone, Copy, Debug, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct RangeDescriptor {
    pub offset: U64,
    pub len: U32,
    pub reserved: U32,
    pub dest: U64,
}

/// An RDMA batch request: a [`BatchRequestHeader`] plus the client's
/// registered destination buffer. Descriptors' `dest` are offsets into it;
/// the node checks each against `remote_len` before writing.
#[derive(Clone, Copy, Debug, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct RdmaBatchRequestHeader {
    pub batch_id: U64,
    pub handle: U32,
    pub range_count: U32,
    pub rkey: U32,
    pub reserved: U32,
    pub remote_addr: U64,
    pub remote_len: U64,
}

#[derive(Clone, Copy, Debug, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct BatchResponseHeader {
    pub batch_id: U64,
    pub status: U32,
    pub range_count: U32,
    pub data_len: U64,
}

impl FrameHeader {
    pub const SIZE: usize = 16;
}
impl BatchRequestHeader {
    pub const SIZE: usize = 16;
}
impl RangeDescriptor {
    pub const SIZE: usize = 24;
}
impl BatchResponseHeader {
    pub const SIZE: usize = 24;
}
impl RdmaBatchRequestHeader {
    pub const SIZE: usize = 40;
}

const _: () = assert!(size_of::<FrameHeader>() == FrameHeader::SIZE);
const _: () = assert!(size_of::<BatchRequestHeader>() == BatchRequestHeader::SIZE);
const _: () = assert!(size_of::<RangeDescriptor>() == RangeDescriptor::SIZE);
const _: () = assert!(size_of::<BatchResponseHeader>() == BatchResponseHeader::SIZE);
const _: () = assert!(size_of::<RdmaBatchRequestHeader>() == RdmaBatchRequestHeader::SIZE);

/// Batch-level outcome: anything but `Ok` means no range was read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub enum BatchStatus {
    Ok = 0,
    UnknownHandle = 1,
    TooLarge = 2,
    ShuttingDown = 3,
    DatasetGone = 4,
    /// RDMA: a range's destination lies outside the buffer the request
    /// named; nothing was written.
    BadDestination = 5,
}

impl BatchStatus {
    pub fn from_u32(value: u32) -> Option<Self> {
        match value {
            0 => Some(Self::Ok),
            1 => Some(Self::UnknownHandle),
            2 => Some(Self::TooLarge),
            3 => Some(Self::ShuttingDown),
            4 => Some(Self::DatasetGone),
            5 => Some(Self::BadDestination),
            _ => None,
        }
    }
}

/// Why bytes off the wire are not a frame.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    #[error("bad magic {0:#010x}: not a sluice peer")]
    BadMagic(u32),
    #[error("protocol version {0}, this side speaks {PROTOCOL_VERSION}")]
    Version(u8),
    #[error("unknown frame kind {0}")]
    Kind(u8),
    #[error("{kind:?} frame of {len} bytes exceeds the limit of {max}")]
    Oversized { kind: FrameKind, len: u64, max: u64 },
    #[error("batch request of {payload_len} bytes does not hold {range_count} ranges")]
    RangeCount { payload_len: usize, range_count: u32 },
    #[error("frame too short for its header")]
    Short,
}

pub fn frame_header(kind: FrameKind, payload_len: u32) -> FrameHeader {
    FrameHeader {
        magic: U32::new(MAGIC),
        version: PROTOCOL_VERSION,
        kind: kind as u8,
        flags: U16::new(0),
        payload_len: U32::new(payload_len),
        reserved: U32::new(0),
    }
}

/// Checks a frame header and the payload size its kind allows.
pub fn parse_frame_header(
    bytes: &[u8; FrameHeader::SIZE],
    response_side: bool,
) -> Result<(FrameKind, u32), FrameError> {
    let header = FrameHeader::read_from_bytes(bytes).map_err(|_| FrameError::Short)?;
    if header.magic.get() != MAGIC {
        return Err(FrameError::BadMagic(header.magic.get()));
    }
    if header.version != PROTOCOL_VERSION {
        return Err(FrameError::Version(header.version));
    }
    let kind = FrameKind::from_u8(header.kind).ok_or(FrameError::Kind(header.kind))?;
    let len = header.payload_len.get();
    let max = match (kind, response_side) {
        (FrameKind::Control, _) => u64::from(CONTROL_PAYLOAD_MAX_BYTES),
        (FrameKind::BatchRequest, false) => u64::from(REQUEST_PAYLOAD_MAX_BYTES),
        (FrameKind::BatchResponse, true) => RESPONSE_PAYLOAD_MAX_BYTES,
        (FrameKind::RdmaBatchRequest, false) => u64::from(RDMA_REQUEST_PAYLOAD_MAX_BYTES),
        (FrameKind::RdmaBatchResponse, true) => u64::from(RDMA_RESPONSE_PAYLOAD_MAX_BYTES),
        (other, _) => return Err(FrameError::Kind(other as u8)),
    };
    if u64::from(len) > max {
        return Err(FrameError::Oversized { kind, len: u64::from(len), max });
    }
    Ok((kind, len))
}

/// Splits a batch request payload into its header and ranges.
pub fn parse_batch_request(payload: &[u8]) -> Result<(&BatchRequestHeader, &[RangeDescriptor]), FrameError> {
    let (header, rest) = BatchRequestHeader::ref_from_prefix(payload).map_err(|_| FrameError::Short)?;
    let range_count = header.range_count.get();
    let mismatch = FrameError::RangeCount { payload_len: payload.len(), range_count };
    if range_count > RANGES_PER_BATCH_MAX || rest.len() != range_count as usize * RangeDescriptor::SIZE {
        return Err(mismatch);
    }
    let ranges = <[RangeDescriptor]>::ref_from_bytes(rest).map_err(|_| mismatch)?;
    Ok((header, ranges))
}

/// Splits an RDMA batch request payload into its header and ranges, and
/// checks every range lands inside the named buffer.
pub fn parse_rdma_batch_request(payload: &[u8]) -> Result<(&RdmaBatchRequestHeader, &[RangeDescriptor]), FrameError> {
    let (header, rest) = RdmaBatchRequestHeader::ref_from_prefix(payload).map_err(|_| FrameError::Short)?;
    let range_count = header.range_count.get();
    let mismatch = FrameError::RangeCount { payload_len: payload.len(), range_count };
    if range_count > RANGES_PER_BATCH_MAX || rest.len() != range_count as usize * RangeDescriptor::SIZE {
        return Err(mismatch);
    }
    let ranges = <[RangeDescriptor]>::ref_from_bytes(rest).map_err(|_| mismatch)?;
    Ok((header, ranges))
}

/// Whether every range of an RDMA request lands inside its buffer.
pub fn destinations_fit(header: &RdmaBatchRequestHeader, ranges: &[RangeDescriptor]) -> bool {
    let buffer_len = header.remote_len.get();
    header.remote_addr.get().checked_add(buffer_len).is_some()
        && ranges.iter().all(|r| r.dest.get().checked_add(u64::from(r.len.get())).is_some_and(|end| end <= buffer_len))
}

/// Encodes an RDMA batch request frame into `out`.
pub fn encode_rdma_batch_request(out: &mut Vec<u8>, header: &RdmaBatchRequestHeader, ranges: &[RangeDescriptor]) {
    assert!(ranges.len() <= RANGES_PER_BATCH_MAX as usize, "batch over the wire limit");
    assert_eq!(header.range_count.get() as usize, ranges.len(), "header counts the ranges");
    let payload_len = RdmaBatchRequestHeader::SIZE + ranges.len() * RangeDescriptor::SIZE;
    out.clear();
    out.extend_from_slice(frame_header(FrameKind::RdmaBatchRequest, payload_len as u32).as_bytes());
    out.extend_from_slice(header.as_bytes());
    out.extend_from_slice(ranges.as_bytes());
}

/// Encodes an RDMA batch response (statuses only) into `out`.
pub fn encode_rdma_batch_response(
    out: &mut Vec<u8>,
    batch_id: u64,
    status: BatchStatus,
    statuses: &[u8],
    written: u64,
) {
    let padded = status_bytes_padded(statuses.len() as u32);
    let payload_len = (BatchResponseHeader::SIZE + padded) as u32;
    out.clear();
    out.extend_from_slice(frame_header(FrameKind::RdmaBatchResponse, payload_len).as_bytes());
    let header = BatchResponseHeader {
        batch_id: U64::new(batch_id),
        status: U32::new(status as u32),
        range_count: U32::new(statuses.len() as u32),
        data_len: U64::new(written),
    };
    out.extend_from_slice(header.as_bytes());
    out.extend_from_slice(statuses);
    out.resize(out.len() + padded - statuses.len(), 0);
}

/// Encodes a batch request frame (header included) into `out`.
pub fn encode_batch_request(out: &mut Vec<u8>, batch_id: u64, handle: u32, ranges: &[RangeDescriptor]) {
    assert!(ranges.len() <= RANGES_PER_BATCH_MAX as usize, "batch over the wire limit");
    let payload_len = BatchRequestHeader::SIZE + ranges.len() * RangeDescriptor::SIZE;
    out.clear();
    out.extend_from_slice(frame_header(FrameKind::BatchRequest, payload_len as u32).as_bytes());
    let header = BatchRequestHeader {
        batch_id: U64::new(batch_id),
        handle: U32::new(handle),
        range_count: U32::new(ranges.len() as u32),
    };
    out.extend_from_slice(header.as_bytes());
    out.extend_from_slice(ranges.as_bytes());
}

/// Status bytes padded so the data that follows starts 8-aligned.
pub fn status_bytes_padded(range_count: u32) -> usize {
    (range_count as usize).next_multiple_of(8)
}

/// Encodes the fixed part of a batch response (frame header, response
/// header, padded statuses); the data follows it on the wire.
pub fn encode_batch_response_head(
    out: &mut Vec<u8>,
    batch_id: u64,
    status: BatchStatus,
    statuses: &[u8],
    data_len: u64,
) {
    let padded = status_bytes_padded(statuses.len() as u32);
    let payload_len = BatchResponseHeader::SIZE as u64 + padded as u64 + data_len;
    out.clear();
    let payload_len = u32::try_from(payload_len).expect("response within the frame limit");
    out.extend_from_slice(frame_header(FrameKind::BatchResponse, payload_len).as_bytes());
    let header = BatchResponseHeader {
        batch_id: U64::new(batch_id),
        status: U32::new(status as u32),
        range_count: U32::new(statuses.len() as u32),
        data_len: U64::new(data_len),
    };
    out.extend_from_slice(header.as_bytes());
    out.extend_from_slice(statuses);
    out.resize(out.len() + padded - statuses.len(), 0);
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn descriptor(offset: u64, len: u32, dest: u64) -> RangeDescriptor {
        RangeDescriptor { offset: U64::new(offset), len: U32::new(len), reserved: U32::new(0), dest: U64::new(dest) }
    }

    /// A request survives encode then decode unchanged.
    #[test]
    fn batch_request_round_trips() {
        let ranges = [descriptor(1, 2, 3), descriptor(u64::MAX, u32::MAX, 0)];
        let mut out = Vec::new();
        encode_batch_request(&mut out, 42, 7, &ranges);
        let head: [u8; FrameHeader::SIZE] = out[..FrameHeader::SIZE].try_into().expect("16 bytes");
        let (kind, len) = parse_frame_header(&head, false).expect("header");
        assert_eq!(kind, FrameKind::BatchRequest);
        assert_eq!(len as usize, out.len() - FrameHeader::SIZE);
        let (header, decoded) = parse_batch_request(&out[FrameHeader::SIZE..]).expect("request");
        assert_eq!((header.batch_id.get(), header.handle.get()), (42, 7));
        assert_eq!(decoded, &ranges);
    }

    /// An RDMA request round-trips, and a destination past the buffer's end
    /// (or one whose end overflows) is caught before anything is written.
    #[test]
    fn rdma_request_round_trips_and_destinations_are_checked() {
        let header = |count: u32, len: u64| RdmaBatchRequestHeader {
            batch_id: U64::new(9),
            handle: U32::new(2),
            range_count: U32::new(count),
            rkey: U32::new(0x1234),
            reserved: U32::new(0),
            remote_addr: U64::new(0x7f00_0000_0000),
            remote_len: U64::new(len),
        };
        let ranges = [descriptor(0, 4096, 0), descriptor(10, 100, 4096)];
        let mut out = Vec::new();
        encode_rdma_batch_request(&mut out, &header(2, 4196), &ranges);
        let (parsed, decoded) = parse_rdma_batch_request(&out[FrameHeader::SIZE..]).expect("request");
        assert_eq!((parsed.batch_id.get(), parsed.rkey.get(), parsed.remote_len.get()), (9, 0x1234, 4196));
        assert_eq!(decoded, &ranges);
        assert!(destinations_fit(parsed, decoded));
        assert!(!destinations_fit(&header(2, 4195), &ranges), "one byte past the end");
        assert!(!destinations_fit(&header(1, 4196), &[descriptor(0, 1, u64::MAX)]), "overflowing end");
    }

    /// Oversized, foreign and wrong-direction frames are refused.
    #[test]
    fn bad_headers_are_refused() {
        let mut head = [0u8; 16];
        head.copy_from_slice(frame_header(FrameKind::BatchRequest, REQUEST_PAYLOAD_MAX_BYTES + 1).as_bytes());
        assert!(matches!(parse_frame_header(&head, false), Err(FrameError::Oversized { .. })));
        head.copy_from_slice(frame_header(FrameKind::BatchResponse, 10).as_bytes());
        assert!(matches!(parse_frame_header(&head, false), Err(FrameError::Kind(3))));
        head[..4].copy_from_slice(b"GET ");
        assert!(matches!(parse_frame_header(&head, false), Err(FrameError::BadMagic(_))));
    }

    proptest! {
        /// No byte string makes the decoders panic.
        #[test]
        fn decoders_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            if bytes.len() >= 16 {
                let head: [u8; 16] = bytes[..16].try_into().expect("16 bytes");
                let _ = parse_frame_header(&head, false);
                let _ = parse_frame_header(&head, true);
            }
            let _ = parse_batch_request(&bytes);
            if let Ok((header, ranges)) = parse_rdma_batch_request(&bytes) {
                let _ = destinations_fit(header, ranges);
            }
        }

        /// A request whose count disagrees with its length is refused.
        #[test]
        fn range_count_must_match(count in 0u32..10, extra in 0usize..30) {
            let ranges: Vec<_> = (0..count).map(|i| descriptor(u64::from(i), 1, 0)).collect();
            let mut out = Vec::new();
            encode_batch_request(&mut out, 1, 1, &ranges);
            let mut payload = out[FrameHeader::SIZE..].to_vec();
            payload.extend(std::iter::repeat_n(0u8, extra));
            prop_assert_eq!(parse_batch_request(&payload).is_ok(), extra == 0);
        }
    }
}

/// The little-endian field types descriptors are made of, for builders
/// outside this crate.
pub mod le {
    pub use zerocopy::little_endian::{U16, U32, U64};
}
