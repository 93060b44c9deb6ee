use std::time::{Duration, Instant};

use super::*;

/// An event loop like a core's: a reactor, no tokio time driver, and the
/// core's timers.
fn core_runtime() -> tokio::runtime::Runtime {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_io().build().expect("runtime");
    install(&runtime).expect("core timers");
    runtime
}

/// Runs `work` on a fresh core-like event loop on a thread of its own (the
/// timers are the thread's), and drops the timers after.
fn on_core<T: Send + 'static>(work: impl Future<Output = T> + Send + 'static) -> T {
    std::thread::spawn(move || {
        let runtime = core_runtime();
        let done = runtime.block_on(work);
        drop(runtime);
        uninstall();
        done
    })
    .join()
    .expect("core thread")
}

fn table_len() -> usize {
    with_core_timers(|timers| timers.entries.len()).expect("on a core")
}

/// Sleeps end at their deadlines and no sooner, whatever the order they
/// were armed in.
#[test]
fn sleeps_end_at_their_deadlines_never_sooner() {
    on_core(async {
        let start = Instant::now();
        let sleeps = [60u64, 20, 40].map(|ms| {
            tokio::spawn(async move {
                let deadline = start + Duration::from_millis(ms);
                sleep_until(deadline).await;
                assert!(Instant::now() >= deadline, "woke before the deadline");
            })
        });
        for sleep in sleeps {
            sleep.await.expect("sleeper");
        }
    });
}

/// A deadline already passed completes on the first poll, with no entry.
#[test]
fn a_passed_deadline_is_ready_at_once() {
    on_core(async {
        sleep_until(Instant::now() - Duration::from_millis(5)).await;
        sleep(Duration::ZERO).await;
        assert_eq!(table_len(), 0);
    });
}

/// A timer moved sooner fires at the new time; moved later, it fires
/// at the later one, not the first (the fd armed for it fires early and is
/// armed again).
#[test]
fn a_moved_timer_fires_at_its_new_deadline() {
    on_core(async {
        let start = Instant::now();
        let mut timer = sleep_until(start + Duration::from_secs(60));
        let sooner = start + Duration::from_millis(20);
        assert!(timeout_at(sooner, &mut timer).await.is_err(), "not yet at its first deadline");
        timer.reset(sooner + Duration::from_millis(10));
        (&mut timer).await;
        assert!(Instant::now() >= sooner + Duration::from_millis(10));
        assert!(Instant::now() < start + Duration::from_secs(30), "fired at the moved deadline");

        // Armed far off, moved in (the fd is armed for that), then moved
        // out again before it fires.
        let mut timer = sleep(Duration::from_secs(60));
        std::future::poll_fn(|cx| {
            assert!(Pin::new(&mut timer).poll(cx).is_pending());
            Poll::Ready(())
        })
        .await;
        timer.reset(Instant::now() + Duration::from_millis(10));
        let later = Instant::now() + Duration::from_millis(60);
        timer.reset(later);
        (&mut timer).await;
        assert!(Instant::now() >= later, "fired at the old deadline");
    });
}

/// A dropped timer gives its place back, and a later timer takes it: the
/// table holds as many places as timers ever waited at once.
#[test]
fn dropped_timers_give_their_places_back() {
    on_core(async {
        for _ in 0..100 {
            let waited = timeout(Duration::from_millis(1), std::future::pending::<()>()).await;
            assert_eq!(waited, Err(Elapsed));
        }
        assert_eq!(table_len(), 1);
        let far = Instant::now() + Duration::from_secs(60);
        let (a, b) = (sleep_until(far), sleep_until(far));
        assert!(timeout(Duration::from_millis(5), async { tokio::join!(a, b) }).await.is_err());
        assert_eq!(table_len(), 3, "the timeout's own timer and the two");
    });
}

/// Ready work finishes even at a deadline already passed; pending work is
/// cut off at its deadline.
#[test]
fn timeouts_let_ready_work_finish_and_cut_off_the_rest() {
    on_core(async {
        assert_eq!(timeout_at(Instant::now() - Duration::from_secs(1), async { 7 }).await, Ok(7));
        let start = Instant::now();
        assert_eq!(timeout(Duration::from_millis(15), std::future::pending::<()>()).await, Err(Elapsed));
        assert!(start.elapsed() >= Duration::from_millis(15));
    });
}

/// An interval ticks at once, then a period apart; a late tick moves the
/// next a period past it rather than bursting.
#[test]
fn an_interval_ticks_a_period_apart_and_never_bursts() {
    on_core(async {
        let period = Duration::from_millis(20);
        let mut ticks = interval(period);
        let first = ticks.tick().await;
        let second = ticks.tick().await;
        assert_eq!(second - first, period);
        std::thread::sleep(period * 3);
        let late = ticks.tick().await;
        assert_eq!(late, second + period, "the missed tick, late");
        // A burst would make the next tick due a period after the late
        // one, long past; it is due a period after the late one was taken.
        let next = ticks.tick().await;
        assert!(next >= second + period * 4, "no burst after a late tick");
    });
}

/// A sleep made on another thread and awaited on a core uses the core's
/// timers (this event loop has no tokio timers to use).
#[test]
fn a_sleep_made_elsewhere_runs_on_the_core_that_polls_it() {
    let mut timer = sleep(Duration::from_secs(60));
    on_core(async move {
        assert_eq!(timeout(Duration::from_millis(5), &mut timer).await, Err(Elapsed));
        assert!(matches!(timer.state, SleepState::Core(_)), "on the core's table");
        timer.reset(Instant::now());
        timer.await;
    });
}

/// Off a core, the same calls use tokio's timers.
#[test]
fn off_a_core_tokio_times_them() {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_time().build().expect("runtime");
    runtime.block_on(async {
        let start = Instant::now();
        assert_eq!(timeout(Duration::from_millis(10), std::future::pending::<()>()).await, Err(Elapsed));
        let mut ticks = interval(Duration::from_millis(5));
        ticks.tick().await;
        ticks.tick().await;
        assert!(start.elapsed() >= Duration::from_millis(15));
        assert!(with_core_timers(|_| ()).is_none());
    });
}
