//! `sluicectl`: operate a sluice node through its control API. A module
//! per command group under [`commands`]; every failure is a [`CtlError`]
//! with the exit code `--help` documents.
//!
//! It speaks to the node through the client library (`sluice-client`) and
//! the shared vocabulary (`sluice-proto`) alone: it links nothing of the
//! node (`scripts/check-layout.sh`).

pub mod api;
pub mod cache_view;
pub mod cli;
pub mod commands;
pub mod error;
pub mod litdata;
pub mod readbench;
pub mod stdout;
pub mod trace_view;
pub mod tui;

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::{CommandFactory, Parser};
use sluice_client::http::ControlHttp;

use api::{secret, Api};
use cli::{BenchCommand, Cli, Command, ListCommand};
use commands::{bench, cluster, dataset, devices, grant, policy, read, replay, top};
pub use error::CtlError;
use error::{local, Result};
use readbench::{BenchParams, ReadPattern};

/// The whole of `sluicectl`'s `main`.
pub fn main() -> ExitCode {
    // Warnings (such as a fallback from RDMA to TCP) go to stderr;
    // SLUICE_LOG=debug shows more.
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_env("SLUICE_LOG").unwrap_or_else(|_| "warn".into()))
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    match run(&cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("sluicectl: {err}");
            err.exit_code()
        }
    }
}

fn run(cli: &Cli) -> Result<()> {
    // Commands that need no node.
    match &cli.command {
        Command::Completion { shell } => {
            // Made whole first: a closed pipe is an error here, not a panic
            // inside the generator.
            let mut script = Vec::new();
            clap_complete::generate(*shell, &mut Cli::command(), "sluicectl", &mut script);
            return std::io::Write::write_all(&mut std::io::stdout().lock(), &script)
                .map_err(|e| CtlError::Local(format!("writing the completion script: {e}")));
        }
        Command::Man { out } => return commands::man::write(out),
        _ => {}
    }
    let token = secret(cli.token.as_deref(), None)?;
    let admin_token = secret(cli.admin_token.as_deref(), cli.admin_token_file.as_deref())?;
    let tls_files =
        sluice_client::ClientTlsFiles { ca: cli.ca_file.clone(), identity: cli.cert.clone().zip(cli.key.clone()) };
    // Operator calls carry the operator token; a reader's calls (a
    // dataset's record, its index and chunks) the grant's.
    let http = ControlHttp::new(&cli.endpoint, &tls_files)?.with_bearer(admin_token.as_deref().or(token.as_deref()));
    let api = Api { http, token, tls_files, transport: cli.transport.parse().map_err(CtlError::Usage)? };
    match &cli.command {
        Command::Dataset(command) => dataset::run(&api, cli.json, command),
        Command::Grant(command) => grant::run(&api, cli.json, command),
        Command::Policy(command) => policy::run(&api, cli.json, command),
        Command::Devices(ListCommand::Ls) => devices::devices(&api, cli.json),
        Command::Namespaces(ListCommand::Ls) => devices::namespaces(&api, cli.json),
        Command::Orphans(command) => devices::orphans(&api, cli.json, command),
        Command::Cluster => cluster::run(&api, cli.json),
        Command::Read { name, offset, len, output } => read::read(&api, name, *offset, *len, output.as_deref()),
        Command::Scrub { name } => read::scrub(&api, name, cli.json),
        Command::Top { once, interval } => top::run(&api, *once, *interval, cli.json),
        Command::Replay { state, step, global_batch, dump } => {
            replay::run(&api, state, *step, *global_batch, dump.as_deref(), cli.json)
        }
        Command::Completion { .. } | Command::Man { .. } => Ok(()),
        Command::Bench(BenchCommand::Read {
            name,
            size,
            batch,
            inflight,
            seconds,
            align,
            sequential,
            verify,
            client_threads,
        }) => {
            let verify_against = match verify {
                Some(path) => Some(Arc::new(std::fs::read(path).map_err(local(path))?)),
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
            bench::read(&api, name, params, usize::from(*client_threads), cli.json)
        }
    }
}
