//! `sluicectl`'s command line: global options and every command group.

use std::path::PathBuf;

use clap::{Parser, Subcommand, ValueEnum};

// No `Debug`: the options hold tokens.
#[derive(Parser)]
#[command(name = "sluicectl", version, about = "Operate a sluice node", after_help = crate::error::EXIT_CODES_HELP)]
pub struct Cli {
    /// Control API of the node.
    #[arg(long, global = true, env = "SLUICE_ENDPOINT", default_value = "http://127.0.0.1:7070")]
    pub endpoint: String,
    /// Print machine-readable JSON.
    #[arg(long, global = true)]
    pub json: bool,
    /// Access grant token for reads (`grant create` prints one), or @FILE
    /// to read it from a file (so it stays out of `ps`).
    #[arg(long, global = true, env = "SLUICE_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// Operator token for administrative calls, or @FILE.
    #[arg(long, global = true, env = "SLUICE_ADMIN_TOKEN", hide_env_values = true)]
    pub admin_token: Option<String>,
    /// A file holding the operator token (the node's DATA_DIR/admin.token,
    /// or a line of its --admin-tokens file).
    #[arg(long, global = true, value_name = "FILE", conflicts_with = "admin_token")]
    pub admin_token_file: Option<PathBuf>,
    /// CA certificate (PEM) the node's TLS certificate chains to, for
    /// https:// endpoints and TLS data ports.
    #[arg(long, global = true, env = "SLUICE_CA_FILE", value_name = "FILE")]
    pub ca_file: Option<PathBuf>,
    /// This client's certificate (PEM), for mTLS.
    #[arg(long, global = true, env = "SLUICE_CERT_FILE", value_name = "FILE", requires = "key")]
    pub cert: Option<PathBuf>,
    /// The key (PEM) of --cert.
    #[arg(long, global = true, env = "SLUICE_KEY_FILE", value_name = "FILE", requires = "cert")]
    pub key: Option<PathBuf>,
    /// Transport for reads (`read`, `bench read`, `replay`): auto picks RDMA
    /// when this host has a device and the node an RDMA endpoint, else TCP.
    #[arg(long, global = true, env = "SLUICE_TRANSPORT", default_value = "auto", value_parser = ["auto", "rdma", "tcp"])]
    pub transport: String,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
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
    /// Prints a shell completion script: `source <(sluicectl completion bash)`.
    Completion {
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Writes man pages (sluicectl.1 and one per subcommand) into DIR.
    Man {
        #[arg(long, value_name = "DIR")]
        out: PathBuf,
    },
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
        /// Write each sample's bytes to DIR/step{K}-{POSITION}.bin.
        #[arg(long)]
        dump: Option<PathBuf>,
    },
}

