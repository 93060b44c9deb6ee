//! The catalog of a cluster of nodes, kept in etcd, and the nodes'
//! membership there.
//!
//! Layout under the prefix (default `/sluice`):
//!
//! | key | value |
//! | --- | --- |
//! | `datasets/NAME` | the dataset's record (JSON), shared by every node |
//! | `replicas/NODE/NAME` | that node's copy: its namespace, and whether it is complete |
//! | `crcs/ID/PAGE` | chunk checksums, 32 768 per page |
//! | `grants/ID` | access grants, valid on every node |
//! | `members/NODE` | a live node's addresses, under a lease it renews |
//! | `meta/next_dataset_id`, `meta/next_grant_id` | id counters |
//!
//! A dataset's namespace is a fact of one node, so each node reads the
//! shared record with its own replica's namespace in it; a node that holds
//! no copy sees the namespace kind `remote`.

pub use sluice_proto::api::Member;
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::catalog::{
    crcs_from_bytes, crcs_to_bytes, new_record, valid_name, CatalogError, CatalogStore, DatasetRecord, ForeignRecord,
    Listing, NamespaceKind, NamespaceRecord, DATASETS_MAX,
};
use crate::etcd::{Compare, Etcd, EtcdAccess, Op};
use crate::grants::{GrantRecord, GRANTS_MAX};
use sluice_proto::api::DatasetKind;

/// Chunk checksums per etcd value (128 KiB): an ingest rewrites only the
/// pages from the old tail on.
const CRCS_PER_PAGE: usize = 32_768;
/// Tries of an optimistic update before giving up on a contended key.
const CAS_TRIES: usize = 32;
/// Nodes one cluster lists.
pub const MEMBERS_MAX: usize = 1024;
/// Longest node id.
pub const NODE_ID_BYTES_MAX: usize = 64;

/// One node's copy of a dataset.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ReplicaRecord {
    pub node: String,
    pub dataset: String,
    pub dataset_id: u64,
    pub namespace: NamespaceRecord,
    /// Every byte is there and verified against the checksums and content
    /// hash: the node serves it.
    pub ready: bool,
    /// Bytes of the namespace the copy uses (the dataset's length): all
    /// that releasing it may discard.
    #[serde(default)]
    pub length_bytes: u64,
}

impl ReplicaRecord {
    /// Whether this copy serves `record`: complete, and of the dataset by
    /// that name now (not an earlier one deleted and made again).
    pub fn serves(&self, record: &DatasetRecord) -> bool {
        self.ready && self.dataset_id == record.id
    }
}

pub fn valid_node_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= NODE_ID_BYTES_MAX
        && id.bytes().all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
}

fn record_error(name: &str, source: serde_json::Error) -> CatalogError {
    CatalogError::Record { name: name.to_string(), source }
}

/// The catalog in etcd, as node `node` sees it.
pub struct EtcdCatalog {
    etcd: Etcd,
    prefix: String,
    node: String,
    /// The foreign records already logged, so each is said once.
    foreign_seen: Mutex<HashSet<(String, u64)>>,
}

/// A dataset record as stored, read by [`EtcdCatalog::read_record`].
enum Stored {
    Readable(Box<DatasetRecord>),
    Foreign(ForeignRecord),
}

impl EtcdCatalog {
    /// Checks that etcd answers; `prefix` keeps several clusters apart in
    /// one etcd.
    pub fn connect(endpoint: &str, prefix: &str, node: &str) -> Result<Self, CatalogError> {
        Self::connect_with(endpoint, &EtcdAccess::default(), prefix, node)
    }

    /// As [`EtcdCatalog::connect`], reaching and signing in to etcd as
    /// `access` says (TLS, client certificate, etcd user).
    pub fn connect_with(endpoint: &str, access: &EtcdAccess, prefix: &str, node: &str) -> Result<Self, CatalogError> {
        if !valid_node_id(node) {
            return Err(CatalogError::BadNodeId(node.to_string()));
        }
        let catalog = Self {
            etcd: Etcd::connect(endpoint, access)?,
            prefix: prefix.trim_end_matches('/').to_string(),
            node: node.to_string(),
            foreign_seen: Mutex::default(),
        };
        catalog.etcd.get(&catalog.key("meta/next_dataset_id"))?;
        Ok(catalog)
    }

