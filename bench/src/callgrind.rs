//! Instructions the node executes per served 4 KiB read, and heap
//! allocations per batch, counted by callgrind: deterministic where wall
//! time is noise. Two runs of the node serve different fixed numbers of
//! reads; the difference of their totals divided by the difference in
//! reads cancels start-up. Each run starts from the node's data directory
//! as it was before any run (kept aside and put back): a node changes its
//! catalog as it runs, and a later run's start-up over a catalog an
//! earlier run changed would not cancel.
//!
//! Shutdown is left out: callgrind writes its totals out as the node's
//! shutdown begins ([`SHUTDOWN_FUNCTION`], `--dump-before`), and the count
//! reads those. Shutdown does not cancel between two runs: the catalog's
//! last commit as it closes cost 15.7 to 16.2 million instructions over
//! the same catalog in four runs of one count, which spread over the
//! 25,600 reads between two runs is ±17 instructions a read.
//!
//! The node does not poll after work (`--poll-window-us 0`): see
//! [`run_once`]. The count still depends on the device, because reads
//! that complete apart each take a turn of the core's event loop; the
//! suite and `bench instructions` read the same 1 GiB at random.
//!
//! So the count is taken twice ([`Source`]): with `O_DIRECT` reads at the
//! device, the goal's measure, and through the page cache, warmed, where
//! io_uring completes each read during its submission and the core never
//! waits for the device. The difference is what waiting costs the core's
//! event loop (its turns for completions that arrive apart, which callgrind,
//! slowing the node and not the device, makes more of than a native run
//! has); the page-cache count is the served path alone.
//!
//! A second pair of runs counts only the instructions spent inside
//! `sluice_dataplane::blocks::block_crc` (`--toggle-collect` collects
//! inside the function named and nowhere else), so the served path's own
//! cost reads apart from verifying every block, whose CRC32C is about
//! 1,930 instructions a 4 KiB block here: callgrind, which runs no AVX-512,
//! runs `crc-fast`'s SSE carry-less multiply code, not the AVX-512
//! (`VPCLMULQDQ`) code a core with it runs.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;
use sluice_client::Client;
use sluicectl::readbench::{self, BenchParams, ReadPattern};

use crate::procs::Server;

pub const BATCH: usize = 32;
/// The function whose instructions alone the second pair of runs counts.
const CRC_FUNCTION: &str = "sluice_dataplane::blocks::block_crc";
/// What the node runs as it stops, once its connections and control API
/// are gone and before its catalog closes (`Node::shutdown`, whose own
/// future is inlined where it is awaited): callgrind writes the totals
/// the count reads as it enters.
const SHUTDOWN_FUNCTION: &str = "sluice_dataplane::engine::DataPlane::shutdown";
/// The C allocator's entry points: a call of any is one heap allocation.
const ALLOCATORS: [&str; 6] = ["malloc", "calloc", "realloc", "posix_memalign", "aligned_alloc", "memalign"];
/// Where an event loop waits (tokio's, through mio): a call is one wait,
/// whether it slept, found events ready or was interrupted.
const EVENT_LOOP_WAIT: [&str; 1] = ["epoll_wait"];

/// Where the counted reads come from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Source {
    /// `O_DIRECT` reads at the device (`--io-mode direct`).
    Device,
    /// Buffered reads of a warmed file (`--io-mode buffered`).
    PageCache,
}

impl Source {
    fn io_mode(self) -> &'static str {
        match self {
            Source::Device => "direct",
            Source::PageCache => "buffered",
        }
    }

    /// The words reports use for it.
    pub fn describe(self) -> &'static str {
        match self {
            Source::Device => "O_DIRECT, reads at the device",
            Source::PageCache => "through the page cache, warmed",
        }
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct InstructionCount {
    pub source: Source,
    pub reads_small: u64,
    pub reads_large: u64,
    pub instructions_small: u64,
    pub instructions_large: u64,
    pub instructions_per_read: f64,
    /// The same, leaving out the block CRC32C of verification.
    pub instructions_per_read_beside_crc: f64,
    /// Heap allocations (calls of the C allocator) in the two runs, and
    /// their difference per batch of `BATCH` more.
    pub allocations_small: u64,
    pub allocations_large: u64,
    pub allocations_per_batch: f64,
    /// Calls of `epoll_wait` in the node per batch of `BATCH` more: the
    /// turns its event loops took to wait (nearly all of them the core's:
    /// the control side waits about the same in both runs). What the
    /// `O_DIRECT` count has more of than the page-cache count.
    pub waits_per_batch: f64,
}

