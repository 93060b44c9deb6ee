//! A data-plane core's own timers: sleeps, timeouts and intervals for the
//! tasks on a core's event loop, kept by the core and fired from one
//! `timerfd`, so the event loop runs without tokio's time driver.
//!
//! Why not tokio's: its time driver takes part in every park of the event
//! loop whether or not a timer is due. It locks its wheel, scans it for the
//! next expiry, reads the clock twice and processes the wheel again. That
//! was about 230 user-space instructions per served 4 KiB read (`bench
//! instructions`), a seventh of the whole path. Here a park is the
//! reactor's alone. The timers' cost falls where a timer is armed, moved or
//! fires, which on the served path is rare: the served path arms one only
//! when work would wait (see `sluice_serve::deadline`).
//!
//! How: each timer is an entry in the core's table (a thread-local; a core's
//! tasks all run on its thread). The `timerfd` is armed for the soonest
//! deadline any entry had when it was armed. When it fires, one task on the
//! core (`drive`) wakes every entry that is due and arms the fd for the
//! soonest one left. A deadline moved later is not re-armed at once: the fd
//! fires at the old time, finds nothing due, and arms for the new soonest.
//!
//! Off a core (tests, the control runtime, clients) the same calls use
//! tokio's timers: which one a [`Sleep`] uses is decided where it is first
//! polled, so a future made on one thread and run on a core works.

use std::cell::RefCell;
use std::future::Future;
use std::io;
use std::os::fd::{AsFd, AsRawFd, RawFd};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use nix::sys::time::TimeSpec;
use nix::sys::timerfd::{ClockId, Expiration, TimerFd, TimerFlags, TimerSetTimeFlags};
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;

/// The core's timerfd, as the reactor takes it (by its raw fd).
#[derive(Debug)]
struct CoreTimerFd(TimerFd);

impl AsRawFd for CoreTimerFd {
    fn as_raw_fd(&self) -> RawFd {
        self.0.as_fd().as_raw_fd()
    }
}

/// The furthest ahead the fd is armed: a later deadline has it fire at
/// this bound, find nothing due and arm again, so no deadline the clock can
/// hold is out of the fd's range.
const ARMED_AHEAD_MAX: Duration = Duration::from_secs(24 * 60 * 60);

thread_local! {
    /// The timers of the core whose thread this is; `None` off a core.
    static CORE_TIMERS: RefCell<Option<CoreTimers>> = const { RefCell::new(None) };
}

/// Installs timers for the core whose thread this is, on `runtime` (the
/// core's event loop, which must have its reactor), and starts the task
/// that fires them there.
///
/// # Panics
/// If this thread has core timers already.
pub fn install(runtime: &tokio::runtime::Runtime) -> io::Result<()> {
    let fd = TimerFd::new(ClockId::CLOCK_MONOTONIC, TimerFlags::TFD_NONBLOCK | TimerFlags::TFD_CLOEXEC)?;
    let fd = {
        let _in_runtime = runtime.enter();
        // SAFETY: the registered value owns the fd, so the fd stays open
        // while it is registered and is closed only when the value drops,
        // which deregisters it first.
        let registered = unsafe { AsyncFd::register_with_interest(CoreTimerFd(fd), Interest::READABLE) };
        Arc::new(registered.map_err(|err| err.into_parts().1)?)
    };
    CORE_TIMERS.with(|timers| {
        let mut timers = timers.borrow_mut();
        assert!(timers.is_none(), "core timers installed twice on one thread");
        *timers = Some(CoreTimers {
            fd: Arc::clone(&fd),
            entries: Vec::new(),
            free: Vec::new(),
            armed: None,
            due: Vec::new(),
        });
    });
    runtime.spawn(drive(fd));
    Ok(())
}

/// Removes this thread's core timers (after the core's event loop ended);
/// a timer polled afterwards on this thread is tokio's.
pub fn uninstall() {
    let _ = CORE_TIMERS.try_with(|timers| timers.borrow_mut().take());
}

/// Fires due timers whenever the fd says one is; runs for the core's life.
async fn drive(fd: Arc<AsyncFd<CoreTimerFd>>) {
    let mut expirations = [0u8; 8];
    loop {
        match fd.readable().await {
            Ok(mut ready) => {
                // Read the expiration count to clear the fd, then clear the
                // readiness: an expiry after the read raises it again. A
                // failed read (none is expected of a timerfd) still clears
                // it, so the task never spins on it; the due timers fire.
                match nix::unistd::read(fd.get_ref().as_raw_fd(), &mut expirations) {
                    Ok(_) | Err(nix::errno::Errno::EAGAIN) => {}
                    Err(err) => tracing::error!("reading the core's timerfd: {err}"),
                }
                ready.clear_ready();
            }
            Err(err) => {
                tracing::error!("waiting on the core's timerfd: {err}");
                return;
            }
        }
        // Woken outside the table's borrow: a task woken (or a waker
        // dropped) may drop a timer of its own, which needs the table.
        let Some(mut due) = with_core_timers(|timers| {
            timers.fire(Instant::now());
            std::mem::take(&mut timers.due)
        }) else {
            return;
        };
        due.drain(..).for_each(Waker::wake);
        let _ = with_core_timers(|timers| timers.due = due);
    }
}

