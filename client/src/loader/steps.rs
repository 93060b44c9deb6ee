//! A loader's schedule: which steps it reads, the steps in flight, and
//! the steps ahead it has told the node of.

use std::collections::VecDeque;

use tokio::task::JoinHandle;

use super::{LoaderError, PREFETCH_MAX};

/// Which steps a loader reads: `first`, `first + stride`, ... up to (not
/// including) `end`. DataLoader worker `w` of `W` reads steps `w, w + W,
/// ...`: the workers' batches taken in worker order, as a DataLoader takes
/// them, are the steps in order, so no step is read twice or skipped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StepSchedule {
    pub first: u64,
    pub stride: u64,
    pub end: Option<u64>,
}

impl StepSchedule {
    /// Every step from `first` on.
    pub fn from(first: u64) -> Self {
        Self { first, stride: 1, end: None }
    }

    fn after(&self, step: u64) -> u64 {
        step.saturating_add(self.stride.max(1))
    }

    fn includes(&self, step: u64) -> bool {
        self.end.is_none_or(|end| step < end)
    }
}

/// Where a loader's schedule stands: the next step to read and the steps
/// read ahead. Both loaders keep one.
pub(super) struct Steps<T> {
    schedule: StepSchedule,
    next_issue: u64,
    in_flight: Prefetch<T>,
    /// Steps ahead of the next read whose ranges are told to the node.
    pub(super) hint_steps: usize,
    /// Steps before this were hinted already.
    hinted_to: u64,
}

impl<T> Steps<T> {
    pub(super) fn new(first: u64, prefetch: usize) -> Self {
        Self {
            schedule: StepSchedule::from(first),
            next_issue: first,
            in_flight: Prefetch::new(prefetch),
            hint_steps: 0,
            hinted_to: first,
        }
    }

    /// The steps of the next `hint_steps` not hinted yet.
    pub(super) fn take_hint(&mut self) -> Vec<u64> {
        let mut steps = Vec::new();
        let mut step = self.next_issue;
        for _ in 0..self.hint_steps {
            if !self.schedule.includes(step) {
                break;
            }
            if step >= self.hinted_to {
                steps.push(step);
            }
            step = self.schedule.after(step);
        }
        self.hinted_to = self.hinted_to.max(step);
        steps
    }

    pub(super) fn set(&mut self, schedule: StepSchedule) {
        self.in_flight.clear();
        self.schedule = schedule;
        self.next_issue = schedule.first;
        self.hinted_to = schedule.first;
    }

    pub(super) fn finished(&self) -> bool {
        self.in_flight.is_empty() && !self.schedule.includes(self.next_issue)
    }

    /// The next step to read, if the schedule has one and the read-ahead
    /// depth allows it.
    pub(super) fn to_issue(&self) -> Option<u64> {
        (self.in_flight.wants_more() && self.schedule.includes(self.next_issue)).then_some(self.next_issue)
    }

    pub(super) fn issued(&mut self, step: u64, task: JoinHandle<Result<T, LoaderError>>) {
        self.in_flight.push(task);
        self.next_issue = self.schedule.after(step);
    }

    /// The oldest step read ahead; `End` once the schedule is done.
    pub(super) async fn next(&mut self) -> Result<T, LoaderError> {
        if self.in_flight.is_empty() {
            return Err(LoaderError::End(self.next_issue));
        }
        self.in_flight.next().await
    }
}

/// Steps read ahead, in order; aborted when dropped.
struct Prefetch<T> {
    depth: usize,
    tasks: VecDeque<JoinHandle<Result<T, LoaderError>>>,
}

impl<T> Prefetch<T> {
    fn new(depth: usize) -> Self {
        let depth = depth.clamp(1, PREFETCH_MAX);
        Self { depth, tasks: VecDeque::with_capacity(depth) }
    }

    fn wants_more(&self) -> bool {
        self.tasks.len() < self.depth
    }

    fn is_empty(&self) -> bool {
        self.tasks.is_empty()
    }

    /// Drops (aborts) every step read ahead.
    fn clear(&mut self) {
        for task in self.tasks.drain(..) {
            task.abort();
        }
    }

    fn push(&mut self, task: JoinHandle<Result<T, LoaderError>>) {
        assert!(self.tasks.len() < self.depth, "prefetch beyond its depth");
        self.tasks.push_back(task);
    }

    async fn next(&mut self) -> Result<T, LoaderError> {
        let task = self.tasks.pop_front().expect("at least one step in flight");
        task.await.map_err(|e| LoaderError::Task(e.to_string()))?
    }
}

impl<T> Drop for Prefetch<T> {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}
