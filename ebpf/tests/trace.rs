//! The probe ABI and the trace program, against the host kernel: the C and
//! Rust layouts agree, the checked-in object is what the source compiles
//! to, and a known mix of reads through a real data plane produces exact
//! counts and histograms in the BPF maps (as root; skipped, saying why,
//! where BPF is not permitted).

use std::mem::offset_of;
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use sluice_dataplane::driver::MemDriver;
use sluice_dataplane::probe::{size_bucket, BatchProbe, LANE_BULK, LANE_LATENCY};
use sluice_dataplane::{BlockDriver, ByteRange, DataPlane, DataPlaneConfig, DatasetView, NamespaceSpec};
use sluice_ebpf::{Scope, Tracer};

const CRATE: &str = env!("CARGO_MANIFEST_DIR");

/// Every field of `struct sluice_batch_probe` sits where the Rust struct
/// puts it, and the sizes match.
#[test]
fn c_and_rust_layouts_match() {
    let dir = tempfile::tempdir().expect("tempdir");
    let src = dir.path().join("layout.c");
    let fields = [
        "dataset_id",
        "client_id",
        "lane",
        "pad",
        "ranges",
        "failed_ranges",
        "bytes",
        "submit_ns",
        "complete_ns",
        "size_hist",
        "lane_source",
        "flow",
        "flow_generation",
        "peer",
    ];
    let mut c =
        String::from("#include <stdio.h>\n#include <stddef.h>\n#include \"sluice_probes.h\"\nint main(void) {\n");
    c.push_str("printf(\"size %zu\\n\", sizeof(struct sluice_batch_probe));\n");
    for f in fields {
        c.push_str(&format!("printf(\"{f} %zu\\n\", offsetof(struct sluice_batch_probe, {f}));\n"));
    }
    c.push_str("return 0; }\n");
    std::fs::write(&src, c).expect("write");
    let exe = dir.path().join("layout");
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let built = Command::new(&cc).arg("-I").arg(format!("{CRATE}/include")).arg(&src).arg("-o").arg(&exe).status();
    match built {
        Ok(status) => assert!(status.success(), "{cc} failed to compile the layout probe"),
        Err(err) => {
            eprintln!("SKIP c_and_rust_layouts_match: no C compiler ({cc}: {err})");
            return;
        }
    }
    let out = String::from_utf8(Command::new(&exe).output().expect("run").stdout).expect("utf-8");
    let c_layout: std::collections::HashMap<&str, usize> =
        out.lines().filter_map(|l| l.split_once(' ')).map(|(k, v)| (k, v.parse().expect("number"))).collect();
    let rust_layout = [
        ("size", size_of::<BatchProbe>()),
        ("dataset_id", offset_of!(BatchProbe, dataset_id)),
        ("client_id", offset_of!(BatchProbe, client_id)),
        ("lane", offset_of!(BatchProbe, lane)),
        ("pad", offset_of!(BatchProbe, pad)),
        ("ranges", offset_of!(BatchProbe, ranges)),
        ("failed_ranges", offset_of!(BatchProbe, failed_ranges)),
        ("bytes", offset_of!(BatchProbe, bytes)),
        ("submit_ns", offset_of!(BatchProbe, submit_ns)),
        ("complete_ns", offset_of!(BatchProbe, complete_ns)),
        ("size_hist", offset_of!(BatchProbe, size_hist)),
        ("lane_source", offset_of!(BatchProbe, lane_source)),
        ("flow", offset_of!(BatchProbe, flow)),
        ("flow_generation", offset_of!(BatchProbe, flow_generation)),
        ("peer", offset_of!(BatchProbe, peer)),
    ];
    for (name, offset) in rust_layout {
        assert_eq!(c_layout.get(name), Some(&offset), "{name}: C {:?}, Rust {offset}", c_layout.get(name));
    }
}

