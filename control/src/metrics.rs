//! `GET /metrics`: the node in the Prometheus text exposition format
//! (version 0.0.4) — per-dataset serving counters and lane latency from the
//! transports, catalog and grant counts, and capacity per namespace device
//! and of the data directory.

use std::fmt::Write as _;

use sluice_proto::Lane;
use sluice_serve::metrics::DatasetCounters;

/// One dataset's counters, by name.
pub struct DatasetSample<'a> {
    pub dataset: &'a str,
    pub counters: &'a DatasetCounters,
}

/// A gauge with its labels.
pub struct Gauge {
    pub name: &'static str,
    pub help: &'static str,
    pub samples: Vec<(Vec<(&'static str, String)>, f64)>,
}

fn escape(value: &str) -> String {
    value.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

fn labels(pairs: &[(&str, &str)]) -> String {
    let inner: Vec<String> = pairs.iter().map(|(k, v)| format!("{k}=\"{}\"", escape(v))).collect();
    format!("{{{}}}", inner.join(","))
}

fn header(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
}

/// A per-dataset counter: name, help, how to read it.
type CounterSpec = (&'static str, &'static str, fn(&DatasetCounters) -> u64);

pub fn render(datasets: &[DatasetSample<'_>], gauges: &[Gauge]) -> String {
    use std::sync::atomic::Ordering::Relaxed;
    let mut out = String::new();
    let counters: [CounterSpec; 4] = [
        ("sluice_dataset_batches_total", "Batches served, per dataset.", |c| c.batches.load(Relaxed)),
        ("sluice_dataset_bytes_total", "Bytes served, per dataset.", |c| c.bytes.load(Relaxed)),
        (
            "sluice_dataset_batches_failed_total",
            "Whole batches refused or lost (dataset gone, too large, shutting down), per dataset.",
            |c| c.batches_failed.load(Relaxed),
        ),
        ("sluice_dataset_ranges_failed_total", "Ranges that failed (I/O error, checksum, bounds), per dataset.", |c| {
            c.ranges_failed.load(Relaxed)
        }),
    ];
    for (name, help, value) in counters {
        header(&mut out, name, "counter", help);
        for d in datasets {
            let _ = writeln!(out, "{name}{} {}", labels(&[("dataset", d.dataset)]), value(d.counters));
        }
    }
    header(&mut out, "sluice_dataset_ranges_total", "counter", "Ranges served whole, per dataset.");
    for d in datasets {
        let _ = writeln!(
            out,
            "sluice_dataset_ranges_total{} {}",
            labels(&[("dataset", d.dataset)]),
            d.counters.ranges_ok.load(Relaxed)
        );
    }
    let name = "sluice_batch_latency_seconds";
    header(
        &mut out,
        name,
        "histogram",
        "Batch latency in the data plane (submit to completion), per dataset and lane.",
    );
    for d in datasets {
        for lane in [Lane::Latency, Lane::Bulk] {
            let (buckets, sum_us) = d.counters.latency[lane as usize].snapshot();
            let mut cumulative = 0u64;
            for (upper_us, count) in &buckets {
                cumulative += count;
                let le = format!("{}", *upper_us as f64 / 1e6);
                let _ = writeln!(
                    out,
                    "{name}_bucket{} {cumulative}",
                    labels(&[("dataset", d.dataset), ("lane", lane.name()), ("le", &le)])
                );
            }
            let base = labels(&[("dataset", d.dataset), ("lane", lane.name())]);
            let _ = writeln!(
                out,
                "{name}_bucket{} {cumulative}",
                labels(&[("dataset", d.dataset), ("lane", lane.name()), ("le", "+Inf")])
            );
            let _ = writeln!(out, "{name}_sum{base} {}", sum_us as f64 / 1e6);
            let _ = writeln!(out, "{name}_count{base} {cumulative}");
        }
    }
    for gauge in gauges {
        header(&mut out, gauge.name, "gauge", gauge.help);
        for (pairs, value) in &gauge.samples {
            let pairs: Vec<(&str, &str)> = pairs.iter().map(|(k, v)| (*k, v.as_str())).collect();
            let rendered = if pairs.is_empty() { String::new() } else { labels(&pairs) };
            let _ = writeln!(out, "{}{rendered} {value}", gauge.name);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn renders_counters_histograms_and_gauges() {
        let counters = DatasetCounters::default();
        counters.record_batch(Lane::Latency, 31, 1, 31 * 4096, Duration::from_micros(300));
        counters.record_batch(Lane::Bulk, 4, 0, 4 << 20, Duration::from_millis(12));
        counters.record_failed_batch();
        let text = render(
            &[DatasetSample { dataset: "wiki", counters: &counters }],
            &[Gauge {
                name: "sluice_datasets",
                help: "Datasets by state.",
                samples: vec![(vec![("state", "sealed".to_string())], 1.0)],
            }],
        );
        assert!(text.contains("sluice_dataset_batches_total{dataset=\"wiki\"} 2\n"), "{text}");
        assert!(text.contains("sluice_dataset_ranges_total{dataset=\"wiki\"} 35\n"));
        assert!(text.contains("sluice_dataset_ranges_failed_total{dataset=\"wiki\"} 1\n"));
        assert!(text.contains("sluice_dataset_batches_failed_total{dataset=\"wiki\"} 1\n"));
        assert!(text.contains(&format!("sluice_dataset_bytes_total{{dataset=\"wiki\"}} {}\n", 31 * 4096 + (4 << 20))));
        // 300 µs falls in the bucket up to 512 µs; cumulative from there.
        assert!(
            text.contains("sluice_batch_latency_seconds_bucket{dataset=\"wiki\",lane=\"latency\",le=\"0.000256\"} 0\n")
        );
        assert!(
            text.contains("sluice_batch_latency_seconds_bucket{dataset=\"wiki\",lane=\"latency\",le=\"0.000512\"} 1\n")
        );
        assert!(text.contains("sluice_batch_latency_seconds_count{dataset=\"wiki\",lane=\"bulk\"} 1\n"));
        assert!(text.contains("sluice_datasets{state=\"sealed\"} 1\n"));
        assert_eq!(escape("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
    }
}
