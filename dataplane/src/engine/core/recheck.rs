//! The recheck: a core that sleeps on its queue's completion fd while it
//! has reads at the device is nudged awake when it is still in that same
//! wait a period later, and looks at the queue itself.
//!
//! A wake-up that never comes (a readiness edge lost between the kernel
//! and the event loop) must cost a batch one period, not the rest of its
//! connection's life: with every batch of a core's only client at the
//! device, no message would ever come to wake it. Reads answer long before
//! the period on any device this serves, so a healthy core is never
//! nudged, and one that finds completions after a nudge says so
//! ([`super::CoreEngine::completion_found_late`]).
//!
//! The watcher is a task of its own on the core's event loop rather than
//! a timer in the core's wait: polling a timer on every wait cost about
//! 70 instructions a read (`bench instructions`), against two stores and
//! a load here. An idle core's event loop wakes once a period for it.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;

use super::CoreMsg;

/// How long a core stays in one wait with reads at the device before it
/// is nudged; between one and two periods.
pub(super) const COMPLETIONS_RECHECK: Duration = Duration::from_millis(50);

/// The core's waits as its watcher sees them.
#[derive(Debug, Default)]
pub(super) struct WaitWatch {
    /// Counts entries into and exits from waits with reads at the device:
    /// odd while the core is in one. Written by the core alone.
    waits: AtomicU64,
    /// Raised by the watcher when it nudged the core.
    nudged: AtomicBool,
}

impl WaitWatch {
    /// The core goes to sleep with reads at the device.
    pub(super) fn enter(&self) {
        let waits = self.waits.load(Ordering::Relaxed);
        debug_assert!(waits.is_multiple_of(2), "entered a wait twice");
        self.waits.store(waits + 1, Ordering::Relaxed);
    }

    /// The core woke; whether the watcher nudged it.
    pub(super) fn leave(&self) -> bool {
        let waits = self.waits.load(Ordering::Relaxed);
        debug_assert!(!waits.is_multiple_of(2), "left a wait never entered");
        self.waits.store(waits + 1, Ordering::Relaxed);
        self.nudged.load(Ordering::Relaxed) && self.nudged.swap(false, Ordering::Relaxed)
    }
}

/// Nudges the core through its inbox whenever a tick finds it in the same
/// wait as the tick before; ends when the core's inbox closes.
pub(super) async fn watch(waits: Arc<WaitWatch>, inbox: mpsc::WeakSender<CoreMsg>) {
    let mut ticks = crate::timer::interval(COMPLETIONS_RECHECK);
    let mut seen = 0;
    loop {
        ticks.tick().await;
        let Some(inbox) = inbox.upgrade().filter(|inbox| !inbox.is_closed()) else {
            return;
        };
        let now = waits.waits.load(Ordering::Relaxed);
        if !now.is_multiple_of(2) && now == seen {
            waits.nudged.store(true, Ordering::Relaxed);
            // A full inbox wakes the core anyway.
            let _ = inbox.try_send(CoreMsg::Wake);
        }
        seen = now;
    }
}
