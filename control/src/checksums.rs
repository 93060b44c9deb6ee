//! Each sealed dataset's block checksums (a CRC32C per 4 KiB, the unit the
//! data plane verifies every read by) in a file of its own beside the
//! data: `DATA_DIR/checksums/<id>.crc`, little-endian u32s.
//!
//! They are 0.1 % of the data, too much for a shared catalog, so each node
//! keeps its own and trusts it only after folding it into chunk CRCs that
//! match the catalog's. A file that is missing (a dataset sealed before
//! block checksums, a file lost) or does not match is made again from the
//! data, and any chunk whose bytes disagree with the catalog then gets
//! checksums that can never match: its reads fail as checksum mismatches
//! instead of serving bytes nobody vouches for.

use std::io::Write;
use std::path::{Path, PathBuf};

use sluice_dataplane::blocks::{self, VERIFY_BLOCK_BYTES};
use sluice_dataplane::Namespace;
use sluice_proto::CHUNK_SIZE_BYTES;

/// Bytes read per step when block checksums are made from the data.
const REBUILD_READ_BYTES: usize = 4 << 20;
const _: () = assert!((REBUILD_READ_BYTES as u64).is_multiple_of(CHUNK_SIZE_BYTES));

/// The directory of checksum files.
#[derive(Debug)]
pub struct ChecksumFiles {
    dir: PathBuf,
}

/// Block checksums made from a dataset's bytes.
#[derive(Debug)]
pub struct Rebuilt {
    pub block_crcs: Vec<u32>,
    /// Chunks whose bytes disagree with the catalog (their blocks poisoned).
    pub bad_chunks: Vec<u64>,
}

impl ChecksumFiles {
    pub fn open(data_dir: &Path) -> std::io::Result<Self> {
        let dir = data_dir.join("checksums");
        std::fs::create_dir_all(&dir)?;
        Ok(Self { dir })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn path(&self, dataset_id: u64) -> PathBuf {
        self.dir.join(format!("{dataset_id:016x}.crc"))
    }

    /// Writes a dataset's block checksums durably: a temporary file,
    /// fsynced, renamed over the old one, and the directory fsynced.
    pub fn write(&self, dataset_id: u64, block_crcs: &[u32]) -> std::io::Result<()> {
        let path = self.path(dataset_id);
        let partial = path.with_extension("crc.partial");
        let mut file = std::fs::File::create(&partial)?;
        let bytes: Vec<u8> = block_crcs.iter().flat_map(|c| c.to_le_bytes()).collect();
        file.write_all(&bytes)?;
        file.sync_all()?;
        std::fs::rename(&partial, &path)?;
        std::fs::File::open(&self.dir)?.sync_all()
    }

    /// A dataset's block checksums if its file holds exactly as many as a
    /// dataset of `length_bytes` has, `None` if it is missing or short.
    pub fn load(&self, dataset_id: u64, length_bytes: u64) -> std::io::Result<Option<Vec<u32>>> {
        let bytes = match std::fs::read(self.path(dataset_id)) {
            Ok(bytes) => bytes,
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(err) => return Err(err),
        };
        if bytes.len() as u64 != blocks::block_count(length_bytes) * 4 {
            return Ok(None);
        }
        Ok(Some(bytes.chunks_exact(4).map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()))
    }

    pub fn remove(&self, dataset_id: u64) {
        let _ = std::fs::remove_file(self.path(dataset_id));
    }
}

/// Block checksums of `length_bytes` of `ns` from `base_offset_bytes`,
/// checked chunk by chunk against the catalog's `chunk_crcs`.
pub fn rebuild(
    ns: &dyn Namespace,
    base_offset_bytes: u64,
    length_bytes: u64,
    chunk_crcs: &[u32],
) -> std::io::Result<Rebuilt> {
    let mut block_crcs = Vec::with_capacity(blocks::block_count(length_bytes) as usize);
    let mut bad_chunks = Vec::new();
    let mut buf = vec![0u8; REBUILD_READ_BYTES];
    let mut at = 0u64;
    while at < length_bytes {
        let len = (length_bytes - at).min(REBUILD_READ_BYTES as u64) as usize;
        let piece = &mut buf[..len];
        ns.read_at(base_offset_bytes + at, piece)?;
        for (i, chunk) in piece.chunks(CHUNK_SIZE_BYTES as usize).enumerate() {
            let index = at / CHUNK_SIZE_BYTES + i as u64;
            let first_block = block_crcs.len();
            let crc = blocks::chunk_crc_and_blocks(chunk, &mut block_crcs);
            if chunk_crcs.get(index as usize) != Some(&crc) {
                bad_chunks.push(index);
                for crc in &mut block_crcs[first_block..] {
                    *crc = blocks::poisoned(*crc);
                }
            }
        }
        at += len as u64;
    }
    debug_assert_eq!(block_crcs.len() as u64, length_bytes.div_ceil(VERIFY_BLOCK_BYTES));
    Ok(Rebuilt { block_crcs, bad_chunks })
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_dataplane::driver::{BlockDriver, MemDriver, NamespaceSpec};

    /// A file round-trips; a short one reads as missing; a rebuild from
    /// data that disagrees with the catalog poisons exactly that chunk.
    #[test]
    fn files_round_trip_and_rebuilds_poison_bad_chunks() {
        let dir = tempfile::tempdir().expect("tempdir");
        let files = ChecksumFiles::open(dir.path()).expect("open");
        let data: Vec<u8> = (0..(2 * CHUNK_SIZE_BYTES as usize + 5000)).map(|i| (i % 251) as u8).collect();
        let chunks: Vec<u32> = data.chunks(CHUNK_SIZE_BYTES as usize).map(crc32c::crc32c).collect();
        let ns = MemDriver.open_namespace(&NamespaceSpec::Mem).expect("namespace");
        ns.write_at(0, &data).expect("write");
        let clean = rebuild(&*ns, 0, data.len() as u64, &chunks).expect("rebuild");
        assert!(clean.bad_chunks.is_empty());
        files.write(7, &clean.block_crcs).expect("write");
        assert_eq!(files.load(7, data.len() as u64).expect("load"), Some(clean.block_crcs.clone()));
        assert_eq!(files.load(7, data.len() as u64 + 4096).expect("load"), None, "length mismatch");
        assert_eq!(files.load(8, 10).expect("load"), None, "missing");

        ns.write_at(CHUNK_SIZE_BYTES + 9, &[0xff]).expect("corrupt");
        let dirty = rebuild(&*ns, 0, data.len() as u64, &chunks).expect("rebuild");
        assert_eq!(dirty.bad_chunks, vec![1]);
        let per_chunk = blocks::BLOCKS_PER_CHUNK as usize;
        assert_eq!(dirty.block_crcs[..per_chunk], clean.block_crcs[..per_chunk]);
        assert_eq!(dirty.block_crcs[2 * per_chunk..], clean.block_crcs[2 * per_chunk..]);
        assert!(dirty.block_crcs[per_chunk..2 * per_chunk]
            .iter()
            .zip(&clean.block_crcs[per_chunk..])
            .all(|(a, b)| a != b));
    }
}
