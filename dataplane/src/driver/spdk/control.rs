//! A namespace's control path (ingest, seal, copies, scrub): one queue pair
//! of its own and a bounce buffer, used one call at a time, for byte ranges
//! of any alignment over whole sectors underneath.

use std::ffi::c_void;
use std::io;
use std::sync::{Arc, Mutex, MutexGuard};

use super::controller::SpdkDriver;
use super::env::{DmaBuffer, Waiter};
use super::{sys, Direction, Sectors};
use crate::driver::{DriverError, IoTarget, Namespace, NamespaceGeometry};

/// Bounce buffer of a namespace's control path.
pub(super) const CONTROL_BUFFER_BYTES: usize = 1 << 20;

/// What the hot path needs of a namespace: its handle, its controller's
/// position (for the core's queue pair) and its sector size.
#[derive(Clone, Copy, Debug)]
pub struct SpdkTarget {
    pub(super) ns: sys::Ns,
    pub(super) controller_index: usize,
    pub(super) sector_bytes: u32,
}

// SAFETY: a namespace handle is a stable pointer into its controller,
// valid while the controller is attached; submitting I/O on it is safe from
// any thread that owns the queue pair used.
unsafe impl Send for SpdkTarget {}
// SAFETY: as above.
unsafe impl Sync for SpdkTarget {}

pub(super) struct SpdkNamespace {
    // Dropped after `control`, whose queue pair is the controller's.
    control: Mutex<ControlPath>,
    _driver: Arc<SpdkDriver>,
    label: String,
    target: SpdkTarget,
    capacity_bytes: u64,
}

struct ControlPath {
    qpair: sys::Qpair,
    buffer: DmaBuffer,
}

// SAFETY: the queue pair is used only under the namespace's mutex.
unsafe impl Send for ControlPath {}

impl Drop for ControlPath {
    fn drop(&mut self) {
        // SAFETY: no command is outstanding (every call waits for its own).
        unsafe { sys::free_io_qpair(self.qpair) };
    }
}

impl SpdkNamespace {
    /// Opens active namespace `nsid` of the controller at `pci`.
    pub(super) fn open(driver: &Arc<SpdkDriver>, pci: &str, nsid: u32) -> Result<Self, DriverError> {
        let label = format!("{pci}/{nsid}");
        let open_error = |message: String| DriverError::Open { what: label.clone(), source: io::Error::other(message) };
        let index = driver.controller_index(pci).map_err(|e| open_error(e.to_string()))?;
        let ctrlr = driver.controllers[index].ctrlr;
        // SAFETY: the controller is attached while `driver` lives.
        let ns = unsafe { sys::active_ns(ctrlr, nsid) }
            .ok_or_else(|| open_error("no active namespace with that id".into()))?;
        // SAFETY: `ns` is an active namespace of an attached controller.
        let (sector_bytes, capacity_bytes) = unsafe { (sys::ns_sector_bytes(ns), sys::ns_size_bytes(ns)) };
        if sector_bytes == 0
            || !sector_bytes.is_power_of_two()
            || !CONTROL_BUFFER_BYTES.is_multiple_of(sector_bytes as usize)
        {
            return Err(open_error(format!("sector size {sector_bytes} is not one sluice reads")));
        }
        let buffer =
            DmaBuffer::new(CONTROL_BUFFER_BYTES).map_err(|source| DriverError::Open { what: label.clone(), source })?;
        // SAFETY: the controller is attached.
        let qpair = unsafe { sys::alloc_io_qpair(ctrlr) }
            .ok_or_else(|| open_error("no I/O queue pair left on the controller".into()))?;
        Ok(Self {
            control: Mutex::new(ControlPath { qpair, buffer }),
            _driver: Arc::clone(driver),
            label,
            target: SpdkTarget { ns, controller_index: index, sector_bytes },
            capacity_bytes,
        })
    }

