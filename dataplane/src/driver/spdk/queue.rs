//! A core's hot path: one I/O queue pair per controller, reads submitted
//! straight into the core's DMA arena and completions reaped by polling,
//! never by interrupt. Owned by the core's thread; nothing here locks.

use std::ffi::c_void;
use std::io;
use std::ptr::NonNull;
use std::sync::Arc;
use std::time::Instant;

use super::controller::SpdkDriver;
use super::env::COMMAND_TIMEOUT;
use super::SpdkTarget;
use super::{sys, Direction, Sectors};
use crate::dma::Arena;
use crate::driver::{Completion, DriverError, IoTarget, QueueFull, ReadIo};

/// One in-flight read's context, handed to SPDK as the callback argument.
struct IoContext {
    state: NonNull<QueueState>,
    index: u32,
    tag: u64,
    len: u32,
}

/// What completion callbacks write: they run inside
/// `process_completions`, on the owning core's thread.
struct QueueState {
    done: Vec<Completion>,
    free: Vec<u32>,
    in_flight: u32,
}

/// A core's queue pairs (one per controller), polled for completions.
///
/// The contexts and the state are owned through raw pointers (made from
/// boxes, freed on drop): SPDK's callbacks write them while the queue is
/// borrowed, so no Rust reference to them is held across a poll.
pub struct SpdkQueue {
    _driver: Arc<SpdkDriver>,
    qpairs: Vec<sys::Qpair>,
    namespaces: Vec<Option<SpdkTarget>>,
    contexts: NonNull<IoContext>,
    depth: u32,
    state: NonNull<QueueState>,
    registered: Option<(NonNull<u8>, usize)>,
}

unsafe extern "C" fn read_done(arg: *mut c_void, cpl: *const sys::Cpl) {
    // SAFETY: `arg` is a context of the queue that submitted it (which
    // outlives its commands); `cpl` is valid for the call; this runs inside
    // the queue's own poll, while no reference to its state is alive.
    let (ctx, cpl) = unsafe { (&*arg.cast_const().cast::<IoContext>(), &*cpl) };
    // SAFETY: as above.
    let state = unsafe { &mut *ctx.state.as_ptr() };
    let result = if sys::cpl_ok(cpl) {
        ctx.len as i32
    } else {
        tracing::warn!("SPDK read failed: {}", sys::status_text(cpl));
        -libc::EIO
    };
    debug_assert!(state.in_flight > 0, "a completion with nothing in flight");
    state.done.push(Completion { tag: ctx.tag, result });
    state.free.push(ctx.index);
    state.in_flight -= 1;
}

impl SpdkQueue {
    /// Registers `arena` with SPDK and allocates a queue pair on every
    /// controller. The arena must be hugepage memory that outlives the
    /// queue ([`crate::driver::BlockDriver::create_queue`] checks the
    /// first; the core drops its queue before its arena).
    pub(super) fn new(driver: Arc<SpdkDriver>, arena: &Arena, depth: u32) -> Result<Self, DriverError> {
        let base = arena.base_ptr();
        // SAFETY: the arena is hugepage memory of `len` bytes that outlives
        // this queue (the contract above).
        let rc = unsafe { sys::mem_register(base, arena.len_bytes()) };
        if rc != 0 {
            return Err(DriverError::Spdk(format!("spdk_mem_register of the DMA arena failed ({rc})")));
        }
        let registered = NonNull::new(base).map(|p| (p, arena.len_bytes()));
        let mut qpairs = Vec::with_capacity(driver.controllers.len());
        for controller in &driver.controllers {
            // SAFETY: the controller is attached while `driver` lives.
            match unsafe { sys::alloc_io_qpair(controller.ctrlr) } {
                Some(qpair) => qpairs.push(qpair),
                None => {
                    for qpair in qpairs {
                        // SAFETY: just allocated, nothing submitted.
                        unsafe { sys::free_io_qpair(qpair) };
                    }
                    // SAFETY: registered above; nothing used it.
                    unsafe { sys::mem_unregister(base, arena.len_bytes()) };
                    return Err(DriverError::Spdk(format!("{}: no I/O queue pair left", controller.pci)));
                }
            }
        }
        let depth = depth.max(1);
        let state = NonNull::from(Box::leak(Box::new(QueueState {
            done: Vec::with_capacity(depth as usize),
            free: (0..depth).rev().collect(),
            in_flight: 0,
        })));
        let contexts: Box<[IoContext]> = (0..depth).map(|index| IoContext { state, index, tag: 0, len: 0 }).collect();
        let contexts = NonNull::from(Box::leak(contexts)).cast::<IoContext>();
        Ok(Self { _driver: driver, qpairs, namespaces: Vec::new(), contexts, depth, state, registered })
    }

    fn state(&mut self) -> &mut QueueState {
        // SAFETY: owned by this queue; callbacks touch it only inside
        // `poll`, and no reference made here outlives a call that polls.
        unsafe { self.state.as_mut() }
    }

