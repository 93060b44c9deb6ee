//! The node's catalog: datasets, their state, their namespace and their
//! manifest, in an embedded transactional store (redb), so a node killed at
//! any point restarts with every committed change and nothing half-made
//! shown as sealed.

use std::path::Path;

use redb::{Database, ReadableTable, ReadableTableMetadata, TableDefinition};

use crate::grants::{GrantRecord, GRANTS_MAX};
pub use sluice_proto::api::{DatasetKind, DatasetRecord, DatasetState, NamespaceKind, NamespaceRecord};

const DATASETS: TableDefinition<&str, &[u8]> = TableDefinition::new("datasets");
/// Per dataset id: CRC32C of each 64 KiB chunk, little-endian u32s; the last
/// entry covers the partial tail while ingesting.
const CHUNK_CRCS: TableDefinition<u64, &[u8]> = TableDefinition::new("chunk_crcs");
const META: TableDefinition<&str, u64> = TableDefinition::new("meta");
const NEXT_ID: &str = "next_dataset_id";
/// Access grants by id (JSON [`GrantRecord`]s).
const GRANTS: TableDefinition<u64, &[u8]> = TableDefinition::new("grants");
/// The catalog's identity (`catalog_id`), written once.
const IDENTITY: TableDefinition<&str, &str> = TableDefinition::new("identity");
const CATALOG_ID: &str = "catalog_id";
const NEXT_GRANT_ID: &str = "next_grant_id";

/// Most datasets one node's catalog holds.
pub const DATASETS_MAX: usize = 65_536;
/// Longest dataset name.
pub const NAME_BYTES_MAX: usize = sluice_proto::codec::DATASET_NAME_BYTES_MAX;

#[derive(Debug, thiserror::Error)]
pub enum CatalogError {
    #[error("catalog store: {0}")]
    Store(#[source] Box<redb::Error>),
    #[error("catalog in etcd: {0}")]
    Cluster(#[from] crate::etcd::EtcdError),
    #[error("catalog in etcd: {0}")]
    Contended(String),
    #[error("invalid node id {0:?}: 1-{max} of [A-Za-z0-9._-]", max = crate::cluster::NODE_ID_BYTES_MAX)]
    BadNodeId(String),
    #[error("catalog record of {name}: {source}")]
    Record {
        name: String,
        #[source]
        source: serde_json::Error,
    },
    #[error("dataset {0:?} already exists")]
    Exists(String),
    #[error("no dataset named {0:?}")]
    Unknown(String),
    #[error("the catalog holds its limit of {DATASETS_MAX} datasets")]
    Full,
    #[error("the catalog holds its limit of {GRANTS_MAX} grants")]
    GrantsFull,
    #[error("grant record {id} is unreadable: {source}")]
    GrantRecord {
        id: u64,
        #[source]
        source: serde_json::Error,
    },
    #[error("invalid dataset name {0:?}: use 1-128 of [A-Za-z0-9._-], not starting with '.'")]
    BadName(String),
}

fn store<E: Into<redb::Error>>(err: E) -> CatalogError {
    CatalogError::Store(Box::new(err.into()))
}

pub fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= NAME_BYTES_MAX
        && !name.starts_with('.')
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
}

/// The catalog's records, read at once ([`CatalogStore::listing`]).
#[derive(Debug, Default)]
pub struct Listing {
    pub readable: Vec<DatasetRecord>,
    pub foreign: Vec<ForeignRecord>,
}

/// A dataset record this build cannot read ([`CatalogStore::listing`]):
/// all it knows of it is its name and id, and why the rest did not read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ForeignRecord {
    pub name: String,
    pub id: u64,
    pub why: String,
}

