//! `sluicectl`: operate a sluice node through its control API.

use std::fs::File;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::{Parser, Subcommand, ValueEnum};
use indicatif::{ProgressBar, ProgressStyle};
use serde_json::Value;
use sluice::readbench::{self, BenchParams, ReadPattern};
use sluice_client::http::ControlHttp;
use sluice_client::{Client, RangeStatus, ReadRange};
use sluice_control::ingest::Appended;
use sluice_control::{npy, DatasetKind, DatasetRecord, DatasetState};

// No `Debug`: the options hold tokens.
#[derive(Parser)]
#[command(name = "sluicectl", version, about = "Operate a sluice node")]
struct Cli {
    /// Control API of the node.
    #[arg(long, global = true, env = "SLUICE_ENDPOINT", default_value = "http://127.0.0.1:7070")]
    endpoint: String,
    /// Print machine-readable JSON.
    #[arg(long, global = true)]
    json: bool,
    /// Access grant token for reads (`grant create` prints one), or @FILE
    /// to read it from a file (so it stays out of `ps`).
    #[arg(long, global = true, env = "SLUICE_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// Operator token for administrative calls, or @FILE.
    #[arg(long, global = true, env = "SLUICE_ADMIN_TOKEN", hide_env_values = true)]
    admin_token: Option<String>,
    /// A file holding the operator token (the node's DATA_DIR/admin.token,
    /// or a line of its --admin-tokens file).
    #[arg(long, global = true, value_name = "FILE", conflicts_with = "admin_token")]
    admin_token_file: Option<PathBuf>,
    /// CA certificate (PEM) the node's TLS certificate chains to, for
    /// https:// endpoints and TLS data ports.
    #[arg(long, global = true, env = "SLUICE_CA_FILE", value_name = "FILE")]
    ca_file: Option<PathBuf>,
    /// This client's certificate (PEM), for mTLS.
    #[arg(long, global = true, env = "SLUICE_CERT_FILE", value_name = "FILE", requires = "key")]
    cert: Option<PathBuf>,
    /// The key (PEM) of --cert.
    #[arg(long, global = true, env = "SLUICE_KEY_FILE", value_name = "FILE", requires = "cert")]
    key: Option<PathBuf>,
    /// Transport for reads (`read`, `bench read`, `replay`): auto picks RDMA
    /// when this host has a device and the node an RDMA endpoint, else TCP.
    #[arg(long, global = true, env = "SLUICE_TRANSPORT", default_value = "auto", value_parser = ["auto", "rdma", "tcp"])]
    transport: String,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Create, ingest, seal, list, inspect and delete datasets.
    #[command(subcommand)]
    Dataset(DatasetCommand),
    /// Issue, list and revoke access grants (a token per client and dataset).
    #[command(subcommand)]
    Grant(GrantCommand),
    /// The lane-steering policy (eBPF): show it, swap it at run time, or
    /// unload it so the batch-size threshold decides.
    #[command(subcommand)]
    Policy(PolicyCommand),
    /// Where datasets live: namespace devices and the data directory.
    #[command(subcommand)]
    Devices(ListCommand),
    /// Each dataset's namespace: kind, path, offset, length and why there.
    #[command(subcommand)]
    Namespaces(ListCommand),
    /// Files no record owns, quarantined in DATA_DIR/orphans/: list them,
    /// or delete them all.
    #[command(subcommand)]
    Orphans(OrphansCommand),
    /// The cluster (nodes sharing a catalog in etcd): live members and each
    /// dataset's placement and copies.
    Cluster,
    /// Read one byte range of a sealed dataset to stdout or a file.
    Read {
        name: String,
        #[arg(long)]
        offset: u64,
        #[arg(long)]
        len: u64,
        #[arg(short = 'o', long)]
        output: Option<PathBuf>,
    },
    /// Benchmarks.
    #[command(subcommand)]
    Bench(BenchCommand),
    /// Live small-read traffic from the node's eBPF probes (a terminal UI on
    /// a terminal; text when piped or with --once).
    Top {
        /// Print one snapshot and exit.
        #[arg(long)]
        once: bool,
        /// Seconds between refreshes.
        #[arg(long, default_value_t = 1.0)]
        interval: f64,
    },
    /// Read every chunk of a sealed dataset through the data plane and check
    /// it against the manifest; exits 1 if any chunk is bad.
    Scrub { name: String },
    /// List (and dump) the exact samples of one training step from a saved
    /// sampler state: the record-of-death workflow.
    Replay {
        /// Sampler state saved by a loader (binary or JSON).
        #[arg(long)]
        state: PathBuf,
        /// Global step, counted from the start of training.
        #[arg(long)]
        step: u64,
        /// Overrides the global batch size recorded in the state.
        #[arg(long)]
        global_batch: Option<u64>,
        /// Write each sample's bytes to DIR/step<K>-<position>.bin.
        #[arg(long)]
        dump: Option<PathBuf>,
    },
}

