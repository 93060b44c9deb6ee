//! A small etcd v3 client over etcd's own JSON gateway (`/v3/kv/*`,
//! `/v3/lease/*`, `/v3/auth/authenticate`), which every etcd since 3.4
//! serves on its client port. The gRPC crates would need `protoc` at build
//! time, and a node needs only these calls, all blocking and short: the
//! catalog calls them from the control plane's threads, never from the
//! I/O path.
//!
//! Against a secured etcd ([`EtcdAccess`]): TLS (rustls, the same roots
//! and client certificates as the node's other TLS), a client certificate
//! for etcd's `--client-cert-auth`, and etcd's own authentication: the
//! node signs in as its user and sends the token etcd gives it with every
//! call, signing in again when etcd says the token expired. A password
//! given as a file is read again at each sign-in, so a rotated password
//! (`etcdctl user passwd`, which also ends the user's tokens, and the
//! file rewritten, as a Kubernetes Secret's is) is taken without a
//! restart.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine as _;
use serde::Deserialize;
use serde_json::{json, Value};
use sluice_proto::codec::Secret;

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

/// How a node reaches and proves itself to etcd.
#[derive(Clone, Default)]
pub struct EtcdAccess {
    /// CA certificates (PEM) etcd's server certificate chains to, for an
    /// `https://` endpoint; the public web roots when unset.
    pub ca: Option<PathBuf>,
    /// Client certificate and key (PEM), for etcd's `--client-cert-auth`.
    pub identity: Option<(PathBuf, PathBuf)>,
    /// etcd user and password, where etcd has authentication enabled.
    pub user: Option<(String, Secret)>,
    /// The file the password was read from, read again at each sign-in:
    /// the password etcd now takes where it was rotated.
    pub password_file: Option<PathBuf>,
}

/// The etcd password in `file`: its first line, which may not be empty.
pub fn read_password_file(file: &Path) -> Result<Secret, String> {
    let text = std::fs::read_to_string(file).map_err(|e| format!("etcd_password_file {}: {e}", file.display()))?;
    let password = text.lines().next().unwrap_or_default();
    if password.is_empty() {
        return Err(format!("etcd_password_file {} is empty", file.display()));
    }
    Ok(Secret::new(password.to_string()))
}

impl std::fmt::Debug for EtcdAccess {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdAccess")
            .field("ca", &self.ca)
            .field("identity", &self.identity)
            .field("user", &self.user.as_ref().map(|(name, _)| name))
            .field("password_file", &self.password_file)
            .finish()
    }
}

/// An etcd cluster's client endpoint, e.g. `https://127.0.0.1:2379`.
#[derive(Clone)]
pub struct Etcd {
    endpoint: String,
    agent: ureq::Agent,
    user: Option<Arc<User>>,
    /// The token of the current sign-in, shared by every clone.
    token: Arc<Mutex<Option<String>>>,
}

impl std::fmt::Debug for Etcd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Etcd").field("endpoint", &self.endpoint).finish_non_exhaustive()
    }
}

/// Who the node signs in as.
struct User {
    name: String,
    /// The password of the last sign-in (read at start, or from `file`).
    password: Mutex<Secret>,
    file: Option<PathBuf>,
}

impl User {
    /// The password to sign in with: `file`'s as it is now, or where it
    /// cannot be read (mid-rewrite, say), the last one, with a warning.
    fn password(&self) -> Secret {
        let mut last = self.password.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(file) = &self.file {
            match read_password_file(file) {
                Ok(now) => *last = now,
                Err(why) => tracing::warn!("{why}; signing in to etcd with the password read before"),
            }
        }
        last.clone()
    }
}

/// How one call failed.
enum Failure {
    /// etcd refused the token (expired, or etcd restarted): sign in again.
    Token(EtcdError),
    Other(EtcdError),
}

impl From<Failure> for EtcdError {
    fn from(failure: Failure) -> Self {
        match failure {
            Failure::Token(err) | Failure::Other(err) => err,
        }
    }
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
    /// etcd at `endpoint`, reached and signed in to as `access` says.
    pub fn connect(endpoint: &str, access: &EtcdAccess) -> Result<Self, EtcdError> {
        let endpoint = endpoint.trim_end_matches('/').to_string();
        let mut agent = ureq::AgentBuilder::new().timeout(CALL_TIMEOUT);
        if access.ca.is_some() || access.identity.is_some() || endpoint.starts_with("https://") {
            if !endpoint.starts_with("https://") {
                return Err(EtcdError::Call {
                    endpoint,
                    message: "etcd_ca / etcd_cert are set but the endpoint is not https://".into(),
                });
            }
            let files =
                sluice_transport::tls::ClientTlsFiles { ca: access.ca.clone(), identity: access.identity.clone() };
            let tls = sluice_transport::tls::client_config(&files)
                .map_err(|e| EtcdError::Call { endpoint: endpoint.clone(), message: e.to_string() })?;
            agent = agent.tls_config(tls);
        }
        let user = access.user.clone().map(|(name, password)| {
            Arc::new(User { name, password: Mutex::new(password), file: access.password_file.clone() })
        });
        Ok(Self { endpoint, agent: agent.build(), user, token: Arc::default() })
    }

    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    fn call(&self, path: &str, body: Value) -> Result<Value, EtcdError> {
        let token = self.token()?;
        match self.send(path, &body, token.as_deref()) {
            Err(Failure::Token(err)) if self.user.is_some() => {
                tracing::debug!("etcd refused the token ({err}); signing in again");
                if let Ok(mut slot) = self.token.lock() {
                    *slot = None;
                }
                let token = self.token()?;
                Ok(self.send(path, &body, token.as_deref())?)
            }
            other => Ok(other?),
        }
    }

    /// The token to send: none without a user; the current sign-in's, or a
    /// new sign-in's.
    fn token(&self) -> Result<Option<String>, EtcdError> {
        let Some(user) = self.user.as_deref() else { return Ok(None) };
        let mut slot = self.token.lock().map_err(|_| self.answer("the token lock is poisoned".into()))?;
        if let Some(token) = slot.as_ref() {
            return Ok(Some(token.clone()));
        }
        let (name, password) = (&user.name, user.password());
        let body = json!({ "name": name, "password": password.expose() });
        let answer = self.send("/v3/auth/authenticate", &body, None)?;
        let token = answer
            .get("token")
            .and_then(Value::as_str)
            .ok_or_else(|| self.answer(format!("signing in as {name} gave no token")))?
            .to_string();
        *slot = Some(token.clone());
        Ok(Some(token))
    }

    fn send(&self, path: &str, body: &Value, token: Option<&str>) -> Result<Value, Failure> {
        let url = format!("{}{path}", self.endpoint);
        let mut request = self.agent.post(&url);
        if let Some(token) = token {
            request = request.set("Authorization", token);
        }
        let call_error = |message: String| EtcdError::Call { endpoint: self.endpoint.clone(), message };
        let response = request.send_json(body.clone()).map_err(|err| match err {
            ureq::Error::Status(code, response) => {
                let text = response.into_string().unwrap_or_default();
                let error = call_error(format!("{path}: {code} {}", text.trim()));
                if code == 401 || text.contains("invalid auth token") {
                    Failure::Token(error)
                } else {
                    Failure::Other(error)
                }
            }
            other => Failure::Other(call_error(format!("{path}: {other}"))),
        })?;
        response.into_json().map_err(|e| Failure::Other(self.answer(format!("{path}: {e}"))))
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
