//! TLS on the control API and the data port, with certificates made here
//! (rcgen, never committed): `sluicectl` and the client reach an
//! `https://` node through a CA file, a wrong CA fails with a message that
//! says so, reads over the TLS data port are byte-exact, an operator
//! certificate administers without a token, and a grant bound to
//! certificate X does not open from certificate Y even with the right
//! token.

mod common;

use std::path::Path;

use common::pki::{authority, issue};
use common::{random_file, NodeProcess};
use serde_json::Value;
use sluice_client::{ClientTlsFiles, OpenOptions, RangeStatus, ReadRange, TransportChoice};

fn path(p: &Path) -> &str {
    p.to_str().expect("utf-8 path")
}

fn stderr(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn tls_control_api_and_data_port_with_bound_grants() {
    let dir = tempfile::tempdir().expect("tempdir");
    let pki = dir.path().join("pki");
    std::fs::create_dir_all(&pki).expect("mkdir");
    let ca = authority(&pki, "sluice-test-ca");
    let stranger_ca = authority(&pki, "someone-elses-ca");
    let (node_cert, node_key) = issue(&pki, &ca, "node", true);
    let (x_cert, x_key) = issue(&pki, &ca, "trainer-x", false);
    let (y_cert, y_key) = issue(&pki, &ca, "trainer-y", false);
    let (ops_cert, ops_key) = issue(&pki, &ca, "ops-alice", false);
    let config = dir.path().join("node.toml");
    std::fs::write(
        &config,
        format!(
            "tls_cert = {node_cert:?}\ntls_key = {node_key:?}\ntls_client_ca = {:?}\ndata_tls = true\n\
             operator_cert_names = [\"ops-alice\"]\n",
            ca.pem
        ),
    )
    .expect("config");
    let node = NodeProcess::start_secure_with(&dir.path().join("node"), &["--config", path(&config)]);
    assert!(node.endpoint.starts_with("https://"), "{}", node.endpoint);
    let ca_args = ["--ca-file", path(&ca.pem)];

    // The operator, by token over HTTPS with the CA file.
    let bytes = random_file(&dir.path().join("a.bin"), 300_007, 9);
    for args in [
        vec!["dataset", "create", "a", "--kind", "bytes"],
        vec!["dataset", "ingest", "a", path(&dir.path().join("a.bin"))],
        vec!["dataset", "seal", "a"],
    ] {
        node.ctl_ok(&[&ca_args[..], &args].concat());
    }

    // A CA that did not sign the node's certificate, or none: refused,
    // saying why.
    for trust in [vec!["--ca-file", path(&stranger_ca.pem)], vec![]] {
        let out = node.ctl(&[&trust[..], &["dataset", "ls"]].concat());
        assert!(!out.status.success() && stderr(&out).contains("not trusted"), "{trust:?}: {}", stderr(&out));
    }

    // An operator certificate administers without a token; another
    // certificate is nobody.
    let as_ops = node.ctl_anonymous(
        &[&ca_args[..], &["--cert", path(&ops_cert), "--key", path(&ops_key), "dataset", "ls"]].concat(),
    );
    assert!(as_ops.status.success(), "{}", stderr(&as_ops));
    assert!(String::from_utf8_lossy(&as_ops.stdout).contains("sealed"));
    let as_x = node
        .ctl_anonymous(&[&ca_args[..], &["--cert", path(&x_cert), "--key", path(&x_key), "dataset", "ls"]].concat());
    assert!(!as_x.status.success() && stderr(&as_x).contains("unauthenticated"), "{}", stderr(&as_x));

    // Reads over the TLS data port, byte-exact.
    let unbound: Value = serde_json::from_str(
        &node.ctl_ok(&[&ca_args[..], &["--json", "grant", "create", "a", "--client", "any"]].concat()),
    )
    .expect("json");
    let trust = ClientTlsFiles { ca: Some(ca.pem.clone()), identity: None };
    let client = sluice_client::blocking::Client::connect_tls(&node.endpoint, TransportChoice::Tcp, trust.clone())
        .expect("connect over https");
    assert!(client.node().data_tls, "the node says its data port speaks TLS");
    let token = |grant: &Value| Some(grant["token"].as_str().expect("token").to_string());
    let dataset =
        client.open_with("a", OpenOptions { token: token(&unbound), verify_chunks: true }).expect("open over TLS");
    let mut buf = vec![0u8; bytes.len()];
    let ranges = [
        ReadRange { offset: 0, len: 4096, dest: 0 },
        ReadRange { offset: 12_345, len: 200_000, dest: 4096 },
        ReadRange { offset: 299_000, len: 1007, dest: 204_096 },
    ];
    assert_eq!(dataset.read_batch(&ranges, &mut buf).expect("read"), [RangeStatus::Ok; 3]);
    assert_eq!(&buf[..4096], &bytes[..4096]);
    assert_eq!(&buf[4096..204_096], &bytes[12_345..212_345]);
    assert_eq!(&buf[204_096..205_103], &bytes[299_000..]);
    // Responses far bigger than a TLS record or a socket buffer, byte-exact.
    // (The rig's TLS test over QEMU's slower wire is what caught frames
    // left unflushed in the session; loopback here drains too fast to.)
    let big = random_file(&dir.path().join("big.bin"), 48 << 20, 10);
    for args in [
        vec!["dataset", "create", "big", "--kind", "bytes"],
        vec!["dataset", "ingest", "big", path(&dir.path().join("big.bin"))],
        vec!["dataset", "seal", "big"],
    ] {
        node.ctl_ok(&[&ca_args[..], &args].concat());
    }
    let big_grant: Value = serde_json::from_str(
        &node.ctl_ok(&[&ca_args[..], &["--json", "grant", "create", "big", "--client", "any"]].concat()),
    )
    .expect("json");
    let dataset =
        client.open_with("big", OpenOptions { token: token(&big_grant), ..OpenOptions::default() }).expect("open");
    let mut whole = vec![0u8; big.len()];
    let pieces: Vec<ReadRange> =
        (0..48u64).map(|i| ReadRange { offset: i << 20, len: 1 << 20, dest: i << 20 }).collect();
    for _ in 0..3 {
        assert!(dataset.read_batch(&pieces, &mut whole).expect("big read").iter().all(|s| *s == RangeStatus::Ok));
        assert!(whole == big, "48 MiB over TLS byte-exact");
    }

    // A grant bound to trainer-x: its token opens nothing from trainer-y or
    // from no certificate, over the data port and the control API.
    let bound: Value = serde_json::from_str(&node.ctl_ok(
        &[&ca_args[..], &["--json", "grant", "create", "a", "--client", "x", "--cert-name", "trainer-x"]].concat(),
    ))
    .expect("json");
    assert_eq!(bound["cert_name"], "trainer-x");
    let as_identity = |cert: &Path, key: &Path| ClientTlsFiles {
        ca: Some(ca.pem.clone()),
        identity: Some((cert.to_path_buf(), key.to_path_buf())),
    };
    for (who, files) in [("trainer-y", as_identity(&y_cert, &y_key)), ("no certificate", trust.clone())] {
        let client =
            sluice_client::blocking::Client::connect_tls(&node.endpoint, TransportChoice::Tcp, files).expect("connect");
        let err = client
            .open_with("a", OpenOptions { token: token(&bound), ..OpenOptions::default() })
            .err()
            .unwrap_or_else(|| panic!("{who} opened a grant bound to trainer-x"))
            .to_string();
        assert!(err.contains("bound to the client certificate \"trainer-x\""), "{who}: {err}");
    }
    let out = node.ctl_anonymous(
        &[
            &ca_args[..],
            &[
                "--cert",
                path(&y_cert),
                "--key",
                path(&y_key),
                "--token",
                bound["token"].as_str().expect("token"),
                "dataset",
                "stat",
                "a",
            ],
        ]
        .concat(),
    );
    assert!(!out.status.success() && stderr(&out).contains("unauthenticated"), "{}", stderr(&out));
    let client = sluice_client::blocking::Client::connect_tls(
        &node.endpoint,
        TransportChoice::Tcp,
        as_identity(&x_cert, &x_key),
    )
    .expect("connect as trainer-x");
    let dataset =
        client.open_with("a", OpenOptions { token: token(&bound), ..OpenOptions::default() }).expect("x opens");
    let mut small = vec![0u8; 1000];
    let read = dataset.read_batch(&[ReadRange { offset: 5, len: 1000, dest: 0 }], &mut small).expect("read");
    assert_eq!(read, [RangeStatus::Ok]);
    assert_eq!(small, bytes[5..1005]);
}

/// A rotated certificate is served without a restart, on the control API
/// and the data port alike: the node's pair is rewritten in place (here
/// by a new CA, so which pair answers is plain), and new connections
/// soon verify against the new CA only. A pair rewritten half (the
/// certificate without its key) keeps the pair in use serving.
#[test]
fn a_rotated_certificate_is_served_without_a_restart() {
    let dir = tempfile::tempdir().expect("tempdir");
    let pki = dir.path().join("pki");
    std::fs::create_dir_all(&pki).expect("mkdir");
    let first_ca = authority(&pki, "first-ca");
    let next_ca = authority(&pki, "next-ca");
    let (first_cert, first_key) = issue(&pki, &first_ca, "node-first", true);
    let (next_cert, next_key) = issue(&pki, &next_ca, "node-next", true);
    let (live_cert, live_key) = (dir.path().join("tls.crt"), dir.path().join("tls.key"));
    std::fs::copy(&first_cert, &live_cert).expect("copy");
    std::fs::copy(&first_key, &live_key).expect("copy");
    let config = dir.path().join("node.toml");
    std::fs::write(&config, format!("tls_cert = {live_cert:?}\ntls_key = {live_key:?}\ndata_tls = true\n"))
        .expect("config");
    let node = NodeProcess::start_secure_with(&dir.path().join("node"), &["--config", path(&config)]);
    let trusting = |ca: &Path| node.ctl(&["--ca-file", path(ca), "dataset", "ls"]).status.success();
    assert!(trusting(&first_ca.pem) && !trusting(&next_ca.pem), "the first pair answers");

    // The certificate rewritten, its key not yet: still the first pair.
    std::fs::copy(&next_cert, &live_cert).expect("copy");
    std::thread::sleep(std::time::Duration::from_millis(1500));
    assert!(trusting(&first_ca.pem), "a certificate without its key is not served");

    std::fs::copy(&next_key, &live_key).expect("copy");
    assert!(common::eventually(10, || trusting(&next_ca.pem)), "the new pair is served without a restart");
    assert!(!trusting(&first_ca.pem), "and the old one no more");
    let trust = ClientTlsFiles { ca: Some(next_ca.pem.clone()), identity: None };
    let client = sluice_client::blocking::Client::connect_tls(&node.endpoint, TransportChoice::Tcp, trust)
        .expect("connect with the new CA");
    assert!(client.node().data_tls);
    random_file(&dir.path().join("r.bin"), 10_000, 3);
    for args in [
        vec!["dataset", "create", "r", "--kind", "bytes"],
        vec!["dataset", "ingest", "r", path(&dir.path().join("r.bin"))],
        vec!["dataset", "seal", "r"],
    ] {
        node.ctl_ok(&[&["--ca-file", path(&next_ca.pem)][..], &args].concat());
    }
    let grant: Value = serde_json::from_str(&node.ctl_ok(&[
        "--ca-file",
        path(&next_ca.pem),
        "--json",
        "grant",
        "create",
        "r",
        "--client",
        "any",
    ]))
    .expect("json");
    let options = OpenOptions { token: grant["token"].as_str().map(String::from), ..OpenOptions::default() };
    client.open_with("r", options).expect("the data port serves the new pair too");
}

/// The client CA is followed as the certificate is: a CA rotated as
/// trust-manager does it (a bundle of the old and the new CA, then the new
/// alone) admits each operator certificate while its CA is in the file,
/// without a restart.
#[test]
fn a_rotated_client_ca_is_followed_without_a_restart() {
    let dir = tempfile::tempdir().expect("tempdir");
    let pki = dir.path().join("pki");
    std::fs::create_dir_all(&pki).expect("mkdir");
    let node_ca = authority(&pki, "node-ca");
    let (old_ca, new_ca) = (authority(&pki, "old-client-ca"), authority(&pki, "new-client-ca"));
    let (node_cert, node_key) = issue(&pki, &node_ca, "node", true);
    let old_ops = issue(&pki, &old_ca, "ops-old", false);
    let new_ops = issue(&pki, &new_ca, "ops-new", false);
    let client_ca = dir.path().join("client-ca.pem");
    std::fs::copy(&old_ca.pem, &client_ca).expect("copy");
    let config = dir.path().join("node.toml");
    std::fs::write(
        &config,
        format!(
            "tls_cert = {node_cert:?}\ntls_key = {node_key:?}\ntls_client_ca = {client_ca:?}\n\
             operator_cert_names = [\"ops-old\", \"ops-new\"]\n"
        ),
    )
    .expect("config");
    let node = NodeProcess::start_secure_with(&dir.path().join("node"), &["--config", path(&config)]);
    let administers = |(cert, key): &(std::path::PathBuf, std::path::PathBuf)| {
        let args = ["--ca-file", path(&node_ca.pem), "--cert", path(cert), "--key", path(key), "dataset", "ls"];
        node.ctl_anonymous(&args).status.success()
    };
    assert!(administers(&old_ops) && !administers(&new_ops), "the old CA only");

    let pem = |ca: &common::pki::Authority| std::fs::read_to_string(&ca.pem).expect("read CA");
    std::fs::write(&client_ca, pem(&old_ca) + &pem(&new_ca)).expect("bundle");
    assert!(common::eventually(10, || administers(&new_ops)), "the new CA, once in the file");
    assert!(administers(&old_ops), "and the old, while the bundle holds it");

    std::fs::write(&client_ca, pem(&new_ca)).expect("the new CA alone");
    assert!(common::eventually(10, || !administers(&old_ops)), "the old CA, once gone from the file");
    assert!(administers(&new_ops));
}