/// The checked-in objects are exactly what `bpf/build.sh` makes of the sources.
#[test]
fn checked_in_object_matches_source() {
    if Command::new("clang").arg("--version").output().is_err() {
        eprintln!("SKIP checked_in_object_matches_source: clang is not installed (apt-get install clang libbpf-dev)");
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let status = Command::new("sh").arg(format!("{CRATE}/bpf/build.sh")).arg(dir.path()).status().expect("build.sh");
    assert!(status.success(), "bpf/build.sh failed");
    let objects = [
        ("trace.bpf.o", sluice_ebpf::TRACE_OBJECT),
        ("steer.bpf.o", sluice_ebpf::steer::STEER_OBJECT),
        ("policy.bpf.o", sluice_ebpf::steer::DEFAULT_POLICY_OBJECT),
        ("all_bulk.bpf.o", sluice_ebpf::steer::ALL_BULK_POLICY_OBJECT),
        ("uring.bpf.o", sluice_ebpf::uring::URING_OBJECT),
    ];
    let sources = std::fs::read_dir(format!("{CRATE}/bpf")).expect("bpf/").flatten();
    let source_count = sources.filter(|e| e.file_name().to_string_lossy().ends_with(".bpf.c")).count();
    assert_eq!(source_count, objects.len(), "every bpf/*.bpf.c is embedded and checked here");
    for (name, embedded) in objects {
        let built = std::fs::read(dir.path().join(name)).expect("built object");
        assert!(built == embedded, "bpf/{name} is stale: run ebpf/bpf/build.sh and commit it");
    }
}

fn attach_or_skip(test: &str) -> Option<Tracer> {
    if !nix_is_root() {
        eprintln!("SKIP {test}: loading BPF programs needs root (or CAP_BPF and CAP_PERFMON)");
        return None;
    }
    let exe = std::env::current_exe().expect("test binary path");
    match Tracer::attach(&exe, Scope::ThisProcess, Duration::from_millis(50)) {
        Ok(tracer) => Some(tracer),
        Err(err) if err.is_permission() => {
            eprintln!("SKIP {test}: the kernel does not permit BPF here: {err}");
            None
        }
        Err(err) => panic!("attaching the trace program: {err:?}"),
    }
}

fn nix_is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// A known mix of batches through a real data plane gives exact counts,
/// size histograms per lane, and a latency histogram with every batch.
#[test]
fn trace_counts_a_known_mix_exactly() {
    let Some(tracer) = attach_or_skip("trace_counts_a_known_mix_exactly") else { return };
    let driver: Arc<dyn BlockDriver> = Arc::new(MemDriver);
    let ns = driver.open_namespace(&NamespaceSpec::Mem).expect("namespace");
    ns.write_at(0, &vec![7u8; 4 << 20]).expect("write");
    let config = DataPlaneConfig { cores: 2, slots_per_core: 64, ..DataPlaneConfig::default() };
    let plane = DataPlane::start(driver, config).expect("data plane");
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    runtime.block_on(async {
        let view = DatasetView::unverified(4242, ns, 4 << 20);
        let slot = plane.attach(Arc::new(view)).await.expect("attach");
        let small = |i: u64| ByteRange { offset_bytes: i * 8192, len_bytes: 4096 };
        let tiny = |i: u64| ByteRange { offset_bytes: i * 1000 + 3, len_bytes: 100 };
        for i in 0..10 {
            let ranges = vec![small(i), small(i + 1), small(i + 2), tiny(i), tiny(i + 7)];
            plane.read(slot, ranges).await.expect("latency batch");
        }
        for i in 0..3 {
            plane
                .read(slot, vec![ByteRange { offset_bytes: i * 700_000, len_bytes: 600_000 }])
                .await
                .expect("bulk batch");
        }
        let past_end = vec![ByteRange { offset_bytes: 4 << 20, len_bytes: 1 }];
        plane.read(slot, past_end).await.expect("batch with a failed range");
    });
    plane.shutdown();

    let entries = tracer.snapshot().expect("snapshot");
    let find = |lane: u8| {
        entries
            .iter()
            .find(|(k, _)| k.dataset_id == 4242 && k.lane == u32::from(lane))
            .map(|(_, s)| *s)
            .unwrap_or_else(|| panic!("no entry for lane {lane}: {entries:?}"))
    };
    let latency = find(LANE_LATENCY);
    assert_eq!(latency.batches, 11);
    assert_eq!(latency.ranges, 51);
    assert_eq!(latency.bytes, 10 * (3 * 4096 + 2 * 100) + 1);
    assert_eq!(latency.failed_ranges, 1);
    assert_eq!(latency.size_log2[size_bucket(4096)], 30);
    assert_eq!(latency.size_log2[size_bucket(100)], 20);
    assert_eq!(latency.size_log2[size_bucket(1)], 1);
    assert_eq!(latency.latency_log2_us.iter().sum::<u64>(), 11);
    let bulk = find(LANE_BULK);
    assert_eq!((bulk.batches, bulk.ranges, bulk.bytes), (3, 3, 1_800_000));
    assert_eq!(bulk.size_log2[size_bucket(600_000)], 3);
}