#[derive(Subcommand, Debug)]
enum DatasetCommand {
    Create {
        name: String,
        /// bytes, tokens:u16, tokens:u32, records or wds
        #[arg(long)]
        kind: String,
        /// For `records`: every record has this many bytes (no index file).
        #[arg(long)]
        record_size: Option<u64>,
        /// Bytes it will hold: the node places it on a namespace that holds
        /// them (the smallest such), else in a file.
        #[arg(long, value_name = "BYTES")]
        size: Option<u64>,
    },
    /// Append files (raw, .npy arrays, or tar shards for wds) in order.
    Ingest {
        name: String,
        #[arg(required = true)]
        files: Vec<PathBuf>,
        #[arg(long, value_enum, default_value_t = Format::Auto)]
        format: Format,
        /// For `records` with variable sizes: the offsets (n + 1 little-endian
        /// u64, raw or .npy) of the records of the one FILE given.
        #[arg(long)]
        index: Option<PathBuf>,
    },
    /// Verify and freeze a dataset; it is served from then on.
    Seal {
        name: String,
    },
    Ls,
    Stat {
        name: String,
    },
    Rm {
        name: String,
    },
}

#[derive(Subcommand, Debug)]
enum ListCommand {
    Ls,
}

#[derive(Subcommand, Debug)]
enum OrphansCommand {
    Ls,
    /// Deletes every quarantined file (the node never does on its own).
    Purge,
}

#[derive(Subcommand, Debug)]
enum GrantCommand {
    /// Issue a grant of DATASET to a client; prints its token once.
    Create {
        dataset: String,
        /// Who the grant is for (job, host or service identity).
        #[arg(long)]
        client: String,
        /// Bind the grant to the client certificate with this CN (mTLS):
        /// its token then opens only from a connection presenting it.
        #[arg(long, value_name = "CN")]
        cert_name: Option<String>,
    },
    Ls,
    /// Revoke a grant: new opens fail and open sessions are closed.
    Revoke {
        id: u64,
    },
}

#[derive(Subcommand, Debug)]
enum PolicyCommand {
    /// The policy attached now, flows per decision, connections per worker.
    Show,
    /// Swap in a policy: a BPF object (clang -target bpf) with a uprobe
    /// `lane_policy` and the maps of ebpf/include/sluice_steer.h.
    Load { object: PathBuf },
    /// Detach the policy and forget its decisions.
    Unload,
}

#[derive(Subcommand, Debug)]
enum BenchCommand {
    /// Random reads through the client, as a training job would issue them.
    Read {
        name: String,
        /// Bytes per read.
        #[arg(long, default_value_t = 4096)]
        size: u32,
        /// Reads per batch.
        #[arg(long, default_value_t = 32)]
        batch: usize,
        /// Batches in flight (queue depth = batch x inflight).
        #[arg(long, default_value_t = 1)]
        inflight: usize,
        #[arg(long, default_value_t = 10.0)]
        seconds: f64,
        /// Offsets are multiples of this; 1 for unaligned reads.
        #[arg(long, default_value_t = 4096)]
        align: u64,
        /// Read consecutive ranges (each batch in flight walks on from its
        /// own start) instead of random ones.
        #[arg(long)]
        sequential: bool,
        /// A local copy of the dataset: check every read's bytes against it
        /// and count mismatches (`mismatched_ranges`).
        #[arg(long, value_name = "FILE")]
        verify: Option<PathBuf>,
    },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Format {
    Auto,
    Raw,
    Npy,
}

type Result<T> = std::result::Result<T, String>;

fn main() -> ExitCode {
    // Warnings (such as a fallback from RDMA to TCP) go to stderr;
    // SLUICE_LOG=debug shows more.
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_env("SLUICE_LOG").unwrap_or_else(|_| "warn".into()))
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    match run(&cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("sluicectl: {message}");
            ExitCode::FAILURE
        }
    }
}

