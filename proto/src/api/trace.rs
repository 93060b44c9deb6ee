//! `GET /v1/trace`: what the node's eBPF probes saw of its batches, per
//! dataset and lane, the slowest batches kept, and the kernel's side of
//! the I/O from the io_uring tracepoints. The node fills it, `sluicectl
//! top` renders it; neither reads the other's JSON by field name.

use serde::{Deserialize, Serialize};

use crate::Lane;

/// A snapshot of the trace, or why there is none.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct TraceSnapshot {
    /// The probes are attached and their maps were read.
    pub available: bool,
    /// Why not, when not available.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(default)]
    pub entries: Vec<TraceEntry>,
    /// The slowest batches, newest last.
    #[serde(default)]
    pub slow_batches: Vec<SlowBatch>,
    #[serde(default)]
    pub kernel: KernelTrace,
}

impl TraceSnapshot {
    /// No trace, and why.
    pub fn unavailable(reason: impl Into<String>) -> Self {
        Self { available: false, reason: Some(reason.into()), ..Self::default() }
    }
}

/// One dataset's batches in one lane, as the probes counted them.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct TraceEntry {
    pub dataset_id: u64,
    /// The dataset's name, when the catalog still has it.
    #[serde(default)]
    pub dataset: Option<String>,
    #[cfg_attr(feature = "openapi", schema(value_type = String))]
    pub lane: Lane,
    pub batches: u64,
    pub ranges: u64,
    pub bytes: u64,
    pub failed_ranges: u64,
    /// Range sizes: bucket i holds sizes up to 2^(i+1) bytes.
    pub size_log2: Vec<u64>,
    /// Batch latencies: bucket i holds latencies up to 2^(i+1) µs.
    pub latency_log2_us: Vec<u64>,
}

impl TraceEntry {
    /// Its dataset's name, or `#id` once the catalog has forgotten it.
    pub fn name(&self) -> String {
        self.dataset.clone().unwrap_or_else(|| format!("#{}", self.dataset_id))
    }
}

/// One batch that took 10 ms or more.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SlowBatch {
    pub dataset_id: u64,
    pub client_id: u64,
    #[cfg_attr(feature = "openapi", schema(value_type = String))]
    pub lane: Lane,
    pub ranges: u64,
    pub bytes: u64,
    pub latency_us: u64,
}

/// The kernel's side of the node's I/O, from tracepoints: every request
/// counted, one in `sampled_one_in` timed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct KernelTrace {
    pub available: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The tracepoints, `submit -> complete`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
    #[serde(default)]
    pub requests: u64,
    #[serde(default = "one")]
    pub sampled_one_in: u64,
    #[serde(default)]
    pub errors: u64,
    /// Request latencies: bucket i holds latencies up to 2^(i+1) µs.
    #[serde(default)]
    pub latency_log2_us: Vec<u64>,
}

fn one() -> u64 {
    1
}

impl Default for KernelTrace {
    fn default() -> Self {
        Self::unavailable("no data")
    }
}

impl KernelTrace {
    /// Not traced, and why.
    pub fn unavailable(reason: impl Into<String>) -> Self {
        Self {
            available: false,
            reason: Some(reason.into()),
            source: None,
            requests: 0,
            sampled_one_in: 1,
            errors: 0,
            latency_log2_us: Vec::new(),
        }
    }
}

/// The upper bound of the log2 bucket holding quantile `q` (0..=1) of
/// `histogram`, whose bucket i holds values up to 2^(i+1).
pub fn log2_quantile(histogram: &[u64], q: f64) -> Option<u64> {
    let total: u64 = histogram.iter().sum();
    let target = ((total as f64) * q).ceil().max(1.0) as u64;
    let mut seen = 0;
    for (bucket, count) in histogram.iter().enumerate() {
        seen += count;
        if total > 0 && seen >= target {
            return Some(2u64 << bucket);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lanes_are_named_on_the_wire_and_an_unavailable_trace_says_why() {
        let entry = TraceEntry {
            dataset_id: 3,
            dataset: None,
            lane: Lane::Bulk,
            batches: 1,
            ranges: 2,
            bytes: 3,
            failed_ranges: 0,
            size_log2: vec![1],
            latency_log2_us: vec![],
        };
        let json = serde_json::to_value(&entry).expect("json");
        assert_eq!(json["lane"], "bulk");
        assert_eq!(serde_json::from_value::<TraceEntry>(json).expect("back"), entry);
        assert_eq!(entry.name(), "#3");
        let none: TraceSnapshot = serde_json::from_str(r#"{"available": false, "reason": "off"}"#).expect("parse");
        assert_eq!(none, TraceSnapshot::unavailable("off"));
        assert_eq!((none.kernel.available, none.kernel.sampled_one_in), (false, 1));
    }

    #[test]
    fn quantiles_name_the_bucket_bound() {
        assert_eq!(log2_quantile(&[0, 0, 0, 0, 0, 50, 49, 0, 1], 0.5), Some(64));
        assert_eq!(log2_quantile(&[0, 0, 0, 0, 0, 50, 49, 0, 1], 0.99), Some(128));
        assert_eq!(log2_quantile(&[], 0.5), None);
    }
}