    pub fn node(&self) -> &str {
        &self.node
    }

    fn key(&self, rest: &str) -> String {
        format!("{}/{rest}", self.prefix)
    }

    fn dataset_key(&self, name: &str) -> String {
        self.key(&format!("datasets/{name}"))
    }

    fn replica_key(&self, node: &str, name: &str) -> String {
        self.key(&format!("replicas/{node}/{name}"))
    }

    fn crcs_prefix(&self, id: u64) -> String {
        self.key(&format!("crcs/{id:016x}/"))
    }

    fn grant_key(&self, id: u64) -> String {
        self.key(&format!("grants/{id:016x}"))
    }

    /// Takes the next value of a counter (starting at 1).
    fn next_id(&self, counter: &str) -> Result<u64, CatalogError> {
        let key = self.key(counter);
        for _ in 0..CAS_TRIES {
            let current = self.etcd.get(&key)?;
            let (id, compare) = match &current {
                Some(kv) => (
                    std::str::from_utf8(&kv.value).ok().and_then(|v| v.parse::<u64>().ok()).unwrap_or(1),
                    Compare::ModRevision(key.clone(), kv.mod_revision),
                ),
                None => (1, Compare::Absent(key.clone())),
            };
            let put = Op::Put { key: key.clone(), value: (id + 1).to_string().into_bytes() };
            if self.etcd.txn(&[compare], &[put])? {
                return Ok(id);
            }
        }
        Err(CatalogError::Contended(format!("counter {counter} changed {CAS_TRIES} times while taking an id")))
    }

    fn count(&self, prefix: &str, limit: usize) -> Result<usize, CatalogError> {
        Ok(self.etcd.list(&self.key(prefix), limit + 1)?.len())
    }

    /// The record as stored: the namespace is per node, so none is in it.
    fn shared(record: &DatasetRecord) -> DatasetRecord {
        DatasetRecord { namespace: remote_namespace(), ..record.clone() }
    }

    fn decode_record(name: &str, bytes: &[u8]) -> Result<DatasetRecord, CatalogError> {
        serde_json::from_slice(bytes).map_err(|e| record_error(name, e))
    }

    /// A record of the `datasets/` listing: readable, or foreign where it
    /// is a record (a JSON object with the dataset's name and id) that
    /// does not read whole, as one a newer build wrote. Anything else is
    /// an error: a damaged record stops the listing rather than being
    /// passed over.
    fn read_record(key: &str, bytes: &[u8]) -> Result<Stored, CatalogError> {
        #[derive(Deserialize)]
        struct Head {
            name: String,
            id: u64,
        }
        match serde_json::from_slice(bytes) {
            Ok(record) => Ok(Stored::Readable(Box::new(record))),
            Err(why) => match serde_json::from_slice::<Head>(bytes) {
                Ok(head) => Ok(Stored::Foreign(ForeignRecord { name: head.name, id: head.id, why: why.to_string() })),
                Err(_) => Err(record_error(key, why)),
            },
        }
    }

    /// Every node's copies, by dataset name.
    pub fn replicas(&self) -> Result<HashMap<String, Vec<ReplicaRecord>>, CatalogError> {
        let mut out: HashMap<String, Vec<ReplicaRecord>> = HashMap::new();
        for kv in self.etcd.list(&self.key("replicas/"), DATASETS_MAX * MEMBERS_MAX)? {
            let replica: ReplicaRecord = serde_json::from_slice(&kv.value).map_err(|e| record_error(&kv.key, e))?;
            out.entry(replica.dataset.clone()).or_default().push(replica);
        }
        Ok(out)
    }

    /// This node's copies, by dataset name.
    pub fn own_replicas(&self) -> Result<HashMap<String, ReplicaRecord>, CatalogError> {
        let mut out = HashMap::new();
        for kv in self.etcd.list(&self.key(&format!("replicas/{}/", self.node)), DATASETS_MAX)? {
            let replica: ReplicaRecord = serde_json::from_slice(&kv.value).map_err(|e| record_error(&kv.key, e))?;
            out.insert(replica.dataset.clone(), replica);
        }
        Ok(out)
    }

