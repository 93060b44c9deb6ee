//! Source-backed datasets: created from object-store URLs with every
//! object pinned, served through a cache of their source that fills on
//! first read, warmed whole on request (resumed after a restart), and
//! hydrated once complete: verified, hashed and given chunk checksums, as
//! reproducible as an ingested dataset.

use std::sync::atomic::Ordering;

use bytes::Bytes;
use sluice_proto::api::{CacheReport, DatasetSource, SourceObject};
use sluice_proto::litdata;
use sluice_proto::mds::MdsIndexer;
use sluice_proto::npy;
use sluice_proto::tar::TarIndexer;

use super::*;
use crate::source::cache::ChunkCache;
use crate::source::read::CacheReader;
use crate::source::{FetchError, SourceError, SourceOptions, Sources};

/// Bytes read per step when a `wds` shard is indexed at create, and when a
/// warmed dataset is hashed.
const SOURCE_STEP_BYTES: u64 = 8 << 20;

/// Passes of a warm over the missing chunks, for those evicted meanwhile.
const WARM_PASSES_MAX: usize = 3;

/// Where a source-backed dataset's bytes come from.
#[derive(Clone, Debug, Default)]
pub struct SourceSpec {
    pub urls: Vec<String>,
    /// A `records` dataset's offsets object (`n + 1` u64, raw or `.npy`)
    /// over the concatenation of the objects, unless records are of one
    /// fixed size.
    pub index: Option<String>,
}

impl From<SourceError> for ControlError {
    fn from(err: SourceError) -> Self {
        ControlError::Source(err.to_string())
    }
}

impl From<FetchError> for ControlError {
    fn from(err: FetchError) -> Self {
        ControlError::Source(err.to_string())
    }
}

/// What create learns from the objects: their data, and the samples.
struct Shaped {
    objects: Vec<SourceObject>,
    length_bytes: u64,
    record_count: u64,
    /// Index entries (`records` with offsets, `wds`, `mds`), dataset-relative.
    entries: Vec<(u64, u64)>,
}

/// What this module owns of the plane: the object stores and how fetches
/// from them behave, and the caches of source-backed datasets.
pub(super) struct SourceTier {
    sources: RwLock<Arc<Sources>>,
    /// Source-backed datasets' caches, by name, made at first open.
    caches: Mutex<HashMap<String, Arc<ChunkCache>>>,
}

impl Default for SourceTier {
    fn default() -> Self {
        Self {
            sources: RwLock::new(Arc::new(Sources::new(SourceOptions::default()))),
            caches: Mutex::new(HashMap::new()),
        }
    }
}

impl SourceTier {
    pub(super) fn sources(&self) -> Arc<Sources> {
        self.sources.read().map(|s| Arc::clone(&s)).unwrap_or_else(|_| Arc::new(Sources::new(SourceOptions::default())))
    }

    /// The cache of `name`, where it is source-backed and was opened.
    pub(super) fn cache(&self, name: &str) -> Option<Arc<ChunkCache>> {
        self.caches.lock().ok()?.get(name).cloned()
    }

    /// Every open cache.
    pub(super) fn caches(&self) -> Vec<Arc<ChunkCache>> {
        self.caches.lock().map(|c| c.values().cloned().collect()).unwrap_or_default()
    }
}

impl ControlPlane {
    /// How fetches from sources behave (timeouts, retries, concurrency).
    pub fn set_source_options(&self, options: SourceOptions) {
        if let Ok(mut sources) = self.source_tier.sources.write() {
            *sources = Arc::new(Sources::new(options));
        }
    }

    fn sources(&self) -> Arc<Sources> {
        self.source_tier.sources()
    }

