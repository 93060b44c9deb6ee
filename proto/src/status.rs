//! The outcome of one range of a batch, as the data plane decides it and
//! the wire carries it (one byte per range).

/// The outcome of one range of a batch. A bad range fails that range only.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum RangeStatus {
    Ok = 0,
    OutOfBounds = 1,
    IoError = 2,
    ChecksumMismatch = 3,
    /// A source-backed dataset's object changed or vanished since it was
    /// pinned at create: its bytes are never served mixed with the old.
    SourceChanged = 4,
    /// A source-backed dataset's chunk could not be fetched from its
    /// source within the retry budget.
    SourceUnavailable = 5,
}

impl RangeStatus {
    pub fn from_u8(value: u8) -> Option<Self> {
        match value {
            0 => Some(Self::Ok),
            1 => Some(Self::OutOfBounds),
            2 => Some(Self::IoError),
            3 => Some(Self::ChecksumMismatch),
            4 => Some(Self::SourceChanged),
            5 => Some(Self::SourceUnavailable),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::Ok => "ok",
            Self::OutOfBounds => "out of bounds",
            Self::IoError => "I/O error",
            Self::ChecksumMismatch => "checksum mismatch",
            Self::SourceChanged => "source changed",
            Self::SourceUnavailable => "source unavailable",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_status_round_trips_through_its_byte() {
        for status in [
            RangeStatus::Ok,
            RangeStatus::OutOfBounds,
            RangeStatus::IoError,
            RangeStatus::ChecksumMismatch,
            RangeStatus::SourceChanged,
            RangeStatus::SourceUnavailable,
        ] {
            assert_eq!(RangeStatus::from_u8(status as u8), Some(status));
        }
        assert_eq!(RangeStatus::from_u8(6), None);
    }
}
