//! The side-by-side benchmark suite: sluice next to the peers a user would
//! pick instead, on the same bytes, in one run.
//!
//! `cargo run -p bench --release -- all` writes `bench/results/<date>/`
//! (`report.md`, `throughput.png`, `latency_p99.png`, `results.json`);
//! `-- all --short` is the seconds-long version CI runs (built with the
//! dev profile there, as its tests are; see [`Profile`]).

mod callgrind;
mod procs;
mod rdma;
mod report;
mod runners;
mod workload;

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::time::Duration;

use clap::{Parser, Subcommand};
use hw_tests::cargo;
use rand::RngCore;
use sluice::{Node, NodeConfig};

use crate::callgrind::{CountSetup, Source};
use crate::procs::{cpu_seconds_of, free_port, output, wait_port, Server};
use crate::report::{Run, BATCHED_LIMIT, DEVICE_LIMIT};
use crate::runners::{FioQueue, FioTarget};
use crate::workload::{Measurement, Workload};

#[derive(Parser, Debug)]
#[command(name = "bench", about = "sluice next to its peers, on the same files, in one run")]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Every system, every workload, the instruction count, the
    /// microbenchmarks; then the report and plots.
    All {
        /// Seconds per workload and small files: checks the suite works.
        #[arg(long)]
        short: bool,
        /// Seconds each system runs each workload.
        #[arg(long)]
        seconds: Option<f64>,
        /// Size of each data file (random bytes, tokens).
        #[arg(long)]
        data_mib: Option<u64>,
        /// Where the report goes [default: bench/results/{DATE}, or
        /// target/bench-short with --short].
        #[arg(long)]
        out: Option<PathBuf>,
    },
    /// Only the instruction count per served 4 KiB read (callgrind), in
    /// all and beside the block CRC32C, and the heap allocations per
    /// batch, on a node of its own: at O_DIRECT (the goal's count) and
    /// through the warmed page cache; keeps the callgrind outputs for
    /// `callgrind_annotate` (in target/bench-instructions: `*.out.1` is
    /// each run up to the node's shutdown, what the count reads).
    Instructions {
        /// Batches of 32 reads in the small and the large run.
        #[arg(long, default_value_t = 200)]
        small: u64,
        #[arg(long, default_value_t = 1000)]
        large: u64,
        /// MiB of data read at random, as in the suite: the count depends
        /// on it, because reads of a file the host does not cache complete
        /// apart, and each completion that arrives alone is a turn of the
        /// core's event loop.
        #[arg(long, default_value_t = DATA_MIB)]
        data_mib: u64,
    },
    /// sluice's RDMA transport next to perftest (ib_write_bw, ib_read_bw) on
    /// the rig's soft-RoCE pair (or real devices via SLUICE_HW_*); writes
    /// rdma.md and rdma.json.
    Rdma {
        /// Seconds each run lasts.
        #[arg(long, default_value_t = 10)]
        seconds: u64,
        /// Where the report goes [default: bench/results/{DATE}].
        #[arg(long)]
        out: Option<PathBuf>,
    },
}

/// MiB of random bytes the suite (and `bench instructions`) reads: more
/// than the host caches of its disk, so reads reach the device.
const DATA_MIB: u64 = 1024;

fn main() -> ExitCode {
    let outcome = match Cli::parse().command {
        Cmd::All { short, seconds, data_mib, out } => run_all(short, seconds, data_mib, out),
        Cmd::Rdma { seconds, out } => run_rdma(seconds, out),
        Cmd::Instructions { small, large, data_mib } => run_instructions(small, large, data_mib),
    };
    match outcome {
        Ok(report) => {
            println!("report: {}", report.display());
            ExitCode::SUCCESS
        }
        Err(err) => {
            eprintln!("bench: {err}");
            ExitCode::FAILURE
        }
    }
}

fn run_rdma(seconds: u64, out: Option<PathBuf>) -> Result<PathBuf, String> {
    let out = layout(false, out)?.out;
    let markdown = rdma::run(seconds.max(1), &out)?;
    print!("{markdown}");
    Ok(out.join("rdma.md"))
}

