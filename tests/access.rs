//! The control API's trust boundary, attacked as a stranger and as a
//! training host would: an unauthenticated caller and the holder of a
//! grant for dataset A try every administrative call and every read of
//! dataset B; each is refused (401 `unauthenticated` or 403 `forbidden`)
//! and the catalog is unchanged afterwards. The grant still reads A
//! byte-exact. Also: operator tokens at first start and from a file,
//! listeners off loopback, file modes, metrics access, and tokens kept out
//! of logs.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use common::{random_file, sealed_dataset, NodeProcess};
use serde_json::Value;
use sluice_client::blocking::Client;
use sluice_client::{OpenOptions, RangeStatus, ReadRange};
use sluice_control::api::Access;

/// One request as `bearer` (none: anonymous): the status and the error
/// code of the answer.
fn call(node: &NodeProcess, bearer: Option<&str>, method: &str, path: &str, body: &[u8]) -> (u16, String) {
    call_with(node, bearer, &[], method, path, body)
}

/// [`call`] with more headers.
fn call_with(
    node: &NodeProcess,
    bearer: Option<&str>,
    headers: &[(&str, &str)],
    method: &str,
    path: &str,
    body: &[u8],
) -> (u16, String) {
    let mut request = ureq::request(method, &format!("{}{path}", node.endpoint));
    for (name, value) in headers {
        request = request.set(name, value);
    }
    if let Some(token) = bearer {
        request = request.set("Authorization", &format!("Bearer {token}"));
    }
    let response = if body.is_empty() {
        request.call()
    } else if body.starts_with(b"{") {
        request.set("Content-Type", "application/json").send_bytes(body)
    } else {
        request.set("Content-Type", "application/octet-stream").send_bytes(body)
    };
    match response {
        Ok(response) => (response.status(), String::new()),
        Err(ureq::Error::Status(status, response)) => {
            let body: Value = response.into_json().unwrap_or(Value::Null);
            (status, body["error"]["code"].as_str().unwrap_or("").to_string())
        }
        Err(err) => panic!("{method} {path}: {err}"),
    }
}

/// Everything an operator can see of the catalog: datasets (with their
/// state, hash, namespace), grants, and the sample index of B.
fn catalog_dump(node: &NodeProcess) -> String {
    let get = |path: &str| node.get(path).expect(path).into_string().expect("body");
    format!("{}\n{}\n{}", get("/v1/datasets"), get("/v1/grants"), get("/v1/datasets/b/index").len())
}

fn grant(node: &NodeProcess, dataset: &str, client: &str) -> (u64, String) {
    let grant: Value =
        serde_json::from_str(&node.ctl_ok(&["--json", "grant", "create", dataset, "--client", client])).expect("json");
    (grant["id"].as_u64().expect("id"), grant["token"].as_str().expect("token").to_string())
}

/// `token` with its last character changed: a token that is no grant,
/// whatever the last character was (always writing `0` there gave the
/// grant's own token back in one run of sixteen: tokens are hex).
fn altered(token: &str) -> String {
    let (head, last) = token.split_at(token.len() - 1);
    format!("{head}{}", if last == "0" { '1' } else { '0' })
}

