//! The node enforces what it announces and lets nothing before
//! authentication cost it much: a batch over the announced footprint gets
//! `TooLarge` without reaching a core; thousands of connections that never
//! say Hello are closed at the handshake deadline; a reader that drains a
//! byte a second loses its connection and its DMA slots come back. A good
//! client reads byte-exact all the while.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{assert_socket_io, eventually, random_file, sealed_dataset, NodeProcess};
use sluice_client::blocking::Client;
use sluice_client::{RangeStatus, ReadRange};
use sluice_proto::codec::{self, ControlMessage};
use sluice_proto::wire::{self, le, BatchResponseHeader, BatchStatus, FrameHeader, FrameKind, RangeDescriptor};
use zerocopy::{FromBytes, IntoBytes};

fn control_frame(message: &ControlMessage) -> Vec<u8> {
    let payload = codec::encode(message).expect("encode");
    let mut frame = wire::frame_header(FrameKind::Control, payload.len() as u32).as_bytes().to_vec();
    frame.extend_from_slice(&payload);
    frame
}

/// Reads one whole frame: its kind and payload.
fn read_frame(stream: &mut TcpStream) -> (FrameKind, Vec<u8>) {
    let mut header = [0u8; FrameHeader::SIZE];
    stream.read_exact(&mut header).expect("frame header");
    let (kind, len) = wire::parse_frame_header(&header, true).expect("valid header");
    let mut payload = vec![0u8; len as usize];
    stream.read_exact(&mut payload).expect("payload");
    (kind, payload)
}

/// A raw connection that said Hello and opened `dataset` (handle 1).
fn opened(addr: &str, dataset: &str) -> TcpStream {
    let mut stream = TcpStream::connect(addr).expect("connect");
    stream.set_read_timeout(Some(Duration::from_secs(30))).expect("timeout");
    stream.write_all(&control_frame(&ControlMessage::Hello { protocol: 1, client: "raw".into() })).expect("hello");
    assert_eq!(read_frame(&mut stream).0, FrameKind::Control);
    stream.write_all(&control_frame(&ControlMessage::Open { name: dataset.into(), token: None })).expect("open");
    let (_, reply) = read_frame(&mut stream);
    assert!(matches!(codec::decode(&reply), Ok(ControlMessage::Opened { handle: 1, .. })), "opened");
    stream
}

fn ranges(count: u64, len: u32, stride: u64) -> Vec<RangeDescriptor> {
    (0..count)
        .map(|i| RangeDescriptor {
            offset: le::U64::new(i * stride),
            len: le::U32::new(len),
            reserved: le::U32::new(0),
            dest: le::U64::new(i * u64::from(len)),
        })
        .collect()
}

/// A good client reading random batches and checking every byte until
/// `stop`, counting them in `done`; returns how many batches it read, and
/// its batch latencies.
fn good_reader(
    endpoint: String,
    data: Arc<Vec<u8>>,
    stop: Arc<AtomicBool>,
    done: Arc<AtomicU64>,
) -> std::thread::JoinHandle<(u64, Vec<Duration>)> {
    std::thread::spawn(move || {
        let dataset = Client::connect(&endpoint).expect("connect").open("data").expect("open");
        let mut buf = vec![0u8; 16 * 4096];
        let mut latencies = Vec::new();
        let mut seed = 1u64;
        while !stop.load(Ordering::Relaxed) {
            seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            let batch: Vec<ReadRange> = (0..16u64)
                .map(|i| ReadRange {
                    offset: (seed >> 20).wrapping_add(i * 7919) % (data.len() as u64 - 4096),
                    len: 4096,
                    dest: i * 4096,
                })
                .collect();
            let started = Instant::now();
            let statuses = dataset.read_batch(&batch, &mut buf).expect("good read");
            latencies.push(started.elapsed());
            for (i, r) in batch.iter().enumerate() {
                assert_eq!(statuses[i], RangeStatus::Ok);
                let want = &data[r.offset as usize..r.offset as usize + 4096];
                assert!(&buf[i * 4096..(i + 1) * 4096] == want, "a good read differs");
            }
            done.fetch_add(1, Ordering::Relaxed);
        }
        (latencies.len() as u64, latencies)
    })
}

/// Waits for the good client to read once more (it was not stopped by
/// what came before), stops it and returns its figures.
fn still_reading_then_stop(
    done: &AtomicU64,
    stop: &AtomicBool,
    good: std::thread::JoinHandle<(u64, Vec<Duration>)>,
) -> (u64, Vec<Duration>) {
    let before = done.load(Ordering::Relaxed);
    assert!(eventually(30, || done.load(Ordering::Relaxed) > before), "the good client still reads");
    stop.store(true, Ordering::Relaxed);
    let figures = good.join().expect("the good client read byte-exact throughout");
    assert!(figures.0 > 0);
    figures
}