    /// Creates `name` from `spec`'s objects, listed and pinned now; it can
    /// be read at once (chunks fill on first read).
    pub async fn create_from_source(
        &self,
        name: &str,
        kind: DatasetKind,
        record_size: Option<u64>,
        spec: SourceSpec,
    ) -> Result<DatasetRecord, ControlError> {
        if spec.urls.is_empty() {
            return Err(ControlError::Source("a source-backed dataset needs at least one URL".into()));
        }
        if spec.index.is_some() && (kind != DatasetKind::Records || record_size.is_some()) {
            return Err(ControlError::Records("--index applies to records datasets without --record-size".into()));
        }
        let sources = self.sources();
        let objects = sources.pin(&spec.urls).await?;
        let shaped = shape(&sources, kind, record_size, objects, spec.index.as_deref()).await?;
        let manifest_hash = manifest_hash(&shaped.objects);
        // Placement takes only a namespace that holds the whole dataset.
        let created = self.create_with(name, kind, record_size, Some(shaped.length_bytes))?;
        let committed = self.commit_source(created, shaped, spec.urls, manifest_hash);
        match committed {
            Ok(record) => Ok(record),
            Err(err) => {
                // Nothing half made stays behind.
                if let Err(undo) = self.delete(name).await {
                    tracing::error!(dataset = name, %undo, "removing a source-backed dataset whose create failed");
                }
                Err(err)
            }
        }
    }

    fn commit_source(
        &self,
        mut record: DatasetRecord,
        shaped: Shaped,
        urls: Vec<String>,
        manifest_hash: String,
    ) -> Result<DatasetRecord, ControlError> {
        let ns = self.namespace(&record)?;
        let geometry = ns.geometry();
        let (capacity, end) = (geometry.capacity_bytes, record.namespace.base_offset_bytes + shaped.length_bytes);
        if geometry.fixed_capacity && end > capacity {
            return Err(ControlError::Ingest(IngestError::NoSpace { needed: end, capacity }));
        }
        ns.truncate(end).map_err(|e| self.ns_error(&record, e))?;
        if !shaped.entries.is_empty() {
            self.index_file(&record)?.append(0, &shaped.entries).map_err(|e| self.ns_error(&record, e))?;
        }
        record.length_bytes = shaped.length_bytes;
        record.record_count = shaped.record_count;
        record.files_ingested = shaped.objects.len() as u32;
        record.state = DatasetState::Sealed;
        record.sealed_unix_ms = Some(now_unix_ms());
        record.source =
            Some(DatasetSource { urls, objects: shaped.objects, manifest_hash, warm_requested: false, pinned: false });
        self.catalog.update(&record, None)?;
        Ok(record)
    }

    /// The cache of a source-backed dataset, made (from its files) on first
    /// use; must run on the control runtime, where its fills then run.
    pub(super) fn cache_for(&self, record: &DatasetRecord) -> Result<Arc<ChunkCache>, ControlError> {
        let Some(source) = &record.source else {
            return Err(ControlError::Source(format!("{} is not source-backed", record.name)));
        };
        let mut caches = self.source_tier.caches.lock().map_err(|_| ControlError::Busy(record.name.clone()))?;
        if let Some(cache) = caches.get(&record.name) {
            return Ok(Arc::clone(cache));
        }
        let runtime = tokio::runtime::Handle::try_current()
            .map_err(|_| ControlError::Source("a cache is made on the control runtime".into()))?;
        let cache = ChunkCache::open(
            &record.name,
            &self.data_dir,
            record.id,
            record.length_bytes,
            record.namespace.base_offset_bytes,
            self.namespace(record)?,
            source.objects.clone(),
            self.sources(),
            runtime,
            source.pinned,
        )
        .map_err(|e| self.ns_error(record, e))?;
        let cache = Arc::new(cache);
        self.sources().budget().register(&cache);
        caches.insert(record.name.clone(), Arc::clone(&cache));
        Ok(cache)
    }

    /// The data plane's view of a source-backed dataset: verified by the
    /// block checksums its fills write.
    pub(super) fn source_view(&self, record: &DatasetRecord) -> Result<DatasetView, ControlError> {
        let cache = self.cache_for(record)?;
        Ok(DatasetView {
            dataset_id: record.id,
            namespace: self.namespace(record)?,
            base_offset_bytes: record.namespace.base_offset_bytes,
            length_bytes: record.length_bytes,
            block_crcs: cache.block_crcs(),
        })
    }

