//! LitData token datasets (`litdata.optimize(..., item_loader=TokensLoader())`,
//! what LitGPT pretrains from) as the files of a `tokens:u16` or
//! `tokens:u32` dataset: a directory's `index.json` names its chunks in
//! order, and each chunk's tokens, past its header, are sent as they are.
//!
//! A chunk is a little-endian `u32` item count `n`, then `n + 1` absolute
//! `u32` offsets, then the items: for a token dataset, each item is a
//! sequence's tokens with no header of its own (`no_header_tensor` or
//! `no_header_numpy`), so the chunk's data is one run of tokens, and the
//! dataset is the runs of its chunks in the index's order, the stream
//! LitData's `TokensLoader` cuts its blocks from.
//!
//! Only that layout is read. Chunks of other item loaders (one pytree per
//! item), and compressed or encrypted chunks, are refused by name: their
//! items are not a token stream.

use std::fs::File;
use std::io::Read;
use std::path::{Component, Path, PathBuf};

use serde::Deserialize;
use sluice_proto::api::DatasetKind;

/// Most items one chunk may hold: its offsets then take 64 MiB.
pub const ITEMS_PER_CHUNK_MAX: u64 = 1 << 24;

/// One chunk's token bytes: `data_bytes` from `data_offset_bytes` of `path`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TokenChunk {
    pub path: PathBuf,
    pub data_offset_bytes: u64,
    pub data_bytes: u64,
}

#[derive(Deserialize)]
struct Index {
    chunks: Vec<ChunkEntry>,
    config: Config,
}

#[derive(Deserialize)]
struct ChunkEntry {
    /// Items in the chunk.
    chunk_size: u64,
    filename: String,
    /// Tokens in the chunk, where the writer recorded them.
    #[serde(default)]
    dim: Option<u64>,
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

/// The `index.json` a LitData output directory holds, when `path` is such
/// a directory or that file itself.
pub fn index_of(path: &Path) -> Option<PathBuf> {
    if path.is_dir() {
        let index = path.join("index.json");
        index.is_file().then_some(index)
    } else {
        (path.file_name().is_some_and(|name| name == "index.json") && path.is_file()).then(|| path.to_path_buf())
    }
}

/// The chunks of the LitData token dataset whose `index.json` is `index`,
/// in its order, each checked against its header, for a dataset of `kind`.
/// Every refusal says what is wrong; nothing is sent before all pass.
pub fn token_chunks(index: &Path, kind: DatasetKind) -> Result<Vec<TokenChunk>, String> {
    let text = std::fs::read(index).map_err(|err| format!("{}: {err}", index.display()))?;
    let parsed: Index = serde_json::from_slice(&text)
        .map_err(|err| format!("{}: not the index.json of a LitData dataset: {err}", index.display()))?;
    let element = token_width(&parsed.config)?;
    if kind.element_size_bytes() != element || !matches!(kind, DatasetKind::TokensU16 | DatasetKind::TokensU32) {
        return Err(format!(
            "LitData tokens of {element} bytes ({}) go into a tokens:u{} dataset, not {}",
            parsed.config.data_format[0],
            element * 8,
            kind.as_str()
        ));
    }
    let dir = index.parent().unwrap_or(Path::new("."));
    parsed.chunks.iter().map(|entry| checked_chunk(dir, entry, element)).collect()
}

/// Bytes of one token, from the configuration; refuses any other layout.
fn token_width(config: &Config) -> Result<u64, String> {
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
    // `_NUMPY_DTYPES_MAPPING`: 13/14 int16, 15/16 int32, 20 uint16 (torch);
    // 1 int16, 2 int32, 5 uint16, 6 uint32 (NumPy). Token ids are not
    // negative, so a signed type's bytes are its unsigned twin's.
    let width = match format.split_once(':') {
        Some(("no_header_tensor", "13" | "14" | "20")) | Some(("no_header_numpy", "1" | "5")) => 2,
        Some(("no_header_tensor", "15" | "16")) | Some(("no_header_numpy", "2" | "6")) => 4,
        _ => {
            return Err(format!(
                "LitData data format {format:?}: sluice's tokens are 16 or 32-bit integers (no_header_tensor or \
                 no_header_numpy of int16, uint16, int32 or uint32)"
            ))
        }
    };
    Ok(width)
}

/// `entry`'s file in `dir`, its header read and checked.
fn checked_chunk(dir: &Path, entry: &ChunkEntry, element: u64) -> Result<TokenChunk, String> {
    let mut components = Path::new(&entry.filename).components();
    let (Some(Component::Normal(_)), None) = (components.next(), components.next()) else {
        return Err(format!("index.json names chunk {:?}, which is not a file name in its directory", entry.filename));
    };
    let path = dir.join(&entry.filename);
    let fail = |what: String| format!("LitData chunk {}: {what}", path.display());
    let mut file = File::open(&path).map_err(|err| fail(err.to_string()))?;
    let size = file.metadata().map_err(|err| fail(err.to_string()))?.len();
    let mut count = [0u8; 4];
    file.read_exact(&mut count).map_err(|_| fail(format!("{size} bytes, shorter than its header")))?;
    let count = u64::from(u32::from_le_bytes(count));
    if count != entry.chunk_size || count > ITEMS_PER_CHUNK_MAX {
        return Err(fail(format!("holds {count} items, index.json says {}", entry.chunk_size)));
    }
    let header_bytes = 4 + 4 * (count + 1);
    let mut offsets = vec![0u8; 4 * (count as usize + 1)];
    file.read_exact(&mut offsets).map_err(|_| fail(format!("{size} bytes, shorter than its header")))?;
    let offsets: Vec<u64> =
        offsets.chunks_exact(4).map(|b| u64::from(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))).collect();
    if offsets[0] != header_bytes {
        return Err(fail(format!(
            "its first item starts at byte {}, not after its header ({header_bytes})",
            offsets[0]
        )));
    }
    if let Some(i) = offsets.windows(2).position(|pair| pair[1] < pair[0] || (pair[1] - pair[0]) % element != 0) {
        return Err(fail(format!(
            "item {i} ({}..{}) is not a run of {element}-byte tokens",
            offsets[i],
            offsets[i + 1]
        )));
    }
    let end = offsets[count as usize];
    if end != size {
        return Err(fail(format!("its offsets end at byte {end}, the file has {size} (cut short or grown?)")));
    }
    let data_bytes = size - header_bytes;
    if let Some(dim) = entry.dim {
        if dim.checked_mul(element) != Some(data_bytes) {
            return Err(fail(format!("holds {} tokens, index.json says {dim}", data_bytes / element)));
        }
    }
    Ok(TokenChunk { path, data_offset_bytes: header_bytes, data_bytes })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A chunk as LitData's writer lays it out: the count, the absolute
    /// offsets, the items.
    fn chunk(items: &[Vec<u8>]) -> Vec<u8> {
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

    fn index(format: &str, loader: &str, chunks: &[(&str, u64, u64)]) -> String {
        let chunks: Vec<_> = chunks
            .iter()
            .map(|(name, items, dim)| serde_json::json!({"chunk_bytes": 0, "chunk_size": items, "dim": dim, "filename": name}))
            .collect();
        serde_json::json!({
            "chunks": chunks,
            "config": {"chunk_bytes": null, "chunk_size": 16392, "compression": null, "data_format": [format],
                       "data_spec": "[1, {}]", "encryption": null, "item_loader": loader},
        })
        .to_string()
    }

    fn tokens_u32(values: &[u32]) -> Vec<u8> {
        values.iter().flat_map(|v| v.to_le_bytes()).collect()
    }

    #[test]
    fn chunks_come_in_index_order_past_their_headers() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        std::fs::write(dir.path().join("chunk-1-0.bin"), chunk(&[tokens_u32(&[7, 8, 9])])).expect("written");
        std::fs::write(dir.path().join("chunk-0-0.bin"), chunk(&[tokens_u32(&[1, 2]), tokens_u32(&[3])]))
            .expect("written");
        let listed = index("no_header_tensor:16", "TokensLoader", &[("chunk-0-0.bin", 2, 3), ("chunk-1-0.bin", 1, 3)]);
        std::fs::write(dir.path().join("index.json"), listed).expect("written");
        let found = index_of(dir.path()).expect("a LitData directory");
        let chunks = token_chunks(&found, DatasetKind::TokensU32).expect("a token dataset");
        assert_eq!(
            chunks,
            vec![
                TokenChunk { path: dir.path().join("chunk-0-0.bin"), data_offset_bytes: 16, data_bytes: 12 },
                TokenChunk { path: dir.path().join("chunk-1-0.bin"), data_offset_bytes: 12, data_bytes: 12 },
            ]
        );
        let refused = token_chunks(&found, DatasetKind::TokensU16).expect_err("u32 tokens into a u16 dataset");
        assert!(refused.contains("tokens:u32 dataset, not tokens:u16"), "{refused}");
    }

