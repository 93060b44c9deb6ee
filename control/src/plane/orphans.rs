//! Finishing what a crash left half done at start, and the quarantine of
//! files no record owns (listed, purged only on an operator's word).

use super::*;
use crate::catalog::{ForeignRecord, Listing};

impl ControlPlane {
    pub(super) fn recover(&self) -> Result<(), ControlError> {
        let Listing { readable: records, foreign } = self.catalog.listing()?;
        let mut known = HashSet::new();
        for record in &records {
            match record.state {
                DatasetState::Deleting => {
                    tracing::info!("finishing the interrupted delete of {}", record.name);
                    self.remove_namespace(record);
                    self.catalog.remove(record)?;
                    continue;
                }
                DatasetState::Ingesting | DatasetState::Creating if record.namespace.kind == NamespaceKind::File => {
                    // Bytes past the committed length belong to an ingest
                    // that never finished.
                    let ns = self.allocated_namespace(record)?;
                    ns.truncate(record.namespace.base_offset_bytes + record.length_bytes)
                        .map_err(|e| self.ns_error(record, e))?;
                }
                _ => {}
            }
            if record.kind.has_records() && record.record_size_bytes.is_none() {
                // Index entries past the committed count belong to an ingest
                // that never finished.
                self.index_file(record)?.truncate(record.record_count).map_err(|e| self.ns_error(record, e))?;
            }
            // As the directory is named now: a record written while it had
            // another name (a symlink, a relative path) still owns its file.
            let namespace = PathBuf::from(&record.namespace.path);
            known.insert(std::fs::canonicalize(&namespace).unwrap_or(namespace));
            known.insert(self.index_path(record));
            known.insert(self.checksums.path(record.id));
            let (present, crcs) = crate::source::cache::cache_paths(&self.data_dir, record.id);
            known.extend([present, crcs]);
        }
        known.extend(self.files_of_foreign_datasets(foreign)?);
        let cache_dir = self.data_dir.join("cache");
        for dir in [
            &self.storage.namespace_dir().to_path_buf(),
            &self.index_dir,
            &self.checksums.dir().to_path_buf(),
            &cache_dir,
        ] {
            for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
                let path = entry.path();
                // Under the canonical data directory, already canonical.
                if !known.contains(&path) {
                    self.quarantine(&path)?;
                }
            }
        }
        Ok(())
    }

    /// The files of this node's copies of datasets this build cannot read
    /// (foreign, [`CatalogStore::listing`]): a node that ran a newer build
    /// holds them, and they are still that dataset's, not orphans.
    fn files_of_foreign_datasets(&self, foreign: Vec<ForeignRecord>) -> Result<Vec<PathBuf>, ControlError> {
        let Some(cluster) = self.cluster.etcd().filter(|_| !foreign.is_empty()) else { return Ok(Vec::new()) };
        let own = cluster.own_replicas()?;
        let mut files = Vec::new();
        for dataset in foreign {
            let (present, crcs) = crate::source::cache::cache_paths(&self.data_dir, dataset.id);
            files.extend([self.index_path_of(dataset.id), self.checksums.path(dataset.id), present, crcs]);
            if let Some(copy) = own.get(&dataset.name).filter(|copy| copy.dataset_id == dataset.id) {
                let namespace = PathBuf::from(&copy.namespace.path);
                files.push(std::fs::canonicalize(&namespace).unwrap_or(namespace));
            }
        }
        Ok(files)
    }

    /// Moves a file no record owns into `orphans/`, under a name that says
    /// where it was; never deletes it.
    pub(super) fn quarantine(&self, path: &Path) -> Result<(), ControlError> {
        let failed =
            |e: std::io::Error| ControlError::Namespace { name: path.display().to_string(), message: e.to_string() };
        std::fs::create_dir_all(&self.orphan_dir).map_err(failed)?;
        let from =
            path.parent().and_then(|p| p.file_name()).map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        let mut target = self.orphan_dir.join(format!("{from}-{name}"));
        let mut n = 1;
        while target.exists() {
            target = self.orphan_dir.join(format!("{from}-{name}.{n}"));
            n += 1;
        }
        std::fs::rename(path, &target).map_err(failed)?;
        tracing::warn!(
            "quarantined {} as {}: no record owns it (`sluicectl orphans purge` deletes quarantined files)",
            path.display(),
            target.display()
        );
        Ok(())
    }

    /// The files quarantined in `orphans/`: (path, bytes).
    pub fn orphans(&self) -> Vec<(String, u64)> {
        let mut files: Vec<(String, u64)> = std::fs::read_dir(&self.orphan_dir)
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| Some((e.path().display().to_string(), e.metadata().ok()?.len())))
            .collect();
        files.sort();
        files
    }

    /// Deletes every quarantined file, on an operator's word: (files, bytes).
    pub fn purge_orphans(&self) -> Result<(u64, u64), ControlError> {
        let (mut files, mut bytes) = (0, 0);
        for (path, len) in self.orphans() {
            std::fs::remove_file(&path)
                .map_err(|e| ControlError::Namespace { name: path.clone(), message: e.to_string() })?;
            tracing::warn!("purged quarantined file {path} ({len} bytes)");
            files += 1;
            bytes += len;
        }
        Ok((files, bytes))
    }
}
