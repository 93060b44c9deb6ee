//! What the node reports: `devices ls`, and `/metrics`.

use super::*;

impl ControlPlane {
    /// The Prometheus exposition of this node.
    pub fn metrics_text(&self) -> String {
        use crate::metrics::{render, DatasetSample, Gauge};
        let serving = self.serving.all_counters();
        let samples: Vec<DatasetSample<'_>> =
            serving.iter().map(|(name, counters)| DatasetSample { dataset: name, counters }).collect();
        let records = self.catalog.list().unwrap_or_default();
        let mut by_state: HashMap<String, f64> = HashMap::new();
        for record in &records {
            *by_state.entry(record.state.to_string()).or_default() += 1.0;
        }
        let mut gauges = vec![
            Gauge {
                name: "sluice_datasets",
                help: "Datasets in the catalog, by state.",
                samples: by_state.into_iter().map(|(state, n)| (vec![("state", state)], n)).collect(),
            },
            Gauge {
                name: "sluice_grants",
                help: "Access grants standing.",
                samples: vec![(vec![], self.access.grant_count() as f64)],
            },
        ];
        // Capacity comes from the same report `GET /v1/devices` serves.
        let (orphans, devices): (Vec<DeviceReport>, Vec<DeviceReport>) =
            self.devices().into_iter().partition(|d| d.kind == "orphan");
        gauges.push(Gauge {
            name: "sluice_orphaned_files",
            help: "Files no record owns, quarantined in DATA_DIR/orphans/ until an operator purges them.",
            samples: vec![(vec![], orphans.len() as f64)],
        });
        gauges.push(Gauge {
            name: "sluice_orphaned_bytes",
            help: "Bytes of the quarantined files.",
            samples: vec![(vec![], orphans.iter().map(|o| o.used_bytes).sum::<u64>() as f64)],
        });
        let (data_dirs, namespaces): (Vec<DeviceReport>, Vec<DeviceReport>) =
            devices.into_iter().partition(|d| d.kind == "data_dir");
        let per_device = |value: fn(&DeviceReport) -> u64| -> Vec<(Vec<(&'static str, String)>, f64)> {
            namespaces.iter().map(|d| (vec![("device", d.path.clone())], value(d) as f64)).collect()
        };
        gauges.push(Gauge {
            name: "sluice_namespace_device_capacity_bytes",
            help: "Capacity of each namespace device given to the node.",
            samples: per_device(|d| d.capacity_bytes),
        });
        gauges.push(Gauge {
            name: "sluice_namespace_device_used_bytes",
            help: "Bytes of datasets on each namespace device.",
            samples: per_device(|d| d.used_bytes),
        });
        let (leased, total) = self.serving.dma_slots();
        gauges.push(Gauge {
            name: "sluice_dma_slots",
            help: "DMA slots of the data plane's cores.",
            samples: vec![(vec![], total as f64)],
        });
        gauges.push(Gauge {
            name: "sluice_dma_slots_leased",
            help: "DMA slots held by batches in flight and responses not yet sent.",
            samples: vec![(vec![], leased as f64)],
        });
        // Per core: a core whose batches stay while nothing is at the device
        // and nothing waits to be pushed is stuck, and these tell which.
        let loads = self.serving.core_loads();
        for (name, help, value) in CORE_GAUGES {
            let samples =
                loads.iter().enumerate().map(|(core, load)| (vec![("core", core.to_string())], value(load))).collect();
            gauges.push(Gauge { name, help, samples });
        }
        for dir in data_dirs.iter().filter(|d| d.capacity_bytes > 0) {
            gauges.push(Gauge {
                name: "sluice_data_dir_capacity_bytes",
                help: "Size of the filesystem holding file namespaces.",
                samples: vec![(vec![], dir.capacity_bytes as f64)],
            });
            gauges.push(Gauge {
                name: "sluice_data_dir_available_bytes",
                help: "Free space for file namespaces.",
                samples: vec![(vec![], (dir.capacity_bytes - dir.used_bytes) as f64)],
            });
        }
        gauges.extend(self.cache_gauges());
        render(&samples, &gauges)
    }

    /// The cache tier on `/metrics`: the budget, and per source-backed
    /// dataset its hits, fills, evictions, fill latency and source errors.
    fn cache_gauges(&self) -> Vec<crate::metrics::Gauge> {
        use crate::metrics::Gauge;
        let caches = self.source_tier.caches();
        let reports: Vec<_> = caches.iter().map(|c| c.report(false)).collect();
        let budget = Arc::clone(self.source_tier.sources().budget());
        let per = |value: fn(&sluice_proto::api::CacheReport) -> u64| {
            reports.iter().map(|r| (vec![("dataset", r.name.clone())], value(r) as f64)).collect::<Vec<_>>()
        };
        let mut gauges = vec![
            Gauge {
                name: "sluice_cache_budget_bytes",
                help: "cache_bytes_max: what source-backed chunks may take on the node (0: no budget).",
                samples: vec![(vec![], budget.max_bytes() as f64)],
            },
            Gauge {
                name: "sluice_cache_used_bytes",
                help: "Bytes of source-backed chunks on the node.",
                samples: vec![(vec![], budget.used_bytes() as f64)],
            },
        ];
        let rows: [(&'static str, &'static str, CacheValue); 9] = [
            ("sluice_cache_chunks_present", "Chunks of a source-backed dataset on the node.", |r| r.chunks_present),
            ("sluice_cache_reads_present_total", "Batches whose chunks were all on the node (hits).", |r| {
                r.reads_present
            }),
            ("sluice_cache_reads_filled_total", "Batches that waited on a fill (misses).", |r| r.reads_filled),
            ("sluice_cache_filled_bytes_total", "Bytes fetched from the source into the cache.", |r| r.bytes_filled),
            ("sluice_cache_evicted_bytes_total", "Bytes evicted under the cache budget.", |r| r.bytes_evicted),
            ("sluice_cache_fill_mean_microseconds", "Mean time of a fill (fetch and commit).", |r| r.fill_mean_micros),
            ("sluice_cache_source_errors_total", "Fetches that failed after every retry.", |r| r.source_errors),
            ("sluice_cache_source_changed_total", "Fetches refused because the object changed since create.", |r| {
                r.source_changed
            }),
            ("sluice_cache_pinned", "1 for a pinned source-backed dataset.", |r| u64::from(r.pinned)),
        ];
        for (name, help, value) in rows {
            gauges.push(Gauge { name, help, samples: per(value) });
        }
        gauges
    }
}

/// One figure of a cache's report.
type CacheValue = fn(&sluice_proto::api::CacheReport) -> u64;

/// The per-core gauges: name, help, and the value from a core's load.
type CoreGauge = (&'static str, &'static str, fn(&sluice_dataplane::CoreLoadSnapshot) -> f64);

const CORE_GAUGES: [CoreGauge; 5] = [
    ("sluice_core_batches", "Batches a data-plane core holds: waiting for DMA slots or being read.", |load| {
        load.batches as f64
    }),
    (
        "sluice_core_batches_to_push",
        "Batches being read with reads not yet at the device (queue full, or bulk reads at their bound).",
        |load| load.batches_to_push as f64,
    ),
    ("sluice_core_reads_at_device", "Reads a data-plane core has at the device.", |load| load.reads_at_device as f64),
    (
        "sluice_core_bulk_bytes_at_device",
        "Bytes of bulk-lane reads a data-plane core has at the device (bounded by bulk_in_flight_bytes).",
        |load| load.bulk_bytes_at_device as f64,
    ),
    (
        "sluice_core_completions_found_late_total",
        "Passes in which a data-plane core found completions only after its periodic recheck nudged it: wake-ups that never came (0 on a healthy core).",
        |load| load.completions_found_late as f64,
    ),
];
