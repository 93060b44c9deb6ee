//! LitData token datasets (`litdata.optimize(..., item_loader=TokensLoader())`,
//! what LitGPT pretrains from) as the files of a `tokens:u16` or
//! `tokens:u32` dataset: the directory's `index.json` names its chunks in
//! order, and each chunk's tokens, past its header, are the dataset's next
//! bytes. `sluicectl` sends them from a local directory; a node reads them
//! in place from a source (`--source s3://bucket/dir/`).
//!
//! A chunk is a little-endian `u32` item count `n`, then `n + 1` absolute
//! `u32` offsets, then the items: for a token dataset, each item is a
//! sequence's tokens with no header of its own (`no_header_tensor` or
//! `no_header_numpy`), so the chunk's data is one run of tokens, and the
//! dataset is the runs of its chunks in the index's order: the stream
//! LitData's `TokensLoader` cuts its blocks from.
//!
//! Only that layout is read. Chunks of other item loaders (one pytree per
//! item), and compressed or encrypted chunks, are refused by name: their
//! items are not a token stream.

use serde::Deserialize;

use crate::api::DatasetKind;

/// Most items one chunk may hold: its offsets then take 64 MiB.
pub const ITEMS_PER_CHUNK_MAX: u64 = 1 << 24;
/// Largest `index.json` read: about 100 bytes a chunk, so a million chunks.
pub const INDEX_BYTES_MAX: u64 = 128 << 20;

/// A LitData token dataset's `index.json`, checked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TokenIndex {
    /// Bytes of one token: 2 or 4.
    pub token_bytes: u64,
    /// What the configuration calls the tokens' type, for messages.
    pub data_format: String,
    /// The chunks, in the index's order: the dataset's order.
    pub chunks: Vec<ChunkEntry>,
}

/// One chunk as the index lists it.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
pub struct ChunkEntry {
    /// Items (sequences) in the chunk.
    #[serde(rename = "chunk_size")]
    pub items: u64,
    /// A file name in the index's directory (checked: no path).
    pub filename: String,
    /// Tokens in the chunk, where the writer recorded them.
    #[serde(default, rename = "dim")]
    pub tokens: Option<u64>,
}

#[derive(Deserialize)]
struct Index {
    chunks: Vec<ChunkEntry>,
    config: Config,
}

/// The configuration's fields that decide whether the chunks are a token
/// stream; the rest (chunk limits, the pytree spec) is the writer's.
#[derive(Deserialize)]
struct Config {
    #[serde(default)]
    item_loader: Option<String>,
    data_format: Vec<String>,
    #[serde(default)]
    compression: Option<serde_json::Value>,
    #[serde(default)]
    encryption: Option<serde_json::Value>,
}

impl TokenIndex {
    /// Parses and checks an `index.json`: a token dataset's, uncompressed,
    /// unencrypted, of 16 or 32-bit integers, its chunks plain file names.
    pub fn parse(json: &[u8]) -> Result<Self, String> {
        let index: Index =
            serde_json::from_slice(json).map_err(|err| format!("not the index.json of a LitData dataset: {err}"))?;
        let config = &index.config;
        let loader = config.item_loader.as_deref().unwrap_or("PyTreeLoader");
        if loader != "TokensLoader" {
            return Err(format!(
                "a LitData dataset written with {loader}: sluice reads LitData token datasets \
                 (item_loader=TokensLoader) only; write samples as WebDataset, MDS or records instead"
            ));
        }
        if config.compression.as_ref().is_some_and(|c| !c.is_null()) {
            return Err("compressed LitData chunks: a token of a compressed chunk is no byte range; run optimize \
                        without compression (sluice's node checksums and caches the tokens itself)"
                .into());
        }
        if config.encryption.as_ref().is_some_and(|e| !e.is_null()) {
            return Err("encrypted LitData chunks: sluice serves token bytes as they are stored".into());
        }
        let [format] = config.data_format.as_slice() else {
            return Err(format!("a token dataset has one data format, not {:?}", config.data_format));
        };
        // The codes are LitData's `_TORCH_DTYPES_MAPPING` and
        // `_NUMPY_DTYPES_MAPPING`: 13/14 int16, 15/16 int32, 20 uint16
        // (torch); 1 int16, 2 int32, 5 uint16, 6 uint32 (NumPy). Token ids
        // are not negative, so a signed type's bytes are its unsigned twin's.
        let token_bytes = match format.split_once(':') {
            Some(("no_header_tensor", "13" | "14" | "20")) | Some(("no_header_numpy", "1" | "5")) => 2,
            Some(("no_header_tensor", "15" | "16")) | Some(("no_header_numpy", "2" | "6")) => 4,
            _ => {
                return Err(format!(
                    "LitData data format {format:?}: sluice's tokens are 16 or 32-bit integers \
                     (no_header_tensor or no_header_numpy of int16, uint16, int32 or uint32)"
                ))
            }
        };
        if let Some(entry) = index.chunks.iter().find(|entry| !plain_file_name(&entry.filename)) {
            return Err(format!(
                "index.json names chunk {:?}, which is not a file name in its directory",
                entry.filename
            ));
        }
        if let Some(entry) = index.chunks.iter().find(|entry| entry.items > ITEMS_PER_CHUNK_MAX) {
            return Err(format!(
                "index.json gives chunk {:?} {} items, more than a chunk may hold ({ITEMS_PER_CHUNK_MAX})",
                entry.filename, entry.items
            ));
        }
        Ok(Self { token_bytes, data_format: format.clone(), chunks: index.chunks })
    }