    /// What the transports fill through for `name`, if it is source-backed.
    pub(super) fn read_through(&self, name: &str) -> Option<Arc<dyn sluice_serve::ReadThrough>> {
        let cache = self.source_tier.cache(name)?;
        Some(Arc::new(CacheReader(cache)))
    }

    /// Drops a dataset's cache (at delete, or when a copy of a dataset
    /// deleted elsewhere is dropped; its files go with the namespace).
    pub(super) fn forget_cache(&self, record: &DatasetRecord) {
        let Ok(mut caches) = self.source_tier.caches.lock() else { return };
        if caches.get(&record.name).is_none_or(|c| c.dataset_id != record.id) {
            return;
        }
        if let Some(cache) = caches.remove(&record.name) {
            drop(caches);
            cache.close();
            self.sources().budget().forget(&cache);
        }
    }

    /// Whether this node's copy of `record` is hydrated: its content hash
    /// is taken (by this node or, in a cluster, another) and every chunk
    /// is here.
    fn hydrated_here(record: &DatasetRecord, cache: &ChunkCache) -> bool {
        record.content_hash.is_some() && cache.chunks_present() == cache.chunks_total()
    }

    /// How much of `name` is on the node.
    pub async fn cache_report(&self, name: &str) -> Result<CacheReport, ControlError> {
        let record = self.catalog.require(name)?;
        let cache = self.cache_for(&record)?;
        Ok(cache.report(Self::hydrated_here(&record, &cache)))
    }

    /// The cache of every source-backed dataset, in name order
    /// (`GET /v1/caches`, what `sluicectl top` shows).
    pub fn cache_reports(&self) -> Result<Vec<CacheReport>, ControlError> {
        let mut reports = Vec::new();
        for record in
            self.catalog.list()?.into_iter().filter(|r| r.source.is_some() && r.namespace.kind != NamespaceKind::Remote)
        {
            let cache = self.cache_for(&record)?;
            reports.push(cache.report(Self::hydrated_here(&record, &cache)));
        }
        reports.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(reports)
    }

    /// Starts filling every chunk of `name`, `parallel` runs at once, if it
    /// is not already; at the end the dataset is hydrated. A restart goes
    /// on with a warm it interrupted ([`ControlPlane::resume_warms`]).
    pub async fn warm(self: &Arc<Self>, name: &str, parallel: usize) -> Result<CacheReport, ControlError> {
        let (_, _) = self.open_for_read(name).await?;
        let mut record = self.catalog.require(name)?;
        let cache = self.cache_for(&record)?;
        let hydrated = Self::hydrated_here(&record, &cache);
        let budget = self.sources().budget().max_bytes();
        if budget != 0 && record.length_bytes > budget {
            return Err(ControlError::Source(format!(
                "{name} ({} bytes) is larger than the node's cache budget (cache_bytes_max = {budget}): it cannot be warm whole",
                record.length_bytes
            )));
        }
        if hydrated || cache.warming.swap(true, Ordering::AcqRel) {
            return Ok(cache.report(hydrated));
        }
        if let Some(source) = record.source.as_mut().filter(|s| !s.warm_requested) {
            source.warm_requested = true;
            self.catalog.update(&record, None)?;
        }
        let report = cache.report(false);
        let control = Arc::clone(self);
        let name = name.to_string();
        tokio::spawn(async move {
            // Chunks evicted while the warm ran are filled again.
            let mut filled = Ok(());
            for _ in 0..WARM_PASSES_MAX {
                filled = cache.warm(parallel.max(1)).await;
                if filled.is_err() || cache.chunks_present() == cache.chunks_total() {
                    break;
                }
            }
            let outcome = match filled {
                Ok(()) => {
                    let control = Arc::clone(&control);
                    let name = name.clone();
                    tokio::task::spawn_blocking(move || control.hydrate(&name))
                        .await
                        .map_err(|e| ControlError::Source(e.to_string()))
                        .and_then(|r| r)
                }
                Err(err) => Err(err.into()),
            };
            if let Err(err) = outcome {
                tracing::error!(dataset = name, %err, "warm did not finish; run it again");
            }
            cache.warming.store(false, Ordering::Release);
        });
        Ok(report)
    }

