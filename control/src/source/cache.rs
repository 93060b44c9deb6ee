//! A source-backed dataset's namespace as a cache of its source: which
//! chunks are on the node, filling the missing ones, and what survives a
//! crash.
//!
//! Two files per dataset beside the data, `DATA_DIR/cache/<id>.present`
//! (a bit per 64 KiB chunk) and `<id>.crc` (the block checksums reads are
//! verified by, a little-endian u32 per 4 KiB). A fill makes a run of
//! chunks durable in this order: their bytes in the namespace, then their
//! block checksums, then their bits. A chunk whose bit is set is whole
//! and vouched for; a crash anywhere before leaves the bit clear and the
//! chunk is fetched again, however much of it was written.
//!
//! Concurrent readers of one missing chunk cause one fetch: the first
//! claims it in the in-flight table and the others wait on its outcome.
//! Fetches run on the control runtime, never on a data-plane core or a
//! connection's task.

use std::collections::{BTreeSet, HashMap};
use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use futures_util::stream::{FuturesUnordered, StreamExt};
use sluice_dataplane::blocks::{self, BLOCKS_PER_CHUNK};
use sluice_dataplane::{BlockCrcs, ByteRange, Namespace};
use sluice_proto::api::{CacheReport, SourceObject};
use sluice_proto::{RangeStatus, CHUNK_SIZE_BYTES};
use tokio::sync::watch;

use super::{FetchError, Sources};

/// Chunks fetched by one ranged GET (per object) at most: 4 MiB.
pub const RUN_CHUNKS_MAX: u64 = 64;

/// How one chunk's fill ended.
type RunOutcome = Result<(), FetchError>;

/// How a claim on chunks ended, as waiters on it see it.
#[derive(Debug)]
pub(super) enum RunEnd {
    /// A fill: its first chunk and an outcome per chunk.
    Filled { first: u64, outcomes: Arc<Vec<RunOutcome>> },
    /// An eviction: the chunks are gone; fill them again.
    Evicted,
}

/// What waiters on a claim see (`None` while it runs).
pub(super) type RunResult = Option<RunEnd>;

/// Chunks prefetch hints may have waiting to fill, per dataset (1 GiB).
pub const PREFETCH_CHUNKS_MAX: u64 = 16_384;

/// Times a reader fills and finds its chunks evicted again before it
/// could read them, before its ranges fail as unavailable.
pub(super) const FILL_ATTEMPTS_MAX: usize = 4;

/// The cache files of one dataset.
pub(super) struct CacheFiles {
    present: File,
    crcs: File,
}

/// Where a dataset's cache files live.
pub fn cache_paths(data_dir: &Path, dataset_id: u64) -> (PathBuf, PathBuf) {
    let dir = data_dir.join("cache");
    (dir.join(format!("{dataset_id:016x}.present")), dir.join(format!("{dataset_id:016x}.crc")))
}

/// Counters of one dataset's cache since the node started.
#[derive(Default)]
pub(super) struct CacheStats {
    pub(super) reads_present: AtomicU64,
    pub(super) reads_filled: AtomicU64,
    chunks_filled: AtomicU64,
    bytes_filled: AtomicU64,
    source_errors: AtomicU64,
    source_changed: AtomicU64,
    pub(super) chunks_evicted: AtomicU64,
    pub(super) bytes_evicted: AtomicU64,
    /// Fill runs committed and the time they took, for the mean latency.
    fills: AtomicU64,
    fill_micros: AtomicU64,
    last_error: Mutex<Option<String>>,
}

