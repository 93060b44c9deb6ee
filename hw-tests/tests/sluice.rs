//! sluice end to end across the rig: `sluiced` in the storage guest keeps a
//! dataset on a whole NVMe namespace (uring backend on `/dev/nvmeXnY`) and
//! serves it over TCP across the virtual wire to `sluicectl` in the training
//! guest, byte-exact.

use hw_tests::{require, Host, Rig, SLUICE_CONTROL_PORT as CONTROL_PORT};
use rand::{Rng, SeedableRng};

const DATASET_BYTES: usize = 24 << 20;

#[test]
fn serves_a_dataset_on_an_nvme_namespace_to_the_training_guest() {
    let Some(rig) = require(Rig::builder("sluice-nvme").hosts(2).nvme(1, 2).namespace_mib(128).memory_mib(1536).boot())
    else {
        return;
    };
    let sluicectl = rig.sluice_binary("sluicectl").expect("sluicectl");
    let devices = rig.namespace_devices(&rig.nvme_controllers()[0]).expect("namespaces");
    let [(1, dev1), (2, dev2)] = &devices[..] else { panic!("expected namespaces 1 and 2, found {devices:?}") };
    let storage = rig.addr(Host::Storage);
    // Off loopback, the node serves TLS on both ports, with a CA made for
    // this run; the operator's commands carry the token it made itself.
    let endpoint = format!("https://{storage}:{CONTROL_PORT}");
    let tls = rig.tls().expect("TLS material");
    let trust = tls.ctl_args();
    let operator = format!("--admin-token-file {}", rig.admin_token_file());
    let auth = |host: Host| if host == Host::Storage { operator.clone() } else { String::new() };

    let mut rng = rand::rngs::StdRng::seed_from_u64(0x51u64);
    let mut data = vec![0u8; DATASET_BYTES];
    rng.fill(&mut data[..]);
    let data_file = rig.share_file("data.bin", &data).expect("share the dataset");
    let (shared_here, shared) = rig.shared_dir();
    let scratch = rig.scratch_dir(Host::Storage);

    rig.start_sluiced(&storage, &format!("--namespace-device {dev1} --namespace-device {dev2} {}", tls.sluiced_args()))
        .expect("start sluiced");

    // The operator's side, on the storage host.
    let ctl = |host: Host, args: &str| {
        rig.sh(host, &format!("{sluicectl} --endpoint {endpoint} {trust} {} {args}", auth(host)))
    };
    ctl(Host::Storage, "dataset create tokens --kind bytes").expect("create");
    ctl(Host::Storage, &format!("dataset ingest tokens {data_file}")).expect("ingest");
    ctl(Host::Storage, "dataset seal tokens").expect("seal");
    let stat: serde_json::Value =
        serde_json::from_str(&ctl(Host::Storage, "--json dataset stat tokens").expect("stat")).expect("stat json");
    assert_eq!(stat["namespace"]["kind"], "device", "{stat}");
    assert_eq!(stat["namespace"]["path"], dev1.as_str(), "{stat}");
    assert_eq!(stat["length_bytes"], DATASET_BYTES as u64, "{stat}");
    let devices: serde_json::Value =
        serde_json::from_str(&ctl(Host::Storage, "--json devices ls").expect("devices ls")).expect("devices json");
    let held = devices.as_array().and_then(|d| d.iter().find(|d| d["path"] == dev1.as_str())).expect("dev1 listed");
    assert_eq!(held["datasets"], serde_json::json!(["tokens"]), "{devices}");
    assert_eq!(held["capacity_bytes"], 128u64 << 20, "{devices}");
    // The bytes are on the namespace itself, from its first block.
    rig.sh(
        Host::Storage,
        &format!("dd if={dev1} iflag=direct bs=1M count={} 2>/dev/null | cmp - {data_file}", DATASET_BYTES >> 20),
    )
    .expect("the namespace holds the dataset");

    // Reads need a grant: none, no bytes; the operator issues one.
    let denied = rig
        .exec(
            Host::Training,
            &format!("{sluicectl} --endpoint {endpoint} {trust} read tokens --offset 0 --len 1 -o /tmp/none"),
        )
        .expect("run read");
    assert!(!denied.success() && denied.stderr.contains("needs a grant"), "{}", denied.stderr);
    let grant: serde_json::Value = serde_json::from_str(
        &ctl(Host::Storage, "--json grant create tokens --client trainer@training").expect("grant create"),
    )
    .expect("grant json");
    let token = grant["token"].as_str().expect("token").to_string();
    let ctl = |host: Host, args: &str| {
        rig.sh(host, &format!("{sluicectl} --endpoint {endpoint} {trust} {} --token {token} {args}", auth(host)))
    };

    // The training side: random unaligned reads across the wire.
    for i in 0..12 {
        let len = rng.gen_range(1..=(1usize << 20));
        let offset = rng.gen_range(0..=DATASET_BYTES - len);
        let out = format!("{shared}/read-{i}.bin");
        ctl(Host::Training, &format!("read tokens --offset {offset} --len {len} -o {out}")).expect("read");
        let got = std::fs::read(shared_here.join(format!("read-{i}.bin"))).expect("read output");
        assert!(got == data[offset..offset + len], "read {i} ({offset}+{len}) differs from the dataset");
    }
    let out_of_range = rig
        .exec(
            Host::Training,
            &format!(
                "{sluicectl} --endpoint {endpoint} {trust} --token {token} read tokens --offset {DATASET_BYTES} --len 1 -o /tmp/none"
            ),
        )
        .expect("run read");
    assert!(!out_of_range.success(), "a read past the end must fail");
    assert!(out_of_range.stderr.contains("out of bounds"), "says why: {}", out_of_range.stderr);

    let bench =
        ctl(Host::Training, "--json bench read tokens --size 4096 --batch 32 --inflight 2 --seconds 3 --align 1")
            .expect("bench read");
    let report: serde_json::Value = serde_json::from_str(bench.trim()).expect("bench json");
    assert_eq!(report["transport"], "tcp", "{report}");
    assert_eq!(report["failed_ranges"], 0, "{report}");
    assert!(report["reads"].as_u64().unwrap_or(0) > 0, "{report}");
    eprintln!("rig bench read (TCG, functional speed only): {report}");

    // Delete gives the namespace back, discarded; the next dataset gets it.
    ctl(Host::Storage, "dataset rm tokens").expect("rm");
    let zeros = rig
        .sh(Host::Storage, &format!("dd if={dev1} iflag=direct bs=1M count=1 2>/dev/null | tr -d '\\000' | wc -c"))
        .expect("read the released namespace");
    assert_eq!(zeros.trim(), "0", "the released namespace reads back deallocated (zeros)");
    ctl(Host::Storage, "dataset create again --kind bytes").expect("create again");
    let stat: serde_json::Value =
        serde_json::from_str(&ctl(Host::Storage, "--json dataset stat again").expect("stat")).expect("stat json");
    assert_eq!(stat["namespace"]["path"], dev1.as_str(), "the released namespace is reused: {stat}");
    rig.sh(Host::Storage, &format!("kill $(cat {scratch}/sluiced.pid)")).expect("stop sluiced");
}