    #[test]
    fn other_layouts_and_broken_chunks_are_refused_by_name() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let good = chunk(&[vec![1, 0, 2, 0], vec![3, 0]]);
        std::fs::write(dir.path().join("c.bin"), &good).expect("written");
        let refusal = |listed: String| {
            std::fs::write(dir.path().join("index.json"), listed).expect("written");
            token_chunks(&dir.path().join("index.json"), DatasetKind::TokensU16).expect_err("refused")
        };
        let ok = index("no_header_numpy:5", "TokensLoader", &[("c.bin", 2, 3)]);
        std::fs::write(dir.path().join("index.json"), &ok).expect("written");
        assert!(token_chunks(&dir.path().join("index.json"), DatasetKind::TokensU16).is_ok());

        assert!(refusal(index("no_header_tensor:16", "PyTreeLoader", &[("c.bin", 2, 3)]))
            .contains("(item_loader=TokensLoader) only"));
        assert!(refusal(index("no_header_tensor:17", "TokensLoader", &[("c.bin", 2, 3)])).contains("16 or 32-bit"));
        assert!(
            refusal(index("no_header_tensor:20", "TokensLoader", &[("../c.bin", 2, 3)])).contains("not a file name")
        );
        assert!(refusal(index("no_header_tensor:20", "TokensLoader", &[("c.bin", 3, 3)])).contains("index.json says 3"));
        assert!(refusal(index("no_header_tensor:20", "TokensLoader", &[("c.bin", 2, 4)])).contains("says 4"));
        assert!(refusal(index("no_header_tensor:20", "TokensLoader", &[("gone.bin", 2, 3)])).contains("gone.bin"));
        let compressed = ok.replace("\"compression\":null", "\"compression\":\"zstd\"");
        assert!(refusal(compressed).contains("compressed LitData chunks"));

        std::fs::write(dir.path().join("c.bin"), &good[..good.len() - 1]).expect("written");
        assert!(refusal(ok.clone()).contains("offsets end at byte 22, the file has 21"));
        let mut odd = good.clone();
        odd[8..12].copy_from_slice(&17u32.to_le_bytes());
        std::fs::write(dir.path().join("c.bin"), odd).expect("written");
        assert!(refusal(ok.clone()).contains("not a run of 2-byte tokens"));
        std::fs::write(dir.path().join("c.bin"), &good[..6]).expect("written");
        assert!(refusal(ok).contains("shorter than its header"));
    }
}
