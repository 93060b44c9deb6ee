//! The receive low-water mark (`SO_RCVLOWAT`) of a plain TCP connection,
//! raised while a large response's bytes are on their way.
//!
//! A 1 MiB range arrives as a stream of segments (64 KiB each on loopback).
//! A reader that waits for readability is woken for each, reads what is
//! there and waits again: a dozen wake-ups a MiB, each paid by the sender
//! too, whose `writev` runs the receiver's wake-up in its own softirq.
//! With the mark at the bytes still to come, the socket turns readable
//! once they are all there. The kernel still signals earlier when its
//! receive window closes, under memory pressure, at the peer's FIN or an
//! error, and setting the mark signals at once if it is already met.
//!
//! The mark is set only when the reader is about to wait (its read came
//! back pending) and never above the bytes the node still owes of the
//! response being read, so it can delay a wake-up but never strand one.
//! Only for plain TCP, where the bytes in the socket are the response's
//! bytes; under TLS the layer above reads whole records ahead.

use std::io;
use std::os::fd::AsRawFd;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, ReadBuf};
use tokio::net::tcp::OwnedReadHalf;

/// While fewer bytes than this are still to come, the socket is readable
/// at the first byte: two `setsockopt`s cost more than the wake-ups saved.
pub(super) const LOW_WATER_FROM_BYTES: u64 = 256 << 10;
/// The highest mark set (the kernel grows the receive buffer to hold it).
pub(super) const LOW_WATER_MAX_BYTES: u64 = 4 << 20;

/// A connection's reading half, told how many bytes of the response
/// being read are still owed; only a plain socket makes use of it
/// ([`LowWaterRead`]), a TLS stream's half ignores it.
pub(super) trait Owed {
    /// `owed_bytes` more bytes of the response being read are sure to
    /// come off the socket (the node sent their length, less what a
    /// buffer above already holds); zero once the response is read.
    fn owe(&mut self, _owed_bytes: u64) {}
}

impl<T> Owed for tokio::io::ReadHalf<T> {}

/// A plain TCP connection's reading half that raises the socket's
/// low-water mark while a response's bytes are owed.
pub(super) struct LowWaterRead {
    inner: OwnedReadHalf,
    /// Bytes of the response being read that have not come off the socket.
    owed_bytes: u64,
    /// The mark the socket has now (1, the kernel's default, at first).
    mark: u64,
}

impl Owed for LowWaterRead {
    fn owe(&mut self, owed_bytes: u64) {
        self.owed_bytes = owed_bytes;
    }
}

impl LowWaterRead {
    pub(super) fn new(inner: OwnedReadHalf) -> Self {
        Self { inner, owed_bytes: 0, mark: 1 }
    }

    /// The mark for a reader about to wait.
    fn wanted_mark(&self) -> u64 {
        if self.owed_bytes >= LOW_WATER_FROM_BYTES {
            self.owed_bytes.min(LOW_WATER_MAX_BYTES)
        } else {
            1
        }
    }