/// One callgrind run's totals.
struct Totals {
    instructions: u64,
    allocations: u64,
    waits: u64,
}

/// Where a count's runs take place: a node's data directory, kept aside
/// once as it was before any run so that every run, of either [`Source`],
/// starts from it.
pub struct CountSetup<'a> {
    runtime: &'a tokio::runtime::Runtime,
    sluiced: &'a Path,
    data_dir: &'a Path,
    dataset: &'a str,
    work_dir: &'a Path,
    pristine: PathBuf,
}

impl<'a> CountSetup<'a> {
    /// Keeps `data_dir` (which no other node may hold) aside in
    /// `work_dir`, where callgrind's outputs go too.
    pub fn keep_aside(
        runtime: &'a tokio::runtime::Runtime,
        sluiced: &'a Path,
        data_dir: &'a Path,
        dataset: &'a str,
        work_dir: &'a Path,
    ) -> Result<Self, String> {
        let pristine = work_dir.join("node.before-runs");
        let _ = std::fs::remove_dir_all(&pristine);
        copy_tree(data_dir, &pristine).map_err(|e| format!("keeping {} aside: {e}", data_dir.display()))?;
        Ok(Self { runtime, sluiced, data_dir, dataset, work_dir, pristine })
    }
}

/// Counts instructions per read of the setup's dataset from `source`, in
/// runs of `batches.0` and `batches.1` batches.
pub fn per_read(setup: &CountSetup, source: Source, batches: (u64, u64)) -> Result<InstructionCount, String> {
    let data_dir = setup.data_dir;
    let run = |batches, crc_only| {
        // Every run starts where the first did.
        std::fs::remove_dir_all(data_dir).map_err(|e| format!("{}: {e}", data_dir.display()))?;
        copy_tree(&setup.pristine, data_dir).map_err(|e| format!("restoring {}: {e}", data_dir.display()))?;
        if source == Source::PageCache {
            crate::warm_namespaces(data_dir)?;
        }
        run_once(setup, source, batches, crc_only)
    };
    let small = run(batches.0, false)?;
    let large = run(batches.1, false)?;
    let small_crc = run(batches.0, true)?;
    let large_crc = run(batches.1, true)?;
    let (reads_small, reads_large) = (batches.0 * BATCH as u64, batches.1 * BATCH as u64);
    let per_read = |small: u64, large: u64| (large as f64 - small as f64) / (reads_large - reads_small) as f64;
    let per_batch = |small: u64, large: u64| (large as f64 - small as f64) / (batches.1 - batches.0) as f64;
    let instructions_per_read = per_read(small.instructions, large.instructions);
    Ok(InstructionCount {
        source,
        reads_small,
        reads_large,
        instructions_small: small.instructions,
        instructions_large: large.instructions,
        instructions_per_read,
        instructions_per_read_beside_crc: instructions_per_read
            - per_read(small_crc.instructions, large_crc.instructions),
        allocations_small: small.allocations,
        allocations_large: large.allocations,
        allocations_per_batch: per_batch(small.allocations, large.allocations),
        waits_per_batch: per_batch(small.waits, large.waits),
    })
}

fn run_once(setup: &CountSetup, source: Source, batches: u64, crc_only: bool) -> Result<Totals, String> {
    let CountSetup { runtime, sluiced, data_dir, dataset, work_dir, .. } = *setup;
    let out = work_dir.join(output_name(source, batches, crc_only));
    // A part left by an earlier run would be read as this one's.
    let _ = std::fs::remove_file(counted_part(&out));
    let mut wrapper = vec![
        "valgrind".to_string(),
        "--tool=callgrind".to_string(),
        format!("--callgrind-out-file={}", out.display()),
        format!("--dump-before={SHUTDOWN_FUNCTION}"),
    ];
    if crc_only {
        wrapper.push(format!("--toggle-collect={CRC_FUNCTION}"));
    }
    // No polling after work: a polling core spins for a time measured on
    // the clock, and under callgrind, which runs the node tens of times
    // slower, the instructions of that spin stand for nothing the node
    // does natively (there it spins as long, at full speed). What polling
    // costs and gains is measured in time, by the read benchmarks.
    let node_flags = ["--cores", "1", "--poll-window-us", "0"];
    let (server, endpoint) = Server::sluiced(&wrapper, sluiced, data_dir, source.io_mode(), &node_flags)?;
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
    drop(server); // SIGTERM: callgrind writes the counted part as shutdown begins, the rest on exit.
    let counted = counted_part(&out);
    let text = std::fs::read_to_string(&counted).map_err(|e| format!("{}: {e}", counted.display()))?;
    if !text.lines().any(|line| line == format!("desc: Trigger: --dump-before={SHUTDOWN_FUNCTION}")) {
        return Err(format!("{}: not written as the node entered {SHUTDOWN_FUNCTION} (renamed?)", counted.display()));
    }
    let instructions = text
        .lines()
        .find_map(|line| line.strip_prefix("totals:").or_else(|| line.strip_prefix("summary:")))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .ok_or_else(|| format!("no totals in {}", counted.display()))?;
    Ok(Totals { instructions, allocations: calls_to(&text, &ALLOCATORS), waits: calls_to(&text, &EVENT_LOOP_WAIT) })
}