    /// Fills, in the background, the chunks of `ranges` of `name` not on
    /// the node: a loader's hint of the steps ahead. The chunks it queued;
    /// 0 for an ingested dataset (all its bytes are here) or a hint over
    /// the bound of what may wait.
    pub fn prefetch(&self, name: &str, ranges: Vec<sluice_dataplane::ByteRange>) -> Result<u64, ControlError> {
        let record = self.catalog.require(name)?;
        if record.source.is_none() {
            return Ok(0);
        }
        let cache = self.cache_for(&record)?;
        Ok(cache.prefetch(ranges))
    }

    /// Pins `name` (its chunks are never evicted) or unpins it.
    pub fn pin(&self, name: &str, pinned: bool) -> Result<CacheReport, ControlError> {
        let _guard = self.busy(name)?;
        let mut record = self.catalog.require(name)?;
        let Some(source) = record.source.as_mut() else {
            return Err(ControlError::Source(format!(
                "{name} is ingested: only source-backed datasets are ever evicted"
            )));
        };
        if source.pinned != pinned {
            source.pinned = pinned;
            self.catalog.update(&record, None)?;
        }
        let cache = self.cache_for(&record)?;
        cache.pinned.store(pinned, Ordering::Relaxed);
        Ok(cache.report(Self::hydrated_here(&record, &cache)))
    }

    /// At start: opens every source-backed dataset's cache (so the budget
    /// counts what is on the node) and goes on with every warm a restart
    /// interrupted.
    pub async fn resume_warms(self: &Arc<Self>) -> Result<(), ControlError> {
        for record in self.catalog.list()? {
            // In a cluster, only the datasets with a copy on this node.
            if record.source.is_none()
                || record.state != DatasetState::Sealed
                || record.namespace.kind == NamespaceKind::Remote
            {
                continue;
            }
            let cache = self.cache_for(&record)?;
            if record.source.as_ref().is_some_and(|s| s.warm_requested) && !Self::hydrated_here(&record, &cache) {
                tracing::info!(dataset = record.name, "going on with an interrupted warm");
                self.warm(&record.name, 4).await?;
            }
        }
        Ok(())
    }

    /// Once every chunk is present: reads the dataset whole, checks every
    /// block against the checksums its fill wrote, and records the content
    /// hash and chunk checksums (the same an ingest of the same bytes
    /// records). Blocking.
    fn hydrate(&self, name: &str) -> Result<DatasetRecord, ControlError> {
        let _guard = self.busy(name)?;
        let mut record = self.catalog.require(name)?;
        let cache = self.cache_for(&record)?;
        if cache.chunks_present() != cache.chunks_total() {
            return Err(ControlError::Source(format!(
                "{name}: {} of {} chunks present after the warm (evicted under the cache budget meanwhile?)",
                cache.chunks_present(),
                cache.chunks_total()
            )));
        }
        let ns = self.namespace(&record)?;
        let stored = cache.block_crcs();
        let mut hasher = blake3::Hasher::new();
        let mut chunk_crcs = Vec::with_capacity(cache.chunks_total() as usize);
        let mut block_crcs = Vec::with_capacity(stored.len());
        let mut buf = vec![0u8; SOURCE_STEP_BYTES as usize];
        let mut at = 0u64;
        while at < record.length_bytes {
            let len = (record.length_bytes - at).min(SOURCE_STEP_BYTES) as usize;
            let piece = &mut buf[..len];
            ns.read_at(record.namespace.base_offset_bytes + at, piece).map_err(|e| self.ns_error(&record, e))?;
            for chunk in piece.chunks(CHUNK_SIZE_BYTES as usize) {
                let first_block = block_crcs.len();
                chunk_crcs.push(sluice_dataplane::blocks::chunk_crc_and_blocks(chunk, &mut block_crcs));
                if (first_block..block_crcs.len()).any(|b| stored.get(b) != Some(block_crcs[b])) {
                    return Err(ControlError::Corrupt { name: name.into(), chunk: chunk_crcs.len() as u64 - 1 });
                }
            }
            hasher.update(piece);
            at += len as u64;
        }
        let hash = format!("blake3:{}", hasher.finalize().to_hex());
        if record.content_hash.as_ref().is_some_and(|h| *h != hash) {
            // Another node's copy hydrated first: the same pinned objects
            // must give the same bytes.
            return Err(ControlError::Source(format!(
                "{name}: this node's copy hashes as {hash}, the catalog's as {:?}",
                record.content_hash
            )));
        }
        record.content_hash = Some(hash);
        if let Some(source) = record.source.as_mut() {
            source.warm_requested = false;
        }
        self.catalog.update(&record, Some(&chunk_crcs))?;
        tracing::info!(dataset = name, hash = record.content_hash, "hydrated");
        Ok(record)
    }
}

