//! Where a connection's writer puts its frames: the socket ring for plain
//! TCP, or a byte stream (TLS, or plain TCP where the kernel gives no
//! io_uring). The writer's loop is written once over [`FrameSink`].

use std::future::Future;
use std::io::{self, IoSlice};

use sluice_dataplane::BatchResult;
use sluice_transport::frame::{write_all_flushed, write_all_vectored};
use tokio::io::{AsyncWrite, AsyncWriteExt};

use super::socket;

/// A connection's sending side.
pub(super) trait FrameSink: Send + 'static {
    /// Sends `frame` whole.
    fn send_frame<'a>(&'a mut self, frame: &'a [u8]) -> impl Future<Output = io::Result<()>> + Send + 'a;

    /// Sends a batch response: `head`, then the bytes of `result`'s `Ok`
    /// ranges from its DMA slots, which go back once they are sent.
    fn send_batch<'a>(
        &'a mut self,
        head: &'a [u8],
        result: BatchResult,
    ) -> impl Future<Output = io::Result<()>> + Send + 'a;

    /// Ends the sending direction after the last frame.
    fn close(&mut self) -> impl Future<Output = ()> + Send + '_;
}

impl FrameSink for socket::Writer {
    async fn send_frame<'a>(&'a mut self, frame: &'a [u8]) -> io::Result<()> {
        socket::Writer::send_frame(self, frame).await
    }

    async fn send_batch<'a>(&'a mut self, head: &'a [u8], result: BatchResult) -> io::Result<()> {
        socket::Writer::send_batch(self, head, result).await
    }

    async fn close(&mut self) {
        self.shutdown();
    }
}

/// A byte stream as a sink: a batch response is one vectored write of its
/// head and its slots' bytes.
pub(super) struct StreamSink<W> {
    writer: W,
    /// The slices of the last response, kept for the next.
    spare_slices: Vec<IoSlice<'static>>,
}

impl<W> StreamSink<W> {
    pub(super) fn new(writer: W) -> Self {
        Self { writer, spare_slices: Vec::new() }
    }
}

impl<W: AsyncWrite + Unpin + Send + 'static> FrameSink for StreamSink<W> {
    async fn send_frame<'a>(&'a mut self, frame: &'a [u8]) -> io::Result<()> {
        write_all_flushed(&mut self.writer, frame).await
    }

    async fn send_batch<'a>(&'a mut self, head: &'a [u8], result: BatchResult) -> io::Result<()> {
        // Borrows this response's head and slots, in the vector the last
        // response used.
        let mut slices = recycled(std::mem::take(&mut self.spare_slices));
        slices.reserve(1 + result.pieces_max());
        slices.push(IoSlice::new(head));
        result.for_each_ok_piece(|piece| slices.push(IoSlice::new(piece)));
        let written = write_all_vectored(&mut self.writer, &mut slices).await;
        self.spare_slices = recycled(slices);
        written
    }

    async fn close(&mut self) {
        let _ = self.writer.shutdown().await;
    }
}

/// `slices` emptied, with its allocation, for slices of another lifetime:
/// collecting a vector's own iterator reuses its buffer when the element
/// size and alignment match, as they do here.
fn recycled<'b>(mut slices: Vec<IoSlice<'_>>) -> Vec<IoSlice<'b>> {
    slices.clear();
    slices.into_iter().map(|_| unreachable!("the vector is empty")).collect()
}
