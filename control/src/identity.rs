//! Which catalog a data directory belongs to, so a node never acts on a
//! catalog that does not describe its data.
//!
//! At first start a node writes the catalog's identity (a random id the
//! catalog keeps, claimed once) into `DATA_DIR/identity`, with its node id.
//! At every start the two must agree. A data directory beside a catalog
//! that is new or another's (a `catalog.redb` moved aside or restored
//! from elsewhere, a typo in `--etcd-prefix`, another cluster) is refused
//! with what differs, before anything is touched: reconciling it would
//! take every file as an orphan. `--adopt` takes the catalog as the truth;
//! files no record owns are then quarantined in `DATA_DIR/orphans/`, never
//! deleted, until an operator purges them (Ceph's OSD superblock and DAOS's
//! pool UUIDs guard their data the same way).

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::catalog::{CatalogError, CatalogStore};

/// The identity file in a data directory.
pub const IDENTITY_FILE: &str = "identity";

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DataDirIdentity {
    /// The catalog this directory's data belongs to.
    pub catalog_id: String,
    /// The node id it was served as (in a cluster).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_id: Option<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum IdentityError {
    #[error(transparent)]
    Catalog(#[from] CatalogError),
    #[error("{path}: {message}")]
    File { path: String, message: String },
    #[error(
        "the data directory {dir} belongs to catalog {dir_catalog}, but {catalog_desc} {found}; refusing to start \
         so nothing in it is taken for an orphan. Give the node the catalog it was using (check --data-dir, \
         catalog.redb, --etcd and --etcd-prefix), or start once with --adopt to take this catalog as the truth \
         (files it does not list are then moved to {dir}/orphans/, never deleted)"
    )]
    Mismatch { dir: String, dir_catalog: String, catalog_desc: String, found: String },
    #[error(
        "the data directory {dir} was served as node {dir_node}, but this node is {node}; refusing to start \
         (another node's copies would be taken for this one's). Use --node-id {dir_node}, or --adopt"
    )]
    NodeMismatch { dir: String, dir_node: String, node: String },
}

fn path_of(data_dir: &Path) -> PathBuf {
    data_dir.join(IDENTITY_FILE)
}

fn read(data_dir: &Path) -> Result<Option<DataDirIdentity>, IdentityError> {
    let path = path_of(data_dir);
    let file_error = |message: String| IdentityError::File { path: path.display().to_string(), message };
    match std::fs::read(&path) {
        Ok(bytes) => serde_json::from_slice(&bytes).map(Some).map_err(|e| file_error(e.to_string())),
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(err) => Err(file_error(err.to_string())),
    }
}

fn write(data_dir: &Path, identity: &DataDirIdentity) -> Result<(), IdentityError> {
    let path = path_of(data_dir);
    let file_error = |message: String| IdentityError::File { path: path.display().to_string(), message };
    let partial = path.with_extension("partial");
    let bytes = serde_json::to_vec_pretty(identity).map_err(|e| file_error(e.to_string()))?;
    std::fs::write(&partial, bytes).map_err(|e| file_error(e.to_string()))?;
    std::fs::File::open(&partial).and_then(|f| f.sync_all()).map_err(|e| file_error(e.to_string()))?;
    std::fs::rename(&partial, &path).map_err(|e| file_error(e.to_string()))?;
    std::fs::File::open(data_dir).and_then(|d| d.sync_all()).map_err(|e| file_error(e.to_string()))
}

/// Checks that `data_dir` belongs to `catalog` (and was this `node_id`),
/// writing the identity at first start. With `adopt`, the catalog is taken
/// as the truth. A data directory written before identities existed (no
/// file) takes the catalog's identity, as at first start.
pub fn reconcile(
    data_dir: &Path,
    catalog: &dyn CatalogStore,
    node_id: Option<&str>,
    adopt: bool,
) -> Result<(), IdentityError> {
    let dir = read(data_dir)?;
    let found = catalog.identity()?;
    let mismatch = |dir_catalog: &str, found: &str| IdentityError::Mismatch {
        dir: data_dir.display().to_string(),
        dir_catalog: dir_catalog.to_string(),
        catalog_desc: catalog.describe(),
        found: found.to_string(),
    };
    match (&dir, &found) {
        (Some(dir), None) if !adopt => return Err(mismatch(&dir.catalog_id, "has no identity (a new, empty catalog)")),
        (Some(dir), Some(found)) if !adopt && dir.catalog_id != *found => {
            return Err(mismatch(&dir.catalog_id, &format!("is catalog {found}")))
        }
        _ => {}
    }
    if let (Some(dir), Some(node)) = (&dir, node_id) {
        match &dir.node_id {
            Some(dir_node) if dir_node != node && !adopt => {
                return Err(IdentityError::NodeMismatch {
                    dir: data_dir.display().to_string(),
                    dir_node: dir_node.clone(),
                    node: node.to_string(),
                })
            }
            _ => {}
        }
    }
    let catalog_id = match found {
        Some(found) => found,
        None => catalog.claim_identity(&crate::hex::random::<16>())?,
    };
    let wanted = DataDirIdentity { catalog_id, node_id: node_id.map(str::to_string) };
    if dir.as_ref() != Some(&wanted) {
        if adopt && dir.is_some() {
            tracing::warn!(
                "--adopt: the data directory {} now belongs to catalog {}; files it does not list go to orphans/",
                data_dir.display(),
                wanted.catalog_id
            );
        }
        write(data_dir, &wanted)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::catalog::Catalog;

    /// First start writes the identity; the same catalog passes; a new
    /// catalog is refused unless adopted; another node id is refused.
    #[test]
    fn a_data_directory_keeps_to_its_catalog() {
        let dir = tempfile::tempdir().expect("tempdir");
        let first = Catalog::open(&dir.path().join("one.redb")).expect("catalog");
        reconcile(dir.path(), &first, None, false).expect("first start");
        reconcile(dir.path(), &first, None, false).expect("same catalog");
        let id = read(dir.path()).expect("read").expect("written").catalog_id;
        assert_eq!(first.identity().expect("identity"), Some(id.clone()));

        let second = Catalog::open(&dir.path().join("two.redb")).expect("catalog");
        let refused = reconcile(dir.path(), &second, None, false).expect_err("a new catalog");
        assert!(refused.to_string().contains("--adopt") && refused.to_string().contains(&id), "{refused}");
        assert_eq!(second.identity().expect("identity"), None, "a refusal claims nothing");
        reconcile(dir.path(), &second, None, true).expect("adopted");
        assert_eq!(read(dir.path()).expect("read").map(|i| i.catalog_id), second.identity().expect("identity"));
        assert!(reconcile(dir.path(), &first, None, false).is_err(), "now the first is the stranger");

        reconcile(dir.path(), &second, Some("n1"), false).expect("node id recorded");
        let refused = reconcile(dir.path(), &second, Some("n2"), false).expect_err("another node id");
        assert!(refused.to_string().contains("--node-id n1"), "{refused}");
    }
}
