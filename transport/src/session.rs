//! The client's half of a session, without I/O: the handshake, the limits
//! the node announced, control replies and batch statuses, read the same
//! way by the TCP and the RDMA client (the node's half is
//! `sluice_serve::session`).

use sluice_proto::codec::{ControlMessage, OpenInfo, Secret};
use sluice_proto::wire::{self, BatchResponseHeader, BatchStatus};
use sluice_proto::RangeStatus;

use crate::tcp::TransportError;

/// The protocol version this client speaks.
pub const PROTOCOL: u32 = 1;

/// Limits the node announced at handshake.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NodeLimits {
    pub ranges_per_batch_max: u32,
    pub batch_footprint_max_bytes: u64,
    pub credits: u32,
}

impl NodeLimits {
    /// What a client assumes before the node has answered Hello: one
    /// batch of one range, nothing more.
    pub const BEFORE_HELLO: Self = Self { ranges_per_batch_max: 1, batch_footprint_max_bytes: 0, credits: 1 };

    /// Refuses a wire batch of more ranges than the node takes, before
    /// anything is sent (the client library splits batches to fit).
    pub fn check_batch(&self, ranges: usize) -> Result<(), TransportError> {
        if ranges > self.ranges_per_batch_max as usize {
            return Err(TransportError::Protocol(format!(
                "a batch of {ranges} ranges is over the node's {} per batch: split it (the client library does)",
                self.ranges_per_batch_max
            )));
        }
        Ok(())
    }
}

/// The first message of every session.
pub fn hello(client_name: &str) -> ControlMessage {
    ControlMessage::Hello { protocol: PROTOCOL, client: client_name.to_string() }
}

/// The limits in the node's answer to Hello, held within what this client
/// supports (at most `credits_max` batches in flight on this transport).
pub fn limits(reply: ControlMessage, credits_max: u32) -> Result<NodeLimits, TransportError> {
    match reply {
        ControlMessage::HelloOk { node: _, ranges_per_batch_max, batch_footprint_max_bytes, credits } => {
            Ok(NodeLimits {
                ranges_per_batch_max: ranges_per_batch_max.clamp(1, wire::RANGES_PER_BATCH_MAX),
                batch_footprint_max_bytes: batch_footprint_max_bytes.min(wire::BATCH_FOOTPRINT_MAX_BYTES),
                credits: credits.clamp(1, credits_max.max(1)),
            })
        }
        other => Err(TransportError::Protocol(format!("expected HelloOk, got {other:?}"))),
    }
}

/// The request that opens dataset `name` (with a grant's token).
pub fn open_request(name: &str, token: Option<String>) -> ControlMessage {
    ControlMessage::Open { name: name.to_string(), token: token.map(Secret::new) }
}

/// The handle and dataset facts from the node's answer to an open.
pub fn opened(reply: ControlMessage) -> Result<(u32, OpenInfo), TransportError> {
    match reply {
        ControlMessage::Opened { handle, info } => Ok((handle, info)),
        other => Err(TransportError::Protocol(format!("expected Opened, got {other:?}"))),
    }
}

/// A reply to a request of ours: an error the node sent is a refusal.
pub fn reply(message: ControlMessage) -> Result<ControlMessage, TransportError> {
    match message {
        ControlMessage::Error { code, message } => Err(TransportError::Refused { code, message }),
        other => Ok(other),
    }
}

/// A control message no request of ours waits for: the node's reason for
/// closing the session, or a protocol error.
pub fn unsolicited(message: ControlMessage) -> TransportError {
    match message {
        ControlMessage::Error { code, message } => TransportError::Refused { code, message },
        other => TransportError::Protocol(format!("unsolicited {other:?}")),
    }
}

