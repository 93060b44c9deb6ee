//! The random-read benchmark behind `sluicectl bench read` and quickstart:
//! `inflight` workers each keep one batch of `batch` random reads of
//! `size_bytes` outstanding for a fixed time, through the real client.

use std::sync::Arc;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use rand::{Rng, SeedableRng};
use serde::Serialize;
use sluice_client::{ClientError, Dataset, RangeStatus, ReadRange};

#[derive(Clone, Debug)]
pub struct BenchParams {
    pub size_bytes: u32,
    pub batch: usize,
    /// Batches outstanding at once; queue depth is `batch * inflight`.
    pub inflight: usize,
    pub duration: Duration,
    /// Offsets are multiples of this (1: any byte).
    pub align_bytes: u64,
    pub seed: u64,
    pub pattern: ReadPattern,
    /// Stop each worker after this many batches (for instruction counts,
    /// which need a fixed amount of work); `None`: run for `duration`.
    pub batches_per_worker: Option<u64>,
    /// The dataset's bytes, to check every read against (rig tests: a
    /// transport that moves bytes fast but wrong shows here).
    pub verify_against: Option<Arc<Vec<u8>>>,
}

/// Where the reads of a run fall.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ReadPattern {
    /// Uniformly random offsets.
    #[default]
    Random,
    /// Each worker walks the dataset from its own starting point, read after
    /// read, wrapping at the end.
    Sequential,
}

#[derive(Clone, Debug, Serialize)]
pub struct BenchReport {
    pub size_bytes: u32,
    pub batch: usize,
    pub inflight: usize,
    pub queue_depth: usize,
    pub seconds: f64,
    pub reads: u64,
    pub bytes: u64,
    pub failed_ranges: u64,
    /// Reads whose bytes differed from `verify_against` (0 when not set).
    pub mismatched_ranges: u64,
    pub iops: f64,
    pub gb_per_s: f64,
    pub batch_latency_us_p50: u64,
    pub batch_latency_us_p99: u64,
    pub batch_latency_us_p999: u64,
    pub batch_latency_us_max: u64,
    /// `(upper bound in µs, batches)` for each power-of-two bucket.
    pub batch_latency_log2_us: Vec<(u64, u64)>,
}

struct Tally {
    histogram: Histogram<u64>,
    reads: u64,
    bytes: u64,
    failed: u64,
    mismatched: u64,
}