    /// The write that records this node's copy of `record` (its namespace,
    /// whether complete).
    fn own_replica_op(&self, record: &DatasetRecord, ready: bool) -> Result<Op, CatalogError> {
        let replica = ReplicaRecord {
            node: self.node.clone(),
            dataset: record.name.clone(),
            dataset_id: record.id,
            namespace: record.namespace.clone(),
            ready,
            length_bytes: record.length_bytes,
        };
        let value = serde_json::to_vec(&replica).map_err(|e| record_error(&record.name, e))?;
        Ok(Op::Put { key: self.replica_key(&self.node, &record.name), value })
    }

    /// Records this node's copy of `record`: the namespace it allocated and
    /// whether the copy is complete.
    pub fn put_replica(&self, record: &DatasetRecord, ready: bool) -> Result<(), CatalogError> {
        self.etcd.txn(&[], &[self.own_replica_op(record, ready)?])?;
        Ok(())
    }

    /// Forgets this node's copy of `name`.
    pub fn remove_replica(&self, name: &str) -> Result<(), CatalogError> {
        self.etcd.delete(&self.replica_key(&self.node, name))?;
        Ok(())
    }

    /// The nodes alive now (their lease is renewed).
    pub fn members(&self) -> Result<Vec<Member>, CatalogError> {
        self.etcd
            .list(&self.key("members/"), MEMBERS_MAX)?
            .into_iter()
            .map(|kv| serde_json::from_slice(&kv.value).map_err(|e| record_error(&kv.key, e)))
            .collect()
    }

    /// Announces `member` under a lease of `ttl` and renews it from a
    /// thread until the returned [`Membership`] drops; a lease that expired
    /// anyway (etcd unreachable longer than `ttl`) is replaced.
    pub fn join(&self, member: Member, ttl: Duration) -> Result<Membership, CatalogError> {
        debug_assert_eq!(member.node, self.node);
        let key = self.key(&format!("members/{}", member.node));
        let value = serde_json::to_vec(&member).map_err(|e| record_error(&member.node, e))?;
        let lease = self.etcd.grant_lease(ttl)?;
        self.etcd.put(&key, &value, Some(lease))?;
        let stop = Arc::new(AtomicBool::new(false));
        let etcd = self.etcd.clone();
        let thread_stop = Arc::clone(&stop);
        let renew = std::thread::Builder::new()
            .name("sluice-membership".into())
            .spawn(move || {
                let mut lease = lease;
                let period = ttl / 3;
                while !thread_stop.load(Ordering::Relaxed) {
                    std::thread::sleep(period);
                    match etcd.keep_alive(lease) {
                        Ok(true) => {}
                        Ok(false) => {
                            tracing::warn!("membership lease expired; joining again");
                            let joined =
                                etcd.grant_lease(ttl).and_then(|l| etcd.put(&key, &value, Some(l)).map(|()| l));
                            match joined {
                                Ok(new_lease) => lease = new_lease,
                                Err(err) => tracing::warn!("rejoining the cluster: {err}"),
                            }
                        }
                        Err(err) => tracing::warn!("renewing the membership lease: {err}"),
                    }
                }
                if let Err(err) = etcd.revoke_lease(lease) {
                    tracing::warn!("leaving the cluster: {err}");
                }
            })
            .map_err(|e| CatalogError::Contended(format!("starting the membership thread: {e}")))?;
        Ok(Membership { stop, renew: Some(renew) })
    }
}

/// The namespace of a dataset this node holds no copy of.
pub fn remote_namespace() -> NamespaceRecord {
    NamespaceRecord::new(NamespaceKind::Remote, "", "held by other nodes of the cluster")
}

/// This node's membership; leaves the cluster (revokes the lease) on drop.
pub struct Membership {
    stop: Arc<AtomicBool>,
    renew: Option<std::thread::JoinHandle<()>>,
}

impl Drop for Membership {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(renew) = self.renew.take() {
            let _ = renew.join();
        }
    }
}