/// Runs `f` on this thread's core timers; `None` off a core.
fn with_core_timers<T>(f: impl FnOnce(&mut CoreTimers) -> T) -> Option<T> {
    CORE_TIMERS.try_with(|timers| timers.borrow_mut().as_mut().map(f)).ok().flatten()
}

/// One timer's place in the table.
struct Entry {
    deadline: Instant,
    /// The task to wake when the deadline comes.
    waker: Option<Waker>,
    /// Fired, or its place is free: either way [`CoreTimers::fire`] passes
    /// it by.
    fired: bool,
    /// Bumped when the place is freed, so a stale handle never reaches the
    /// place's next timer.
    generation: u32,
}

/// A core's timers.
struct CoreTimers {
    fd: Arc<AsyncFd<CoreTimerFd>>,
    entries: Vec<Entry>,
    free: Vec<u32>,
    /// The deadline the fd is armed for, if it is.
    armed: Option<Instant>,
    /// The wakers of the timers [`CoreTimers::fire`] found due, to wake
    /// once the table is let go; kept for its allocation.
    due: Vec<Waker>,
}

/// Where a registered timer is in its core's table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Handle {
    index: u32,
    generation: u32,
}

impl CoreTimers {
    /// A new entry for `deadline`, waking `waker`; `None` if it is due
    /// already (the clock is read only when the fd must be armed sooner).
    fn register(&mut self, deadline: Instant, waker: &Waker) -> Option<Handle> {
        // Read once, for the check and for arming.
        let now = if self.armed.is_none_or(|armed| deadline < armed) {
            let now = Instant::now();
            if deadline <= now {
                return None;
            }
            Some(now)
        } else {
            None
        };
        let entry = Entry { deadline, waker: Some(waker.clone()), fired: false, generation: 0 };
        let handle = match self.free.pop() {
            Some(index) => {
                let slot = &mut self.entries[index as usize];
                *slot = Entry { generation: slot.generation, ..entry };
                Handle { index, generation: slot.generation }
            }
            None => {
                let index = u32::try_from(self.entries.len()).expect("fewer than 2^32 timers on a core");
                self.entries.push(entry);
                Handle { index, generation: 0 }
            }
        };
        if let Some(now) = now {
            self.arm(Some(deadline), now);
        }
        Some(handle)
    }

    fn entry(&mut self, handle: Handle) -> &mut Entry {
        let entry = &mut self.entries[handle.index as usize];
        assert_eq!(entry.generation, handle.generation, "a timer outlived its place");
        entry
    }

    /// Whether the timer fired; if not, `waker` is woken when it does. A
    /// waker it replaced comes back, to be dropped once the table is let go.
    fn poll(&mut self, handle: Handle, waker: &Waker) -> (bool, Option<Waker>) {
        let entry = self.entry(handle);
        if entry.fired || entry.waker.as_ref().is_some_and(|held| held.will_wake(waker)) {
            return (entry.fired, None);
        }
        (false, entry.waker.replace(waker.clone()))
    }

    /// Moves the timer to `deadline`, unfired.
    fn reset(&mut self, handle: Handle, deadline: Instant) {
        let entry = self.entry(handle);
        entry.deadline = deadline;
        entry.fired = false;
        self.arm_for(deadline);
    }

    /// Frees the timer's place; its waker comes back, to be dropped once
    /// the table is let go.
    fn release(&mut self, handle: Handle) -> Option<Waker> {
        let entry = self.entry(handle);
        entry.generation = entry.generation.wrapping_add(1);
        entry.fired = true;
        let waker = entry.waker.take();
        self.free.push(handle.index);
        waker
    }

    /// Arms the fd for `deadline` if it is armed for later or not at all.
    fn arm_for(&mut self, deadline: Instant) {
        if self.armed.is_none_or(|armed| deadline < armed) {
            self.arm(Some(deadline), Instant::now());
        }
    }

    /// Arms the fd for `deadline` as of `now`, or disarms it.
    fn arm(&mut self, deadline: Option<Instant>, now: Instant) {
        let set = match deadline {
            // A zero expiration disarms; a deadline passed fires at once.
            Some(deadline) => {
                let after = deadline.saturating_duration_since(now).clamp(Duration::from_nanos(1), ARMED_AHEAD_MAX);
                self.fd.get_ref().0.set(Expiration::OneShot(TimeSpec::from_duration(after)), TimerSetTimeFlags::empty())
            }
            None => self.fd.get_ref().0.unset(),
        };
        match set {
            Ok(()) => self.armed = deadline,
            // Only a bad fd or argument fails: a bug, not a condition.
            Err(err) => panic!("arming the core's timerfd: {err}"),
        }
    }

