//! The node serves an OpenAPI document of its control API, and every
//! operation it documents is routed (a request reaches a handler, not the
//! router's fallback).

mod common;

use common::NodeProcess;
use serde_json::Value;

#[test]
fn every_documented_operation_is_served() {
    let dir = tempfile::tempdir().expect("tempdir");
    let node = NodeProcess::start(&dir.path().join("node"));
    let doc: Value =
        ureq::get(&format!("{}/openapi.json", node.endpoint)).call().expect("openapi.json").into_json().expect("json");
    assert!(doc["openapi"].as_str().is_some_and(|v| v.starts_with("3.")), "{doc}");
    let paths = doc["paths"].as_object().expect("paths");
    for expected in ["/v1/datasets", "/v1/datasets/{name}/ingest", "/v1/grants", "/v1/grants/{id}", "/metrics"] {
        assert!(paths.contains_key(expected), "{expected} is documented");
    }
    assert!(doc["components"]["schemas"]["DatasetRecord"].is_object(), "schemas are included");
    let mut operations = 0;
    for (path, item) in paths {
        let concrete = path.replace("{name}", "no-such-dataset").replace("{id}", "999999");
        for (method, _) in item.as_object().expect("path item") {
            let url = format!("{}{concrete}", node.endpoint);
            let response = match method.as_str() {
                "get" => ureq::get(&url).call(),
                "post" => ureq::post(&url).send_bytes(b"{}"),
                "put" => ureq::put(&url).send_bytes(b"{}"),
                "delete" => ureq::delete(&url).call(),
                other => panic!("undocumented method kind {other}"),
            };
            let (status, body) = match response {
                Ok(r) => (r.status(), r.into_string().unwrap_or_default()),
                Err(ureq::Error::Status(code, r)) => (code, r.into_string().unwrap_or_default()),
                Err(err) => panic!("{method} {path}: {err}"),
            };
            // The router's own 404/405 say `no_route` / `method_not_allowed`;
            // handlers answer with their own codes.
            let code =
                serde_json::from_str::<Value>(&body).ok().and_then(|b| b["error"]["code"].as_str().map(String::from));
            assert!(
                !matches!(code.as_deref(), Some("no_route" | "method_not_allowed")),
                "{method} {path} is documented but not routed ({status} {body})"
            );
            operations += 1;
        }
    }
    assert!(operations >= 20, "{operations} operations documented");
}