/// A secret given on the command line or in the environment: the value
/// itself, or `@FILE` for the first line of FILE.
fn secret(given: Option<&str>, file: Option<&Path>) -> Result<Option<String>> {
    let read = |path: &Path| -> Result<String> {
        let text = std::fs::read_to_string(path).map_err(|e| format!("reading {}: {e}", path.display()))?;
        let line = text.lines().map(str::trim).find(|l| !l.is_empty() && !l.starts_with('#'));
        line.map(str::to_string).ok_or_else(|| format!("{} holds no token", path.display()))
    };
    match (given, file) {
        (_, Some(path)) => read(path).map(Some),
        (Some(value), None) => match value.strip_prefix('@') {
            Some(path) => read(Path::new(path)).map(Some),
            None => Ok(Some(value.to_string()).filter(|v| !v.is_empty())),
        },
        (None, None) => Ok(None),
    }
}

fn run(cli: &Cli) -> Result<()> {
    let token = secret(cli.token.as_deref(), None)?;
    let admin_token = secret(cli.admin_token.as_deref(), cli.admin_token_file.as_deref())?;
    let tls_files =
        sluice_client::ClientTlsFiles { ca: cli.ca_file.clone(), identity: cli.cert.clone().zip(cli.key.clone()) };
    // Operator calls carry the operator token; a reader's calls (a
    // dataset's record, its index and chunks) the grant's.
    let http = ControlHttp::new(&cli.endpoint, &tls_files)
        .map_err(|e| e.to_string())?
        .with_bearer(admin_token.as_deref().or(token.as_deref()));
    let api = Api { http, token, tls_files, transport: cli.transport.parse()? };
    match &cli.command {
        Command::Dataset(command) => dataset(&api, cli.json, command),
        Command::Grant(command) => grant(&api, cli.json, command),
        Command::Policy(command) => policy(&api, cli.json, command),
        Command::Devices(ListCommand::Ls) => devices(&api, cli.json),
        Command::Namespaces(ListCommand::Ls) => namespaces(&api, cli.json),
        Command::Orphans(command) => orphans(&api, cli.json, command),
        Command::Cluster => cluster(&api, cli.json),
        Command::Read { name, offset, len, output } => read(&api, name, *offset, *len, output.as_deref()),
        Command::Scrub { name } => scrub(&api, name, cli.json),
        Command::Top { once, interval } => top(&api, *once, *interval, cli.json),
        Command::Replay { state, step, global_batch, dump } => {
            replay(&api, state, *step, *global_batch, dump.as_deref(), cli.json)
        }
        Command::Bench(BenchCommand::Read { name, size, batch, inflight, seconds, align, sequential, verify }) => {
            let verify_against = match verify {
                Some(path) => Some(Arc::new(std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?)),
                None => None,
            };
            let params = BenchParams {
                size_bytes: *size,
                batch: (*batch).max(1),
                inflight: (*inflight).max(1),
                duration: Duration::from_secs_f64(seconds.max(0.1)),
                align_bytes: *align,
                seed: 0x5eed,
                pattern: if *sequential { ReadPattern::Sequential } else { ReadPattern::Random },
                batches_per_worker: None,
                verify_against,
            };
            bench_read(&api, name, params, cli.json)
        }
    }
}

struct Api {
    http: ControlHttp,
    /// The grant token reads open datasets with.
    token: Option<String>,
    tls_files: sluice_client::ClientTlsFiles,
    transport: sluice_client::TransportChoice,
}

impl Api {
    async fn connect(&self) -> Result<Client> {
        Client::connect_tls(self.http.endpoint(), self.transport, self.tls_files.clone())
            .await
            .map_err(|e| e.to_string())
    }

    fn open_options(&self) -> sluice_client::OpenOptions {
        sluice_client::OpenOptions { token: self.token.clone(), ..Default::default() }
    }

    fn call(&self, request: std::result::Result<ureq::Response, ureq::Error>) -> Result<ureq::Response> {
        self.http.call(request).map_err(|e| e.to_string())
    }

    fn get_json<T: serde::de::DeserializeOwned>(&self, path: &str) -> Result<T> {
        self.http.get_json(path).map_err(|e| e.to_string())
    }

    fn request(&self, method: &str, path: &str) -> ureq::Request {
        self.http.request(method, path)
    }
}

fn devices(api: &Api, json: bool) -> Result<()> {
    let devices: Vec<sluice_control::DeviceReport> = api.get_json("/v1/devices")?;
    if json {
        println!("{}", serde_json::to_string(&devices).map_err(|e| e.to_string())?);
        return Ok(());
    }
    println!("{:<15} {:<40} {:>16} {:>16}  DATASETS", "KIND", "PATH", "CAPACITY", "USED");
    for d in devices {
        println!(
            "{:<15} {:<40} {:>16} {:>16}  {}",
            d.kind,
            d.path,
            d.capacity_bytes,
            d.used_bytes,
            if d.datasets.is_empty() { "-".to_string() } else { d.datasets.join(",") }
        );
    }
    Ok(())
}

