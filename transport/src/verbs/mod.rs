//! Safe wrappers over libibverbs and librdmacm (through `rdma-sys`) for
//! exactly what sluice uses: rdma_cm connection setup, one protection domain
//! per device, memory regions, a completion queue with its completion
//! channel, and RC queue pairs that post SEND, RECV and RDMA WRITE.
//!
//! Ownership encodes the teardown order the verbs demand: a queue pair holds
//! its protection domain, completion queue and cm id, and destroys itself
//! before any of them; a memory region holds its protection domain; a cm id
//! holds its event channel. Every resource is released on drop, also when
//! the peer vanished and the queue pair is in the error state.

mod cm;
mod memory;
mod queue;

use std::ffi::CStr;
use std::io;

pub use cm::{
    CmEvent, CmEventKind, CmId, DeviceLimits, EventChannel, RNR_RETRY_ENDLESS, RNR_RETRY_OF_NODE_SENDS,
    TRANSPORT_RETRIES,
};
pub use memory::{Access, MemoryRegion, MessageSlots, ProtectionDomain};
pub use queue::{CompletionQueue, QueueCaps, QueuePair, SendOp, SendWr, Sge, WorkCompletion};

/// A verbs or rdma_cm call failed.
#[derive(Debug, thiserror::Error)]
#[error("{op}: {source}")]
pub struct VerbsError {
    pub op: &'static str,
    #[source]
    pub source: io::Error,
}

impl VerbsError {
    /// From `errno`, for calls that return -1 or NULL and set it.
    fn last(op: &'static str) -> Self {
        Self { op, source: io::Error::last_os_error() }
    }

    /// From a returned error number (`ibv_post_*`, `ibv_req_notify_cq`).
    fn code(op: &'static str, code: i32) -> Self {
        Self { op, source: io::Error::from_raw_os_error(code) }
    }

    /// Whether the call failed only because nothing was ready.
    pub fn would_block(&self) -> bool {
        self.source.kind() == io::ErrorKind::WouldBlock
    }
}

/// The RDMA devices of this host. An error says why none can be listed:
/// `ENOSYS` where the kernel has no verbs support (as on hosts without an
/// RDMA NIC or soft-RoCE).
pub fn devices() -> Result<Vec<String>, VerbsError> {
    let mut count = 0i32;
    // SAFETY: `count` is a valid out-pointer; the list is freed below.
    let list = unsafe { rdma_sys::ibv_get_device_list(&mut count) };
    if list.is_null() {
        return Err(VerbsError::last("ibv_get_device_list"));
    }
    let mut names = Vec::with_capacity(count.max(0) as usize);
    for index in 0..count.max(0) as usize {
        // SAFETY: the list holds `count` valid device pointers until freed.
        let name = unsafe { rdma_sys::ibv_get_device_name(*list.add(index)) };
        if !name.is_null() {
            // SAFETY: a NUL-terminated name owned by the device list.
            names.push(unsafe { CStr::from_ptr(name) }.to_string_lossy().into_owned());
        }
    }
    // SAFETY: `list` came from ibv_get_device_list and is freed once.
    unsafe { rdma_sys::ibv_free_device_list(list) };
    Ok(names)
}

/// Whether this host has an RDMA device a transport could use, and if not,
/// why: the client's `auto` choice and the tests' skip messages use it.
pub fn usable_device() -> Result<String, String> {
    match devices() {
        Ok(names) => names.into_iter().next().ok_or_else(|| "no RDMA device (ibv_get_device_list is empty)".into()),
        Err(err) => Err(format!("no RDMA support on this host ({err})")),
    }
}
