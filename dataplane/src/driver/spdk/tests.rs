//! The SPDK driver's logic over `fake.rs`: attach and teardown, namespace
//! management, the control path's byte ranges over sectors, and the hot
//! path's contexts, tags and full queues. What SPDK itself does on a real
//! controller is the rig's to check (`hw-tests`, `--features spdk`).

use std::sync::Arc;

use super::control::CONTROL_BUFFER_BYTES;
use super::sys::{self as fake, NamespaceSetup};
use super::{SpdkDriver, SpdkQueue};
use crate::dma::Arena;
use crate::driver::{BlockDriver, Completion, Namespace, NamespaceSpec, NvmeAdmin, QueueFull, ReadIo};

const A: &str = "0000:00:05.0";
const B: &str = "0000:00:06.0";
const MIB: u64 = 1 << 20;

fn ns(nsid: u32, bytes: u64, sector_bytes: u32, active: bool, shared: bool) -> NamespaceSetup {
    NamespaceSetup { nsid, bytes, sector_bytes, active, shared }
}

/// Controller A: namespace 1 active (4 MiB, 512 B sectors), 2 detached
/// (2 MiB, 4 KiB sectors), 3 detached and shared.
fn driver() -> Arc<SpdkDriver> {
    fake::install(
        A,
        7,
        true,
        &[ns(1, 4 * MIB, 512, true, false), ns(2, 2 * MIB, 4096, false, false), ns(3, MIB, 512, false, true)],
    );
    Arc::new(SpdkDriver::start(&[A.to_string()]).expect("start"))
}

fn open(driver: &Arc<SpdkDriver>, nsid: u32) -> Arc<dyn Namespace> {
    driver.open_namespace(&NamespaceSpec::Nvme { controller: A.into(), nsid }).expect("open")
}

/// Bytes that differ at every offset and between calls.
fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) ^ (i >> 9) as u8).collect()
}

fn error_text<T>(result: Result<T, impl std::fmt::Display>) -> String {
    match result {
        Ok(_) => panic!("expected an error"),
        Err(err) => err.to_string(),
    }
}

#[test]
fn controllers_are_attached_once_each_and_detached_on_drop() {
    fake::install(A, 1, false, &[]);
    fake::install(B, 2, false, &[]);
    let driver = SpdkDriver::start(&[A.to_string(), B.to_string()]).expect("start");
    assert_eq!(driver.controllers(), [A, B]);
    drop(driver);
    let ledger = fake::ledger();
    assert_eq!(ledger.detached, [A, B]);
    assert!(ledger.detached_busy.is_empty());
}

#[test]
fn start_refuses_none_a_missing_one_and_a_repeat_and_gives_back_the_rest() {
    assert!(error_text(SpdkDriver::start(&[])).contains("no NVMe controller given"));
    fake::install(A, 1, false, &[]);
    let missing = error_text(SpdkDriver::start(&[A.to_string(), B.to_string()]));
    assert!(missing.contains(B) && missing.contains("vfio-pci"), "{missing}");
    assert_eq!(fake::ledger().detached, [A], "the controller attached before the failure is detached");
    let twice = error_text(SpdkDriver::start(&[A.to_string(), A.to_string()]));
    assert!(twice.contains("given twice"), "{twice}");
}

#[test]
fn namespaces_come_from_identify_with_attachment_sharing_and_size() {
    let driver = driver();
    let listed = driver.namespaces(A).expect("namespaces");
    let seen: Vec<_> = listed.iter().map(|n| (n.nsid, n.attached, n.capacity_bytes, n.shared)).collect();
    assert_eq!(seen, [(1, true, 4 * MIB, false), (2, false, 2 * MIB, false), (3, false, MIB, true)]);
    let identity = driver.namespace_identity(A, 2).expect("identity");
    assert_eq!(identity, format!("{}-{}", "02".repeat(16), "00".repeat(8)));
    assert!(driver.namespace_identity(A, 9).is_err(), "an unknown NSID is an error");
    assert!(error_text(driver.namespaces(B)).contains("no SPDK controller at"));
    assert!(driver.manages_namespaces(A).expect("oacs"));
}