fn orphans(api: &Api, json: bool, command: &OrphansCommand) -> Result<()> {
    let answer: Value = match command {
        OrphansCommand::Ls => api.get_json("/v1/orphans")?,
        OrphansCommand::Purge => {
            api.call(api.request("DELETE", "/v1/orphans").call())?.into_json().map_err(|e| e.to_string())?
        }
    };
    if json {
        println!("{answer}");
        return Ok(());
    }
    match command {
        OrphansCommand::Ls => {
            for file in answer.as_array().into_iter().flatten() {
                println!("{:>16}  {}", file["bytes"], file["path"].as_str().unwrap_or(""));
            }
        }
        OrphansCommand::Purge => println!("purged {} files, {} bytes", answer["files"], answer["bytes"]),
    }
    Ok(())
}

fn cluster(api: &Api, json: bool) -> Result<()> {
    let status: sluice_control::ClusterStatus = api.get_json("/v1/cluster")?;
    if json {
        println!("{}", serde_json::to_string(&status).map_err(|e| e.to_string())?);
        return Ok(());
    }
    if status.node.is_empty() {
        println!("a single node (catalog: {}); start nodes with --etcd to form a cluster", status.catalog);
        return Ok(());
    }
    println!("node {} ; catalog {} ; {} copies per dataset", status.node, status.catalog, status.replication);
    println!("{:<20} {:<32} DATA", "MEMBER", "CONTROL");
    for m in &status.members {
        println!("{:<20} {:<32} {}", m.node, m.control_endpoint, m.data_addr);
    }
    println!("{:<32} {:<10} {:<24} COPIES (node:ready/syncing, * = not live)", "DATASET", "STATE", "PLACEMENT");
    for d in &status.datasets {
        let copies: Vec<String> = d
            .copies
            .iter()
            .map(|c| {
                format!("{}:{}{}", c.node, if c.ready { "ready" } else { "syncing" }, if c.live { "" } else { "*" })
            })
            .collect();
        println!("{:<32} {:<10} {:<24} {}", d.name, d.state.to_string(), d.placement.join(","), copies.join(" "));
    }
    Ok(())
}

fn namespaces(api: &Api, json: bool) -> Result<()> {
    let records: Vec<DatasetRecord> = api.get_json("/v1/datasets")?;
    if json {
        let rows: Vec<Value> = records
            .iter()
            .map(|r| serde_json::json!({ "dataset": r.name, "length_bytes": r.length_bytes, "namespace": r.namespace }))
            .collect();
        println!("{}", Value::Array(rows));
        return Ok(());
    }
    println!("{:<32} {:<7} {:<40} {:>12} {:>16}  REASON", "DATASET", "KIND", "PATH", "OFFSET", "BYTES");
    for r in records {
        println!(
            "{:<32} {:<7} {:<40} {:>12} {:>16}  {}",
            r.name,
            r.namespace.kind,
            r.namespace.path,
            r.namespace.base_offset_bytes,
            r.length_bytes,
            r.namespace.reason
        );
    }
    Ok(())
}

fn policy(api: &Api, json: bool, command: &PolicyCommand) -> Result<()> {
    let answer: Value = match command {
        PolicyCommand::Show => api.get_json("/v1/policy")?,
        PolicyCommand::Load { object } => {
            let bytes = std::fs::read(object).map_err(|e| format!("{}: {e}", object.display()))?;
            let name = object.file_name().map_or_else(|| "policy".into(), |n| n.to_string_lossy().into_owned());
            let request = api
                .request("PUT", "/v1/policy")
                .query("name", &name)
                .set("content-type", "application/octet-stream")
                .send_bytes(&bytes);
            api.call(request)?.into_json().map_err(|e| e.to_string())?
        }
        PolicyCommand::Unload => {
            api.call(api.request("DELETE", "/v1/policy").call())?.into_json().map_err(|e| e.to_string())?
        }
    };
    if json {
        println!("{answer}");
        return Ok(());
    }
    match command {
        PolicyCommand::Show if answer["available"] == false => {
            println!("no steering: {}", answer["reason"].as_str().unwrap_or("unknown"));
        }
        PolicyCommand::Show => {
            let policy = &answer["policy"];
            match policy["name"].as_str() {
                Some(name) => println!(
                    "policy {name} ({}, {} bytes)",
                    policy["object_hash"].as_str().unwrap_or(""),
                    policy["object_bytes"]
                ),
                None => println!("no policy: lanes by batch size"),
            }
            let flows = &answer["flows"];
            println!(
                "flows: {} open; decided {} latency, {} bulk ({} entries undecided)",
                flows["open"], flows["latency"], flows["bulk"], flows["undecided"]
            );
            let connections = &answer["connections"];
            println!(
                "connections accepted: {} on latency-lane workers, {} on bulk-lane workers",
                connections["latency_workers"], connections["bulk_workers"]
            );
            println!("policy swaps since start: {}", answer["swaps"]);
        }
        PolicyCommand::Load { .. } => {
            println!(
                "policy {} attached ({})",
                answer["name"].as_str().unwrap_or(""),
                answer["object_hash"].as_str().unwrap_or("")
            );
        }
        PolicyCommand::Unload => match answer["unloaded"]["name"].as_str() {
            Some(name) => println!("policy {name} detached; lanes by batch size"),
            None => println!("no policy was attached; lanes by batch size"),
        },
    }
    Ok(())
}