fn run_instructions(small: u64, large: u64, data_mib: u64) -> Result<PathBuf, String> {
    if small >= large {
        return Err(format!("--small ({small}) must be fewer batches than --large ({large})"));
    }
    let (workspace, target) = workspace_and_target()?;
    let bin = built_binaries(&workspace, &target)?;
    let work = target.join("bench-instructions");
    let _ = std::fs::remove_dir_all(&work);
    std::fs::create_dir_all(&work).map_err(|e| format!("{}: {e}", work.display()))?;
    write_random(&work.join("data.bin"), data_mib.max(1) << 20)?;
    let node_dir = work.join("node");
    let (node, endpoint) = Server::sluiced(&[], &bin.join("sluiced"), &node_dir, "direct", &[])?;
    sluicectl(&bin, &endpoint, &["dataset", "create", "bytes", "--kind", "bytes"])?;
    sluicectl(&bin, &endpoint, &["dataset", "ingest", "bytes", &work.join("data.bin").display().to_string()])?;
    sluicectl(&bin, &endpoint, &["dataset", "seal", "bytes"])?;
    drop(node);
    let runtime = sluicectl::api::runtime_with_workers(1).map_err(|e| e.to_string())?;
    let sluiced = bin.join("sluiced");
    let setup = CountSetup::keep_aside(&runtime, &sluiced, &node_dir, "bytes", &work)?;
    for source in [Source::Device, Source::PageCache] {
        let count = callgrind::per_read(&setup, source, (small, large))?;
        println!(
            "{}:\n  {:.0} instructions per read: ({} - {}) instructions / ({} - {}) reads{}\n  \
             {:.0} per read beside the block CRC32C; {:.3} heap allocations per batch ({} - {}); \
             {:.1} event-loop waits (epoll_wait) per batch",
            source.describe(),
            count.instructions_per_read,
            count.instructions_large,
            count.instructions_small,
            count.reads_large,
            count.reads_small,
            Profile::OF_THIS_BUILD.caveat(),
            count.instructions_per_read_beside_crc,
            count.allocations_per_batch,
            count.allocations_large,
            count.allocations_small,
            count.waits_per_batch,
        );
    }
    Ok(callgrind::counted_part(&work.join(callgrind::output_name(Source::Device, large, false))))
}

/// The workspace and its target directory (`CARGO_TARGET_DIR` if set).
fn workspace_and_target() -> Result<(PathBuf, PathBuf), String> {
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).parent().ok_or("no workspace")?.to_path_buf();
    let target = std::env::var_os("CARGO_TARGET_DIR").map(PathBuf::from).unwrap_or_else(|| workspace.join("target"));
    Ok((workspace, target))
}

/// The directory of `sluiced` and `sluicectl` as this build's profile
/// makes them, built first if missing.
fn built_binaries(workspace: &Path, target: &Path) -> Result<PathBuf, String> {
    let bin = target.join(Profile::OF_THIS_BUILD.directory());
    if !bin.join("sluiced").is_file() || !bin.join("sluicectl").is_file() {
        let mut build = cargo();
        build.args(["build", "-p", "sluice", "--bins"]).args(Profile::OF_THIS_BUILD.cargo_flag());
        output(build.current_dir(workspace))?;
    }
    Ok(bin)
}

/// Paths the suite works with.
struct Layout {
    workspace: PathBuf,
    target: PathBuf,
    out: PathBuf,
    work: PathBuf,
}

fn layout(short: bool, out: Option<PathBuf>) -> Result<Layout, String> {
    let (workspace, target) = workspace_and_target()?;
    let date = output(Command::new("date").arg("+%Y-%m-%d"))?.trim().to_string();
    let out = out.unwrap_or_else(|| {
        if short {
            target.join("bench-short")
        } else {
            workspace.join("bench").join("results").join(&date)
        }
    });
    // Absolute: the peers (nginx's prefix among them) are handed paths
    // inside it and run from other directories.
    let out = std::path::absolute(&out).map_err(|e| format!("{}: {e}", out.display()))?;
    let work = out.join("tmp");
    let _ = std::fs::remove_dir_all(&work);
    std::fs::create_dir_all(&work).map_err(|e| format!("{}: {e}", work.display()))?;
    // nginx's workers may run as another user: let them read the files.
    use std::os::unix::fs::PermissionsExt;
    for dir in [&out, &work] {
        let _ = std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755));
    }
    Ok(Layout { workspace, target, out, work })
}