impl CatalogStore for EtcdCatalog {
    fn identity(&self) -> Result<Option<String>, CatalogError> {
        let kv = self.etcd.get(&self.key("meta/catalog_id"))?;
        Ok(kv.map(|kv| String::from_utf8_lossy(&kv.value).into_owned()))
    }

    fn claim_identity(&self, id: &str) -> Result<String, CatalogError> {
        let key = self.key("meta/catalog_id");
        // Create-only: of nodes starting at once, one identity wins.
        let ops = [Op::Put { key: key.clone(), value: id.as_bytes().to_vec() }];
        self.etcd.txn(&[Compare::Absent(key)], &ops)?;
        self.identity()?.ok_or_else(|| {
            CatalogError::Cluster(crate::etcd::EtcdError::Answer {
                endpoint: self.etcd.endpoint().to_string(),
                message: "the catalog identity vanished right after it was written".into(),
            })
        })
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
        let key = self.dataset_key(name);
        if self.etcd.get(&key)?.is_some() {
            return Err(CatalogError::Exists(name.to_string()));
        }
        if self.count("datasets/", DATASETS_MAX)? >= DATASETS_MAX {
            return Err(CatalogError::Full);
        }
        let id = self.next_id("meta/next_dataset_id")?;
        let record = new_record(id, name, kind, now_unix_ms, namespace(id));
        let ops = [
            Op::Put {
                key: key.clone(),
                value: serde_json::to_vec(&Self::shared(&record)).map_err(|e| record_error(name, e))?,
            },
            self.own_replica_op(&record, false)?,
        ];
        if !self.etcd.txn(&[Compare::Absent(key)], &ops)? {
            // Another node created it between the check and now; the
            // namespace just allocated is released as an orphan.
            return Err(CatalogError::Exists(name.to_string()));
        }
        Ok(record)
    }

    fn get(&self, name: &str) -> Result<Option<DatasetRecord>, CatalogError> {
        let Some(kv) = self.etcd.get(&self.dataset_key(name))? else { return Ok(None) };
        let mut record = Self::decode_record(name, &kv.value)?;
        if let Some(own) = self.etcd.get(&self.replica_key(&self.node, name))? {
            let replica: ReplicaRecord = serde_json::from_slice(&own.value).map_err(|e| record_error(name, e))?;
            if replica.dataset_id == record.id {
                record.namespace = replica.namespace;
            }
        }
        Ok(Some(record))
    }

    fn list(&self) -> Result<Vec<DatasetRecord>, CatalogError> {
        Ok(self.listing()?.readable)
    }

    fn listing(&self) -> Result<Listing, CatalogError> {
        let own = self.own_replicas()?;
        let mut listing = Listing::default();
        for kv in self.etcd.list(&self.key("datasets/"), DATASETS_MAX)? {
            let mut record = match Self::read_record(&kv.key, &kv.value)? {
                Stored::Readable(record) => *record,
                Stored::Foreign(foreign) => {
                    let mut seen = self.foreign_seen.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
                    if seen.insert((foreign.name.clone(), foreign.id)) {
                        tracing::warn!(
                            dataset = foreign.name,
                            id = foreign.id,
                            "passing over a dataset this build cannot read (written by a newer one?): {}",
                            foreign.why
                        );
                    }
                    listing.foreign.push(foreign);
                    continue;
                }
            };
            if let Some(replica) = own.get(&record.name).filter(|r| r.dataset_id == record.id) {
                record.namespace = replica.namespace.clone();
            }
            listing.readable.push(record);
        }
        Ok(listing)
    }