fn grant(api: &Api, json: bool, command: &GrantCommand) -> Result<()> {
    match command {
        GrantCommand::Create { dataset, client, cert_name } => {
            let body = serde_json::json!({ "dataset": dataset, "client": client, "cert_name": cert_name });
            let grant: Value =
                api.call(api.request("POST", "/v1/grants").send_json(body))?.into_json().map_err(|e| e.to_string())?;
            if json {
                println!("{grant}");
            } else {
                println!("grant {} of {dataset} to {client}", grant["id"]);
                println!(
                    "token (shown once; pass it as --token or SLUICE_TOKEN): {}",
                    grant["token"].as_str().unwrap_or("")
                );
            }
        }
        GrantCommand::Ls => {
            let grants: Vec<Value> = api.get_json("/v1/grants")?;
            if json {
                println!("{}", Value::Array(grants));
            } else {
                println!("{:>6}  {:<32} {:<40} CREATED (unix ms)", "ID", "DATASET", "CLIENT");
                for g in grants {
                    println!(
                        "{:>6}  {:<32} {:<40} {}",
                        g["id"],
                        g["dataset"].as_str().unwrap_or(""),
                        g["client"].as_str().unwrap_or(""),
                        g["created_unix_ms"]
                    );
                }
            }
        }
        GrantCommand::Revoke { id } => {
            api.call(api.request("DELETE", &format!("/v1/grants/{id}")).call())?;
            if json {
                println!("{}", serde_json::json!({ "revoked": id }));
            } else {
                println!("revoked grant {id}");
            }
        }
    }
    Ok(())
}

fn dataset(api: &Api, json: bool, command: &DatasetCommand) -> Result<()> {
    match command {
        DatasetCommand::Create { name, kind, record_size, size } => {
            let body =
                serde_json::json!({ "name": name, "kind": kind, "record_size": record_size, "size_bytes": size });
            let record: DatasetRecord = api
                .call(api.request("POST", "/v1/datasets").send_json(body))?
                .into_json()
                .map_err(|e| e.to_string())?;
            print_record(&record, json, &format!("created {} ({})", record.name, record.kind));
        }
        DatasetCommand::Ingest { name, files, format, index } => {
            // Refuse early what the node would refuse after the upload.
            let record: DatasetRecord = api.get_json(&format!("/v1/datasets/{name}"))?;
            if !matches!(record.state, DatasetState::Creating | DatasetState::Ingesting) {
                return Err(format!("dataset {name:?} is {}; ingest needs it creating or ingesting", record.state));
            }
            let needs_index = record.kind == DatasetKind::Records && record.record_size_bytes.is_none();
            if needs_index && index.is_none() {
                return Err(format!(
                    "{name} is a records dataset: send its offsets first (sluicectl dataset ingest {name} FILE --index OFFSETS)"
                ));
            }
            if let Some(index) = index {
                if files.len() != 1 {
                    return Err("--index describes one file: give exactly one FILE with it".into());
                }
                stage_index(api, name, index)?;
            }
            let mut results = Vec::new();
            for file in files {
                let appended = ingest_file(api, name, file, *format, json)?;
                results.push(serde_json::json!({ "file": file, "appended": appended }));
            }
            if json {
                println!("{}", Value::Array(results));
            }
        }
        DatasetCommand::Seal { name } => {
            let record: DatasetRecord = api
                .call(api.request("POST", &format!("/v1/datasets/{name}/seal")).call())?
                .into_json()
                .map_err(|e| e.to_string())?;
            let hash = record.content_hash.clone().unwrap_or_default();
            print_record(&record, json, &format!("sealed {} ({} bytes, {hash})", record.name, record.length_bytes));
        }
        DatasetCommand::Ls => {
            let records: Vec<DatasetRecord> = api.get_json("/v1/datasets")?;
            if json {
                println!("{}", serde_json::to_string(&records).map_err(|e| e.to_string())?);
            } else {
                println!("{:<32} {:<11} {:<10} {:>16} {:>6}  HASH", "NAME", "KIND", "STATE", "BYTES", "FILES");
                for r in records {
                    let hash = r.content_hash.as_deref().map(|h| &h[..h.len().min(23)]).unwrap_or("-");
                    let state = serde_json::to_value(r.state).ok().and_then(|v| v.as_str().map(str::to_string));
                    println!(
                        "{:<32} {:<11} {:<10} {:>16} {:>6}  {hash}",
                        r.name,
                        r.kind.as_str(),
                        state.unwrap_or_default(),
                        r.length_bytes,
                        r.files_ingested
                    );
                }
            }
        }
        DatasetCommand::Stat { name } => {
            let record: DatasetRecord = api.get_json(&format!("/v1/datasets/{name}"))?;
            let pretty = serde_json::to_string_pretty(&record).map_err(|e| e.to_string())?;
            print_record(&record, json, &pretty);
        }
        DatasetCommand::Rm { name } => {
            api.call(api.request("DELETE", &format!("/v1/datasets/{name}")).call())?;
            if json {
                println!("{}", serde_json::json!({ "deleted": name }));
            } else {
                println!("deleted {name}");
            }
        }
    }
    Ok(())
}

