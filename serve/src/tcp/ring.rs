//! A core's socket ring: the io_uring its plain-TCP connections receive
//! and send through, so a connection's bytes move by submissions on the
//! core's own thread instead of readiness callbacks and a syscall each.
//!
//! The ring owns whatever memory an operation lends the kernel (a receive
//! buffer; a response's head, iovecs and DMA slots) until that operation's
//! completion arrives, whoever stops waiting for it first: a future
//! dropped mid-operation (a deadline, a closed connection) asks the kernel
//! to cancel and leaves the memory here, freed when the completion says
//! the kernel is done with it. That is what makes an io_uring socket safe
//! to use from futures that may be dropped at any await.
//!
//! The kernel runs a socket operation's deferred work (the receive once
//! its data arrived) only when the core asks for it (`DEFER_TASKRUN`), not
//! by interrupting the core wherever it is: the ring signals an eventfd
//! when work is waiting, the event loop watches it, and the ring's task
//! then has the work run and reaps the completions. A future polling its
//! own operation reaps too, so a send the kernel finished during its
//! submission (nearly every one) is seen without a trip through the event
//! loop. Kernels before 6.1 get a plain ring, watched by its own fd.

use std::future::Future;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll, Waker};

use io_uring::{opcode, squeue, IoUring};
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;
use tokio::sync::Notify;

use super::socket::SendParts;

/// Submission queue entries of one ring: a connection has at most one
/// receive and one send in flight, so this many connections submit at
/// once without waiting for room (a full queue is flushed and refilled).
const RING_ENTRIES: u32 = 256;
/// The `user_data` of cancellations, whose completions say nothing the
/// ring waits for.
const CANCEL_USER_DATA: u64 = u64::MAX;

/// What an operation lends the kernel until its completion.
pub(super) enum Lent {
    /// A receive's buffer.
    Recv(Vec<u8>),
    /// A send's head, iovecs and batch result.
    Send(Box<SendParts>),
}

/// When an operation is submitted.
#[derive(Clone, Copy)]
pub(super) enum At {
    /// Now: a send, which the kernel nearly always completes during its
    /// submission, so its owner finds it done on its first poll.
    Once,
    /// With the other entries queued in this turn of the event loop, by
    /// the ring's task: a receive, which waits for its peer anyway.
    EndOfTurn,
}

/// One operation's place in the ring.
enum Phase {
    Free,
    /// Submitted; `waker` is the task waiting for it. An abandoned one has
    /// no owner left: its completion frees the place and what it lent.
    InFlight {
        waker: Option<Waker>,
        abandoned: bool,
    },
    Done(i32),
}

struct Slot {
    phase: Phase,
    /// Bumped each time the place is freed, so a stale completion or
    /// cancellation never reaches the place's next operation.
    generation: u32,
    lent: Option<Lent>,
}

/// The operations' places, and which are free.
#[derive(Default)]
struct Slots {
    slots: Vec<Slot>,
    free: Vec<u32>,
}

impl Slots {
    /// A free place for an operation lending `lent`: its index and
    /// generation.
    fn take(&mut self, lent: Lent) -> io::Result<(u32, u32)> {
        let index = match self.free.pop() {
            Some(index) => index,
            None => {
                let index = u32::try_from(self.slots.len()).map_err(|_| io::Error::other("socket ring full"))?;
                self.slots.push(Slot { phase: Phase::Free, generation: 0, lent: None });
                index
            }
        };
        let slot = &mut self.slots[index as usize];
        debug_assert!(matches!(slot.phase, Phase::Free));
        slot.phase = Phase::InFlight { waker: None, abandoned: false };
        slot.lent = Some(lent);
        Ok((index, slot.generation))
    }

    /// Frees place `index`; what it lent, if anything, is returned.
    fn release(&mut self, index: u32) -> Option<Lent> {
        let slot = &mut self.slots[index as usize];
        slot.phase = Phase::Free;
        slot.generation = slot.generation.wrapping_add(1);
        self.free.push(index);
        slot.lent.take()
    }
}

