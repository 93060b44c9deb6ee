//! Adaptive polling: a core that did work a moment ago keeps looking for
//! more before it sleeps.
//!
//! A queue-depth-1 client sends its next batch a round trip after the last
//! answer. Were the core to park at once, every batch would pay a wake-up
//! (tens of microseconds on a virtual machine, more than the read itself)
//! on the way in and another when the core waited in the kernel for its
//! completion. Within the window after its last work the core spins on its
//! inbox and completion queue instead. The window is bounded, and a core
//! with no recent work parks as before, so idle cores use no CPU.
//!
//! Spinning cores never take every CPU the node may run on: at most one
//! fewer than that poll at once ([`PollerSlots`]), so a CPU is left to
//! whatever else must run for the next request to come (the control
//! plane, the kernel's network work, a client on the same host). Where
//! two cores shared a 2-vCPU host with their client, both spinning took
//! the CPU the client needed to answer: page-cache 8 × 4 batches read
//! 1.29× faster with one of them polling than with both. On a one-CPU
//! host one core still polls, as every core did before the limit: there
//! is no other CPU to leave, and its core is preempted for a woken thread
//! like any other.
//!
//! While the core's reads are at the device, the wait is for the device,
//! not the client, so the window stretches to how long the core's batches
//! have lately taken from admission to answer (a moving average), at most
//! [`DEVICE_POLL_MAX`]: a core that slept through a 300 µs device read
//! paid a wake-up (~25 µs on this kind of VM) for each completion that
//! found it asleep, and with several batches in flight that was most of
//! them. A device slower than the bound (a disk, a throttled volume)
//! still lets the core sleep, and a zero window still never polls.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The longest a core polls while its reads are at the device, however
/// slow its batches have been: past it a core sleeps, as for a device
/// whose reads take milliseconds polling would spin through each.
pub(super) const DEVICE_POLL_MAX: Duration = Duration::from_millis(1);

/// How many of a data plane's cores may poll at once: one fewer than the
/// CPUs the node may run on, and at least one.
pub(crate) struct PollerSlots {
    polling: AtomicUsize,
    max: usize,
}

impl PollerSlots {
    /// Slots for a node that may run on `cpus` CPUs: one fewer, and at
    /// least one.
    pub(crate) fn for_cpus(cpus: usize) -> Arc<Self> {
        Arc::new(Self { polling: AtomicUsize::new(0), max: cpus.saturating_sub(1).max(1) })
    }

    fn take(&self) -> bool {
        self.polling.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| (n < self.max).then_some(n + 1)).is_ok()
    }

    fn give_back(&self) {
        let before = self.polling.fetch_sub(1, Ordering::AcqRel);
        assert!(before > 0, "a poller slot given back twice");
    }
}

/// When a core last did work, how long after that it keeps polling, and
/// its place among the cores polling.
pub(super) struct PollWindow {
    window: Duration,
    /// Moving average (weight 1/8 a batch) of the core's batches' time from
    /// admission to answer, in nanoseconds: how long its reads are at the
    /// device, and so how long polling while they are waits at most.
    batch_ns_average: u64,
    last_work: Instant,
    slots: Arc<PollerSlots>,
    /// Holds one of `slots`: from the first turn it polls until it sleeps.
    polling: bool,
}

impl PollWindow {
    pub(super) fn new(window: Duration, slots: Arc<PollerSlots>) -> Self {
        // Starts closed: a core that has done nothing sleeps.
        let last_work = Instant::now().checked_sub(window).unwrap_or_else(Instant::now);
        Self { window, batch_ns_average: 0, last_work, slots, polling: false }
    }

    /// Notes that a batch took `ns` from admission to its answer.
    pub(super) fn batch_took(&mut self, ns: u64) {
        self.batch_ns_average = self.batch_ns_average - self.batch_ns_average / 8 + ns / 8;
    }

    /// How long after its last work the core polls: the window, or while
    /// reads are at the device, as long as its batches have lately taken
    /// (a quarter more, for their spread), bounded by [`DEVICE_POLL_MAX`].
    /// Zero (no polling) stays zero.
    fn window(&self, reads_in_flight: bool) -> Duration {
        if !reads_in_flight || self.window.is_zero() {
            return self.window;
        }
        let device = Duration::from_nanos(self.batch_ns_average.saturating_add(self.batch_ns_average / 4));
        self.window.max(device.min(DEVICE_POLL_MAX))
    }