fn print_record(record: &DatasetRecord, json: bool, human: &str) {
    if json {
        println!("{}", serde_json::to_string(record).unwrap_or_default());
    } else {
        println!("{human}");
    }
}

/// Sends a records file's offsets ahead of the file itself.
fn stage_index(api: &Api, name: &str, path: &Path) -> Result<()> {
    let bytes = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let npy = path.extension().is_some_and(|e| e.eq_ignore_ascii_case("npy"));
    let request = api
        .request("POST", &format!("/v1/datasets/{name}/index"))
        .query("format", if npy { "npy" } else { "raw" })
        .set("Content-Type", "application/octet-stream")
        .send_bytes(&bytes);
    api.call(request)?;
    Ok(())
}

/// Streams one file to the node, then compares the node's CRC32C of the
/// data with the one computed here while sending.
fn ingest_file(api: &Api, name: &str, path: &Path, format: Format, json: bool) -> Result<Appended> {
    let file = File::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let size = file.metadata().map(|m| m.len()).map_err(|e| format!("{}: {e}", path.display()))?;
    let npy = match format {
        Format::Npy => true,
        Format::Raw => false,
        Format::Auto => path.extension().is_some_and(|e| e.eq_ignore_ascii_case("npy")),
    };
    let data_offset = if npy {
        let mut head = vec![0u8; (size as usize).min(npy::HEADER_BYTES_MAX)];
        File::open(path).and_then(|mut f| f.read_exact(&mut head)).map_err(|e| format!("{}: {e}", path.display()))?;
        npy::parse_header(&head).map(|h| h.data_offset_bytes as u64).map_err(|e| format!("{}: {e}", path.display()))?
    } else {
        0
    };
    let progress = ProgressBar::new(size);
    progress.set_style(
        ProgressStyle::with_template("{msg} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec} eta {eta}")
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
    );
    progress.set_message(path.display().to_string());
    let reader = CrcReader { inner: progress.wrap_read(file), skip: data_offset, crc: 0 };
    let crc = Arc::new(std::sync::Mutex::new(0u32));
    let reader = SharedCrc { reader, out: Arc::clone(&crc) };
    let request = api
        .request("POST", &format!("/v1/datasets/{name}/ingest"))
        .query("format", if npy { "npy" } else { "raw" })
        .set("Content-Type", "application/octet-stream")
        .send(reader);
    progress.finish_and_clear();
    let appended: Appended = api.call(request)?.into_json().map_err(|e| e.to_string())?;
    let sent = *crc.lock().map_err(|_| "crc lock poisoned".to_string())?;
    if appended.data_crc32c != sent {
        return Err(format!(
            "{}: checksum mismatch: sent crc32c {sent:#010x}, node stored {:#010x}",
            path.display(),
            appended.data_crc32c
        ));
    }
    if !json {
        println!(
            "ingested {}: {} bytes (crc32c {:#010x} verified); {name} is now {} bytes",
            path.display(),
            appended.data_bytes,
            sent,
            appended.length_bytes
        );
    }
    Ok(appended)
}

/// CRC32C of what passes through, after the first `skip` bytes.
struct CrcReader<R> {
    inner: R,
    skip: u64,
    crc: u32,
}

