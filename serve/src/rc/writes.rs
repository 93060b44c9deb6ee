//! Planning a batch's RDMA WRITEs: its ranges' DMA pieces as SGEs, grouped
//! into WRITEs that each land where the previous one ended.

use sluice_transport::verbs::Sge;

/// Lists the SGEs of each range's pieces and groups them into WRITEs
/// `(first SGE, count, offset in the client's buffer)` of at most
/// `per_write` SGEs, each landing where the last one ended. Returns the
/// bytes written, or `None` if a piece lies outside every registered arena.
pub(super) fn plan_writes<'a>(
    ranges: impl Iterator<Item = (u64, impl Iterator<Item = &'a [u8]>)>,
    per_write: usize,
    lkey_of: impl Fn(u64, u64) -> Option<u32>,
    sges: &mut Vec<Sge>,
    writes: &mut Vec<(usize, usize, u64)>,
) -> Option<u64> {
    assert!(per_write > 0, "a WRITE takes at least one SGE");
    let mut written = 0u64;
    for (mut dest, pieces) in ranges {
        let mut first = sges.len();
        let mut first_dest = dest;
        for piece in pieces.filter(|p| !p.is_empty()) {
            if sges.len() - first == per_write {
                writes.push((first, per_write, first_dest));
                first = sges.len();
                first_dest = dest;
            }
            let (addr, len) = (piece.as_ptr() as u64, piece.len() as u64);
            sges.push(Sge { addr, len: piece.len() as u32, lkey: lkey_of(addr, len)? });
            dest += len;
            written += len;
        }
        if sges.len() > first {
            writes.push((first, sges.len() - first, first_dest));
        }
    }
    Some(written)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Pieces become SGEs in order; a range's pieces share WRITEs of at
    /// most `per_write` SGEs, each WRITE landing where the previous ended;
    /// empty pieces are skipped; memory outside the arenas is refused.
    #[test]
    fn writes_group_pieces_and_land_contiguously() {
        let arena = vec![7u8; 1000];
        let pieces: [&[u8]; 5] =
            [&arena[0..100], &arena[200..250], &arena[300..300], &arena[400..410], &arena[500..501]];
        let base = arena.as_ptr() as u64;
        let inside = |addr: u64, len: u64| (addr >= base && addr + len <= base + 1000).then_some(42);
        let (mut sges, mut writes) = (Vec::new(), Vec::new());
        let second: Vec<&[u8]> = vec![&arena[600..700]];
        let ranges = vec![(5000u64, pieces.iter().copied()), (9000u64, second.iter().copied())];
        let written = plan_writes(ranges.into_iter(), 2, inside, &mut sges, &mut writes);
        assert_eq!(written, Some(100 + 50 + 10 + 1 + 100));
        assert_eq!(sges.len(), 5, "the empty piece has no SGE");
        assert!(sges.iter().all(|s| s.lkey == 42));
        assert_eq!(writes, vec![(0, 2, 5000), (2, 2, 5150), (4, 1, 9000)]);
        assert_eq!((sges[2].len, sges[3].len), (10, 1));

        let outside = [0u8; 8];
        let stray = vec![(0u64, [&outside[..]].into_iter())];
        assert_eq!(plan_writes(stray.into_iter(), 2, inside, &mut Vec::new(), &mut Vec::new()), None);
    }
}