/// Where datasets, their checksums and grants are kept: an embedded redb
/// file on a single node ([`Catalog`]), or etcd shared by a cluster of
/// nodes ([`crate::cluster::EtcdCatalog`]). Every change is one atomic
/// transaction in either.
pub trait CatalogStore: Send + Sync {
    /// Adds a dataset in state `creating`; `namespace` picks its namespace
    /// from the id it is given, and is called once.
    fn create(
        &self,
        name: &str,
        kind: DatasetKind,
        now_unix_ms: u64,
        namespace: &mut dyn FnMut(u64) -> NamespaceRecord,
    ) -> Result<DatasetRecord, CatalogError>;
    fn get(&self, name: &str) -> Result<Option<DatasetRecord>, CatalogError>;
    /// Every record this build can read; [`CatalogStore::listing`] names
    /// the others too.
    fn list(&self) -> Result<Vec<DatasetRecord>, CatalogError>;
    /// Every record, read at once: those this build can read, and the
    /// foreign ones, of datasets it cannot read. In a shared catalog those
    /// were written by a newer build that knows a kind or field this one
    /// does not. A node passes them over (lists, serves, places and
    /// restarts as if they were not there) but never takes their names,
    /// ids or files for free: a copy this node holds of one (it ran a
    /// newer build before) is neither reaped nor quarantined. The single
    /// node's own catalog has none: a record there it cannot read stops
    /// the node, as etcd refuses a data directory a newer etcd wrote.
    fn listing(&self) -> Result<Listing, CatalogError> {
        Ok(Listing { readable: self.list()?, foreign: Vec::new() })
    }
    /// Replaces a record and, when given, its chunk checksums, atomically.
    fn update(&self, record: &DatasetRecord, chunk_crcs: Option<&[u32]>) -> Result<(), CatalogError>;
    fn chunk_crcs(&self, id: u64) -> Result<Vec<u32>, CatalogError>;
    /// Removes a dataset's record and checksums.
    fn remove(&self, record: &DatasetRecord) -> Result<(), CatalogError>;
    /// Stores a new grant; `make` builds it from the id it is given.
    fn add_grant(&self, make: &mut dyn FnMut(u64) -> GrantRecord) -> Result<GrantRecord, CatalogError>;
    /// Removes a grant; whether it existed.
    fn remove_grant(&self, id: u64) -> Result<bool, CatalogError>;
    fn grants(&self) -> Result<Vec<GrantRecord>, CatalogError>;
    /// Where the catalog lives, for the node's description.
    fn describe(&self) -> String;
    /// The catalog's identity, once one was claimed.
    fn identity(&self) -> Result<Option<String>, CatalogError>;
    /// Makes `id` the catalog's identity unless it has one already;
    /// returns the identity it has now.
    fn claim_identity(&self, id: &str) -> Result<String, CatalogError>;

    fn require(&self, name: &str) -> Result<DatasetRecord, CatalogError> {
        self.get(name)?.ok_or_else(|| CatalogError::Unknown(name.to_string()))
    }
}

/// Checksums as stored: little-endian u32s.
pub(crate) fn crcs_to_bytes(crcs: &[u32]) -> Vec<u8> {
    crcs.iter().flat_map(|c| c.to_le_bytes()).collect()
}

pub(crate) fn crcs_from_bytes(bytes: &[u8]) -> impl Iterator<Item = u32> + '_ {
    bytes.chunks_exact(4).map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
}

/// A new record in state `creating`.
pub(crate) fn new_record(
    id: u64,
    name: &str,
    kind: DatasetKind,
    now_unix_ms: u64,
    namespace: NamespaceRecord,
) -> DatasetRecord {
    DatasetRecord {
        id,
        name: name.to_string(),
        kind,
        state: DatasetState::Creating,
        length_bytes: 0,
        files_ingested: 0,
        chunk_size_bytes: sluice_proto::CHUNK_SIZE_BYTES,
        content_hash: None,
        namespace,
        created_unix_ms: now_unix_ms,
        sealed_unix_ms: None,
        record_size_bytes: None,
        record_count: 0,
        placement: Vec::new(),
        source: None,
    }
}

/// The single-node catalog: one redb file in the data directory.
pub struct Catalog {
    db: Database,
    path: std::path::PathBuf,
}

impl Catalog {
    pub fn open(path: &Path) -> Result<Self, CatalogError> {
        let db = Database::create(path).map_err(store)?;
        let txn = db.begin_write().map_err(store)?;
        {
            txn.open_table(DATASETS).map_err(store)?;
            txn.open_table(CHUNK_CRCS).map_err(store)?;
            txn.open_table(META).map_err(store)?;
            txn.open_table(GRANTS).map_err(store)?;
            txn.open_table(IDENTITY).map_err(store)?;
        }
        txn.commit().map_err(store)?;
        Ok(Self { db, path: path.to_path_buf() })
    }
}

