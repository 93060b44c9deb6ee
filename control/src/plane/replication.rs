//! A node's part in a cluster: where new datasets are placed, which copies
//! this node must make, writing and verifying a copy, and dropping copies
//! of datasets deleted elsewhere.
//!
//! Datasets are ingested and sealed on the node that created them; the
//! other nodes of their placement copy the sealed bytes from a live node
//! holding them, over the data plane like any client, verifying every
//! chunk against the catalog's checksums and the whole against the content
//! hash before they announce their copy ready. Sealed datasets never
//! change, so a copy is complete or absent, never stale.
//!
//! A source-backed dataset is placed the same way, but its copies hold no
//! bytes to copy: each placed node's copy is a cache of the source of its
//! own, announced ready as soon as its namespace is made (with the sample
//! index of a `records`, `wds` or `mds` dataset, taken from a node whose copy
//! serves), and its chunks fill from the source on first read or warm, as
//! on the node that created it. No node fetches a chunk from a peer.

use std::time::Duration;

use super::*;
use crate::cluster::ReplicaRecord;
use sluice_proto::api::{ClusterStatus, CopyStatus, DatasetPlacement, ForeignDataset, Member};

/// Where a node keeps its catalog.
#[derive(Clone, Debug, Default)]
pub enum CatalogChoice {
    /// A redb file in the data directory: a single node.
    #[default]
    Local,
    /// etcd, shared by every node started with the same endpoint and prefix.
    /// A dataset short of `replicas` live placed nodes for `repair_after`
    /// gets a new one.
    Etcd {
        endpoint: String,
        /// TLS, client certificate and etcd user.
        access: Box<crate::etcd::EtcdAccess>,
        prefix: String,
        node: String,
        replicas: usize,
        repair_after: Duration,
    },
}

/// A copy this node is placed to hold and does not have yet.
#[derive(Clone, Debug)]
pub struct ReplicaJob {
    pub name: String,
    pub dataset_id: u64,
    /// Control endpoints of live nodes holding a complete copy (of a
    /// source-backed dataset: a copy that serves).
    pub sources: Vec<String>,
    /// Its copy fills from the dataset's source ([`ControlPlane::begin_source_replica`]).
    pub source_backed: bool,
    /// The sample index must come from one of `sources` first.
    pub needs_index: bool,
}

/// A copy being written: sequential pieces, each chunk checked as it lands.
pub struct ReplicaTarget<'a> {
    control: &'a ControlPlane,
    _guard: BusyGuard<'a>,
    record: DatasetRecord,
    ns: Arc<dyn Namespace>,
    crcs: Vec<u32>,
    hasher: blake3::Hasher,
    /// Block checksums of what was written, for the node's checksum file.
    block_crcs: Vec<u32>,
    written_bytes: u64,
}