    /// Refuses a dataset of `kind` for these tokens.
    pub fn check_kind(&self, kind: DatasetKind) -> Result<(), String> {
        let fits = matches!(kind, DatasetKind::TokensU16 | DatasetKind::TokensU32)
            && kind.element_size_bytes() == self.token_bytes;
        if fits {
            return Ok(());
        }
        Err(format!(
            "LitData tokens of {} bytes ({}) go into a tokens:u{} dataset, not {}",
            self.token_bytes,
            self.data_format,
            self.token_bytes * 8,
            kind.as_str()
        ))
    }
}

/// A name with no directory part, `.` or `..`.
fn plain_file_name(name: &str) -> bool {
    !name.is_empty() && name != "." && name != ".." && !name.contains('/') && !name.contains('\\')
}

impl ChunkEntry {
    /// Bytes of the chunk's header, as the index's item count sizes it.
    pub fn header_bytes(&self) -> u64 {
        4 + 4 * (self.items + 1)
    }

    /// Checks the chunk's `header` (its first [`ChunkEntry::header_bytes`]
    /// bytes, or fewer if the file is shorter) against the index and the
    /// file's size; its token bytes, which follow the header.
    pub fn check_header(&self, header: &[u8], file_bytes: u64, token_bytes: u64) -> Result<u64, String> {
        let short = || format!("{file_bytes} bytes, shorter than its header");
        let count = u64::from(u32_at(header, 0).ok_or_else(short)?);
        if count != self.items {
            return Err(format!("holds {count} items, index.json says {}", self.items));
        }
        let header_bytes = self.header_bytes();
        if (header.len() as u64) < header_bytes {
            return Err(short());
        }
        let offset = |i: u64| u64::from(u32_at(header, 4 + 4 * i as usize).unwrap_or(0));
        if offset(0) != header_bytes {
            return Err(format!("its first item starts at byte {}, not after its header ({header_bytes})", offset(0)));
        }
        for i in 0..count {
            let (start, end) = (offset(i), offset(i + 1));
            if end < start || (end - start) % token_bytes != 0 {
                return Err(format!("item {i} ({start}..{end}) is not a run of {token_bytes}-byte tokens"));
            }
        }
        let end = offset(count);
        if end != file_bytes {
            return Err(format!("its offsets end at byte {end}, the file has {file_bytes} (cut short or grown?)"));
        }
        let data_bytes = file_bytes - header_bytes;
        if let Some(tokens) = self.tokens {
            if tokens.checked_mul(token_bytes) != Some(data_bytes) {
                return Err(format!("holds {} tokens, index.json says {tokens}", data_bytes / token_bytes));
            }
        }
        Ok(data_bytes)
    }
}

fn u32_at(bytes: &[u8], at: usize) -> Option<u32> {
    let word = bytes.get(at..at + 4)?;
    Some(u32::from_le_bytes([word[0], word[1], word[2], word[3]]))
}

/// A chunk as LitData's writer lays it out (the count, the absolute
/// offsets, the items), for tests here and elsewhere.
pub fn write_chunk(items: &[Vec<u8>]) -> Vec<u8> {
    let mut offset = 4 + 4 * (items.len() as u32 + 1);
    let mut bytes = (items.len() as u32).to_le_bytes().to_vec();
    bytes.extend_from_slice(&offset.to_le_bytes());
    for item in items {
        offset += item.len() as u32;
        bytes.extend_from_slice(&offset.to_le_bytes());
    }
    items.iter().for_each(|item| bytes.extend_from_slice(item));
    bytes
}