#[test]
fn namespaces_are_created_attached_detached_and_deleted() {
    let driver = driver();
    let nsid = driver.create(A, 3000).expect("create");
    assert_eq!(nsid, 4);
    let created = driver.namespaces(A).expect("namespaces").into_iter().find(|n| n.nsid == nsid).expect("listed");
    assert_eq!((created.attached, created.capacity_bytes), (false, 3072), "whole 512 B blocks of format 0");
    driver.attach(A, nsid).expect("attach");
    assert_eq!(fake::namespace_active(A, nsid), Some(true));
    assert!(driver.attach(A, nsid).is_err(), "attaching an attached namespace");
    assert!(driver.delete(A, nsid).is_err(), "deleting an attached namespace");
    driver.detach(A, nsid).expect("detach");
    driver.delete(A, nsid).expect("delete");
    assert_eq!(fake::namespace_active(A, nsid), None);
    assert!(driver.delete(A, nsid).is_err(), "deleting it twice");
}

#[test]
fn create_is_refused_without_namespace_management() {
    fake::install(A, 1, false, &[]);
    let driver = SpdkDriver::start(&[A.to_string()]).expect("start");
    assert!(!driver.manages_namespaces(A).expect("oacs"));
    assert!(error_text(driver.create(A, MIB)).contains("refused"));
}

#[test]
fn the_control_path_reads_and_writes_any_range_over_whole_sectors() {
    let driver = driver();
    let namespace = open(&driver, 1);
    let geometry = namespace.geometry();
    assert_eq!((geometry.block_size_bytes, geometry.capacity_bytes, geometry.fixed_capacity), (512, 4 * MIB, true));
    let mut model = pattern(4 * MIB as usize, 1);
    namespace.write_at(0, &model).expect("whole write");
    // Unaligned at both ends and longer than the bounce buffer.
    let (at, len) = (1000usize, CONTROL_BUFFER_BYTES + CONTROL_BUFFER_BYTES / 2 + 77);
    let piece = pattern(len, 9);
    namespace.write_at(at as u64, &piece).expect("unaligned write");
    model[at..at + len].copy_from_slice(&piece);
    assert!(fake::namespace_bytes(A, 1) == model, "the sectors around the range keep their bytes");
    let mut back = vec![0u8; len + 300];
    namespace.read_at(at as u64 - 150, &mut back).expect("unaligned read");
    assert!(back == model[at - 150..at + len + 150]);
    let refused = namespace.write_at(4 * MIB - 10, &[0u8; 11]).expect_err("past the end");
    assert_eq!(refused.kind(), std::io::ErrorKind::InvalidInput);
    assert!(fake::namespace_bytes(A, 1) == model, "a refused write writes nothing");
    namespace.sync().expect("flush");
}

#[test]
fn discard_deallocates_only_the_whole_sectors_inside_the_range() {
    let driver = driver();
    let namespace = open(&driver, 1);
    namespace.write_at(0, &vec![0xff; 8192]).expect("write");
    namespace.discard(100, 2000).expect("discard");
    let bytes = fake::namespace_bytes(A, 1);
    assert!(bytes[..512].iter().all(|&b| b == 0xff), "the partial first sector keeps its bytes");
    assert!(bytes[512..2048].iter().all(|&b| b == 0), "sectors 1 to 3 are deallocated");
    assert!(bytes[2048..8192].iter().all(|&b| b == 0xff), "the partial last sector keeps its bytes");
}

#[test]
fn failed_submissions_and_completions_are_errors_that_say_why() {
    let driver = driver();
    let namespace = open(&driver, 1);
    fake::faults(|f| f.submit_rc = Some(-libc::EIO));
    assert!(error_text(namespace.sync()).contains("submit failed"));
    fake::faults(|f| f.completion_status = Some((0, 0x81)));
    let failed = error_text(namespace.read_at(0, &mut [0u8; 512]));
    assert!(failed.contains("NVMe status type 0x0 code 0x81"), "{failed}");
    namespace.read_at(0, &mut [0u8; 512]).expect("the next read succeeds");
}