/// A source-backed dataset's chunks: present or not, and how to fill them.
pub struct ChunkCache {
    name: String,
    /// The dataset it caches (a dataset deleted and made again under the
    /// same name is another).
    pub(crate) dataset_id: u64,
    length_bytes: u64,
    base_offset_bytes: u64,
    namespace: Arc<dyn Namespace>,
    objects: Vec<SourceObject>,
    /// Where each object's data starts in the dataset.
    starts: Vec<u64>,
    sources: Arc<Sources>,
    /// A bit per chunk; set (release) only once the chunk and its block
    /// checksums are durable.
    present: Vec<AtomicU64>,
    block_crcs: BlockCrcs,
    files: Mutex<CacheFiles>,
    /// Chunks being fetched or evicted now, each with the end its claim
    /// sends.
    pub(super) in_flight: Mutex<HashMap<u64, watch::Receiver<RunResult>>>,
    /// A bit per chunk read since the eviction clock last passed it.
    pub(super) referenced: Vec<AtomicU64>,
    /// Readers holding leases, by epoch parity ([`super::evict`]).
    pub(super) readers: [AtomicU64; 2],
    pub(super) epoch: AtomicU64,
    /// `dataset pin`: never evicted.
    pub(crate) pinned: AtomicBool,
    /// Chunks queued by prefetch hints and not yet filled.
    pub(super) prefetching: AtomicU64,
    /// Cleared at delete, before the namespace is given back.
    open: std::sync::RwLock<bool>,
    pub(super) runtime: tokio::runtime::Handle,
    pub(super) stats: CacheStats,
    pub(crate) warming: AtomicBool,
    budget: Arc<super::evict::CacheBudget>,
}

impl std::fmt::Debug for ChunkCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChunkCache").field("name", &self.name).field("length_bytes", &self.length_bytes).finish()
    }
}

impl ChunkCache {
    /// The cache of a dataset of `length_bytes` made of `objects`, with
    /// what its files say is present (nothing, if they are missing or do
    /// not fit the dataset).
    #[allow(clippy::too_many_arguments)]
    pub fn open(
        name: &str,
        data_dir: &Path,
        dataset_id: u64,
        length_bytes: u64,
        base_offset_bytes: u64,
        namespace: Arc<dyn Namespace>,
        objects: Vec<SourceObject>,
        sources: Arc<Sources>,
        runtime: tokio::runtime::Handle,
        pinned: bool,
    ) -> std::io::Result<Self> {
        let chunks = length_bytes.div_ceil(CHUNK_SIZE_BYTES);
        let block_count = blocks::block_count(length_bytes);
        let bitmap_bytes = chunks.div_ceil(8);
        let crc_bytes = block_count * 4;
        let (present_path, crc_path) = cache_paths(data_dir, dataset_id);
        if let Some(dir) = present_path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        let open = |path: &Path| OpenOptions::new().read(true).write(true).create(true).truncate(false).open(path);
        let present_file = open(&present_path)?;
        let crc_file = open(&crc_path)?;
        let fits = present_file.metadata()?.len() == bitmap_bytes && crc_file.metadata()?.len() == crc_bytes;
        if !fits {
            // New, or left by another length: nothing in it is vouched for.
            present_file.set_len(0)?;
            present_file.set_len(bitmap_bytes)?;
            crc_file.set_len(crc_bytes)?;
            present_file.sync_all()?;
            crc_file.sync_all()?;
        }
        let mut bitmap = vec![0u8; bitmap_bytes as usize];
        present_file.read_exact_at(&mut bitmap, 0)?;
        let mut crc_raw = vec![0u8; crc_bytes as usize];
        crc_file.read_exact_at(&mut crc_raw, 0)?;
        let crcs: Vec<u32> = crc_raw.chunks_exact(4).map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
        let words = chunks.div_ceil(64) as usize;
        let present: Vec<AtomicU64> = bitmap
            .chunks(8)
            .map(|word| {
                let mut bytes = [0u8; 8];
                bytes[..word.len()].copy_from_slice(word);
                AtomicU64::new(u64::from_le_bytes(bytes))
            })
            .collect();
        let mut starts = Vec::with_capacity(objects.len());
        let mut at = 0;
        for object in &objects {
            starts.push(at);
            at += object.data_bytes;
        }
        assert_eq!(at, length_bytes, "objects out of step with the dataset's length");
        Ok(Self {
            name: name.to_string(),
            dataset_id,
            length_bytes,
            base_offset_bytes,
            namespace,
            objects,
            starts,
            present,
            block_crcs: BlockCrcs::from(crcs),
            files: Mutex::new(CacheFiles { present: present_file, crcs: crc_file }),
            in_flight: Mutex::new(HashMap::new()),
            referenced: (0..words).map(|_| AtomicU64::new(0)).collect(),
            readers: [AtomicU64::new(0), AtomicU64::new(0)],
            epoch: AtomicU64::new(0),
            pinned: AtomicBool::new(pinned),
            prefetching: AtomicU64::new(0),
            open: std::sync::RwLock::new(true),
            runtime,
            stats: CacheStats::default(),
            warming: AtomicBool::new(false),
            budget: Arc::clone(&sources.budget),
            sources,
        })
    }

