//! Hostile and broken clients on loopback — random bytes, oversized and
//! truncated frames, slowloris, a thousand idle connections, clients that
//! never read their responses — while well-behaved clients read and verify
//! every byte. They see no errors, the node's memory stays bounded, and its
//! descriptors come back when the hostile clients go.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{assert_socket_io, eventually, random_file, sealed_dataset, NodeProcess};
use rand::{Rng, SeedableRng};
use sluice_client::blocking::Client;
use sluice_client::{RangeStatus, ReadRange};
use sluice_proto::codec::{self, ControlMessage};
use sluice_proto::wire::{self, le, FrameKind, RangeDescriptor};
use zerocopy::IntoBytes;

const IDLE_CONNECTIONS: usize = 1000;

fn control_frame(message: &ControlMessage) -> Vec<u8> {
    let payload = codec::encode(message).expect("encode");
    let mut frame = wire::frame_header(FrameKind::Control, payload.len() as u32).as_bytes().to_vec();
    frame.extend_from_slice(&payload);
    frame
}

/// Opens the dataset on a raw connection and queues large batches it never
/// reads the answers to.
fn non_reader(addr: &str) -> Option<TcpStream> {
    let mut stream = TcpStream::connect(addr).ok()?;
    stream.write_all(&control_frame(&ControlMessage::Hello { protocol: 1, client: "non-reader".into() })).ok()?;
    stream.write_all(&control_frame(&ControlMessage::Open { name: "data".into(), token: None })).ok()?;
    let ranges: Vec<RangeDescriptor> = (0..32u64)
        .map(|i| RangeDescriptor {
            offset: le::U64::new(i * 200_000),
            len: le::U32::new(200_000),
            reserved: le::U32::new(0),
            dest: le::U64::new(i * 200_000),
        })
        .collect();
    let mut frame = Vec::new();
    stream.set_write_timeout(Some(Duration::from_millis(500))).ok()?;
    for batch in 0..64 {
        wire::encode_batch_request(&mut frame, batch, 1, &ranges);
        if stream.write_all(&frame).is_err() {
            break;
        }
    }
    Some(stream)
}

#[test]
fn hostile_clients_do_not_hurt_good_ones() {
    hostile_clients_do_not_hurt_good_ones_over(&[]);
}

/// The same over the cores' socket rings (io_uring) instead of readiness.
#[test]
fn hostile_clients_do_not_hurt_good_ones_over_the_socket_ring() {
    hostile_clients_do_not_hurt_good_ones_over(&["--socket-io", "uring"]);
}