#[test]
fn only_active_namespaces_of_known_controllers_open() {
    let driver = driver();
    let open_error = |controller: &str, nsid| {
        error_text(driver.open_namespace(&NamespaceSpec::Nvme { controller: controller.into(), nsid }))
    };
    assert!(open_error(A, 2).contains("no active namespace"));
    assert!(open_error(A, 99).contains("no active namespace"));
    assert!(open_error(B, 1).contains("no SPDK controller"));
    assert!(driver.open_namespace(&NamespaceSpec::Mem).is_err());
    fake::faults(|f| f.qpairs_left = Some(0));
    assert!(open_error(A, 1).contains("no I/O queue pair left"));
    assert_eq!(fake::ledger().dma_live, 0, "the bounce buffer is given back when the open fails");
}

/// A queue over the fake, on an arena of eight 4 KiB slots (plain memory:
/// `Arena` takes hugepages only for whole 2 MiB pages).
fn queue(driver: &Arc<SpdkDriver>, depth: u32) -> (Arena, SpdkQueue) {
    let arena = Arena::new(8, 4096).expect("arena");
    let queue = SpdkQueue::new(Arc::clone(driver), &arena, depth).expect("queue");
    (arena, queue)
}

fn read_io(arena: &Arena, slot: u32, offset_bytes: u64, len_bytes: u32, tag: u64) -> ReadIo {
    ReadIo { namespace_index: 0, offset_bytes, len_bytes, buf: arena.slot_ptr(slot, 0), tag }
}

#[test]
fn reads_land_in_the_arena_and_complete_by_tag() {
    let driver = driver();
    let namespace = open(&driver, 1);
    let model = pattern(64 << 10, 3);
    namespace.write_at(0, &model).expect("write");
    let (arena, mut queue) = queue(&driver, 4);
    queue.register_namespace(0, &namespace.target());
    for (slot, at) in [(0u32, 0u64), (1, 8192), (2, 512)] {
        // SAFETY: each slot is this test's and untouched until reaped.
        unsafe { queue.push_read(read_io(&arena, slot, at, 4096, 100 + u64::from(slot))) }.expect("push");
    }
    assert_eq!(queue.in_flight(), 3);
    queue.wait().expect("wait");
    let mut done = Vec::new();
    assert_eq!(queue.reap(&mut done, 16), 3);
    assert_eq!(done, [100, 101, 102].map(|tag| Completion { tag, result: 4096 }));
    assert_eq!(queue.in_flight(), 0);
    for (slot, at) in [(0u32, 0usize), (1, 8192), (2, 512)] {
        // SAFETY: reaped; nothing writes the slot now.
        let bytes = unsafe { arena.slot_bytes(slot, 0, 4096) };
        assert!(bytes == &model[at..at + 4096], "slot {slot}");
    }
}

#[test]
fn a_full_queue_says_so_and_its_contexts_are_reused_after_reaping() {
    let driver = driver();
    let namespace = open(&driver, 1);
    let (arena, mut queue) = queue(&driver, 2);
    queue.register_namespace(0, &namespace.target());
    for tag in 0..2 {
        // SAFETY: as above.
        unsafe { queue.push_read(read_io(&arena, tag as u32, 0, 512, tag)) }.expect("push");
    }
    // SAFETY: as above.
    assert_eq!(unsafe { queue.push_read(read_io(&arena, 2, 0, 512, 2)) }, Err(QueueFull));
    let mut done = Vec::new();
    queue.wait().expect("wait");
    assert_eq!(queue.reap(&mut done, 1), 1, "reaps at most what is asked");
    assert_eq!(queue.reap(&mut done, 8), 1);
    for tag in 2..4 {
        // SAFETY: as above.
        unsafe { queue.push_read(read_io(&arena, tag as u32, 0, 512, tag)) }.expect("contexts came back");
    }
    // SPDK out of request objects is a full queue too, and takes no context.
    queue.wait().expect("wait");
    queue.reap(&mut done, 8);
    fake::faults(|f| f.submit_rc = Some(-libc::ENOMEM));
    // SAFETY: as above.
    assert_eq!(unsafe { queue.push_read(read_io(&arena, 4, 0, 512, 4)) }, Err(QueueFull));
    assert_eq!(queue.in_flight(), 0);
    // SAFETY: as above.
    unsafe { queue.push_read(read_io(&arena, 4, 0, 512, 4)) }.expect("the retry queues");
    queue.wait().expect("wait");
    queue.reap(&mut done, 8);
    assert_eq!(done.iter().map(|c| c.tag).collect::<Vec<_>>(), [0, 1, 2, 3, 4]);
}

