//! The engine against real io_uring and the memory driver.

use super::*;
use crate::driver::{IoMode, MemDriver, NamespaceSpec, UringDriver};
use rand::{Rng, SeedableRng};
use sluice_proto::CHUNK_SIZE_BYTES;

fn small_config() -> DataPlaneConfig {
    DataPlaneConfig { cores: 2, slots_per_core: 64, queue_depth: 32, ..DataPlaneConfig::default() }
}

/// The block checksums of `data`, as a sealed dataset's view has them.
fn blocks(data: &[u8]) -> crate::BlockCrcs {
    let mut crcs = Vec::new();
    crate::blocks::extend_block_crcs(&mut crcs, data);
    crcs.into()
}

/// Dataset 1: the whole of `ns`, which holds `data`, with its block
/// checksums.
fn whole_view(ns: Arc<dyn crate::driver::Namespace>, data: &[u8]) -> DatasetView {
    DatasetView {
        dataset_id: 1,
        namespace: ns,
        base_offset_bytes: 0,
        length_bytes: data.len() as u64,
        block_crcs: blocks(data),
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime")
}

fn random_ranges(rng: &mut impl Rng, len: u64, count: usize) -> Vec<ByteRange> {
    (0..count)
        .map(|_| {
            let len_bytes = rng.gen_range(1..=300_000u32).min(len as u32);
            let offset_bytes = rng.gen_range(0..=len - u64::from(len_bytes));
            ByteRange { offset_bytes, len_bytes }
        })
        .collect()
}

fn assert_batch_exact(data: &[u8], ranges: &[ByteRange], result: &BatchResult) {
    for (index, range) in ranges.iter().enumerate() {
        assert_eq!(result.statuses()[index], RangeStatus::Ok, "range {index}");
        let got: Vec<u8> = result.range_pieces(index).collect::<Vec<_>>().concat();
        let start = range.offset_bytes as usize;
        assert_eq!(got, &data[start..start + range.len_bytes as usize], "range {index}");
    }
}

/// Random unaligned batches read back byte-exact through io_uring with
/// O_DIRECT on a real file, and through the memory backend; with cores
/// that sleep at once and cores that poll after work (which must still
/// stop when the plane shuts down).
#[test]
fn reads_are_byte_exact_on_both_backends() {
    let mut rng = rand::rngs::SmallRng::seed_from_u64(7);
    let data: Vec<u8> = (0..3_000_001).map(|_| rng.gen()).collect();
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("ns");
    let drivers = |path: &std::path::Path| -> [(Arc<dyn BlockDriver>, NamespaceSpec); 2] {
        [
            (Arc::new(UringDriver::new(IoMode::Direct)), NamespaceSpec::File { path: path.into(), create: true }),
            (Arc::new(MemDriver), NamespaceSpec::Mem),
        ]
    };
    let windows = [std::time::Duration::ZERO, std::time::Duration::from_millis(2)];
    for (poll_window, (driver, spec)) in windows.into_iter().flat_map(|w| drivers(&path).map(|d| (w, d))) {
        let ns = driver.open_namespace(&spec).expect("namespace");
        ns.write_at(0, &data).expect("write");
        ns.truncate(data.len() as u64).expect("truncate");
        ns.sync().expect("sync");
        let plane =
            DataPlane::start(Arc::clone(&driver), DataPlaneConfig { poll_window, ..small_config() }).expect("start");
        let view = whole_view(ns, &data);
        runtime().block_on(async {
            let slot = plane.attach(Arc::new(view)).await.expect("attach");
            for _ in 0..20 {
                let ranges = random_ranges(&mut rng, data.len() as u64, 40);
                let result = plane.read(slot, ranges.clone()).await.expect("batch");
                assert_batch_exact(&data, &ranges, &result);
            }
            plane.detach(slot).await;
            let gone = plane.read(slot, vec![ByteRange { offset_bytes: 0, len_bytes: 1 }]).await;
            assert_eq!(gone.err(), Some(SubmitError::UnknownDataset));
        });
        plane.shutdown();
    }
}

/// A task placed on a core runs on that core's thread, and a batch it
/// sends to that core is read and answered there: no step of it leaves the
/// thread. Several such tasks share the core with its engine while reads
/// are in flight on a real io_uring (each awaits its own completions).
#[test]
fn tasks_placed_on_a_core_are_served_on_its_thread() {
    let mut rng = rand::rngs::SmallRng::seed_from_u64(11);
    let data: Vec<u8> = (0..1_500_000).map(|_| rng.gen()).collect();
    let dir = tempfile::tempdir().expect("tempdir");
    let driver: Arc<dyn BlockDriver> = Arc::new(UringDriver::new(IoMode::Direct));
    let ns =
        driver.open_namespace(&NamespaceSpec::File { path: dir.path().join("ns"), create: true }).expect("namespace");
    ns.write_at(0, &data).expect("write");
    ns.truncate(data.len() as u64).expect("truncate");
    let plane = Arc::new(DataPlane::start(driver, small_config()).expect("start"));
    assert_eq!(plane.core_count(), 2);
    let view = whole_view(ns, &data);
    let slot = runtime().block_on(plane.attach(Arc::new(view))).expect("attach");
    let data = Arc::new(data);
    for core in 0..plane.core_count() {
        let tasks: Vec<_> = (0..4u64)
            .map(|seed| {
                let (plane, data) = (Arc::clone(&plane), Arc::clone(&data));
                plane.core_runtime(core).clone().spawn(async move {
                    let thread = || std::thread::current().name().map(str::to_string);
                    assert_eq!(thread().as_deref(), Some(format!("sluice-core-{core}").as_str()));
                    let mut rng = rand::rngs::SmallRng::seed_from_u64(seed);
                    for _ in 0..10 {
                        let ranges = random_ranges(&mut rng, data.len() as u64, 8);
                        let (reply, result) = oneshot::channel();
                        let batch = ReadBatch {
                            dataset: slot,
                            client_id: 0,
                            flow: Flow::UNSTEERED,
                            ranges: ranges.clone(),
                            reply: reply.into(),
                            hold: None,
                        };
                        plane.submit_to(core, batch).await.expect("submit");
                        let result = result.await.expect("reply").expect("batch");
                        assert_eq!(thread().as_deref(), Some(format!("sluice-core-{core}").as_str()));
                        assert_batch_exact(&data, &ranges, &result);
                    }
                })
            })
            .collect();
        runtime().block_on(async {
            for task in tasks {
                task.await.expect("a task on the core failed");
            }
        });
    }
    runtime().block_on(plane.detach(slot));
    plane.shutdown();
}

/// A connection's batches stay on its core at shallow depth and spill to
/// the least-held core only when its own holds clearly more.
#[test]
fn batches_spill_from_a_loaded_core_only() {
    // Core `core` of a node whose cores hold `held`, spilling to any core.
    let target = |core: usize, held: &[usize]| spill_target(&Placement { core, spill_to: 0..held.len() }, |c| held[c]);
    assert_eq!(target(0, &[0, 0]), 0);
    assert_eq!(target(1, &[0, SPILL_AT - 1]), 1, "under the spill point: stays");
    assert_eq!(target(0, &[SPILL_AT, 0]), 1);
    assert_eq!(target(0, &[SPILL_AT, SPILL_AT - SPILL_MARGIN + 1]), 0, "the others are as busy: stays");
    assert_eq!(target(2, &[9, SPILL_AT - 1, SPILL_AT + 5, 7]), 1, "to the least held");
    assert_eq!(target(0, &[SPILL_AT]), 0, "one core: nowhere to go");
}

/// A connection of the bulk listener group (cores 1..) never spills onto
/// the latency lane's core 0, however idle it is, and a latency-lane
/// connection stays on its own core.
#[test]
fn batches_spill_only_within_their_listener_group() {
    let held = [0, SPILL_AT + 4, SPILL_AT + 2, SPILL_AT + 3];
    let bulk = Placement { core: 1, spill_to: 1..4 };
    assert_eq!(spill_target(&bulk, |c| held[c]), 2, "to the least held of its group, not core 0");
    let latency = Placement { core: 0, spill_to: 0..1 };
    assert_eq!(spill_target(&latency, |c| [SPILL_AT + 9, 0][c]), 0, "alone in its group: stays");
}

/// With block checksums every read is verified, however small and
/// wherever it starts: one flipped byte fails exactly the ranges that
/// touch its 4 KiB block, and bytes read around it stay served.
#[test]
fn small_reads_are_verified_per_block() {
    let len = 3 * CHUNK_SIZE_BYTES as usize + 1000;
    let data: Vec<u8> = (0..len).map(|i| (i * 7 + 3) as u8).collect();
    let ns = MemDriver.open_namespace(&NamespaceSpec::Mem).expect("namespace");
    ns.write_at(0, &data).expect("write");
    let flipped = CHUNK_SIZE_BYTES + 3 * VERIFY_BLOCK_BYTES + 17;
    ns.write_at(flipped, &[!data[flipped as usize]]).expect("corrupt");
    let plane = DataPlane::start(Arc::new(MemDriver), small_config()).expect("start");
    let view = whole_view(ns, &data);
    runtime().block_on(async {
        let slot = plane.attach(Arc::new(view)).await.expect("attach");
        let block = flipped / VERIFY_BLOCK_BYTES * VERIFY_BLOCK_BYTES;
        let ranges = vec![
            ByteRange { offset_bytes: flipped, len_bytes: 1 },
            ByteRange { offset_bytes: block + 4000, len_bytes: 200 },
            ByteRange { offset_bytes: block - 10, len_bytes: 10 },
            ByteRange { offset_bytes: block + VERIFY_BLOCK_BYTES, len_bytes: 4096 },
            ByteRange { offset_bytes: len as u64 - 900, len_bytes: 900 },
            ByteRange { offset_bytes: 5, len_bytes: 2048 },
        ];
        let result = plane.read(slot, ranges.clone()).await.expect("batch");
        let bad = RangeStatus::ChecksumMismatch;
        assert_eq!(result.statuses(), &[bad, bad, RangeStatus::Ok, RangeStatus::Ok, RangeStatus::Ok, RangeStatus::Ok]);
        let served = ranges[2..].to_vec();
        let result = plane.read(slot, served.clone()).await.expect("batch");
        assert_batch_exact(&data, &served, &result);
    });
    plane.shutdown();
}

/// A chunk whose bytes no longer match the manifest fails the ranges
/// that cover it and only those.
#[test]
fn corrupt_chunk_fails_only_its_ranges() {
    let data = vec![0xabu8; 4 * CHUNK_SIZE_BYTES as usize];
    let ns = MemDriver.open_namespace(&NamespaceSpec::Mem).expect("namespace");
    ns.write_at(0, &data).expect("write");
    let manifest = blocks(&data);
    ns.write_at(CHUNK_SIZE_BYTES + 5, &[0]).expect("corrupt");
    let plane = DataPlane::start(Arc::new(MemDriver), small_config()).expect("start");
    let view = DatasetView {
        dataset_id: 1,
        namespace: ns,
        base_offset_bytes: 0,
        length_bytes: data.len() as u64,
        block_crcs: manifest,
    };
    runtime().block_on(async {
        let slot = plane.attach(Arc::new(view)).await.expect("attach");
        let whole = |c: u64| ByteRange { offset_bytes: c * CHUNK_SIZE_BYTES, len_bytes: CHUNK_SIZE_BYTES as u32 };
        let ranges =
            vec![whole(0), whole(1), whole(2), ByteRange { offset_bytes: 3 * CHUNK_SIZE_BYTES, len_bytes: 10 }];
        let result = plane.read(slot, ranges).await.expect("batch");
        assert_eq!(
            result.statuses(),
            &[RangeStatus::Ok, RangeStatus::ChecksumMismatch, RangeStatus::Ok, RangeStatus::Ok]
        );
    });
    plane.shutdown();
}

/// A batch of more I/O units than the queue is deep completes: when the
/// queue drains with units still to push, the core pushes them instead
/// of parking (it once parked there and waited for a message that never
/// came, on both backends).
#[test]
fn batches_of_more_units_than_the_queue_holds_complete() {
    let data: Vec<u8> = (0..(8u32 << 20)).map(|i| (i % 251) as u8).collect();
    let dir = tempfile::tempdir().expect("tempdir");
    let drivers: [(Arc<dyn BlockDriver>, NamespaceSpec); 2] = [
        (Arc::new(UringDriver::new(IoMode::Direct)), NamespaceSpec::File { path: dir.path().join("ns"), create: true }),
        (Arc::new(MemDriver), NamespaceSpec::Mem),
    ];
    for (driver, spec) in drivers {
        let ns = driver.open_namespace(&spec).expect("namespace");
        ns.write_at(0, &data).expect("write");
        ns.sync().expect("sync");
        let config = DataPlaneConfig { cores: 1, queue_depth: 4, ..small_config() };
        let plane = DataPlane::start(driver, config).expect("start");
        let view = DatasetView::unverified(1, ns, data.len() as u64);
        runtime().block_on(async {
            let slot = plane.attach(Arc::new(view)).await.expect("attach");
            // 100 ranges 64 KiB apart: 100 units for a queue of 4.
            let ranges: Vec<ByteRange> =
                (0..100u64).map(|i| ByteRange { offset_bytes: i * 65_536 + 7, len_bytes: 3001 }).collect();
            for _ in 0..3 {
                let read = plane.read(slot, ranges.clone());
                let result = crate::timer::timeout(std::time::Duration::from_secs(20), read)
                    .await
                    .expect("the batch completes")
                    .expect("batch");
                assert_batch_exact(&data, &ranges, &result);
            }
        });
        plane.shutdown();
    }
}

/// Many batches in flight share a small pool: slots held by unsent
/// responses come back and later batches proceed.
#[test]
fn slots_recycle_under_pressure() {
    let data = vec![1u8; 8 << 20];
    let ns = MemDriver.open_namespace(&NamespaceSpec::Mem).expect("namespace");
    ns.write_at(0, &data).expect("write");
    let config = DataPlaneConfig { cores: 1, slots_per_core: 16, ..small_config() };
    let plane = Arc::new(DataPlane::start(Arc::new(MemDriver), config).expect("start"));
    let view = DatasetView::unverified(1, ns, data.len() as u64);
    runtime().block_on(async {
        let slot = plane.attach(Arc::new(view)).await.expect("attach");
        let big = vec![ByteRange { offset_bytes: 0, len_bytes: 12 * 128 * 1024 }];
        let held = plane.read(slot, big.clone()).await.expect("first");
        let plane2 = Arc::clone(&plane);
        let second = tokio::spawn(async move { plane2.read(slot, big).await });
        crate::timer::sleep(std::time::Duration::from_millis(50)).await;
        assert!(!second.is_finished(), "second batch must wait for slots");
        drop(held);
        let second = second.await.expect("join").expect("second");
        assert_eq!(second.payload_bytes(), 12 * 128 * 1024);
        let too_big = vec![ByteRange { offset_bytes: 0, len_bytes: 17 * 128 * 1024 }];
        assert!(matches!(plane.read(slot, too_big).await, Err(SubmitError::TooLarge { .. })));
    });
    plane.shutdown();
}

/// Latency-lane units go to the queue before bulk ones, and bulk
/// batches leave room for them: a small read that arrives while a slow
/// 4 MiB batch (32 units, each delayed 20 ms, queue depth 4) is being
/// read is pushed before the bulk batch's remaining units, not after.
#[test]
fn latency_lane_reads_pass_a_bulk_batch_in_the_queue() {
    use crate::driver::{FaultPlan, FaultyDriver};
    let ns = MemDriver.open_namespace(&NamespaceSpec::Mem).expect("namespace");
    ns.write_at(0, &vec![3u8; 8 << 20]).expect("write");
    let plan = FaultPlan { delays: vec![(0..(4 << 20), std::time::Duration::from_millis(20))], ..FaultPlan::default() };
    let driver = Arc::new(FaultyDriver::new(Arc::new(MemDriver), plan));
    let config = DataPlaneConfig { cores: 1, queue_depth: 4, ..small_config() };
    let plane = Arc::new(DataPlane::start(Arc::clone(&driver) as Arc<dyn BlockDriver>, config).expect("start"));
    let view = DatasetView::unverified(1, ns, 8 << 20);
    let small_offset = 6 << 20;
    runtime().block_on(async {
        let slot = plane.attach(Arc::new(view)).await.expect("attach");
        let bulk_plane = Arc::clone(&plane);
        let bulk = tokio::spawn(async move {
            bulk_plane.read(slot, vec![ByteRange { offset_bytes: 0, len_bytes: 4 << 20 }]).await
        });
        crate::timer::sleep(std::time::Duration::from_millis(30)).await;
        let small = plane.read(slot, vec![ByteRange { offset_bytes: small_offset, len_bytes: 4096 }]).await;
        assert_eq!(small.expect("small read").statuses(), &[RangeStatus::Ok]);
        let bulk = bulk.await.expect("join").expect("bulk");
        assert_eq!(bulk.payload_bytes(), 4 << 20);
    });
    plane.shutdown();
    let pushed = driver.pushed_offsets();
    assert_eq!(pushed.len(), 33, "{pushed:?}");
    let small_at = pushed.iter().position(|o| *o == small_offset).expect("small read pushed");
    assert!(small_at < 16, "the small read went to the queue after {small_at} bulk units: {pushed:?}");
}

/// A core whose queue never announces a completion (a wake-up lost
/// between the kernel and the event loop) still finds it: with the only
/// batch at the device and no message to come, nothing else would wake
/// it. Each read is held 20 ms past its io_uring completion and the queue
/// names no time for it; the batch still completes.
#[test]
fn a_completion_nobody_announces_is_still_found() {
    use crate::driver::{FaultPlan, FaultyDriver};
    let data = vec![5u8; 1 << 20];
    let dir = tempfile::tempdir().expect("tempdir");
    let uring = Arc::new(UringDriver::new(IoMode::Buffered));
    let ns =
        uring.open_namespace(&NamespaceSpec::File { path: dir.path().join("ns"), create: true }).expect("namespace");
    ns.write_at(0, &data).expect("write");
    let plan = FaultPlan {
        delays: vec![(0..(1 << 20), std::time::Duration::from_millis(20))],
        delays_unannounced: true,
        ..FaultPlan::default()
    };
    let driver = Arc::new(FaultyDriver::new(uring, plan));
    let config = DataPlaneConfig { cores: 1, poll_window: std::time::Duration::ZERO, ..small_config() };
    let plane = DataPlane::start(driver, config).expect("start");
    let view = DatasetView::unverified(1, ns, data.len() as u64);
    runtime().block_on(async {
        let slot = plane.attach(Arc::new(view)).await.expect("attach");
        for _ in 0..3 {
            let read = plane.read(slot, vec![ByteRange { offset_bytes: 4096, len_bytes: 8192 }]);
            let result = crate::timer::timeout(std::time::Duration::from_secs(10), read)
                .await
                .expect("the batch completes although no wake-up announced its read")
                .expect("batch");
            assert_eq!(result.statuses(), &[RangeStatus::Ok]);
        }
    });
    let late = plane.core_loads()[0].completions_found_late;
    assert!(late > 0, "the recheck, not a wake-up, found the held completions");
    plane.shutdown();
}

/// Writes `data` to a new file namespace and drops its pages from the
/// page cache, so that reads of it wait for the device, O_DIRECT or not.
fn cold_namespace(driver: &UringDriver, dir: &std::path::Path, data: &[u8]) -> Arc<dyn crate::driver::Namespace> {
    let path = dir.join("ns");
    let ns = driver.open_namespace(&NamespaceSpec::File { path: path.clone(), create: true }).expect("namespace");
    ns.write_at(0, data).expect("write");
    ns.sync().expect("sync");
    let file = std::fs::File::open(&path).expect("open");
    use nix::fcntl::{posix_fadvise, PosixFadviseAdvice};
    posix_fadvise(std::os::fd::AsRawFd::as_raw_fd(&file), 0, 0, PosixFadviseAdvice::POSIX_FADV_DONTNEED)
        .expect("posix_fadvise");
    ns
}

/// A new directory on a filesystem whose reads wait for a device: the
/// temporary directory, or `/var/tmp` where that is a tmpfs (whose reads,
/// `O_DIRECT` or not, complete before `io_uring_enter` returns, so a test
/// of wake-ups there would exercise none). `None` where both are tmpfs.
fn device_backed_tempdir() -> Option<tempfile::TempDir> {
    [std::env::temp_dir(), std::path::PathBuf::from("/var/tmp")].into_iter().find_map(|parent| {
        let dir = tempfile::tempdir_in(&parent).ok()?;
        let fs = nix::sys::statfs::statfs(dir.path()).ok()?;
        (fs.filesystem_type() != nix::sys::statfs::TMPFS_MAGIC).then_some(dir)
    })
}

/// A core that sleeps while its reads are at the device (no poll window)
/// is woken by their completions, not by the recheck. The recheck makes a
/// lost wake-up cost a batch 50 to 100 ms and nothing more, so a test that
/// only waits for its batches would pass without any wake-up at all; this
/// one counts the passes the recheck had to start. With the wake-up gone
/// nearly every batch needs one (39 of 40 when tried); a few are allowed
/// for a device that stalls past the recheck's period on a loaded machine.
#[test]
fn completions_wake_a_sleeping_core_without_the_recheck() {
    let Some(dir) = device_backed_tempdir() else {
        eprintln!("skipped: the temporary directory and /var/tmp are both tmpfs, whose reads never wait for a wake-up");
        return;
    };
    let data: Vec<u8> = (0..8u32 << 20).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
    let uring = UringDriver::new(IoMode::Direct);
    let ns = cold_namespace(&uring, dir.path(), &data);
    let config = DataPlaneConfig { cores: 1, poll_window: std::time::Duration::ZERO, ..small_config() };
    let plane = DataPlane::start(Arc::new(uring), config).expect("start");
    let mut rng = rand::rngs::StdRng::seed_from_u64(21);
    runtime().block_on(async {
        let slot = plane.attach(Arc::new(whole_view(ns, &data))).await.expect("attach");
        for _ in 0..40 {
            let ranges: Vec<ByteRange> = (0..8)
                .map(|_| ByteRange { offset_bytes: rng.gen_range(0..data.len() as u64 - 4096), len_bytes: 4096 })
                .collect();
            let read = plane.read(slot, ranges.clone());
            let result = crate::timer::timeout(std::time::Duration::from_secs(10), read)
                .await
                .expect("the batch completes")
                .expect("batch");
            assert_batch_exact(&data, &ranges, &result);
        }
    });
    let late = plane.core_loads()[0].completions_found_late;
    plane.shutdown();
    assert!(late <= 4, "{late} of 40 batches' completions found only after the recheck's nudge");
}

/// A core keeps no more bulk bytes at the device than its bound, so a
/// small read that comes later waits behind at most that much, in the
/// core rather than in the kernel. A 4 MiB batch (32 units of 128 KiB,
/// each delayed 100 ms) with room in the queue for all of them: bounded
/// to 512 KiB, four are at the device at a time and the small read, sent
/// once the first is, goes among the first sixteen (three rounds, 300 ms,
/// of slack for a slow test machine); unbounded, all 32 go at once and
/// the small read after them.
#[test]
fn bulk_reads_at_the_device_stay_within_their_bytes_bound() {
    use crate::driver::{FaultPlan, FaultyDriver};
    let small_offset = 6 << 20;
    let run = |bulk_in_flight_bytes_max: u64| {
        let ns = MemDriver.open_namespace(&NamespaceSpec::Mem).expect("namespace");
        ns.write_at(0, &vec![3u8; 8 << 20]).expect("write");
        let plan =
            FaultPlan { delays: vec![(0..(4 << 20), std::time::Duration::from_millis(100))], ..FaultPlan::default() };
        let driver = Arc::new(FaultyDriver::new(Arc::new(MemDriver), plan));
        let config = DataPlaneConfig { cores: 1, queue_depth: 64, bulk_in_flight_bytes_max, ..small_config() };
        let plane = Arc::new(DataPlane::start(Arc::clone(&driver) as Arc<dyn BlockDriver>, config).expect("start"));
        let view = DatasetView::unverified(1, ns, 8 << 20);
        runtime().block_on(async {
            let slot = plane.attach(Arc::new(view)).await.expect("attach");
            let bulk_plane = Arc::clone(&plane);
            let bulk = tokio::spawn(async move {
                bulk_plane.read(slot, vec![ByteRange { offset_bytes: 0, len_bytes: 4 << 20 }]).await
            });
            while driver.pushed_offsets().is_empty() {
                crate::timer::sleep(std::time::Duration::from_millis(1)).await;
            }
            let small = plane.read(slot, vec![ByteRange { offset_bytes: small_offset, len_bytes: 4096 }]).await;
            assert_eq!(small.expect("small read").statuses(), &[RangeStatus::Ok]);
            let bulk = bulk.await.expect("join").expect("bulk");
            assert_eq!(bulk.payload_bytes(), 4 << 20);
            assert!(bulk.statuses().iter().all(|s| *s == RangeStatus::Ok));
        });
        plane.shutdown();
        let pushed = driver.pushed_offsets();
        assert_eq!(pushed.len(), 33, "{pushed:?}");
        let small_at = pushed.iter().position(|o| *o == small_offset).expect("small read pushed");
        (driver.in_flight_peak(), small_at)
    };
    let (peak, small_at) = run(512 << 10);
    assert!(peak <= 5, "bounded to 4 bulk units, {peak} reads were at the device at once");
    assert!(small_at <= 16, "the small read went to the device after {small_at} bulk units");
    let (peak, small_at) = run(0);
    assert!(peak >= 32, "unbounded, only {peak} reads were at the device at once");
    assert_eq!(small_at, 32, "unbounded, the small read still went after every bulk unit");
}

/// A core whose read a fault plan holds back keeps serving meanwhile: a
/// read that arrives while the delayed one waits is answered first, on
/// both the memory backend (no completion fd) and io_uring (whose fd the
/// core watches beside the delay's timer). The core sleeps through the
/// delay in its event loop, where its connections run too, never by
/// blocking the thread.
#[test]
fn a_core_serves_other_reads_while_a_delayed_one_waits() {
    use crate::driver::{FaultPlan, FaultyDriver};
    use std::pin::pin;
    let dir = tempfile::tempdir().expect("tempdir");
    let inners: [(Arc<dyn BlockDriver>, NamespaceSpec); 2] = [
        (Arc::new(MemDriver), NamespaceSpec::Mem),
        (
            Arc::new(UringDriver::new(IoMode::Buffered)),
            NamespaceSpec::File { path: dir.path().join("ns"), create: true },
        ),
    ];
    for (inner, spec) in inners {
        let ns = inner.open_namespace(&spec).expect("namespace");
        ns.write_at(0, &vec![5u8; 2 << 20]).expect("write");
        let plan =
            FaultPlan { delays: vec![(0..(1 << 20), std::time::Duration::from_secs(2))], ..FaultPlan::default() };
        let driver = Arc::new(FaultyDriver::new(inner, plan));
        let config = DataPlaneConfig { cores: 1, ..small_config() };
        let plane = DataPlane::start(Arc::clone(&driver) as Arc<dyn BlockDriver>, config).expect("start");
        let view = DatasetView::unverified(1, ns, 2 << 20);
        runtime().block_on(async {
            let slot = plane.attach(Arc::new(view)).await.expect("attach");
            let mut delayed = pin!(plane.read(slot, vec![ByteRange { offset_bytes: 0, len_bytes: 4096 }]));
            // Until the core has pushed the delayed read: anything sent
            // after that reaches the core while it waits for the delay.
            while driver.pushed_offsets().is_empty() {
                tokio::select! {
                    biased;
                    _ = &mut delayed => panic!("the delayed read finished before it was pushed"),
                    () = crate::timer::sleep(std::time::Duration::from_millis(1)) => {}
                }
            }
            let prompt = plane.read(slot, vec![ByteRange { offset_bytes: 1 << 20, len_bytes: 4096 }]);
            tokio::select! {
                biased;
                _ = &mut delayed => panic!("the delayed read was answered first: the core blocked through its delay"),
                prompt = prompt => assert_eq!(prompt.expect("prompt read").statuses(), &[RangeStatus::Ok]),
            }
            assert_eq!(delayed.await.expect("delayed read").statuses(), &[RangeStatus::Ok]);
        });
        plane.shutdown();
    }
}

/// A group places connections in turn on its own cores only, and a core
/// outside it is refused.
#[test]
fn a_core_group_places_in_turn_on_its_cores() {
    let group = CoreGroup(1..4);
    let turns: Vec<usize> = (0..5).map(|n| group.nth_wrapping(n)).collect();
    assert_eq!(turns, [1, 2, 3, 1, 2]);
    assert_eq!(group.place(2), Placement { core: 2, spill_to: 1..4 });
    assert!(std::panic::catch_unwind(|| group.place(0)).is_err(), "core 0 is not in the group");
}