#[test]
fn strangers_and_grant_holders_cannot_administer_or_read_other_datasets() {
    let dir = tempfile::tempdir().expect("tempdir");
    let node = NodeProcess::start_secure(&dir.path().join("node"));
    let a_bytes = random_file(&dir.path().join("a.bin"), 200_003, 1);
    sealed_dataset(&node, "a", &[&dir.path().join("a.bin")]);
    random_file(&dir.path().join("b.bin"), 4000, 2);
    node.ctl_ok(&["dataset", "create", "b", "--kind", "records", "--record-size", "100"]);
    node.ctl_ok(&["dataset", "ingest", "b", dir.path().join("b.bin").to_str().expect("utf-8")]);
    node.ctl_ok(&["dataset", "seal", "b"]);
    let (a_grant, a_token) = grant(&node, "a", "trainer-a");
    let policy_object = std::fs::read(concat!(env!("CARGO_MANIFEST_DIR"), "/ebpf/bpf/all_bulk.bpf.o")).expect("object");
    let before = catalog_dump(&node);

    let revoke_id = a_grant.to_string();
    let revoke = format!("/v1/grants/{revoke_id}");
    let attempts: Vec<(&str, &str, Vec<u8>)> = vec![
        ("POST", "/v1/grants", br#"{"dataset":"a","client":"mallory"}"#.to_vec()),
        ("POST", "/v1/grants", br#"{"dataset":"b","client":"mallory"}"#.to_vec()),
        ("GET", "/v1/grants", vec![]),
        ("DELETE", revoke.as_str(), vec![]),
        ("DELETE", "/v1/datasets/a", vec![]),
        ("POST", "/v1/datasets", br#"{"name":"c","kind":"bytes"}"#.to_vec()),
        ("POST", "/v1/datasets/a/index", 0u64.to_le_bytes().repeat(2)),
        ("POST", "/v1/datasets/a/ingest", vec![7u8; 4096]),
        ("POST", "/v1/datasets/a/seal", vec![]),
        ("POST", "/v1/datasets/a/scrub", vec![]),
        ("PUT", "/v1/policy", policy_object),
        ("DELETE", "/v1/policy", vec![]),
        ("GET", "/v1/policy", vec![]),
        ("GET", "/v1/datasets", vec![]),
        ("GET", "/v1/datasets/b", vec![]),
        ("GET", "/v1/datasets/b/chunks", vec![]),
        ("GET", "/v1/datasets/b/index", vec![]),
        ("GET", "/v1/devices", vec![]),
        ("GET", "/v1/cluster", vec![]),
        ("GET", "/v1/trace", vec![]),
        ("GET", "/metrics", vec![]),
        ("POST", "/v1/datasets/a/warm", vec![]),
        ("PUT", "/v1/datasets/a/pin", vec![]),
        ("DELETE", "/v1/datasets/a/pin", vec![]),
        ("GET", "/v1/datasets/b/cache", vec![]),
        ("GET", "/v1/caches", vec![]),
        ("POST", "/v1/datasets/b/prefetch", [0u64.to_le_bytes().as_slice(), &64u32.to_le_bytes()].concat()),
        ("GET", "/v1/orphans", vec![]),
        ("DELETE", "/v1/orphans", vec![]),
    ];
    // Every guarded operation of the API is in the list: a new route
    // cannot go untested here.
    for (method, route, access) in sluice_control::api::ROUTES {
        if *access == Access::Public {
            continue;
        }
        let attacked = attempts.iter().any(|(m, path, _)| {
            m == method
                && (path == route
                    || [("{name}", "a"), ("{name}", "b"), ("{id}", revoke_id.as_str())]
                        .iter()
                        .any(|(hole, fill)| route.replace(hole, fill) == *path))
        });
        assert!(attacked, "{method} {route} ({access:?}) is not attacked by this test");
    }
    let forged = format!("sluice_{}", "ab".repeat(32));
    for (who, bearer, expected) in [
        ("anonymous", None, (401, "unauthenticated")),
        ("a forged token", Some(forged.as_str()), (401, "unauthenticated")),
        ("the holder of a grant for a", Some(a_token.as_str()), (403, "forbidden")),
    ] {
        for (method, path, body) in &attempts {
            let (status, code) = call(&node, bearer, method, path, body);
            assert_eq!((status, code.as_str()), expected, "{who}: {method} {path}");
        }
    }
    assert_eq!(catalog_dump(&node), before, "a refused call changed the catalog");

    // The grant reads what it covers: A's record, chunks and bytes.
    assert_eq!(call(&node, Some(&a_token), "GET", "/v1/datasets/a", b"").0, 200);
    assert_eq!(call(&node, Some(&a_token), "GET", "/v1/datasets/a/chunks", b"").0, 200);
    assert_eq!(call(&node, Some(&a_token), "GET", "/v1/node", b"").0, 200, "node facts stay open");
    assert_eq!(call(&node, None, "GET", "/v1/node", b"").0, 200);
    let client = Client::connect(&node.endpoint).expect("connect");
    let options = OpenOptions { token: Some(a_token.clone()), verify_chunks: true };
    let dataset = client.open_with("a", options).expect("open a");
    let mut buf = vec![0u8; a_bytes.len()];
    let statuses =
        dataset.read_batch(&[ReadRange { offset: 0, len: a_bytes.len() as u32, dest: 0 }], &mut buf).expect("read");
    assert_eq!(statuses, [RangeStatus::Ok]);
    assert!(buf == a_bytes, "a grant reads its dataset byte-exact");

    // A grant holder cannot tell a dataset it may not read from one that
    // does not exist: over HTTP and on the data plane alike.
    let (other, _) = call(&node, Some(&a_token), "GET", "/v1/datasets/b", b"");
    let (missing, _) = call(&node, Some(&a_token), "GET", "/v1/datasets/no-such", b"");
    assert_eq!((other, missing), (403, 403));
    let options = || OpenOptions { token: Some(a_token.clone()), ..OpenOptions::default() };
    let refused_b = client.open_with("b", options()).err().expect("b refused").to_string();
    let refused_none = client.open_with("no-such", options()).err().expect("no-such refused").to_string();
    assert_eq!(refused_b.replace("\"b\"", "NAME"), refused_none.replace("\"no-such\"", "NAME"));
}

#[test]
fn operator_tokens_come_from_a_private_file_or_the_first_start() {
    let dir = tempfile::tempdir().expect("tempdir");
    // First start: a token of its own, private, that sluicectl can use.
    let node = NodeProcess::start_secure(&dir.path().join("node"));
    let token_file = dir.path().join("node/admin.token");
    let mode = std::fs::metadata(&token_file).expect("admin.token made at first start").permissions().mode();
    assert_eq!(mode & 0o777, 0o600);
    let refused = node.ctl_anonymous(&["dataset", "ls"]);
    assert!(
        !refused.status.success() && String::from_utf8_lossy(&refused.stderr).contains("unauthenticated"),
        "{}",
        String::from_utf8_lossy(&refused.stderr)
    );
    let listed = node.ctl_anonymous(&["--admin-token-file", token_file.to_str().expect("utf-8"), "dataset", "ls"]);
    assert!(listed.status.success(), "{}", String::from_utf8_lossy(&listed.stderr));
    let at_file = format!("@{}", token_file.display());
    assert!(node.ctl_anonymous(&["--admin-token", &at_file, "grant", "ls"]).status.success());
    drop(node);

    // A token file others can read: the node refuses to start.
    let tokens = dir.path().join("operators");
    std::fs::write(&tokens, "# operators\nfirst-operator-token-0001\n").expect("write");
    std::fs::set_permissions(&tokens, std::fs::Permissions::from_mode(0o644)).expect("chmod");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_sluiced"))
        .args(["--data-dir", dir.path().join("other").to_str().expect("utf-8")])
        .args(["--listen", "127.0.0.1:0", "--control", "127.0.0.1:0", "--admin-tokens"])
        .arg(&tokens)
        .output()
        .expect("run sluiced");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && stderr.contains("readable by group or others"), "{stderr}");

    // Private, with one token plain and one as its blake3 hash: both work,
    // and no admin.token is made.
    let hashed = blake3::hash(b"second-operator-token-02").to_hex();
    std::fs::write(&tokens, format!("first-operator-token-0001\nblake3:{hashed}\n")).expect("write");
    std::fs::set_permissions(&tokens, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    let data = dir.path().join("other");
    let node = NodeProcess::start_secure_with(&data, &["--admin-tokens", tokens.to_str().expect("utf-8")]);
    assert!(!data.join("admin.token").exists());
    for token in ["first-operator-token-0001", "second-operator-token-02"] {
        assert_eq!(call(&node, Some(token), "GET", "/v1/datasets", b"").0, 200, "{token}");
    }
    assert_eq!(call(&node, Some("first-operator-token-0002"), "GET", "/v1/datasets", b"").0, 401);
}

/// The operator token file is followed: a token removed from it is
/// refused and one added is taken, within a second or two, without a
/// restart. An edit that leaves the file unreadable to the node's checks
/// (readable by others, emptied) changes nothing: the tokens in use stay.
#[test]
fn an_operator_token_removed_from_its_file_is_refused_without_a_restart() {
    let dir = tempfile::tempdir().expect("tempdir");
    let tokens = dir.path().join("operators");
    let write_tokens = |text: &str, mode: u32| {
        // Written aside and renamed over, as an editor or a Secret volume does.
        let next = dir.path().join("operators.next");
        std::fs::write(&next, text).expect("write");
        std::fs::set_permissions(&next, std::fs::Permissions::from_mode(mode)).expect("chmod");
        std::fs::rename(&next, &tokens).expect("rename");
    };
    write_tokens("leaked-operator-token-001\n", 0o600);
    let node =
        NodeProcess::start_secure_with(&dir.path().join("node"), &["--admin-tokens", tokens.to_str().expect("utf-8")]);
    let status = |token: &str| call(&node, Some(token), "GET", "/v1/datasets", b"").0;
    assert_eq!((status("leaked-operator-token-001"), status("fresh-operator-token-0002")), (200, 401));

    write_tokens("# rotated\nfresh-operator-token-0002\n", 0o600);
    assert!(common::eventually(10, || status("leaked-operator-token-001") == 401), "the removed token is refused");
    assert_eq!(status("fresh-operator-token-0002"), 200, "the added one is taken");

    for (broken, mode) in [("leaked-operator-token-001\n", 0o644), ("# nobody\n", 0o600)] {
        write_tokens(broken, mode);
        std::thread::sleep(std::time::Duration::from_millis(2500));
        let now = (status("leaked-operator-token-001"), status("fresh-operator-token-0002"));
        assert_eq!(now, (401, 200), "{broken:?} mode {mode:o}: the tokens in use stay");
    }
}

/// A page in a browser must not drive the API: not with an operator's
/// credential the browser holds, not through DNS rebinding to an
/// `--insecure` node on loopback. Every request with an `Origin` header
/// (which browsers send with every POST, PUT and DELETE) is refused and
/// changes nothing; the same requests without one are served. And an
/// `--insecure` node on loopback answers only requests addressed to a
/// loopback name, so DNS rebinding reaches nothing.
#[test]
fn requests_from_browsers_are_refused_whatever_they_carry() {
    let dir = tempfile::tempdir().expect("tempdir");
    let secure = NodeProcess::start_secure(&dir.path().join("secure"));
    let insecure = NodeProcess::start(&dir.path().join("insecure"));
    let create = br#"{"name":"made-by-a-page","kind":"bytes"}"#;
    for node in [&secure, &insecure] {
        let admin = node.admin_token.clone();
        for origin in ["http://attacker.example:7070", "null"] {
            let from_page = call_with(node, admin.as_deref(), &[("Origin", origin)], "POST", "/v1/datasets", create);
            assert_eq!(from_page, (403, "forbidden".to_string()), "{origin}");
        }
        assert!(!node.get("/v1/datasets").expect("list").into_string().expect("body").contains("made-by-a-page"));
        assert_eq!(call(node, admin.as_deref(), "POST", "/v1/datasets", create).0, 201, "without Origin: served");
    }
    // DNS rebinding: a page whose own name now resolves to 127.0.0.1 reads
    // with its name in Host and no Origin. The insecure node on loopback
    // answers only loopback names; the secure one needs a credential.
    let port = |node: &NodeProcess| node.endpoint.rsplit(':').next().expect("port").to_string();
    let rebound = format!("attacker.example:{}", port(&insecure));
    assert_eq!(call_with(&insecure, None, &[("Host", &rebound)], "GET", "/v1/datasets", b"").0, 403);
    for host in [format!("localhost:{}", port(&insecure)), format!("127.0.0.1:{}", port(&insecure))] {
        assert_eq!(call_with(&insecure, None, &[("Host", &host)], "GET", "/v1/datasets", b"").0, 200, "{host}");
    }
    let rebound = format!("attacker.example:{}", port(&secure));
    assert_eq!(call_with(&secure, None, &[("Host", &rebound)], "GET", "/v1/datasets", b"").0, 401);
}

/// An `--insecure` node off loopback checks no credential, so DNS
/// rebinding (a page whose own name now resolves to the node) would read
/// and change it with no `Origin` on its reads. It answers IP addresses,
/// `localhost`, the names it was given and the one it advertises, and no
/// other name.
#[test]
fn an_insecure_node_off_loopback_answers_only_addresses_and_its_own_names() {
    let dir = tempfile::tempdir().expect("tempdir");
    let node = NodeProcess::start_with(
        &dir.path().join("node"),
        &["--control", "0.0.0.0:0", "--insecure-host", "sluice-0.storage.internal", "--advertise", "sluice-0.example"],
    );
    let port = node.endpoint.rsplit(':').next().expect("port").to_string();
    let get = |host: &str| call_with(&node, None, &[("Host", host)], "GET", "/v1/datasets", b"");
    for host in ["attacker.example", "sluice-0.storage.internal.attacker.example", "storage.internal"] {
        let (status, code) = get(&format!("{host}:{port}"));
        assert_eq!((status, code.as_str()), (403, "forbidden"), "{host}");
    }
    let create = br#"{"name":"made-by-a-page","kind":"bytes"}"#;
    let rebound = format!("attacker.example:{port}");
    assert_eq!(call_with(&node, None, &[("Host", &rebound)], "POST", "/v1/datasets", create).0, 403);
    let answered =
        ["127.0.0.1", "localhost", "10.11.12.13", "[fd00::1]", "SLUICE-0.storage.internal", "sluice-0.example"];
    for host in answered {
        assert_eq!(get(&format!("{host}:{port}")).0, 200, "{host}");
    }
    assert!(!node.get("/v1/datasets").expect("list").into_string().expect("body").contains("made-by-a-page"));

    // A name that is not one is refused at start, with its setting's name.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_sluiced"))
        .args(["--data-dir", dir.path().join("other").to_str().expect("utf-8"), "--insecure"])
        .args(["--listen", "127.0.0.1:0", "--control", "127.0.0.1:0", "--insecure-host", "sluice:7070"])
        .output()
        .expect("run sluiced");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && stderr.contains("insecure_hosts"), "{stderr}");
}

#[test]
fn listeners_off_loopback_need_tls_or_insecure() {
    let dir = tempfile::tempdir().expect("tempdir");
    for (flags, missing) in [
        (["--control", "0.0.0.0:0", "--listen", "127.0.0.1:0"], "tls_cert"),
        (["--control", "127.0.0.1:0", "--listen", "0.0.0.0:0"], "data_tls"),
    ] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_sluiced"))
            .args(["--data-dir", dir.path().join("node").to_str().expect("utf-8")])
            .args(flags)
            .output()
            .expect("run sluiced");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{flags:?} started");
        assert!(stderr.contains("not loopback") && stderr.contains(missing), "{flags:?}: {stderr}");
        assert!(!dir.path().join("node/admin.token").exists(), "nothing is made before the refusal");
    }
}

fn mode_of(path: &Path) -> u32 {
    std::fs::metadata(path).unwrap_or_else(|e| panic!("{}: {e}", path.display())).permissions().mode() & 0o777
}

#[test]
fn what_the_node_writes_is_private() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("node");
    // A data directory an operator made world-readable is closed at start.
    std::fs::create_dir_all(&data).expect("mkdir");
    std::fs::set_permissions(&data, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let node = NodeProcess::start_secure(&data);
    let records = dir.path().join("r.bin");
    random_file(&records, 5000, 3);
    let offsets = dir.path().join("r.offsets");
    std::fs::write(&offsets, (0..=50u64).flat_map(|i| (i * 100).to_le_bytes()).collect::<Vec<u8>>()).expect("write");
    node.ctl_ok(&["dataset", "create", "r", "--kind", "records"]);
    node.ctl_ok(&[
        "dataset",
        "ingest",
        "r",
        records.to_str().expect("utf-8"),
        "--index",
        offsets.to_str().expect("utf-8"),
    ]);
    node.ctl_ok(&["dataset", "seal", "r"]);
    assert_eq!(mode_of(&data), 0o700, "data directory");
    assert_eq!(mode_of(&data.join("admin.token")), 0o600, "operator token");
    let mut files = 0;
    let mut stack = vec![data.clone()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).expect("read dir").flatten() {
            let path = entry.path();
            if path.is_dir() {
                assert_eq!(mode_of(&path), 0o700, "{}", path.display());
                stack.push(path);
            } else {
                assert_eq!(mode_of(&path), 0o600, "{}", path.display());
                files += 1;
            }
        }
    }
    assert!(files >= 4, "catalog, token, namespace and index files: {files}");
    assert!(data.join("catalog.redb").is_file() && data.join("namespaces").is_dir());
}

