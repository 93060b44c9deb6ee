//! Frames on a byte stream, as both ends of the TCP transport (and the
//! RDMA transport's control messages) write and read them.

use std::io::{self, IoSlice};

use tokio::io::{AsyncWrite, AsyncWriteExt};

/// Most iovecs handed to one `writev` (Linux's IOV_MAX).
const IOV_MAX: usize = 1024;

/// Writes every slice, however many, however short the kernel's writes,
/// then flushes (see [`write_all_flushed`]).
pub async fn write_all_vectored<W: AsyncWrite + Unpin>(
    writer: &mut W,
    mut slices: &mut [IoSlice<'_>],
) -> io::Result<()> {
    IoSlice::advance_slices(&mut slices, 0);
    while !slices.is_empty() {
        let take = slices.len().min(IOV_MAX);
        let written = writer.write_vectored(&slices[..take]).await?;
        if written == 0 {
            return Err(io::ErrorKind::WriteZero.into());
        }
        IoSlice::advance_slices(&mut slices, written);
    }
    writer.flush().await
}

/// Writes a whole frame and flushes it. On plain TCP the flush costs
/// nothing; over TLS, a write the socket could not take whole leaves
/// records buffered in the session, and only a flush sends them: without
/// it a frame can wait for the next write, which may never come.
pub async fn write_all_flushed<W: AsyncWrite + Unpin>(writer: &mut W, frame: &[u8]) -> io::Result<()> {
    writer.write_all(frame).await?;
    writer.flush().await
}

/// Reads the next frame header; `None` when the peer closed the stream
/// cleanly between frames.
pub async fn read_frame_header<R: tokio::io::AsyncRead + Unpin>(
    reader: &mut R,
) -> io::Result<Option<[u8; sluice_proto::wire::FrameHeader::SIZE]>> {
    let mut header = [0u8; sluice_proto::wire::FrameHeader::SIZE];
    match tokio::io::AsyncReadExt::read_exact(reader, &mut header).await {
        Ok(_) => Ok(Some(header)),
        Err(err) if err.kind() == io::ErrorKind::UnexpectedEof => Ok(None),
        Err(err) => Err(err),
    }
}

/// Encodes a control message as a whole frame.
pub fn control_frame(message: &sluice_proto::ControlMessage) -> Vec<u8> {
    use zerocopy::IntoBytes;
    let payload = sluice_proto::codec::encode(message).unwrap_or_default();
    let mut frame = Vec::with_capacity(sluice_proto::wire::FrameHeader::SIZE + payload.len());
    frame.extend_from_slice(
        sluice_proto::wire::frame_header(sluice_proto::wire::FrameKind::Control, payload.len() as u32).as_bytes(),
    );
    frame.extend_from_slice(&payload);
    frame
}