/// `blake3:` of the pinned manifest: each object's URL, size, ETag,
/// version and data span, in order.
fn manifest_hash(objects: &[SourceObject]) -> String {
    let mut hasher = blake3::Hasher::new();
    for o in objects {
        for field in [o.url.as_str(), o.e_tag.as_deref().unwrap_or(""), o.version.as_deref().unwrap_or("")] {
            hasher.update(&(field.len() as u64).to_le_bytes());
            hasher.update(field.as_bytes());
        }
        for n in [o.size_bytes, o.data_offset_bytes, o.data_bytes] {
            hasher.update(&n.to_le_bytes());
        }
    }
    format!("blake3:{}", hasher.finalize().to_hex())
}

/// Fits the pinned objects to `kind`: `.npy` headers of token arrays,
/// whole elements, the records' index, the shards' samples.
async fn shape(
    sources: &Sources,
    kind: DatasetKind,
    record_size: Option<u64>,
    mut objects: Vec<SourceObject>,
    index: Option<&str>,
) -> Result<Shaped, ControlError> {
    let elem = kind.element_size_bytes();
    if kind.npy_dtypes().is_some() {
        match objects.iter().position(|object| object.url.ends_with("/index.json")) {
            Some(index_at) => objects = litdata_chunks(sources, kind, objects, index_at).await?,
            None => refuse_mixed_arrays(&objects)?,
        }
    }
    if kind == DatasetKind::Mds {
        // Mosaic's index.json lies beside the shards it lists; each shard's
        // own header says what sluice needs.
        objects.retain(|object| !object.url.ends_with("/index.json"));
    }
    for object in &mut objects {
        if kind.npy_dtypes().is_some() && object.url.ends_with(".npy") {
            let head = sources.fetch(object, 0..object.size_bytes.min(npy::HEADER_BYTES_MAX as u64)).await?;
            let header = npy::parse_header(&head).map_err(|e| bad_object(object, e))?;
            let accepted = kind.npy_dtypes().unwrap_or(&[]);
            if !accepted.contains(&header.descr.as_str()) {
                return Err(ControlError::Ingest(IngestError::Dtype {
                    found: header.descr,
                    kind,
                    expected: accepted.join(" or "),
                }));
            }
            let data = header.data_len_bytes().ok_or_else(|| bad_object(object, "its shape overflows"))?;
            let offset = header.data_offset_bytes as u64;
            if offset + data != object.size_bytes {
                return Err(ControlError::Ingest(IngestError::TruncatedNpy {
                    expected: data,
                    got: object.size_bytes.saturating_sub(offset),
                }));
            }
            object.data_offset_bytes = offset;
            object.data_bytes = data;
        }
        if object.data_bytes % elem != 0 {
            return Err(ControlError::Ingest(IngestError::PartialElement { len: object.data_bytes, kind, elem }));
        }
        if let Some(size) = record_size {
            if object.data_bytes % size != 0 {
                return Err(bad_object(
                    object,
                    format!("{} bytes is not a whole number of {size}-byte records", object.data_bytes),
                ));
            }
        }
    }
    let length_bytes: u64 = objects.iter().map(|o| o.data_bytes).sum();
    let (record_count, entries) = match (kind, record_size) {
        (DatasetKind::Records, Some(size)) => (length_bytes / size, Vec::new()),
        (DatasetKind::Records, None) => {
            let url = index.ok_or_else(|| {
                ControlError::Records(
                    "a records dataset from a source needs --index URL (its offsets) or --record-size".into(),
                )
            })?;
            let entries = fetch_offsets(sources, url, length_bytes).await?;
            (entries.len() as u64, entries)
        }
        (DatasetKind::Wds, _) => {
            let entries = index_shards(sources, &objects).await?;
            (entries.len() as u64, entries)
        }
        (DatasetKind::Mds, _) => {
            let entries = index_mds_shards(sources, &objects).await?;
            (entries.len() as u64, entries)
        }
        _ => (0, Vec::new()),
    };
    if kind.has_records() && record_count == 0 {
        return Err(ControlError::Records("the source holds no samples".into()));
    }
    Ok(Shaped { objects, length_bytes, record_count, entries })
}

