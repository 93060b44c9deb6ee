//! Transport choice on a host without RDMA (this one: no verbs devices):
//! `auto` falls back to TCP and says why, `rdma` fails saying why, and a
//! node asked to serve RDMA here refuses to start with a clear error.

mod common;

use common::{random_file, sealed_dataset, NodeProcess};
use sluice_client::blocking::Client;
use sluice_client::{ClientError, RangeStatus, ReadRange, TransportChoice};

#[test]
fn auto_falls_back_to_tcp_and_rdma_says_why_not() {
    let dir = tempfile::tempdir().expect("tempdir");
    let node = NodeProcess::start(&dir.path().join("node"));
    let data = random_file(&dir.path().join("a.bin"), 1 << 20, 3);
    sealed_dataset(&node, "a", &[&dir.path().join("a.bin")]);

    // The node serves no RDMA endpoint: auto picks TCP and says so.
    let client = Client::connect_with(&node.endpoint, TransportChoice::Auto).expect("connect");
    assert_eq!(client.transport(), "tcp");
    assert_eq!(client.node().rdma_addr, None);
    let reason = client.transport_reason();
    assert!(reason.contains("no RDMA endpoint") || reason.contains("no RDMA support"), "{reason}");

    // A reusable buffer is plain memory on TCP, and reads land in it.
    let dataset = client.open("a").expect("open");
    let mut buf = client.buffer(3 * 4096).expect("buffer");
    assert!(!buf.is_registered());
    let ranges = [
        ReadRange { offset: 17, len: 4096, dest: 0 },
        ReadRange { offset: 500_001, len: 4096, dest: 4096 },
        ReadRange { offset: (1 << 20) - 4096, len: 4096, dest: 8192 },
    ];
    let statuses = dataset.read_into(&ranges, &mut buf).expect("read_into");
    assert!(statuses.iter().all(|s| *s == RangeStatus::Ok), "{statuses:?}");
    for r in &ranges {
        let want = &data[r.offset as usize..][..r.len as usize];
        assert!(&buf[r.dest as usize..][..r.len as usize] == want, "{r:?}");
    }

    // Asking for RDMA fails, naming what is missing.
    match Client::connect_with(&node.endpoint, TransportChoice::Rdma) {
        Err(ClientError::Rdma(why)) => assert!(why.contains("RDMA"), "{why}"),
        Err(other) => panic!("expected an RDMA error, got {other}"),
        Ok(client) => panic!("RDMA connected on a host without it ({})", client.transport_reason()),
    }

    // The CLI: tcp and auto read; rdma fails with the reason.
    let out = dir.path().join("out.bin");
    for transport in ["tcp", "auto"] {
        node.ctl_ok(&[
            "read",
            "a",
            "--transport",
            transport,
            "--offset",
            "10",
            "--len",
            "1000",
            "-o",
            out.to_str().expect("path"),
        ]);
        assert!(std::fs::read(&out).expect("out") == data[10..1010]);
    }
    let refused = node.ctl(&["read", "a", "--transport", "rdma", "--offset", "0", "--len", "10"]);
    assert!(!refused.status.success());
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(stderr.contains("RDMA unavailable"), "{stderr}");
    let bench: serde_json::Value = serde_json::from_str(&node.ctl_ok(&[
        "--json",
        "bench",
        "read",
        "a",
        "--transport",
        "tcp",
        "--size",
        "4096",
        "--batch",
        "4",
        "--inflight",
        "1",
        "--seconds",
        "1",
    ]))
    .expect("bench json");
    assert_eq!(bench["transport"], "tcp", "{bench}");
    assert!(bench["reads"].as_u64().is_some_and(|reads| reads > 0), "{bench}");
    // The client's runtime: one worker by default, more when asked, never none.
    let args =
        ["--json", "bench", "read", "a", "--size", "4096", "--batch", "4", "--inflight", "2", "--seconds", "0.2"];
    let two: serde_json::Value =
        serde_json::from_str(&node.ctl_ok(&[&args[..], &["--client-threads", "2"]].concat())).expect("bench json");
    assert!(two["reads"].as_u64().is_some_and(|reads| reads > 0), "{two}");
    let none = node.ctl(&[&args[..], &["--client-threads", "0"]].concat());
    assert_eq!(none.status.code(), Some(2), "{}", String::from_utf8_lossy(&none.stderr));
}

/// `--rdma-listen` on a host with no RDMA device (or a build without the
/// feature) stops start-up with an error naming the RDMA transport.
#[test]
fn a_node_asked_for_rdma_without_a_device_refuses_to_start() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_sluiced"))
        .args(["--data-dir", dir.path().join("node").to_str().expect("path"), "--insecure", "--driver", "mem"])
        .args(["--listen", "127.0.0.1:0", "--control", "127.0.0.1:0", "--rdma-listen", "127.0.0.1:7472"])
        .output()
        .expect("run sluiced");
    let stderr = String::from_utf8_lossy(&out.stderr);
    if sluice_rdma_device_present() {
        eprintln!("skipped: this host has an RDMA device, so the refusal cannot be shown here");
        return;
    }
    assert!(!out.status.success(), "sluiced started: {stderr}");
    assert!(stderr.contains("RDMA transport on 127.0.0.1:7472"), "{stderr}");
}

/// Whether `/sys/class/infiniband` lists a device (soft-RoCE included).
fn sluice_rdma_device_present() -> bool {
    std::fs::read_dir("/sys/class/infiniband").is_ok_and(|mut d| d.next().is_some())
}
