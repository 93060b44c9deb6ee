//! Serving opens: the grant check, block checksums, attaching a sealed
//! dataset to the data plane, scrub, and the transports' resolver.

use super::*;

/// Chunks read per scrub batch.
const SCRUB_CHUNKS_PER_BATCH: u64 = 64;

struct Attached {
    slot: DatasetSlot,
    info: OpenInfo,
}

/// What this module owns of the plane: the data plane, the datasets
/// attached to it for reading, and their serving counters.
pub(super) struct Serving {
    plane: Arc<DataPlane>,
    attached: tokio::sync::Mutex<HashMap<String, Attached>>,
    /// Serving counters per dataset name, shared with the transports.
    counters: Mutex<HashMap<String, Arc<DatasetCounters>>>,
}

impl Serving {
    pub(super) fn new(plane: Arc<DataPlane>) -> Self {
        Self { plane, attached: tokio::sync::Mutex::new(HashMap::new()), counters: Mutex::new(HashMap::new()) }
    }

    /// Detaches `name` from the data plane, if it is attached: open
    /// handles fail their next batch.
    pub(super) async fn detach(&self, name: &str) {
        let attached = self.attached.lock().await.remove(name);
        if let Some(attached) = attached {
            self.plane.detach(attached.slot).await;
        }
    }

    /// The serving counters of `name`, made at its first open.
    pub(super) fn counters(&self, name: &str) -> Arc<DatasetCounters> {
        match self.counters.lock() {
            Ok(mut counters) => Arc::clone(counters.entry(name.to_string()).or_default()),
            Err(_) => Arc::new(DatasetCounters::default()),
        }
    }

    /// Every dataset's counters, for `/metrics`.
    pub(super) fn all_counters(&self) -> Vec<(String, Arc<DatasetCounters>)> {
        self.counters.lock().map(|s| s.iter().map(|(k, v)| (k.clone(), Arc::clone(v))).collect()).unwrap_or_default()
    }

    /// Drops a deleted dataset's counters.
    pub(super) fn forget(&self, name: &str) {
        if let Ok(mut counters) = self.counters.lock() {
            counters.remove(name);
        }
    }

    /// The data plane's DMA slots: leased, total.
    pub(super) fn dma_slots(&self) -> (usize, usize) {
        self.plane.dma_slots()
    }

    /// Each data-plane core's load as of its last pass.
    pub(super) fn core_loads(&self) -> Vec<sluice_dataplane::CoreLoadSnapshot> {
        self.plane.core_loads()
    }
}

/// The data-plane transports open datasets through the control plane.
///
/// Opens run on the control side's runtime, not on the threads that serve
/// data connections: the grant check, the catalog, loading block
/// checksums and attaching are control work, and a connection on a data
/// thread only waits for the answer.
pub struct Resolver {
    control: Arc<ControlPlane>,
    runtime: tokio::runtime::Handle,
}

impl Resolver {
    /// A resolver whose opens run on `runtime` (the control runtime).
    pub fn new(control: Arc<ControlPlane>, runtime: tokio::runtime::Handle) -> Self {
        Self { control, runtime }
    }
}

impl DatasetResolver for Resolver {
    async fn open(&self, name: String, token: Option<String>, peer: Peer) -> Result<Opened, OpenError> {
        let opening = Arc::clone(&self.control).open_dataset(name, token, peer);
        self.runtime
            .spawn(opening)
            .await
            .map_err(|e| OpenError { code: ErrorCode::Internal, message: format!("open task: {e}") })?
    }

    fn grant_live(&self, grant: u64) -> bool {
        self.control.grant_live(grant)
    }

    fn revocations(&self) -> tokio::sync::watch::Receiver<u64> {
        self.control.access.revocations()
    }
}

impl ControlPlane {
    /// A sealed dataset's block checksums: its file, if it folds into the
    /// catalog's chunk CRCs; else made again from the data (and kept), with
    /// any chunk that disagrees with the catalog made unreadable.
    pub(super) fn block_checksums(
        &self,
        record: &DatasetRecord,
        ns: &dyn Namespace,
        chunk_crcs: &[u32],
    ) -> Result<Vec<u32>, ControlError> {
        use sluice_dataplane::blocks::chunks_disagreeing;
        let loaded = self.checksums.load(record.id, record.length_bytes).map_err(|e| self.ns_error(record, e))?;
        if let Some(block_crcs) = loaded {
            if chunks_disagreeing(&block_crcs, record.length_bytes, chunk_crcs).is_empty() {
                return Ok(block_crcs);
            }
            tracing::warn!(dataset = record.name, "block checksums disagree with the catalog; making them again");
        }
        let rebuilt =
            crate::checksums::rebuild(ns, record.namespace.base_offset_bytes, record.length_bytes, chunk_crcs)
                .map_err(|e| self.ns_error(record, e))?;
        if !rebuilt.bad_chunks.is_empty() {
            tracing::error!(
                dataset = record.name,
                chunks = ?rebuilt.bad_chunks,
                "chunks disagree with the catalog; their reads fail as checksum mismatches"
            );
        }
        self.checksums.write(record.id, &rebuilt.block_crcs).map_err(|e| self.ns_error(record, e))?;
        Ok(rebuilt.block_crcs)
    }

