//! The serving side of a cache: what a batch of a source-backed dataset
//! does before the data plane reads it (a lease when its chunks are all
//! present, a fill when not), and the loaders' prefetch hints.

use std::collections::BTreeSet;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use sluice_dataplane::{ByteRange, Hold};
use sluice_proto::RangeStatus;
use sluice_serve::read_through::{FillOutcome, ReadThrough};

use super::cache::{ChunkCache, FILL_ATTEMPTS_MAX, PREFETCH_CHUNKS_MAX};
use super::evict::ReadLease;

/// The serving side's handle on a cache.
#[derive(Debug, Clone)]
pub struct CacheReader(pub Arc<ChunkCache>);

impl ReadThrough for CacheReader {
    fn admit(&self, ranges: &[ByteRange]) -> Option<Hold> {
        let lease = self.0.present_lease(ranges)?;
        self.0.stats.reads_present.fetch_add(1, Ordering::Relaxed);
        Some(Box::new(lease))
    }

    fn fill(&self, ranges: Vec<ByteRange>) -> FillOutcome {
        let cache = Arc::clone(&self.0);
        let count = ranges.len();
        cache.stats.reads_filled.fetch_add(1, Ordering::Relaxed);
        let task = self.0.runtime.spawn(async move {
            let mut statuses = Vec::new();
            for _ in 0..FILL_ATTEMPTS_MAX {
                statuses = cache.fill_ranges(&ranges).await;
                // The ranges that filled, leased before the bits are read
                // again: evicted in between means filling them again.
                let filled: Vec<ByteRange> =
                    ranges.iter().zip(&statuses).filter(|(_, s)| **s == RangeStatus::Ok).map(|(r, _)| *r).collect();
                if let Some(lease) = cache.present_lease(&filled) {
                    return (statuses, Some(Box::new(lease) as Hold));
                }
            }
            for (range, status) in ranges.iter().zip(&mut statuses) {
                if *status == RangeStatus::Ok && cache.chunks_of(*range).any(|c| !cache.is_present(c)) {
                    *status = RangeStatus::SourceUnavailable;
                }
            }
            cache.note_error(&cache.unavailable(
                "chunks were evicted as fast as they filled: the cache budget is smaller than the reads in flight",
            ));
            (statuses, None)
        });
        Box::pin(async move { task.await.unwrap_or_else(|_| (vec![RangeStatus::SourceUnavailable; count], None)) })
    }
}

impl ChunkCache {
    /// Fills the missing chunks of `ranges` in the background; the chunks
    /// queued (none past [`PREFETCH_CHUNKS_MAX`] waiting).
    pub fn prefetch(self: &Arc<Self>, ranges: Vec<ByteRange>) -> u64 {
        let missing: BTreeSet<u64> =
            ranges.iter().flat_map(|r| self.chunks_of(*r)).filter(|&c| !self.is_present(c)).collect();
        let count = missing.len() as u64;
        let queued = self.prefetching.fetch_add(count, Ordering::SeqCst);
        if count == 0 || queued + count > PREFETCH_CHUNKS_MAX {
            self.prefetching.fetch_sub(count, Ordering::SeqCst);
            return 0;
        }
        let cache = Arc::clone(self);
        self.runtime.spawn(async move {
            cache.ensure_as(missing, true).await;
            cache.prefetching.fetch_sub(count, Ordering::SeqCst);
        });
        count
    }

    /// A lease on the chunks `ranges` cover if all are present, each
    /// marked as read for the eviction clock.
    pub(super) fn present_lease(self: &Arc<Self>, ranges: &[ByteRange]) -> Option<ReadLease> {
        let lease = ReadLease::take(self);
        for range in ranges {
            for chunk in self.chunks_of(*range) {
                if !self.is_present(chunk) {
                    return None;
                }
                let (word, bit) = ((chunk / 64) as usize, 1u64 << (chunk % 64));
                if self.referenced[word].load(Ordering::Relaxed) & bit == 0 {
                    self.referenced[word].fetch_or(bit, Ordering::Relaxed);
                }
            }
        }
        Some(lease)
    }
}
