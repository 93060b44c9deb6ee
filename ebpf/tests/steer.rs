//! Steering and the kernel-side trace against the host kernel, as root
//! (skipped, saying why, where BPF is not permitted): a policy's decisions
//! reach the data plane through the mmapped array and a run-time swap
//! changes them; the `sk_reuseport` program lands a known mix of
//! connections on the expected worker socket; the io_uring tracepoints
//! count the node's own requests exactly.

use std::io::Write;
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::time::Duration;

use sluice_dataplane::driver::{MemDriver, UringDriver};
use sluice_dataplane::probe::{LANE_BULK, LANE_LATENCY};
use sluice_dataplane::steer::{peer_key, DECISION_BULK, DECISION_LATENCY};
use sluice_dataplane::{
    BlockDriver, ByteRange, DataPlane, DataPlaneConfig, DatasetSlot, DatasetView, IoMode, NamespaceSpec,
};
use sluice_ebpf::steer::{reuseport_pair, Steering, ALL_BULK_POLICY_OBJECT, DEFAULT_POLICY_OBJECT};
use sluice_ebpf::uring::UringTracer;
use sluice_ebpf::{Scope, TraceStats, Tracer, TRACE_OBJECT};

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// Runs `start` as root; None (after saying why) where BPF is not allowed.
fn bpf_or_skip<T, E: std::fmt::Debug + std::fmt::Display>(
    test: &str,
    permission: impl Fn(&E) -> bool,
    start: impl FnOnce() -> Result<T, E>,
) -> Option<T> {
    if !is_root() {
        eprintln!("SKIP {test}: loading BPF programs needs root (or CAP_BPF, CAP_PERFMON, CAP_SYS_ADMIN)");
        return None;
    }
    match start() {
        Ok(value) => Some(value),
        Err(err) if permission(&err) => {
            eprintln!("SKIP {test}: the kernel does not permit BPF here: {err}");
            None
        }
        Err(err) => panic!("{test}: {err:?}"),
    }
}

async fn attach_dataset(plane: &DataPlane, driver: &Arc<dyn BlockDriver>, dataset_id: u64) -> DatasetSlot {
    let ns = driver.open_namespace(&NamespaceSpec::Mem).expect("namespace");
    ns.write_at(0, &vec![1u8; 8 << 20]).expect("write");
    let view = DatasetView::unverified(dataset_id, ns, 8 << 20);
    plane.attach(Arc::new(view)).await.expect("attach")
}

fn lane_batches(tracer: &Tracer, dataset_id: u64, lane: u8) -> u64 {
    let entries = tracer.snapshot().expect("snapshot");
    entries
        .iter()
        .find(|(k, _)| k.dataset_id == dataset_id && k.lane == u32::from(lane))
        .map_or(0, |(_, s): &(_, TraceStats)| s.batches)
}