struct State {
    ring: IoUring,
    /// With deferred task running: the eventfd the ring signals when work
    /// waits for the core. Declared after the ring, so closed after it.
    wake_fd: Option<OwnedFd>,
    slots: Slots,
    /// Operations submitted whose completion has not been reaped.
    in_flight: usize,
    /// Entries wait in the submission queue.
    queued: bool,
}

/// An operation this ring runs: whoever holds it owns its completion.
#[must_use = "an operation not waited on is cancelled when dropped"]
pub(super) struct Op {
    ring: SocketRing,
    index: u32,
    generation: u32,
    done: bool,
}

struct Shared {
    state: Mutex<State>,
    /// Handles ([`SocketRing`]s) alive; the reaping task ends when none is
    /// and nothing is in flight.
    handles: AtomicUsize,
    last_handle_gone: Notify,
    /// Raised when an entry is queued: the ring task submits what the
    /// connections queued in one turn of the event loop with one enter.
    submit_due: Notify,
}

/// A handle on one core's socket ring.
pub(super) struct SocketRing {
    shared: Arc<Shared>,
}

impl Clone for SocketRing {
    fn clone(&self) -> Self {
        self.shared.handles.fetch_add(1, Ordering::Relaxed);
        Self { shared: Arc::clone(&self.shared) }
    }
}

impl Drop for SocketRing {
    fn drop(&mut self) {
        if self.shared.handles.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.shared.last_handle_gone.notify_one();
        }
    }
}

/// The fd the event loop watches for the ring (its eventfd, or the ring
/// itself); the ring outlives the watch (see [`Reaper`]).
struct RingFd(RawFd);

impl AsRawFd for RingFd {
    fn as_raw_fd(&self) -> RawFd {
        self.0
    }
}

impl SocketRing {
    /// A ring on the current event loop (a core's), with its reaping task
    /// spawned there. Fails where the kernel gives no io_uring (too old,
    /// or disabled by `kernel.io_uring_disabled` or a seccomp profile).
    pub(super) fn start() -> io::Result<Self> {
        let deferred =
            IoUring::builder().setup_single_issuer().setup_defer_taskrun().setup_taskrun_flag().build(RING_ENTRIES);
        let (ring, wake_fd) = match deferred {
            Ok(ring) => {
                let wake_fd = eventfd()?;
                ring.submitter().register_eventfd(wake_fd.as_raw_fd())?;
                (ring, Some(wake_fd))
            }
            Err(_) => (IoUring::new(RING_ENTRIES)?, None),
        };
        let fd = wake_fd.as_ref().map_or(ring.as_raw_fd(), AsRawFd::as_raw_fd);
        let shared = Arc::new(Shared {
            state: Mutex::new(State { ring, wake_fd, slots: Slots::default(), in_flight: 0, queued: false }),
            handles: AtomicUsize::new(1),
            last_handle_gone: Notify::new(),
            submit_due: Notify::new(),
        });
        // SAFETY: the fd is the ring's (or its eventfd), open while `shared`
        // holds the ring; the reaping task drops the watch first (`Reaper`).
        let watched = unsafe { AsyncFd::register_with_interest(RingFd(fd), Interest::READABLE) }
            .map_err(|err| err.into_parts().1)?;
        tokio::spawn(reap_until_unused(Reaper { watched, shared: Arc::clone(&shared) }));
        Ok(Self { shared })
    }