impl CatalogStore for Catalog {
    fn identity(&self) -> Result<Option<String>, CatalogError> {
        let txn = self.db.begin_read().map_err(store)?;
        let table = txn.open_table(IDENTITY).map_err(store)?;
        Ok(table.get(CATALOG_ID).map_err(store)?.map(|v| v.value().to_string()))
    }

    fn claim_identity(&self, id: &str) -> Result<String, CatalogError> {
        let txn = self.db.begin_write().map_err(store)?;
        let current = {
            let mut table = txn.open_table(IDENTITY).map_err(store)?;
            let existing = table.get(CATALOG_ID).map_err(store)?.map(|v| v.value().to_string());
            match existing {
                Some(existing) => existing,
                None => {
                    table.insert(CATALOG_ID, id).map_err(store)?;
                    id.to_string()
                }
            }
        };
        txn.commit().map_err(store)?;
        Ok(current)
    }

    fn create(
        &self,
        name: &str,
        kind: DatasetKind,
        now_unix_ms: u64,
        namespace: &mut dyn FnMut(u64) -> NamespaceRecord,
    ) -> Result<DatasetRecord, CatalogError> {
        if !valid_name(name) {
            return Err(CatalogError::BadName(name.to_string()));
        }
        let txn = self.db.begin_write().map_err(store)?;
        let record = {
            let mut datasets = txn.open_table(DATASETS).map_err(store)?;
            if datasets.get(name).map_err(store)?.is_some() {
                return Err(CatalogError::Exists(name.to_string()));
            }
            if datasets.len().map_err(store)? as usize >= DATASETS_MAX {
                return Err(CatalogError::Full);
            }
            let mut meta = txn.open_table(META).map_err(store)?;
            let id = meta.get(NEXT_ID).map_err(store)?.map(|v| v.value()).unwrap_or(1);
            meta.insert(NEXT_ID, id + 1).map_err(store)?;
            let record = new_record(id, name, kind, now_unix_ms, namespace(id));
            datasets.insert(name, encode(&record)?.as_slice()).map_err(store)?;
            record
        };
        txn.commit().map_err(store)?;
        Ok(record)
    }

    fn get(&self, name: &str) -> Result<Option<DatasetRecord>, CatalogError> {
        let txn = self.db.begin_read().map_err(store)?;
        let datasets = txn.open_table(DATASETS).map_err(store)?;
        let value = datasets.get(name).map_err(store)?;
        value.map(|v| decode(name, v.value())).transpose()
    }

    fn list(&self) -> Result<Vec<DatasetRecord>, CatalogError> {
        let txn = self.db.begin_read().map_err(store)?;
        let datasets = txn.open_table(DATASETS).map_err(store)?;
        let mut out = Vec::new();
        for entry in datasets.iter().map_err(store)? {
            let (key, value) = entry.map_err(store)?;
            out.push(decode(key.value(), value.value())?);
        }
        Ok(out)
    }

    fn update(&self, record: &DatasetRecord, chunk_crcs: Option<&[u32]>) -> Result<(), CatalogError> {
        let txn = self.db.begin_write().map_err(store)?;
        {
            let mut datasets = txn.open_table(DATASETS).map_err(store)?;
            if datasets.get(record.name.as_str()).map_err(store)?.is_none() {
                return Err(CatalogError::Unknown(record.name.clone()));
            }
            datasets.insert(record.name.as_str(), encode(record)?.as_slice()).map_err(store)?;
            if let Some(crcs) = chunk_crcs {
                let bytes = crcs_to_bytes(crcs);
                let mut table = txn.open_table(CHUNK_CRCS).map_err(store)?;
                table.insert(record.id, bytes.as_slice()).map_err(store)?;
            }
        }
        txn.commit().map_err(store)?;
        Ok(())
    }

    fn chunk_crcs(&self, id: u64) -> Result<Vec<u32>, CatalogError> {
        let txn = self.db.begin_read().map_err(store)?;
        let table = txn.open_table(CHUNK_CRCS).map_err(store)?;
        let value = table.get(id).map_err(store)?;
        Ok(value.map(|v| crcs_from_bytes(v.value()).collect()).unwrap_or_default())
    }