#[derive(Subcommand, Debug)]
pub enum DatasetCommand {
    Create {
        name: String,
        /// bytes, tokens:u16, tokens:u32, records, wds or mds
        #[arg(long)]
        kind: String,
        /// For `records`: every record has this many bytes (no index file).
        #[arg(long)]
        record_size: Option<u64>,
        /// Bytes it will hold: the node places it on a namespace that holds
        /// them (the smallest such), else in a file.
        #[arg(long, value_name = "BYTES")]
        size: Option<u64>,
        /// Serve it from these objects, listed and pinned (size, ETag) now
        /// and fetched as they are read: s3://bucket/key, s3://bucket/prefix/
        /// (every object under it, in key order), gs://, az://, https://,
        /// file://. Credentials and endpoints from the node's AWS_* (or
        /// GOOGLE_*, AZURE_*) environment.
        #[arg(long, value_name = "URL", value_delimiter = ',')]
        source: Vec<String>,
        /// With --source, for `records` with variable sizes: the object of
        /// their offsets (n + 1 little-endian u64, raw or .npy) over the
        /// concatenated objects.
        #[arg(long, value_name = "URL", requires = "source")]
        index: Option<String>,
    },
    /// Fill a source-backed dataset from its source, with a progress bar;
    /// resumed after a restart. Once complete it has its content hash.
    Warm {
        name: String,
        /// Runs of chunks (up to 4 MiB each) fetched at once.
        #[arg(long, default_value_t = 4)]
        parallel: usize,
        /// Start it and return.
        #[arg(long)]
        no_wait: bool,
    },
    /// Keep every chunk of a source-backed dataset on the node: never
    /// evicted under the cache budget.
    Pin {
        name: String,
    },
    /// Let the coldest chunks of a source-backed dataset be evicted again.
    Unpin {
        name: String,
    },
    /// Append files (raw, .npy arrays, a LitData token dataset's directory
    /// for tokens, tar shards for wds, MDS shards for mds) in order; a file
    /// named .zst or .zstd is decompressed as it is sent.
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
pub enum ListCommand {
    Ls,
}

#[derive(Subcommand, Debug)]
pub enum OrphansCommand {
    Ls,
    /// Deletes every quarantined file (the node never does on its own).
    Purge,
}

/// A lifetime as seconds: a number with `s`, `m`, `h` or `d`, or bare
/// seconds.
pub fn parse_lifetime_s(text: &str) -> Result<u64, String> {
    let (digits, unit) = match text.char_indices().find(|(_, c)| !c.is_ascii_digit()) {
        Some((at, _)) => text.split_at(at),
        None => (text, "s"),
    };
    let scale = match unit {
        "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86_400,
        _ => return Err(format!("{text:?}: a number with s, m, h or d (90s, 15m, 12h, 30d)")),
    };
    let count: u64 =
        digits.parse().map_err(|_| format!("{text:?}: a number with s, m, h or d (90s, 15m, 12h, 30d)"))?;
    count.checked_mul(scale).filter(|s| *s > 0).ok_or_else(|| format!("{text:?}: from 1 s on"))
}

#[derive(Subcommand, Debug)]
pub enum GrantCommand {
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
        /// How long the grant stands (90s, 15m, 12h, 30d, or seconds);
        /// past it the token opens nothing and its sessions close. Without
        /// it, until revoked.
        #[arg(long, value_name = "DURATION", value_parser = parse_lifetime_s)]
        ttl: Option<u64>,
    },
    Ls,
    /// Revoke a grant: new opens fail and open sessions are closed.
    Revoke {
        id: u64,
    },
}

#[derive(Subcommand, Debug)]
pub enum PolicyCommand {
    /// The policy attached now, flows per decision, connections per worker.
    Show,
    /// Swap in a policy: a BPF object (clang -target bpf) with a uprobe
    /// `lane_policy` and the maps of ebpf/include/sluice_steer.h.
    Load { object: PathBuf },
    /// Detach the policy and forget its decisions.
    Unload,
}

#[derive(Subcommand, Debug)]
pub enum BenchCommand {
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
        /// Worker threads of the client's runtime. One, as the blocking
        /// client (Python's) runs: the connection's reader task and the
        /// batches it answers then share a thread.
        #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..))]
        client_threads: u16,
    },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Format {
    Auto,
    Raw,
    Npy,
}

#[cfg(test)]
mod tests {
    use super::parse_lifetime_s;

    #[test]
    fn lifetimes_take_a_unit_or_seconds() {
        assert_eq!(parse_lifetime_s("90"), Ok(90));
        assert_eq!(parse_lifetime_s("90s"), Ok(90));
        assert_eq!(parse_lifetime_s("15m"), Ok(900));
        assert_eq!(parse_lifetime_s("12h"), Ok(43_200));
        assert_eq!(parse_lifetime_s("30d"), Ok(2_592_000));
        for bad in ["", "0", "0s", "h", "1.5h", "10w", "-1", "99999999999999999999d"] {
            assert!(parse_lifetime_s(bad).is_err(), "{bad:?}");
        }
    }
}