#[test]
fn bad_reads_fail_by_completion_with_an_errno() {
    let driver = driver();
    let namespace = open(&driver, 1);
    let (arena, mut queue) = queue(&driver, 4);
    queue.register_namespace(0, &namespace.target());
    let unregistered = ReadIo { namespace_index: 5, ..read_io(&arena, 0, 0, 512, 1) };
    let ios =
        [unregistered, read_io(&arena, 1, 100, 512, 2), read_io(&arena, 2, 0, 0, 3), read_io(&arena, 3, 0, 100, 4)];
    for io in ios {
        // SAFETY: as above.
        unsafe { queue.push_read(io) }.expect("a bad read is a completion, not a refusal");
    }
    fake::faults(|f| f.submit_rc = Some(-libc::EIO));
    // SAFETY: as above.
    unsafe { queue.push_read(read_io(&arena, 4, 0, 512, 5)) }.expect("push");
    fake::faults(|f| f.completion_status = Some((0, 0x80)));
    // SAFETY: as above.
    unsafe { queue.push_read(read_io(&arena, 5, 0, 512, 6)) }.expect("push");
    queue.wait().expect("wait");
    let mut done = Vec::new();
    queue.reap(&mut done, 16);
    let results: Vec<_> = done.iter().map(|c| (c.tag, c.result)).collect();
    assert_eq!(
        results,
        [
            (1, -libc::EBADF),
            (2, -libc::EINVAL),
            (3, -libc::EINVAL),
            (4, -libc::EINVAL),
            (5, -libc::EIO),
            (6, -libc::EIO)
        ]
    );
    queue.unregister_namespace(0);
    // SAFETY: as above.
    unsafe { queue.push_read(read_io(&arena, 0, 0, 512, 7)) }.expect("push");
    queue.reap(&mut done, 16);
    assert_eq!(done.last(), Some(&Completion { tag: 7, result: -libc::EBADF }));
}

#[test]
fn teardown_gives_back_every_queue_pair_buffer_and_registration_before_detaching() {
    let driver = driver();
    let namespace = open(&driver, 1);
    let (arena, mut queue) = queue(&driver, 4);
    queue.register_namespace(0, &namespace.target());
    // SAFETY: as above; the queue's drop waits for it.
    unsafe { queue.push_read(read_io(&arena, 0, 0, 4096, 1)) }.expect("push");
    let ledger = fake::ledger();
    assert_eq!((ledger.qpairs_live, ledger.dma_live, ledger.registered.len()), (2, 1, 1));
    // The node drops its handle to the driver first; the namespace and the
    // queue keep the controller attached until they go.
    drop(driver);
    assert!(fake::ledger().detached.is_empty());
    drop(queue);
    drop(namespace);
    let ledger = fake::ledger();
    assert_eq!((ledger.qpairs_live, ledger.dma_live), (0, 0));
    assert!(ledger.registered.is_empty());
    assert_eq!(ledger.detached, [A]);
    assert!(ledger.detached_busy.is_empty(), "no queue pair outlived its controller");
    drop(arena);
}

#[test]
fn a_queue_that_cannot_be_made_gives_back_what_it_took() {
    fake::install(A, 1, false, &[]);
    fake::install(B, 2, false, &[]);
    let driver = Arc::new(SpdkDriver::start(&[A.to_string(), B.to_string()]).expect("start"));
    let arena = Arena::new(8, 4096).expect("arena");
    fake::faults(|f| f.qpairs_left = Some(1));
    assert!(error_text(SpdkQueue::new(Arc::clone(&driver), &arena, 4)).contains("no I/O queue pair left"));
    let ledger = fake::ledger();
    assert_eq!(ledger.qpairs_live, 0);
    assert!(ledger.registered.is_empty());
    fake::faults(|f| {
        f.qpairs_left = None;
        f.mem_register_rc = -libc::EINVAL;
    });
    assert!(error_text(SpdkQueue::new(Arc::clone(&driver), &arena, 4)).contains("spdk_mem_register"));
    assert_eq!(fake::ledger().qpairs_live, 0);
    // 32 KiB is no whole hugepage, so the arena is plain memory here.
    assert!(!arena.is_hugepage_backed());
    let refused = error_text(driver.create_queue(&arena, 4));
    assert!(refused.contains("hugepages"), "{refused}");
}
