//! SPDK's env: started once per process, and the DMA memory it hands out.
//! Also how a synchronous caller waits for one command: by polling, as
//! SPDK never interrupts.

use std::cell::RefCell;
use std::ffi::c_void;
use std::io;
use std::ptr::NonNull;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use super::sys;
use crate::driver::DriverError;

/// Longest a synchronous SPDK command may take before it is an error.
pub(super) const COMMAND_TIMEOUT: Duration = Duration::from_secs(30);

/// SPDK's env (DPDK) is process-wide and starts once.
static ENV: OnceLock<Result<(), String>> = OnceLock::new();

pub(super) fn start_env(name: &str) -> Result<(), DriverError> {
    ENV.get_or_init(|| sys::env_init(name)).clone().map_err(DriverError::Spdk)
}

/// DMA memory from SPDK (hugepages, registered for the device).
pub(super) struct DmaBuffer {
    ptr: NonNull<u8>,
    len: usize,
}

impl DmaBuffer {
    pub(super) fn new(len: usize) -> io::Result<Self> {
        sys::dma_alloc(len)
            .map(|ptr| Self { ptr, len })
            .ok_or_else(|| io::Error::new(io::ErrorKind::OutOfMemory, "spdk_zmalloc: no DMA memory (hugepages)"))
    }

    /// Where a command's data goes: valid for `len` bytes while `self`
    /// lives.
    pub(super) fn as_mut_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    pub(super) fn bytes(&self) -> &[u8] {
        // SAFETY: `len` bytes owned by this buffer; no command is using it
        // when this is called (commands are synchronous).
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    pub(super) fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as above, and `&mut self` makes it unique.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for DmaBuffer {
    fn drop(&mut self) {
        // SAFETY: allocated by dma_alloc, freed once; commands are
        // synchronous, so none uses it now.
        unsafe { sys::dma_free(self.ptr) };
    }
}

// SAFETY: DMA memory is plain memory; users synchronise access.
unsafe impl Send for DmaBuffer {}

/// Waits on one SPDK command's callback by polling. The callback reaches
/// it through a shared pointer, so its outcome is in a cell: set once the
/// command completed.
#[derive(Default)]
pub(super) struct Waiter {
    outcome: RefCell<Option<Result<u32, String>>>,
}

impl Waiter {
    /// The callback argument that names this waiter.
    pub(super) fn arg(&self) -> *mut c_void {
        (self as *const Waiter).cast_mut().cast()
    }

    /// The callback to submit with [`Waiter::arg`].
    pub(super) unsafe extern "C" fn complete(arg: *mut c_void, cpl: *const sys::Cpl) {
        // SAFETY: `arg` is the Waiter the submitter passed and keeps alive
        // until the outcome is set, reached only through shared references;
        // `cpl` is valid for the callback.
        let (waiter, cpl) = unsafe { (&*arg.cast_const().cast::<Waiter>(), &*cpl) };
        let outcome = if sys::cpl_ok(cpl) { Ok(sys::cpl_result(cpl)) } else { Err(sys::status_text(cpl)) };
        *waiter.outcome.borrow_mut() = Some(outcome);
    }

    /// Polls until the callback ran: its completion dword 0, or the status.
    pub(super) fn wait(&self, mut poll: impl FnMut()) -> Result<u32, String> {
        let deadline = Instant::now() + COMMAND_TIMEOUT;
        loop {
            poll();
            if let Some(outcome) = self.outcome.borrow_mut().take() {
                return outcome;
            }
            if Instant::now() > deadline {
                return Err(format!("no completion within {COMMAND_TIMEOUT:?}"));
            }
        }
    }
}
