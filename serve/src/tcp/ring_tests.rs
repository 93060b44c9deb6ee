//! The socket ring over real sockets: bytes cross it exactly, and an
//! operation abandoned mid-flight (a dropped reader, a send cut off by its
//! deadline) is cancelled and its memory kept until the kernel is done.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::AsyncReadExt;

use super::ring::SocketRing;
use super::socket::{Reader, Socket, Writer};

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime")
}

/// A connected pair: the node's side, the client's.
fn connected() -> (TcpStream, TcpStream) {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let client = TcpStream::connect(listener.local_addr().expect("address")).expect("connect");
    let (node, _) = listener.accept().expect("accept");
    (node, client)
}

/// A ring, or `None` (and why, on stderr) where the kernel gives none.
fn ring_or_skip() -> Option<SocketRing> {
    match SocketRing::start() {
        Ok(ring) => Some(ring),
        Err(err) => {
            eprintln!("skipped: this kernel gives no io_uring ({err})");
            None
        }
    }
}

/// Runs `test` on a current-thread runtime with a ring and a connected
/// pair (the node's side as a ring socket, the client's plain), unless
/// the kernel gives no io_uring.
fn on_ring<F, Fut>(test: F)
where
    F: FnOnce(SocketRing, Arc<Socket>, TcpStream) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    runtime().block_on(async {
        let Some(ring) = ring_or_skip() else { return };
        let (node, client) = connected();
        let socket = Socket::new(node).expect("socket");
        test(ring, socket, client).await;
    });
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect()
}

/// Waits (a bounded while) for the ring's operations to be reaped.
async fn settled(ring: &SocketRing) -> bool {
    for _ in 0..500 {
        if ring.in_flight() == 0 {
            return true;
        }
        sluice_dataplane::timer::sleep(Duration::from_millis(2)).await;
    }
    false
}

#[test]
fn bytes_cross_the_ring_exactly_both_ways() {
    on_ring(|ring, socket, mut client| async move {
        // A small buffer: a megabyte takes hundreds of receives.
        let mut reader = Reader::new(ring.clone(), Arc::clone(&socket), 4096);
        let mut writer = Writer::new(ring.clone(), socket);
        let request = pattern(1 << 20, 7);
        let response = pattern(8 << 20, 3);
        let (to_send, expected) = (request.clone(), response.clone());
        let peer = std::thread::spawn(move || {
            client.write_all(&to_send).expect("client write");
            let mut got = vec![0; expected.len()];
            client.read_exact(&mut got).expect("client read");
            let mut rest = Vec::new();
            client.read_to_end(&mut rest).expect("end of stream");
            (got == expected, rest.len())
        });
        let mut got = vec![0; request.len()];
        reader.read_exact(&mut got).await.expect("node read");
        assert!(got == request, "the node reads the client's bytes exactly");
        // Larger than the socket's buffers: sent in parts, each resubmitted
        // from where the last stopped.
        writer.send_frame(&response).await.expect("node send");
        writer.shutdown();
        let (exact, extra) = peer.join().expect("client thread");
        assert!(exact, "the client reads the node's bytes exactly");
        assert_eq!(extra, 0, "and nothing after them");
        let mut rest = [0u8; 16];
        assert_eq!(reader.read(&mut rest).await.expect("end of stream"), 0, "the client's close reads as the end");
        drop((reader, writer));
        assert!(settled(&ring).await, "nothing left in flight");
    });
}

#[test]
fn a_reader_dropped_while_it_waits_cancels_its_receive() {
    on_ring(|ring, socket, client| async move {
        // Held open, silent, for the whole test.
        let _client = client;
        let mut reader = Reader::new(ring.clone(), socket, 4096);
        let mut byte = [0u8; 1];
        // The client sends nothing: the receive waits in the kernel.
        let waited = sluice_dataplane::timer::timeout(Duration::from_millis(50), reader.read(&mut byte)).await;
        assert!(waited.is_err(), "nothing to read yet");
        assert_eq!(ring.in_flight(), 1, "the receive is in flight, its buffer lent to the kernel");
        drop(reader);
        assert!(settled(&ring).await, "the dropped reader's receive is cancelled and reaped");
    });
}

#[test]
fn a_send_cut_off_by_its_deadline_is_cancelled_and_the_writer_goes_on() {
    on_ring(|ring, socket, client| async move {
        let mut writer = Writer::new(ring.clone(), Arc::clone(&socket));
        // The client never reads: 64 MiB cannot fit the socket's buffers.
        let frame = pattern(64 << 20, 1);
        let sent = crate::deadline::within(Duration::from_millis(100), writer.send_frame(&frame)).await;
        assert!(sent.is_err(), "the send waits on a client that does not read, until its deadline");
        assert!(settled(&ring).await, "the abandoned send is cancelled and its parts reaped");
        // The writer lost its parts to the ring and sends with new ones.
        drop(client);
        let after = writer.send_frame(b"after").await;
        assert!(after.is_err(), "the client is gone: the next send fails, cleanly");
        assert!(settled(&ring).await);
    });
}
