//! `sluice`: the embedded demo. `sluice quickstart` starts a node in a local
//! data directory, makes (or ingests) a token dataset, reads random token
//! windows from it through the client over TCP, and reports what it saw.

use std::io::Read;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::{Parser, Subcommand};
use indicatif::{ProgressBar, ProgressStyle};
use rand::{Rng, SeedableRng};
use sluice::{Node, NodeConfig};
use sluice_client::{Client, RangeStatus, ReadRange};
use sluice_control::ingest::IngestFormat;
use sluice_control::{DatasetKind, DatasetState};
use sluicectl::readbench::{self, BenchParams, ReadPattern};

const DEMO_DATASET: &str = "quickstart-tokens";
/// GPT-2's vocabulary size: the demo's tokens look like a real u16 stream.
const DEMO_VOCAB: u32 = 50_257;

#[derive(Parser, Debug)]
#[command(name = "sluice", version, about = "sluice: training data from NVMe at device speed")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Start an embedded node, make a token dataset, read random windows.
    Quickstart(QuickstartArgs),
}

#[derive(clap::Args, Debug)]
struct QuickstartArgs {
    /// Where the node keeps its catalog and namespaces.
    #[arg(long, default_value = "quickstart-data")]
    data_dir: PathBuf,
    /// A token file to ingest instead of the generated one (.bin or .npy).
    #[arg(long)]
    input: Option<PathBuf>,
    /// Kind of --input: tokens:u16 or tokens:u32.
    #[arg(long, default_value = "tokens:u16")]
    kind: String,
    /// Size of the generated dataset.
    #[arg(long, default_value_t = 256)]
    size_mib: u64,
    /// Tokens per window.
    #[arg(long, default_value_t = 1024)]
    window: u32,
    /// Windows per batch.
    #[arg(long, default_value_t = 64)]
    batch: usize,
    /// Batches in flight.
    #[arg(long, default_value_t = 4)]
    inflight: usize,
    #[arg(long, default_value_t = 5.0)]
    seconds: f64,
}

fn main() -> ExitCode {
    // The NVMe admin helper a `--user` node starts is this executable too.
    if let Some(exit) = sluice::admin_helper::serve_if_asked() {
        return exit;
    }
    // The embedded node's files are its own, as sluiced's are.
    nix::sys::stat::umask(nix::sys::stat::Mode::from_bits_truncate(0o077));
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_env("SLUICE_LOG").unwrap_or_else(|_| "warn".into()))
        .with_writer(std::io::stderr)
        .init();
    let Command::Quickstart(args) = Cli::parse().command;
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(err) => {
            eprintln!("sluice: runtime: {err}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(quickstart(args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("sluice quickstart: {err}");
            ExitCode::FAILURE
        }
    }
}

async fn quickstart(args: QuickstartArgs) -> Result<(), String> {
    let kind: DatasetKind = args.kind.parse()?;
    let config = NodeConfig {
        data_dir: args.data_dir.clone(),
        listen: "127.0.0.1:0".parse().map_err(|e| format!("{e}"))?,
        control: "127.0.0.1:0".parse().map_err(|e| format!("{e}"))?,
        ..NodeConfig::default()
    };
    let node = Node::start(config).await.map_err(|e| e.to_string())?;
    sluicectl::outln!("node up: control API {} , data plane tcp {}", node.control_url(), node.data_addr);
    sluicectl::outln!("  {}", node.describe());
    let outcome = run_demo(&node, &args, kind).await;
    node.shutdown().await;
    sluicectl::outln!("node stopped cleanly");
    outcome
}

