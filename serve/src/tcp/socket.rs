//! A plain-TCP connection's two halves over its core's socket ring: the
//! reader receives into a buffer of its own and is read as a buffered
//! [`AsyncRead`]; the writer sends a response's head and its bytes from
//! the DMA slots with one `sendmsg`, the batch result lent to the kernel
//! until the send completes.

use std::future::Future;
use std::io;
use std::os::fd::AsRawFd;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use io_uring::{opcode, types};
use sluice_dataplane::BatchResult;
use tokio::io::{AsyncRead, ReadBuf};

use super::ring::{At, Lent, Op, SocketRing};

/// Most iovecs one `sendmsg` takes (Linux's `UIO_MAXIOV`).
const IOV_MAX: usize = 1024;

/// A connection's socket, shared by its halves; closed when both are gone
/// (after whatever they had in flight was cancelled).
pub(super) struct Socket {
    stream: std::net::TcpStream,
}

impl Socket {
    /// Takes over `stream`, made blocking: io_uring waits for a blocking
    /// socket itself (it arms a poll), where a non-blocking one would
    /// hand its `EAGAIN` back.
    pub(super) fn new(stream: std::net::TcpStream) -> io::Result<Arc<Self>> {
        stream.set_nonblocking(false)?;
        Ok(Arc::new(Self { stream }))
    }

    fn fd(&self) -> types::Fd {
        types::Fd(self.stream.as_raw_fd())
    }

    /// Ends the sending direction (the peer reads end of stream after the
    /// last response).
    pub(super) fn shutdown_write(&self) {
        let _ = self.stream.shutdown(std::net::Shutdown::Write);
    }
}

/// The receiving half: a buffered reader whose refills are ring receives.
pub(super) struct Reader {
    ring: SocketRing,
    socket: Arc<Socket>,
    /// The buffer, or `None` while a receive has it.
    buffer: Option<Vec<u8>>,
    /// Bytes of `buffer` received and not yet read: `start..end`.
    start: usize,
    end: usize,
    receiving: Option<Op>,
    at_end: bool,
}

impl Reader {
    pub(super) fn new(ring: SocketRing, socket: Arc<Socket>, capacity: usize) -> Self {
        Self { ring, socket, buffer: Some(vec![0; capacity]), start: 0, end: 0, receiving: None, at_end: false }
    }

    /// Starts a receive into the (whole, empty) buffer.
    fn receive(&mut self) -> io::Result<()> {
        let Some(mut buffer) = self.buffer.take() else {
            // Only a submission that failed loses it (with its error).
            return Err(io::Error::other("the connection's receive buffer went with a failed submission"));
        };
        let len = u32::try_from(buffer.len()).unwrap_or(u32::MAX);
        let entry = opcode::Recv::new(self.socket.fd(), buffer.as_mut_ptr(), len).build();
        // SAFETY: the entry points into `buffer`'s heap memory, lent to the
        // ring with it until the receive completes.
        let op = unsafe { self.ring.submit(entry, Lent::Recv(buffer), At::EndOfTurn) }?;
        self.receiving = Some(op);
        Ok(())
    }
}

impl AsyncRead for Reader {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, out: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        loop {
            if let Some(buffer) = &this.buffer {
                if this.start < this.end {
                    let take = (this.end - this.start).min(out.remaining());
                    out.put_slice(&buffer[this.start..this.start + take]);
                    this.start += take;
                    return Poll::Ready(Ok(()));
                }
                if this.at_end {
                    return Poll::Ready(Ok(()));
                }
            }
            match &mut this.receiving {
                None => this.receive()?,
                Some(op) => {
                    let (result, lent) = ready!(Pin::new(op).poll(cx));
                    this.receiving = None;
                    let Lent::Recv(buffer) = lent else { unreachable!("a receive lends its buffer") };
                    this.buffer = Some(buffer);
                    this.start = 0;
                    this.end = 0;
                    match usize::try_from(result) {
                        Ok(0) => this.at_end = true,
                        Ok(received) => this.end = received,
                        Err(_) => return Poll::Ready(Err(io::Error::from_raw_os_error(-result))),
                    }
                }
            }
        }
    }
}

/// What a send lends the kernel: the bytes of the frame's head (a control
/// frame whole, or a batch response's head), the batch result whose DMA
/// slots hold the rest, and the iovecs and message header over both. Kept
/// by the writer from one send to the next, so a send allocates nothing.
pub(super) struct SendParts {
    head: Vec<u8>,
    result: Option<BatchResult>,
    iovecs: Vec<libc::iovec>,
    header: libc::msghdr,
}

