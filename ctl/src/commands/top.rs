//! `sluicectl top`: live small-read traffic from the node's eBPF probes,
//! and the cache tier of its source-backed datasets.

use std::collections::HashMap;
use std::time::Duration;

use serde_json::Value;

use crate::api::Api;
use crate::cache_view::CacheRates;
use crate::error::{CtlError, Result};
use crate::tui::Snapshot;

fn snapshot(api: &Api) -> Result<Snapshot> {
    Ok(Snapshot { trace: api.get_json("/v1/trace")?, caches: api.get_json("/v1/caches")? })
}

pub fn run(api: &Api, once: bool, interval: f64, json: bool) -> Result<()> {
    use std::io::IsTerminal;
    if !once && !json && std::io::stdout().is_terminal() {
        // Live terminal UI; plain text when piped.
        let fetch = || snapshot(api).map_err(|e| e.to_string());
        return crate::tui::run(fetch, Duration::from_secs_f64(interval.max(0.1))).map_err(CtlError::Unavailable);
    }
    let mut previous: HashMap<(u64, String), u64> = HashMap::new();
    let mut cache_rates = CacheRates::default();
    loop {
        let Snapshot { mut trace, caches } = snapshot(api)?;
        cache_rates.update(&caches, interval);
        if json {
            trace["caches"] = serde_json::to_value(&caches).map_err(|e| CtlError::Failed(e.to_string()))?;
            println!("{trace}");
        } else {
            if !once {
                print!("\x1b[2J\x1b[H");
            }
            print!("{}", render_top(&trace, &mut previous, interval));
            print!("{}", crate::cache_view::render(&cache_rates.rows(&caches)));
        }
        if once {
            return Ok(());
        }
        std::thread::sleep(Duration::from_secs_f64(interval.max(0.1)));
    }
}

fn render_top(snapshot: &Value, previous: &mut HashMap<(u64, String), u64>, interval: f64) -> String {
    if snapshot["available"] != Value::Bool(true) {
        return format!("no trace: {}\n", snapshot["reason"].as_str().unwrap_or("unknown"));
    }
    let mut out = format!(
        "{:<24} {:<8} {:>10} {:>9} {:>12} {:>14} {:>8} {:>12} {:>14}\n",
        "DATASET", "LANE", "BATCHES", "BATCH/S", "RANGES", "BYTES", "FAILED", "SIZE p50 B", "LATENCY p50 us"
    );
    for entry in snapshot["entries"].as_array().into_iter().flatten() {
        let id = entry["dataset_id"].as_u64().unwrap_or(0);
        let lane = entry["lane"].as_str().unwrap_or("?").to_string();
        let batches = entry["batches"].as_u64().unwrap_or(0);
        let rate = previous.insert((id, lane.clone()), batches).map(|p| (batches - p.min(batches)) as f64 / interval);
        let name = entry["dataset"].as_str().map(str::to_string).unwrap_or_else(|| format!("#{id}"));
        let size = crate::tui::log2_quantile(&entry["size_log2"], 0.5);
        let latency = crate::tui::log2_quantile(&entry["latency_log2_us"], 0.5);
        out.push_str(&format!(
            "{:<24} {:<8} {:>10} {:>9} {:>12} {:>14} {:>8} {:>12} {:>14}\n",
            name,
            lane,
            batches,
            rate.map(|r| format!("{r:.0}")).unwrap_or_else(|| "-".into()),
            entry["ranges"],
            entry["bytes"],
            entry["failed_ranges"],
            size.map(|s| format!("<{s}")).unwrap_or_else(|| "-".into()),
            latency.map(|l| format!("<{l}")).unwrap_or_else(|| "-".into()),
        ));
    }
    let slow = snapshot["slow_batches"].as_array().map_or(0, Vec::len);
    out.push_str(&format!("slow batches (>= 10 ms) kept: {slow}\n"));
    out.push_str(&crate::tui::kernel_line(snapshot));
    out.push('\n');
    out
}