async fn run_demo(node: &Node, args: &QuickstartArgs, kind: DatasetKind) -> Result<(), String> {
    let name = match &args.input {
        Some(path) => {
            let stem = path.file_stem().and_then(|s| s.to_str()).unwrap_or("input");
            let name: String =
                stem.chars().map(|c| if c.is_ascii_alphanumeric() || c == '-' { c } else { '-' }).collect();
            prepare(node, &name, kind, Source::File(path.clone())).await?;
            name
        }
        None => {
            prepare(node, DEMO_DATASET, DatasetKind::TokensU16, Source::Generated(args.size_mib << 20)).await?;
            DEMO_DATASET.to_string()
        }
    };
    let record = node.control.get(&name).map_err(|e| e.to_string())?;
    let token_bytes = record.kind.element_size_bytes();
    let window_bytes = u64::from(args.window) * token_bytes;
    sluicectl::outln!(
        "dataset {name}: {} tokens ({} MiB, {}), {}",
        record.length_bytes / token_bytes,
        record.length_bytes >> 20,
        record.kind,
        record.content_hash.as_deref().unwrap_or("-")
    );

    // Reads need a grant, as on any node: the demo issues itself one.
    let grant = node.control.issue_grant(&name, "quickstart", None, None).map_err(|e| e.to_string())?;
    sluicectl::outln!("granted {name} to client \"quickstart\" (grant {})", grant.id);
    let client = Client::connect(&node.control_url()).await.map_err(|e| e.to_string())?;
    let options = sluice_client::OpenOptions { token: grant.token.map(|t| t.into_inner()), ..Default::default() };
    let dataset = Arc::new(client.open_with(&name, options).await.map_err(|e| e.to_string())?);
    check_windows(&dataset, &record.namespace, window_bytes, token_bytes).await?;

    sluicectl::outln!(
        "reading random {}-token windows over {}: batches of {}, {} in flight, {:.0} s",
        args.window,
        client.transport(),
        args.batch,
        args.inflight,
        args.seconds
    );
    let params = BenchParams {
        size_bytes: u32::try_from(window_bytes).map_err(|_| "window too large".to_string())?,
        batch: args.batch.max(1),
        inflight: args.inflight.max(1),
        duration: Duration::from_secs_f64(args.seconds.max(0.5)),
        align_bytes: token_bytes,
        seed: 42,
        pattern: ReadPattern::Random,
        batches_per_worker: None,
        verify_against: None,
    };
    let report = readbench::run(Arc::clone(&dataset), params).await.map_err(|e| e.to_string())?;
    sluicectl::outln!(
        "{:.0} windows/s = {:.1} M tokens/s = {:.0} MB/s",
        report.iops,
        report.iops * f64::from(args.window) / 1e6,
        report.gb_per_s * 1e3
    );
    sluicectl::out!("{}", report.render());
    // The demo's grant ends with the demo, so reruns do not pile them up.
    node.control.revoke_grant(grant.id).map_err(|e| e.to_string())?;
    Ok(())
}

/// Reads 256 random windows through the client and compares them with the
/// namespace's bytes read directly, so the demo proves what it serves.
async fn check_windows(
    dataset: &sluice_client::Dataset,
    namespace: &sluice_control::NamespaceRecord,
    window_bytes: u64,
    token_bytes: u64,
) -> Result<(), String> {
    let mut rng = rand::rngs::SmallRng::seed_from_u64(7);
    let starts = (dataset.len_bytes() - window_bytes) / token_bytes;
    let ranges: Vec<ReadRange> = (0..256u64)
        .map(|i| ReadRange {
            offset: rng.gen_range(0..=starts) * token_bytes,
            len: window_bytes as u32,
            dest: i * window_bytes,
        })
        .collect();
    let mut buf = vec![0u8; (window_bytes * 256) as usize];
    let statuses = dataset.read_batch(&ranges, &mut buf).await.map_err(|e| e.to_string())?;
    if statuses.iter().any(|s| *s != RangeStatus::Ok) {
        return Err(format!("a window failed: {statuses:?}"));
    }
    if namespace.kind == sluice_proto::api::NamespaceKind::File {
        let file = std::fs::File::open(&namespace.path).map_err(|e| e.to_string())?;
        let mut expected = vec![0u8; window_bytes as usize];
        for range in &ranges {
            file.read_exact_at(&mut expected, namespace.base_offset_bytes + range.offset).map_err(|e| e.to_string())?;
            let got = &buf[range.dest as usize..(range.dest + window_bytes) as usize];
            if got != expected.as_slice() {
                return Err(format!("window at byte {} differs from the namespace", range.offset));
            }
        }
        sluicectl::outln!("checked 256 random windows byte-exact against the namespace file");
    }
    Ok(())
}