impl ReplicaTarget<'_> {
    pub fn record(&self) -> &DatasetRecord {
        &self.record
    }

    /// Bytes written and verified so far.
    pub fn written_bytes(&self) -> u64 {
        self.written_bytes
    }

    /// Appends the next `bytes` of the dataset: whole chunks, or the tail.
    pub fn write(&mut self, bytes: &[u8]) -> Result<(), ControlError> {
        let chunk = self.record.chunk_size_bytes;
        let end = self.written_bytes + bytes.len() as u64;
        if end > self.record.length_bytes
            || (!(bytes.len() as u64).is_multiple_of(chunk) && end != self.record.length_bytes)
        {
            return Err(ControlError::Cluster(format!(
                "copy of {}: a piece of {} bytes at {} is not whole chunks within its {} bytes",
                self.record.name,
                bytes.len(),
                self.written_bytes,
                self.record.length_bytes
            )));
        }
        let first_block = self.block_crcs.len();
        for (i, piece) in bytes.chunks(chunk as usize).enumerate() {
            let index = self.written_bytes / chunk + i as u64;
            let crc = sluice_dataplane::blocks::chunk_crc_and_blocks(piece, &mut self.block_crcs);
            if self.crcs.get(index as usize) != Some(&crc) {
                self.block_crcs.truncate(first_block);
                return Err(ControlError::Corrupt { name: self.record.name.clone(), chunk: index });
            }
        }
        if let Err(err) = self.ns.write_at(self.record.namespace.base_offset_bytes + self.written_bytes, bytes) {
            self.block_crcs.truncate(first_block);
            return Err(self.control.ns_error(&self.record, err));
        }
        self.hasher.update(bytes);
        self.written_bytes = end;
        Ok(())
    }

    /// Writes the sample index of a `records`, `wds` or `mds` dataset.
    pub fn write_index(&self, entries: &[(u64, u64)]) -> Result<(), ControlError> {
        if entries.len() as u64 != self.record.record_count {
            return Err(ControlError::Cluster(format!(
                "copy of {}: the index has {} entries, the catalog {}",
                self.record.name,
                entries.len(),
                self.record.record_count
            )));
        }
        self.control.index_file(&self.record)?.append(0, entries).map_err(|e| self.control.ns_error(&self.record, e))
    }

    /// Checks the content hash, makes the copy durable and announces it.
    pub fn finish(self) -> Result<(), ControlError> {
        let hash = format!("blake3:{}", self.hasher.finalize().to_hex());
        if self.written_bytes != self.record.length_bytes || Some(&hash) != self.record.content_hash.as_ref() {
            return Err(ControlError::Cluster(format!(
                "copy of {}: {} of {} bytes with hash {hash}, the catalog says {:?}",
                self.record.name, self.written_bytes, self.record.length_bytes, self.record.content_hash
            )));
        }
        self.ns
            .truncate(self.record.namespace.base_offset_bytes + self.record.length_bytes)
            .and_then(|()| self.ns.sync())
            .map_err(|e| self.control.ns_error(&self.record, e))?;
        self.control
            .checksums
            .write(self.record.id, &self.block_crcs)
            .map_err(|e| self.control.ns_error(&self.record, e))?;
        let cluster = self.control.cluster()?;
        cluster.put_replica(&self.record, true)?;
        tracing::info!(dataset = self.record.name, bytes = self.record.length_bytes, "copy complete and verified");
        Ok(())
    }
}

/// What this module owns of the plane: the cluster's catalog, how many
/// copies it keeps, and the repair and membership state.
pub(super) struct ClusterState {
    /// The catalog when it is etcd's: replicas and membership.
    etcd: Option<Arc<EtcdCatalog>>,
    /// Copies of each dataset a cluster keeps.
    replication: usize,
    /// How long a dataset may have fewer than `replication` live placed
    /// nodes before a live node adds itself to its placement.
    repair_after: std::time::Duration,
    /// When each dataset was first seen short of live placed nodes.
    short_since: Mutex<HashMap<String, std::time::Instant>>,
    membership: Mutex<Option<Membership>>,
}

impl ClusterState {
    /// A single node: no etcd, one copy, never repaired.
    pub(super) fn single() -> Self {
        Self::new(None, 1, std::time::Duration::MAX)
    }

    pub(super) fn new(etcd: Option<Arc<EtcdCatalog>>, replication: usize, repair_after: std::time::Duration) -> Self {
        Self {
            etcd,
            replication: replication.max(1),
            repair_after,
            short_since: Mutex::new(HashMap::new()),
            membership: Mutex::new(None),
        }
    }

    /// The cluster's catalog, where this node is in one.
    pub(super) fn etcd(&self) -> Option<&EtcdCatalog> {
        self.etcd.as_deref()
    }
}

impl ControlPlane {
    fn cluster(&self) -> Result<&EtcdCatalog, ControlError> {
        self.cluster.etcd().ok_or_else(|| ControlError::Cluster("this node is not in a cluster (no --etcd)".into()))
    }

    /// This node's id in its cluster, if it is in one.
    pub fn node_id(&self) -> Option<&str> {
        self.cluster.etcd().map(EtcdCatalog::node)
    }

    /// Announces this node to the cluster and keeps it announced (a lease
    /// of `ttl`) until [`ControlPlane::leave_cluster`] or exit; a node
    /// killed drops out when its lease expires.
    pub fn join_cluster(&self, control_endpoint: String, data_addr: String, ttl: Duration) -> Result<(), ControlError> {
        let cluster = self.cluster()?;
        let member =
            Member { node: cluster.node().to_string(), control_endpoint, data_addr, started_unix_ms: now_unix_ms() };
        let membership = cluster.join(member, ttl)?;
        if let Ok(mut slot) = self.cluster.membership.lock() {
            *slot = Some(membership);
        }
        Ok(())
    }

