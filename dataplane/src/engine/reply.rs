//! Where a batch's outcome goes. A caller that waits for one batch gives a
//! one-shot channel; a connection with many batches in flight gives its
//! queue of completions and a tag per batch, so a batch allocates no
//! channel of its own (a one-shot channel is a heap allocation a batch).

use tokio::sync::{mpsc, oneshot};

use super::{BatchResult, SubmitError};

/// A batch's outcome.
pub type Outcome = Result<BatchResult, SubmitError>;

/// One batch's outcome on a connection's completion queue, with the tag
/// the connection gave the batch.
pub struct BatchCompletion {
    pub tag: u64,
    pub outcome: Outcome,
}

/// Where a batch's outcome is sent. A reply dropped unsent (a core that
/// stopped with the batch aboard) sends [`SubmitError::Shutdown`], so a
/// queue's reader never waits for a batch that is gone.
pub struct Reply(Option<To>);

enum To {
    Once(oneshot::Sender<Outcome>),
    Queue { queue: mpsc::UnboundedSender<BatchCompletion>, tag: u64 },
}

impl Reply {
    /// The outcome goes to the one receiver of `sender`.
    pub fn once(sender: oneshot::Sender<Outcome>) -> Self {
        Self(Some(To::Once(sender)))
    }

    /// The outcome goes onto `queue`, tagged `tag`.
    pub fn queued(queue: mpsc::UnboundedSender<BatchCompletion>, tag: u64) -> Self {
        Self(Some(To::Queue { queue, tag }))
    }

    /// Sends the outcome; false when nobody receives it any more (the
    /// outcome, and the slots of a result, are then dropped).
    pub fn send(mut self, outcome: Outcome) -> bool {
        match self.0.take() {
            Some(To::Once(sender)) => sender.send(outcome).is_ok(),
            Some(To::Queue { queue, tag }) => queue.send(BatchCompletion { tag, outcome }).is_ok(),
            None => false,
        }
    }

    /// Whether nobody receives the outcome any more: the requester left.
    pub fn is_closed(&self) -> bool {
        match &self.0 {
            Some(To::Once(sender)) => sender.is_closed(),
            Some(To::Queue { queue, .. }) => queue.is_closed(),
            None => true,
        }
    }
}

impl From<oneshot::Sender<Outcome>> for Reply {
    fn from(sender: oneshot::Sender<Outcome>) -> Self {
        Self::once(sender)
    }
}

impl Drop for Reply {
    fn drop(&mut self) {
        if self.0.is_some() {
            let unsent = Self(self.0.take());
            unsent.send(Err(SubmitError::Shutdown));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A queued reply tags its outcome; one dropped unsent still answers.
    #[test]
    fn queued_replies_are_tagged_and_never_lost() {
        let (queue, mut completions) = mpsc::unbounded_channel();
        assert!(Reply::queued(queue.clone(), 7).send(Err(SubmitError::UnknownDataset)));
        drop(Reply::queued(queue.clone(), 8));
        let first = completions.try_recv().expect("sent");
        assert_eq!(first.tag, 7);
        assert!(matches!(first.outcome, Err(SubmitError::UnknownDataset)));
        let dropped = completions.try_recv().expect("sent on drop");
        assert_eq!(dropped.tag, 8);
        assert!(matches!(dropped.outcome, Err(SubmitError::Shutdown)));

        let closed = Reply::queued(queue, 9);
        drop(completions);
        assert!(closed.is_closed());
        assert!(!closed.send(Err(SubmitError::Shutdown)));
    }
}
