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

use std::time::{Duration, Instant};

/// When a core last did work, and how long after that it keeps polling.
pub(super) struct PollWindow {
    window: Duration,
    last_work: Instant,
}

impl PollWindow {
    pub(super) fn new(window: Duration) -> Self {
        // Starts closed: a core that has done nothing sleeps.
        let last_work = Instant::now().checked_sub(window).unwrap_or_else(Instant::now);
        Self { window, last_work }
    }

    /// Notes that the core did work (a message handled, a completion reaped).
    pub(super) fn worked(&mut self, now: Instant) {
        self.last_work = now;
    }

    /// Whether the core should poll once more instead of sleeping.
    pub(super) fn keep_polling(&self, now: Instant) -> bool {
        !self.window.is_zero() && now.saturating_duration_since(self.last_work) < self.window
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn polls_only_within_the_window_after_work() {
        let mut poll = PollWindow::new(Duration::from_micros(50));
        let start = Instant::now();
        assert!(!poll.keep_polling(start), "a core that did nothing sleeps");
        poll.worked(start);
        assert!(poll.keep_polling(start + Duration::from_micros(49)));
        assert!(!poll.keep_polling(start + Duration::from_micros(50)));

        let never = PollWindow::new(Duration::ZERO);
        assert!(!never.keep_polling(Instant::now()), "a zero window never polls");
    }
}