    fn add_grant(&self, make: &mut dyn FnMut(u64) -> GrantRecord) -> Result<GrantRecord, CatalogError> {
        let txn = self.db.begin_write().map_err(store)?;
        let grant = {
            let mut grants = txn.open_table(GRANTS).map_err(store)?;
            if grants.len().map_err(store)? as usize >= GRANTS_MAX {
                return Err(CatalogError::GrantsFull);
            }
            let mut meta = txn.open_table(META).map_err(store)?;
            let id = meta.get(NEXT_GRANT_ID).map_err(store)?.map(|v| v.value()).unwrap_or(1);
            meta.insert(NEXT_GRANT_ID, id + 1).map_err(store)?;
            let grant = make(id);
            debug_assert_eq!(grant.id, id);
            let bytes = serde_json::to_vec(&grant).map_err(|source| CatalogError::GrantRecord { id, source })?;
            grants.insert(id, bytes.as_slice()).map_err(store)?;
            grant
        };
        txn.commit().map_err(store)?;
        Ok(grant)
    }

    fn remove_grant(&self, id: u64) -> Result<bool, CatalogError> {
        let txn = self.db.begin_write().map_err(store)?;
        let existed = txn.open_table(GRANTS).map_err(store)?.remove(id).map_err(store)?.is_some();
        txn.commit().map_err(store)?;
        Ok(existed)
    }

    fn grants(&self) -> Result<Vec<GrantRecord>, CatalogError> {
        let txn = self.db.begin_read().map_err(store)?;
        let table = txn.open_table(GRANTS).map_err(store)?;
        let mut out = Vec::new();
        for entry in table.iter().map_err(store)? {
            let (id, bytes) = entry.map_err(store)?;
            let id = id.value();
            out.push(serde_json::from_slice(bytes.value()).map_err(|source| CatalogError::GrantRecord { id, source })?);
        }
        Ok(out)
    }

    fn describe(&self) -> String {
        format!("redb {}", self.path.display())
    }

    fn remove(&self, record: &DatasetRecord) -> Result<(), CatalogError> {
        let txn = self.db.begin_write().map_err(store)?;
        {
            txn.open_table(DATASETS).map_err(store)?.remove(record.name.as_str()).map_err(store)?;
            txn.open_table(CHUNK_CRCS).map_err(store)?.remove(record.id).map_err(store)?;
        }
        txn.commit().map_err(store)?;
        Ok(())
    }
}

fn encode(record: &DatasetRecord) -> Result<Vec<u8>, CatalogError> {
    serde_json::to_vec(record).map_err(|source| CatalogError::Record { name: record.name.clone(), source })
}

fn decode(name: &str, bytes: &[u8]) -> Result<DatasetRecord, CatalogError> {
    serde_json::from_slice(bytes).map_err(|source| CatalogError::Record { name: name.to_string(), source })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file_ns(id: u64) -> NamespaceRecord {
        NamespaceRecord::new(NamespaceKind::File, format!("ns/{id}"), "test")
    }

    /// Records and checksums persist across reopening the store.
    #[test]
    fn records_survive_reopen() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("catalog.redb");
        {
            let catalog = Catalog::open(&path).expect("open");
            let mut record = catalog.create("a", DatasetKind::TokensU16, 1, &mut file_ns).expect("create");
            assert!(matches!(catalog.create("a", DatasetKind::Bytes, 1, &mut file_ns), Err(CatalogError::Exists(_))));
            record.length_bytes = 10;
            record.state = DatasetState::Ingesting;
            catalog.update(&record, Some(&[1, 2, 3])).expect("update");
            catalog.create("b", DatasetKind::Bytes, 2, &mut file_ns).expect("create b");
        }
        let catalog = Catalog::open(&path).expect("reopen");
        let record = catalog.require("a").expect("a");
        assert_eq!((record.length_bytes, record.state), (10, DatasetState::Ingesting));
        assert_eq!(catalog.chunk_crcs(record.id).expect("crcs"), vec![1, 2, 3]);
        assert_eq!(catalog.list().expect("list").len(), 2);
        catalog.remove(&record).expect("remove");
        assert!(catalog.get("a").expect("get").is_none());
        assert_ne!(catalog.require("b").expect("b").id, record.id, "ids are not reused");
    }

    /// Names that would escape a directory or confuse a shell are refused.
    #[test]
    fn names_are_checked() {
        for bad in ["", ".hidden", "a/b", "../x", "sp ace", &"x".repeat(129)] {
            assert!(!valid_name(bad), "{bad:?}");
        }
        assert!(valid_name("wiki-en.v2_tokens"));
    }
}
