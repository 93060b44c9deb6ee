//! Mosaic Data Shards (MDS: what Mosaic Streaming's `MDSWriter` writes), as
//! the files of an `mds` dataset: a shard's header is read as the shard
//! streams in, so ingest indexes its samples without holding the shard.
//!
//! A shard is a little-endian `u32` sample count `n`, then `n + 1` absolute
//! `u32` offsets, then the writer's configuration as JSON (its format and
//! columns), then the samples: sample `i` is bytes `[offsets[i],
//! offsets[i + 1])` and `offsets[n]` is the shard's length. A sample holds
//! a `u32` size for each column of no fixed size, then each column's bytes;
//! decoding them is the reader's (Python's `sluice.MdsSamples`), by the
//! columns of the dataset's first shard, which every later shard must
//! repeat. A sample is one read, as a WebDataset sample is.
//!
//! Compressed bytes are refused with a word on how to decompress them: a
//! sample of a compressed shard is no byte range. (`sluicectl` decompresses
//! a `.mds.zstd` shard as it sends it.)

use serde::{Deserialize, Serialize};

/// Most samples one shard may hold: its offsets then take 64 MiB, where
/// Mosaic's default shard of 64 MiB holds far fewer.
pub const SAMPLES_PER_SHARD_MAX: u32 = 1 << 24;
/// Largest configuration accepted: a writer's takes a few hundred bytes.
pub const CONFIG_BYTES_MAX: u32 = 1 << 20;
/// The first bytes of a zstd frame.
const ZSTD_MAGIC: [u8; 4] = [0x28, 0xb5, 0x2f, 0xfd];

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum MdsError {
    #[error(
        "a zstd-compressed MDS shard: decompress it first (sluicectl decompresses a file named .zst or .zstd as \
         it sends it)"
    )]
    Compressed,
    #[error("MDS shard header: {0}")]
    Header(String),
    #[error("MDS shard ends after {got} bytes, inside its header")]
    TruncatedHeader { got: u64 },
    #[error("MDS shard is {got} bytes, but its offsets end at byte {expected}")]
    Length { expected: u64, got: u64 },
    #[error("MDS shard's columns ({found}) differ from the dataset's first shard's ({expected})")]
    Columns { expected: String, found: String },
}

/// A shard's columns, as its configuration names them: what a reader needs
/// to split and decode a sample.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MdsColumns {
    pub column_names: Vec<String>,
    pub column_encodings: Vec<String>,
    /// Bytes of each column, `None` for one whose size each sample gives.
    pub column_sizes: Vec<Option<u64>>,
}

impl MdsColumns {
    fn describe(&self) -> String {
        let columns: Vec<String> = self
            .column_names
            .iter()
            .zip(&self.column_encodings)
            .map(|(name, encoding)| format!("{name}: {encoding}"))
            .collect();
        columns.join(", ")
    }
}

/// The configuration's fields that matter here; the rest (hashes, size
/// limit, compression) is the writer's.
#[derive(Deserialize)]
struct Config {
    format: String,
    #[serde(flatten)]
    columns: MdsColumns,
}

/// Indexes one shard as its bytes arrive: [`MdsIndexer::push`] each piece in
/// order, then [`MdsIndexer::finish`].
pub struct MdsIndexer {
    /// Bytes seen.
    at: u64,
    /// The header and configuration, until they are whole.
    header: Vec<u8>,
    /// Parsed once the header and configuration are whole.
    parsed: Option<Parsed>,
    /// The columns every shard of the dataset must have (its first
    /// shard's); `None` for the first.
    expected: Option<MdsColumns>,
}

struct Parsed {
    offsets: Vec<u32>,
    columns: MdsColumns,
}

impl MdsIndexer {
    pub fn new(expected: Option<MdsColumns>) -> Self {
        Self { at: 0, header: Vec::new(), parsed: None, expected }
    }

    /// How many more bytes the header needs before the shard's layout is
    /// known (0 once it is): a reader that can seek fetches just these.
    pub fn header_bytes_wanted(&self) -> Result<u64, MdsError> {
        if self.parsed.is_some() {
            return Ok(0);
        }
        Ok(self.header_len_known()?.saturating_sub(self.header.len() as u64))
    }