    /// Operations whose completion has not been reaped, abandoned ones
    /// included.
    #[cfg(test)]
    pub(super) fn in_flight(&self) -> usize {
        self.state().in_flight
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // Nothing is left half-done while the state is held.
        self.shared.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Submits `entry`, which lends the kernel `lent` until it completes:
    /// `At::Once`, or `At::EndOfTurn` with whatever else the connections
    /// queue before the ring's task next runs.
    ///
    /// # Safety
    /// Every pointer in `entry` must point into `lent`'s heap memory (which
    /// does not move when `lent` does) or into memory that outlives the
    /// ring, and be valid for the operation's access.
    pub(super) unsafe fn submit(&self, entry: squeue::Entry, lent: Lent, at: At) -> io::Result<Op> {
        let mut state = self.state();
        let (index, generation) = state.slots.take(lent)?;
        let entry = entry.user_data(user_data(index, generation));
        let queued = state.queue(&entry).and_then(|first| match at {
            At::Once => state.submit_queued().map(|()| false),
            At::EndOfTurn => Ok(first),
        });
        let first = match queued {
            Ok(first) => first,
            Err(err) => {
                state.slots.release(index);
                return Err(err);
            }
        };
        state.in_flight += 1;
        drop(state);
        if first {
            self.shared.submit_due.notify_one();
        }
        Ok(Op { ring: self.clone(), index, generation, done: false })
    }
}

impl State {
    /// Queues `entry` for the ring task's next submission (or submits
    /// what is queued now, if the queue is full); true if it is the first
    /// queued since the last submission, when the ring task must be told.
    fn queue(&mut self, entry: &squeue::Entry) -> io::Result<bool> {
        // SAFETY: the caller of `SocketRing::submit` vouched for the
        // entry's memory; cancellations point at nothing.
        if unsafe { self.ring.submission().push(entry) }.is_err() {
            self.submit_queued()?;
            // SAFETY: as above.
            unsafe { self.ring.submission().push(entry) }.map_err(|_| io::Error::other("socket ring full"))?;
        }
        Ok(!std::mem::replace(&mut self.queued, true))
    }

    /// Submits what is queued, and has the kernel run the work it deferred
    /// for this thread (a receive whose data arrived) when it asks for
    /// that (the enter then carries GETEVENTS), which posts completions.
    fn submit_queued(&mut self) -> io::Result<()> {
        let deferred_work = self.wake_fd.is_some() && self.ring.submission().taskrun();
        if !self.queued && !deferred_work {
            return Ok(());
        }
        loop {
            match self.ring.submit() {
                Ok(_) => {
                    self.queued = !self.ring.submission().is_empty();
                    return Ok(());
                }
                Err(err) if err.raw_os_error() == Some(libc::EINTR) => continue,
                // The kernel is short of memory for completions: they are
                // reaped next, and what is queued stays for the next pass.
                Err(err) if matches!(err.raw_os_error(), Some(libc::EBUSY | libc::EAGAIN)) => return Ok(()),
                Err(err) => return Err(err),
            }
        }
    }