fn hostile_clients_do_not_hurt_good_ones_over(socket_io: &[&str]) {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = dir.path().join("node.toml");
    std::fs::write(&config, "write_timeout_ms = 1000\nconnections_max = 1500\nconnections_per_source_max = 1500\n")
        .expect("config");
    let flags = [&["--config", config.to_str().expect("p")][..], socket_io].concat();
    let node = NodeProcess::start_with(&dir.path().join("node"), &flags);
    assert_socket_io(&node, socket_io);
    let data = Arc::new(random_file(&dir.path().join("data.bin"), 16 << 20, 21));
    sealed_dataset(&node, "data", &[&dir.path().join("data.bin")]);
    let fds_before = node.fd_count();
    let stop = Arc::new(AtomicBool::new(false));
    let addr = node.data_addr.clone();

    // A thousand idle connections, held for the whole test.
    // HOSTILE_PARTS picks the attacks (idle, junk, slowloris, non-readers)
    // when chasing a regression; all run by default.
    let parts = std::env::var("HOSTILE_PARTS").unwrap_or_else(|_| "ijsn".into());
    let n_idle = if parts.contains('i') { IDLE_CONNECTIONS } else { 0 };
    let idle: Vec<TcpStream> = (0..n_idle).filter_map(|_| TcpStream::connect(&addr).ok()).collect();
    assert_eq!(idle.len(), n_idle);

    let mut hostile = Vec::new();
    // Random bytes, oversized and truncated frames, reconnecting each time.
    for seed in 0..(if parts.contains('j') { 4u64 } else { 0 }) {
        let (addr, stop) = (addr.clone(), Arc::clone(&stop));
        hostile.push(std::thread::spawn(move || {
            let mut rng = rand::rngs::SmallRng::seed_from_u64(seed);
            let mut tries = 0u64;
            while !stop.load(Ordering::Relaxed) && tries < 10_000 {
                tries += 1;
                let Ok(mut s) = TcpStream::connect(&addr) else { continue };
                let mut junk = vec![0u8; rng.gen_range(1..4096)];
                match tries % 3 {
                    0 => rng.fill(&mut junk[..]),
                    1 => junk = wire::frame_header(FrameKind::BatchRequest, u32::MAX).as_bytes().to_vec(),
                    _ => {
                        junk = wire::frame_header(FrameKind::Control, 60_000).as_bytes().to_vec();
                        junk.extend_from_slice(&[1, 2, 3]);
                    }
                }
                let _ = s.write_all(&junk);
            }
            tries
        }));
    }
    // Slowloris: a frame header, one byte at a time.
    for _ in 0..(if parts.contains('s') { 10 } else { 0 }) {
        let (addr, stop) = (addr.clone(), Arc::clone(&stop));
        hostile.push(std::thread::spawn(move || {
            let Ok(mut s) = TcpStream::connect(&addr) else { return 0 };
            let header = control_frame(&ControlMessage::Hello { protocol: 1, client: "slow".into() });
            for byte in header.iter().cycle().take(200) {
                if stop.load(Ordering::Relaxed) || s.write_all(&[*byte]).is_err() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            1
        }));
    }
    // Clients that never read what they asked for.
    let non_readers: Vec<TcpStream> =
        (0..(if parts.contains('n') { 8 } else { 0 })).filter_map(|_| non_reader(&addr)).collect();

    // Meanwhile, good clients read and verify for a few seconds.
    let mut good = Vec::new();
    for seed in 0..3u64 {
        let (endpoint, data) = (node.endpoint.clone(), Arc::clone(&data));
        good.push(std::thread::spawn(move || {
            let dataset = Client::connect(&endpoint).expect("connect").open("data").expect("open");
            let mut rng = rand::rngs::SmallRng::seed_from_u64(100 + seed);
            let mut latencies = Vec::new();
            let deadline = Instant::now() + Duration::from_secs(4);
            let mut buf = vec![0u8; 64 * 4096];
            while Instant::now() < deadline {
                let ranges: Vec<ReadRange> = (0..64u64)
                    .map(|i| ReadRange { offset: rng.gen_range(0..(16 << 20) - 4096), len: 4096, dest: i * 4096 })
                    .collect();
                let started = Instant::now();
                let statuses = dataset.read_batch(&ranges, &mut buf).expect("a good client sees no errors");
                latencies.push(started.elapsed());
                for (r, status) in ranges.iter().zip(&statuses) {
                    assert_eq!(*status, RangeStatus::Ok);
                    let want = &data[r.offset as usize..r.offset as usize + 4096];
                    assert!(&buf[r.dest as usize..r.dest as usize + 4096] == want, "wrong bytes");
                }
            }
            latencies
        }));
    }
    let mut latencies: Vec<Duration> = good.into_iter().flat_map(|t| t.join().expect("good client")).collect();
    stop.store(true, Ordering::Relaxed);
    let attacks: u64 = hostile.into_iter().map(|t| t.join().expect("hostile thread")).sum();
    latencies.sort();
    let p99 = latencies[latencies.len() * 99 / 100];
    let (rss, peak) = node.memory_kib();
    eprintln!(
        "hostile: {} good batches, p99 {p99:?}; {attacks} hostile connections, {IDLE_CONNECTIONS} idle; node RSS {} MiB, peak {} MiB",
        latencies.len(),
        rss >> 10,
        peak >> 10
    );
    assert!(!latencies.is_empty());
    assert!(peak < 1 << 20, "node memory stays bounded (peak {} MiB)", peak >> 10);

    // Non-readers are dropped after the write timeout; their buffers return.
    let mut leftover = [0u8; 1];
    for mut s in non_readers {
        s.set_read_timeout(Some(Duration::from_secs(10))).expect("timeout");
        while let Ok(n) = s.read(&mut leftover) {
            if n == 0 {
                break;
            }
        }
    }
    drop(idle);
    assert!(
        eventually(10, || node.fd_count() <= fds_before + 2),
        "descriptors come back: {} now, {fds_before} before",
        node.fd_count()
    );
    assert!(
        eventually(10, || node.gauge("sluice_dma_slots_leased") == Some(0.0)),
        "every DMA slot comes back: {:?} still leased",
        node.gauge("sluice_dma_slots_leased")
    );
    assert!(node.gauge("sluice_dma_slots").is_some_and(|slots| slots > 0.0));
    // And the cores hold nothing: no batch, no read at the device, no bulk
    // bytes counted against the bound.
    for gauge in ["batches", "batches_to_push", "reads_at_device", "bulk_bytes_at_device"] {
        let name = format!("sluice_core_{gauge}{{core=\"0\"}}");
        assert!(eventually(10, || node.gauge(&name) == Some(0.0)), "{name}: {:?}", node.gauge(&name));
    }
    let dataset = Client::connect(&node.endpoint).expect("connect").open("data").expect("open");
    let mut buf = vec![0u8; 1 << 20];
    let statuses = dataset.read_batch(&[ReadRange { offset: 0, len: 1 << 20, dest: 0 }], &mut buf).expect("read");
    assert_eq!(statuses, [RangeStatus::Ok]);
    assert!(buf == data[..1 << 20]);
}