/// Each peer's version, or which Debian package to install.
fn versions() -> Result<Vec<(String, String)>, String> {
    let probe = |program: &str, args: &[&str], package: &str| -> Result<(String, String), String> {
        let out = Command::new(program).args(args).output().map_err(|_| {
            format!("`{program}` is missing: install the Debian package {package} (scripts/test.sh does)")
        })?;
        let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        Ok((program.to_string(), text.lines().next().unwrap_or_default().trim().to_string()))
    };
    Ok(vec![
        probe("fio", &["--version"], "fio")?,
        probe("nbdkit", &["--version"], "nbdkit")?,
        probe("nginx", &["-v"], "nginx-light")?,
        probe("wrk", &["-v"], "wrk")?,
        probe("valgrind", &["--version"], "valgrind")?,
    ])
}

fn machine() -> Vec<(String, String)> {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model =
        cpuinfo.lines().find_map(|l| l.strip_prefix("model name")).map(|l| l.trim_start_matches([' ', '\t', ':']));
    let cores = cpuinfo.lines().filter(|l| l.starts_with("processor")).count();
    let mem = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let mem_kb = mem.lines().find_map(|l| l.strip_prefix("MemTotal:")).map(|l| l.trim().to_string());
    let kernel = output(Command::new("uname").arg("-sr")).unwrap_or_default();
    vec![
        ("CPU".into(), format!("{} ({cores} logical cores)", model.unwrap_or("unknown"))),
        ("memory".into(), mem_kb.unwrap_or_default()),
        ("kernel".into(), kernel.trim().to_string()),
    ]
}

fn write_random(path: &Path, bytes: u64) -> Result<(), String> {
    use std::io::Write;
    let mut file = std::fs::File::create(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut rng = <rand::rngs::StdRng as rand::SeedableRng>::seed_from_u64(bytes);
    let mut buf = vec![0u8; 4 << 20];
    let mut left = bytes;
    while left > 0 {
        let n = left.min(buf.len() as u64) as usize;
        rng.fill_bytes(&mut buf[..n]);
        file.write_all(&buf[..n]).map_err(|e| e.to_string())?;
        left -= n as u64;
    }
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o644)).map_err(|e| e.to_string())
}

fn sluicectl(bin: &Path, endpoint: &str, args: &[&str]) -> Result<String, String> {
    output(Command::new(bin.join("sluicectl")).args(["--endpoint", endpoint]).args(args))
}

/// The `bytes` dataset from `data.bin`; `tok16`/`tok32` from `tokens.bin`.
fn ingest(bin: &Path, endpoint: &str, work: &Path) -> Result<PathBuf, String> {
    for (name, kind, file) in
        [("bytes", "bytes", "data.bin"), ("tok16", "tokens:u16", "tokens.bin"), ("tok32", "tokens:u32", "tokens.bin")]
    {
        let path = work.join(file);
        sluicectl(bin, endpoint, &["dataset", "create", name, "--kind", kind])?;
        sluicectl(bin, endpoint, &["dataset", "ingest", name, &path.display().to_string()])?;
        sluicectl(bin, endpoint, &["dataset", "seal", name])?;
    }
    let stat: serde_json::Value =
        serde_json::from_str(&sluicectl(bin, endpoint, &["--json", "dataset", "stat", "bytes"])?)
            .map_err(|e| format!("dataset stat: {e}"))?;
    stat["namespace"]["path"]
        .as_str()
        .map(PathBuf::from)
        .ok_or_else(|| "the bytes dataset has no namespace path".into())
}

fn dataset_for(workload: Workload) -> &'static str {
    match workload {
        Workload::Windows { token_bytes: 2 } => "tok16",
        Workload::Windows { .. } => "tok32",
        _ => "bytes",
    }
}

fn file_for(workload: Workload) -> &'static str {
    if dataset_for(workload) == "bytes" {
        "data.bin"
    } else {
        "tokens.bin"
    }
}

