//! Access grants on the TCP transport: without a grant no bytes; a grant
//! reads exactly its dataset; revocation refuses new opens at once and
//! closes the sessions opened under it; grants survive a restart and go
//! with their dataset.

mod common;

use common::{eventually, random_file, sealed_dataset, NodeProcess};
use serde_json::Value;
use sluice_client::blocking::Client;
use sluice_client::{OpenOptions, RangeStatus, ReadRange};

fn with_token(token: &str) -> OpenOptions {
    OpenOptions { token: Some(token.to_string()), ..OpenOptions::default() }
}

fn issue(node: &NodeProcess, dataset: &str, client: &str) -> (u64, String) {
    let grant: Value =
        serde_json::from_str(&node.ctl_ok(&["--json", "grant", "create", dataset, "--client", client])).expect("json");
    let id = grant["id"].as_u64().expect("grant id");
    let token = grant["token"].as_str().expect("token shown at creation").to_string();
    (id, token)
}

fn read_all(dataset: &sluice_client::blocking::Dataset, len: usize) -> Result<Vec<u8>, String> {
    let mut buf = vec![0u8; len];
    let statuses = dataset
        .read_batch(&[ReadRange { offset: 0, len: len as u32, dest: 0 }], &mut buf)
        .map_err(|e| e.to_string())?;
    if statuses != [RangeStatus::Ok] {
        return Err(format!("{statuses:?}"));
    }
    Ok(buf)
}

