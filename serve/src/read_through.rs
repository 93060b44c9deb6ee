//! Reads of a source-backed dataset: a batch whose chunks are all on the
//! node goes to the data plane as any other; one that needs a chunk first
//! waits for its fill, off the data-plane cores and off the connection's
//! own task, and then is read.
//!
//! The node's cache tier (in the control crate) implements
//! [`ReadThrough`]; a sealed, ingested dataset has none and costs nothing
//! here.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use sluice_dataplane::{ByteRange, DataPlane, Hold, Placement, ReadBatch, SubmitError};
use sluice_proto::RangeStatus;
use tokio::sync::oneshot;

/// What a fill gives back: a status per range of the batch, `Ok` when
/// every chunk the range covers is present, and the lease that keeps them
/// so while the batch is read and answered.
pub type FillOutcome = Pin<Box<dyn Future<Output = (Vec<RangeStatus>, Option<Hold>)> + Send>>;

/// A dataset whose chunks may not all be on the node yet.
pub trait ReadThrough: std::fmt::Debug + Send + Sync + 'static {
    /// If every chunk `ranges` cover is present, a lease that keeps them
    /// from eviction until it is dropped (with the batch's result); `None`
    /// if one is missing. A check of the presence bitmap: no I/O, no lock.
    fn admit(&self, ranges: &[ByteRange]) -> Option<Hold>;

    /// Makes the chunks `ranges` cover present, fetching the missing ones
    /// from the source; one status per range, and the lease. A range past
    /// the dataset's end is `Ok` here (the data plane answers it).
    fn fill(&self, ranges: Vec<ByteRange>) -> FillOutcome;
}

/// Hands `batch` to the data plane (near its connection's core, if it is
/// placed on one: see [`DataPlane::submit_near`]), after its fill when
/// `through` says a chunk is missing.
///
/// The fill runs as a task of its own, so the connection keeps reading
/// (and other batches, of present chunks, are served meanwhile); the
/// batch's reply arrives on its `reply` as usual, with the ranges whose
/// fill failed marked with why and read as nothing.
pub async fn submit(
    plane: &Arc<DataPlane>,
    placement: Option<&Placement>,
    batch: ReadBatch,
    through: Option<&Arc<dyn ReadThrough>>,
) -> Result<(), SubmitError> {
    let Some(through) = through else { return to_core(plane, placement, batch).await };
    if let Some(lease) = through.admit(&batch.ranges) {
        return to_core(plane, placement, ReadBatch { hold: Some(lease), ..batch }).await;
    }
    let fill = through.fill(batch.ranges.clone());
    let plane = Arc::clone(plane);
    let placement = placement.cloned();
    tokio::spawn(async move {
        let ReadBatch { dataset, client_id, flow, mut ranges, reply, hold: _ } = batch;
        let (statuses, hold) = fill.await;
        assert_eq!(statuses.len(), ranges.len(), "a fill answers every range");
        for (range, status) in ranges.iter_mut().zip(&statuses) {
            if *status != RangeStatus::Ok {
                // Read as nothing; its status is set below.
                *range = ByteRange { offset_bytes: 0, len_bytes: 0 };
            }
        }
        let (inner, result) = oneshot::channel();
        if let Err(err) = to_core(
            &plane,
            placement.as_ref(),
            ReadBatch { dataset, client_id, flow, ranges, reply: inner.into(), hold },
        )
        .await
        {
            let _ = reply.send(Err(err));
            return;
        }
        let outcome = match result.await {
            Ok(Ok(mut result)) => {
                for (index, status) in statuses.iter().enumerate() {
                    if *status != RangeStatus::Ok {
                        result.fail_range(index, *status);
                    }
                }
                Ok(result)
            }
            Ok(Err(err)) => Err(err),
            Err(_) => Err(SubmitError::Shutdown),
        };
        let _ = reply.send(outcome);
    });
    Ok(())
}

async fn to_core(plane: &DataPlane, placement: Option<&Placement>, batch: ReadBatch) -> Result<(), SubmitError> {
    match placement {
        Some(placement) => plane.submit_near(placement, batch).await,
        None => plane.submit(batch).await,
    }
}