    /// Attaches a sealed dataset to the data plane (once) for reading.
    ///
    /// The node-wide table of attached datasets is locked only to look and
    /// to insert, never across the catalog reads and checksum I/O between.
    pub async fn open_for_read(&self, name: &str) -> Result<(DatasetSlot, OpenInfo), ControlError> {
        if let Some(entry) = self.serving.attached.lock().await.get(name) {
            return Ok((entry.slot, entry.info.clone()));
        }
        let record = self.catalog.require(name)?;
        if record.state != DatasetState::Sealed {
            return Err(ControlError::State {
                name: name.into(),
                state: record.state,
                action: "reading",
                needed: "sealed",
            });
        }
        if !self.holds_ready_copy(&record)? {
            return Err(ControlError::Elsewhere { name: name.into(), elsewhere: self.replica_endpoints(name) });
        }
        let view = if record.source.is_some() {
            self.source_view(&record)?
        } else {
            let namespace = self.namespace(&record)?;
            let chunk_crcs = self.catalog.chunk_crcs(record.id)?;
            let block_crcs = self.block_checksums(&record, &*namespace, &chunk_crcs)?;
            DatasetView {
                dataset_id: record.id,
                namespace,
                base_offset_bytes: record.namespace.base_offset_bytes,
                length_bytes: record.length_bytes,
                block_crcs: block_crcs.into(),
            }
        };
        let mut attached = self.serving.attached.lock().await;
        if let Some(entry) = attached.get(name) {
            // Attached by a concurrent open meanwhile.
            return Ok((entry.slot, entry.info.clone()));
        }
        let slot =
            self.serving.plane.attach(Arc::new(view)).await.map_err(|e| ControlError::DataPlane(e.to_string()))?;
        // A source-backed dataset is named by its pinned manifest, the
        // same before and after its bytes reach the node.
        let identity = match &record.source {
            Some(source) => Some(source.manifest_hash.clone()),
            None => record.content_hash.clone(),
        };
        let info = OpenInfo {
            kind: record.kind.to_string(),
            length_bytes: record.length_bytes,
            content_hash: identity.unwrap_or_default(),
            chunk_size_bytes: record.chunk_size_bytes,
            replicas: Vec::new(),
        };
        attached.insert(name.to_string(), Attached { slot, info: info.clone() });
        drop(attached);
        // A delete marks the record before it detaches what is attached:
        // if one ran while this open was preparing, undo the attach.
        let current = self.catalog.get(name)?;
        if current.as_ref().is_none_or(|r| r.id != record.id || r.state != DatasetState::Sealed) {
            let mut attached = self.serving.attached.lock().await;
            if attached.get(name).is_some_and(|entry| entry.slot == slot) {
                attached.remove(name);
                drop(attached);
                self.serving.plane.detach(slot).await;
            }
            return Err(ControlError::Catalog(CatalogError::Unknown(name.to_string())));
        }
        Ok((slot, info))
    }

    /// Reads every chunk of a sealed dataset through the data plane, which
    /// verifies each against the manifest, and reports the ones that fail.
    pub async fn scrub(&self, name: &str) -> Result<ScrubReport, ControlError> {
        let (slot, info) = self.open_for_read(name).await?;
        // Of a source-backed dataset, the chunks on the node.
        let cache = self.source_tier.cache(name);
        let chunk = info.chunk_size_bytes;
        let chunks = info.length_bytes.div_ceil(chunk);
        let mut bad_chunks = Vec::new();
        let mut first = 0;
        while first < chunks {
            let last = (first + SCRUB_CHUNKS_PER_BATCH).min(chunks);
            let ranges: Vec<sluice_dataplane::ByteRange> = (first..last)
                .filter(|&c| cache.as_ref().is_none_or(|cache| cache.is_present(c)))
                .map(|c| sluice_dataplane::ByteRange {
                    offset_bytes: c * chunk,
                    len_bytes: (chunk.min(info.length_bytes - c * chunk)) as u32,
                })
                .collect();
            if ranges.is_empty() {
                first = last;
                continue;
            }
            let result = self
                .serving
                .plane
                .read(slot, ranges.clone())
                .await
                .map_err(|e| ControlError::DataPlane(e.to_string()))?;
            for (range, status) in ranges.iter().zip(result.statuses()) {
                if *status != sluice_proto::RangeStatus::Ok {
                    bad_chunks.push((range.offset_bytes / chunk, status.name().to_string()));
                }
            }
            first = last;
        }
        Ok(ScrubReport { name: name.to_string(), chunks, bytes: info.length_bytes, bad_chunks })
    }

    pub(super) async fn open_dataset(
        self: Arc<Self>,
        name: String,
        token: Option<String>,
        peer: Peer,
    ) -> Result<Opened, OpenError> {
        // Access first: nothing is attached for a client without a grant.
        let grant = self.check_grant(&name, token.as_deref(), &peer)?;
        let (slot, info) = self.open_for_read(&name).await.map_err(|err| {
            let code = match &err {
                ControlError::Catalog(CatalogError::Unknown(_)) => ErrorCode::UnknownDataset,
                ControlError::State { .. } => ErrorCode::NotSealed,
                ControlError::Elsewhere { .. } => ErrorCode::UnknownDataset,
                _ => ErrorCode::Internal,
            };
            OpenError { code, message: err.to_string() }
        })?;
        let mut info = info;
        info.replicas = self.replica_endpoints(&name);
        Ok(Opened { slot, info, grant, counters: self.serving.counters(&name), read_through: self.read_through(&name) })
    }
}
