//! Deadlines that cost nothing when the work is ready at once.
//!
//! Nearly every response write goes into a socket buffer with room, and
//! under load nearly every request frame is already buffered: arming a
//! timer for those (an entry in the runtime's timer wheel, inserted and
//! removed under its lock) costs more than the work. [`within`] polls the
//! work once and arms the timer only if it would wait, so the deadline
//! still bounds every wait.

use std::future::Future;
use std::pin::pin;
use std::task::Poll;
use std::time::Duration;

use tokio::time::error::Elapsed;
use tokio::time::Instant;

/// Runs `work`; if it does not finish at once, gives it until `limit`
/// from now.
pub async fn within<F: Future>(limit: Duration, work: F) -> Result<F::Output, Elapsed> {
    at_once_or_by(work, || Instant::now() + limit).await
}

/// Runs `work`; if it does not finish at once, gives it until `at`.
pub async fn until<F: Future>(at: Instant, work: F) -> Result<F::Output, Elapsed> {
    at_once_or_by(work, || at).await
}

/// Polls `work` once; only if it waits is the deadline (read from the
/// clock, if it needs it) taken and a timer armed.
async fn at_once_or_by<F: Future>(work: F, deadline: impl FnOnce() -> Instant) -> Result<F::Output, Elapsed> {
    let mut work = pin!(work);
    match std::future::poll_fn(|cx| Poll::Ready(work.as_mut().poll(cx))).await {
        Poll::Ready(done) => Ok(done),
        Poll::Pending => tokio::time::timeout_at(deadline(), work).await,
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
        let later = tokio::time::sleep(Duration::from_millis(10));
        assert!(within(Duration::from_secs(60), later).await.is_ok());
        let at = Instant::now() + Duration::from_millis(50);
        assert!(until(at, std::future::pending::<()>()).await.is_err());
        assert!(Instant::now() >= at);
    }
}
