//! `sluicectl top`'s view of the eBPF trace (`GET /v1/trace`): one row per
//! dataset and lane with its batch rate since the last snapshot, the
//! slow-batch count and the kernel's line. The text output and the
//! terminal UI draw the same rows.

use std::collections::HashMap;

use sluice_proto::api::trace::log2_quantile;
use sluice_proto::api::{KernelTrace, TraceSnapshot};
use sluice_proto::Lane;

/// The columns of a row, in order.
pub const HEADER: [&str; 9] =
    ["DATASET", "LANE", "BATCHES", "BATCH/S", "RANGES", "BYTES", "FAILED", "SIZE p50 B", "LATENCY p50 us"];

/// What the view remembers between snapshots: batches per dataset and lane.
#[derive(Default)]
pub struct TraceRates {
    batches_before: HashMap<(u64, Lane), u64>,
    batch_rates: HashMap<(u64, Lane), f64>,
}

impl TraceRates {
    /// Takes a new snapshot; a rate is the difference from the last one.
    pub fn update(&mut self, snapshot: &TraceSnapshot, interval_s: f64) {
        for entry in &snapshot.entries {
            let key = (entry.dataset_id, entry.lane);
            if let Some(before) = self.batches_before.insert(key, entry.batches) {
                self.batch_rates.insert(key, entry.batches.saturating_sub(before) as f64 / interval_s.max(0.1));
            }
        }
    }

    /// One row per entry, in the order of [`HEADER`].
    pub fn rows(&self, snapshot: &TraceSnapshot) -> Vec<[String; 9]> {
        let bound = |histogram: &[u64]| log2_quantile(histogram, 0.5).map_or_else(|| "-".into(), |v| format!("<{v}"));
        snapshot
            .entries
            .iter()
            .map(|e| {
                let rate = self.batch_rates.get(&(e.dataset_id, e.lane));
                [
                    e.name(),
                    e.lane.name().to_string(),
                    e.batches.to_string(),
                    rate.map_or_else(|| "-".into(), |r| format!("{r:.0}")),
                    e.ranges.to_string(),
                    e.bytes.to_string(),
                    e.failed_ranges.to_string(),
                    bound(&e.size_log2),
                    bound(&e.latency_log2_us),
                ]
            })
            .collect()
    }
}

/// The trace as text: the rows under a header, the slow batches kept and
/// the kernel's line; or why there is no trace.
pub fn render(snapshot: &TraceSnapshot, rows: &[[String; 9]]) -> String {
    if !snapshot.available {
        return format!("no trace: {}\n", snapshot.reason.as_deref().unwrap_or("unknown"));
    }
    let line = |c: [&str; 9]| {
        format!(
            "{:<24} {:<8} {:>10} {:>9} {:>12} {:>14} {:>8} {:>12} {:>14}\n",
            c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7], c[8]
        )
    };
    let mut out = line(HEADER);
    for row in rows {
        out.push_str(&line(std::array::from_fn(|i| row[i].as_str())));
    }
    out.push_str(&slow_line(snapshot));
    out.push('\n');
    out.push_str(&kernel_line(&snapshot.kernel));
    out.push('\n');
    out
}

pub fn slow_line(snapshot: &TraceSnapshot) -> String {
    format!("slow batches (>= 10 ms) kept: {}", snapshot.slow_batches.len())
}

/// One line on the kernel's side of the node's I/O (io_uring tracepoints),
/// shown beside the probes' per-batch view.
pub fn kernel_line(kernel: &KernelTrace) -> String {
    if !kernel.available {
        return format!("kernel io_uring: not traced ({})", kernel.reason.as_deref().unwrap_or("no data"));
    }
    let quantile = |q| log2_quantile(&kernel.latency_log2_us, q).map_or("-".into(), |v| format!("<{v}"));
    format!(
        "kernel io_uring (1 in {} timed): {} requests, {} errors, request latency p50 {} us, p99 {} us",
        kernel.sampled_one_in,
        kernel.requests,
        kernel.errors,
        quantile(0.5),
        quantile(0.99)
    )
}

#[cfg(test)]
pub(crate) mod tests {
    use sluice_proto::api::{SlowBatch, TraceEntry};

    use super::*;

    pub(crate) fn snapshot(batches: u64) -> TraceSnapshot {
        let entry = |id: u64, name: &str, lane, batches: u64, failed, size: Vec<u64>, latency: Vec<u64>| TraceEntry {
            dataset_id: id,
            dataset: Some(name.into()),
            lane,
            batches,
            ranges: 64 * batches,
            bytes: 262_144 * batches,
            failed_ranges: failed,
            size_log2: size,
            latency_log2_us: latency,
        };
        let mut size = vec![0; 12];
        size[11] = 64;
        TraceSnapshot {
            available: true,
            reason: None,
            entries: vec![
                entry(1, "wiki", Lane::Latency, batches, 0, size, vec![0, 0, 0, 0, 0, 0, 0, 0, 3, 5]),
                entry(2, "books", Lane::Bulk, 2, 1, vec![], vec![]),
            ],
            slow_batches: vec![SlowBatch {
                dataset_id: 1,
                client_id: 4,
                lane: Lane::Latency,
                ranges: 1,
                bytes: 10,
                latency_us: 12_000,
            }],
            kernel: KernelTrace {
                available: true,
                reason: None,
                source: None,
                requests: 100,
                sampled_one_in: 8,
                errors: 0,
                latency_log2_us: vec![0, 0, 0, 0, 0, 50, 49, 0, 1],
            },
        }
    }

    #[test]
    fn rows_carry_rates_and_quantiles_and_the_text_says_what_is_missing() {
        let mut rates = TraceRates::default();
        rates.update(&snapshot(10), 1.0);
        rates.update(&snapshot(25), 1.0);
        let rows = rates.rows(&snapshot(25));
        assert_eq!(rows[0][..], ["wiki", "latency", "25", "15", "1600", "6553600", "0", "<4096", "<1024"]);
        assert_eq!(rows[1][3], "0");
        let text = render(&snapshot(25), &rows);
        assert!(text.contains("slow batches (>= 10 ms) kept: 1"), "{text}");
        assert!(
            text.contains(
                "kernel io_uring (1 in 8 timed): 100 requests, 0 errors, request latency p50 <64 us, p99 <128 us"
            ),
            "{text}"
        );
        assert_eq!(render(&TraceSnapshot::unavailable("off"), &[]), "no trace: off\n");
        assert_eq!(
            kernel_line(&KernelTrace::unavailable("no tracepoints")),
            "kernel io_uring: not traced (no tracepoints)"
        );
    }
}