#[test]
fn metrics_open_to_a_scraper_token_or_address_only() {
    let dir = tempfile::tempdir().expect("tempdir");
    let tokens = dir.path().join("scrapers");
    std::fs::write(&tokens, "prometheus-scraper-token\n").expect("write");
    std::fs::set_permissions(&tokens, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    let config = dir.path().join("node.toml");
    // Port 0: the node binds, then announces where (no port chosen here
    // that another test could take first).
    std::fs::write(&config, format!("metrics_tokens = {tokens:?}\nmetrics_listen = \"127.0.0.1:0\"\n"))
        .expect("config");
    let node = NodeProcess::start_secure_with(&dir.path().join("node"), &["--config", config.to_str().expect("utf-8")]);
    let metrics = node.metrics_addr.clone().expect("the node announces its metrics listener");
    assert_eq!(call(&node, Some("prometheus-scraper-token"), "GET", "/metrics", b"").0, 200);
    assert_eq!(call(&node, Some("prometheus-scraper-token"), "GET", "/v1/datasets", b""), (403, "forbidden".into()));
    assert_eq!(call(&node, None, "GET", "/metrics", b"").0, 401);
    let open = ureq::get(&format!("http://{metrics}/metrics")).call().expect("metrics listener");
    assert!(open.into_string().expect("text").contains("sluice_datasets"));
    let other = ureq::get(&format!("http://{metrics}/v1/datasets")).call();
    assert!(matches!(other, Err(ureq::Error::Status(404, _))), "the metrics listener serves metrics only");
}

#[test]
fn tokens_stay_out_of_the_log() {
    let dir = tempfile::tempdir().expect("tempdir");
    let log = dir.path().join("sluiced.log");
    let node = NodeProcess::start_secure_logged(&dir.path().join("node"), &[], &log);
    random_file(&dir.path().join("a.bin"), 10_000, 4);
    sealed_dataset(&node, "a", &[&dir.path().join("a.bin")]);
    let (_, token) = grant(&node, "a", "trainer");
    let client = Client::connect(&node.endpoint).expect("connect");
    let dataset = client.open_with("a", OpenOptions { token: Some(token.clone()), ..OpenOptions::default() });
    assert!(dataset.is_ok());
    let wrong = altered(&token);
    let _ = client.open_with("a", OpenOptions { token: Some(wrong.clone()), ..OpenOptions::default() });
    let _ = call(&node, Some(&wrong), "POST", "/v1/grants", br#"{"dataset":"a","client":"x"}"#);
    let admin = node.admin_token.clone().expect("operator token");
    drop(node);
    let text = std::fs::read_to_string(&log).expect("log");
    assert!(text.contains("grant issued"), "the log is at debug level and saw the grant: {text}");
    for (what, secret) in [("grant token", &token), ("wrong token", &wrong), ("operator token", &admin)] {
        assert!(!text.contains(&secret[7..]), "the {what} is in the log");
    }
}

/// Policy loading is off unless the config enables it; with an allowlist,
/// only the listed objects get past the node's first check.
#[test]
fn policy_loading_is_off_by_default_and_follows_the_allowlist() {
    let dir = tempfile::tempdir().expect("tempdir");
    let all_bulk = std::fs::read(concat!(env!("CARGO_MANIFEST_DIR"), "/ebpf/bpf/all_bulk.bpf.o")).expect("object");
    let default = std::fs::read(concat!(env!("CARGO_MANIFEST_DIR"), "/ebpf/bpf/policy.bpf.o")).expect("object");
    let node = NodeProcess::start_secure(&dir.path().join("off"));
    let admin = node.admin_token.clone().expect("operator token");
    assert_eq!(call(&node, Some(&admin), "PUT", "/v1/policy", &all_bulk), (403, "policy_load_off".into()));
    drop(node);

    use sha2::Digest;
    let digest: String = sha2::Sha256::digest(&all_bulk).iter().map(|b| format!("{b:02x}")).collect();
    let config = dir.path().join("node.toml");
    std::fs::write(&config, format!("policy_load = true\npolicy_allowlist = [\"sha256:{digest}\"]\n")).expect("config");
    let node = NodeProcess::start_secure_with(&dir.path().join("on"), &["--config", config.to_str().expect("utf-8")]);
    let admin = node.admin_token.clone().expect("operator token");
    let (status, code) = call(&node, Some(&admin), "PUT", "/v1/policy", &default);
    assert_eq!((status, code.as_str()), (400, "bad_policy"), "a valid object not on the allowlist");
    // The listed object passes the allowlist; this node has no steering
    // (no --ebpf), which is the next thing it says.
    assert_eq!(call(&node, Some(&admin), "PUT", "/v1/policy", &all_bulk), (409, "steering_off".into()));
}

/// Every change and every refusal leaves an audit record, and no record
/// holds a credential: an operator's create, grant and delete are
/// recorded under the operator token's blake3 prefix, a grant holder's
/// attempt to administer under its grant id with its 403, a stranger's
/// under "anonymous" with its 401; reads are not recorded.
#[test]
fn changes_and_refusals_leave_an_audit_record_without_a_credential() {
    let dir = tempfile::tempdir().expect("tempdir");
    let audit = dir.path().join("audit.jsonl");
    let node =
        NodeProcess::start_secure_with(&dir.path().join("node"), &["--audit-log", audit.to_str().expect("utf-8")]);
    let admin = node.admin_token.clone().expect("operator token");
    random_file(&dir.path().join("a.bin"), 10_000, 5);
    sealed_dataset(&node, "a", &[&dir.path().join("a.bin")]);
    let (grant_id, token) = grant(&node, "a", "trainer");
    assert_eq!(call(&node, Some(&token), "GET", "/v1/datasets/a", b"").0, 200, "a read: not recorded");
    assert_eq!(call(&node, Some(&token), "DELETE", "/v1/datasets/a", b"").0, 403);
    assert_eq!(call(&node, None, "POST", "/v1/grants", br#"{"dataset":"a","client":"x"}"#).0, 401);
    // On the data port: no token, a token that is no grant, and the grant
    // asking for a name it does not cover are refused and recorded; its
    // own dataset opens, a read, and is not.
    let client = Client::connect(&node.endpoint).expect("connect");
    let open = |name: &str, token: Option<&str>| {
        client.open_with(name, OpenOptions { token: token.map(str::to_string), ..OpenOptions::default() })
    };
    let wrong = altered(&token);
    assert!(open("a", None).is_err() && open("a", Some(&wrong)).is_err() && open("b", Some(&token)).is_err());
    open("a", Some(&token)).expect("the grant opens its dataset");
    node.ctl_ok(&["dataset", "rm", "a"]);

    let text = std::fs::read_to_string(&audit).expect("audit log");
    for (what, secret) in [("grant token", &token), ("wrong token", &wrong), ("operator token", &admin)] {
        assert!(!text.contains(&secret[7..]), "the {what} is in the audit log");
    }
    let records: Vec<Value> = text.lines().map(|line| serde_json::from_str(line).expect("a JSON line")).collect();
    let operator = format!("operator token blake3:{}", &blake3::hash(admin.as_bytes()).to_hex()[..16]);
    let find = |method: &str, path: &str, refused: bool| {
        records
            .iter()
            .find(|r| r["method"] == method && r["path"] == path && (r["status"].as_u64() >= Some(400)) == refused)
            .unwrap_or_else(|| panic!("no record of {method} {path} (refused: {refused}): {text}"))
    };
    let created = find("POST", "/v1/datasets", false);
    assert_eq!((created["caller"].as_str(), created["status"].as_u64()), (Some(operator.as_str()), Some(201)));
    assert!(created["remote"].as_str().is_some_and(|r| r.starts_with("127.0.0.1:")), "{created}");
    assert_eq!(find("POST", "/v1/grants", false)["caller"], operator.as_str());
    let by_grant = find("DELETE", "/v1/datasets/a", true);
    assert_eq!(
        (by_grant["caller"].as_str(), by_grant["status"].as_u64()),
        (Some(&*format!("grant {grant_id} on a")), Some(403))
    );
    let stranger = find("POST", "/v1/grants", true);
    assert_eq!((stranger["caller"].as_str(), stranger["status"].as_u64()), (Some("anonymous"), Some(401)));
    assert_eq!(find("DELETE", "/v1/datasets/a", false)["caller"], operator.as_str());
    assert!(records.iter().all(|r| r["method"] != "GET" || r["status"] == 401 || r["status"] == 403), "{text}");
    assert!(stranger["reason"].as_str().is_some_and(|r| r.contains("needs a credential")), "{stranger}");

    let opens: Vec<&Value> = records.iter().filter(|r| r["method"] == "OPEN").collect();
    let callers: Vec<(&str, &str)> =
        opens.iter().map(|r| (r["caller"].as_str().unwrap_or("?"), r["path"].as_str().unwrap_or("?"))).collect();
    let holder = format!("grant {grant_id} on a");
    assert_eq!(callers, [("anonymous", "a"), ("an invalid credential", "a"), (holder.as_str(), "b")], "{text}");
    for open in opens {
        assert_eq!(open["status"], 403, "{open}");
        assert!(open["remote"].as_str().is_some_and(|r| r.starts_with("127.0.0.1:")), "{open}");
        assert!(open["reason"].as_str().is_some_and(|r| !r.is_empty()), "{open}");
    }
}