enum Source {
    Generated(u64),
    File(PathBuf),
}

/// Makes sure `name` exists and is sealed, reusing a sealed one.
async fn prepare(node: &Node, name: &str, kind: DatasetKind, source: Source) -> Result<(), String> {
    let control = Arc::clone(&node.control);
    if let Ok(record) = control.get(name) {
        if record.state == DatasetState::Sealed {
            sluicectl::outln!("reusing sealed dataset {name}");
            return Ok(());
        }
        sluicectl::outln!("dataset {name} was left {:?}; starting it over", record.state);
        control.delete(name).await.map_err(|e| e.to_string())?;
    }
    let name = name.to_string();
    tokio::task::spawn_blocking(move || -> Result<(), String> {
        control.create(&name, kind).map_err(|e| e.to_string())?;
        match source {
            Source::Generated(bytes) => generate(&control, &name, bytes)?,
            Source::File(path) => ingest_file(&control, &name, &path)?,
        }
        let started = std::time::Instant::now();
        let record = control.seal(&name).map_err(|e| e.to_string())?;
        sluicectl::outln!(
            "sealed {name} in {:.1} s: every chunk verified, content hash computed",
            started.elapsed().as_secs_f64()
        );
        let _ = record;
        Ok(())
    })
    .await
    .map_err(|e| e.to_string())?
}

fn progress(total: u64, message: &str) -> ProgressBar {
    let bar = ProgressBar::new(total);
    bar.set_style(
        ProgressStyle::with_template("{msg} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec}")
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
    );
    bar.set_message(message.to_string());
    bar
}

/// Writes `bytes` of skewed (Zipf-like) u16 tokens from a fixed seed.
fn generate(control: &sluice_control::ControlPlane, name: &str, bytes: u64) -> Result<(), String> {
    sluicectl::outln!("generating {} MiB of synthetic u16 tokens (vocabulary {DEMO_VOCAB})", bytes >> 20);
    let mut session = control.begin_ingest(name, IngestFormat::Raw).map_err(|e| e.to_string())?;
    let mut rng = rand::rngs::SmallRng::seed_from_u64(0x51u64);
    let bar = progress(bytes, "generating");
    let mut piece = vec![0u8; 4 << 20];
    let mut done = 0u64;
    while done < bytes {
        let len = ((bytes - done) as usize).min(piece.len()) & !1;
        for pair in piece[..len].chunks_exact_mut(2) {
            let u: f64 = rng.gen();
            let token = ((u * u * u) * f64::from(DEMO_VOCAB)) as u16;
            pair.copy_from_slice(&token.to_le_bytes());
        }
        session.push(&piece[..len]).map_err(|e| e.to_string())?;
        done += len as u64;
        bar.set_position(done);
        if len == 0 {
            break;
        }
    }
    bar.finish_and_clear();
    session.finish().map_err(|e| e.to_string())?;
    Ok(())
}

fn ingest_file(control: &sluice_control::ControlPlane, name: &str, path: &std::path::Path) -> Result<(), String> {
    let npy = path.extension().is_some_and(|e| e.eq_ignore_ascii_case("npy"));
    let format = if npy { IngestFormat::Npy } else { IngestFormat::Raw };
    let mut file = std::fs::File::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let size = file.metadata().map(|m| m.len()).unwrap_or(0);
    let mut session = control.begin_ingest(name, format).map_err(|e| e.to_string())?;
    let bar = progress(size, &path.display().to_string());
    let mut piece = vec![0u8; 4 << 20];
    loop {
        let n = file.read(&mut piece).map_err(|e| format!("{}: {e}", path.display()))?;
        if n == 0 {
            break;
        }
        session.push(&piece[..n]).map_err(|e| e.to_string())?;
        bar.inc(n as u64);
    }
    bar.finish_and_clear();
    let appended = session.finish().map_err(|e| e.to_string())?;
    sluicectl::outln!("ingested {}: {} bytes", path.display(), appended.data_bytes);
    Ok(())
}
