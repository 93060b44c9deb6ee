//! Instructions the node executes per served 4 KiB read, counted by
//! callgrind: deterministic where wall time is noise. Two runs of the node
//! serve different fixed numbers of reads; the difference of their totals
//! divided by the difference in reads cancels start-up and shutdown.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;
use sluice_client::Client;
use sluicectl::readbench::{self, BenchParams, ReadPattern};

use crate::procs::Server;

const BATCH: usize = 32;

#[derive(Clone, Debug, Serialize)]
pub struct InstructionCount {
    pub reads_small: u64,
    pub reads_large: u64,
    pub instructions_small: u64,
    pub instructions_large: u64,
    pub instructions_per_read: f64,
}

/// Counts instructions per read of `dataset` on a node over `data_dir`
/// (no other node may hold it).
pub fn per_read(
    runtime: &tokio::runtime::Runtime,
    sluiced: &Path,
    data_dir: &Path,
    dataset: &str,
    work_dir: &Path,
    batches: (u64, u64),
) -> Result<InstructionCount, String> {
    let small = run_once(runtime, sluiced, data_dir, dataset, work_dir, batches.0)?;
    let large = run_once(runtime, sluiced, data_dir, dataset, work_dir, batches.1)?;
    let (reads_small, reads_large) = (batches.0 * BATCH as u64, batches.1 * BATCH as u64);
    Ok(InstructionCount {
        reads_small,
        reads_large,
        instructions_small: small,
        instructions_large: large,
        instructions_per_read: (large as f64 - small as f64) / (reads_large - reads_small) as f64,
    })
}

fn run_once(
    runtime: &tokio::runtime::Runtime,
    sluiced: &Path,
    data_dir: &Path,
    dataset: &str,
    work_dir: &Path,
    batches: u64,
) -> Result<u64, String> {
    let out = work_dir.join(format!("callgrind.{batches}.out"));
    let wrapper =
        vec!["valgrind".to_string(), "--tool=callgrind".to_string(), format!("--callgrind-out-file={}", out.display())];
    let (server, endpoint) = Server::sluiced(&wrapper, sluiced, data_dir, "direct", &["--cores", "1"])?;
    runtime.block_on(async {
        let client = Client::connect(&endpoint).await.map_err(|e| e.to_string())?;
        let dataset = Arc::new(client.open(dataset).await.map_err(|e| e.to_string())?);
        let params = BenchParams {
            size_bytes: 4096,
            batch: BATCH,
            inflight: 1,
            duration: Duration::from_secs(3600),
            align_bytes: 4096,
            seed: 11,
            pattern: ReadPattern::Random,
            batches_per_worker: Some(batches),
            verify_against: None,
        };
        let report = readbench::run(dataset, params).await.map_err(|e| e.to_string())?;
        if report.failed_ranges > 0 || report.reads != batches * BATCH as u64 {
            return Err(format!("callgrind run served {} reads, {} failed", report.reads, report.failed_ranges));
        }
        Ok(())
    })?;
    drop(server); // SIGTERM: callgrind writes its totals on exit.
    let text = std::fs::read_to_string(&out).map_err(|e| format!("{}: {e}", out.display()))?;
    text.lines()
        .find_map(|line| line.strip_prefix("totals:").or_else(|| line.strip_prefix("summary:")))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .ok_or_else(|| format!("no totals in {}", out.display()))
}
