//! The node's cache budget and eviction: source-backed chunks on the node
//! take at most `cache_bytes_max` bytes; a fill that needs room evicts the
//! coldest chunks (CLOCK: a reference bit per chunk, set by each read and
//! cleared as the hand passes) of unpinned source-backed datasets. An
//! ingested dataset is not a cache and is never counted or evicted; a
//! pinned one is counted and never evicted.
//!
//! An eviction must never take bytes from under a read: a read holds a
//! [`ReadLease`] from before it checks its chunks' bits until its result
//! is dropped. Readers count themselves in one of two counters by the
//! parity of an epoch; an eviction clears the victims' bits, moves the
//! epoch on, and waits for the old parity's readers to finish before it
//! discards the bytes. A reader that counted itself before the clear is
//! waited for; one after it finds the bits clear and fills. While an
//! eviction runs its chunks are claimed in the in-flight table, so no fill
//! writes them until the discard is done.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use sluice_proto::CHUNK_SIZE_BYTES;
use tokio::sync::watch;

use super::cache::{ChunkCache, RunEnd};

/// How long an eviction waits for the reads that hold its chunks; past
/// it, the chunks stay (a read that long is a stuck client, bounded by
/// the transports' write timeout).
const DRAIN_WAIT_MAX: Duration = Duration::from_secs(30);

/// Passes of the clock over every chunk before an eviction gives up.
const CLOCK_PASSES_MAX: usize = 2;

/// Keeps the chunks a read checked from eviction until dropped.
pub struct ReadLease {
    cache: Arc<ChunkCache>,
    parity: usize,
}

impl ReadLease {
    pub(super) fn take(cache: &Arc<ChunkCache>) -> Self {
        let parity = (cache.epoch.load(Ordering::SeqCst) & 1) as usize;
        cache.readers[parity].fetch_add(1, Ordering::SeqCst);
        Self { cache: Arc::clone(cache), parity }
    }
}

impl Drop for ReadLease {
    fn drop(&mut self) {
        self.cache.readers[self.parity].fetch_sub(1, Ordering::SeqCst);
    }
}

/// Source-backed bytes on the node, and the clock that evicts them.
pub struct CacheBudget {
    /// 0: no budget.
    max_bytes: u64,
    used_bytes: std::sync::atomic::AtomicU64,
    caches: Mutex<Vec<Weak<ChunkCache>>>,
    /// The clock hand (cache, chunk); held by one eviction at a time.
    hand: tokio::sync::Mutex<(usize, u64)>,
}

impl CacheBudget {
    pub fn new(max_bytes: u64) -> Self {
        Self { max_bytes, used_bytes: 0.into(), caches: Mutex::new(Vec::new()), hand: tokio::sync::Mutex::new((0, 0)) }
    }

    pub fn max_bytes(&self) -> u64 {
        self.max_bytes
    }

    pub fn used_bytes(&self) -> u64 {
        self.used_bytes.load(Ordering::SeqCst)
    }

    /// Counts a cache's present chunks, and evicts from it from now on.
    pub fn register(&self, cache: &Arc<ChunkCache>) {
        self.used_bytes.fetch_add(cache.present_bytes(), Ordering::SeqCst);
        if let Ok(mut caches) = self.caches.lock() {
            caches.retain(|c| c.strong_count() > 0);
            caches.push(Arc::downgrade(cache));
        }
    }

    /// A cache going away (its dataset deleted) gives its bytes back.
    pub fn forget(&self, cache: &ChunkCache) {
        self.release(cache.present_bytes());
    }