/// Refuses tokens from `.npy` arrays beside objects that are not: a prefix
/// of arrays usually holds other files too (`stats.json`, a README), and
/// taking one of those as raw tokens would splice its bytes into the
/// token stream without a word. All arrays, or all raw token files.
fn refuse_mixed_arrays(objects: &[SourceObject]) -> Result<(), ControlError> {
    let is_array = |object: &&SourceObject| object.url.ends_with(".npy");
    let (Some(array), Some(other)) = (objects.iter().find(is_array), objects.iter().find(|o| !is_array(o))) else {
        return Ok(());
    };
    Err(bad_object(
        other,
        format!(
            "not an .npy array, beside {} which is: a tokens dataset's objects are all .npy arrays or all raw \
             tokens; name the arrays, or keep other objects out of the prefix",
            array.url
        ),
    ))
}

/// A LitData token dataset's chunks (see [`sluice_proto::litdata`]), from
/// the `index.json` at `index_at` among `objects`: in the index's order,
/// each past its header, checked against the index from a ranged read of
/// the header alone. Every other object is refused by name, as a prefix
/// of `.npy` arrays refuses its strays.
async fn litdata_chunks(
    sources: &Sources,
    kind: DatasetKind,
    mut objects: Vec<SourceObject>,
    index_at: usize,
) -> Result<Vec<SourceObject>, ControlError> {
    let index_object = objects.remove(index_at);
    if index_object.size_bytes == 0 || index_object.size_bytes > litdata::INDEX_BYTES_MAX {
        let why = format!(
            "{} bytes; a LitData index.json is 1 to {} bytes",
            index_object.size_bytes,
            litdata::INDEX_BYTES_MAX
        );
        return Err(bad_object(&index_object, why));
    }
    let json = sources.fetch(&index_object, 0..index_object.size_bytes).await?;
    let index = litdata::TokenIndex::parse(&json).map_err(|e| bad_object(&index_object, e))?;
    index.check_kind(kind).map_err(|e| bad_object(&index_object, e))?;
    // The index's URL ends with `/index.json` (how it was found): its
    // directory is the rest, to the `/`.
    let dir = index_object.url.strip_suffix("index.json").unwrap_or(&index_object.url);
    let mut chunks = Vec::with_capacity(index.chunks.len());
    for entry in &index.chunks {
        let url = format!("{dir}{}", entry.filename);
        let Some(at) = objects.iter().position(|object| object.url == url) else {
            let why = format!("names chunk {url}, which the source does not hold (or which it names twice)");
            return Err(bad_object(&index_object, why));
        };
        let mut object = objects.swap_remove(at);
        let header_end = entry.header_bytes().min(object.size_bytes);
        let header = if header_end == 0 { Bytes::new() } else { sources.fetch(&object, 0..header_end).await? };
        let data_bytes = entry
            .check_header(&header, object.size_bytes, index.token_bytes)
            .map_err(|e| bad_object(&object, format!("LitData chunk: {e}")))?;
        object.data_offset_bytes = entry.header_bytes();
        object.data_bytes = data_bytes;
        chunks.push(object);
    }
    if let Some(stray) = objects.first() {
        let why = format!(
            "not a chunk {} names: a LitData dataset's objects are its index.json and the chunks it lists; name \
             its directory alone",
            index_object.url
        );
        return Err(bad_object(stray, why));
    }
    Ok(chunks)
}

