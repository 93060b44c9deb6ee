//! `sluicectl top`: live small-read traffic from the node's eBPF probes,
//! and the cache tier of its source-backed datasets.

use std::time::Duration;

use crate::api::Api;
use crate::cache_view::CacheRates;
use crate::error::{CtlError, Result};
use crate::trace_view::TraceRates;
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
    let mut trace_rates = TraceRates::default();
    let mut cache_rates = CacheRates::default();
    loop {
        let snapshot = snapshot(api)?;
        trace_rates.update(&snapshot.trace, interval);
        cache_rates.update(&snapshot.caches, interval);
        if json {
            crate::outln!("{}", crate::error::json_line(&snapshot)?);
        } else {
            if !once {
                crate::out!("\x1b[2J\x1b[H");
            }
            crate::out!("{}", crate::trace_view::render(&snapshot.trace, &trace_rates.rows(&snapshot.trace)));
            crate::out!("{}", crate::cache_view::render(&cache_rates.rows(&snapshot.caches)));
        }
        if once {
            return Ok(());
        }
        std::thread::sleep(Duration::from_secs_f64(interval.max(0.1)));
    }
}
