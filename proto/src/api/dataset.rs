//! Datasets as the control API shows them, and as the catalog stores them:
//! kind, state, where the bytes live, and what ingest and scrub report.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// What a dataset holds. Tokens are little-endian, concatenated into one
/// stream, as Megatron's `.bin` files and 1-D `.npy` arrays are.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub enum DatasetKind {
    #[serde(rename = "bytes")]
    Bytes,
    #[serde(rename = "tokens:u16")]
    TokensU16,
    #[serde(rename = "tokens:u32")]
    TokensU32,
    /// Samples of any size: concatenated bytes plus an index of
    /// `(offset, len)` per sample (or one fixed record size).
    #[serde(rename = "records")]
    Records,
    /// WebDataset tar shards; the index of samples is built at ingest.
    #[serde(rename = "wds")]
    Wds,
    /// Mosaic Data Shards (Mosaic Streaming's `MDSWriter`, uncompressed);
    /// the index of samples is read from each shard's header at ingest.
    #[serde(rename = "mds")]
    Mds,
}

impl DatasetKind {
    /// Size of one element; a dataset's length is a multiple of it.
    pub fn element_size_bytes(self) -> u64 {
        match self {
            Self::Bytes | Self::Records | Self::Wds | Self::Mds => 1,
            Self::TokensU16 => 2,
            Self::TokensU32 => 4,
        }
    }

    /// The `.npy` dtype descriptors this kind accepts (`None`: any).
    pub fn npy_dtypes(self) -> Option<&'static [&'static str]> {
        match self {
            Self::Bytes | Self::Records | Self::Wds | Self::Mds => None,
            Self::TokensU16 => Some(&["<u2"]),
            Self::TokensU32 => Some(&["<u4"]),
        }
    }

    /// Whether samples are records with an index rather than token windows.
    pub fn has_records(self) -> bool {
        matches!(self, Self::Records | Self::Wds | Self::Mds)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Bytes => "bytes",
            Self::TokensU16 => "tokens:u16",
            Self::TokensU32 => "tokens:u32",
            Self::Records => "records",
            Self::Wds => "wds",
            Self::Mds => "mds",
        }
    }
}

impl fmt::Display for DatasetKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for DatasetKind {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "bytes" => Ok(Self::Bytes),
            "tokens:u16" => Ok(Self::TokensU16),
            "tokens:u32" => Ok(Self::TokensU32),
            "records" => Ok(Self::Records),
            "wds" => Ok(Self::Wds),
            "mds" => Ok(Self::Mds),
            other => Err(format!(
                "unknown dataset kind {other:?} (expected bytes, tokens:u16, tokens:u32, records, wds or mds)"
            )),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum DatasetState {
    /// Made, nothing ingested yet.
    Creating,
    /// At least one file ingested; more may follow.
    Ingesting,
    /// Immutable and served.
    Sealed,
    /// Being removed; finished at the next start if interrupted.
    Deleting,
}

impl std::fmt::Display for DatasetState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Creating => "creating",
            Self::Ingesting => "ingesting",
            Self::Sealed => "sealed",
            Self::Deleting => "deleting",
        })
    }
}

/// What holds a dataset's bytes on a node. Stored and shown by its name
/// (`file`, `device`, ...), so records stay readable JSON; a name this
/// build does not know is kept as [`NamespaceKind::Other`] and refused
/// where a namespace of it would be touched (a record is untrusted until
/// checked against the node's config).
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(from = "String", into = "String")]
pub enum NamespaceKind {
    /// A file of its own under the data directory (`DATA_DIR/namespaces/`).
    File,
    /// A block device: a namespace device given whole to the dataset, or
    /// one the allocator attached from a controller's detached pool.
    Device,
    /// A namespace on a controller a user-space driver (SPDK) owns; its
    /// path is `PCI_ADDRESS/NSID`.
    Nvme,
    /// Memory (`--driver mem`): gone at restart.
    Mem,
    /// A dataset this node holds no copy of (a cluster catalog's record
    /// as other nodes see it).
    Remote,
    /// No namespace could be had: create undoes the record.
    Unplaced,
    /// A name this build does not know.
    Other(String),
}

impl NamespaceKind {
    pub fn as_str(&self) -> &str {
        match self {
            Self::File => "file",
            Self::Device => "device",
            Self::Nvme => "nvme",
            Self::Mem => "mem",
            Self::Remote => "remote",
            Self::Unplaced => "unplaced",
            Self::Other(name) => name,
        }
    }
}

impl From<String> for NamespaceKind {
    fn from(name: String) -> Self {
        match name.as_str() {
            "file" => Self::File,
            "device" => Self::Device,
            "nvme" => Self::Nvme,
            "mem" => Self::Mem,
            "remote" => Self::Remote,
            "unplaced" => Self::Unplaced,
            _ => Self::Other(name),
        }
    }
}

impl From<NamespaceKind> for String {
    fn from(kind: NamespaceKind) -> Self {
        kind.as_str().to_string()
    }
}

impl fmt::Display for NamespaceKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Where a dataset's bytes live and why there.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct NamespaceRecord {
    /// `file`, `device`, `nvme` (SPDK), `mem`, `remote` (a cluster node
    /// holding no copy) or `unplaced`.
    #[cfg_attr(feature = "openapi", schema(value_type = String))]
    pub kind: NamespaceKind,
    pub path: String,
    pub base_offset_bytes: u64,
    /// Why the allocator chose this namespace.
    pub reason: String,
    /// `CONTROLLER:NSID` when the allocator attached this namespace from the
    /// controller's detached pool; delete detaches it again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attached: Option<String>,
    /// The allocator created this namespace (NVMe Namespace Management)
    /// for the dataset; delete detaches and deletes it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub created: bool,
}

