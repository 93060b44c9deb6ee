//! Adaptive polling on the client: a connection that heard from its node a
//! moment ago keeps looking for the next response before it lets its thread
//! sleep.
//!
//! A queue-depth-1 reader asks again as soon as an answer comes back, and
//! the next answer is one round trip away: tens of microseconds on a fast
//! network, about what it costs a virtual machine to wake a thread that
//! slept in `epoll_wait`. Within the window after its last response the
//! connection's reader yields to its runtime instead of sleeping (each
//! yield lets the runtime poll its sockets without blocking), so the answer
//! is read by a thread that is already running. The node's cores do the
//! same for their requests (`--poll-window-us`). The window is bounded and
//! counts from the last response, so a connection with nothing in flight
//! sleeps as before and an idle client uses no CPU.
//!
//! The window adapts to the stream it serves. A reader whose answers come
//! a little further apart than the set window (a queue-depth-1 reader of a
//! device that takes 100 µs, say) would stop polling just before each
//! answer arrives and pay the wake-up every time; a reader whose answers
//! come far apart (a batch of 32 direct reads, every 600 µs) gains nothing
//! from polling and takes CPU the node and the job need (on a 2-core host
//! a 50 µs poll after each such batch cost it 8–12% of its IOPS). So the
//! connection keeps a running mean of the gaps between its responses and
//! polls for half as long again as that mean, never less than the set
//! window; when that is more than [`POLL_ADAPT_MAX`] (or the set window,
//! if longer) the answers are too far apart to poll for, and it sleeps.

use std::future::Future;
use std::pin::Pin;
use std::task::Poll;
use std::time::{Duration, Instant};

/// How long a connection polls after its last response, unless the client
/// is told otherwise ([`POLL_WINDOW_ENV`]).
pub const POLL_WINDOW_DEFAULT: Duration = Duration::from_micros(50);

/// The longest window a client may ask for: polling is for the gap of one
/// round trip, and a longer window only burns the CPU the training job
/// needs.
pub const POLL_WINDOW_MAX: Duration = Duration::from_millis(10);

/// The longest a connection stretches its window to cover the gaps between
/// its responses: about one NVMe read and one network round trip.
pub const POLL_ADAPT_MAX: Duration = Duration::from_micros(250);

/// Microseconds a connection polls after its last response; 0 turns
/// polling off.
pub const POLL_WINDOW_ENV: &str = "SLUICE_POLL_WINDOW_US";

/// The window [`POLL_WINDOW_ENV`] asks for, else the default.
///
/// # Errors
/// The variable is set but is not a whole number of microseconds.
pub fn window_from_env() -> Result<Duration, String> {
    match std::env::var(POLL_WINDOW_ENV) {
        Err(_) => Ok(POLL_WINDOW_DEFAULT),
        Ok(text) => parse_window(&text),
    }
}

/// A window of `text` microseconds, at most [`POLL_WINDOW_MAX`].
fn parse_window(text: &str) -> Result<Duration, String> {
    let micros: u64 =
        text.trim().parse().map_err(|_| format!("{POLL_WINDOW_ENV}={text}: not a whole number of microseconds"))?;
    let window = Duration::from_micros(micros);
    if window > POLL_WINDOW_MAX {
        return Err(format!(
            "{POLL_WINDOW_ENV}={text}: more than the {} µs a client may poll",
            POLL_WINDOW_MAX.as_micros()
        ));
    }
    Ok(window)
}

/// When a connection last heard from its node, and how long after that it
/// polls.
#[derive(Clone, Copy, Debug)]
pub struct PollWindow {
    /// The set window: the least the connection polls after a response.
    window: Duration,
    last_heard: Option<Instant>,
    /// Running mean of the gaps between responses, in nanoseconds, each
    /// gap taken at most twice the longest window polled for (so one pause
    /// is forgotten after a response or two) and weighing a quarter.
    mean_gap_nanos: u64,
}

impl PollWindow {
    /// A window that starts closed: a connection that has heard nothing
    /// sleeps.
    pub fn new(window: Duration) -> Self {
        Self { window, last_heard: None, mean_gap_nanos: 0 }
    }

