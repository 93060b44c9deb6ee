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
    window: Duration,
    last_heard: Option<Instant>,
}

impl PollWindow {
    /// A window that starts closed: a connection that has heard nothing
    /// sleeps.
    pub fn new(window: Duration) -> Self {
        Self { window, last_heard: None }
    }

    /// Notes a response (or any frame) from the node.
    pub fn heard(&mut self, now: Instant) {
        self.last_heard = Some(now);
    }

    /// Until when to poll, if the window is open at `now`.
    pub fn open_until(&self, now: Instant) -> Option<Instant> {
        let until = self.last_heard? + self.window;
        (!self.window.is_zero() && now < until).then_some(until)
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
