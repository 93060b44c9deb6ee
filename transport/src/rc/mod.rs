//! The RDMA transport: the same batches as TCP over RC queue pairs set up
//! with rdma_cm. The client is here, with what both ends share (slot
//! sizes, timeouts, work-request tags); the node's side is `sluice_serve::rc`.
//!
//! A client registers its destination buffer and names it (address, length,
//! rkey) in each batch request, which travels as a SEND. The node reads
//! into its DMA slots, RDMA-WRITEs each range's bytes from them straight
//! into the client's buffer, then SENDs the batch's statuses; RC ordering
//! puts the bytes in place before the statuses arrive. The node registers
//! its DMA arenas once, for local access only: no peer can reach its memory.
//! Credits bound the batches in flight per connection, and every DMA slot a
//! batch holds comes back when its SEND completes, or when the connection
//! is torn down after a peer vanished.

mod client;

pub use client::{InFlightBuffer, RdmaClient, RegisteredBuffer};

use sluice_proto::wire::{FrameHeader, CONTROL_PAYLOAD_MAX_BYTES, RDMA_REQUEST_PAYLOAD_MAX_BYTES};

/// Batches in flight per RDMA connection, whatever the TCP credits are:
/// each holds a receive and a send slot on both sides.
pub const RDMA_CREDITS_MAX: u32 = 16;
/// Receives posted beyond the credits, for control messages.
pub const CONTROL_MESSAGES_MAX: u32 = 4;
/// A message slot holding any request the node accepts.
pub const REQUEST_SLOT_BYTES: usize = slot_bytes(FrameHeader::SIZE + RDMA_REQUEST_PAYLOAD_MAX_BYTES as usize);
/// A message slot holding any response or control message.
pub const RESPONSE_SLOT_BYTES: usize = slot_bytes(FrameHeader::SIZE + CONTROL_PAYLOAD_MAX_BYTES as usize);
/// ACK timeout exponent for both sides: 4.096 µs × 2^16 ≈ 270 ms before a
/// lost packet is sent again, seven times; a vanished peer is noticed in
/// about two seconds, and a lost packet never stalls a connection.
pub const ACK_TIMEOUT_EXPONENT: u8 = 16;
/// How long a queue pair keeps sending a lost packet again before it
/// fails the work request: one ACK timeout and then one a retry.
pub const LOST_PACKET_GIVE_UP: std::time::Duration =
    std::time::Duration::from_nanos(4096 * (1 << ACK_TIMEOUT_EXPONENT) * (crate::verbs::TRANSPORT_RETRIES as u64 + 1));
/// How long rdma_cm may take to resolve an address or route.
pub const RESOLVE_TIMEOUT_MS: i32 = 5000;
/// Work-request ids: the low 32 bits are a slot, the tag says which kind.
pub const WR_RECV: u64 = 1 << 32;
pub const WR_SEND: u64 = 2 << 32;
pub const WR_WRITE: u64 = 3 << 32;
pub const WR_TAG_MASK: u64 = 0xffff_ffff << 32;

const fn slot_bytes(len: usize) -> usize {
    len.next_multiple_of(4096)
}

const _: () =
    assert!(RESPONSE_SLOT_BYTES >= FrameHeader::SIZE + sluice_proto::wire::RDMA_RESPONSE_PAYLOAD_MAX_BYTES as usize);
const _: () = assert!(REQUEST_SLOT_BYTES >= FrameHeader::SIZE + CONTROL_PAYLOAD_MAX_BYTES as usize);

/// Registers a verbs object's fd with tokio's reactor, for readiness.
pub fn readiness<T: std::os::fd::AsRawFd>(
    inner: std::sync::Arc<T>,
    op: &'static str,
) -> Result<tokio::io::unix::AsyncFd<std::sync::Arc<T>>, crate::verbs::VerbsError> {
    use tokio::io::unix::AsyncFd;
    // SAFETY: the fd belongs to `inner`, which the AsyncFd owns (an Arc of
    // it), so it stays open and the same for the AsyncFd's whole life.
    unsafe { AsyncFd::register_with_interest(inner, tokio::io::Interest::READABLE) }
        .map_err(|err| crate::verbs::VerbsError { op, source: err.into() })
}

/// Splits a received message into its frame kind and payload.
pub fn parse_message(
    bytes: &[u8],
    response_side: bool,
) -> Result<(sluice_proto::wire::FrameKind, &[u8]), sluice_proto::wire::FrameError> {
    let head: &[u8; FrameHeader::SIZE] =
        bytes.get(..FrameHeader::SIZE).and_then(|h| h.try_into().ok()).ok_or(sluice_proto::wire::FrameError::Short)?;
    let (kind, len) = sluice_proto::wire::parse_frame_header(head, response_side)?;
    let payload =
        bytes.get(FrameHeader::SIZE..FrameHeader::SIZE + len as usize).ok_or(sluice_proto::wire::FrameError::Short)?;
    Ok((kind, payload))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A received message must hold the whole frame its header announces.
    #[test]
    fn messages_shorter_than_their_frame_are_refused() {
        let frame = crate::frame::control_frame(&sluice_proto::ControlMessage::Close { handle: 1 });
        assert!(parse_message(&frame, true).is_ok());
        assert!(parse_message(&frame[..frame.len() - 1], true).is_err());
        assert!(parse_message(&frame[..8], true).is_err());
    }
}
