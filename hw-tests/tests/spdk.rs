//! The SPDK driver in the rig: a controller handed to vfio-pci, `sluiced
//! --driver spdk --nvme PCI` owns it from user space (queue pairs polled per
//! core, the DMA arena in hugepages registered with SPDK); datasets get
//! whole namespaces through SPDK (an active one, else one attached from the
//! detached pool after QEMU refuses namespace create), are read byte-exact
//! from the training guest over TCP and over RDMA (soft-RoCE: the node
//! RDMA-WRITEs from the same hugepage arena SPDK reads into, registered
//! with both), and go back to the pool on delete.
//!
//! Needs an SPDK install that pkg-config finds (PKG_CONFIG_PATH); without
//! one it skips and says so (`SLUICE_SPDK_REQUIRE=1` makes that a failure).

use std::path::{Path, PathBuf};
use std::process::Command;

use hw_tests::{require, Host, Rig, SLUICE_CONTROL_PORT as CONTROL_PORT};
use rand::{Rng, SeedableRng};

const DATASET_BYTES: usize = 6 << 20;
const RDMA_PORT: u16 = 7473;

/// `sluiced` and `sluicectl` built with `--features spdk`, or why not.
fn spdk_binaries() -> Option<(String, String)> {
    let found = Command::new("pkg-config").args(["--exists", "spdk_nvme", "spdk_env_dpdk"]).status();
    if !found.is_ok_and(|s| s.success()) {
        let why = "SKIPPED: no SPDK install that pkg-config finds (spdk_nvme, spdk_env_dpdk): \
                   set PKG_CONFIG_PATH=<SPDK prefix>/lib/pkgconfig to run the SPDK driver in the rig";
        assert!(std::env::var("SLUICE_SPDK_REQUIRE").as_deref() != Ok("1"), "{why}");
        eprintln!("{why}");
        return None;
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().map(Path::to_path_buf).unwrap_or_default();
    let target = root.join("target").join("spdk");
    let status = hw_tests::cargo()
        .args(["build", "--release", "-p", "sluice", "--bins", "--features", "spdk rdma", "--target-dir"])
        .arg(&target)
        .current_dir(&root)
        .status()
        .expect("run cargo build --features spdk");
    assert!(status.success(), "building sluice with --features spdk failed: {status}");
    let bin = |name: &str| -> String {
        let path: PathBuf = target.join("release").join(name);
        assert!(path.is_file(), "{} was not built", path.display());
        path.display().to_string()
    };
    Some((bin("sluiced"), bin("sluicectl")))
}

#[test]
fn serves_datasets_from_a_controller_spdk_owns() {
    let Some((sluiced, sluicectl)) = spdk_binaries() else { return };
    let Some(rig) = require(
        Rig::builder("spdk")
            .hosts(2)
            .nvme(1, 3)
            .detached(1)
            .namespace_mib(64)
            .memory_mib(2048)
            .hugepages(512)
            .rdma(true)
            .boot(),
    ) else {
        return;
    };
    if !rig.is_emulated() {
        eprintln!("SKIPPED: this takes a controller from the kernel and changes its namespaces; rig only");
        return;
    }
    let pci = rig.nvme_controllers()[0].pci.clone();
    rig.sh(
        Host::Storage,
        &format!(
            "echo {pci} > /sys/bus/pci/drivers/nvme/unbind && \
             echo vfio-pci > /sys/bus/pci/devices/{pci}/driver_override && \
             echo {pci} > /sys/bus/pci/drivers_probe && \
             test \"$(basename $(readlink -f /sys/bus/pci/devices/{pci}/driver))\" = vfio-pci"
        ),
    )
    .expect("hand the controller to vfio-pci");

    let storage = rig.addr(Host::Storage);
    let endpoint = format!("http://{storage}:{CONTROL_PORT}");
    let mut rng = rand::rngs::StdRng::seed_from_u64(0x5bd4);
    let mut data = vec![0u8; DATASET_BYTES];
    rng.fill(&mut data[..]);
    let data_file = rig.share_file("spdk-data.bin", &data).expect("share the dataset");
    let (shared_here, shared) = rig.shared_dir();
    let scratch = rig.scratch_dir(Host::Storage);
    if let Err(err) = rig.start_sluiced_binary(
        &sluiced,
        &storage,
        &format!("--insecure --driver spdk --nvme {pci} --rdma-listen {storage}:{RDMA_PORT}"),
    ) {
        let log = std::fs::read_to_string(shared_here.join("sluiced.log")).unwrap_or_default();
        panic!("sluiced --driver spdk did not start: {err}\n{log}");
    }
    let ctl = |host: Host, args: &str| rig.sh(host, &format!("{sluicectl} --endpoint {endpoint} {args}"));
    let stat = |name: &str| -> serde_json::Value {
        serde_json::from_str(&ctl(Host::Storage, &format!("--json dataset stat {name}")).expect("stat"))
            .expect("stat json")
    };

    // Ingest and seal through SPDK's control path (unaligned file size:
    // read-modify-write of the tail sector).
    ctl(Host::Storage, "dataset create first --kind bytes").expect("create");
    ctl(Host::Storage, &format!("dataset ingest first {data_file}")).expect("ingest");
    ctl(Host::Storage, "dataset seal first").expect("seal");
    let first = stat("first");
    assert_eq!(first["namespace"]["kind"], "nvme", "{first}");
    assert_eq!(first["namespace"]["path"], format!("{pci}/1"), "{first}");
    assert_eq!(first["length_bytes"], DATASET_BYTES as u64, "{first}");

    // The training guest reads it over TCP; the bytes come from SPDK's
    // queue pairs into the arena and out of the wire.
    for i in 0..8 {
        let len = rng.gen_range(1..=(1usize << 20));
        let offset = rng.gen_range(0..=DATASET_BYTES - len);
        let out = format!("{shared}/spdk-read-{i}.bin");
        ctl(Host::Training, &format!("read first --offset {offset} --len {len} -o {out}")).expect("read");
        let got = std::fs::read(shared_here.join(format!("spdk-read-{i}.bin"))).expect("read output");
        assert!(got == data[offset..offset + len], "read {i} ({offset}+{len}) differs from the dataset");
    }
    // Over RDMA: the node writes each range from the arena SPDK read into.
    let bench = ctl(
        Host::Training,
        &format!(
            "--transport rdma --json bench read first --size 4096 --align 1 --batch 64 --inflight 2 --seconds 2 \
             --verify {data_file}"
        ),
    )
    .expect("bench read over RDMA");
    let report: serde_json::Value = serde_json::from_str(bench.trim()).expect("bench json");
    assert_eq!(report["transport"], "rdma", "{report}");
    assert_eq!(
        (report["failed_ranges"].as_u64(), report["mismatched_ranges"].as_u64()),
        (Some(0), Some(0)),
        "{report}"
    );
    assert!(report["reads"].as_u64().unwrap_or(0) > 0, "{report}");
    eprintln!("rig SPDK + RDMA bench (TCG, functional speed only): {report}");

    let scrub = ctl(Host::Storage, "--json scrub first").expect("scrub through the SPDK queue pairs");
    assert!(scrub.contains("\"bad_chunks\":[]"), "{scrub}");

    // The second active namespace, then the detached one: QEMU refuses
    // namespace create, so SPDK attaches the pool's namespace 3.
    ctl(Host::Storage, "dataset create second --kind bytes").expect("create second");
    assert_eq!(stat("second")["namespace"]["path"], format!("{pci}/2"));
    ctl(Host::Storage, "dataset create third --kind bytes --size 1000000").expect("create third");
    let third = stat("third");
    assert_eq!(third["namespace"]["path"], format!("{pci}/3"), "{third}");
    let reason = third["namespace"]["reason"].as_str().unwrap_or("");
    eprintln!("third dataset's namespace: {reason}");
    assert!(reason.contains("attached for it (SPDK)") && reason.contains("refused"), "{third}");
    let full = rig
        .exec(Host::Storage, &format!("{sluicectl} --endpoint {endpoint} dataset create fourth --kind bytes"))
        .expect("run create");
    assert!(!full.success() && full.stderr.contains("no free NVMe namespace"), "{}", full.stderr);
    // Delete detaches it through SPDK; the next dataset attaches it again.
    ctl(Host::Storage, "dataset rm third").expect("rm third");
    ctl(Host::Storage, "dataset create fourth --kind bytes").expect("create fourth");
    assert_eq!(stat("fourth")["namespace"]["path"], format!("{pci}/3"));

    rig.sh(Host::Storage, &format!("kill $(cat {scratch}/sluiced.pid); sleep 3")).expect("stop sluiced");
    let log = std::fs::read_to_string(shared_here.join("sluiced.log")).unwrap_or_default();
    assert!(log.contains(&format!("SPDK detached the NVMe controller at {pci}")), "clean shutdown: {log}");
}

/// CPU seconds (user + system) the process `pid` on `host` has used.
fn cpu_seconds(rig: &Rig, host: Host, pid: &str) -> f64 {
    let stat = rig.sh(host, &format!("cat /proc/{pid}/stat; getconf CLK_TCK")).expect("read /proc stat");
    let mut lines = stat.lines();
    let fields: Vec<&str> =
        lines.next().and_then(|l| l.rsplit_once(") ")).map(|(_, rest)| rest).unwrap_or("").split(' ').collect();
    let ticks: f64 = lines.next().and_then(|t| t.trim().parse().ok()).unwrap_or(100.0);
    // utime and stime are fields 14 and 15 of /proc/PID/stat (11 and 12
    // after the command name).
    let field = |i: usize| fields.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    (field(11) + field(12)) / ticks
}

/// Benchmark, not a test (`cargo test -p hw-tests --test spdk -- --ignored
/// --nocapture`): the same emulated controller served by the uring backend
/// (kernel NVMe driver, O_DIRECT) and by the SPDK backend (vfio-pci), the
/// same random 4 KiB reads from a client on the storage guest: IOPS and the
/// node's CPU time per read, in one run. Under TCG both are emulation-bound;
/// the ratio is what carries over.
#[test]
#[ignore = "benchmark: run explicitly"]
fn bench_spdk_against_uring_on_one_controller() {
    let Some((sluiced, sluicectl)) = spdk_binaries() else { return };
    let Some(rig) =
        require(Rig::builder("spdk-bench").nvme(1, 1).namespace_mib(256).memory_mib(2048).hugepages(512).boot())
    else {
        return;
    };
    let controller = rig.nvme_controllers()[0].clone();
    let pci = controller.pci.clone();
    let device = rig.namespace_devices(&controller).expect("namespaces")[0].1.clone();
    // One guest: the client runs beside the node, over loopback.
    let storage = "127.0.0.1".to_string();
    let endpoint = format!("http://{storage}:{CONTROL_PORT}");
    let scratch = rig.scratch_dir(Host::Storage);
    let mut data = vec![0u8; 64 << 20];
    rand::rngs::StdRng::seed_from_u64(9).fill(&mut data[..]);
    let source = rig.share_file("bench.bin", &data).expect("share");
    let seconds = std::env::var("SLUICE_SPDK_BENCH_SECONDS").ok().and_then(|s| s.parse().ok()).unwrap_or(10u32);

    let mut rows = Vec::new();
    for (backend, args) in [
        ("uring", format!("--insecure --namespace-device {device}")),
        ("spdk", format!("--insecure --driver spdk --nvme {pci}")),
    ] {
        if backend == "spdk" {
            rig.sh(
                Host::Storage,
                &format!(
                    "echo {pci} > /sys/bus/pci/drivers/nvme/unbind && \
                     echo vfio-pci > /sys/bus/pci/devices/{pci}/driver_override && \
                     echo {pci} > /sys/bus/pci/drivers_probe"
                ),
            )
            .expect("hand the controller to vfio-pci");
        }
        rig.sh(Host::Storage, &format!("rm -rf {scratch}/data")).expect("fresh data dir");
        rig.start_sluiced_binary(&sluiced, &storage, &args).expect("start sluiced");
        let ctl = |args: &str| rig.sh(Host::Storage, &format!("{sluicectl} --endpoint {endpoint} {args}"));
        ctl("dataset create bench --kind bytes").expect("create");
        ctl(&format!("dataset ingest bench {source}")).expect("ingest");
        ctl("dataset seal bench").expect("seal");
        let pid = rig.sh(Host::Storage, &format!("cat {scratch}/sluiced.pid")).expect("pid").trim().to_string();
        let before = cpu_seconds(&rig, Host::Storage, &pid);
        let report = ctl(&format!(
            "--transport tcp --json bench read bench --size 4096 --batch 32 --inflight 4 --seconds {seconds}"
        ))
        .expect("bench read");
        let cpu = cpu_seconds(&rig, Host::Storage, &pid) - before;
        let report: serde_json::Value = serde_json::from_str(report.trim()).expect("bench json");
        assert_eq!(report["failed_ranges"], 0, "{report}");
        let reads = report["reads"].as_u64().unwrap_or(0).max(1) as f64;
        let iops = report["iops"].as_f64().unwrap_or(0.0);
        rows.push((backend, iops, cpu * 1e6 / reads, report["batch_latency_us_p99"].as_u64().unwrap_or(0)));
        rig.sh(Host::Storage, &format!("kill $(cat {scratch}/sluiced.pid); sleep 3")).expect("stop sluiced");
    }
    let mut table = String::from("| backend | IOPS (4 KiB random, QD 128) | node CPU µs per read | p99 batch latency µs |\n| --- | --- | --- | --- |\n");
    for (backend, iops, cpu_us, p99) in &rows {
        table += &format!("| {backend} | {iops:.0} | {cpu_us:.1} | {p99} |\n");
    }
    if let [(_, uring_iops, uring_cpu, _), (_, spdk_iops, spdk_cpu, _)] = rows[..] {
        table += &format!(
            "\nspdk / uring: IOPS {:.2}, CPU per read {:.2} ({seconds} s each, same controller, same run)\n",
            spdk_iops / uring_iops.max(1.0),
            spdk_cpu / uring_cpu.max(1e-9)
        );
    }
    eprintln!("{table}");
    let out = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/spdk-bench.md");
    std::fs::write(&out, &table).expect("write the table");
}
