//! Per-dataset serving counters, kept by the transports and exported by the
//! node's `/metrics`. A connection holds its datasets' counters from open
//! on, so a batch costs a few relaxed atomic adds and no lookup or lock.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use sluice_dataplane::{BatchResult, Outcome, SubmitError};
use sluice_proto::{Lane, RangeStatus};

use sluice_proto::wire::BatchStatus;

/// Counts the data plane's answer to a batch submitted at `submitted` in
/// `counters`, and gives what the transport sends back: the result, or the
/// batch status a client reads for a batch that failed whole.
pub(crate) fn settle_outcome(
    outcome: Outcome,
    counters: &DatasetCounters,
    submitted: Instant,
) -> Result<BatchResult, BatchStatus> {
    let outcome = match outcome {
        Ok(batch) => Ok(batch),
        Err(SubmitError::UnknownDataset) => Err(BatchStatus::DatasetGone),
        Err(SubmitError::TooLarge { .. }) => Err(BatchStatus::TooLarge),
        Err(SubmitError::Shutdown) => Err(BatchStatus::ShuttingDown),
    };
    match &outcome {
        Ok(batch) => {
            let ok = batch.statuses().iter().filter(|s| **s == RangeStatus::Ok).count() as u64;
            let failed = batch.statuses().len() as u64 - ok;
            counters.record_batch(batch.lane(), ok, failed, batch.payload_bytes(), submitted.elapsed());
        }
        Err(_) => counters.record_failed_batch(),
    }
    outcome
}

/// Latency histogram buckets: upper bounds 2^0 .. 2^(N-1) µs (~9 minutes).
pub const LATENCY_BUCKETS: usize = 30;

/// Batch latency, log2 buckets of microseconds.
#[derive(Debug)]
pub struct LatencyHistogram {
    buckets: [AtomicU64; LATENCY_BUCKETS],
    sum_us: AtomicU64,
}

impl Default for LatencyHistogram {
    fn default() -> Self {
        Self { buckets: std::array::from_fn(|_| AtomicU64::new(0)), sum_us: AtomicU64::new(0) }
    }
}

impl LatencyHistogram {
    pub fn record(&self, latency: Duration) {
        let us = u64::try_from(latency.as_micros()).unwrap_or(u64::MAX).max(1);
        // Bucket i holds (2^(i-1), 2^i]; ceil(log2(us)).
        let index = (64 - (us - 1).leading_zeros()) as usize;
        self.buckets[index.min(LATENCY_BUCKETS - 1)].fetch_add(1, Ordering::Relaxed);
        self.sum_us.fetch_add(us, Ordering::Relaxed);
    }

    /// `(upper bound µs, count in that bucket)`, and the sum in µs.
    pub fn snapshot(&self) -> (Vec<(u64, u64)>, u64) {
        let buckets = self.buckets.iter().enumerate().map(|(i, b)| (1u64 << i, b.load(Ordering::Relaxed))).collect();
        (buckets, self.sum_us.load(Ordering::Relaxed))
    }
}

/// What one dataset has served since the node started.
#[derive(Debug, Default)]
pub struct DatasetCounters {
    pub batches: AtomicU64,
    pub ranges_ok: AtomicU64,
    pub ranges_failed: AtomicU64,
    pub bytes: AtomicU64,
    /// Whole batches refused or lost (dataset gone, too large, shutting down).
    pub batches_failed: AtomicU64,
    pub latency: [LatencyHistogram; 2],
}

impl DatasetCounters {
    pub fn record_batch(&self, lane: Lane, ok: u64, failed: u64, bytes: u64, latency: Duration) {
        self.batches.fetch_add(1, Ordering::Relaxed);
        self.ranges_ok.fetch_add(ok, Ordering::Relaxed);
        self.ranges_failed.fetch_add(failed, Ordering::Relaxed);
        self.bytes.fetch_add(bytes, Ordering::Relaxed);
        self.latency[lane as usize].record(latency);
    }

    pub fn record_failed_batch(&self) {
        self.batches_failed.fetch_add(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn latencies_land_in_log2_buckets() {
        let h = LatencyHistogram::default();
        for us in [1, 2, 3, 4, 5, 1000, 1024, 1025] {
            h.record(Duration::from_micros(us));
        }
        h.record(Duration::from_secs(100_000));
        let (buckets, sum) = h.snapshot();
        let count = |bound: u64| buckets.iter().find(|(b, _)| *b == bound).map(|(_, c)| *c).unwrap_or(0);
        assert_eq!(count(1), 1);
        assert_eq!(count(2), 1);
        assert_eq!(count(4), 2, "3 and 4");
        assert_eq!(count(8), 1, "5");
        assert_eq!(count(1024), 2, "1000 and 1024");
        assert_eq!(count(2048), 1, "1025");
        assert_eq!(count(1 << (LATENCY_BUCKETS - 1)), 1, "overflow goes to the last bucket");
        assert!(sum >= 1 + 2 + 3 + 4 + 5 + 1000 + 1024 + 1025);
    }
}
