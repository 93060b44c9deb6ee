//! A small etcd v3 client over etcd's own JSON gateway (`/v3/kv/*`,
//! `/v3/lease/*`), which every etcd since 3.4 serves on its client port.
//! The gRPC crates would need `protoc` at build time, and a node needs
//! only these six calls, all blocking and short: the catalog calls them
//! from the control plane's threads, never from the I/O path.

use std::time::Duration;

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine as _;
use serde::Deserialize;
use serde_json::{json, Value};

/// Longest one etcd call may take before the catalog reports it down.
const CALL_TIMEOUT: Duration = Duration::from_secs(5);

#[derive(Debug, thiserror::Error)]
pub enum EtcdError {
    #[error("etcd at {endpoint}: {message}")]
    Call { endpoint: String, message: String },
    #[error("etcd at {endpoint} answered something unreadable: {message}")]
    Answer { endpoint: String, message: String },
}

/// One key with its value and revisions.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyValue {
    pub key: String,
    pub value: Vec<u8>,
    pub mod_revision: i64,
}

/// What a transaction compares before it runs its operations.
#[derive(Clone, Debug)]
pub enum Compare {
    /// The key does not exist.
    Absent(String),
    /// The key was last changed at this revision.
    ModRevision(String, i64),
}

/// One write of a transaction.
#[derive(Clone, Debug)]
pub enum Op {
    Put {
        key: String,
        value: Vec<u8>,
    },
    Delete(String),
    /// Every key starting with the prefix.
    DeletePrefix(String),
}

/// An etcd cluster's client endpoint, e.g. `http://127.0.0.1:2379`.
#[derive(Clone, Debug)]
pub struct Etcd {
    endpoint: String,
    agent: ureq::Agent,
}

#[derive(Deserialize)]
struct RawKv {
    key: String,
    #[serde(default)]
    value: String,
    #[serde(default)]
    mod_revision: String,
}

/// The end of the key range that holds every key starting with `prefix`.
fn prefix_end(prefix: &str) -> Vec<u8> {
    let mut end = prefix.as_bytes().to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0]
}

fn b64(bytes: impl AsRef<[u8]>) -> String {
    B64.encode(bytes)
}

impl Etcd {
    pub fn new(endpoint: &str) -> Self {
        let agent = ureq::AgentBuilder::new().timeout(CALL_TIMEOUT).build();
        Self { endpoint: endpoint.trim_end_matches('/').to_string(), agent }
    }

    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    fn call(&self, path: &str, body: Value) -> Result<Value, EtcdError> {
        let url = format!("{}{path}", self.endpoint);
        let response = self.agent.post(&url).send_json(body).map_err(|err| EtcdError::Call {
            endpoint: self.endpoint.clone(),
            message: match err {
                ureq::Error::Status(code, response) => {
                    format!("{path}: {code} {}", response.into_string().unwrap_or_default())
                }
                other => format!("{path}: {other}"),
            },
        })?;
        response.into_json().map_err(|e| self.answer(format!("{path}: {e}")))
    }

    fn answer(&self, message: String) -> EtcdError {
        EtcdError::Answer { endpoint: self.endpoint.clone(), message }
    }

    fn kvs(&self, answer: &Value) -> Result<Vec<KeyValue>, EtcdError> {
        let Some(kvs) = answer.get("kvs") else { return Ok(Vec::new()) };
        let raw: Vec<RawKv> = serde_json::from_value(kvs.clone()).map_err(|e| self.answer(e.to_string()))?;
        raw.into_iter()
            .map(|kv| {
                let key = B64.decode(&kv.key).map_err(|e| self.answer(format!("key: {e}")))?;
                Ok(KeyValue {
                    key: String::from_utf8(key).map_err(|e| self.answer(format!("key: {e}")))?,
                    value: B64.decode(&kv.value).map_err(|e| self.answer(format!("value: {e}")))?,
                    mod_revision: kv.mod_revision.parse().unwrap_or(0),
                })
            })
            .collect()
    }