    /// The block checksums the data plane verifies reads by, shared with
    /// the fills that write them.
    pub fn block_crcs(&self) -> BlockCrcs {
        self.block_crcs.clone()
    }

    pub fn chunks_total(&self) -> u64 {
        self.length_bytes.div_ceil(CHUNK_SIZE_BYTES)
    }

    pub fn chunks_present(&self) -> u64 {
        self.present.iter().map(|w| u64::from(w.load(Ordering::Acquire).count_ones())).sum()
    }

    pub fn is_present(&self, chunk: u64) -> bool {
        // SeqCst: the other half of an eviction's clear-then-drain
        // ([`super::evict`]).
        let word = self.present[(chunk / 64) as usize].load(Ordering::SeqCst);
        word & (1 << (chunk % 64)) != 0
    }

    /// Bytes of chunk `chunk` (the last may be short).
    pub(super) fn chunk_bytes(&self, chunk: u64) -> u64 {
        (self.length_bytes - chunk * CHUNK_SIZE_BYTES).min(CHUNK_SIZE_BYTES)
    }

    /// Bytes of the chunks present.
    pub(super) fn present_bytes(&self) -> u64 {
        (0..self.chunks_total()).filter(|&c| self.is_present(c)).map(|c| self.chunk_bytes(c)).sum()
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// The chunks a range covers; none for an empty range or one past the
    /// end (the data plane answers those).
    pub(super) fn chunks_of(&self, range: ByteRange) -> std::ops::Range<u64> {
        let end = range.offset_bytes.saturating_add(u64::from(range.len_bytes));
        if range.len_bytes == 0 || end > self.length_bytes {
            return 0..0;
        }
        range.offset_bytes / CHUNK_SIZE_BYTES..end.div_ceil(CHUNK_SIZE_BYTES)
    }

    pub fn report(&self, hydrated: bool) -> CacheReport {
        let s = &self.stats;
        CacheReport {
            name: self.name.clone(),
            chunks_total: self.chunks_total(),
            chunks_present: self.chunks_present(),
            warming: self.warming.load(Ordering::Relaxed),
            hydrated,
            reads_present: s.reads_present.load(Ordering::Relaxed),
            reads_filled: s.reads_filled.load(Ordering::Relaxed),
            chunks_filled: s.chunks_filled.load(Ordering::Relaxed),
            bytes_filled: s.bytes_filled.load(Ordering::Relaxed),
            source_errors: s.source_errors.load(Ordering::Relaxed),
            source_changed: s.source_changed.load(Ordering::Relaxed),
            chunks_evicted: s.chunks_evicted.load(Ordering::Relaxed),
            bytes_evicted: s.bytes_evicted.load(Ordering::Relaxed),
            fill_mean_micros: s
                .fill_micros
                .load(Ordering::Relaxed)
                .checked_div(s.fills.load(Ordering::Relaxed))
                .unwrap_or(0),
            pinned: self.pinned.load(Ordering::Relaxed),
            last_error: s.last_error.lock().ok().and_then(|e| e.clone()),
        }
    }

    /// Fills what `ranges` need; a status per range.
    pub async fn fill_ranges(self: &Arc<Self>, ranges: &[ByteRange]) -> Vec<RangeStatus> {
        let needed: BTreeSet<u64> =
            ranges.iter().flat_map(|r| self.chunks_of(*r)).filter(|&c| !self.is_present(c)).collect();
        let outcomes = self.ensure(needed).await;
        ranges
            .iter()
            .map(|r| {
                let mut status = RangeStatus::Ok;
                for chunk in self.chunks_of(*r) {
                    match outcomes.get(&chunk) {
                        Some(Err(FetchError::Changed { .. })) => return RangeStatus::SourceChanged,
                        Some(Err(FetchError::Unavailable { .. })) => status = RangeStatus::SourceUnavailable,
                        _ => {}
                    }
                }
                status
            })
            .collect()
    }

    /// Makes `chunks` present: claims those no one is fetching, in runs of
    /// consecutive chunks, and waits for those someone is. The outcome of
    /// each chunk that was missing.
    pub async fn ensure(self: &Arc<Self>, chunks: BTreeSet<u64>) -> HashMap<u64, RunOutcome> {
        self.ensure_as(chunks, false).await
    }

    /// As [`ChunkCache::ensure`]; `background` fills (prefetch hints)
    /// take at most a quarter of the node's fetch slots, so a read
    /// that waits on its fill is not queued behind them.
    pub async fn ensure_as(self: &Arc<Self>, chunks: BTreeSet<u64>, background: bool) -> HashMap<u64, RunOutcome> {
        let mut waits: Vec<(u64, watch::Receiver<RunResult>)> = Vec::new();
        let mut claimed: Vec<Vec<u64>> = Vec::new();
        {
            let Ok(mut in_flight) = self.in_flight.lock() else {
                return chunks.into_iter().map(|c| (c, Err(self.unavailable("the fill table is poisoned")))).collect();
            };
            for chunk in chunks {
                if self.is_present(chunk) {
                    continue;
                }
                // A fill that died (its sender gone) holds nothing.
                if let Some(wait) = in_flight.get(&chunk).filter(|w| w.has_changed().is_ok()) {
                    waits.push((chunk, wait.clone()));
                    continue;
                }
                match claimed.last_mut() {
                    Some(run) if run.last().is_some_and(|&l| l + 1 == chunk) && (run.len() as u64) < RUN_CHUNKS_MAX => {
                        run.push(chunk)
                    }
                    _ => claimed.push(vec![chunk]),
                }
            }
            for run in &mut claimed {
                let (done, wait) = watch::channel(None);
                for &chunk in run.iter() {
                    in_flight.insert(chunk, wait.clone());
                }
                waits.extend(run.iter().map(|&c| (c, wait.clone())));
                let cache = Arc::clone(self);
                let first = run[0];
                let count = run.len() as u64;
                self.runtime.spawn(async move {
                    let outcomes = cache.fill_run(first, count, background).await;
                    if let Ok(mut in_flight) = cache.in_flight.lock() {
                        for chunk in first..first + count {
                            in_flight.remove(&chunk);
                        }
                    }
                    let _ = done.send(Some(RunEnd::Filled { first, outcomes: Arc::new(outcomes) }));
                });
            }
        }
        let mut outcomes = HashMap::new();
        for (chunk, mut wait) in waits {
            let outcome = match wait.wait_for(Option::is_some).await {
                Ok(run) => match &*run {
                    Some(RunEnd::Filled { first, outcomes }) => outcomes[(chunk - first) as usize].clone(),
                    // The caller finds it missing and fills it again.
                    Some(RunEnd::Evicted) => Ok(()),
                    None => Err(self.unavailable("the fill ended without an outcome")),
                },
                Err(_) => Err(self.unavailable("the fill ended without an outcome")),
            };
            outcomes.insert(chunk, outcome);
        }
        outcomes
    }

    pub(super) fn unavailable(&self, why: &str) -> FetchError {
        FetchError::Unavailable { url: self.name.clone(), why: why.to_string(), attempts: 0 }
    }

    /// Fetches chunks `first..first + count` from the objects that hold
    /// them and commits those that arrived whole; an outcome per chunk (a
    /// chunk fails if any object it spans failed).
    async fn fill_run(self: &Arc<Self>, first: u64, count: u64, background: bool) -> Vec<RunOutcome> {
        let start = first * CHUNK_SIZE_BYTES;
        let end = ((first + count) * CHUNK_SIZE_BYTES).min(self.length_bytes);
        let started = std::time::Instant::now();
        // Room first: the budget evicts the coldest chunks to make it.
        if let Err(why) = self.budget.reserve(end - start, self).await {
            let err = self.unavailable(&why);
            self.note_error(&err);
            return vec![Err(err); count as usize];
        }
        let background_permit = match background {
            true => self.sources.background_fetches.acquire().await.ok(),
            false => None,
        };
        let Ok(permit) = self.sources.fetches.acquire().await else {
            self.budget.release(end - start);
            return vec![Err(self.unavailable("shutting down")); count as usize];
        };
        let mut outcomes: Vec<RunOutcome> = vec![Ok(()); count as usize];
        let mut data = vec![0u8; (end - start) as usize];
        // The first object holding `start`, then on until `end`.
        let mut index = self.starts.partition_point(|&s| s <= start) - 1;
        let mut at = start;
        while at < end {
            let object = &self.objects[index];
            let within = at - self.starts[index];
            let take = (object.data_bytes - within).min(end - at);
            if take > 0 {
                let from = object.data_offset_bytes + within;
                match self.sources.fetch(object, from..from + take).await {
                    Ok(bytes) => data[(at - start) as usize..][..take as usize].copy_from_slice(&bytes),
                    Err(err) => {
                        self.note_error(&err);
                        for chunk in at / CHUNK_SIZE_BYTES..(at + take).div_ceil(CHUNK_SIZE_BYTES) {
                            outcomes[(chunk - first) as usize] = Err(err.clone());
                        }
                    }
                }
            }
            at += take;
            index += 1;
        }
        drop(permit);
        drop(background_permit);
        let whole: Vec<bool> = outcomes.iter().map(Result::is_ok).collect();
        let cache = Arc::clone(self);
        let committed = tokio::task::spawn_blocking(move || {
            // Each stretch of chunks that arrived whole, in one write.
            let mut written = Vec::new();
            let mut a = 0;
            while a < whole.len() {
                if !whole[a] {
                    a += 1;
                    continue;
                }
                let b = a + whole[a..].iter().take_while(|w| **w).count();
                let bytes = &data[a * CHUNK_SIZE_BYTES as usize..(b * CHUNK_SIZE_BYTES as usize).min(data.len())];
                written.push((a, b, cache.commit(first + a as u64, bytes).map_err(|e| e.to_string())));
                a = b;
            }
            written
        })
        .await;
        match committed {
            Ok(written) => {
                for (a, b, result) in written {
                    match result {
                        Ok(()) => {
                            let bytes = ((first + b as u64) * CHUNK_SIZE_BYTES).min(self.length_bytes)
                                - (first + a as u64) * CHUNK_SIZE_BYTES;
                            self.stats.chunks_filled.fetch_add((b - a) as u64, Ordering::Relaxed);
                            self.stats.bytes_filled.fetch_add(bytes, Ordering::Relaxed);
                        }
                        Err(why) => {
                            let err = self.unavailable(&format!("writing the cache: {why}"));
                            self.note_error(&err);
                            outcomes[a..b].fill(Err(err));
                        }
                    }
                }
            }
            Err(join) => outcomes.fill(Err(self.unavailable(&join.to_string()))),
        }
        // Room reserved for chunks that did not arrive goes back.
        let unfilled: u64 =
            (0..count).filter(|&i| outcomes[i as usize].is_err()).map(|i| self.chunk_bytes(first + i)).sum();
        self.budget.release(unfilled);
        self.stats.fills.fetch_add(1, Ordering::Relaxed);
        self.stats.fill_micros.fetch_add(started.elapsed().as_micros() as u64, Ordering::Relaxed);
        outcomes
    }

    pub(super) fn note_error(&self, err: &FetchError) {
        let counter = match err {
            FetchError::Changed { .. } => &self.stats.source_changed,
            FetchError::Unavailable { .. } => &self.stats.source_errors,
        };
        counter.fetch_add(1, Ordering::Relaxed);
        tracing::error!(dataset = self.name, %err, "fill failed");
        if let Ok(mut last) = self.stats.last_error.lock() {
            *last = Some(err.to_string());
        }
    }

    /// Makes `data` (chunks from `first` on) durable and present: bytes,
    /// then block checksums, then bits.
    fn commit(&self, first: u64, data: &[u8]) -> std::io::Result<()> {
        let _open = self.writable()?;
        let start = first * CHUNK_SIZE_BYTES;
        self.namespace.write_at(self.base_offset_bytes + start, data)?;
        self.namespace.sync()?;
        let mut crcs = Vec::with_capacity(blocks::block_count(data.len() as u64) as usize);
        blocks::extend_block_crcs(&mut crcs, data);
        let first_block = first * BLOCKS_PER_CHUNK;
        let raw: Vec<u8> = crcs.iter().flat_map(|c| c.to_le_bytes()).collect();
        let files = self.files.lock().map_err(|_| std::io::Error::other("cache files poisoned"))?;
        files.crcs.write_all_at(&raw, first_block * 4)?;
        files.crcs.sync_data()?;
        self.block_crcs.set(first_block as usize, &crcs);
        let count = (data.len() as u64).div_ceil(CHUNK_SIZE_BYTES);
        for chunk in first..first + count {
            let (word, bit) = ((chunk / 64) as usize, 1u64 << (chunk % 64));
            self.referenced[word].fetch_or(bit, Ordering::Relaxed);
            self.present[word].fetch_or(bit, Ordering::SeqCst);
        }
        self.persist_bits(&files, first..first + count)
    }

    /// Writes the bitmap bytes that hold chunks `chunks`, as they are now,
    /// and makes them durable.
    pub(super) fn persist_bits(&self, files: &CacheFiles, chunks: std::ops::Range<u64>) -> std::io::Result<()> {
        let (byte_first, byte_end) = (chunks.start / 8, chunks.end.div_ceil(8));
        let bytes: Vec<u8> = (byte_first..byte_end)
            .map(|b| (self.present[(b / 8) as usize].load(Ordering::SeqCst) >> ((b % 8) * 8)) as u8)
            .collect();
        files.present.write_all_at(&bytes, byte_first)?;
        files.present.sync_data()
    }

    /// Held while the namespace is written (a fill, an eviction's
    /// discard): a deleted dataset's namespace may already hold another's.
    pub(super) fn writable(&self) -> std::io::Result<std::sync::RwLockReadGuard<'_, bool>> {
        let open = self.open.read().map_err(|_| std::io::Error::other("cache state poisoned"))?;
        if !*open {
            return Err(std::io::Error::other("the dataset was deleted"));
        }
        Ok(open)
    }