impl<R: Read> Read for CrcReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        let skip = (self.skip.min(n as u64)) as usize;
        self.skip -= skip as u64;
        self.crc = crc32c::crc32c_append(self.crc, &buf[skip..n]);
        Ok(n)
    }
}

/// Publishes the running CRC so it can be read after the request consumed
/// the reader.
struct SharedCrc<R> {
    reader: CrcReader<R>,
    out: Arc<std::sync::Mutex<u32>>,
}

impl<R: Read> Read for SharedCrc<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.reader.read(buf)?;
        if let Ok(mut out) = self.out.lock() {
            *out = self.reader.crc;
        }
        Ok(n)
    }
}

fn runtime() -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread().enable_all().build().map_err(|e| format!("runtime: {e}"))
}

/// Most bytes asked for in one batch by `read`; longer reads are streamed.
const READ_PIECE_BYTES: u64 = 64 << 20;

fn read(api: &Api, name: &str, offset: u64, len: u64, output: Option<&Path>) -> Result<()> {
    runtime()?.block_on(async {
        let client = api.connect().await?;
        let dataset = client.open_with(name, api.open_options()).await.map_err(|e| e.to_string())?;
        let mut out: Box<dyn Write> = match output {
            Some(path) => Box::new(File::create(path).map_err(|e| format!("{}: {e}", path.display()))?),
            None => Box::new(std::io::stdout().lock()),
        };
        let mut done = 0u64;
        let mut buf = Vec::new();
        while done < len {
            let piece = (len - done).min(READ_PIECE_BYTES);
            buf.resize(piece as usize, 0);
            let ranges: Vec<ReadRange> = (0..piece.div_ceil(4 << 20))
                .map(|i| {
                    let at = i * (4 << 20);
                    ReadRange { offset: offset + done + at, len: (piece - at).min(4 << 20) as u32, dest: at }
                })
                .collect();
            let statuses = dataset.read_batch(&ranges, &mut buf).await.map_err(|e| e.to_string())?;
            if let Some(bad) = statuses.iter().find(|s| **s != RangeStatus::Ok) {
                return Err(format!(
                    "reading {len} bytes at {offset} of {name}: {} (the dataset is {} bytes)",
                    bad.name(),
                    dataset.len_bytes()
                ));
            }
            out.write_all(&buf).map_err(|e| e.to_string())?;
            done += piece;
        }
        out.flush().map_err(|e| e.to_string())
    })
}

fn bench_read(api: &Api, name: &str, params: BenchParams, json: bool) -> Result<()> {
    runtime()?.block_on(async {
        let client = api.connect().await?;
        let dataset = Arc::new(client.open_with(name, api.open_options()).await.map_err(|e| e.to_string())?);
        let report = readbench::run(dataset, params).await.map_err(|e| e.to_string())?;
        if json {
            let mut value = serde_json::to_value(&report).map_err(|e| e.to_string())?;
            value["transport"] = Value::from(client.transport());
            value["transport_reason"] = Value::from(client.transport_reason());
            value["dataset"] = Value::from(name);
            println!("{value}");
        } else {
            println!("{name} over {} from {} ({})", client.transport(), client.node().name, client.transport_reason());
            print!("{}", report.render());
        }
        Ok(())
    })
}