/// With `--nvme-controller`, each new dataset gets a namespace attached
/// from the controller's detached pool through NVMe admin commands; delete
/// detaches it again; when the pool is empty, or no namespace holds the
/// size asked, a dataset gets a file. With a size, the allocator first asks
/// the controller to create a namespace of that size: QEMU's controller
/// advertises Namespace Management and refuses create, and the refusal
/// (with its NVMe status) is in the reason of the namespace it took
/// instead. Then the same node again as `--user nobody`: its NVMe admin
/// helper detaches, attaches and opens the namespaces, and a dataset on an
/// attached namespace reads byte-exact before and after a restart.
#[test]
fn attaches_a_detached_namespace_per_dataset_and_detaches_it_on_delete() {
    let Some(rig) =
        require(Rig::builder("sluice-attach").nvme(1, 3).detached(2).namespace_mib(64).memory_mib(1536).boot())
    else {
        return;
    };
    if !rig.is_emulated() {
        eprintln!("SKIPPED: attaching and detaching changes a real controller's namespaces; run it in the rig only");
        return;
    }
    let sluicectl = rig.sluice_binary("sluicectl").expect("sluicectl");
    let controller = rig.nvme_controllers()[0].clone();
    let attached = |rig: &Rig| -> Vec<u32> {
        rig.namespace_devices(&controller).expect("namespaces").into_iter().map(|(nsid, _)| nsid).collect()
    };
    assert_eq!(attached(&rig), [1], "namespaces 2 and 3 start detached");
    let scratch = rig.scratch_dir(Host::Storage);
    let endpoint = format!("http://127.0.0.1:{CONTROL_PORT}");
    rig.start_sluiced("127.0.0.1", &format!("--insecure --nvme-controller /dev/{}", controller.name))
        .expect("start sluiced");
    let ctl = |args: &str| rig.sh(Host::Storage, &format!("{sluicectl} --endpoint {endpoint} {args}"));
    let stat = |name: &str| -> serde_json::Value {
        serde_json::from_str(&ctl(&format!("--json dataset stat {name}")).expect("stat")).expect("stat json")
    };

    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let mut data = vec![0u8; 3 << 20];
    rng.fill(&mut data[..]);
    let file = rig.share_file("attach.bin", &data).expect("share");
    ctl("dataset create first --kind bytes").expect("create first");
    let first = stat("first");
    assert_eq!(first["namespace"]["kind"], "device", "{first}");
    assert_eq!(first["namespace"]["attached"], format!("/dev/{}:2", controller.name), "{first}");
    assert_eq!(attached(&rig), [1, 2], "namespace 2 attached for the dataset");
    ctl(&format!("dataset ingest first {file}")).expect("ingest");
    ctl("dataset seal first").expect("seal");
    let offset = 1_234_567usize;
    let got = rig
        .sh(
            Host::Storage,
            &format!("{sluicectl} --endpoint {endpoint} read first --offset {offset} --len 4000 | od -An -tx1 -v"),
        )
        .expect("read");
    let expected: String = data[offset..offset + 4000].iter().map(|b| format!(" {b:02x}")).collect();
    assert_eq!(got.split_whitespace().collect::<Vec<_>>(), expected.split_whitespace().collect::<Vec<_>>());

    ctl("dataset create second --kind bytes").expect("create second");
    assert_eq!(stat("second")["namespace"]["attached"], format!("/dev/{}:3", controller.name));
    // `devices ls` lists the controller's namespaces and who holds them.
    let devices: serde_json::Value =
        serde_json::from_str(&ctl("--json devices ls").expect("devices ls")).expect("devices json");
    let pool: Vec<(String, String, u64, Vec<String>)> = devices
        .as_array()
        .expect("devices")
        .iter()
        .filter(|d| d["path"].as_str().unwrap_or("").starts_with(&format!("/dev/{}:", controller.name)))
        .map(|d| {
            let datasets = d["datasets"].as_array().expect("datasets").iter().map(|n| n.to_string()).collect();
            (d["path"].to_string(), d["kind"].to_string(), d["capacity_bytes"].as_u64().expect("capacity"), datasets)
        })
        .collect();
    let entry = |nsid: u32, datasets: &[&str]| {
        let path = format!("\"/dev/{}:{nsid}\"", controller.name);
        let datasets = datasets.iter().map(|d| format!("\"{d}\"")).collect();
        (path, "\"nvme_attached\"".to_string(), 64u64 << 20, datasets)
    };
    assert_eq!(pool, vec![entry(1, &[]), entry(2, &["first"]), entry(3, &["second"])], "{devices}");
    ctl("dataset create third --kind bytes").expect("create third");
    let third = stat("third");
    assert_eq!(third["namespace"]["kind"], "file", "the pool is empty: {third}");
    assert!(third["namespace"]["reason"].as_str().unwrap_or("").contains("no detached namespace"), "{third}");

    ctl("dataset rm first").expect("rm first");
    assert_eq!(attached(&rig), [1, 3], "namespace 2 detached again");
    let devices = ctl("--json devices ls").expect("devices ls");
    let free = format!(
        r#""kind":"nvme_detached","path":"/dev/{}:2","capacity_bytes":{},"used_bytes":0,"datasets":[]"#,
        controller.name,
        64u64 << 20
    );
    assert!(devices.contains(&free), "namespace 2 listed free: {devices}");
    // A size no namespace holds gets a file and leaves the pool alone.
    ctl(&format!("dataset create huge --kind bytes --size {}", 128u64 << 20)).expect("create huge");
    let huge = stat("huge");
    assert_eq!(huge["namespace"]["kind"], "file", "{huge}");
    let reason = huge["namespace"]["reason"].as_str().unwrap_or("");
    assert!(reason.contains(&format!("holds {} bytes", 128u64 << 20)), "{huge}");
    assert!(reason.contains("namespace create refused") && reason.contains("NVMe status"), "{huge}");
    assert_eq!(attached(&rig), [1, 3], "namespace 2 still detached");
    ctl("dataset create fourth --kind bytes --size 1000000").expect("create fourth");
    let fourth = stat("fourth");
    assert_eq!(fourth["namespace"]["attached"], format!("/dev/{}:2", controller.name), "reused: {fourth}");
    let reason = fourth["namespace"]["reason"].as_str().unwrap_or("");
    assert!(reason.contains(&format!("{} bytes", 64u64 << 20)) && reason.contains("1000000 bytes asked"), "{fourth}");
    assert!(reason.contains("namespace create refused"), "create was tried first: {fourth}");
    assert_eq!(fourth["namespace"].get("created"), None, "a pool namespace is not deleted on release: {fourth}");

    // The same node as an unprivileged user: its helper detaches, attaches
    // and opens namespaces for it, before and after a restart.
    let stop =
        format!("pid=$(cat {scratch}/sluiced.pid); kill $pid; while kill -0 $pid 2>/dev/null; do sleep 0.1; done");
    rig.sh(Host::Storage, &stop).expect("stop sluiced");
    // The service user must reach its data directory under /root.
    rig.sh(Host::Storage, &format!("chmod o+x /root {scratch}")).expect("chmod");
    let as_user = format!("--insecure --user nobody --nvme-controller /dev/{}", controller.name);
    rig.start_sluiced("127.0.0.1", &as_user).expect("start sluiced --user");
    let owner = rig.sh(Host::Storage, &format!("ps -o user= -p $(cat {scratch}/sluiced.pid)")).expect("ps");
    assert_eq!(owner.trim(), "nobody", "the node dropped to --user");
    let helper = rig
        .sh(Host::Storage, "grep -E '^(Uid|CapEff):' /proc/$(pgrep -f -- --nvme-admin-helper)/status")
        .expect("helper status");
    assert!(helper.contains("0000000000200000") && helper.contains("Uid:\t0"), "root, CAP_SYS_ADMIN alone: {helper}");
    ctl("dataset rm fourth").expect("rm fourth as nobody");
    assert_eq!(attached(&rig), [1, 3], "the helper detached namespace 2");
    ctl("dataset create fifth --kind bytes").expect("create fifth as nobody");
    assert_eq!(stat("fifth")["namespace"]["attached"], format!("/dev/{}:2", controller.name));
    assert_eq!(attached(&rig), [1, 2, 3], "the helper attached namespace 2");
    ctl(&format!("dataset ingest fifth {file}")).expect("ingest as nobody");
    ctl("dataset seal fifth").expect("seal");
    let read_fifth = || {
        let got = rig
            .sh(
                Host::Storage,
                &format!("{sluicectl} --endpoint {endpoint} read fifth --offset {offset} --len 4000 | od -An -tx1 -v"),
            )
            .expect("read");
        assert_eq!(got.split_whitespace().collect::<Vec<_>>(), expected.split_whitespace().collect::<Vec<_>>());
    };
    read_fifth();
    rig.sh(Host::Storage, &stop).expect("stop sluiced --user");
    rig.start_sluiced("127.0.0.1", &as_user).expect("restart sluiced --user");
    read_fifth();
    ctl("dataset rm fifth").expect("rm fifth");
    assert_eq!(attached(&rig), [1, 3], "namespace 2 detached again");
    rig.sh(Host::Storage, &format!("kill $(cat {scratch}/sluiced.pid)")).expect("stop sluiced");
}