fn p99(mut latencies: Vec<Duration>) -> Duration {
    latencies.sort();
    latencies.get(latencies.len() * 99 / 100).copied().unwrap_or_default()
}

#[test]
fn batches_over_the_announced_footprint_are_too_large() {
    let dir = tempfile::tempdir().expect("tempdir");
    let node = NodeProcess::start(&dir.path().join("node"));
    let data = Arc::new(random_file(&dir.path().join("data.bin"), 64 << 20, 5));
    sealed_dataset(&node, "data", &[&dir.path().join("data.bin")]);
    // The good client alone first, for its p99 beside the attack's.
    let (stop_alone, done_alone) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicU64::new(0)));
    let alone = good_reader(node.endpoint.clone(), Arc::clone(&data), Arc::clone(&stop_alone), done_alone);
    std::thread::sleep(Duration::from_secs(2));
    stop_alone.store(true, Ordering::Relaxed);
    let (_, alone_latencies) = alone.join().expect("the good client alone");
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let good = good_reader(node.endpoint.clone(), Arc::clone(&data), Arc::clone(&stop), Arc::clone(&done));
    assert!(eventually(30, || done.load(Ordering::Relaxed) > 0), "the good client reads");

    // 64 ranges of 1 MiB: 64 MiB of DMA, eight times the announced 8 MiB.
    let mut hostile = opened(&node.data_addr, "data");
    let oversized = ranges(64, 1 << 20, 1 << 20);
    let mut frame = Vec::new();
    let refused = AtomicU64::new(0);
    for batch in 0..200u64 {
        wire::encode_batch_request(&mut frame, batch, 1, &oversized);
        hostile.write_all(&frame).expect("send");
        let (kind, payload) = read_frame(&mut hostile);
        assert_eq!(kind, FrameKind::BatchResponse);
        let head = BatchResponseHeader::read_from_bytes(&payload[..BatchResponseHeader::SIZE]).expect("head");
        assert_eq!(head.status.get(), BatchStatus::TooLarge as u32, "batch {batch}");
        assert_eq!(head.data_len.get(), 0);
        refused.fetch_add(1, Ordering::Relaxed);
    }
    // Within the limit, the same connection still reads.
    let fitting = ranges(4, 1 << 20, 1 << 20);
    wire::encode_batch_request(&mut frame, 999, 1, &fitting);
    hostile.write_all(&frame).expect("send");
    let (_, payload) = read_frame(&mut hostile);
    let head = BatchResponseHeader::read_from_bytes(&payload[..BatchResponseHeader::SIZE]).expect("head");
    assert_eq!(head.status.get(), BatchStatus::Ok as u32);
    let (batches, latencies) = still_reading_then_stop(&done, &stop, good);
    eprintln!(
        "{} oversized batches refused; good client p99 {:?} alone, {:?} beside them ({batches} batches)",
        refused.load(Ordering::Relaxed),
        p99(alone_latencies),
        p99(latencies)
    );
}

/// Raises this process's descriptor limit (the node inherits it) so the
/// test can hold thousands of sockets.
fn raise_fd_limit(want: u64) {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    let (_, hard) = getrlimit(Resource::RLIMIT_NOFILE).expect("getrlimit");
    let hard = if nix::unistd::Uid::effective().is_root() { hard.max(want) } else { hard };
    setrlimit(Resource::RLIMIT_NOFILE, want.min(hard), hard).expect("setrlimit");
}

/// Connects from `source` (a loopback address) to `addr`.
fn connect_from(source: std::net::Ipv4Addr, addr: std::net::SocketAddr) -> Option<TcpStream> {
    let socket = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).ok()?;
    socket.bind(&std::net::SocketAddr::new(source.into(), 0).into()).ok()?;
    socket.connect(&addr.into()).ok()?;
    Some(socket.into())
}

