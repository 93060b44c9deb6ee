//! A dataset's life: create, ingest (with its record index), seal, delete.

use super::*;
use crate::ingest::first_mds_columns;
use sluice_proto::mds::MdsIndexer;

/// A dataset's sample index, to read a piece at a time.
pub enum IndexSource {
    /// Fixed-size records: the entries follow from the size.
    Fixed {
        size: u64,
        count: u64,
    },
    File {
        file: IndexFile,
        count: u64,
    },
}

impl IndexSource {
    pub fn entries(&self) -> u64 {
        match self {
            Self::Fixed { count, .. } | Self::File { count, .. } => *count,
        }
    }

    /// `count` entries from entry `first`, as raw bytes.
    pub fn read(&self, first: u64, count: u64) -> std::io::Result<Vec<u8>> {
        match self {
            Self::Fixed { size, .. } => Ok((first..first + count)
                .flat_map(|i| (i * size).to_le_bytes().into_iter().chain(size.to_le_bytes()))
                .collect()),
            Self::File { file, .. } => file.read_raw_range(first, count),
        }
    }
}

/// One file being appended; commits only through [`IngestSession::finish`].
pub struct IngestSession<'a> {
    control: &'a ControlPlane,
    _guard: BusyGuard<'a>,
    record: DatasetRecord,
    appender: Appender,
}

impl IngestSession<'_> {
    pub fn push(&mut self, bytes: &[u8]) -> Result<(), ControlError> {
        Ok(self.appender.push(bytes)?)
    }

    /// Checks the file arrived whole, makes it durable, then commits the new
    /// length and checksums in one catalog transaction.
    pub fn finish(self) -> Result<Appended, ControlError> {
        let finished = self.appender.finish()?;
        let mut record = self.record;
        if !finished.index_entries.is_empty() {
            let file = self.control.index_file(&record)?;
            file.append(record.record_count, &finished.index_entries).map_err(|e| self.control.ns_error(&record, e))?;
        }
        record.length_bytes = finished.appended.length_bytes;
        record.record_count += finished.appended.records;
        record.files_ingested += 1;
        record.state = DatasetState::Ingesting;
        self.control.catalog.update(&record, Some(&finished.chunk_crcs))?;
        Ok(finished.appended)
    }
}

impl ControlPlane {
    pub(super) fn index_path(&self, record: &DatasetRecord) -> PathBuf {
        self.index_path_of(record.id)
    }

    pub(super) fn index_path_of(&self, dataset_id: u64) -> PathBuf {
        self.index_dir.join(format!("{dataset_id:016x}.idx"))
    }

    pub(super) fn index_file(&self, record: &DatasetRecord) -> Result<IndexFile, ControlError> {
        IndexFile::open(&self.index_path(record)).map_err(|e| self.ns_error(record, e))
    }

    /// Where a `records`, `wds` or `mds` dataset's sample index is read from, a
    /// piece at a time.
    pub fn record_index_source(&self, name: &str) -> Result<IndexSource, ControlError> {
        let record = self.catalog.require(name)?;
        if !record.kind.has_records() {
            return Err(ControlError::Records(format!("{name} is {}, which has no record index", record.kind)));
        }
        Ok(match record.record_size_bytes {
            Some(size) => IndexSource::Fixed { size, count: record.record_count },
            None => IndexSource::File { file: self.index_file(&record)?, count: record.record_count },
        })
    }

    /// Holds the offsets (`n + 1` u64, from 0 to the file's length) of the
    /// next `records` file ingested into `name`.
    pub fn stage_offsets(&self, name: &str, bytes: &[u8], format: IngestFormat) -> Result<u64, ControlError> {
        let record = self.catalog.require(name)?;
        if record.kind != DatasetKind::Records || record.record_size_bytes.is_some() {
            return Err(ControlError::Records(format!(
                "{name} takes no offsets index (kind {}, fixed size {:?})",
                record.kind, record.record_size_bytes
            )));
        }
        let offsets = parse_offsets(bytes, format)?;
        let count = offsets.len() as u64 - 1;
        self.staged_offsets.lock().map_err(|_| ControlError::Busy(name.into()))?.insert(name.to_string(), offsets);
        Ok(count)
    }