fn warm(path: &Path) -> Result<(), String> {
    let mut file = std::fs::File::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
    std::io::copy(&mut file, &mut std::io::sink()).map(|_| ()).map_err(|e| e.to_string())
}

/// Reads every namespace file of the node over `node_dir`, so the page
/// cache holds them.
fn warm_namespaces(node_dir: &Path) -> Result<(), String> {
    for entry in std::fs::read_dir(node_dir.join("namespaces")).map_err(|e| e.to_string())?.flatten() {
        warm(&entry.path())?;
    }
    Ok(())
}

fn record(results: &mut Vec<Measurement>, outcome: Result<Measurement, String>, what: &str) -> Result<(), String> {
    let m = outcome.map_err(|e| format!("{what}: {e}"))?;
    println!(
        "  {:<34} {:<18} {:>10.0} IOPS {:>7.3} GB/s  p99 {:>8.0} us  errors {}",
        m.system, m.workload, m.iops, m.gb_per_s, m.latency_us_p99, m.errors
    );
    results.push(m);
    Ok(())
}

fn run_all(short: bool, seconds: Option<f64>, data_mib: Option<u64>, out: Option<PathBuf>) -> Result<PathBuf, String> {
    let seconds = seconds.unwrap_or(if short { 1.0 } else { 10.0 });
    let data_bytes = data_mib.unwrap_or(if short { 32 } else { DATA_MIB }) << 20;
    let versions = versions()?;
    let layout = layout(short, out)?;
    let bin = built_binaries(&layout.workspace, &layout.target)?;
    let work = &layout.work;
    println!(
        "preparing {} MiB of random bytes and {} MiB of tokens in {}",
        data_bytes >> 20,
        data_bytes >> 20,
        work.display()
    );
    write_random(&work.join("data.bin"), data_bytes)?;
    write_random(&work.join("tokens.bin"), data_bytes)?;
    // The sluice client runs on one worker thread, as `sluicectl bench read`
    // and the blocking (Python) client do: a connection's reader task then
    // wakes the batch it answers on its own thread, not another worker's.
    let runtime = sluicectl::api::runtime_with_workers(1).map_err(|e| e.to_string())?;
    let workloads = workload::ALL.to_vec();
    let mut results = Vec::new();
    let node_dir = work.join("node");

    // sluice over TCP, O_DIRECT, as a separate process.
    let (node, endpoint) = Server::sluiced(&[], &bin.join("sluiced"), &node_dir, "direct", &[])?;
    let namespace = ingest(&bin, &endpoint, work)?;
    for &w in &workloads {
        let cpu = || node.cpu_seconds();
        let m = runtime.block_on(runners::sluice("sluice TCP (O_DIRECT)", &endpoint, dataset_for(w), w, seconds, &cpu));
        record(&mut results, m, "sluice TCP (O_DIRECT)")?;
    }
    drop(node);

    // The same node through the page cache, warmed.
    let (node, endpoint) = Server::sluiced(&[], &bin.join("sluiced"), &node_dir, "buffered", &[])?;
    warm_namespaces(&node_dir)?;
    for &w in &workloads {
        let cpu = || node.cpu_seconds();
        let m =
            runtime.block_on(runners::sluice("sluice TCP (page cache)", &endpoint, dataset_for(w), w, seconds, &cpu));
        record(&mut results, m, "sluice TCP (page cache)")?;
    }
    drop(node);

    // Client and node in one process.
    let config = NodeConfig {
        data_dir: node_dir.clone(),
        listen: "127.0.0.1:0".parse().map_err(|_| "address")?,
        control: "127.0.0.1:0".parse().map_err(|_| "address")?,
        insecure: true,
        ..NodeConfig::default()
    };
    let in_process = runtime.block_on(Node::start(config)).map_err(|e| format!("in-process node: {e}"))?;
    let endpoint = in_process.control_url();
    for &w in &workloads {
        let me = std::process::id();
        let cpu = move || cpu_seconds_of(me);
        let m = runtime.block_on(runners::sluice("sluice in-process", &endpoint, dataset_for(w), w, seconds, &cpu));
        record(&mut results, m, "sluice in-process")?;
    }
    runtime.block_on(in_process.shutdown());

    // The local limit: fio on the very namespace file sluice serves.
    for &w in workloads.iter().filter(|w| w.block_shaped() && !w.sluice_only()) {
        let target = FioTarget::File { path: &namespace, direct: true };
        record(&mut results, runners::fio(DEVICE_LIMIT, target, data_bytes, w, seconds, None, FioQueue::Free), "fio")?;
    }
    // The same reads issued locally as sluice's client issues them: whole
    // batches, each waited for whole.
    for &w in workloads.iter().filter(|w| w.batched_random()) {
        let target = FioTarget::File { path: &namespace, direct: true };
        let m = runners::fio(BATCHED_LIMIT, target, data_bytes, w, seconds, None, FioQueue::SluiceBatches);
        record(&mut results, m, "fio (sluice's batches)")?;
    }

    // A network block peer: nbdkit serving the file, fio's nbd engine.
    warm(&work.join("data.bin"))?;
    let port = free_port()?;
    let nbd = Server::spawn(
        "nbdkit",
        Command::new("nbdkit")
            .args(["--foreground", "--readonly", "-i", "127.0.0.1", "-p", &port.to_string(), "file"])
            .arg(format!("file={}", work.join("data.bin").display())),
    )?;
    wait_port(port, Duration::from_secs(10))?;
    let uri = format!("nbd://127.0.0.1:{port}");
    for &w in workloads.iter().filter(|w| w.block_shaped() && !w.sluice_only()) {
        let cpu = || nbd.cpu_seconds();
        let target = FioTarget::Nbd { uri: &uri };
        let m = runners::fio("nbdkit + fio nbd", target, data_bytes, w, seconds, Some(&cpu), FioQueue::Free);
        record(&mut results, m, "nbd")?;
    }
    drop(nbd);

    // An object-store-style peer: nginx serving range requests.
    warm(&work.join("tokens.bin"))?;
    let port = free_port()?;
    let conf = work.join("nginx.conf");
    let user = if nix::unistd::geteuid().is_root() { "user root;\n" } else { "" };
    std::fs::write(
        &conf,
        format!(
            "{user}daemon off;\nworker_processes 2;\npid {work}/nginx.pid;\nerror_log {work}/nginx.err warn;\n\
             events {{ worker_connections 4096; }}\n\
             http {{ access_log off; sendfile on; tcp_nopush on; keepalive_requests 100000000;\n\
               client_body_temp_path {work}; proxy_temp_path {work}; fastcgi_temp_path {work};\n\
               uwsgi_temp_path {work}; scgi_temp_path {work};\n\
               server {{ listen 127.0.0.1:{port}; root {work}; }} }}\n",
            work = work.display()
        ),
    )
    .map_err(|e| e.to_string())?;
    let nginx = Server::spawn(
        "nginx",
        Command::new("nginx").arg("-c").arg(&conf).arg("-p").arg(work).arg("-e").arg(work.join("nginx.err")),
    )?;
    wait_port(port, Duration::from_secs(10))?;
    for &w in workloads.iter().filter(|w| !w.sluice_only()) {
        let cpu = || nginx.cpu_seconds();
        let url = format!("http://127.0.0.1:{port}/{}", file_for(w));
        record(
            &mut results,
            runners::wrk("nginx + wrk (HTTP ranges)", &url, data_bytes, w, seconds, work, &cpu),
            "nginx",
        )?;
    }
    drop(nginx);

    println!("counting instructions per read under callgrind");
    let batches = if short { (20, 60) } else { (200, 1000) };
    let sluiced = bin.join("sluiced");
    let (instructions, instructions_page_cache) =
        match CountSetup::keep_aside(&runtime, &sluiced, &node_dir, "bytes", work) {
            Ok(setup) => (
                callgrind::per_read(&setup, Source::Device, batches),
                callgrind::per_read(&setup, Source::PageCache, batches),
            ),
            Err(why) => (Err(why.clone()), Err(why)),
        };
    for why in [&instructions, &instructions_page_cache].into_iter().filter_map(|count| count.as_ref().err()) {
        eprintln!("callgrind: {why}");
    }
    println!("running the hot-path microbenchmarks");
    let micro = microbenchmarks(&layout, short);

    let run = Run {
        title: format!(
            "sluice benchmark suite{}{}",
            if short { " (short run: a smoke test, not figures)" } else { "" },
            Profile::OF_THIS_BUILD.caveat()
        ),
        machine: machine(),
        versions,
        setup: vec![
            format!(
                "{} MiB of random bytes (`bytes` dataset) and {} MiB of tokens (`tok16`, `tok32`)",
                data_bytes >> 20,
                data_bytes >> 20
            ),
            format!("{seconds} s per system and workload, all on loopback; one node with the default cores"),
            format!(
                "command: `cargo run -p bench{} -- all{}`",
                Profile::OF_THIS_BUILD.cargo_flag().map(|flag| format!(" {flag}")).unwrap_or_default(),
                if short { " --short" } else { "" }
            ),
        ],
        workloads,
        measurements: results,
        instructions,
        instructions_page_cache,
        micro,
    };
    std::fs::write(layout.out.join("report.md"), report::markdown(&run)).map_err(|e| e.to_string())?;
    let json = serde_json::json!({
        "measurements": run.measurements,
        "instructions": run.instructions.as_ref().ok(),
        "instructions_page_cache": run.instructions_page_cache.as_ref().ok(),
    });
    std::fs::write(layout.out.join("results.json"), serde_json::to_string_pretty(&json).map_err(|e| e.to_string())?)
        .map_err(|e| e.to_string())?;
    report::plots(&run, &layout.out)?;
    let _ = std::fs::remove_dir_all(work);
    Ok(layout.out.join("report.md"))
}

