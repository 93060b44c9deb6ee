//! Deadlines that cost nothing when the work is ready at once.
//!
//! The timers are the core's own ([`sluice_dataplane::timer`]) on a
//! data-plane core, tokio's elsewhere.
//!
//! Nearly every response write goes into a socket buffer with room, and
//! under load nearly every request frame is already buffered: arming a
//! timer for those (an entry in the core's timer table, taken and freed,
//! and a clock read) costs more than the work. [`within`] polls the
//! work once and arms the timer only if it would wait, so the deadline
//! still bounds every wait.
//!
//! A connection that waits for its next request waits nearly every time
//! (a queue-depth-1 client sends it a round trip later), so there
//! [`Lazy`] keeps one timer across waits and moves it only when a
//! deadline comes sooner than it: a timer armed afresh for each wait, the
//! soonest on the core, re-arms the core's timerfd (a syscall) every
//! time.

use std::future::Future;
use std::pin::{pin, Pin};
use std::task::Poll;
use std::time::{Duration, Instant};

use sluice_dataplane::timer::{self, Elapsed, Sleep};

/// Runs `work`; if it does not finish at once, gives it until `limit`
/// from now (the clock is read, and a timer armed, only then).
pub async fn within<F: Future>(limit: Duration, work: F) -> Result<F::Output, Elapsed> {
    let mut work = pin!(work);
    match poll_once(work.as_mut()).await {
        Poll::Ready(done) => Ok(done),
        Poll::Pending => timer::timeout_at(Instant::now() + limit, work).await,
    }
}

/// Polls `work` once.
async fn poll_once<F: Future>(mut work: Pin<&mut F>) -> Poll<F::Output> {
    std::future::poll_fn(|cx| Poll::Ready(work.as_mut().poll(cx))).await
}

/// One timer kept across a series of waits (a connection's requests),
/// each bounded by its own deadline.
#[derive(Default)]
pub struct Lazy {
    /// Never later than the deadline of the wait under way; earlier after
    /// a deadline moved on, when it fires early and is moved once.
    timer: Option<Sleep>,
}

impl Lazy {
    /// Runs `work`; if it does not finish at once, gives it until `at`.
    /// `None` when `at` passed first.
    pub async fn until<F: Future>(&mut self, at: Instant, work: F) -> Option<F::Output> {
        let mut work = pin!(work);
        if let Poll::Ready(done) = poll_once(work.as_mut()).await {
            return Some(done);
        }
        let timer = match &mut self.timer {
            Some(timer) => {
                if timer.deadline() > at {
                    timer.reset(at);
                }
                timer
            }
            None => self.timer.insert(timer::sleep_until(at)),
        };
        loop {
            tokio::select! {
                biased;
                done = &mut work => return Some(done),
                () = &mut *timer => {
                    if Instant::now() >= at {
                        return None;
                    }
                    // Armed for an earlier wait's deadline: move it on.
                    timer.reset(at);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Ready work finishes; waiting work finishes within its deadline or
    /// is cut off at it.
    #[tokio::test]
    async fn ready_work_finishes_and_waiting_work_is_cut_off_at_its_deadline() {
        assert_eq!(within(Duration::from_millis(50), async { 7 }).await.ok(), Some(7));
        let never = std::future::pending::<()>();
        assert!(within(Duration::from_millis(50), never).await.is_err());
        let later = timer::sleep(Duration::from_millis(10));
        assert!(within(Duration::from_secs(60), later).await.is_ok());
    }

    /// A kept timer bounds each wait by that wait's own deadline, sooner
    /// or later than the last one's.
    #[tokio::test]
    async fn a_kept_timer_bounds_each_wait_by_its_own_deadline() {
        let mut lazy = Lazy::default();
        assert_eq!(lazy.until(Instant::now(), async { 7 }).await, Some(7), "ready work finishes");
        let soon = Instant::now() + Duration::from_millis(30);
        assert_eq!(lazy.until(soon, std::future::pending::<()>()).await, None);
        assert!(Instant::now() >= soon);
        // Later than the timer: it fires early and is moved on, not obeyed.
        let later = Instant::now() + Duration::from_millis(80);
        let work = timer::sleep(Duration::from_millis(40));
        assert!(lazy.until(later, work).await.is_some(), "work due before its deadline finishes");
        assert_eq!(lazy.until(later, std::future::pending::<()>()).await, None);
        assert!(Instant::now() >= later);
        // Sooner than the timer: it is moved in.
        let far = Instant::now() + Duration::from_secs(60);
        assert!(lazy.until(far, timer::sleep(Duration::from_millis(5))).await.is_some());
        let sooner = Instant::now() + Duration::from_millis(20);
        assert_eq!(lazy.until(sooner, std::future::pending::<()>()).await, None);
        assert!(Instant::now() >= sooner && Instant::now() < far);
    }
}