/// Many small ranges (800 KiB a batch: over the 512 KiB threshold) and
/// few large ones (256 KiB a batch: under it): the threshold puts each in
/// the wrong lane, the default policy in the right one from the second
/// batch on (the first has no decision yet). Swapping to the all-bulk
/// policy moves the small reader to bulk after one more batch; unloading
/// hands the choice back to the threshold. A bad object is refused and
/// leaves the running policy in place.
#[test]
fn policy_decisions_steer_batches_and_swap_at_run_time() {
    let exe = std::env::current_exe().expect("test binary");
    let test = "policy_decisions_steer_batches_and_swap_at_run_time";
    let Some(mut steering) =
        bpf_or_skip(test, sluice_ebpf::steer::SteerError::is_permission, || Steering::start(&exe, Scope::ThisProcess))
    else {
        return;
    };
    let tracer = Tracer::attach(&exe, Scope::ThisProcess, Duration::from_secs(10)).expect("trace");
    let driver: Arc<dyn BlockDriver> = Arc::new(MemDriver);
    let config = DataPlaneConfig { cores: 2, slots_per_core: 64, ..DataPlaneConfig::default() };
    let plane = DataPlane::start(Arc::clone(&driver), config).expect("data plane");
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    let small_reader: IpAddr = "127.0.0.2".parse().expect("addr");
    let large_reader: IpAddr = "127.0.0.3".parse().expect("addr");
    runtime.block_on(async {
        plane.steer_with(steering.decisions()).await.expect("steer");
        let (small_id, large_id) = (9001, 9002);
        let small_slot = attach_dataset(&plane, &driver, small_id).await;
        let large_slot = attach_dataset(&plane, &driver, large_id).await;
        let small_flow = plane.open_flow(peer_key(small_reader));
        let large_flow = plane.open_flow(peer_key(large_reader));
        let small = |i: u64| {
            (0..200)
                .map(|j| ByteRange { offset_bytes: (i * 200 + j) * 8192 % (8 << 20), len_bytes: 4096 })
                .collect::<Vec<_>>()
        };
        let large = |i: u64| vec![ByteRange { offset_bytes: i * 262_144, len_bytes: 131_072 }; 2];
        let read = |slot, flow: &sluice_dataplane::FlowLease, ranges| plane.read_in_flow(slot, flow.flow(), ranges);

        // No policy: the threshold.
        read(small_slot, &small_flow, small(0)).await.expect("batch");
        read(large_slot, &large_flow, large(0)).await.expect("batch");
        assert_eq!((lane_batches(&tracer, small_id, LANE_BULK), lane_batches(&tracer, large_id, LANE_LATENCY)), (1, 1));

        steering.load_policy("default", DEFAULT_POLICY_OBJECT).expect("default policy");
        for i in 1..=10 {
            read(small_slot, &small_flow, small(i)).await.expect("batch");
            read(large_slot, &large_flow, large(i)).await.expect("batch");
        }
        // The first batch under the policy still had no decision.
        assert_eq!(lane_batches(&tracer, small_id, LANE_BULK), 2);
        assert_eq!(lane_batches(&tracer, small_id, LANE_LATENCY), 9);
        assert_eq!(lane_batches(&tracer, large_id, LANE_LATENCY), 2);
        assert_eq!(lane_batches(&tracer, large_id, LANE_BULK), 9);
        assert_eq!(steering.decisions().decision(small_flow.flow().index), DECISION_LATENCY);
        assert_eq!(steering.decisions().decision(large_flow.flow().index), DECISION_BULK);
        assert_eq!(steering.peer_decision(small_reader).expect("peer"), Some(DECISION_LATENCY));
        assert_eq!(steering.peer_decision(large_reader).expect("peer"), Some(DECISION_BULK));
        assert_eq!(steering.decision_counts(), (4094, 1, 1));

        // Swap at run time: the next batch still has the old decision.
        steering.load_policy("all_bulk", ALL_BULK_POLICY_OBJECT).expect("swap");
        for i in 11..=15 {
            read(small_slot, &small_flow, small(i)).await.expect("batch");
        }
        assert_eq!(lane_batches(&tracer, small_id, LANE_LATENCY), 10);
        assert_eq!(lane_batches(&tracer, small_id, LANE_BULK), 6);
        assert_eq!(steering.peer_decision(small_reader).expect("peer"), Some(DECISION_BULK));
        assert_eq!(steering.policy().expect("policy").name, "all_bulk");

        // Bad objects are refused; the running policy stays.
        let garbage = steering.load_policy("garbage", b"not an ELF object");
        assert!(garbage.is_err(), "garbage loaded");
        let no_policy = steering.load_policy("trace", TRACE_OBJECT).expect_err("trace object is no policy");
        assert!(no_policy.to_string().contains("lane_policy"), "{no_policy}");
        assert_eq!(steering.policy().expect("policy").name, "all_bulk");
        assert_eq!(steering.swaps(), 2);

        // Unloaded: every decision is gone; the threshold decides again.
        steering.unload_policy().expect("unload");
        assert_eq!(steering.decision_counts(), (4096, 0, 0));
        assert_eq!(steering.peer_decision(small_reader).expect("peer"), None);
        read(large_slot, &large_flow, large(20)).await.expect("batch");
        assert_eq!(lane_batches(&tracer, large_id, LANE_LATENCY), 3);

        // A flow opened in a reused index starts with no decision.
        let index = small_flow.flow().index;
        steering.load_policy("default", DEFAULT_POLICY_OBJECT).expect("default policy");
        read(small_slot, &small_flow, small(30)).await.expect("batch");
        assert_eq!(steering.decisions().decision(index), DECISION_LATENCY);
        drop(small_flow);
        let reopened = plane.open_flow(peer_key(small_reader));
        assert_eq!(reopened.flow().index, index);
        assert_eq!(steering.decisions().decision(index), 0);
    });
    plane.shutdown();
}

fn connect_from(source: IpAddr, to: SocketAddr) -> TcpStream {
    use nix::sys::socket::{bind, connect, socket, AddressFamily, SockFlag, SockType, SockaddrStorage};
    let fd = socket(AddressFamily::Inet, SockType::Stream, SockFlag::SOCK_CLOEXEC, None).expect("socket");
    bind(std::os::fd::AsRawFd::as_raw_fd(&fd), &SockaddrStorage::from(SocketAddr::new(source, 0))).expect("bind");
    connect(std::os::fd::AsRawFd::as_raw_fd(&fd), &SockaddrStorage::from(to)).expect("connect");
    TcpStream::from(fd)
}