fn replay(
    api: &Api,
    state_path: &Path,
    step: u64,
    global_batch: Option<u64>,
    dump: Option<&Path>,
    json: bool,
) -> Result<()> {
    use sluice_client::loader::replay_step;
    use sluice_client::sampler::SamplerState;
    let bytes = std::fs::read(state_path).map_err(|e| format!("{}: {e}", state_path.display()))?;
    let mut state = SamplerState::from_bytes(&bytes).map_err(|e| format!("{}: {e}", state_path.display()))?;
    if let Some(batch) = global_batch {
        state.global_batch = batch.max(1);
    }
    let records: Vec<DatasetRecord> = api.get_json("/v1/datasets")?;
    let record = records
        .iter()
        .find(|r| r.content_hash.as_deref() == Some(state.content_hash.as_str()))
        .ok_or_else(|| format!("no sealed dataset on this node has content hash {}", state.content_hash))?;
    let name = record.name.clone();
    let (samples, data) = runtime()?.block_on(async {
        let client = api.connect().await?;
        let dataset = client.open_with(&name, api.open_options()).await.map_err(|e| e.to_string())?;
        let index = match state.kind {
            sluice_client::sampler::SamplerKind::Record => {
                Some(dataset.record_index().await.map_err(|e| e.to_string())?)
            }
            sluice_client::sampler::SamplerKind::Window => None,
        };
        let samples = replay_step(&state, step, index.as_deref()).map_err(|e| e.to_string())?;
        let mut ranges = Vec::with_capacity(samples.len());
        let mut dest = 0u64;
        for s in &samples {
            let len = u32::try_from(s.len_bytes).map_err(|_| format!("sample {} is over 4 GiB", s.index))?;
            ranges.push(ReadRange { offset: s.byte_offset, len, dest });
            dest += s.len_bytes;
        }
        let mut buf = vec![0u8; dest as usize];
        let statuses = dataset.read_batch(&ranges, &mut buf).await.map_err(|e| e.to_string())?;
        if let Some(bad) = statuses.iter().position(|s| *s != RangeStatus::Ok) {
            return Err(format!("sample {bad}: {}", statuses[bad].name()));
        }
        Ok::<_, String>((samples, buf))
    })?;
    if let Some(dir) = dump {
        std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    }
    let mut rows = Vec::with_capacity(samples.len());
    let mut at = 0usize;
    for sample in &samples {
        let bytes = &data[at..at + sample.len_bytes as usize];
        at += sample.len_bytes as usize;
        let crc = crc32c::crc32c(bytes);
        if let Some(dir) = dump {
            let path = dir.join(format!("step{step}-{:05}.bin", sample.position));
            std::fs::write(&path, bytes).map_err(|e| format!("{}: {e}", path.display()))?;
        }
        rows.push((sample, crc));
    }
    if json {
        let out: Vec<Value> = rows
            .iter()
            .map(|(s, crc)| {
                let mut v = serde_json::to_value(s).unwrap_or_default();
                v["crc32c"] = Value::from(*crc);
                v["dataset"] = Value::from(name.as_str());
                v
            })
            .collect();
        println!("{}", Value::Array(out));
    } else {
        println!("dataset {name} ({}), step {step}, global batch {}", state.content_hash, state.global_batch);
        println!(
            "{:>8} {:>14} {:>6} {:>14} {:>16} {:>10}",
            "POSITION", "GLOBAL_SAMPLE", "EPOCH", "INDEX", "BYTE_OFFSET", "CRC32C"
        );
        for (s, crc) in rows {
            println!(
                "{:>8} {:>14} {:>6} {:>14} {:>16}   {crc:#010x}",
                s.position, s.global_sample, s.epoch, s.index, s.byte_offset
            );
        }
    }
    Ok(())
}

fn scrub(api: &Api, name: &str, json: bool) -> Result<()> {
    let report: sluice_control::ScrubReport = api
        .call(api.request("POST", &format!("/v1/datasets/{name}/scrub")).call())?
        .into_json()
        .map_err(|e| e.to_string())?;
    if json {
        println!("{}", serde_json::to_string(&report).map_err(|e| e.to_string())?);
    } else {
        println!("{name}: {} chunks, {} bytes, {} bad", report.chunks, report.bytes, report.bad_chunks.len());
        for (chunk, status) in &report.bad_chunks {
            println!("  chunk {chunk} (bytes {}..): {status}", chunk * sluice_proto::CHUNK_SIZE_BYTES);
        }
    }
    if !report.bad_chunks.is_empty() {
        return Err(format!("{name}: {} bad chunks", report.bad_chunks.len()));
    }

    Ok(())
}

fn top(api: &Api, once: bool, interval: f64, json: bool) -> Result<()> {
    use std::io::IsTerminal;
    if !once && !json && std::io::stdout().is_terminal() {
        // Live terminal UI; plain text when piped.
        return sluice::top::run(|| api.get_json("/v1/trace"), Duration::from_secs_f64(interval.max(0.1)));
    }
    let mut previous: std::collections::HashMap<(u64, String), u64> = std::collections::HashMap::new();
    loop {
        let snapshot: Value = api.get_json("/v1/trace")?;
        if json {
            println!("{snapshot}");
        } else {
            if !once {
                print!("\x1b[2J\x1b[H");
            }
            print!("{}", render_top(&snapshot, &mut previous, interval));
        }
        if once {
            return Ok(());
        }
        std::thread::sleep(Duration::from_secs_f64(interval.max(0.1)));
    }
}

fn render_top(snapshot: &Value, previous: &mut std::collections::HashMap<(u64, String), u64>, interval: f64) -> String {
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
        let size = sluice::top::log2_quantile(&entry["size_log2"], 0.5);
        let latency = sluice::top::log2_quantile(&entry["latency_log2_us"], 0.5);
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
    out.push_str(&sluice::top::kernel_line(snapshot));
    out.push('\n');
    out
}
