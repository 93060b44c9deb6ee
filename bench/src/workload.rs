//! The workloads and what one measurement of one system records.

use serde::Serialize;

/// One access pattern, run the same way against every system that can.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Workload {
    /// 4 KiB random reads, block-aligned, at this queue depth.
    Random4k { queue_depth: usize },
    /// The same reads issued by sluice as one batch of `queue_depth` at a
    /// time (a data loader's whole step at once) rather than four smaller
    /// ones in flight; the peers' figures are those of [`Workload::Random4k`].
    Random4kOneBatch { queue_depth: usize },
    /// 1024-token windows at random token offsets (unaligned to blocks),
    /// `token_bytes` 2 (u16) or 4 (u32), batches of 64.
    Windows { token_bytes: u32 },
    /// 1 MiB sequential reads, 16 in flight.
    Sequential1m,
}

pub const ALL: [Workload; 7] = [
    Workload::Random4k { queue_depth: 1 },
    Workload::Random4k { queue_depth: 32 },
    Workload::Random4kOneBatch { queue_depth: 32 },
    Workload::Random4k { queue_depth: 256 },
    Workload::Windows { token_bytes: 2 },
    Workload::Windows { token_bytes: 4 },
    Workload::Sequential1m,
];

pub const WINDOW_TOKENS: u32 = 1024;
pub const WINDOW_BATCH: usize = 64;

impl Workload {
    pub fn name(self) -> String {
        match self {
            Self::Random4k { queue_depth } => format!("4k-random-qd{queue_depth}"),
            Self::Random4kOneBatch { queue_depth } => format!("4k-random-qd{queue_depth}-1x{queue_depth}"),
            Self::Windows { token_bytes } => format!("windows-1024-u{}", token_bytes * 8),
            Self::Sequential1m => "1m-sequential".into(),
        }
    }

    pub fn describe(self) -> String {
        match self {
            Self::Random4k { queue_depth } => format!("4 KiB random reads, queue depth {queue_depth}"),
            Self::Random4kOneBatch { queue_depth } => format!(
                "4 KiB random reads, queue depth {queue_depth} as one batch of {queue_depth} at a time \
                 (sluice, and fio issuing the same batches; the other peers' figures are those of {})",
                Self::Random4k { queue_depth }.name()
            ),
            Self::Windows { token_bytes } => format!(
                "{WINDOW_TOKENS}-token u{} windows at random token offsets, batches of {WINDOW_BATCH}, 4 in flight",
                token_bytes * 8
            ),
            Self::Sequential1m => "1 MiB sequential reads, 16 in flight".into(),
        }
    }

    pub fn size_bytes(self) -> u32 {
        match self {
            Self::Random4k { .. } | Self::Random4kOneBatch { .. } => 4096,
            Self::Windows { token_bytes } => WINDOW_TOKENS * token_bytes,
            Self::Sequential1m => 1 << 20,
        }
    }

    pub fn align_bytes(self) -> u64 {
        match self {
            Self::Random4k { .. } | Self::Random4kOneBatch { .. } => 4096,
            Self::Windows { token_bytes } => u64::from(token_bytes),
            Self::Sequential1m => 1 << 20,
        }
    }

    /// Requests outstanding at once.
    pub fn queue_depth(self) -> usize {
        let (batch, inflight) = self.sluice_shape();
        batch * inflight
    }

    /// How sluice's client issues it: `(ranges per batch, batches in flight)`.
    pub fn sluice_shape(self) -> (usize, usize) {
        match self {
            Self::Random4k { queue_depth: 1 } => (1, 1),
            Self::Random4k { queue_depth } => (queue_depth.div_ceil(4), 4),
            Self::Random4kOneBatch { queue_depth } => (queue_depth, 1),
            Self::Windows { .. } => (WINDOW_BATCH, 4),
            Self::Sequential1m => (4, 4),
        }
    }

    /// Whether sluice's client issues it as batches of more than one read
    /// from a random block workload, so fio can issue the same batches.
    pub fn batched_random(self) -> bool {
        matches!(self, Self::Random4k { .. } | Self::Random4kOneBatch { .. }) && self.sluice_shape().0 > 1
    }

    pub fn sequential(self) -> bool {
        self == Self::Sequential1m
    }

    /// Whether a block-device peer (fio, nbd) can run it: token windows at
    /// 2- or 4-byte offsets are not block I/O.
    pub fn block_shaped(self) -> bool {
        !matches!(self, Self::Windows { .. })
    }

    /// Whether only sluice (and fio issuing sluice's batches) runs it: it
    /// differs from another workload only in how the reads are grouped
    /// into batches, which the other peers cannot express.
    pub fn sluice_only(self) -> bool {
        self.peer_equivalent() != self
    }

    /// The workload whose peer figures this one is compared with: itself,
    /// or for a sluice-only shape the same reads as the peers issue them.
    pub fn peer_equivalent(self) -> Self {
        match self {
            Self::Random4kOneBatch { queue_depth } => Self::Random4k { queue_depth },
            other => other,
        }
    }
}

/// One system on one workload.
#[derive(Clone, Debug, Serialize)]
pub struct Measurement {
    pub system: String,
    pub workload: String,
    pub seconds: f64,
    pub iops: f64,
    pub gb_per_s: f64,
    /// Per request for the peers; per batch for sluice (its unit of I/O).
    pub latency_us_p50: f64,
    pub latency_us_p99: f64,
    pub latency_us_p999: f64,
    /// Server CPU (user + system) per GB served; `None` where unknown.
    pub cpu_s_per_gb: Option<f64>,
    pub errors: u64,
}