    /// Takes every completion the kernel posted and wakes the tasks waiting
    /// on them (a wake only schedules a task on this core; it locks the
    /// state when it runs, after this); what abandoned operations lent goes
    /// to `orphans`, to be dropped once the state is unlocked (a batch
    /// result gives its DMA slots back when dropped). Nothing allocates
    /// unless an operation was abandoned.
    fn reap(&mut self, orphans: &mut Vec<Lent>) {
        let State { ring, slots, in_flight, .. } = self;
        for cqe in ring.completion() {
            if cqe.user_data() == CANCEL_USER_DATA {
                continue;
            }
            let (index, generation) = split_user_data(cqe.user_data());
            let Some(slot) = slots.slots.get_mut(index as usize) else { continue };
            if slot.generation != generation {
                continue;
            }
            match std::mem::replace(&mut slot.phase, Phase::Done(cqe.result())) {
                Phase::InFlight { waker, abandoned: false } => waker.into_iter().for_each(Waker::wake),
                Phase::InFlight { abandoned: true, .. } => orphans.extend(slots.release(index)),
                // Never: one completion per operation (none is multishot).
                phase @ (Phase::Free | Phase::Done(_)) => {
                    slot.phase = phase;
                    continue;
                }
            }
            *in_flight -= 1;
        }
    }
}

/// A non-blocking eventfd.
fn eventfd() -> io::Result<OwnedFd> {
    // SAFETY: plain syscall; the fd it returns is checked and then owned.
    let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` was just opened and nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn user_data(index: u32, generation: u32) -> u64 {
    (u64::from(generation) << 32) | u64::from(index)
}

fn split_user_data(user_data: u64) -> (u32, u32) {
    (user_data as u32, (user_data >> 32) as u32)
}

impl Future for Op {
    /// The completion's result (bytes moved, or a negated errno) and what
    /// the operation lent, given back.
    type Output = (i32, Lent);

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = &mut *self;
        assert!(!this.done, "operation polled after it finished");
        let mut orphans = Vec::new();
        let finished = {
            let mut state = this.ring.state();
            // A send usually finished inside its own submission: look in
            // the completion queue before waiting for the reaping task.
            state.reap(&mut orphans);
            let slot = &mut state.slots.slots[this.index as usize];
            debug_assert_eq!(slot.generation, this.generation);
            let finished = match &mut slot.phase {
                Phase::Done(result) => Some(*result),
                Phase::InFlight { waker, .. } => {
                    match waker {
                        Some(waker) if waker.will_wake(cx.waker()) => {}
                        _ => *waker = Some(cx.waker().clone()),
                    }
                    None
                }
                Phase::Free => unreachable!("an operation's place is freed only by its owner or its completion"),
            };
            finished.map(|result| (result, state.slots.release(this.index)))
        };
        drop(orphans);
        match finished {
            Some((result, Some(lent))) => {
                this.done = true;
                Poll::Ready((result, lent))
            }
            Some((_, None)) => unreachable!("an operation lends something until it completes"),
            None => Poll::Pending,
        }
    }
}

impl Drop for Op {
    /// Abandons an operation still in flight: the kernel is asked to cancel
    /// it, and what it lent stays with the ring until its completion.
    fn drop(&mut self) {
        if self.done {
            return;
        }
        let lent = {
            let mut state = self.ring.state();
            let slot = &mut state.slots.slots[self.index as usize];
            match &mut slot.phase {
                Phase::Done(_) => state.slots.release(self.index),
                Phase::InFlight { waker, abandoned } => {
                    *waker = None;
                    *abandoned = true;
                    let cancel = opcode::AsyncCancel::new(user_data(self.index, self.generation))
                        .build()
                        .user_data(CANCEL_USER_DATA);
                    match state.queue(&cancel) {
                        Ok(true) => self.ring.shared.submit_due.notify_one(),
                        Ok(false) => {}
                        // The operation still ends: its socket is closed
                        // by its owner, which completes it.
                        Err(err) => tracing::debug!("cancelling a socket operation: {err}"),
                    }
                    None
                }
                Phase::Free => None,
            }
        };
        drop(lent);
    }
}

/// The ring's reaping task: reaps whenever the ring's fd turns readable,
/// until no handle is left and nothing is in flight. A ring dropped with
/// operations still in flight (its event loop shut down) leaks what they
/// lent rather than free memory the kernel may still write.
async fn reap_until_unused(reaper: Reaper) {
    let Reaper { watched, shared } = &reaper;
    let mut orphans = Vec::new();
    loop {
        {
            let mut state = shared.state.lock().unwrap_or_else(PoisonError::into_inner);
            if let Err(err) = state.submit_queued() {
                tracing::error!("submitting to the socket ring: {err}");
            }
            state.reap(&mut orphans);
            if shared.handles.load(Ordering::Acquire) == 0 && state.in_flight == 0 {
                break;
            }
        }
        orphans.clear();
        tokio::select! {
            ready = watched.readable() => match ready {
                // Cleared before the next reap, so a completion posted
                // after it raises readiness again.
                Ok(mut guard) => guard.clear_ready(),
                Err(err) => {
                    tracing::error!("watching the socket ring: {err}");
                    sluice_dataplane::timer::sleep(std::time::Duration::from_millis(1)).await;
                }
            },
            () = shared.submit_due.notified() => {
                // The rest of this turn first: a send submitted in it
                // takes the queued entries along in its own enter.
                tokio::task::yield_now().await;
            }
            () = shared.last_handle_gone.notified() => {}
        }
    }
}

/// What the reaping task holds: the watch is declared first so that it is
/// dropped (and the fd unwatched) before the ring it watches can close,
/// whether the task ends or its event loop drops it.
struct Reaper {
    watched: AsyncFd<RingFd>,
    shared: Arc<Shared>,
}

impl Drop for State {
    fn drop(&mut self) {
        for slot in &mut self.slots.slots {
            if matches!(slot.phase, Phase::InFlight { .. }) {
                // The kernel may still write it: leaked, never freed.
                std::mem::forget(slot.lent.take());
            }
        }
    }
}