    /// The header's length as far as the bytes held tell it: 4 until the
    /// count is known, then the offsets, then the configuration.
    fn header_len_known(&self) -> Result<u64, MdsError> {
        let held = &self.header;
        if held.len() < 4 {
            return Ok(4);
        }
        if held[..4] == ZSTD_MAGIC {
            return Err(MdsError::Compressed);
        }
        let count = u32_at(held, 0);
        if count > SAMPLES_PER_SHARD_MAX {
            return Err(MdsError::Header(format!(
                "{count} samples, more than a shard may hold ({SAMPLES_PER_SHARD_MAX}); is this an MDS shard?"
            )));
        }
        let offsets_end = 4 + 4 * (u64::from(count) + 1);
        if (held.len() as u64) < offsets_end {
            return Ok(offsets_end);
        }
        let first = u64::from(u32_at(held, 4));
        if first < offsets_end || first - offsets_end > u64::from(CONFIG_BYTES_MAX) {
            return Err(MdsError::Header(format!(
                "the first sample starts at byte {first}, not within {CONFIG_BYTES_MAX} bytes after the offsets \
                 (byte {offsets_end})"
            )));
        }
        Ok(first)
    }

    /// Takes the shard's next bytes.
    pub fn push(&mut self, mut bytes: &[u8]) -> Result<(), MdsError> {
        self.at += bytes.len() as u64;
        while self.parsed.is_none() && !bytes.is_empty() {
            let wanted = self.header_bytes_wanted()?;
            let take = bytes.len().min(usize::try_from(wanted).unwrap_or(usize::MAX));
            self.header.extend_from_slice(&bytes[..take]);
            bytes = &bytes[take..];
            if self.header_bytes_wanted()? == 0 {
                self.parse()?;
            }
        }
        Ok(())
    }

    /// The header and configuration are whole: checks the offsets and the
    /// columns.
    fn parse(&mut self) -> Result<(), MdsError> {
        let held = std::mem::take(&mut self.header);
        let count = u32_at(&held, 0) as usize;
        let offsets: Vec<u32> = (0..=count).map(|i| u32_at(&held, 4 + 4 * i)).collect();
        if let Some(i) = offsets.windows(2).position(|pair| pair[1] < pair[0]) {
            return Err(MdsError::Header(format!(
                "offset {} ({}) is before offset {i} ({})",
                i + 1,
                offsets[i + 1],
                offsets[i]
            )));
        }
        let config_start = 4 + 4 * (count + 1);
        let config: Config = serde_json::from_slice(&held[config_start..])
            .map_err(|err| MdsError::Header(format!("its configuration is not the JSON of an MDS writer: {err}")))?;
        if config.format != "mds" {
            return Err(MdsError::Header(format!("its configuration says format {:?}, not \"mds\"", config.format)));
        }
        let columns = config.columns;
        let names = columns.column_names.len();
        if names == 0 || columns.column_encodings.len() != names || columns.column_sizes.len() != names {
            return Err(MdsError::Header(format!(
                "{names} column names, {} encodings and {} sizes",
                columns.column_encodings.len(),
                columns.column_sizes.len()
            )));
        }
        if let Some(expected) = &self.expected {
            if *expected != columns {
                return Err(MdsError::Columns { expected: expected.describe(), found: columns.describe() });
            }
        }
        self.parsed = Some(Parsed { offsets, columns });
        Ok(())
    }

    /// The shard's columns, once its header is read.
    pub fn columns(&self) -> Option<&MdsColumns> {
        self.parsed.as_ref().map(|parsed| &parsed.columns)
    }

    /// Ends a shard whose every byte was pushed: its samples' `(offset,
    /// len)` spans, relative to the shard's start.
    pub fn finish(self) -> Result<Vec<(u64, u64)>, MdsError> {
        let length = self.at;
        self.finish_at(length)
    }

    /// Ends a shard of `shard_bytes` whose header alone was pushed (a reader
    /// that seeks): as [`MdsIndexer::finish`].
    pub fn finish_at(self, shard_bytes: u64) -> Result<Vec<(u64, u64)>, MdsError> {
        let Some(parsed) = self.parsed else {
            return Err(MdsError::TruncatedHeader { got: self.at });
        };
        let end = parsed.offsets.last().map_or(0, |&last| u64::from(last));
        if end != shard_bytes {
            return Err(MdsError::Length { expected: end, got: shard_bytes });
        }
        Ok(parsed.offsets.windows(2).map(|pair| (u64::from(pair[0]), u64::from(pair[1] - pair[0]))).collect())
    }
}

fn u32_at(bytes: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]])
}