    fn lock(&self) -> io::Result<MutexGuard<'_, ControlPath>> {
        self.control.lock().map_err(|_| io::Error::other("control path lock poisoned"))
    }

    /// Runs one command on the control queue pair and waits for it.
    fn command(&self, path: &mut ControlPath, submit: impl FnOnce(sys::Qpair, *mut c_void) -> i32) -> io::Result<()> {
        let done = Waiter::default();
        let rc = submit(path.qpair, done.arg());
        if rc != 0 {
            return Err(io::Error::other(format!(
                "{}: submit failed ({})",
                self.label,
                io::Error::from_raw_os_error(-rc)
            )));
        }
        let qpair = path.qpair;
        done.wait(|| {
            // SAFETY: the queue pair is ours under the mutex.
            unsafe { sys::process_completions(qpair) };
        })
        .map(drop)
        .map_err(|e| io::Error::other(format!("{}: {e}", self.label)))
    }

    /// Reads or writes whole sectors `[lba, lba + count)` through the
    /// bounce buffer (its first `count * sector` bytes).
    fn sectors(&self, path: &mut ControlPath, direction: Direction, sectors: Sectors) -> io::Result<()> {
        debug_assert!(sectors.count as usize * self.target.sector_bytes as usize <= CONTROL_BUFFER_BYTES);
        let ns = self.target.ns;
        let buf = path.buffer.as_mut_ptr();
        self.command(path, |qpair, arg| {
            // SAFETY: the bounce buffer is DMA memory of at least `count`
            // sectors, alive and untouched until the command completes (we
            // wait for it); `arg` is the Waiter `command` keeps alive.
            unsafe { sys::rw(direction, ns, qpair, buf, sectors, Waiter::complete, arg) }
        })
    }

    fn check_range(&self, offset_bytes: u64, len: usize) -> io::Result<()> {
        match offset_bytes.checked_add(len as u64) {
            Some(end) if end <= self.capacity_bytes => Ok(()),
            _ => Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{}: {len} bytes at {offset_bytes} pass its {} bytes", self.label, self.capacity_bytes),
            )),
        }
    }

    /// Reads, or with `write` read-modify-writes, any byte range a bounce
    /// buffer at a time, whole sectors underneath: `step` gets each piece
    /// of the bounce buffer and its offset in the range.
    fn transfer(
        &self,
        offset_bytes: u64,
        len: usize,
        write: bool,
        mut step: impl FnMut(&mut [u8], usize),
    ) -> io::Result<()> {
        self.check_range(offset_bytes, len)?;
        let sector = u64::from(self.target.sector_bytes);
        let mut path = self.lock()?;
        let mut done = 0usize;
        while done < len {
            let at = offset_bytes + done as u64;
            let first_lba = at / sector;
            let skip = (at - first_lba * sector) as usize;
            let piece = (len - done).min(CONTROL_BUFFER_BYTES - skip);
            let count = ((skip + piece) as u64).div_ceil(sector) as u32;
            let span = count as usize * sector as usize;
            let sectors = Sectors { lba: first_lba, count };
            // A write of whole sectors needs no read first.
            if !write || skip != 0 || piece != span {
                self.sectors(&mut path, Direction::Read, sectors)?;
            }
            step(&mut path.buffer.bytes_mut()[skip..skip + piece], done);
            if write {
                self.sectors(&mut path, Direction::Write, sectors)?;
            }
            done += piece;
        }
        Ok(())
    }
}

impl Namespace for SpdkNamespace {
    fn geometry(&self) -> NamespaceGeometry {
        NamespaceGeometry {
            block_size_bytes: self.target.sector_bytes,
            capacity_bytes: self.capacity_bytes,
            fixed_capacity: true,
        }
    }

    fn write_at(&self, offset_bytes: u64, data: &[u8]) -> io::Result<()> {
        self.transfer(offset_bytes, data.len(), true, |bounce, at| {
            bounce.copy_from_slice(&data[at..at + bounce.len()]);
        })
    }

    fn read_at(&self, offset_bytes: u64, buf: &mut [u8]) -> io::Result<()> {
        self.transfer(offset_bytes, buf.len(), false, |bounce, at| {
            buf[at..at + bounce.len()].copy_from_slice(bounce);
        })
    }

    fn sync(&self) -> io::Result<()> {
        let mut path = self.lock()?;
        let ns = self.target.ns;
        self.command(&mut path, |qpair, arg| {
            // SAFETY: `arg` is the Waiter `command` keeps alive.
            unsafe { sys::flush(ns, qpair, Waiter::complete, arg) }
        })
    }

    fn truncate(&self, _len_bytes: u64) -> io::Result<()> {
        // A namespace keeps its size; the catalog's length bounds reads.
        Ok(())
    }

    /// Deallocates the whole sectors inside the range (a partial sector at
    /// either end keeps its bytes).
    fn discard(&self, offset_bytes: u64, len_bytes: u64) -> io::Result<()> {
        let sector = u64::from(self.target.sector_bytes);
        let start = offset_bytes.div_ceil(sector);
        let end = offset_bytes.saturating_add(len_bytes).min(self.capacity_bytes) / sector;
        let mut path = self.lock()?;
        let ns = self.target.ns;
        let mut lba = start;
        while lba < end {
            let count = (end - lba).min(u64::from(u32::MAX)) as u32;
            self.command(&mut path, |qpair, arg| {
                // SAFETY: `arg` is the Waiter `command` keeps alive.
                unsafe { sys::deallocate(ns, qpair, Sectors { lba, count }, Waiter::complete, arg) }
            })?;
            lba += u64::from(count);
        }
        Ok(())
    }

    fn target(&self) -> IoTarget {
        IoTarget::Spdk(self.target)
    }

    fn describe(&self) -> String {
        format!("{} (SPDK, {} B sectors)", self.label, self.target.sector_bytes)
    }
}