    pub(super) fn record_rule(
        &self,
        record: &DatasetRecord,
        namespace: &dyn Namespace,
    ) -> Result<RecordRule, ControlError> {
        Ok(match (record.kind, record.record_size_bytes) {
            (DatasetKind::Records, Some(size)) => RecordRule::Fixed(size),
            (DatasetKind::Records, None) => {
                let staged = self
                    .staged_offsets
                    .lock()
                    .map_err(|_| ControlError::Busy(record.name.clone()))?
                    .remove(&record.name);
                RecordRule::Offsets(staged.ok_or_else(|| {
                    ControlError::Records(format!(
                        "{} is a records dataset: send its offsets first (sluicectl dataset ingest {} FILE --index OFFSETS)",
                        record.name, record.name
                    ))
                })?)
            }
            (DatasetKind::Wds, _) => RecordRule::Tar(Box::default()),
            (DatasetKind::Mds, _) => {
                let base = record.namespace.base_offset_bytes;
                let first = first_mds_columns(namespace, base, record.length_bytes)?;
                RecordRule::Mds(Box::new(MdsIndexer::new(first)))
            }
            _ => RecordRule::None,
        })
    }

    pub fn create(&self, name: &str, kind: DatasetKind) -> Result<DatasetRecord, ControlError> {
        self.create_with(name, kind, None, None)
    }

    /// Creates a dataset; `record_size` makes a `records` dataset of fixed
    /// size records (no index needed); `size_hint` (the bytes it will hold)
    /// makes placement take only a namespace that holds them.
    pub fn create_with(
        &self,
        name: &str,
        kind: DatasetKind,
        record_size: Option<u64>,
        size_hint: Option<u64>,
    ) -> Result<DatasetRecord, ControlError> {
        if record_size.is_some() && kind != DatasetKind::Records {
            return Err(ControlError::Records("--record-size applies to records datasets only".into()));
        }
        if record_size == Some(0) {
            return Err(ControlError::Records("record size must be at least 1 byte".into()));
        }
        let allocating = self.storage.allocating(name)?;
        let mut record =
            self.catalog.create(name, kind, now_unix_ms(), &mut |id| self.allocate_namespace(id, size_hint))?;
        drop(allocating);
        if record.namespace.kind == NamespaceKind::Unplaced {
            self.catalog.remove(&record)?;
            return Err(ControlError::Namespace { name: name.into(), message: record.namespace.reason });
        }
        let placement = self.place_replicas();
        if record_size.is_some() || !placement.is_empty() {
            record.record_size_bytes = record_size;
            record.placement = placement;
            self.catalog.update(&record, None)?;
        }
        self.allocated_namespace(&record)?;
        Ok(record)
    }

    pub fn get(&self, name: &str) -> Result<DatasetRecord, ControlError> {
        Ok(self.catalog.require(name)?)
    }

    pub fn list(&self) -> Result<Vec<DatasetRecord>, ControlError> {
        Ok(self.catalog.list()?)
    }

    pub fn chunk_crcs(&self, name: &str) -> Result<Vec<u32>, ControlError> {
        let record = self.catalog.require(name)?;
        if record.source.is_some() && record.content_hash.is_none() {
            return Err(ControlError::Source(format!(
                "{name} is source-backed and not yet warm: its chunk checksums are known once `sluicectl dataset warm {name}` finishes"
            )));
        }
        Ok(self.catalog.chunk_crcs(record.id)?)
    }