    /// Leaves the cluster now (revokes the lease) rather than at expiry.
    pub fn leave_cluster(&self) {
        let membership = self.cluster.membership.lock().ok().and_then(|mut m| m.take());
        drop(membership);
    }

    /// The nodes a new dataset is placed on: this one (where it is
    /// ingested) and the live members holding the fewest copies.
    pub(super) fn place_replicas(&self) -> Vec<String> {
        let Some(cluster) = self.cluster.etcd() else { return Vec::new() };
        let mut others: Vec<(usize, String)> = match (cluster.members(), cluster.replicas()) {
            (Ok(members), Ok(replicas)) => members
                .into_iter()
                .filter(|m| m.node != cluster.node())
                .map(|m| (replicas.values().flatten().filter(|r| r.node == m.node).count(), m.node))
                .collect(),
            (Err(err), _) | (_, Err(err)) => {
                tracing::warn!("placing a dataset on this node only: {err}");
                Vec::new()
            }
        };
        others.sort();
        std::iter::once(cluster.node().to_string())
            .chain(others.into_iter().map(|(_, node)| node))
            .take(self.cluster.replication)
            .collect()
    }

    /// Whether this node serves `record`: always on a single node; in a
    /// cluster, when its copy is complete.
    pub(super) fn holds_ready_copy(&self, record: &DatasetRecord) -> Result<bool, ControlError> {
        let Some(cluster) = self.cluster.etcd() else { return Ok(true) };
        Ok(cluster.own_replicas()?.get(&record.name).is_some_and(|r| r.serves(record)))
    }

    /// Control endpoints of the live nodes with a complete copy of `name`,
    /// this node first.
    pub fn replica_endpoints(&self, name: &str) -> Vec<String> {
        let Some(cluster) = self.cluster.etcd() else { return Vec::new() };
        let (Ok(members), Ok(replicas), Ok(Some(record))) =
            (cluster.members(), cluster.replicas(), self.catalog.get(name))
        else {
            return Vec::new();
        };
        let mut ready: Vec<&Member> = members
            .iter()
            .filter(|m| {
                replicas.get(name).is_some_and(|copies| copies.iter().any(|r| r.node == m.node && r.serves(&record)))
            })
            .collect();
        ready.sort_by_key(|m| (m.node != cluster.node(), m.node.clone()));
        ready.into_iter().map(|m| m.control_endpoint.clone()).collect()
    }

    /// Reloads the grants from the shared catalog; sessions of grants gone
    /// (revoked on another node) are closed.
    pub fn refresh_grants(&self) {
        let fresh = match self.catalog.grants() {
            Ok(fresh) => fresh,
            Err(err) => {
                tracing::warn!("refreshing grants: {err}");
                return;
            }
        };
        self.access.replace_grants(fresh);
    }

