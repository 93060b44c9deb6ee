//! eBPF on the rig's guest kernel (Debian's 6.1, where the host runs a
//! newer one): `sluiced --ebpf` in the storage guest attaches its trace,
//! the default steering policy, `sk_reuseport` and the io_uring tracepoints
//! there too, and the tracepoint fields sit at the offsets
//! `ebpf/bpf/uring.bpf.c` reads.

use hw_tests::{require, Host, Rig, SLUICE_CONTROL_PORT as CONTROL_PORT};

#[test]
fn sluiced_ebpf_attaches_on_the_guest_kernel() {
    let Some(rig) = require(Rig::builder("sluice-ebpf").nvme(1, 1).namespace_mib(64).memory_mib(1536).boot()) else {
        return;
    };
    let formats = rig
        .sh(
            Host::Storage,
            "grep -q tracefs /proc/mounts || mount -t tracefs tracefs /sys/kernel/tracing; \
             cd /sys/kernel/tracing/events/io_uring; \
             cat $(ls -d io_uring_submit_req io_uring_submit_sqe 2>/dev/null | head -1)/format io_uring_complete/format",
        )
        .expect("tracepoint formats");
    for field in ["void * ctx;\toffset:8;", "void * req;\toffset:16;", "user_data;\toffset:24;", "int res;\toffset:32;"]
    {
        assert!(formats.contains(field), "{field:?} is not where uring.bpf.c reads it:\n{formats}");
    }

    let sluicectl = rig.sluice_binary("sluicectl").expect("sluicectl");
    let device = rig.namespace_devices(&rig.nvme_controllers()[0]).expect("namespaces")[0].1.clone();
    let data = (0..(8u32 << 20)).map(|i| (i % 251) as u8).collect::<Vec<_>>();
    let data_file = rig.share_file("ebpf.bin", &data).expect("share");
    rig.start_sluiced("127.0.0.1", &format!("--insecure --ebpf --namespace-device {device}")).expect("start sluiced");
    let endpoint = format!("http://127.0.0.1:{CONTROL_PORT}");
    let ctl = |args: &str| rig.sh(Host::Storage, &format!("{sluicectl} --endpoint {endpoint} {args}"));
    ctl("dataset create traced --kind bytes").expect("create");
    ctl(&format!("dataset ingest traced {data_file}")).expect("ingest");
    ctl("dataset seal traced").expect("seal");
    let bench = ctl("--json bench read traced --size 4096 --batch 16 --seconds 2").expect("bench read");
    let report: serde_json::Value = serde_json::from_str(bench.trim()).expect("bench json");
    assert_eq!(report["failed_ranges"], 0, "{report}");

    let policy: serde_json::Value =
        serde_json::from_str(&ctl("--json policy show").expect("policy show")).expect("policy json");
    assert_eq!(policy["available"], true, "steering on the guest kernel: {policy}");
    assert_eq!(policy["policy"]["name"], "default", "{policy}");
    assert_eq!(policy["flows"]["latency"], 1, "the 4 KiB reader was decided latency: {policy}");
    let top: serde_json::Value = serde_json::from_str(&ctl("top --json --once").expect("top")).expect("top json");
    assert_eq!(top["available"], true, "{top}");
    let entry = top["entries"].as_array().and_then(|e| e.iter().find(|e| e["dataset"] == "traced")).expect("traced");
    let batches = entry["batches"].as_u64().expect("batches");
    assert!(batches > 0, "{top}");
    assert_eq!(entry["ranges"].as_u64(), Some(batches * 16), "16 ranges a batch, each counted once: {top}");
    let kernel = &top["kernel"];
    assert_eq!(kernel["available"], true, "io_uring tracepoints on the guest kernel: {kernel}");
    assert!(kernel["requests"].as_u64().unwrap_or(0) > 0, "{kernel}");
    assert_eq!(kernel["errors"], 0, "{kernel}");
    let scratch = rig.scratch_dir(Host::Storage);
    rig.sh(Host::Storage, &format!("kill $(cat {scratch}/sluiced.pid)")).expect("stop sluiced");
}