/// A batch response's outcome, from its header and status bytes, for a
/// batch that was sent with `ranges_sent` ranges: the range statuses, or
/// the status the whole batch failed with.
pub fn batch_outcome(
    head: &BatchResponseHeader,
    statuses: &[u8],
    ranges_sent: usize,
) -> Result<Result<Vec<RangeStatus>, BatchStatus>, TransportError> {
    let batch_id = head.batch_id.get();
    let range_count = head.range_count.get();
    if statuses.len() != wire::status_bytes_padded(range_count) {
        return Err(TransportError::Protocol(format!("response {batch_id} has inconsistent lengths")));
    }
    if range_count as usize != ranges_sent {
        return Err(TransportError::Protocol(format!("response {batch_id} has {range_count} statuses")));
    }
    let status = BatchStatus::from_u32(head.status.get())
        .ok_or_else(|| TransportError::Protocol(format!("batch status {}", head.status.get())))?;
    if status != BatchStatus::Ok {
        return Ok(Err(status));
    }
    statuses[..ranges_sent]
        .iter()
        .map(|&b| RangeStatus::from_u8(b).ok_or_else(|| TransportError::Protocol(format!("range status {b}"))))
        .collect::<Result<Vec<_>, _>>()
        .map(Ok)
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_proto::codec::ErrorCode;
    use zerocopy::FromBytes;

    fn head(status: BatchStatus, ranges: u32) -> (Vec<u8>, usize) {
        let mut bytes = Vec::new();
        let statuses = vec![RangeStatus::Ok as u8; ranges as usize];
        wire::encode_batch_response_head(&mut bytes, 9, status, &statuses, 0);
        (bytes, wire::FrameHeader::SIZE)
    }

    #[test]
    fn hello_ok_limits_are_held_within_what_the_client_supports() {
        let reply = ControlMessage::HelloOk {
            node: "n".into(),
            ranges_per_batch_max: u32::MAX,
            batch_footprint_max_bytes: u64::MAX,
            credits: 1000,
        };
        let got = limits(reply, 16).expect("limits");
        assert_eq!(got.ranges_per_batch_max, wire::RANGES_PER_BATCH_MAX);
        assert_eq!(got.batch_footprint_max_bytes, wire::BATCH_FOOTPRINT_MAX_BYTES);
        assert_eq!(got.credits, 16);
        let zero = ControlMessage::HelloOk {
            node: "n".into(),
            ranges_per_batch_max: 0,
            batch_footprint_max_bytes: 0,
            credits: 0,
        };
        assert_eq!(limits(zero, 16).expect("limits").credits, 1, "a client always has one credit");
        assert!(matches!(limits(ControlMessage::Close { handle: 1 }, 16), Err(TransportError::Protocol(_))));
    }

    #[test]
    fn errors_from_the_node_are_refusals() {
        let error = ControlMessage::Error { code: ErrorCode::AccessDenied, message: "no grant".into() };
        assert!(matches!(reply(error.clone()), Err(TransportError::Refused { code: ErrorCode::AccessDenied, .. })));
        assert!(matches!(unsolicited(error), TransportError::Refused { .. }));
        assert!(matches!(unsolicited(ControlMessage::Close { handle: 1 }), TransportError::Protocol(_)));
        assert!(matches!(opened(ControlMessage::Close { handle: 1 }), Err(TransportError::Protocol(_))));
    }

    #[test]
    fn batch_statuses_must_match_the_batch_sent() {
        let (bytes, at) = head(BatchStatus::Ok, 3);
        let (header, rest) = BatchResponseHeader::ref_from_prefix(&bytes[at..]).expect("head");
        assert_eq!(batch_outcome(header, rest, 3).expect("decoded"), Ok(vec![RangeStatus::Ok; 3]));
        assert!(batch_outcome(header, rest, 2).is_err(), "a count that differs from the batch sent");
        assert!(batch_outcome(header, &rest[..1], 3).is_err(), "status bytes shorter than announced");

        let (bytes, at) = head(BatchStatus::TooLarge, 2);
        let (header, rest) = BatchResponseHeader::ref_from_prefix(&bytes[at..]).expect("head");
        assert_eq!(batch_outcome(header, rest, 2).expect("decoded"), Err(BatchStatus::TooLarge));

        let (mut bytes, at) = head(BatchStatus::Ok, 1);
        let status_at = at + BatchResponseHeader::SIZE;
        bytes[status_at] = 0xee;
        let (header, rest) = BatchResponseHeader::ref_from_prefix(&bytes[at..]).expect("head");
        assert!(batch_outcome(header, rest, 1).is_err(), "an unknown range status");
    }
}