    /// Re-places datasets that have had fewer than `replication` live
    /// placed nodes for `repair_after` (a node died and stayed away): the
    /// live node outside the placement holding the fewest copies (lowest
    /// id on ties) adds itself, then copies it like any placed node. Every
    /// node computes the same choice, and the catalog's compare-and-swap
    /// settles a race. The dead node stays placed: if it returns, the
    /// dataset has one copy more.
    fn repair_placement(
        &self,
        records: &mut [DatasetRecord],
        members: &[Member],
        replicas: &HashMap<String, Vec<ReplicaRecord>>,
    ) {
        let Some(cluster) = self.cluster.etcd() else { return };
        let live = |node: &String| members.iter().any(|m| m.node == *node);
        let Ok(mut short_since) = self.cluster.short_since.lock() else { return };
        short_since.retain(|name, _| records.iter().any(|r| r.name == *name));
        for record in records.iter_mut().filter(|r| r.state == DatasetState::Sealed) {
            let placed_live = record.placement.iter().filter(|n| live(n)).count();
            if placed_live >= self.cluster.replication.min(members.len()) {
                short_since.remove(&record.name);
                continue;
            }
            let since = *short_since.entry(record.name.clone()).or_insert_with(std::time::Instant::now);
            if since.elapsed() < self.cluster.repair_after {
                continue;
            }
            let held = |node: &str| replicas.values().flatten().filter(|r| r.node == node).count();
            let chosen = members
                .iter()
                .filter(|m| !record.placement.contains(&m.node))
                .min_by_key(|m| (held(&m.node), m.node.clone()));
            if chosen.is_none_or(|m| m.node != cluster.node()) {
                continue;
            }
            let mut updated = record.clone();
            updated.placement.push(cluster.node().to_string());
            match self.catalog.update(&updated, None) {
                Ok(()) => {
                    tracing::warn!(
                        dataset = record.name,
                        "{placed_live} of {} placed nodes live for {:?}: this node takes a copy",
                        self.cluster.replication,
                        since.elapsed()
                    );
                    short_since.remove(&record.name);
                    *record = updated;
                }
                Err(err) => tracing::debug!(dataset = record.name, "re-placing lost a race: {err}"),
            }
        }
    }

    /// The copies this node is placed to hold and lacks, with where to
    /// copy each from.
    pub fn replication_jobs(&self) -> Result<Vec<ReplicaJob>, ControlError> {
        let cluster = self.cluster()?;
        let members = cluster.members()?;
        let replicas = cluster.replicas()?;
        let mut records = self.catalog.list()?;
        self.repair_placement(&mut records, &members, &replicas);
        let mut jobs = Vec::new();
        for record in records {
            if record.state != DatasetState::Sealed || !record.placement.iter().any(|n| n == cluster.node()) {
                continue;
            }
            let copies = replicas.get(&record.name).map(Vec::as_slice).unwrap_or_default();
            let complete = |r: &&ReplicaRecord| r.serves(&record);
            if copies.iter().filter(complete).any(|r| r.node == cluster.node()) {
                continue;
            }
            let sources = copies
                .iter()
                .filter(complete)
                .filter_map(|r| members.iter().find(|m| m.node == r.node))
                .map(|m| m.control_endpoint.clone())
                .collect();
            let source_backed = record.source.is_some();
            let needs_index = record.kind.has_records() && record.record_size_bytes.is_none();
            jobs.push(ReplicaJob { name: record.name, dataset_id: record.id, sources, source_backed, needs_index });
        }
        Ok(jobs)
    }

