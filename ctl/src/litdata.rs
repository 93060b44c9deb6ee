//! A local LitData token dataset (see [`sluice_proto::litdata`]): its
//! directory's `index.json` read, and each chunk's header checked against
//! it, before any byte is sent.

use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};

use sluice_proto::api::DatasetKind;
use sluice_proto::litdata::{ChunkEntry, TokenIndex, INDEX_BYTES_MAX};

/// One chunk's token bytes: `data_bytes` from `data_offset_bytes` of `path`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TokenChunk {
    pub path: PathBuf,
    pub data_offset_bytes: u64,
    pub data_bytes: u64,
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
    let failed = |err: String| format!("{}: {err}", index.display());
    let mut json = Vec::new();
    File::open(index)
        .and_then(|file| file.take(INDEX_BYTES_MAX).read_to_end(&mut json))
        .map_err(|err| failed(err.to_string()))?;
    let parsed = TokenIndex::parse(&json).map_err(failed)?;
    parsed.check_kind(kind).map_err(failed)?;
    let dir = index.parent().unwrap_or(Path::new("."));
    parsed.chunks.iter().map(|entry| checked_chunk(dir, entry, parsed.token_bytes)).collect()
}

/// `entry`'s file in `dir`, its header read and checked.
fn checked_chunk(dir: &Path, entry: &ChunkEntry, token_bytes: u64) -> Result<TokenChunk, String> {
    let path = dir.join(&entry.filename);
    let fail = |what: String| format!("LitData chunk {}: {what}", path.display());
    let file = File::open(&path).map_err(|err| fail(err.to_string()))?;
    let size = file.metadata().map_err(|err| fail(err.to_string()))?.len();
    let mut header = Vec::new();
    file.take(entry.header_bytes()).read_to_end(&mut header).map_err(|err| fail(err.to_string()))?;
    let data_bytes = entry.check_header(&header, size, token_bytes).map_err(fail)?;
    Ok(TokenChunk { path, data_offset_bytes: entry.header_bytes(), data_bytes })
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_proto::litdata::{write_chunk, write_index};

    fn tokens_u32(values: &[u32]) -> Vec<u8> {
        values.iter().flat_map(|v| v.to_le_bytes()).collect()
    }

    #[test]
    fn chunks_come_in_index_order_past_their_headers() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        std::fs::write(dir.path().join("chunk-1-0.bin"), write_chunk(&[tokens_u32(&[7, 8, 9])])).expect("written");
        std::fs::write(dir.path().join("chunk-0-0.bin"), write_chunk(&[tokens_u32(&[1, 2]), tokens_u32(&[3])]))
            .expect("written");
        let listed =
            write_index("no_header_tensor:16", "TokensLoader", &[("chunk-0-0.bin", 2, 3), ("chunk-1-0.bin", 1, 3)]);
        std::fs::write(dir.path().join("index.json"), listed).expect("written");
        let found = index_of(dir.path()).expect("a LitData directory");
        assert_eq!(index_of(&found), Some(found.clone()));
        assert_eq!(index_of(&dir.path().join("chunk-0-0.bin")), None);
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

        std::fs::remove_file(dir.path().join("chunk-1-0.bin")).expect("removed");
        let missing = token_chunks(&found, DatasetKind::TokensU32).expect_err("a chunk is missing");
        assert!(missing.contains("chunk-1-0.bin"), "{missing}");
        std::fs::write(dir.path().join("chunk-1-0.bin"), &write_chunk(&[tokens_u32(&[7, 8, 9])])[..10])
            .expect("written");
        let cut = token_chunks(&found, DatasetKind::TokensU32).expect_err("a chunk is cut short");
        assert!(cut.contains("chunk-1-0.bin: 10 bytes, shorter than its header"), "{cut}");
    }
}