// SAFETY: the raw pointers in `iovecs` and `header` point only into
// `head` and `result`, owned alongside them, which are `Send`.
unsafe impl Send for SendParts {}

impl SendParts {
    fn new() -> Box<Self> {
        // SAFETY: an all-zero msghdr is a valid empty one (no name, no
        // iovecs, no control data).
        let header = unsafe { std::mem::zeroed::<libc::msghdr>() };
        Box::new(Self { head: Vec::with_capacity(256), result: None, iovecs: Vec::new(), header })
    }

    /// Points the iovecs at the head, then at each piece of the result.
    fn gather(&mut self) {
        self.iovecs.clear();
        self.iovecs.push(libc::iovec { iov_base: self.head.as_mut_ptr().cast(), iov_len: self.head.len() });
        if let Some(result) = &self.result {
            // Empty pieces left out: a send of nothing but them would read
            // as a connection that takes no more bytes.
            self.iovecs.reserve(result.pieces_max());
            result.for_each_ok_piece(|piece| {
                if !piece.is_empty() {
                    self.iovecs.push(libc::iovec { iov_base: piece.as_ptr().cast_mut().cast(), iov_len: piece.len() });
                }
            });
        }
    }
}

/// The sending half.
pub(super) struct Writer {
    ring: SocketRing,
    socket: Arc<Socket>,
    /// The parts of the last send, for the next; `None` after a send was
    /// abandoned (its parts stay with the ring until it completes).
    spare: Option<Box<SendParts>>,
}

impl Writer {
    pub(super) fn new(ring: SocketRing, socket: Arc<Socket>) -> Self {
        Self { ring, socket, spare: Some(SendParts::new()) }
    }

    /// Sends `frame` whole.
    pub(super) async fn send_frame(&mut self, frame: &[u8]) -> io::Result<()> {
        let mut parts = self.spare.take().unwrap_or_else(SendParts::new);
        parts.head.clear();
        parts.head.extend_from_slice(frame);
        parts.result = None;
        self.send(parts).await
    }

    /// Sends a batch response: `head`, then the bytes of `result`'s `Ok`
    /// ranges; `result` (and its DMA slots) is dropped once they are sent.
    pub(super) async fn send_batch(&mut self, head: &[u8], result: BatchResult) -> io::Result<()> {
        let mut parts = self.spare.take().unwrap_or_else(SendParts::new);
        parts.head.clear();
        parts.head.extend_from_slice(head);
        parts.result = Some(result);
        self.send(parts).await
    }

    /// Sends what `parts` holds, resubmitting after a short send.
    async fn send(&mut self, mut parts: Box<SendParts>) -> io::Result<()> {
        parts.gather();
        let mut sent_iovecs = 0;
        while sent_iovecs < parts.iovecs.len() {
            let take = (parts.iovecs.len() - sent_iovecs).min(IOV_MAX);
            let iovecs = parts.iovecs[sent_iovecs..].as_mut_ptr();
            parts.header.msg_iov = iovecs;
            parts.header.msg_iovlen = take;
            let entry = opcode::SendMsg::new(self.socket.fd(), &raw const parts.header)
                .flags((libc::MSG_NOSIGNAL | libc::MSG_WAITALL) as u32)
                .build();
            // SAFETY: header, iovecs, head and result are all `parts`' heap
            // memory, lent to the ring with it until the send completes.
            let op = unsafe { self.ring.submit(entry, Lent::Send(parts), At::Once) }?;
            let (result, lent) = op.await;
            let Lent::Send(returned) = lent else { unreachable!("a send lends its parts") };
            parts = returned;
            let Ok(mut sent) = usize::try_from(result) else {
                return Err(io::Error::from_raw_os_error(-result));
            };
            if sent == 0 {
                return Err(io::ErrorKind::WriteZero.into());
            }
            // Past the iovecs sent whole; into the one sent in part.
            while sent > 0 {
                let iovec = &mut parts.iovecs[sent_iovecs];
                if sent >= iovec.iov_len {
                    sent -= iovec.iov_len;
                    sent_iovecs += 1;
                } else {
                    iovec.iov_base = iovec.iov_base.cast::<u8>().wrapping_add(sent).cast();
                    iovec.iov_len -= sent;
                    sent = 0;
                }
            }
        }
        parts.result = None;
        self.spare = Some(parts);
        Ok(())
    }

    /// Ends the sending direction.
    pub(super) fn shutdown(&self) {
        self.socket.shutdown_write();
    }
}