    pub fn get(&self, key: &str) -> Result<Option<KeyValue>, EtcdError> {
        let answer = self.call("/v3/kv/range", json!({ "key": b64(key) }))?;
        Ok(self.kvs(&answer)?.into_iter().next())
    }

    /// Every key starting with `prefix`, in key order, at most `limit`.
    pub fn list(&self, prefix: &str, limit: usize) -> Result<Vec<KeyValue>, EtcdError> {
        let answer = self.call(
            "/v3/kv/range",
            json!({ "key": b64(prefix), "range_end": b64(prefix_end(prefix)), "limit": limit }),
        )?;
        self.kvs(&answer)
    }

    /// Writes `key`; with a lease, the key goes when the lease expires.
    pub fn put(&self, key: &str, value: &[u8], lease: Option<i64>) -> Result<(), EtcdError> {
        let mut body = json!({ "key": b64(key), "value": b64(value) });
        if let Some(lease) = lease {
            body["lease"] = json!(lease.to_string());
        }
        self.call("/v3/kv/put", body).map(drop)
    }

    /// Runs `ops` if every comparison holds; whether they ran.
    pub fn txn(&self, compares: &[Compare], ops: &[Op]) -> Result<bool, EtcdError> {
        let compare: Vec<Value> = compares
            .iter()
            .map(|c| match c {
                Compare::Absent(key) => {
                    json!({ "target": "CREATE", "key": b64(key), "create_revision": "0", "result": "EQUAL" })
                }
                Compare::ModRevision(key, revision) => json!({
                    "target": "MOD", "key": b64(key), "mod_revision": revision.to_string(), "result": "EQUAL"
                }),
            })
            .collect();
        let success: Vec<Value> = ops
            .iter()
            .map(|op| match op {
                Op::Put { key, value } => json!({ "request_put": { "key": b64(key), "value": b64(value) } }),
                Op::Delete(key) => json!({ "request_delete_range": { "key": b64(key) } }),
                Op::DeletePrefix(prefix) => json!({
                    "request_delete_range": { "key": b64(prefix), "range_end": b64(prefix_end(prefix)) }
                }),
            })
            .collect();
        let answer = self.call("/v3/kv/txn", json!({ "compare": compare, "success": success }))?;
        Ok(answer.get("succeeded").and_then(Value::as_bool).unwrap_or(false))
    }

    /// Deletes `key`; whether it existed.
    pub fn delete(&self, key: &str) -> Result<bool, EtcdError> {
        let answer = self.call("/v3/kv/deleterange", json!({ "key": b64(key) }))?;
        Ok(answer.get("deleted").and_then(Value::as_str).is_some_and(|n| n != "0"))
    }

    /// A lease of `ttl` seconds: its id.
    pub fn grant_lease(&self, ttl: Duration) -> Result<i64, EtcdError> {
        let answer = self.call("/v3/lease/grant", json!({ "TTL": ttl.as_secs().max(1) }))?;
        answer
            .get("ID")
            .and_then(Value::as_str)
            .and_then(|id| id.parse().ok())
            .ok_or_else(|| self.answer(format!("lease grant without an id: {answer}")))
    }

    /// Renews a lease; `false` when it has already expired.
    pub fn keep_alive(&self, lease: i64) -> Result<bool, EtcdError> {
        let answer = self.call("/v3/lease/keepalive", json!({ "ID": lease.to_string() }))?;
        let ttl = answer.pointer("/result/TTL").and_then(Value::as_str).and_then(|t| t.parse::<i64>().ok());
        Ok(ttl.is_some_and(|t| t > 0))
    }

    pub fn revoke_lease(&self, lease: i64) -> Result<(), EtcdError> {
        self.call("/v3/lease/revoke", json!({ "ID": lease.to_string() })).map(drop)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The range end of a prefix is the first key past every key with it.
    #[test]
    fn prefix_end_bounds_the_prefix() {
        assert_eq!(prefix_end("/a/"), b"/a0".to_vec());
        assert_eq!(prefix_end("a\u{7f}"), b"a\x80".to_vec());
        assert_eq!(prefix_end(""), vec![0]);
    }
}