    /// Starts this node's copy of a job's dataset: a namespace for it
    /// (the one an interrupted copy left, or a new one), announced as not
    /// ready before a byte is written so a crash leaks nothing.
    pub fn begin_replica(&self, job: &ReplicaJob) -> Result<ReplicaTarget<'_>, ControlError> {
        let guard = self.busy(&job.name)?;
        let cluster = self.cluster()?;
        let mut record = self.catalog.require(&job.name)?;
        if record.id != job.dataset_id || record.state != DatasetState::Sealed {
            return Err(ControlError::Cluster(format!("{} changed since its copy was planned", job.name)));
        }
        if record.namespace.kind == NamespaceKind::Remote {
            let _allocating = self.storage.allocating(&job.name)?;
            record.namespace = self.allocate_namespace(record.id, Some(record.length_bytes));
            cluster.put_replica(&record, false)?;
        }
        let ns = self.allocated_namespace(&record)?;
        let crcs = self.catalog.chunk_crcs(record.id)?;
        Ok(ReplicaTarget {
            control: self,
            _guard: guard,
            record,
            ns,
            crcs,
            hasher: blake3::Hasher::new(),
            block_crcs: Vec::new(),
            written_bytes: 0,
        })
    }

    /// Makes this node's copy of a source-backed dataset: a namespace of
    /// its length and, for a `records`, `wds` or `mds` dataset, the sample index
    /// (`index`, from a node whose copy serves); then the copy is announced
    /// ready. Its chunks fill from the source on first read.
    pub fn begin_source_replica(&self, job: &ReplicaJob, index: Option<&[(u64, u64)]>) -> Result<(), ControlError> {
        let target = self.begin_replica(job)?;
        let record = target.record();
        if record.source.is_none() {
            return Err(ControlError::Cluster(format!("{} is not source-backed", job.name)));
        }
        let ns = self.namespace(record)?;
        ns.truncate(record.namespace.base_offset_bytes + record.length_bytes)
            .and_then(|()| ns.sync())
            .map_err(|e| self.ns_error(record, e))?;
        match index {
            Some(entries) => target.write_index(entries)?,
            None if job.needs_index => {
                return Err(ControlError::Cluster(format!("copy of {}: its sample index is needed first", job.name)));
            }
            None => {}
        }
        self.cluster()?.put_replica(record, true)?;
        tracing::info!(dataset = job.name, "copy of a source-backed dataset ready; its chunks fill from the source");
        Ok(())
    }

    /// Drops this node's copies of datasets deleted (or re-created) on
    /// other nodes: detaches them, releases their namespaces, forgets them.
    pub async fn reap_replicas(&self) -> Result<usize, ControlError> {
        let cluster = self.cluster()?;
        let mut reaped = 0;
        // Copies first, then datasets: a dataset and its creator's copy are
        // made in one transaction, so every copy listed here whose dataset
        // still exists has it in the list below.
        let own = cluster.own_replicas()?;
        // A dataset this build cannot read (foreign) still exists: its copy
        // here (the node ran a newer build) stays for the build that reads it.
        let listing = self.catalog.listing()?;
        let readable = listing.readable.into_iter().map(|r| (r.name, r.id));
        let current: HashMap<String, u64> =
            readable.chain(listing.foreign.into_iter().map(|dataset| (dataset.name, dataset.id))).collect();
        for (name, replica) in own {
            if current.get(&name) == Some(&replica.dataset_id) {
                continue;
            }
            let Ok(_guard) = self.busy(&name) else { continue };
            self.serving.detach(&name).await;
            // The copy's own record says how many bytes it used: no more is
            // discarded (a record without it discards nothing).
            let mut gone =
                crate::catalog::new_record(replica.dataset_id, &name, DatasetKind::Bytes, 0, replica.namespace);
            gone.length_bytes = replica.length_bytes;
            self.forget_cache(&gone);
            self.remove_namespace(&gone);
            cluster.remove_replica(&name)?;
            tracing::info!(dataset = name, "dropped the copy of a dataset deleted elsewhere");
            reaped += 1;
        }
        Ok(reaped)
    }

    /// The cluster's members and every dataset's copies, those whose
    /// records this build cannot read (foreign) among them.
    pub fn cluster_status(&self) -> Result<ClusterStatus, ControlError> {
        let Some(cluster) = self.cluster.etcd() else {
            return Ok(ClusterStatus {
                node: String::new(),
                catalog: self.catalog.describe(),
                replication: 1,
                members: Vec::new(),
                datasets: Vec::new(),
                foreign_datasets: Vec::new(),
            });
        };
        let members = cluster.members()?;
        let replicas = cluster.replicas()?;
        let copies_of = |name: &str, id: u64| -> Vec<CopyStatus> {
            replicas
                .get(name)
                .map(Vec::as_slice)
                .unwrap_or_default()
                .iter()
                .filter(|r| r.dataset_id == id)
                .map(|r| CopyStatus {
                    node: r.node.clone(),
                    ready: r.ready,
                    live: members.iter().any(|m| m.node == r.node),
                })
                .collect()
        };
        let listing = self.catalog.listing()?;
        let datasets = listing
            .readable
            .into_iter()
            .map(|record| DatasetPlacement {
                copies: copies_of(&record.name, record.id),
                name: record.name,
                state: record.state,
                placement: record.placement,
            })
            .collect();
        let foreign_datasets = listing
            .foreign
            .into_iter()
            .map(|record| ForeignDataset {
                copies: copies_of(&record.name, record.id),
                name: record.name,
                id: record.id,
                why: record.why,
            })
            .collect();
        Ok(ClusterStatus {
            node: cluster.node().to_string(),
            catalog: self.catalog.describe(),
            replication: self.cluster.replication,
            members,
            datasets,
            foreign_datasets,
        })
    }
}