/// A shard as `MDSWriter` lays it out, for tests here and elsewhere.
pub fn write_shard(columns: &MdsColumns, samples: &[Vec<u8>]) -> Vec<u8> {
    #[derive(Serialize)]
    struct WrittenConfig<'a> {
        version: u32,
        format: &'static str,
        compression: Option<String>,
        hashes: Vec<String>,
        size_limit: u64,
        #[serde(flatten)]
        columns: &'a MdsColumns,
    }
    let config = serde_json::to_vec(&WrittenConfig {
        version: 2,
        format: "mds",
        compression: None,
        hashes: Vec::new(),
        size_limit: 1 << 26,
        columns,
    })
    .expect("a configuration serializes");
    let count = samples.len() as u32;
    let mut offset = 4 + 4 * (count + 1) + config.len() as u32;
    let mut shard = count.to_le_bytes().to_vec();
    for sample in std::iter::once(&Vec::new()).chain(samples) {
        offset += sample.len() as u32;
        shard.extend_from_slice(&offset.to_le_bytes());
    }
    shard.extend_from_slice(&config);
    for sample in samples {
        shard.extend_from_slice(sample);
    }
    shard
}

#[cfg(test)]
mod tests {
    use super::*;

    fn columns() -> MdsColumns {
        MdsColumns {
            column_names: vec!["id".into(), "text".into()],
            column_encodings: vec!["int".into(), "str".into()],
            column_sizes: vec![Some(8), None],
        }
    }

    fn samples() -> Vec<Vec<u8>> {
        (0..50u64)
            .map(|i| {
                let text = "x".repeat(i as usize % 9);
                let mut sample = (text.len() as u32).to_le_bytes().to_vec();
                sample.extend_from_slice(&i.to_le_bytes());
                sample.extend_from_slice(text.as_bytes());
                sample
            })
            .collect()
    }

    fn index(shard: &[u8], piece: usize, expected: Option<MdsColumns>) -> Result<Vec<(u64, u64)>, MdsError> {
        let mut indexer = MdsIndexer::new(expected);
        for part in shard.chunks(piece) {
            indexer.push(part)?;
        }
        indexer.finish()
    }

    /// Whatever the pieces a shard arrives in, each sample's span holds its
    /// bytes.
    #[test]
    fn samples_are_found_in_any_pieces() {
        let samples = samples();
        let shard = write_shard(&columns(), &samples);
        for piece in [1, 3, 4, 5, 64, 1 << 20] {
            let spans = index(&shard, piece, Some(columns())).expect("indexed");
            assert_eq!(spans.len(), samples.len());
            for ((offset, len), sample) in spans.iter().zip(&samples) {
                assert_eq!(&shard[*offset as usize..(offset + len) as usize], sample.as_slice());
            }
        }
    }

    /// A reader that seeks pushes the header alone and names the length.
    #[test]
    fn the_header_alone_indexes_a_shard_of_known_length() {
        let shard = write_shard(&columns(), &samples());
        let mut indexer = MdsIndexer::new(None);
        let mut at = 0;
        loop {
            let wanted = indexer.header_bytes_wanted().expect("header") as usize;
            if wanted == 0 {
                break;
            }
            indexer.push(&shard[at..at + wanted]).expect("push");
            at += wanted;
        }
        assert!(at < shard.len() / 2, "the header is {at} of {} bytes", shard.len());
        assert_eq!(indexer.columns(), Some(&columns()));
        assert_eq!(indexer.finish_at(shard.len() as u64).expect("spans"), index(&shard, 7, None).expect("spans"));
    }

    /// Truncated, overlong, compressed, malformed and other-column shards
    /// are refused, each with what is wrong.
    #[test]
    fn bad_shards_are_refused() {
        let shard = write_shard(&columns(), &samples());
        let cut = index(&shard[..shard.len() - 1], 100, None).expect_err("truncated");
        assert!(matches!(cut, MdsError::Length { got, .. } if got == shard.len() as u64 - 1), "{cut}");
        let mut long = shard.clone();
        long.push(0);
        assert!(matches!(index(&long, 100, None), Err(MdsError::Length { .. })));
        assert!(matches!(index(&shard[..30], 100, None), Err(MdsError::TruncatedHeader { got: 30 })));
        let mut zstd = ZSTD_MAGIC.to_vec();
        zstd.extend_from_slice(&shard);
        assert_eq!(index(&zstd, 100, None), Err(MdsError::Compressed));
        assert!(index(&[0xff; 64], 100, None).expect_err("count").to_string().contains("is this an MDS shard"));

        let mut backwards = shard.clone();
        backwards[8..12].copy_from_slice(&0u32.to_le_bytes());
        assert!(index(&backwards, 100, None).expect_err("order").to_string().contains("is before offset"));
        let mut garbled = shard.clone();
        let config_at = 4 + 4 * 51;
        garbled[config_at] = b'[';
        assert!(index(&garbled, 100, None).expect_err("config").to_string().contains("not the JSON"));

        let mut other = columns();
        other.column_encodings[1] = "bytes".into();
        let err = index(&shard, 100, Some(other)).expect_err("columns");
        assert!(err.to_string().contains("text: bytes") && err.to_string().contains("text: str"), "{err}");
    }
}