    /// Notes a response (or any frame) from the node.
    pub fn heard(&mut self, now: Instant) {
        if let Some(last) = self.last_heard {
            let gap = now.saturating_duration_since(last).min(2 * self.longest());
            let gap = u64::try_from(gap.as_nanos()).unwrap_or(u64::MAX);
            self.mean_gap_nanos = if self.mean_gap_nanos == 0 { gap } else { (3 * self.mean_gap_nanos + gap) / 4 };
        }
        self.last_heard = Some(now);
    }

    /// The longest the connection polls after a response.
    fn longest(&self) -> Duration {
        self.window.max(POLL_ADAPT_MAX)
    }

    /// How long the connection polls after a response now: the set window,
    /// stretched to half as long again as the mean gap between responses;
    /// nothing when that is longer than `Self::longest`.
    pub fn current(&self) -> Duration {
        if self.window.is_zero() {
            return Duration::ZERO;
        }
        let stretched = Duration::from_nanos(self.mean_gap_nanos + self.mean_gap_nanos / 2);
        if stretched > self.longest() {
            return Duration::ZERO;
        }
        self.window.max(stretched)
    }

    /// Until when to poll, if the window is open at `now`.
    pub fn open_until(&self, now: Instant) -> Option<Instant> {
        let window = self.current();
        let until = self.last_heard? + window;
        (!window.is_zero() && now < until).then_some(until)
    }
}

/// Runs `work` to completion, polling it (yielding to the runtime between
/// polls, never sleeping) until `until`, and from then on waiting for it
/// as usual. `work` is never dropped half-done, so a read that is not
/// cancel-safe may be polled this way.
pub async fn polling<F: Future>(work: F, until: Option<Instant>) -> F::Output {
    let mut work = std::pin::pin!(work);
    if let Some(until) = until {
        loop {
            if let Poll::Ready(done) = poll_once(work.as_mut()).await {
                return done;
            }
            if Instant::now() >= until {
                break;
            }
            // Deferred by the runtime until it has polled its I/O driver
            // without blocking: that poll is what notices the response.
            tokio::task::yield_now().await;
        }
    }
    work.await
}