    pub fn release(&self, bytes: u64) {
        let _ = self.used_bytes.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |u| Some(u.saturating_sub(bytes)));
    }

    /// Room for `bytes` more, evicting to make it; `filling` is the cache
    /// the room is for (its chunks may be evicted too, unless pinned).
    pub async fn reserve(&self, bytes: u64, filling: &ChunkCache) -> Result<(), String> {
        if self.max_bytes == 0 {
            self.used_bytes.fetch_add(bytes, Ordering::SeqCst);
            return Ok(());
        }
        if bytes > self.max_bytes {
            return Err(format!("a fill of {bytes} bytes is more than the cache budget of {}", self.max_bytes));
        }
        loop {
            let used = self.used_bytes.load(Ordering::SeqCst);
            if used + bytes <= self.max_bytes {
                if self.used_bytes.compare_exchange(used, used + bytes, Ordering::SeqCst, Ordering::SeqCst).is_ok() {
                    return Ok(());
                }
                continue;
            }
            let freed = self.evict(used + bytes - self.max_bytes).await;
            if freed == 0 {
                return Err(format!(
                    "the cache budget of {} bytes is full of pinned or in-use chunks (filling {})",
                    self.max_bytes,
                    filling.name()
                ));
            }
        }
    }

    /// Evicts at least `needed` bytes if it can; the bytes freed.
    async fn evict(&self, needed: u64) -> u64 {
        // One eviction at a time; the caller checks the room again after.
        let mut hand = self.hand.lock().await;
        let caches: Vec<Arc<ChunkCache>> =
            self.caches.lock().map(|c| c.iter().filter_map(Weak::upgrade).collect()).unwrap_or_default();
        let total: u64 = caches.iter().map(|c| c.chunks_total()).sum();
        let mut victims: Vec<Vec<u64>> = vec![Vec::new(); caches.len()];
        let mut chosen = 0;
        let mut steps = 0;
        while chosen < needed && steps < total * CLOCK_PASSES_MAX as u64 && !caches.is_empty() {
            let (index, chunk) = (hand.0 % caches.len(), hand.1);
            let cache = &caches[index];
            if chunk >= cache.chunks_total() {
                *hand = (index + 1, 0);
                continue;
            }
            *hand = (index, chunk + 1);
            steps += 1;
            if cache.pinned.load(Ordering::Relaxed) || !cache.is_present(chunk) {
                continue;
            }
            let (word, bit) = ((chunk / 64) as usize, 1u64 << (chunk % 64));
            if cache.referenced[word].fetch_and(!bit, Ordering::Relaxed) & bit != 0 {
                continue; // Read since the hand last passed: a second chance.
            }
            victims[index].push(chunk);
            chosen += cache.chunk_bytes(chunk);
        }
        let mut freed = 0;
        for (cache, chunks) in caches.iter().zip(victims) {
            if !chunks.is_empty() {
                freed += cache.evict(chunks).await;
            }
        }
        self.release(freed);
        freed
    }
}

impl ChunkCache {
    /// Evicts `chunks` (present, chosen by the clock): claims them, clears
    /// their bits, waits for the reads that may hold them, records their
    /// absence, then discards their bytes. The bytes freed.
    async fn evict(self: &Arc<Self>, mut chunks: Vec<u64>) -> u64 {
        let (done, wait) = watch::channel(None);
        {
            let Ok(mut in_flight) = self.in_flight.lock() else { return 0 };
            chunks.retain(|c| !in_flight.contains_key(c) && self.is_present(*c));
            for &chunk in &chunks {
                in_flight.insert(chunk, wait.clone());
                self.present_words()[(chunk / 64) as usize].fetch_and(!(1u64 << (chunk % 64)), Ordering::SeqCst);
            }
        }
        let old = (self.epoch.fetch_add(1, Ordering::SeqCst) & 1) as usize;
        let deadline = Instant::now() + DRAIN_WAIT_MAX;
        while self.readers[old].load(Ordering::SeqCst) != 0 && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_micros(200)).await;
        }
        let drained = self.readers[old].load(Ordering::SeqCst) == 0;
        let cache = Arc::clone(self);
        let victims = chunks.clone();
        let discarded = tokio::task::spawn_blocking(move || cache.discard(&victims, drained)).await;
        let freed = match discarded {
            Ok(Ok(freed)) => freed,
            Ok(Err(err)) => {
                tracing::error!(dataset = self.name(), %err, "evicting chunks");
                0
            }
            Err(_) => 0,
        };
        if let Ok(mut in_flight) = self.in_flight.lock() {
            for chunk in &chunks {
                in_flight.remove(chunk);
            }
        }
        let _ = done.send(Some(RunEnd::Evicted));
        freed
    }

    /// The blocking half of an eviction: the bits on disk, then the bytes.
    /// Not `drained` (a read still holds them): the bits come back and
    /// nothing is freed.
    fn discard(&self, chunks: &[u64], drained: bool) -> std::io::Result<u64> {
        let _open = self.writable()?;
        if !drained {
            for &chunk in chunks {
                self.present_words()[(chunk / 64) as usize].fetch_or(1u64 << (chunk % 64), Ordering::SeqCst);
            }
            tracing::warn!(dataset = self.name(), "reads held chunks past {DRAIN_WAIT_MAX:?}; not evicting them");
            return Ok(0);
        }
        {
            let files = self.files()?;
            for &chunk in chunks {
                self.persist_bits(&files, chunk..chunk + 1)?;
            }
        }
        let mut freed = 0;
        for &chunk in chunks {
            let bytes = self.chunk_bytes(chunk);
            self.namespace().discard(self.base_offset_bytes() + chunk * CHUNK_SIZE_BYTES, bytes)?;
            freed += bytes;
        }
        self.stats.chunks_evicted.fetch_add(chunks.len() as u64, Ordering::Relaxed);
        self.stats.bytes_evicted.fetch_add(freed, Ordering::Relaxed);
        Ok(freed)
    }
}