impl NamespaceRecord {
    /// A whole namespace (or file) from its first byte, chosen for `reason`.
    pub fn new(kind: NamespaceKind, path: impl Into<String>, reason: impl Into<String>) -> Self {
        Self { kind, path: path.into(), base_offset_bytes: 0, reason: reason.into(), attached: None, created: false }
    }

    /// Attached for the dataset (`label` names it for release), and
    /// created for it when `created`: delete gives it back.
    pub fn attached_as(self, label: String, created: bool) -> Self {
        Self { attached: Some(label), created, ..self }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct DatasetRecord {
    pub id: u64,
    pub name: String,
    pub kind: DatasetKind,
    pub state: DatasetState,
    pub length_bytes: u64,
    pub files_ingested: u32,
    pub chunk_size_bytes: u64,
    /// `blake3:<hex>` of the content, set at seal.
    pub content_hash: Option<String>,
    pub namespace: NamespaceRecord,
    pub created_unix_ms: u64,
    pub sealed_unix_ms: Option<u64>,
    /// `records` of one fixed size: no index file.
    #[serde(default)]
    pub record_size_bytes: Option<u64>,
    /// Samples committed (`records`, `wds` and `mds`).
    #[serde(default)]
    pub record_count: u64,
    /// Nodes chosen to hold a copy, the ingesting node first (a cluster
    /// catalog only; empty on a single node).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub placement: Vec<String>,
    /// Where a source-backed dataset's bytes come from, pinned at create;
    /// `None` for an ingested dataset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<DatasetSource>,
}

/// A source-backed dataset's objects, listed and pinned at create: its
/// bytes are the concatenation of their data, in this order, and a read
/// never mixes versions (every fetch is conditional on the pinned ETag).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct DatasetSource {
    /// The URLs given at create (`s3://bucket/key`, `s3://bucket/prefix/`,
    /// `gs://`, `az://`, `https://`, `file://`).
    pub urls: Vec<String>,
    pub objects: Vec<SourceObject>,
    /// `blake3:` of the pinned manifest (each object's URL, size, ETag and
    /// version): what a client's sampler state names the dataset by, the
    /// same before and after the bytes reach the node.
    pub manifest_hash: String,
    /// `dataset warm` was asked for and has not finished: a restart goes on
    /// with it.
    #[serde(default)]
    pub warm_requested: bool,
    /// `dataset pin`: its chunks are never evicted.
    #[serde(default)]
    pub pinned: bool,
}

/// One object of a source-backed dataset, as pinned at create.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SourceObject {
    /// The object's own URL.
    pub url: String,
    pub size_bytes: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub e_tag: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    /// Where the dataset's bytes start inside the object (after a `.npy`
    /// header; 0 otherwise).
    pub data_offset_bytes: u64,
    /// How many of the dataset's bytes the object holds.
    pub data_bytes: u64,
}

/// How much of a source-backed dataset is on the node, and how its fills
/// have gone since the node started.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct CacheReport {
    pub name: String,
    pub chunks_total: u64,
    pub chunks_present: u64,
    /// `dataset warm` is running.
    pub warming: bool,
    /// Every chunk is present and the content hash is taken.
    pub hydrated: bool,
    /// Reads whose chunks were all present, and reads that waited on a fill.
    pub reads_present: u64,
    pub reads_filled: u64,
    pub chunks_filled: u64,
    pub bytes_filled: u64,
    /// Fetches that failed after every retry, and ranges failed because the
    /// source changed.
    pub source_errors: u64,
    pub source_changed: u64,
    /// Chunks evicted under the node's cache budget, and their bytes.
    pub chunks_evicted: u64,
    pub bytes_evicted: u64,
    /// Mean time of a fill (fetch and commit of a run of chunks).
    pub fill_mean_micros: u64,
    /// `dataset pin`: its chunks are never evicted.
    pub pinned: bool,
    /// The last source error, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
}

/// What one file added.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Appended {
    /// Data bytes of the file (the array data of a `.npy`).
    pub data_bytes: u64,
    /// CRC32C of those bytes, for the sender to compare with its own.
    pub data_crc32c: u32,
    /// The dataset's length once this is committed.
    pub length_bytes: u64,
    /// Samples the file added (`records`, `wds` and `mds`).
    #[serde(default)]
    pub records: u64,
}

/// What a scrub found.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ScrubReport {
    pub name: String,
    pub chunks: u64,
    pub bytes: u64,
    /// `(chunk, status)` of every chunk that did not read back clean.
    pub bad_chunks: Vec<(u64, String)>,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A namespace kind is stored by its name, as before it had a type, and
    /// a name this build does not know survives a read and a write intact
    /// (so a record from a newer node is refused where it is used, not
    /// lost when the catalog is read).
    #[test]
    fn namespace_kinds_are_stored_by_name() {
        let kinds = [
            NamespaceKind::File,
            NamespaceKind::Device,
            NamespaceKind::Nvme,
            NamespaceKind::Mem,
            NamespaceKind::Remote,
            NamespaceKind::Unplaced,
            NamespaceKind::Other("zoned".into()),
        ];
        for kind in kinds {
            let stored = serde_json::to_string(&NamespaceRecord::new(kind.clone(), "p", "r")).expect("json");
            assert!(stored.contains(&format!(r#""kind":"{kind}""#)), "{stored}");
            let read: NamespaceRecord = serde_json::from_str(&stored).expect("read back");
            assert_eq!(read.kind, kind);
        }
        let old = r#"{"kind":"file","path":"ns/1","base_offset_bytes":0,"reason":"r"}"#;
        assert_eq!(serde_json::from_str::<NamespaceRecord>(old).expect("old record").kind, NamespaceKind::File);
    }
}