#[test]
fn no_grant_no_bytes_and_revocation_closes_sessions() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut node = NodeProcess::start_secure(&dir.path().join("node"));
    let a_bytes = random_file(&dir.path().join("a.bin"), 300_001, 1);
    random_file(&dir.path().join("b.bin"), 4096, 2);
    sealed_dataset(&node, "a", &[&dir.path().join("a.bin")]);
    sealed_dataset(&node, "b", &[&dir.path().join("b.bin")]);
    let client = Client::connect(&node.endpoint).expect("connect");
    assert!(client.node().grants_required, "a node started without --insecure says it checks grants");

    // No token, a made-up token, and another dataset's token: no bytes.
    let err = client.open("a").err().expect("an open without a token is refused").to_string();
    assert!(err.contains("needs a grant") && err.contains("sluicectl grant create"), "{err}");
    let forged = format!("sluice_{}", "0".repeat(64));
    let err = client.open_with("a", with_token(&forged)).err().expect("forged token refused").to_string();
    assert!(err.contains("not a grant on this node"), "{err}");
    let (_, b_token) = issue(&node, "b", "job-b");
    let err = client.open_with("a", with_token(&b_token)).err().expect("b's token does not open a").to_string();
    assert!(err.contains("does not cover a dataset named \"a\""), "{err}");
    let out = node.ctl(&["read", "a", "--offset", "0", "--len", "16"]);
    assert!(!out.status.success() && String::from_utf8_lossy(&out.stderr).contains("needs a grant"));

    // The grant reads its dataset byte-exact, through the client and sluicectl.
    let (a_id, a_token) = issue(&node, "a", "job-a/rank-0");
    let dataset = client.open_with("a", with_token(&a_token)).expect("granted open");
    assert_eq!(read_all(&dataset, a_bytes.len()).expect("read"), a_bytes);
    let out = node.ctl(&["--token", &a_token, "read", "a", "--offset", "100", "--len", "1000"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(out.stdout, &a_bytes[100..1100]);

    // The reads show in the node's metrics.
    let metrics = node.get("/metrics").expect("metrics").into_string().expect("text");
    let served = |name: &str| -> u64 {
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{name}{{dataset=\"a\"}} ")))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    assert_eq!(served("sluice_dataset_bytes_total"), a_bytes.len() as u64 + 1000, "{metrics}");
    assert_eq!(served("sluice_dataset_ranges_total"), 2, "{metrics}");
    assert!(metrics.contains("sluice_batch_latency_seconds_count{dataset=\"a\",lane=\"latency\"} 2"), "{metrics}");
    assert!(metrics.contains("sluice_grants 2"), "{metrics}");

    // The listing names grants, never tokens.
    let listing = node.ctl_ok(&["--json", "grant", "ls"]);
    assert!(listing.contains("job-a/rank-0") && !listing.contains(&a_token[7..]), "{listing}");

    // Grants outlive a restart.
    node.kill();
    let node = NodeProcess::start_secure(&dir.path().join("node"));
    let client = Client::connect(&node.endpoint).expect("connect");
    let dataset = client.open_with("a", with_token(&a_token)).expect("the grant survives a restart");
    assert_eq!(read_all(&dataset, 1000).expect("read"), a_bytes[..1000]);

    // Revoke: the open session is closed, new opens are refused.
    node.ctl_ok(&["grant", "revoke", &a_id.to_string()]);
    assert!(
        eventually(10, || read_all(&dataset, 1000).is_err()),
        "a session opened under a revoked grant keeps reading"
    );
    let err = client.open_with("a", with_token(&a_token)).err().expect("the closed session opens nothing").to_string();
    assert!(err.contains("was revoked"), "the session says why it closed: {err}");
    let client = Client::connect(&node.endpoint).expect("reconnect");
    let err = client.open_with("a", with_token(&a_token)).err().expect("revoked token refused").to_string();
    assert!(err.contains("revoked or never issued"), "{err}");
    let out = node.ctl(&["grant", "revoke", &a_id.to_string()]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown_grant"));

    // A grant goes with its dataset; a dataset made again under the same
    // name does not inherit it.
    node.ctl_ok(&["dataset", "rm", "b"]);
    assert!(!node.ctl_ok(&["--json", "grant", "ls"]).contains("job-b"));
    sealed_dataset(&node, "b", &[&dir.path().join("b.bin")]);
    let err = client.open_with("b", with_token(&b_token)).err().expect("old grant void").to_string();
    assert!(err.contains("revoked or never issued"), "{err}");
}

#[test]
fn bad_grant_requests_get_clear_errors() {
    let dir = tempfile::tempdir().expect("tempdir");
    let node = NodeProcess::start_secure(&dir.path().join("node"));
    let unknown = node.ctl(&["grant", "create", "nope", "--client", "job"]);
    assert!(String::from_utf8_lossy(&unknown.stderr).contains("unknown_dataset"));
    random_file(&dir.path().join("a.bin"), 10, 1);
    sealed_dataset(&node, "a", &[&dir.path().join("a.bin")]);
    let bad = node.ctl(&["grant", "create", "a", "--client", "has space"]);
    assert!(String::from_utf8_lossy(&bad.stderr).contains("invalid client identity"));
    let none = node.ctl(&["grant", "revoke", "999"]);
    assert!(String::from_utf8_lossy(&none.stderr).contains("unknown_grant"));
}

/// A grant given a lifetime ends by itself: before its end it reads as any
/// grant; from its end its token opens nothing (data port and control
/// API, each saying it ended), the session opened under it closes, and the
/// node drops it from the listing. A grant without one stands. A lifetime
/// of zero or past ten years is refused.
#[test]
fn a_grant_with_a_lifetime_ends_by_itself() {
    let dir = tempfile::tempdir().expect("tempdir");
    let node = NodeProcess::start_secure(&dir.path().join("node"));
    let bytes = random_file(&dir.path().join("a.bin"), 50_000, 7);
    sealed_dataset(&node, "a", &[&dir.path().join("a.bin")]);
    let issued: Value =
        serde_json::from_str(&node.ctl_ok(&["--json", "grant", "create", "a", "--client", "short-job", "--ttl", "3s"]))
            .expect("json");
    let token = issued["token"].as_str().expect("token").to_string();
    let ends = issued["expires_unix_ms"].as_u64().expect("an end");
    assert_eq!(ends - issued["created_unix_ms"].as_u64().expect("created"), 3000);
    let (_, lasting) = issue(&node, "a", "long-job");

    let client = Client::connect(&node.endpoint).expect("connect");
    let dataset = client.open_with("a", with_token(&token)).expect("open before its end");
    assert_eq!(read_all(&dataset, bytes.len()).expect("read before its end"), bytes);
    assert!(node.ctl_ok(&["grant", "ls"]).contains("short-job"));

    assert!(eventually(20, || read_all(&dataset, 100).is_err()), "the session outlived its grant's end");
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("clock").as_millis() as u64;
    assert!(now >= ends, "closed before the grant's end");
    let err = Client::connect(&node.endpoint)
        .expect("connect")
        .open_with("a", with_token(&token))
        .err()
        .expect("an ended grant opens nothing")
        .to_string();
    assert!(err.contains("has ended") || err.contains("revoked or never issued"), "{err}");
    let out = node.ctl_anonymous(&["--token", &token, "dataset", "stat", "a"]);
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && (said.contains("has ended") || said.contains("live grant")), "{said}");
    assert!(eventually(10, || !node.ctl_ok(&["grant", "ls"]).contains("short-job")), "the ended grant is dropped");

    let client = Client::connect(&node.endpoint).expect("connect");
    let dataset = client.open_with("a", with_token(&lasting)).expect("a grant without an end stands");
    assert_eq!(read_all(&dataset, 100).expect("read"), bytes[..100]);
    for ttl in ["0s", "3651d"] {
        let out = node.ctl(&["grant", "create", "a", "--client", "x", "--ttl", ttl]);
        assert!(!out.status.success(), "--ttl {ttl} is refused");
    }
}

/// A node with `grant_ttl_max_s` gives every grant an end: one asked for
/// without a lifetime gets the longest, a longer one is cut to it, a
/// shorter one stands as asked; a lifetime outside the API's bounds is
/// still refused, and so is a bound of 0 at start.
#[test]
fn a_node_cuts_grant_lifetimes_to_its_longest() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_sluiced"))
        .args(["--data-dir", dir.path().join("refused").to_str().expect("utf-8")])
        .args(["--listen", "127.0.0.1:0", "--control", "127.0.0.1:0", "--grant-ttl-max-s", "0"])
        .output()
        .expect("run sluiced");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && stderr.contains("grant_ttl_max_s = 0"), "{stderr}");

    let node = NodeProcess::start_secure_with(&dir.path().join("node"), &["--grant-ttl-max-s", "600"]);
    random_file(&dir.path().join("a.bin"), 10_000, 3);
    sealed_dataset(&node, "a", &[&dir.path().join("a.bin")]);
    let lifetime_ms = |ttl: &[&str]| {
        let args = [&["--json", "grant", "create", "a", "--client", "job"][..], ttl].concat();
        let grant: Value = serde_json::from_str(&node.ctl_ok(&args)).expect("json");
        grant["expires_unix_ms"].as_u64().expect("an end") - grant["created_unix_ms"].as_u64().expect("created")
    };
    assert_eq!(lifetime_ms(&[]), 600_000, "none asked: the longest");
    assert_eq!(lifetime_ms(&["--ttl", "12h"]), 600_000, "a longer one: cut");
    assert_eq!(lifetime_ms(&["--ttl", "90s"]), 90_000, "a shorter one: as asked");
    for ttl in ["0s", "3651d"] {
        let out = node.ctl(&["grant", "create", "a", "--client", "x", "--ttl", ttl]);
        assert!(!out.status.success(), "--ttl {ttl} is refused");
    }
}
