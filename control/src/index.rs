//! The sample index of `records`, `wds` and `mds` datasets
//! ([`sluice_proto::sample_index`] is its format), in a file beside the catalog.
//! Entries are appended (and fsynced) before the catalog commits the count
//! that makes them visible; entries past that count are cut at start.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::Path;

use sluice_proto::sample_index::encode;
pub use sluice_proto::sample_index::ENTRY_BYTES;

pub struct IndexFile {
    file: File,
}

impl IndexFile {
    pub fn open(path: &Path) -> io::Result<Self> {
        let file = OpenOptions::new().read(true).write(true).create(true).truncate(false).open(path)?;
        Ok(Self { file })
    }

    /// Writes `entries` after the first `committed` and makes them durable.
    pub fn append(&self, committed: u64, entries: &[(u64, u64)]) -> io::Result<()> {
        let bytes = encode(entries);
        self.file.write_all_at(&bytes, committed * ENTRY_BYTES)?;
        self.file.set_len((committed + entries.len() as u64) * ENTRY_BYTES)?;
        self.file.sync_all()
    }

    /// Keeps the first `count` entries.
    pub fn truncate(&self, count: u64) -> io::Result<()> {
        self.file.set_len(count * ENTRY_BYTES)?;
        self.file.sync_all()
    }

    /// `count` entries from entry `first` as raw bytes.
    pub fn read_raw_range(&self, first: u64, count: u64) -> io::Result<Vec<u8>> {
        let mut bytes = vec![0u8; (count * ENTRY_BYTES) as usize];
        self.file.read_exact_at(&mut bytes, first * ENTRY_BYTES)?;
        Ok(bytes)
    }
}