    fn update(&self, record: &DatasetRecord, chunk_crcs: Option<&[u32]>) -> Result<(), CatalogError> {
        let key = self.dataset_key(&record.name);
        let Some(old) = self.etcd.get(&key)? else { return Err(CatalogError::Unknown(record.name.clone())) };
        let previous = Self::decode_record(&record.name, &old.value)?;
        let mut ops = vec![Op::Put {
            key: key.clone(),
            value: serde_json::to_vec(&Self::shared(record)).map_err(|e| record_error(&record.name, e))?,
        }];
        if record.namespace.kind != NamespaceKind::Remote {
            ops.push(self.own_replica_op(record, record.state == crate::catalog::DatasetState::Sealed)?);
        }
        if let Some(crcs) = chunk_crcs {
            // Appends change only the old tail chunk's checksum and those
            // after it: rewrite the pages from there.
            let first_page = (previous.length_bytes / previous.chunk_size_bytes.max(1)) as usize / CRCS_PER_PAGE;
            for (page, piece) in crcs.chunks(CRCS_PER_PAGE).enumerate().skip(first_page) {
                ops.push(Op::Put {
                    key: format!("{}{page:08x}", self.crcs_prefix(record.id)),
                    value: crcs_to_bytes(piece),
                });
            }
        }
        if self.etcd.txn(&[Compare::ModRevision(key, old.mod_revision)], &ops)? {
            Ok(())
        } else {
            Err(CatalogError::Contended(format!("{} changed on another node during this update", record.name)))
        }
    }

    fn chunk_crcs(&self, id: u64) -> Result<Vec<u32>, CatalogError> {
        let pages = self.etcd.list(&self.crcs_prefix(id), usize::MAX >> 1)?;
        Ok(pages.iter().flat_map(|kv| crcs_from_bytes(&kv.value)).collect())
    }

    fn remove(&self, record: &DatasetRecord) -> Result<(), CatalogError> {
        let ops = [
            Op::Delete(self.dataset_key(&record.name)),
            Op::Delete(self.replica_key(&self.node, &record.name)),
            Op::DeletePrefix(self.crcs_prefix(record.id)),
        ];
        self.etcd.txn(&[], &ops)?;
        Ok(())
    }

    fn add_grant(&self, make: &mut dyn FnMut(u64) -> GrantRecord) -> Result<GrantRecord, CatalogError> {
        if self.count("grants/", GRANTS_MAX)? >= GRANTS_MAX {
            return Err(CatalogError::GrantsFull);
        }
        let id = self.next_id("meta/next_grant_id")?;
        let grant = make(id);
        debug_assert_eq!(grant.id, id);
        let value = serde_json::to_vec(&grant).map_err(|source| CatalogError::GrantRecord { id, source })?;
        self.etcd.put(&self.grant_key(id), &value, None)?;
        Ok(grant)
    }

    fn remove_grant(&self, id: u64) -> Result<bool, CatalogError> {
        Ok(self.etcd.delete(&self.grant_key(id))?)
    }

    fn grants(&self) -> Result<Vec<GrantRecord>, CatalogError> {
        self.etcd
            .list(&self.key("grants/"), GRANTS_MAX)?
            .into_iter()
            .map(|kv| {
                let id = u64::from_str_radix(kv.key.rsplit('/').next().unwrap_or(""), 16).unwrap_or(0);
                serde_json::from_slice(&kv.value).map_err(|source| CatalogError::GrantRecord { id, source })
            })
            .collect()
    }

    fn describe(&self) -> String {
        format!("etcd {} under {} as node {}", self.etcd.endpoint(), self.prefix, self.node)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A record that reads whole is readable; one with its name and id
    /// but a kind this build does not know is foreign; anything else (not
    /// a record at all, or one without its name and id) is an error that
    /// stops the listing.
    #[test]
    fn a_record_reads_as_readable_foreign_or_damaged() {
        let record = new_record(3, "a", DatasetKind::Bytes, 1, remote_namespace());
        let bytes = serde_json::to_vec(&record).expect("json");
        assert!(matches!(EtcdCatalog::read_record("k", &bytes), Ok(Stored::Readable(r)) if *r == record));
        let newer = String::from_utf8(bytes).expect("utf-8").replace(r#""kind":"bytes""#, r#""kind":"parquet""#);
        let Ok(Stored::Foreign(foreign)) = EtcdCatalog::read_record("k", newer.as_bytes()) else {
            panic!("a record of a kind this build does not know is foreign")
        };
        assert_eq!((foreign.name.as_str(), foreign.id), ("a", 3));
        assert!(foreign.why.contains("parquet"), "{}", foreign.why);
        for damaged in [&b"{\"name\":\"a\""[..], b"not json", br#"{"kind":"parquet"}"#] {
            assert!(EtcdCatalog::read_record("k", damaged).is_err(), "{}", String::from_utf8_lossy(damaged));
        }
    }
}
