//! The node's loops in a cluster. Once a second, replication drops copies
//! of datasets deleted elsewhere and copies the sealed datasets placed on
//! this node from a live node that holds them, reading over the data plane
//! with a grant it issues itself (a source-backed dataset's copy instead
//! fills from its source: only a `records`, `wds` or `mds` dataset's sample index
//! is fetched from a peer); beside it, the grant refresh picks up grants
//! issued or revoked on other nodes. On every node, clustered or not,
//! grants past their end are dropped and their sessions closed.

use std::sync::Arc;
use std::time::Duration;

use sluice_client::{Client, OpenOptions, ReadRange, TransportChoice};
use sluice_control::{ControlPlane, ReplicaJob};
use tokio::sync::watch;

/// How often the node looks for work.
const PERIOD: Duration = Duration::from_secs(1);
/// Bytes read per step of a copy: whole 64 KiB chunks.
const STEP_BYTES: u64 = 8 << 20;
/// Bytes per range of a step.
const RANGE_BYTES: u64 = 1 << 20;

/// A once-a-[`PERIOD`] ticker that ends at shutdown.
struct Ticker {
    tick: tokio::time::Interval,
    shutdown: watch::Receiver<bool>,
}

impl Ticker {
    fn new(shutdown: watch::Receiver<bool>) -> Self {
        let mut tick = tokio::time::interval(PERIOD);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        Self { tick, shutdown }
    }

    /// Waits for the next tick; `false` once the node shuts down.
    async fn next(&mut self) -> bool {
        tokio::select! {
            _ = self.tick.tick() => true,
            _ = self.shutdown.changed() => false,
        }
    }
}

/// Picks up grants issued or revoked on other nodes once a second, in a
/// loop of its own so a long copy never delays a revocation: sessions of a
/// grant revoked anywhere close within about a second here.
pub async fn refresh_grants(control: Arc<ControlPlane>, shutdown: watch::Receiver<bool>) {
    let mut ticker = Ticker::new(shutdown);
    while ticker.next().await {
        let refreshing = Arc::clone(&control);
        let _ = tokio::task::spawn_blocking(move || refreshing.refresh_grants()).await;
    }
}

/// Ends grants past their lifetime once a second (every node, in a
/// cluster or not): their sessions close within about a second of the
/// end, and new opens are refused from the end on regardless.
pub async fn expire_grants(control: Arc<ControlPlane>, shutdown: watch::Receiver<bool>) {
    let mut ticker = Ticker::new(shutdown);
    while ticker.next().await {
        let expiring = Arc::clone(&control);
        let _ = tokio::task::spawn_blocking(move || expiring.expire_grants()).await;
    }
}

pub async fn run(control: Arc<ControlPlane>, shutdown: watch::Receiver<bool>) {
    let mut ticker = Ticker::new(shutdown.clone());
    while ticker.next().await {
        if let Err(err) = control.reap_replicas().await {
            tracing::warn!("dropping copies of deleted datasets: {err}");
        }
        let planning = Arc::clone(&control);
        let jobs = match tokio::task::spawn_blocking(move || planning.replication_jobs()).await {
            Ok(Ok(jobs)) => jobs,
            Ok(Err(err)) => {
                tracing::warn!("planning copies: {err}");
                continue;
            }
            Err(err) => {
                tracing::warn!("planning copies: {err}");
                continue;
            }
        };
        for job in jobs {
            if job.source_backed && !job.needs_index {
                let made = Arc::clone(&control);
                let made = tokio::task::spawn_blocking(move || {
                    made.begin_source_replica(&job, None).map_err(|e| e.to_string())
                })
                .await
                .unwrap_or_else(|e| Err(e.to_string()));
                if let Err(err) = made {
                    tracing::warn!("copy of a source-backed dataset, trying again: {err}");
                }
                continue;
            }
            if job.sources.is_empty() {
                tracing::debug!(dataset = job.name, "no live node holds a complete copy to copy from");
                continue;
            }
            match copy(&control, &job).await {
                Ok(bytes) => tracing::info!(dataset = job.name, bytes, "copied"),
                Err(err) => tracing::warn!(dataset = job.name, "copy failed, trying again: {err}"),
            }
            if *shutdown.borrow() {
                return;
            }
        }
    }
}

/// Makes this node's copy of `job`'s dataset under a grant of its own,
/// revoked when done.
async fn copy(control: &Arc<ControlPlane>, job: &ReplicaJob) -> Result<u64, String> {
    let client = format!("node:{}", control.node_id().unwrap_or("?"));
    let grant = control.issue_grant(&job.name, &client, None, None).map_err(|e| e.to_string())?;
    let mut failures = Vec::new();
    let mut copied = None;
    for source in &job.sources {
        match copy_from(control, job, source, grant.token.clone().map(|t| t.into_inner())).await {
            Ok(bytes) => {
                copied = Some(bytes);
                break;
            }
            Err(err) => failures.push(format!("from {source}: {err}")),
        }
    }
    if let Err(err) = control.revoke_grant(grant.id) {
        tracing::warn!("revoking the copy's grant {}: {err}", grant.id);
    }
    copied.ok_or_else(|| failures.join("; "))
}

async fn copy_from(
    control: &ControlPlane,
    job: &ReplicaJob,
    source: &str,
    token: Option<String>,
) -> Result<u64, String> {
    let client = Client::connect_with(source, TransportChoice::Tcp).await.map_err(|e| e.to_string())?;
    let dataset =
        client.open_with(&job.name, OpenOptions { verify_chunks: false, token }).await.map_err(|e| e.to_string())?;
    if job.source_backed {
        // Its chunks fill from the source: only the sample index is copied.
        let entries = dataset.record_index().await.map_err(|e| e.to_string())?;
        let _ = dataset.close().await;
        control.begin_source_replica(job, Some(&entries)).map_err(|e| e.to_string())?;
        return Ok(0);
    }
    let mut target = control.begin_replica(job).map_err(|e| e.to_string())?;
    let length = target.record().length_bytes;
    if dataset.len_bytes() != length {
        return Err(format!("the source serves {} bytes, the catalog says {length}", dataset.len_bytes()));
    }
    let mut buf = Vec::new();
    while target.written_bytes() < length {
        let at = target.written_bytes();
        let step = STEP_BYTES.min(length - at);
        let ranges: Vec<ReadRange> = (0..step.div_ceil(RANGE_BYTES))
            .map(|i| ReadRange {
                offset: at + i * RANGE_BYTES,
                len: RANGE_BYTES.min(step - i * RANGE_BYTES) as u32,
                dest: i * RANGE_BYTES,
            })
            .collect();
        buf.resize(step as usize, 0);
        let statuses = dataset.read_batch(&ranges, &mut buf).await.map_err(|e| e.to_string())?;
        if let Some(bad) = statuses.iter().find(|s| **s != sluice_client::RangeStatus::Ok) {
            return Err(format!("reading at {at}: {bad:?}"));
        }
        target.write(&buf).map_err(|e| e.to_string())?;
    }
    let record = target.record();
    if record.kind.has_records() && record.record_size_bytes.is_none() {
        let entries = dataset.record_index().await.map_err(|e| e.to_string())?;
        target.write_index(&entries).map_err(|e| e.to_string())?;
    }
    target.finish().map_err(|e| e.to_string())?;
    let _ = dataset.close().await;
    Ok(length)
}