/// The name of one run's callgrind output: `callgrind.<io mode>.<batches>[.crc].out`.
/// The part the count reads, up to shutdown, is [`counted_part`] of it.
pub fn output_name(source: Source, batches: u64, crc_only: bool) -> String {
    format!("callgrind.{}.{batches}{}.out", source.io_mode(), if crc_only { ".crc" } else { "" })
}

/// The file callgrind writes a run's first part to (its outputs are
/// numbered by part), up to the node's shutdown: what the count reads.
pub fn counted_part(out: &Path) -> PathBuf {
    let mut name = out.as_os_str().to_owned();
    name.push(".1");
    PathBuf::from(name)
}

/// Copies the directory tree at `from` to `to` (files and directories;
/// a node's data directory holds nothing else), keeping permissions.
fn copy_tree(from: &Path, to: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(to)?;
    std::fs::set_permissions(to, std::fs::metadata(from)?.permissions())?;
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        let target = to.join(entry.file_name());
        if entry.file_type()?.is_dir() {
            copy_tree(&entry.path(), &target)?;
        } else {
            std::fs::copy(entry.path(), &target)?;
        }
    }
    Ok(())
}

/// Calls of the functions named `names` in a callgrind output: the sum of
/// every `calls=` line under a `cfn=` naming one of them. Names are
/// compressed (`cfn=(7) malloc` once, then `cfn=(7)`), so ids are mapped.
fn calls_to(text: &str, names: &[&str]) -> u64 {
    let mut named = std::collections::HashMap::new();
    let mut callee_counts = false;
    let mut calls = 0;
    for line in text.lines() {
        let spec = line.strip_prefix("cfn=").or_else(|| line.strip_prefix("cfni=")).map(|s| (s, true));
        let spec = spec.or_else(|| line.strip_prefix("fn=").map(|s| (s, false)));
        if let Some((spec, is_callee)) = spec {
            let (id, name) = match spec.strip_prefix('(').and_then(|s| s.split_once(')')) {
                Some((id, rest)) => (Some(id.to_string()), rest.trim()),
                None => (None, spec.trim()),
            };
            let name = match (&id, name.is_empty()) {
                (Some(id), true) => named.get(id).cloned().unwrap_or_default(),
                (Some(id), false) => {
                    named.insert(id.clone(), name.to_string());
                    name.to_string()
                }
                (None, _) => name.to_string(),
            };
            callee_counts = is_callee && names.contains(&name.as_str());
        } else if let Some(rest) = line.strip_prefix("calls=") {
            if callee_counts {
                calls += rest.split_whitespace().next().and_then(|n| n.parse::<u64>().ok()).unwrap_or(0);
            }
            callee_counts = false;
        }
    }
    calls
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Calls are summed per callee, through compressed names.
    #[test]
    fn calls_are_counted_through_compressed_names() {
        let text = "fn=(1) main\ncfn=(2) malloc\ncalls=3 10\n5 9\ncfn=(3) free\ncalls=2 11\n4 6\n\
                    fn=(4) other\ncfn=(2)\ncalls=4 12\n1 3\ncfn=(5) calloc\ncalls=1 0\n1 2\n";
        assert_eq!(calls_to(text, &["malloc"]), 7);
        assert_eq!(calls_to(text, &ALLOCATORS), 8);
        assert_eq!(calls_to(text, &["free"]), 2);
    }
}