/// The Cargo profile this program was built with; the node's binaries and
/// the microbenchmarks are taken from the same one. Figures come from
/// `--release`; CI's short run is built with the dev profile (as its tests
/// are), so that it proves the suite works without a second optimized
/// build of the whole workspace.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Profile {
    Release,
    Dev,
}

impl Profile {
    const OF_THIS_BUILD: Self = if cfg!(debug_assertions) { Self::Dev } else { Self::Release };

    /// Its directory under `target/`.
    fn directory(self) -> &'static str {
        match self {
            Self::Release => "release",
            Self::Dev => "debug",
        }
    }

    fn cargo_flag(self) -> Option<&'static str> {
        (self == Self::Release).then_some("--release")
    }

    /// What the report's title says of figures from this build.
    fn caveat(self) -> &'static str {
        match self {
            Self::Release => "",
            Self::Dev => " (dev build: not the node's speed)",
        }
    }
}

/// Runs the criterion benches and reads back their mean estimates.
fn microbenchmarks(layout: &Layout, short: bool) -> Result<Vec<(String, f64)>, String> {
    let mut command = cargo();
    command.args(["bench", "-p", "bench", "--bench", "hot_path"]).current_dir(&layout.workspace);
    if Profile::OF_THIS_BUILD == Profile::Dev {
        command.args(["--profile", "dev"]);
    }
    if cfg!(feature = "rdma") {
        command.args(["--features", "rdma"]);
    }
    command.arg("--");
    if short {
        command.args(["--warm-up-time", "0.2", "--measurement-time", "0.5"]);
    }
    let root = layout.target.join("criterion");
    // Only this run's estimates may reach the report.
    let _ = std::fs::remove_dir_all(&root);
    output(&mut command)?;
    let mut rows = Vec::new();
    for group in std::fs::read_dir(&root).map_err(|e| format!("{}: {e}", root.display()))?.flatten() {
        for bench in std::fs::read_dir(group.path()).into_iter().flatten().flatten() {
            let estimates = bench.path().join("new").join("estimates.json");
            let Ok(text) = std::fs::read_to_string(&estimates) else { continue };
            let value: serde_json::Value = serde_json::from_str(&text).map_err(|e| e.to_string())?;
            if let Some(ns) = value["mean"]["point_estimate"].as_f64() {
                rows.push((
                    format!("{}/{}", group.file_name().to_string_lossy(), bench.file_name().to_string_lossy()),
                    ns,
                ));
            }
        }
    }
    rows.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(rows)
}