#[test]
fn connections_that_never_say_hello_are_closed_at_the_deadline() {
    const SILENT: usize = 5000;
    raise_fd_limit(16_384);
    let dir = tempfile::tempdir().expect("tempdir");
    let config = dir.path().join("node.toml");
    std::fs::write(&config, "handshake_timeout_ms = 3000\nconnections_max = 8000\nconnections_per_source_max = 1100\n")
        .expect("config");
    let node = NodeProcess::start_with(&dir.path().join("node"), &["--config", config.to_str().expect("utf-8")]);
    let data = Arc::new(random_file(&dir.path().join("data.bin"), 16 << 20, 6));
    sealed_dataset(&node, "data", &[&dir.path().join("data.bin")]);
    let fds_before = node.fd_count();
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let good = good_reader(node.endpoint.clone(), Arc::clone(&data), Arc::clone(&stop), Arc::clone(&done));
    assert!(eventually(30, || done.load(Ordering::Relaxed) > 0), "the good client reads");

    // Five sources of a thousand silent connections each (the per-source
    // cap would refuse more from one).
    let addr: std::net::SocketAddr = node.data_addr.parse().expect("data address");
    let started = Instant::now();
    let silent: Vec<TcpStream> = (0..SILENT)
        .filter_map(|i| connect_from(std::net::Ipv4Addr::new(127, 0, 0, 2 + (i / 1000) as u8), addr))
        .collect();
    assert_eq!(silent.len(), SILENT, "every silent connection was accepted by the kernel");
    eprintln!("{SILENT} silent connections made in {:?}", started.elapsed());

    // Each is taken and closed by the node at the deadline: it reads the
    // reason, then EOF (one the node never took would block until the
    // read timeout).
    let mut closed = 0;
    let mut told = 0;
    for mut stream in silent {
        stream.set_read_timeout(Some(Duration::from_secs(20))).expect("timeout");
        let mut said = Vec::new();
        if stream.read_to_end(&mut said).is_ok() {
            closed += 1;
        }
        if String::from_utf8_lossy(&said).contains("handshake deadline") {
            told += 1;
        }
    }
    assert!(told > SILENT / 2, "the node says why it closes ({told} of {SILENT} read it)");
    let waited = started.elapsed();
    assert_eq!(closed, SILENT, "silent connections left open");
    assert!(eventually(20, || node.fd_count() <= fds_before + 8), "descriptors came back: {}", node.fd_count());
    let (batches, latencies) = still_reading_then_stop(&done, &stop, good);
    eprintln!(
        "{SILENT} silent connections closed within {waited:?}; good client {batches} batches, p99 {:?}",
        p99(latencies)
    );
}

#[test]
fn a_reader_that_drains_a_byte_a_second_is_dropped_and_its_slots_return() {
    a_reader_that_drains_a_byte_a_second_is_dropped_and_its_slots_return_over(&[]);
}

/// The same over the cores' socket rings (io_uring) instead of readiness.
#[test]
fn a_reader_that_drains_a_byte_a_second_is_dropped_and_its_slots_return_over_the_socket_ring() {
    a_reader_that_drains_a_byte_a_second_is_dropped_and_its_slots_return_over(&["--socket-io", "uring"]);
}

fn a_reader_that_drains_a_byte_a_second_is_dropped_and_its_slots_return_over(socket_io: &[&str]) {
    let dir = tempfile::tempdir().expect("tempdir");
    let node = NodeProcess::start_with(&dir.path().join("node"), socket_io);
    assert_socket_io(&node, socket_io);
    let data = Arc::new(random_file(&dir.path().join("data.bin"), 96 << 20, 7));
    sealed_dataset(&node, "data", &[&dir.path().join("data.bin")]);
    // Opened once, so the dataset's files are open before the count.
    drop(opened(&node.data_addr, "data"));
    assert!(eventually(10, || node.fd_count() > 0));
    std::thread::sleep(Duration::from_millis(300));
    let fds_before = node.fd_count();

    // 64 batches of 7 MiB queued (every credit; within the announced
    // 8 MiB footprint), then a byte a second.
    let mut slow = opened(&node.data_addr, "data");
    let batch = ranges(7, 1 << 20, 1 << 20);
    let mut frame = Vec::new();
    for id in 0..64 {
        wire::encode_batch_request(&mut frame, id, 1, &batch);
        slow.write_all(&frame).expect("send");
    }
    let draining = Arc::new(AtomicBool::new(true));
    let drainer = {
        let draining = Arc::clone(&draining);
        let mut slow = slow.try_clone().expect("clone");
        std::thread::spawn(move || {
            let mut byte = [0u8; 1];
            while draining.load(Ordering::Relaxed) && slow.read(&mut byte).is_ok_and(|n| n == 1) {
                std::thread::sleep(Duration::from_secs(1));
            }
        })
    };
    let started = Instant::now();
    assert!(eventually(60, || node.fd_count() < fds_before + 1), "the slow reader's connection was not dropped");
    eprintln!("a reader draining a byte a second was dropped after {:?}", started.elapsed());

    // Its slots came back: a good client reads the whole dataset in big
    // batches, byte-exact.
    let dataset = Client::connect(&node.endpoint).expect("connect").open("data").expect("open");
    let mut whole = vec![0u8; data.len()];
    let pieces: Vec<ReadRange> =
        (0..96u64).map(|i| ReadRange { offset: i << 20, len: 1 << 20, dest: i << 20 }).collect();
    let statuses = dataset.read_batch(&pieces, &mut whole).expect("read");
    assert!(statuses.iter().all(|s| *s == RangeStatus::Ok));
    assert!(whole == *data, "byte-exact after the slow reader");
    draining.store(false, Ordering::Relaxed);
    drop(slow);
    let _ = drainer.join();
}