fn accept_all(listener: &TcpListener) -> Vec<IpAddr> {
    listener.set_nonblocking(true).expect("nonblocking");
    let mut peers = Vec::new();
    while let Ok((_, peer)) = listener.accept() {
        peers.push(peer.ip());
    }
    peers.sort();
    peers
}

/// Connections from a peer decided latency land on the latency worker
/// socket; from a peer decided bulk, or unknown, on the bulk one.
#[test]
fn sk_reuseport_lands_a_known_mix_where_expected() {
    let exe = std::env::current_exe().expect("test binary");
    let test = "sk_reuseport_lands_a_known_mix_where_expected";
    let Some(mut steering) =
        bpf_or_skip(test, sluice_ebpf::steer::SteerError::is_permission, || Steering::start(&exe, Scope::ThisProcess))
    else {
        return;
    };
    let (latency, bulk) = reuseport_pair("127.0.0.1:0".parse().expect("addr"), 64).expect("listeners");
    let addr = latency.local_addr().expect("addr");
    assert_eq!(bulk.local_addr().expect("addr"), addr);
    steering.steer_listeners(&latency, &bulk).expect("attach sk_reuseport");
    let small: IpAddr = "127.0.0.2".parse().expect("addr");
    let large: IpAddr = "127.0.0.3".parse().expect("addr");
    let unknown: IpAddr = "127.0.0.4".parse().expect("addr");
    steering.set_peer_decision(small, DECISION_LATENCY).expect("peer");
    steering.set_peer_decision(large, DECISION_BULK).expect("peer");
    let mut streams = Vec::new();
    for _ in 0..6 {
        for source in [small, large, unknown] {
            let mut stream = connect_from(source, addr);
            stream.write_all(b"x").expect("write");
            streams.push(stream);
        }
    }
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(accept_all(&latency), vec![small; 6]);
    let mut expected_bulk = vec![large; 6];
    expected_bulk.extend(vec![unknown; 6]);
    assert_eq!(accept_all(&bulk), expected_bulk);
}

/// Every read the io_uring backend submits shows in the kernel-side
/// histogram exactly once when every request is timed (ranges far apart
/// are one request each); timing one in 8 times about an eighth.
#[test]
fn uring_tracepoints_count_the_node_io_exactly() {
    let test = "uring_tracepoints_count_the_node_io_exactly";
    let Some(uring) = bpf_or_skip(test, sluice_ebpf::uring::UringTraceError::is_permission, || {
        UringTracer::attach(std::process::id(), 0)
    }) else {
        return;
    };
    let sampled = UringTracer::attach(std::process::id(), 3).expect("sampled tracer");
    let before = uring.snapshot().expect("snapshot").requests;
    let sampled_before = sampled.snapshot().expect("snapshot").requests;
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("data");
    std::fs::write(&path, vec![5u8; 4 << 20]).expect("write");
    let driver: Arc<dyn BlockDriver> = Arc::new(UringDriver::new(IoMode::Buffered));
    let ns = driver.open_namespace(&NamespaceSpec::File { path: path.clone(), create: false }).expect("namespace");
    let config = DataPlaneConfig { cores: 1, slots_per_core: 64, ..DataPlaneConfig::default() };
    let plane = DataPlane::start(Arc::clone(&driver), config).expect("data plane");
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    runtime.block_on(async {
        let view = DatasetView::unverified(1, ns, 4 << 20);
        let slot = plane.attach(Arc::new(view)).await.expect("attach");
        for batch in 0..16u64 {
            let ranges =
                (0..4).map(|i| ByteRange { offset_bytes: (batch * 4 + i) * 65_536, len_bytes: 4096 }).collect();
            let result = plane.read(slot, ranges).await.expect("batch");
            assert!(result.statuses().iter().all(|s| *s == sluice_proto::RangeStatus::Ok));
        }
    });
    plane.shutdown();
    let after = uring.snapshot().expect("snapshot");
    assert_eq!(after.requests - before, 64, "{after:?}");
    assert_eq!(after.errors, 0);
    assert_eq!(after.latency_log2_us.iter().sum::<u64>(), after.requests);
    // Every 8th submission per CPU, counting from each CPU's first: 64 /
    // 8, plus at most one more for each CPU the core's thread ran on.
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get() as u64);
    let timed = sampled.snapshot().expect("snapshot").requests - sampled_before;
    assert!((8..=8 + cpus).contains(&timed), "{timed} of 64 timed at 1 in 8 on {cpus} CPUs");
    assert_eq!(sampled.sampled_one_in(), 8);
}
