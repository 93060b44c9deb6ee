//! Chunk geometry and the DMA footprint rule: what both ends must agree on
//! for a batch to be verified on the node and split right on the client.

/// Checksum granularity of every sealed dataset (CRC32C per chunk).
///
/// 64 KiB keeps the manifest at 64 KiB per GiB of data while a large read
/// still covers whole chunks and so can be verified on the way out.
pub const CHUNK_SIZE_BYTES: u64 = 64 * 1024;

/// Alignment of every device read and DMA slot (O_DIRECT's, and NVMe's
/// largest common block size).
pub const IO_ALIGN_BYTES: usize = 4096;

/// Upper bound on the DMA bytes one range of `len_bytes` can take, at any
/// offset, for block sizes ≤ 4096: clients split batches with it so that
/// a batch always fits a core's pool.
pub fn footprint_bound_bytes(len_bytes: u32) -> u64 {
    u64::from(len_bytes).next_multiple_of(IO_ALIGN_BYTES as u64) + 2 * IO_ALIGN_BYTES as u64
}

/// Whether a batch of ranges of these lengths keeps the limits a node
/// announces: at most `ranges_max` ranges, and their footprint bounds
/// within `footprint_max_bytes` of DMA. Every transport checks this
/// before a batch reaches a core.
pub fn batch_fits(lens: impl ExactSizeIterator<Item = u32>, ranges_max: u32, footprint_max_bytes: u64) -> bool {
    lens.len() <= ranges_max as usize && lens.map(footprint_bound_bytes).sum::<u64>() <= footprint_max_bytes
}

/// The chunks wholly inside `len_bytes` bytes at `offset_bytes` of a
/// dataset of `length_bytes` (its last chunk may be short): each as
/// `(chunk, first byte, end byte)`. Only these can be checked against the
/// chunk manifest from what the range read.
pub fn whole_chunks_within(
    offset_bytes: u64,
    len_bytes: u64,
    length_bytes: u64,
) -> impl Iterator<Item = (u64, u64, u64)> {
    let end = offset_bytes.saturating_add(len_bytes);
    (offset_bytes.div_ceil(CHUNK_SIZE_BYTES)..)
        .map(move |chunk| {
            let start = chunk.saturating_mul(CHUNK_SIZE_BYTES);
            (chunk, start, start.saturating_add(CHUNK_SIZE_BYTES).min(length_bytes))
        })
        .take_while(move |&(_, start, chunk_end)| start < chunk_end && chunk_end <= end)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_whole_chunks_are_within_a_range() {
        let c = CHUNK_SIZE_BYTES;
        let within = |offset, len, length| whole_chunks_within(offset, len, length).collect::<Vec<_>>();
        assert_eq!(within(0, 0, 10 * c), []);
        assert_eq!(within(0, c - 1, 10 * c), []);
        assert_eq!(within(0, c, 10 * c), [(0, 0, c)]);
        assert_eq!(within(1, 2 * c, 10 * c), [(1, c, 2 * c)]);
        // The dataset's short last chunk is whole where the range reaches its end.
        assert_eq!(within(c, c + 100, c + 100), [(1, c, c + 100)]);
        assert_eq!(within(c, 99, c + 100), []);
        assert_eq!(within(u64::MAX - 1, 10, u64::MAX), []);
    }

    #[test]
    fn the_footprint_bound_covers_any_alignment() {
        assert_eq!(footprint_bound_bytes(0), 2 * IO_ALIGN_BYTES as u64);
        assert_eq!(footprint_bound_bytes(1), 3 * IO_ALIGN_BYTES as u64);
        assert!(batch_fits([4096u32; 2].into_iter(), 2, 6 * 4096));
        assert!(!batch_fits([4096u32; 3].into_iter(), 2, u64::MAX));
        assert!(!batch_fits([4096u32; 2].into_iter(), 2, 6 * 4096 - 1));
    }
}