    /// No write reaches the namespace from now on (the dataset is being
    /// deleted); waits for any under way.
    pub fn close(&self) {
        if let Ok(mut open) = self.open.write() {
            *open = false;
        }
    }

    /// The cache files, for an eviction's bitmap update.
    pub(super) fn files(&self) -> std::io::Result<std::sync::MutexGuard<'_, CacheFiles>> {
        self.files.lock().map_err(|_| std::io::Error::other("cache files poisoned"))
    }

    pub(super) fn namespace(&self) -> &Arc<dyn Namespace> {
        &self.namespace
    }

    pub(super) fn base_offset_bytes(&self) -> u64 {
        self.base_offset_bytes
    }

    pub(super) fn present_words(&self) -> &[AtomicU64] {
        &self.present
    }

    /// Fills every missing chunk, `parallel` runs at once; the first error
    /// if any chunk could not be filled (the others are filled still).
    pub async fn warm(self: &Arc<Self>, parallel: usize) -> Result<(), FetchError> {
        let missing: Vec<u64> = (0..self.chunks_total()).filter(|&c| !self.is_present(c)).collect();
        let mut runs = missing.chunk_by(|a, b| b - a == 1).flat_map(|run| run.chunks(RUN_CHUNKS_MAX as usize));
        let mut filling = FuturesUnordered::new();
        let mut first_error = None;
        loop {
            while filling.len() < parallel.max(1) {
                let Some(run) = runs.next() else { break };
                filling.push(self.ensure(run.iter().copied().collect()));
            }
            let Some(outcomes) = filling.next().await else { break };
            if let Some(Err(err)) = outcomes.into_values().find(Result::is_err) {
                first_error.get_or_insert(err);
            }
        }
        first_error.map_or(Ok(()), Err)
    }
}