    /// Sets the socket's mark; a refusal costs only the wake-ups.
    fn set_mark(&mut self, mark: u64) {
        debug_assert!((1..=LOW_WATER_MAX_BYTES).contains(&mark));
        let value = mark as libc::c_int;
        // SAFETY: the fd is the socket `inner` holds open; the option is
        // a live c_int passed with its size.
        let done = unsafe {
            libc::setsockopt(
                self.inner.as_ref().as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_RCVLOWAT,
                (&value as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        if done == 0 {
            self.mark = mark;
        } else {
            tracing::debug!("setting SO_RCVLOWAT to {mark}: {}", io::Error::last_os_error());
        }
    }
}

impl AsyncRead for LowWaterRead {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let this = &mut *self;
        match Pin::new(&mut this.inner).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                let read = (buf.filled().len() - before) as u64;
                this.owed_bytes = this.owed_bytes.saturating_sub(read);
                Poll::Ready(Ok(()))
            }
            Poll::Pending => {
                // About to wait: wake when what is owed is there. Setting
                // the mark signals readiness at once if it is already met.
                let wanted = this.wanted_mark();
                if wanted != this.mark {
                    this.set_mark(wanted);
                }
                Poll::Pending
            }
            ready @ Poll::Ready(Err(_)) => ready,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::RawFd;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::{TcpListener, TcpStream};

    /// Whether `fd` polls readable now.
    fn readable(fd: RawFd) -> bool {
        let mut poll = libc::pollfd { fd, events: libc::POLLIN, revents: 0 };
        // SAFETY: one live pollfd, a socket this test holds open.
        let ready = unsafe { libc::poll(&mut poll, 1, 0) };
        assert!(ready >= 0, "poll: {}", io::Error::last_os_error());
        poll.revents & libc::POLLIN != 0
    }

    async fn pair() -> (TcpStream, TcpStream) {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let client = TcpStream::connect(listener.local_addr().expect("addr")).await.expect("connect");
        let (server, _) = listener.accept().await.expect("accept");
        (client, server)
    }

    /// Polls a read once; how many bytes it gave, or `None` if it waits.
    async fn read_once(reader: &mut LowWaterRead, into: &mut [u8]) -> Option<usize> {
        std::future::poll_fn(|cx| {
            let mut buf = ReadBuf::new(into);
            Poll::Ready(match Pin::new(&mut *reader).poll_read(cx, &mut buf) {
                Poll::Ready(result) => Some(result.map(|()| buf.filled().len()).expect("read")),
                Poll::Pending => None,
            })
        })
        .await
    }

    /// Bytes queued on the socket, not yet read.
    fn queued(fd: RawFd) -> usize {
        let mut bytes: libc::c_int = 0;
        // SAFETY: FIONREAD writes one c_int, which is live.
        let done = unsafe { libc::ioctl(fd, libc::FIONREAD, &mut bytes) };
        assert_eq!(done, 0, "FIONREAD: {}", io::Error::last_os_error());
        bytes as usize
    }

    /// Part of a 1 MiB response is read as it comes; once the reader
    /// waits, the socket is not readable with bytes queued but fewer than
    /// are owed. The rest, sent while the reader waits (more than the
    /// socket's first receive window), arrives whole and byte-exact; after
    /// the response the next frame's first byte is readable at once.
    #[tokio::test(flavor = "current_thread")]
    async fn a_waiting_reader_wakes_when_what_is_owed_is_there() {
        let (client, mut server) = pair().await;
        let (reader, _writer) = client.into_split();
        let fd = reader.as_ref().as_raw_fd();
        let mut reader = LowWaterRead::new(reader);
        let response: Vec<u8> = (0..1u32 << 20).map(|i| (i * 7 % 251) as u8).collect();
        let mut got = vec![0u8; response.len()];

        server.write_all(&response[..32 << 10]).await.expect("write");
        reader.inner.readable().await.expect("readable");
        reader.owe(response.len() as u64);
        let mut filled = 0;
        while let Some(read) = read_once(&mut reader, &mut got[filled..]).await {
            assert!(read > 0, "no end of stream here");
            filled += read;
        }
        assert!(filled > 0, "what had come was read");
        assert_eq!(reader.mark, (response.len() - filled) as u64, "the mark is what is still owed");

        let (mut sent, next) = (filled, filled + (16 << 10));
        server.write_all(&response[sent..next]).await.expect("write");
        sent = next;
        for _ in 0..1000 {
            if queued(fd) > 0 {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(1)).await;
        }
        assert!(queued(fd) > 0, "16 KiB sent on loopback never arrived");
        assert!(!readable(fd), "readable with {} of the {} bytes owed", queued(fd), reader.mark);

        let rest = response[sent..].to_vec();
        let sender = tokio::spawn(async move {
            server.write_all(&rest).await.expect("write");
            server
        });
        let read = tokio::time::timeout(std::time::Duration::from_secs(30), reader.read_exact(&mut got[filled..]));
        read.await.expect("the rest of the response never came readable").expect("read the rest");
        assert!(got == response, "bytes differ");
        let mut server = sender.await.expect("join");

        reader.owe(0);
        let mut byte = [0u8; 1];
        assert_eq!(read_once(&mut reader, &mut byte).await, None, "nothing sent yet");
        assert_eq!(reader.mark, 1, "back to the first byte");
        server.write_all(b"h").await.expect("write");
        assert!(readable(fd), "a next frame's first byte is readable");
    }

    /// Less than [`LOW_WATER_FROM_BYTES`] owed leaves the mark alone.
    #[tokio::test(flavor = "current_thread")]
    async fn a_small_response_sets_no_mark() {
        let (client, mut server) = pair().await;
        let (reader, _writer) = client.into_split();
        let fd = reader.as_ref().as_raw_fd();
        let mut reader = LowWaterRead::new(reader);
        reader.owe(LOW_WATER_FROM_BYTES - 1);
        let mut buf = vec![0u8; 4096];
        assert_eq!(read_once(&mut reader, &mut buf).await, None);
        assert_eq!(reader.mark, 1);
        server.write_all(b"x").await.expect("write");
        assert!(readable(fd));
    }
}