/// Polls `work` once with this task's waker.
async fn poll_once<F: Future>(work: Pin<&mut F>) -> Poll<F::Output> {
    let mut work = Some(work);
    std::future::poll_fn(move |cx| match work.take() {
        Some(work) => Poll::Ready(work.poll(cx)),
        None => unreachable!("polled again after it returned"),
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_window_opens_only_after_a_response_and_closes_after_it() {
        let mut poll = PollWindow::new(Duration::from_micros(50));
        let start = Instant::now();
        assert_eq!(poll.open_until(start), None, "a connection that heard nothing sleeps");
        poll.heard(start);
        assert_eq!(poll.open_until(start + Duration::from_micros(49)), Some(start + Duration::from_micros(50)));
        assert_eq!(poll.open_until(start + Duration::from_micros(50)), None);

        let mut never = PollWindow::new(Duration::ZERO);
        never.heard(start);
        assert_eq!(never.open_until(start), None, "a zero window never polls");
    }

    #[test]
    fn the_window_stretches_to_cover_the_gaps_of_a_steady_stream_within_the_bound() {
        let start = Instant::now();
        let at = |micros: u64| start + Duration::from_micros(micros);
        let mut poll = PollWindow::new(Duration::from_micros(50));
        // Answers 120 µs apart (a queue-depth-1 reader of a slow device):
        // the window grows past the gap, so the next answer is polled for.
        for i in 0..20 {
            poll.heard(at(120 * i));
        }
        assert_eq!(poll.current(), Duration::from_micros(180));
        assert!(poll.open_until(at(120 * 19 + 119)).is_some(), "the next answer falls inside the window");
        // Answers 20 µs apart: the set window is the floor.
        for i in 0..40 {
            poll.heard(at(10_000 + 20 * i));
        }
        assert_eq!(poll.current(), Duration::from_micros(50));
        // Answers 600 µs apart (batches of direct reads): too far apart
        // to poll for, so the connection sleeps between them.
        let mut far = PollWindow::new(Duration::from_micros(50));
        for i in 0..20 {
            far.heard(at(600 * i));
        }
        assert_eq!(far.current(), Duration::ZERO);
        assert_eq!(far.open_until(at(600 * 19 + 1)), None);
        // One pause in a fast stream does not stop the polling, and is
        // forgotten within a few responses.
        let mut paused = PollWindow::new(Duration::from_micros(50));
        for i in 0..20 {
            paused.heard(at(20 * i));
        }
        paused.heard(at(1_000_000));
        assert!(paused.current() > Duration::ZERO && paused.current() <= POLL_ADAPT_MAX, "{:?}", paused.current());
        for i in 1..=10 {
            paused.heard(at(1_000_000 + 20 * i));
        }
        assert_eq!(paused.current(), Duration::from_micros(50));
        // The longest stretch is the bound.
        let mut steady_slow = PollWindow::new(Duration::from_micros(50));
        for i in 0..20 {
            steady_slow.heard(at(160 * i));
        }
        assert_eq!(steady_slow.current(), Duration::from_micros(240));
        // A longer set window is honoured as set: answers 600 µs apart are
        // then polled for.
        let mut long = PollWindow::new(Duration::from_millis(1));
        for i in 0..20 {
            long.heard(at(600 * i));
        }
        assert_eq!(long.current(), Duration::from_millis(1));
        // A zero window stays off whatever the stream.
        let mut off = PollWindow::new(Duration::ZERO);
        for i in 0..20 {
            off.heard(at(100 * i));
        }
        assert_eq!(off.current(), Duration::ZERO);
        assert_eq!(off.open_until(at(1_900)), None);
    }

    #[test]
    fn the_window_setting_is_whole_microseconds_within_the_bound() {
        assert_eq!(parse_window("0"), Ok(Duration::ZERO), "0 turns polling off");
        assert_eq!(parse_window(" 75 "), Ok(Duration::from_micros(75)));
        assert_eq!(parse_window("10000"), Ok(POLL_WINDOW_MAX));
        for bad in ["", "-1", "1.5", "50us", "10001"] {
            let err = parse_window(bad).expect_err(bad);
            assert!(err.starts_with(&format!("{POLL_WINDOW_ENV}={bad}:")), "{err}");
        }
    }

    #[tokio::test(flavor = "current_thread")]
    async fn polling_finishes_work_that_is_ready_late_and_keeps_its_progress() {
        // A reader that gets its bytes in two parts, the second well after
        // the window: the first part read while polling is not lost.
        let (mut tx, rx) = tokio::io::duplex(64);
        let mut rx = tokio::io::BufReader::new(rx);
        let writer = tokio::spawn(async move {
            use tokio::io::AsyncWriteExt;
            tx.write_all(b"head").await.expect("write");
            tokio::time::sleep(Duration::from_millis(20)).await;
            tx.write_all(b"tail").await.expect("write");
            tx
        });
        let mut bytes = [0u8; 8];
        let read = async {
            use tokio::io::AsyncReadExt;
            rx.read_exact(&mut bytes).await
        };
        let until = Instant::now() + Duration::from_millis(2);
        polling(read, Some(until)).await.expect("read");
        assert_eq!(&bytes, b"headtail");
        let _tx = writer.await.expect("writer");
    }

    #[tokio::test(flavor = "current_thread")]
    async fn polling_lets_other_tasks_run() {
        // On one thread, the work becomes ready only when another task
        // runs: polling must yield to it, not spin in place.
        let (tx, rx) = tokio::sync::oneshot::channel();
        tokio::spawn(async move { tx.send(7).expect("send") });
        let until = Instant::now() + Duration::from_secs(10);
        let started = Instant::now();
        assert_eq!(polling(rx, Some(until)).await.expect("value"), 7);
        assert!(started.elapsed() < Duration::from_secs(10), "the other task ran within the window");
    }
}