/// An `index.json` as LitData writes it for a token dataset of `format`
/// (`"no_header_tensor:16"`: int32) and `loader`, listing `(file name,
/// items, tokens)`, for tests here and elsewhere.
pub fn write_index(format: &str, loader: &str, chunks: &[(&str, u64, u64)]) -> String {
    let chunks: Vec<_> = chunks
        .iter()
        .map(|(name, items, tokens)| {
            serde_json::json!({"chunk_bytes": 0, "chunk_size": items, "dim": tokens, "filename": name})
        })
        .collect();
    serde_json::json!({
        "chunks": chunks,
        "config": {"chunk_bytes": null, "chunk_size": 16392, "compression": null, "data_format": [format],
                   "data_spec": "[1, {}]", "encryption": null, "item_loader": loader},
    })
    .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_index_is_read_and_other_layouts_refused_by_name() {
        let index = TokenIndex::parse(write_index("no_header_numpy:5", "TokensLoader", &[("c.bin", 2, 3)]).as_bytes())
            .expect("a token index");
        assert_eq!(index.token_bytes, 2);
        assert!(index.check_kind(DatasetKind::TokensU16).is_ok());
        let refused = index.check_kind(DatasetKind::TokensU32).expect_err("u16 tokens into u32");
        assert!(refused.contains("tokens:u16 dataset, not tokens:u32"), "{refused}");
        assert!(index.check_kind(DatasetKind::Bytes).is_err());

        let refusal = |json: String| TokenIndex::parse(json.as_bytes()).expect_err("refused");
        let pytree = refusal(write_index("no_header_tensor:16", "PyTreeLoader", &[("c.bin", 2, 3)]));
        assert!(pytree.contains("(item_loader=TokensLoader) only"), "{pytree}");
        assert!(refusal(write_index("no_header_tensor:17", "TokensLoader", &[])).contains("16 or 32-bit"));
        for name in ["../c.bin", "a/c.bin", "..", ""] {
            let escaped = refusal(write_index("no_header_tensor:20", "TokensLoader", &[(name, 2, 3)]));
            assert!(escaped.contains("not a file name"), "{name}: {escaped}");
        }
        let compressed = write_index("no_header_tensor:20", "TokensLoader", &[])
            .replace("\"compression\":null", "\"compression\":\"zstd\"");
        assert!(refusal(compressed).contains("compressed LitData chunks"));
        let encrypted = write_index("no_header_tensor:20", "TokensLoader", &[])
            .replace("\"encryption\":null", "\"encryption\":{\"algorithm\":\"fernet\"}");
        assert!(refusal(encrypted).contains("encrypted"));
        assert!(refusal("[]".into()).contains("not the index.json"));
        let huge = refusal(write_index("no_header_tensor:20", "TokensLoader", &[("c.bin", u64::MAX, 3)]));
        assert!(huge.contains("more than a chunk may hold"), "{huge}");
    }

    #[test]
    fn a_chunk_header_is_checked_against_its_index_entry_and_size() {
        let chunk = write_chunk(&[vec![1, 0, 2, 0], vec![3, 0]]);
        let entry = ChunkEntry { items: 2, filename: "c.bin".into(), tokens: Some(3) };
        let size = chunk.len() as u64;
        assert_eq!(entry.header_bytes(), 16);
        assert_eq!(entry.check_header(&chunk[..16], size, 2), Ok(6));

        let wrong = |entry: &ChunkEntry, header: &[u8], size: u64| entry.check_header(header, size, 2).expect_err("");
        assert!(wrong(&ChunkEntry { items: 3, ..entry.clone() }, &chunk, size).contains("index.json says 3"));
        assert!(wrong(&ChunkEntry { tokens: Some(4), ..entry.clone() }, &chunk, size).contains("says 4"));
        assert!(wrong(&entry, &chunk, size - 1).contains("offsets end at byte 22, the file has 21"));
        assert!(wrong(&entry, &chunk[..6], 6).contains("shorter than its header"));
        assert!(wrong(&entry, &chunk[..2], 2).contains("shorter than its header"));
        let mut odd = chunk.clone();
        odd[8..12].copy_from_slice(&17u32.to_le_bytes());
        assert!(wrong(&entry, &odd, size).contains("not a run of 2-byte tokens"));
        let mut late = chunk.clone();
        late[4..8].copy_from_slice(&18u32.to_le_bytes());
        assert!(wrong(&entry, &late, size).contains("first item starts at byte 18"));
    }
}