    /// Notes that the core did work (a message handled, a completion reaped).
    pub(super) fn worked(&mut self, now: Instant) {
        self.last_work = now;
    }

    /// Whether the core should poll once more instead of sleeping: within
    /// the window after its work (stretched while `reads_in_flight`), and
    /// with a poller slot (kept until it sleeps).
    pub(super) fn keep_polling(&mut self, now: Instant, reads_in_flight: bool) -> bool {
        let window = self.window(reads_in_flight);
        let within = !window.is_zero() && now.saturating_duration_since(self.last_work) < window;
        if !within {
            self.stop_polling();
        } else if !self.polling {
            self.polling = self.slots.take();
        }
        self.polling
    }

    fn stop_polling(&mut self) {
        if std::mem::take(&mut self.polling) {
            self.slots.give_back();
        }
    }
}

impl Drop for PollWindow {
    fn drop(&mut self) {
        self.stop_polling();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn polls_only_within_the_window_after_work() {
        let mut poll = PollWindow::new(Duration::from_micros(50), PollerSlots::for_cpus(2));
        let start = Instant::now();
        assert!(!poll.keep_polling(start, false), "a core that did nothing sleeps");
        poll.worked(start);
        assert!(poll.keep_polling(start + Duration::from_micros(49), false));
        assert!(!poll.keep_polling(start + Duration::from_micros(50), false));

        let mut never = PollWindow::new(Duration::ZERO, PollerSlots::for_cpus(2));
        assert!(!never.keep_polling(Instant::now(), false), "a zero window never polls");
    }

    #[test]
    fn reads_at_the_device_stretch_the_window_to_the_batches_time() {
        let mut poll = PollWindow::new(Duration::from_micros(100), PollerSlots::for_cpus(2));
        for _ in 0..64 {
            poll.batch_took(400_000);
        }
        let start = Instant::now();
        poll.worked(start);
        let later = start + Duration::from_micros(450);
        assert!(poll.keep_polling(later, true), "batches of ~400 µs: a core with reads out polls through one");
        assert!(!poll.keep_polling(later, false), "with none out it waits for its client's next only 100 µs");
        assert!(
            !poll.keep_polling(start + Duration::from_micros(520), true),
            "a quarter past the batches' time it sleeps"
        );

        for _ in 0..64 {
            poll.batch_took(20_000_000);
        }
        assert!(poll.keep_polling(start + DEVICE_POLL_MAX - Duration::from_micros(1), true));
        assert!(!poll.keep_polling(start + DEVICE_POLL_MAX, true), "a slow device's reads are slept through");

        let mut fast = PollWindow::new(Duration::from_micros(100), PollerSlots::for_cpus(2));
        fast.batch_took(10_000);
        fast.worked(start);
        assert!(fast.keep_polling(start + Duration::from_micros(99), true), "never less than the window");

        let mut never = PollWindow::new(Duration::ZERO, PollerSlots::for_cpus(2));
        never.batch_took(400_000);
        never.worked(start);
        assert!(!never.keep_polling(start, true), "a zero window never polls, reads out or not");
    }

    #[test]
    fn cores_poll_on_one_fewer_cpus_than_the_node_has() {
        let slots = PollerSlots::for_cpus(2);
        let window = Duration::from_micros(100);
        let (mut first, mut second) =
            (PollWindow::new(window, Arc::clone(&slots)), PollWindow::new(window, Arc::clone(&slots)));
        let now = Instant::now();
        first.worked(now);
        second.worked(now);
        assert!(first.keep_polling(now, false));
        assert!(first.keep_polling(now, false), "a polling core keeps its slot");
        assert!(!second.keep_polling(now, false), "the other CPU is left to the rest");
        assert!(!first.keep_polling(now + window, false), "past its window the first sleeps and gives its slot back");
        assert!(second.keep_polling(now, false), "now the second may poll");
        drop(second);
        assert_eq!(slots.polling.load(Ordering::Relaxed), 0, "a stopped core gives its slot back");

        let one_cpu = PollerSlots::for_cpus(1);
        let (mut first, mut second) = (PollWindow::new(window, Arc::clone(&one_cpu)), PollWindow::new(window, one_cpu));
        first.worked(now);
        second.worked(now);
        assert!(first.keep_polling(now, false), "on one CPU one core still polls");
        assert!(!second.keep_polling(now, false), "and only one");
    }
}