    /// Wakes every timer due at `now`, and arms the fd for the soonest left.
    fn fire(&mut self, now: Instant) {
        let mut soonest: Option<Instant> = None;
        for entry in self.entries.iter_mut().filter(|entry| !entry.fired) {
            if entry.deadline <= now {
                entry.fired = true;
                self.due.extend(entry.waker.take());
            } else if soonest.is_none_or(|soonest| entry.deadline < soonest) {
                soonest = Some(entry.deadline);
            }
        }
        self.arm(soonest, now);
    }
}

/// A future that completes at its deadline.
#[must_use = "a sleep does nothing unless awaited"]
pub struct Sleep {
    deadline: Instant,
    state: SleepState,
}

enum SleepState {
    /// Not yet polled: whose timer it becomes is decided on its first poll.
    New,
    /// In the core's table.
    Core(Handle),
    /// Done, on a core, without an entry (it was due when first polled).
    Due,
    Tokio(Pin<Box<tokio::time::Sleep>>),
}

/// Completes at `deadline`.
pub fn sleep_until(deadline: Instant) -> Sleep {
    Sleep { deadline, state: SleepState::New }
}

/// Completes `duration` from now.
pub fn sleep(duration: Duration) -> Sleep {
    sleep_until(Instant::now() + duration)
}

impl Sleep {
    pub fn deadline(&self) -> Instant {
        self.deadline
    }

    /// Moves the deadline, fired or not.
    pub fn reset(&mut self, deadline: Instant) {
        self.deadline = deadline;
        match &mut self.state {
            SleepState::New => {}
            SleepState::Core(handle) => {
                let handle = *handle;
                with_core_timers(|timers| timers.reset(handle, deadline)).expect("a core timer moved off its core");
            }
            SleepState::Due => self.state = SleepState::New,
            SleepState::Tokio(sleep) => sleep.as_mut().reset(deadline.into()),
        }
    }
}

impl Future for Sleep {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let deadline = self.deadline;
        match &mut self.state {
            SleepState::New => {
                let registered = with_core_timers(|timers| timers.register(deadline, cx.waker()));
                match registered {
                    Some(Some(handle)) => {
                        self.state = SleepState::Core(handle);
                        Poll::Pending
                    }
                    Some(None) => {
                        self.state = SleepState::Due;
                        Poll::Ready(())
                    }
                    None => {
                        // Off a core, where tokio's time driver runs.
                        #[allow(clippy::disallowed_methods)]
                        let mut sleep = Box::pin(tokio::time::sleep_until(deadline.into()));
                        let polled = sleep.as_mut().poll(cx);
                        self.state = SleepState::Tokio(sleep);
                        polled
                    }
                }
            }
            SleepState::Core(handle) => {
                let handle = *handle;
                let (fired, _replaced) = with_core_timers(|timers| timers.poll(handle, cx.waker()))
                    .expect("a core timer polled off its core");
                if fired {
                    Poll::Ready(())
                } else {
                    Poll::Pending
                }
            }
            SleepState::Due => Poll::Ready(()),
            SleepState::Tokio(sleep) => sleep.as_mut().poll(cx),
        }
    }
}

impl Drop for Sleep {
    fn drop(&mut self) {
        if let SleepState::Core(handle) = self.state {
            // Gone with the thread's timers when the thread ends.
            let _waker = with_core_timers(|timers| timers.release(handle));
        }
    }
}

/// A deadline passed before the work it bounded finished.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("deadline has elapsed")]
pub struct Elapsed;

/// Runs `work` until `deadline`; `Elapsed` if the deadline comes first.
/// Work ready when first polled finishes even past its deadline.
pub async fn timeout_at<F: Future>(deadline: Instant, work: F) -> Result<F::Output, Elapsed> {
    tokio::select! {
        biased;
        done = work => Ok(done),
        () = sleep_until(deadline) => Err(Elapsed),
    }
}

/// Runs `work` for at most `limit` from now.
pub async fn timeout<F: Future>(limit: Duration, work: F) -> Result<F::Output, Elapsed> {
    timeout_at(Instant::now() + limit, work).await
}

/// Ticks every `period`; the first tick at once. A tick taken a period or
/// more late moves the next one a whole period past it: missed ticks are
/// skipped, never burst to catch up.
pub struct Interval {
    period: Duration,
    sleep: Sleep,
}

/// An [`Interval`] of `period`.
///
/// # Panics
/// If `period` is zero.
pub fn interval(period: Duration) -> Interval {
    assert!(!period.is_zero(), "an interval of no time");
    Interval { period, sleep: sleep_until(Instant::now()) }
}

impl Interval {
    /// Waits for the next tick; the time it was due.
    pub async fn tick(&mut self) -> Instant {
        (&mut self.sleep).await;
        let due = self.sleep.deadline();
        let now = Instant::now();
        let next = if now >= due + self.period { now + self.period } else { due + self.period };
        self.sleep.reset(next);
        due
    }
}

#[cfg(test)]
mod tests;
