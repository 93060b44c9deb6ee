//! `sluicectl top`'s view of the cache tier: one row per source-backed
//! dataset from `GET /v1/caches`, the same figures the node puts on
//! `/metrics` (how much is on the node, hit ratio, fills, evictions, fill
//! latency, source errors), with the fill rate since the last snapshot.

use std::collections::HashMap;

use sluice_proto::api::CacheReport;

/// The columns of a row, in order.
pub const HEADER: [&str; 9] =
    ["DATASET", "PRESENT", "HIT", "FILLED", "FILL/S", "EVICTED", "FILL us", "ERRORS", "STATE"];

/// What the view remembers between snapshots: bytes filled per dataset.
#[derive(Default)]
pub struct CacheRates {
    filled_before: HashMap<String, u64>,
    fill_rates: HashMap<String, f64>,
}

impl CacheRates {
    /// Takes a new snapshot; a rate is the difference from the last one.
    pub fn update(&mut self, caches: &[CacheReport], interval_s: f64) {
        for cache in caches {
            if let Some(before) = self.filled_before.insert(cache.name.clone(), cache.bytes_filled) {
                let rate = cache.bytes_filled.saturating_sub(before) as f64 / interval_s.max(0.1);
                self.fill_rates.insert(cache.name.clone(), rate);
            }
        }
    }

    /// One row per cache, in the order of [`HEADER`].
    pub fn rows(&self, caches: &[CacheReport]) -> Vec<[String; 9]> {
        caches
            .iter()
            .map(|c| {
                [
                    c.name.clone(),
                    percent(c.chunks_present, c.chunks_total),
                    percent(c.reads_present, c.reads_present + c.reads_filled),
                    bytes(c.bytes_filled as f64),
                    self.fill_rates.get(&c.name).map_or_else(|| "-".into(), |r| bytes(*r)),
                    bytes(c.bytes_evicted as f64),
                    c.fill_mean_micros.to_string(),
                    format!("{}/{}", c.source_errors, c.source_changed),
                    state(c),
                ]
            })
            .collect()
    }
}

/// The rows as text, under a header; nothing when there is no cache.
pub fn render(rows: &[[String; 9]]) -> String {
    if rows.is_empty() {
        return String::new();
    }
    let line = |cells: [&str; 9]| {
        format!(
            "{:<24} {:>8} {:>6} {:>10} {:>10} {:>10} {:>8} {:>8}  {}\n",
            cells[0], cells[1], cells[2], cells[3], cells[4], cells[5], cells[6], cells[7], cells[8]
        )
    };
    let mut out = String::from("cache tier (source-backed datasets; ERRORS: unavailable/changed)\n");
    out.push_str(&line(HEADER));
    for row in rows {
        out.push_str(&line(std::array::from_fn(|i| row[i].as_str())));
    }
    out
}

fn percent(part: u64, whole: u64) -> String {
    if whole == 0 {
        return "-".into();
    }
    format!("{:.1}%", part as f64 * 100.0 / whole as f64)
}

/// Bytes with a binary unit: `512B`, `3.2MiB`.
fn bytes(value: f64) -> String {
    let mut value = value;
    for unit in ["B", "KiB", "MiB", "GiB"] {
        if value < 1024.0 {
            return if unit == "B" { format!("{value:.0}{unit}") } else { format!("{value:.1}{unit}") };
        }
        value /= 1024.0;
    }
    format!("{value:.1}TiB")
}

fn state(cache: &CacheReport) -> String {
    let mut words = Vec::new();
    if cache.hydrated {
        words.push("hydrated");
    }
    if cache.warming {
        words.push("warming");
    }
    if cache.pinned {
        words.push("pinned");
    }
    if cache.last_error.is_some() {
        words.push("source error");
    }
    words.join(",")
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) fn report(name: &str, present: u64, filled: u64) -> CacheReport {
        CacheReport {
            name: name.into(),
            chunks_total: 400,
            chunks_present: present,
            warming: true,
            hydrated: false,
            reads_present: 3,
            reads_filled: 1,
            chunks_filled: present,
            bytes_filled: filled,
            source_errors: 2,
            source_changed: 1,
            chunks_evicted: 0,
            bytes_evicted: 0,
            fill_mean_micros: 850,
            pinned: true,
            last_error: Some("503".into()),
        }
    }

    #[test]
    fn rows_show_ratios_rates_and_state() {
        let mut rates = CacheRates::default();
        rates.update(&[report("web", 100, 1 << 20)], 1.0);
        assert_eq!(rates.rows(&[report("web", 100, 1 << 20)])[0][4], "-", "no rate before a second snapshot");
        let now = [report("web", 300, 3 << 20)];
        rates.update(&now, 2.0);
        let row = &rates.rows(&now)[0];
        assert_eq!(
            row[..],
            ["web", "75.0%", "75.0%", "3.0MiB", "1.0MiB", "0B", "850", "2/1", "warming,pinned,source error"]
        );
        let text = render(&rates.rows(&now));
        assert!(text.starts_with("cache tier") && text.contains("DATASET") && text.contains("web"), "{text}");
        assert!(render(&[]).is_empty());
    }
}
