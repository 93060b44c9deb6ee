//! Appending one file's bytes to a dataset: raw (e.g. Megatron `.bin`) or
//! `.npy` (header checked against the kind, then the array data), indexing
//! samples as they pass (WebDataset and MDS shards, offsets), with the
//! chunk checksums kept up to date as bytes arrive. Nothing is committed
//! here; the caller commits the outcome only when the whole file arrived.

use std::sync::Arc;

use sluice_dataplane::Namespace;
use sluice_proto::CHUNK_SIZE_BYTES;

use crate::tar::{TarError, TarIndexer};
pub use sluice_proto::api::Appended;
use sluice_proto::api::DatasetKind;
use sluice_proto::mds::{MdsColumns, MdsError, MdsIndexer};
use sluice_proto::npy::{self, NpyError};

/// How a file's bytes are to be read.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum IngestFormat {
    Raw,
    Npy,
}

/// Writes are gathered into pieces this large.
const WRITE_BYTES: usize = 4 << 20;

#[derive(Debug, thiserror::Error)]
pub enum IngestError {
    #[error("{0}")]
    Npy(#[from] NpyError),
    #[error(".npy dtype {found} does not match dataset kind {kind} (expected {expected})")]
    Dtype { found: String, kind: DatasetKind, expected: String },
    #[error("truncated .npy: its header promises {expected} data bytes, the file has {got}")]
    TruncatedNpy { expected: u64, got: u64 },
    #[error(".npy file has bytes after its array data ({expected} bytes)")]
    TrailingBytes { expected: u64 },
    #[error("{len} bytes is not a whole number of {kind} elements ({elem} bytes each)")]
    PartialElement { len: u64, kind: DatasetKind, elem: u64 },
    #[error("writing to the namespace: {0}")]
    Io(#[from] std::io::Error),
    #[error("{0}")]
    Tar(#[from] TarError),
    #[error("{0}")]
    Mds(#[from] MdsError),
    #[error("record index: {0}")]
    Index(String),
    #[error("the namespace is full: {needed} bytes needed, {capacity} available")]
    NoSpace { needed: u64, capacity: u64 },
}

/// How a file's bytes split into samples (`records`, `wds` and `mds` datasets).
pub enum RecordRule {
    /// No samples: `bytes` and `tokens` datasets.
    None,
    /// Records of one size.
    Fixed(u64),
    /// `n + 1` offsets into the file, first 0, last the file's length.
    Offsets(Vec<u64>),
    /// A WebDataset tar shard, indexed as it streams.
    Tar(Box<TarIndexer>),
    /// A Mosaic Data Shard, indexed by its header as it streams.
    Mds(Box<MdsIndexer>),
}

/// What a finished file leaves to commit.
#[derive(Debug)]
pub struct Finished {
    pub appended: Appended,
    pub chunk_crcs: Vec<u32>,
    /// New `(offset, len)` index entries, dataset-relative.
    pub index_entries: Vec<(u64, u64)>,
}

pub struct Appender {
    namespace: Arc<dyn Namespace>,
    kind: DatasetKind,
    format: IngestFormat,
    base_offset_bytes: u64,
    start_length_bytes: u64,
    written_bytes: u64,
    chunk_crcs: Vec<u32>,
    data_crc: u32,
    header: Vec<u8>,
    expected_bytes: Option<u64>,
    pending: Vec<u8>,
    rule: RecordRule,
}

impl Appender {
    /// Appends after `length_bytes` committed bytes whose chunk checksums
    /// are `chunk_crcs`.
    pub fn new(
        namespace: Arc<dyn Namespace>,
        kind: DatasetKind,
        format: IngestFormat,
        base_offset_bytes: u64,
        length_bytes: u64,
        chunk_crcs: Vec<u32>,
        rule: RecordRule,
    ) -> Self {
        assert_eq!(chunk_crcs.len() as u64, length_bytes.div_ceil(CHUNK_SIZE_BYTES), "manifest out of step");
        Self {
            namespace,
            kind,
            format,
            base_offset_bytes,
            start_length_bytes: length_bytes,
            written_bytes: 0,
            chunk_crcs,
            data_crc: 0,
            header: Vec::new(),
            expected_bytes: None,
            pending: Vec::with_capacity(WRITE_BYTES),
            rule,
        }
    }

    /// Takes the next bytes of the file.
    pub fn push(&mut self, mut bytes: &[u8]) -> Result<(), IngestError> {
        if self.format == IngestFormat::Npy && self.expected_bytes.is_none() {
            bytes = self.take_header(bytes)?;
            if self.expected_bytes.is_none() {
                return Ok(());
            }
        }
        if let Some(expected) = self.expected_bytes {
            if self.written_bytes + self.pending.len() as u64 + bytes.len() as u64 > expected {
                return Err(IngestError::TrailingBytes { expected });
            }
        }
        while !bytes.is_empty() {
            let take = bytes.len().min(WRITE_BYTES - self.pending.len());
            self.pending.extend_from_slice(&bytes[..take]);
            bytes = &bytes[take..];
            if self.pending.len() == WRITE_BYTES {
                self.flush()?;
            }
        }
        Ok(())
    }

    fn take_header<'a>(&mut self, bytes: &'a [u8]) -> Result<&'a [u8], IngestError> {
        let room = npy::HEADER_BYTES_MAX - self.header.len();
        let take = bytes.len().min(room);
        self.header.extend_from_slice(&bytes[..take]);
        match npy::parse_header(&self.header) {
            Ok(header) => {
                if let Some(accepted) = self.kind.npy_dtypes() {
                    if !accepted.contains(&header.descr.as_str()) {
                        return Err(IngestError::Dtype {
                            found: header.descr,
                            kind: self.kind,
                            expected: accepted.join(" or "),
                        });
                    }
                }
                let expected = header.data_len_bytes().ok_or(NpyError::Malformed("shape overflows".into()))?;
                self.expected_bytes = Some(expected);
                // Bytes past the header that were buffered are data.
                let data = self.header.split_off(header.data_offset_bytes);
                let rest = &bytes[take..];
                self.header.clear();
                self.push(&data)?;
                Ok(rest)
            }
            Err(NpyError::Truncated) if take == bytes.len() && room > take => Ok(&[]),
            Err(NpyError::Truncated) => Err(NpyError::TooLong(self.header.len()).into()),
            Err(err) => Err(err.into()),
        }
    }

    fn flush(&mut self) -> Result<(), IngestError> {
        if self.pending.is_empty() {
            return Ok(());
        }
        let dataset_offset = self.start_length_bytes + self.written_bytes;
        let geometry = self.namespace.geometry();
        let end = self.base_offset_bytes + dataset_offset + self.pending.len() as u64;
        if geometry.fixed_capacity && end > geometry.capacity_bytes {
            return Err(IngestError::NoSpace { needed: end, capacity: geometry.capacity_bytes });
        }
        match &mut self.rule {
            RecordRule::Tar(indexer) => indexer.push(&self.pending)?,
            RecordRule::Mds(indexer) => indexer.push(&self.pending)?,
            RecordRule::None | RecordRule::Fixed(_) | RecordRule::Offsets(_) => {}
        }
        self.namespace.write_at(self.base_offset_bytes + dataset_offset, &self.pending)?;
        self.data_crc = crc32c::crc32c_append(self.data_crc, &self.pending);
        update_chunk_crcs(&mut self.chunk_crcs, dataset_offset, &self.pending);
        self.written_bytes += self.pending.len() as u64;
        self.pending.clear();
        Ok(())
    }

    /// Ends the file: checks it is whole and makes its bytes durable.
    pub fn finish(mut self) -> Result<Finished, IngestError> {
        if self.format == IngestFormat::Npy && self.expected_bytes.is_none() {
            return Err(match npy::parse_header(&self.header) {
                Err(err) => err.into(),
                Ok(_) => NpyError::Truncated.into(),
            });
        }
        self.flush()?;
        if let Some(expected) = self.expected_bytes {
            if self.written_bytes != expected {
                return Err(IngestError::TruncatedNpy { expected, got: self.written_bytes });
            }
        }
        let elem = self.kind.element_size_bytes();
        if !self.written_bytes.is_multiple_of(elem) {
            return Err(IngestError::PartialElement { len: self.written_bytes, kind: self.kind, elem });
        }
        let start = self.start_length_bytes;
        let (records, index_entries) = match std::mem::replace(&mut self.rule, RecordRule::None) {
            RecordRule::None => (0, Vec::new()),
            RecordRule::Fixed(size) => {
                if size == 0 || !self.written_bytes.is_multiple_of(size) {
                    return Err(IngestError::Index(format!(
                        "{} bytes is not a whole number of {size}-byte records",
                        self.written_bytes
                    )));
                }
                (self.written_bytes / size, Vec::new())
            }
            RecordRule::Offsets(offsets) => {
                let entries = entries_from_offsets(&offsets, self.written_bytes)?;
                (entries.len() as u64, entries.into_iter().map(|(o, l)| (start + o, l)).collect())
            }
            RecordRule::Tar(indexer) => {
                let spans = indexer.finish()?;
                let entries: Vec<(u64, u64)> = spans.iter().map(|s| (start + s.offset_bytes, s.len_bytes)).collect();
                (entries.len() as u64, entries)
            }
            RecordRule::Mds(indexer) => {
                let entries: Vec<(u64, u64)> =
                    indexer.finish()?.into_iter().map(|(offset, len)| (start + offset, len)).collect();
                (entries.len() as u64, entries)
            }
        };
        self.namespace.sync()?;
        let appended = Appended {
            data_bytes: self.written_bytes,
            data_crc32c: self.data_crc,
            length_bytes: start + self.written_bytes,
            records,
        };
        Ok(Finished { appended, chunk_crcs: self.chunk_crcs, index_entries })
    }
}

/// The columns of an `mds` dataset's first shard, read back from its
/// namespace (`None` before the first shard): every later shard must have
/// the same, since a reader decodes every sample by them.
pub fn first_mds_columns(
    namespace: &dyn Namespace,
    base_offset_bytes: u64,
    length_bytes: u64,
) -> Result<Option<MdsColumns>, IngestError> {
    if length_bytes == 0 {
        return Ok(None);
    }
    let mut indexer = MdsIndexer::new(None);
    let mut at = 0;
    loop {
        let wanted = indexer.header_bytes_wanted()?;
        if wanted == 0 {
            return Ok(indexer.columns().cloned());
        }
        if at + wanted > length_bytes {
            return Err(MdsError::TruncatedHeader { got: length_bytes }.into());
        }
        let mut header = vec![0u8; wanted as usize];
        namespace.read_at(base_offset_bytes + at, &mut header)?;
        indexer.push(&header)?;
        at += wanted;
    }
}

/// `(offset, len)` entries from `n + 1` monotonic offsets spanning a file of
/// `file_bytes`.
pub fn entries_from_offsets(offsets: &[u64], file_bytes: u64) -> Result<Vec<(u64, u64)>, IngestError> {
    let bad = |what: String| IngestError::Index(what);
    match (offsets.first(), offsets.last()) {
        (Some(0), Some(&last)) if last == file_bytes => {}
        (Some(&first), Some(&last)) => {
            return Err(bad(format!("offsets must run from 0 to the file's {file_bytes} bytes, not {first}..{last}")))
        }
        _ => return Err(bad("no offsets".into())),
    }
    let mut entries = Vec::with_capacity(offsets.len().saturating_sub(1));
    for (i, pair) in offsets.windows(2).enumerate() {
        if pair[1] < pair[0] {
            return Err(bad(format!("offset {} ({}) is before offset {i} ({})", i + 1, pair[1], pair[0])));
        }
        entries.push((pair[0], pair[1] - pair[0]));
    }
    Ok(entries)
}

/// Extends the per-chunk CRC32Cs with `data` written at `offset_bytes`, right
/// after the bytes they already cover.
pub fn update_chunk_crcs(crcs: &mut Vec<u32>, mut offset_bytes: u64, mut data: &[u8]) {
    while !data.is_empty() {
        let chunk = (offset_bytes / CHUNK_SIZE_BYTES) as usize;
        let room = (CHUNK_SIZE_BYTES - offset_bytes % CHUNK_SIZE_BYTES) as usize;
        let (part, rest) = data.split_at(room.min(data.len()));
        if chunk == crcs.len() {
            crcs.push(crc32c::crc32c(part));
        } else {
            assert_eq!(chunk + 1, crcs.len(), "appending out of order");
            crcs[chunk] = crc32c::crc32c_append(crcs[chunk], part);
        }
        offset_bytes += part.len() as u64;
        data = rest;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_dataplane::driver::MemDriver;
    use sluice_dataplane::{BlockDriver, NamespaceSpec};

    fn namespace() -> Arc<dyn Namespace> {
        MemDriver.open_namespace(&NamespaceSpec::Mem).expect("namespace")
    }

    fn ingest(
        ns: &Arc<dyn Namespace>,
        kind: DatasetKind,
        format: IngestFormat,
        file: &[u8],
        piece: usize,
    ) -> Result<(Appended, Vec<u32>), IngestError> {
        let mut appender = Appender::new(Arc::clone(ns), kind, format, 0, 0, Vec::new(), RecordRule::None);
        for part in file.chunks(piece) {
            appender.push(part)?;
        }
        appender.finish().map(|f| (f.appended, f.chunk_crcs))
    }

    /// Chunk CRCs kept while appending in odd pieces equal those of the
    /// whole data.
    #[test]
    fn running_crcs_match_whole_data() {
        let data: Vec<u8> = (0..300_000u32).map(|i| (i * 7 % 256) as u8).collect();
        let mut crcs = Vec::new();
        let mut at = 0;
        for piece in data.chunks(10_007) {
            update_chunk_crcs(&mut crcs, at, piece);
            at += piece.len() as u64;
        }
        let whole: Vec<u32> = data.chunks(CHUNK_SIZE_BYTES as usize).map(crc32c::crc32c).collect();
        assert_eq!(crcs, whole);
    }

    /// An .npy of the right dtype lands as its array data only, whatever the
    /// pieces it arrives in.
    #[test]
    fn npy_is_stored_as_its_data() {
        let tokens: Vec<u8> = (0..5000u16).flat_map(|t| t.to_le_bytes()).collect();
        let mut file = npy::encode_header("<u2", 5000);
        file.extend_from_slice(&tokens);
        for piece in [1, 7, 100, 1 << 20] {
            let ns = namespace();
            let (appended, _) = ingest(&ns, DatasetKind::TokensU16, IngestFormat::Npy, &file, piece).expect("ingest");
            assert_eq!(appended.data_bytes, 10_000);
            assert_eq!(appended.data_crc32c, crc32c::crc32c(&tokens));
            let mut back = vec![0u8; 10_000];
            ns.read_at(0, &mut back).expect("read");
            assert_eq!(back, tokens);
        }
    }

    /// Offsets must start at 0, end at the file's length and never go back.
    #[test]
    fn offsets_are_checked() {
        assert_eq!(entries_from_offsets(&[0, 3, 3, 10], 10).expect("ok"), vec![(0, 3), (3, 0), (3, 7)]);
        assert!(entries_from_offsets(&[0, 3, 2, 10], 10).is_err());
        assert!(entries_from_offsets(&[1, 10], 10).is_err());
        assert!(entries_from_offsets(&[0, 9], 10).is_err());
        assert!(entries_from_offsets(&[], 0).is_err());
    }

    /// A tar shard appended after earlier data gets dataset-relative spans.
    #[test]
    fn wds_shards_are_indexed_while_ingesting() {
        let shard = crate::tar::write_tar(&[("k1.txt", b"one"), ("k1.cls", b"1"), ("k2.txt", b"two")]);
        let ns = namespace();
        let rule = RecordRule::Tar(Box::default());
        let mut appender = Appender::new(Arc::clone(&ns), DatasetKind::Wds, IngestFormat::Raw, 0, 0, Vec::new(), rule);
        appender.push(&shard).expect("push");
        let first = appender.finish().expect("finish");
        assert_eq!(first.appended.records, 2);
        let rule = RecordRule::Tar(Box::default());
        let crcs = first.chunk_crcs.clone();
        let start = first.appended.length_bytes;
        let mut appender = Appender::new(Arc::clone(&ns), DatasetKind::Wds, IngestFormat::Raw, 0, start, crcs, rule);
        appender.push(&shard).expect("push");
        let second = appender.finish().expect("finish");
        assert_eq!(second.index_entries[0].0, start);
        assert_eq!(second.index_entries[1], (start + first.index_entries[1].0, first.index_entries[1].1));
    }

    /// MDS shards appended one after another get dataset-relative spans;
    /// every later shard must have the first one's columns, read back from
    /// the namespace.
    #[test]
    fn mds_shards_keep_the_first_ones_columns() {
        use sluice_proto::mds::write_shard;
        let columns = MdsColumns {
            column_names: vec!["text".into()],
            column_encodings: vec!["str".into()],
            column_sizes: vec![None],
        };
        let samples: Vec<Vec<u8>> = (0..20u32).map(|i| [&1u32.to_le_bytes()[..], &[b'a' + i as u8]].concat()).collect();
        let shard = write_shard(&columns, &samples);
        let ns = namespace();
        let append = |start: u64, crcs: Vec<u32>, shard: &[u8]| {
            let expected = first_mds_columns(ns.as_ref(), 0, start)?;
            let rule = RecordRule::Mds(Box::new(MdsIndexer::new(expected)));
            let mut appender =
                Appender::new(Arc::clone(&ns), DatasetKind::Mds, IngestFormat::Raw, 0, start, crcs, rule);
            appender.push(shard)?;
            appender.finish()
        };
        let first = append(0, Vec::new(), &shard).expect("first shard");
        assert_eq!(first.appended.records, 20);
        assert_eq!(
            first_mds_columns(ns.as_ref(), 0, first.appended.length_bytes).expect("read back"),
            Some(columns.clone())
        );
        let start = first.appended.length_bytes;
        let second = append(start, first.chunk_crcs.clone(), &shard).expect("second shard");
        assert_eq!(second.index_entries[3], (start + first.index_entries[3].0, 5));

        let mut other = columns;
        other.column_encodings[0] = "bytes".into();
        let err = append(start, first.chunk_crcs, &write_shard(&other, &samples)).expect_err("other columns");
        assert!(matches!(err, IngestError::Mds(MdsError::Columns { .. })), "{err}");
    }

    /// Truncated, mistyped and overlong .npy files and partial tokens are
    /// refused with an error that says which.
    #[test]
    fn bad_files_are_refused() {
        let mut file = npy::encode_header("<u2", 100);
        file.extend_from_slice(&[0u8; 150]);
        let ns = namespace();
        let err = ingest(&ns, DatasetKind::TokensU16, IngestFormat::Npy, &file, 64).expect_err("truncated");
        assert!(matches!(err, IngestError::TruncatedNpy { expected: 200, got: 150 }), "{err}");
        let err = ingest(&ns, DatasetKind::TokensU32, IngestFormat::Npy, &file, 64).expect_err("dtype");
        assert!(err.to_string().contains("<u2"), "{err}");
        file.extend_from_slice(&[0u8; 51]);
        let err = ingest(&ns, DatasetKind::TokensU16, IngestFormat::Npy, &file, 64).expect_err("trailing");
        assert!(matches!(err, IngestError::TrailingBytes { .. }), "{err}");
        let err = ingest(&ns, DatasetKind::TokensU16, IngestFormat::Npy, &file[..30], 64).expect_err("header cut");
        assert!(matches!(err, IngestError::Npy(NpyError::Truncated)), "{err}");
        let err = ingest(&ns, DatasetKind::TokensU32, IngestFormat::Raw, &[0u8; 10], 64).expect_err("partial");
        assert!(matches!(err, IngestError::PartialElement { .. }), "{err}");
    }
}