/// Runs the benchmark against an open dataset.
pub async fn run(dataset: Arc<Dataset>, params: BenchParams) -> Result<BenchReport, ClientError> {
    let length = dataset.len_bytes();
    let size = u64::from(params.size_bytes);
    if size == 0 || size > length {
        return Err(ClientError::Control {
            endpoint: String::new(),
            message: format!("read size {size} does not fit the {length}-byte dataset"),
            status: None,
        });
    }
    let align = params.align_bytes.max(1);
    let started = Instant::now();
    let deadline = started + params.duration;
    let mut workers = Vec::new();
    for worker in 0..params.inflight.max(1) {
        let dataset = Arc::clone(&dataset);
        let params = params.clone();
        workers.push(tokio::spawn(async move {
            let mut rng = rand::rngs::SmallRng::seed_from_u64(params.seed.wrapping_add(worker as u64));
            let mut tally = Tally { histogram: new_histogram(), reads: 0, bytes: 0, failed: 0, mismatched: 0 };
            // Registered once on RDMA: no per-read registration in the loop.
            let mut buf = dataset.buffer(params.size_bytes as usize * params.batch)?;
            let slots = (length - size) / align;
            let mut ranges = Vec::with_capacity(params.batch);
            let mut cursor = rng.gen_range(0..=slots);
            let mut batches = 0u64;
            while Instant::now() < deadline && params.batches_per_worker.is_none_or(|max| batches < max) {
                batches += 1;
                ranges.clear();
                for i in 0..params.batch {
                    let offset = match params.pattern {
                        ReadPattern::Random => rng.gen_range(0..=slots) * align,
                        ReadPattern::Sequential => {
                            let offset = cursor * align;
                            cursor = if offset + size * 2 > length { 0 } else { cursor + size.div_ceil(align) };
                            offset
                        }
                    };
                    ranges.push(ReadRange { offset, len: params.size_bytes, dest: (i as u64) * size });
                }
                let sent = Instant::now();
                let statuses = dataset.read_into(&ranges, &mut buf).await?;
                let _ = tally.histogram.record(sent.elapsed().as_micros().max(1) as u64);
                let ok = statuses.iter().filter(|s| **s == RangeStatus::Ok).count() as u64;
                tally.reads += ok;
                tally.bytes += ok * size;
                tally.failed += statuses.len() as u64 - ok;
                if let Some(expected) = &params.verify_against {
                    for (range, status) in ranges.iter().zip(&statuses) {
                        let want = expected.get(range.offset as usize..(range.offset + size) as usize);
                        let got = &buf[range.dest as usize..(range.dest + size) as usize];
                        if *status == RangeStatus::Ok && want != Some(got) {
                            tally.mismatched += 1;
                        }
                    }
                }
            }
            Ok::<Tally, ClientError>(tally)
        }));
    }
    let mut total = Tally { histogram: new_histogram(), reads: 0, bytes: 0, failed: 0, mismatched: 0 };
    for worker in workers {
        let tally = worker.await.map_err(|e| ClientError::Control {
            endpoint: String::new(),
            message: e.to_string(),
            status: None,
        })??;
        let _ = total.histogram.add(&tally.histogram);
        total.reads += tally.reads;
        total.bytes += tally.bytes;
        total.failed += tally.failed;
        total.mismatched += tally.mismatched;
    }
    let seconds = started.elapsed().as_secs_f64();
    let h = &total.histogram;
    let mut buckets = Vec::new();
    let mut upper = 1u64;
    while upper / 2 <= h.max() && !h.is_empty() {
        let count = h.count_between(upper / 2 + 1, upper);
        if count > 0 || !buckets.is_empty() {
            buckets.push((upper, count));
        }
        upper *= 2;
    }
    Ok(BenchReport {
        size_bytes: params.size_bytes,
        batch: params.batch,
        inflight: params.inflight,
        queue_depth: params.batch * params.inflight,
        seconds,
        reads: total.reads,
        bytes: total.bytes,
        failed_ranges: total.failed,
        mismatched_ranges: total.mismatched,
        iops: total.reads as f64 / seconds,
        gb_per_s: total.bytes as f64 / seconds / 1e9,
        batch_latency_us_p50: h.value_at_quantile(0.5),
        batch_latency_us_p99: h.value_at_quantile(0.99),
        batch_latency_us_p999: h.value_at_quantile(0.999),
        batch_latency_us_max: h.max(),
        batch_latency_log2_us: buckets,
    })
}

fn new_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 60_000_000, 3).expect("valid histogram bounds")
}

impl BenchReport {
    /// The human-readable form.
    pub fn render(&self) -> String {
        let mut out = format!(
            "{} reads of {} B in batches of {} x {} in flight (queue depth {}) over {:.1} s\n\
             IOPS {:.0}   throughput {:.3} GB/s   failed ranges {}\n\
             batch latency  p50 {} us   p99 {} us   p99.9 {} us   max {} us\n",
            self.reads,
            self.size_bytes,
            self.batch,
            self.inflight,
            self.queue_depth,
            self.seconds,
            self.iops,
            self.gb_per_s,
            self.failed_ranges,
            self.batch_latency_us_p50,
            self.batch_latency_us_p99,
            self.batch_latency_us_p999,
            self.batch_latency_us_max,
        );
        let peak = self.batch_latency_log2_us.iter().map(|(_, c)| *c).max().unwrap_or(1).max(1);
        for (upper, count) in &self.batch_latency_log2_us {
            let bar = "#".repeat((count * 40).div_ceil(peak) as usize);
            out.push_str(&format!("  <= {upper:>8} us {count:>9} {bar}\n"));
        }
        out
    }
}