fn bad_object(object: &SourceObject, why: impl std::fmt::Display) -> ControlError {
    ControlError::Source(format!("{}: {why}", object.url))
}

/// The samples of MDS shards from their headers alone (a few ranged reads
/// a shard, not the shard), every shard with the first one's columns.
async fn index_mds_shards(sources: &Sources, objects: &[SourceObject]) -> Result<Vec<(u64, u64)>, ControlError> {
    let mut entries = Vec::new();
    let mut start = 0;
    let mut columns = None;
    for object in objects {
        if !object.url.ends_with(".mds") {
            return Err(bad_object(
                object,
                "not an MDS shard (.mds): an mds dataset's objects are uncompressed shards (Mosaic's index.json \
                 beside them is passed over); decompress .mds.zstd shards first",
            ));
        }
        let mut indexer = MdsIndexer::new(columns.clone());
        let mut at = 0;
        loop {
            let wanted = indexer.header_bytes_wanted().map_err(|e| bad_object(object, e))?;
            if wanted == 0 {
                break;
            }
            if at + wanted > object.size_bytes {
                return Err(bad_object(
                    object,
                    format!("an MDS shard of {} bytes ends inside its header", object.size_bytes),
                ));
            }
            let piece = sources.fetch(object, at..at + wanted).await?;
            indexer.push(&piece).map_err(|e| bad_object(object, e))?;
            at += wanted;
        }
        columns = columns.or_else(|| indexer.columns().cloned());
        let spans = indexer.finish_at(object.size_bytes).map_err(|e| bad_object(object, e))?;
        entries.extend(spans.into_iter().map(|(offset, len)| (start + offset, len)));
        start += object.data_bytes;
    }
    Ok(entries)
}

/// A records dataset's offsets object, checked against the data.
async fn fetch_offsets(sources: &Sources, url: &str, length_bytes: u64) -> Result<Vec<(u64, u64)>, ControlError> {
    let pinned = sources.pin(&[url.to_string()]).await?;
    let [object] = pinned.as_slice() else {
        return Err(ControlError::Records(format!("--index {url} must name one object")));
    };
    if object.size_bytes as usize > STAGED_INDEX_BYTES_MAX || object.size_bytes == 0 {
        return Err(bad_object(object, format!("an offsets object of {} bytes", object.size_bytes)));
    }
    let bytes = sources.fetch(object, 0..object.size_bytes).await?;
    let format = if url.ends_with(".npy") { IngestFormat::Npy } else { IngestFormat::Raw };
    let offsets = super::datasets::parse_offsets(&bytes, format)?;
    if offsets.first() != Some(&0) || offsets.last() != Some(&length_bytes) || offsets.windows(2).any(|w| w[0] > w[1]) {
        return Err(ControlError::Records(format!(
            "the offsets in {url} must rise from 0 to the data's {length_bytes} bytes"
        )));
    }
    Ok(offsets.windows(2).map(|w| (w[0], w[1] - w[0])).collect())
}

/// The samples of every shard: a tar has no directory, so each is read
/// once, in pieces, through the same indexer ingest uses.
async fn index_shards(sources: &Sources, objects: &[SourceObject]) -> Result<Vec<(u64, u64)>, ControlError> {
    let mut entries = Vec::new();
    let mut start = 0;
    for object in objects {
        let mut indexer = TarIndexer::new();
        let mut at = 0;
        while at < object.size_bytes {
            let end = (at + SOURCE_STEP_BYTES).min(object.size_bytes);
            let piece = sources.fetch(object, at..end).await?;
            indexer.push(&piece).map_err(|e| bad_object(object, e))?;
            at = end;
        }
        let spans = indexer.finish().map_err(|e| bad_object(object, e))?;
        entries.extend(spans.iter().map(|s| (start + s.offset_bytes, s.len_bytes)));
        start += object.data_bytes;
    }
    Ok(entries)
}