    pub fn register_namespace(&mut self, index: u32, target: &IoTarget) {
        let IoTarget::Spdk(target) = target else {
            tracing::error!("an SPDK queue was given a namespace of another driver");
            return;
        };
        let index = index as usize;
        if self.namespaces.len() <= index {
            self.namespaces.resize(index + 1, None);
        }
        self.namespaces[index] = Some(*target);
    }

    pub fn unregister_namespace(&mut self, index: u32) {
        if let Some(slot) = self.namespaces.get_mut(index as usize) {
            *slot = None;
        }
    }

    /// # Safety
    /// As [`crate::driver::Queue::push_read`]: `io.buf` holds `io.len_bytes`
    /// writable bytes of this queue's arena, untouched until the completion
    /// is reaped.
    pub unsafe fn push_read(&mut self, io: ReadIo) -> Result<(), QueueFull> {
        let fail = |queue: &mut Self, errno: i32| queue.state().done.push(Completion { tag: io.tag, result: -errno });
        let Some(target) = self.namespaces.get(io.namespace_index as usize).copied().flatten() else {
            fail(self, libc::EBADF);
            return Ok(());
        };
        let sector = u64::from(target.sector_bytes);
        if !io.offset_bytes.is_multiple_of(sector)
            || !u64::from(io.len_bytes).is_multiple_of(sector)
            || io.len_bytes == 0
        {
            fail(self, libc::EINVAL);
            return Ok(());
        }
        let sectors = Sectors { lba: io.offset_bytes / sector, count: (u64::from(io.len_bytes) / sector) as u32 };
        let Some(index) = self.state().free.pop() else { return Err(QueueFull) };
        debug_assert!(index < self.depth);
        // SAFETY: `index` < depth, a context no command holds (it came off
        // the free list).
        let ctx = unsafe { self.contexts.as_ptr().add(index as usize) };
        // SAFETY: as above; nothing else references it now.
        unsafe {
            (*ctx).tag = io.tag;
            (*ctx).len = io.len_bytes;
        }
        let qpair = self.qpairs[target.controller_index];
        // SAFETY: the caller guarantees the buffer; `ctx` lives as long as
        // the queue and is not reused until its callback frees it; the
        // queue pair is this core's own.
        let rc = unsafe { sys::rw(Direction::Read, target.ns, qpair, io.buf, sectors, read_done, ctx.cast()) };
        match rc {
            0 => {
                self.state().in_flight += 1;
                Ok(())
            }
            rc if rc == -libc::ENOMEM => {
                self.state().free.push(index);
                Err(QueueFull)
            }
            rc => {
                self.state().free.push(index);
                fail(self, -rc);
                Ok(())
            }
        }
    }

    fn poll(&mut self) {
        for &qpair in &self.qpairs {
            // SAFETY: this core's own queue pair; callbacks touch only this
            // queue's state, to which no reference is alive here.
            let rc = unsafe { sys::process_completions(qpair) };
            if rc < 0 {
                tracing::error!("SPDK queue pair failed: {}", io::Error::from_raw_os_error(-rc));
            }
        }
    }

    pub fn reap(&mut self, out: &mut Vec<Completion>, max: usize) -> usize {
        self.poll();
        let done = &mut self.state().done;
        let n = done.len().min(max);
        out.extend(done.drain(..n));
        n
    }

    /// Polls until a completion is ready (completions are polled, never
    /// interrupt-driven).
    pub fn wait(&mut self) -> io::Result<()> {
        loop {
            let state = self.state();
            if !state.done.is_empty() || state.in_flight == 0 {
                return Ok(());
            }
            self.poll();
            std::hint::spin_loop();
        }
    }

    pub fn in_flight(&self) -> u32 {
        // SAFETY: a read of state owned by this queue; no callback runs
        // outside `poll`, which needs `&mut self`.
        let state = unsafe { self.state.as_ref() };
        state.in_flight + state.done.len() as u32
    }

    pub fn describe(&self) -> String {
        format!("spdk ({} controllers, polled)", self.qpairs.len())
    }
}

impl Drop for SpdkQueue {
    fn drop(&mut self) {
        let deadline = Instant::now() + COMMAND_TIMEOUT;
        while self.state().in_flight > 0 && Instant::now() < deadline {
            self.poll();
        }
        for &qpair in &self.qpairs {
            // SAFETY: nothing is outstanding (or the deadline passed and the
            // controller is being torn down anyway).
            unsafe { sys::free_io_qpair(qpair) };
        }
        if let Some((base, len)) = self.registered {
            // SAFETY: registered in `new`; the arena is still mapped.
            unsafe { sys::mem_unregister(base.as_ptr(), len) };
        }
        // SAFETY: made by Box::leak in `new` (a boxed slice of `depth`
        // contexts and a box of state); no callback can run any more.
        unsafe {
            drop(Box::from_raw(std::ptr::slice_from_raw_parts_mut(self.contexts.as_ptr(), self.depth as usize)));
            drop(Box::from_raw(self.state.as_ptr()));
        }
    }
}

// SAFETY: a queue moves to its core's thread once, before any I/O; its raw
// pointers are then used only there.
unsafe impl Send for SpdkQueue {}