    /// Starts appending one file to `name`.
    pub fn begin_ingest(&self, name: &str, format: IngestFormat) -> Result<IngestSession<'_>, ControlError> {
        let guard = self.busy(name)?;
        let record = self.catalog.require(name)?;
        if record.namespace.kind == NamespaceKind::Remote {
            return Err(ControlError::Cluster(format!(
                "{name} was created on node {}: ingest it there",
                record.placement.first().map(String::as_str).unwrap_or("another node")
            )));
        }
        if !matches!(record.state, DatasetState::Creating | DatasetState::Ingesting) {
            return Err(ControlError::State {
                name: name.into(),
                state: record.state,
                action: "ingest",
                needed: "creating or ingesting",
            });
        }
        let crcs = self.catalog.chunk_crcs(record.id)?;
        let ns = self.namespace(&record)?;
        let rule = self.record_rule(&record, ns.as_ref())?;
        let appender =
            Appender::new(ns, record.kind, format, record.namespace.base_offset_bytes, record.length_bytes, crcs, rule);
        Ok(IngestSession { control: self, _guard: guard, record, appender })
    }

    /// Verifies every chunk against the checksums taken at ingest, hashes the
    /// content and makes the dataset immutable. Blocking: reads it all.
    pub fn seal(&self, name: &str) -> Result<DatasetRecord, ControlError> {
        let _guard = self.busy(name)?;
        let mut record = self.catalog.require(name)?;
        match record.state {
            DatasetState::Sealed => return Ok(record),
            DatasetState::Ingesting if record.kind.has_records() && record.record_count == 0 => {
                return Err(ControlError::Empty(name.into()))
            }
            DatasetState::Ingesting => {}
            DatasetState::Creating => return Err(ControlError::Empty(name.into())),
            state => return Err(ControlError::State { name: name.into(), state, action: "seal", needed: "ingesting" }),
        }
        let crcs = self.catalog.chunk_crcs(record.id)?;
        let ns = self.namespace(&record)?;
        let mut hasher = blake3::Hasher::new();
        let mut block_crcs = Vec::with_capacity(sluice_dataplane::blocks::block_count(record.length_bytes) as usize);
        let mut buf = vec![0u8; SEAL_READ_BYTES];
        let mut at = 0u64;
        while at < record.length_bytes {
            let len = (record.length_bytes - at).min(SEAL_READ_BYTES as u64) as usize;
            let piece = &mut buf[..len];
            ns.read_at(record.namespace.base_offset_bytes + at, piece).map_err(|e| self.ns_error(&record, e))?;
            for (i, chunk) in piece.chunks(CHUNK_SIZE_BYTES as usize).enumerate() {
                let index = at / CHUNK_SIZE_BYTES + i as u64;
                let crc = sluice_dataplane::blocks::chunk_crc_and_blocks(chunk, &mut block_crcs);
                if crcs.get(index as usize) != Some(&crc) {
                    return Err(ControlError::Corrupt { name: name.into(), chunk: index });
                }
            }
            hasher.update(piece);
            at += len as u64;
        }
        ns.truncate(record.namespace.base_offset_bytes + record.length_bytes)
            .and_then(|()| ns.sync())
            .map_err(|e| self.ns_error(&record, e))?;
        // The block checksums every read is verified by, durable before
        // the dataset is readable.
        self.checksums.write(record.id, &block_crcs).map_err(|e| self.ns_error(&record, e))?;
        record.state = DatasetState::Sealed;
        record.content_hash = Some(format!("blake3:{}", hasher.finalize().to_hex()));
        record.sealed_unix_ms = Some(now_unix_ms());
        self.catalog.update(&record, None)?;
        Ok(record)
    }

    /// Removes a dataset: new opens fail at once, open handles fail their
    /// next batch, and its namespace is released.
    pub async fn delete(&self, name: &str) -> Result<(), ControlError> {
        let _guard = self.busy(name)?;
        let mut record = self.catalog.require(name)?;
        // Its grants go first, which also closes the sessions reading it.
        for id in self.access.grants_of(record.id) {
            match self.revoke_grant(id) {
                // Revoked on another node since this one last looked.
                Ok(()) | Err(ControlError::UnknownGrant(_)) => {}
                Err(err) => return Err(err),
            }
        }
        record.state = DatasetState::Deleting;
        self.catalog.update(&record, None)?;
        self.serving.detach(name).await;
        // No fill or eviction writes the namespace once it is given back.
        self.forget_cache(&record);
        self.remove_namespace(&record);
        self.catalog.remove(&record)?;
        self.serving.forget(name);
        Ok(())
    }
}

/// A records dataset's offsets (`n + 1` little-endian u64s, raw or as a
/// `.npy` of `<u8`/`<i8`), checked to be a list of u64; the caller checks
/// them against the data.
pub(super) fn parse_offsets(bytes: &[u8], format: IngestFormat) -> Result<Vec<u64>, ControlError> {
    let data = match format {
        IngestFormat::Raw => bytes,
        IngestFormat::Npy => {
            let header = sluice_proto::npy::parse_header(bytes).map_err(|e| ControlError::Records(e.to_string()))?;
            if !matches!(header.descr.as_str(), "<u8" | "<i8") {
                return Err(ControlError::Records(format!("offsets must be <u8 or <i8, not {}", header.descr)));
            }
            let data = &bytes[header.data_offset_bytes..];
            if Some(data.len() as u64) != header.data_len_bytes() {
                return Err(ControlError::Records("truncated offsets .npy".into()));
            }
            data
        }
    };
    if data.len() % 8 != 0 || data.len() < 8 {
        return Err(ControlError::Records(format!("{} bytes of offsets is not a list of u64", data.len())));
    }
    let offsets: Vec<u64> = data.chunks_exact(8).map(|c| u64::from_le_bytes(c.try_into().unwrap_or([0; 8]))).collect();
    Ok(offsets)
}
