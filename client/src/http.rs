//! The control API over HTTP or HTTPS, as training hosts and `sluicectl`
//! speak it: one agent per endpoint with the trust the caller configured
//! (CA file, client certificate) and the bearer credential it holds.
//!
//! Errors keep the node's stable code (`unauthenticated`, `forbidden`,
//! `unknown_dataset`, ...) so callers can act on it and people can read it.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use sluice_transport::tls::{self, ClientTlsFiles};

/// How long a client waits on the node, by kind of request.
///
/// Most requests have a deadline a little past the node's own
/// ([`sluice_proto::api::REQUEST_TIMEOUT`]), so the node's `timeout` answer
/// arrives rather than a cut connection. The long operations (an ingest's
/// upload, a seal or scrub that reads every byte before it answers, a
/// streamed index) have no deadline, since their length is their work's: a
/// 100 GB ingest is not late at minute two. They are bounded instead by
/// how long the node may stay silent: a send stuck for the node's own
/// upload idle bound, or no answer for [`LONG_ANSWER_WAIT`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Timeouts {
    pub connect: Duration,
    /// The whole of an ordinary request.
    pub deadline: Duration,
    /// One stuck send of a long operation.
    pub send_idle: Duration,
    /// One silent wait of a long operation: the node reads every byte of
    /// a seal or scrub before it says a word.
    pub answer_wait: Duration,
}

/// A long operation's longest silence: an hour of a seal or scrub is a few
/// terabytes read at device speed.
pub const LONG_ANSWER_WAIT: Duration = Duration::from_secs(3600);

impl Default for Timeouts {
    fn default() -> Self {
        Self {
            connect: Duration::from_secs(10),
            deadline: sluice_proto::api::REQUEST_TIMEOUT + Duration::from_secs(10),
            send_idle: sluice_proto::api::UPLOAD_IDLE_TIMEOUT,
            answer_wait: LONG_ANSWER_WAIT,
        }
    }
}

/// The CA file (PEM) a client trusts for `https://` endpoints and TLS data
/// ports; the public web roots when unset.
pub const CA_FILE_ENV: &str = "SLUICE_CA_FILE";
/// This client's certificate (PEM), presented for mTLS.
pub const CERT_FILE_ENV: &str = "SLUICE_CERT_FILE";
/// The key of [`CERT_FILE_ENV`]'s certificate (PEM).
pub const KEY_FILE_ENV: &str = "SLUICE_KEY_FILE";

/// The TLS settings named by `SLUICE_CA_FILE`, `SLUICE_CERT_FILE` and
/// `SLUICE_KEY_FILE`.
pub fn tls_files_from_env() -> Result<ClientTlsFiles, String> {
    let path = |name: &str| std::env::var_os(name).filter(|v| !v.is_empty()).map(PathBuf::from);
    let identity = match (path(CERT_FILE_ENV), path(KEY_FILE_ENV)) {
        (Some(cert), Some(key)) => Some((cert, key)),
        (None, None) => None,
        _ => return Err(format!("{CERT_FILE_ENV} and {KEY_FILE_ENV} go together: set both or neither")),
    };
    Ok(ClientTlsFiles { ca: path(CA_FILE_ENV), identity })
}

/// A refused or failed control request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ApiFailure {
    /// The HTTP status, when the node answered.
    pub status: Option<u16>,
    /// The node's stable error code, when it sent one.
    pub code: Option<String>,
    pub message: String,
}

impl std::fmt::Display for ApiFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.code {
            Some(code) => write!(f, "{} ({code})", self.message),
            None => f.write_str(&self.message),
        }
    }
}

/// One node's control API.
#[derive(Clone)]
pub struct ControlHttp {
    endpoint: String,
    /// Ordinary requests, each under a deadline.
    agent: ureq::Agent,
    /// Long operations: no deadline, every send and wait bounded. A fresh
    /// connection each, since ureq sets those bounds on new connections
    /// only (a pooled one comes back without them).
    long_agent: ureq::Agent,
    tls: Option<Arc<rustls::ClientConfig>>,
    /// `Authorization: Bearer` for every request (an operator token or a
    /// grant's token); never shown by `Debug`.
    bearer: Option<Arc<str>>,
}

impl std::fmt::Debug for ControlHttp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ControlHttp")
            .field("endpoint", &self.endpoint)
            .field("tls", &self.tls.is_some())
            .field("bearer", &self.bearer.as_ref().map(|_| "<redacted>"))
            .finish()
    }
}

impl ControlHttp {
    /// A client of the control API at `endpoint` (`http://` or `https://`).
    pub fn new(endpoint: &str, tls_files: &ClientTlsFiles) -> Result<Self, ApiFailure> {
        Self::with_timeouts(endpoint, tls_files, Timeouts::default())
    }

    pub(crate) fn with_timeouts(
        endpoint: &str,
        tls_files: &ClientTlsFiles,
        timeouts: Timeouts,
    ) -> Result<Self, ApiFailure> {
        let endpoint = endpoint.trim_end_matches('/').to_string();
        let local = |message: String| ApiFailure { status: None, code: None, message };
        if !endpoint.starts_with("http://") && !endpoint.starts_with("https://") {
            return Err(local(format!("endpoint {endpoint:?} must start with http:// or https://")));
        }
        let tls = if endpoint.starts_with("https://") || tls_files.ca.is_some() || tls_files.identity.is_some() {
            Some(tls::client_config(tls_files).map_err(|e| local(e.to_string()))?)
        } else {
            None
        };
        let with_tls = |builder: ureq::AgentBuilder| match &tls {
            Some(config) => builder.tls_config(Arc::clone(config)),
            None => builder,
        };
        let agent = with_tls(ureq::AgentBuilder::new().timeout_connect(timeouts.connect).timeout(timeouts.deadline));
        let long_agent = with_tls(
            ureq::AgentBuilder::new()
                .timeout_connect(timeouts.connect)
                .timeout_write(timeouts.send_idle)
                .timeout_read(timeouts.answer_wait)
                .max_idle_connections(0),
        );
        Ok(Self { endpoint, agent: agent.build(), long_agent: long_agent.build(), tls, bearer: None })
    }

    /// The same client, sending `token` as its bearer credential.
    pub fn with_bearer(mut self, token: Option<&str>) -> Self {
        self.bearer = token.filter(|t| !t.is_empty()).map(Arc::from);
        self
    }

    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// The rustls config this client trusts with, for the data port too.
    pub fn tls_config(&self) -> Option<Arc<rustls::ClientConfig>> {
        self.tls.clone()
    }

    /// A request to `path`, with the bearer credential set: under the
    /// ordinary deadline, or, for one of the node's long operations
    /// ([`sluice_proto::api::LONG_OPERATIONS`]), with none but the bounds
    /// of `Timeouts` on a stuck send and a silent node.
    pub fn request(&self, method: &str, path: &str) -> ureq::Request {
        let long = sluice_proto::api::is_long_operation(method, path);
        self.on(if long { &self.long_agent } else { &self.agent }, method, path)
    }

    fn on(&self, agent: &ureq::Agent, method: &str, path: &str) -> ureq::Request {
        let request = agent.request(method, &format!("{}{path}", self.endpoint));
        match &self.bearer {
            Some(token) => request.set("authorization", &format!("Bearer {token}")),
            None => request,
        }
    }

    /// Sends `request` (from [`ControlHttp::request`]) and turns a refusal
    /// into the node's code and message.
    pub fn call(&self, sent: Result<ureq::Response, ureq::Error>) -> Result<ureq::Response, ApiFailure> {
        sent.map_err(|err| match err {
            ureq::Error::Status(status, response) => {
                let text = response.into_string().unwrap_or_default();
                let body: Option<serde_json::Value> = serde_json::from_str(&text).ok();
                let field = |name: &str| body.as_ref().and_then(|b| b["error"][name].as_str().map(str::to_string));
                ApiFailure {
                    status: Some(status),
                    code: field("code"),
                    message: field("message").unwrap_or_else(|| format!("HTTP {status}: {text}")),
                }
            }
            ureq::Error::Transport(transport) => ApiFailure {
                status: None,
                code: None,
                message: format!("cannot reach the node at {}: {}", self.endpoint, transport_words(&transport)),
            },
        })
    }

    /// `GET path`.
    pub fn get(&self, path: &str) -> Result<ureq::Response, ApiFailure> {
        self.call(self.request("GET", path).call())
    }

    /// `GET path` as JSON.
    pub fn get_json<T: serde::de::DeserializeOwned>(&self, path: &str) -> Result<T, ApiFailure> {
        self.get(path)?.into_json().map_err(|e| ApiFailure {
            status: None,
            code: None,
            message: format!("bad answer from {path}: {e}"),
        })
    }

    /// `GET path`, the whole body, streamed as long as it takes (an index
    /// of a billion records is 16 GB).
    pub fn get_bytes(&self, path: &str) -> Result<Vec<u8>, ApiFailure> {
        let mut bytes = Vec::new();
        let response = self.call(self.on(&self.long_agent, "GET", path).call())?;
        std::io::Read::read_to_end(&mut response.into_reader(), &mut bytes).map_err(|e| ApiFailure {
            status: None,
            code: None,
            message: format!("reading {path}: {e}"),
        })?;
        Ok(bytes)
    }
}

/// A transport failure in words, with a certificate problem spelled out.
fn transport_words(transport: &ureq::Transport) -> String {
    let source = std::error::Error::source(transport);
    if let Some(io) = source.and_then(|s| s.downcast_ref::<std::io::Error>()) {
        if io.get_ref().and_then(|e| e.downcast_ref::<rustls::Error>()).is_some() {
            return tls::handshake_error_words(io);
        }
        // A send timeout surfaces as EAGAIN from the socket.
        if io.kind() == std::io::ErrorKind::WouldBlock {
            return format!("timed out sending: the node stopped taking the request ({transport})");
        }
    }
    if let Some(rustls_error) = source.and_then(|s| s.downcast_ref::<rustls::Error>()) {
        return tls::handshake_error_words(&std::io::Error::other(rustls_error.clone()));
    }
    transport.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The bearer credential never shows in Debug output.
    #[test]
    fn bearer_is_redacted() {
        let http = ControlHttp::new("http://127.0.0.1:1", &ClientTlsFiles::default())
            .expect("client")
            .with_bearer(Some("sluice_secret_value"));
        assert!(!format!("{http:?}").contains("secret_value"));
    }

    /// A node on loopback that reads one request whole, then answers `ok`
    /// after `delay` (never, when `None`).
    fn node_answering_after(delay: Option<Duration>) -> String {
        use std::io::{BufRead, BufReader, Read, Write};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let address = listener.local_addr().expect("address");
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(mut stream) = stream else { return };
                let mut reader = BufReader::new(stream.try_clone().expect("clone"));
                let mut body_bytes = 0usize;
                loop {
                    let mut line = String::new();
                    if reader.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
                        break;
                    }
                    if let Some(length) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                        body_bytes = length.trim().parse().expect("content-length");
                    }
                }
                let _ = reader.by_ref().take(body_bytes as u64).read_to_end(&mut Vec::new());
                match delay {
                    Some(delay) => std::thread::sleep(delay),
                    None => std::thread::sleep(Duration::from_secs(600)),
                }
                let _ = stream.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok");
            }
        });
        format!("http://{address}")
    }

    fn short_timeouts() -> Timeouts {
        Timeouts {
            connect: Duration::from_secs(5),
            deadline: Duration::from_millis(300),
            send_idle: Duration::from_millis(300),
            answer_wait: Duration::from_secs(5),
        }
    }

    /// A long operation's answer may come after the ordinary deadline (a
    /// seal reads every byte; an ingest under load commits late): it is
    /// waited for, while an ordinary request to the same node is cut off.
    #[test]
    fn a_long_operation_outlasts_the_ordinary_deadline() {
        let endpoint = node_answering_after(Some(Duration::from_millis(900)));
        let http = ControlHttp::with_timeouts(&endpoint, &ClientTlsFiles::default(), short_timeouts()).expect("client");
        let long = http.call(http.request("POST", "/v1/datasets/d/ingest").send_bytes(&[7u8; 4096]));
        assert_eq!(long.expect("a long operation waits for its answer").into_string().expect("body"), "ok");
        let ordinary = http.call(http.request("POST", "/v1/datasets/d/pin").send_bytes(&[7u8; 16]));
        let failure = ordinary.expect_err("an ordinary request has a deadline");
        assert!(failure.message.contains("timed out"), "{failure}");
    }

    /// A long operation still gives up on a node that stops reading its
    /// upload, and on one that never answers.
    #[test]
    fn a_long_operation_gives_up_on_a_stuck_node() {
        let silent = node_answering_after(None);
        let timeouts = Timeouts { answer_wait: Duration::from_millis(300), ..short_timeouts() };
        let http = ControlHttp::with_timeouts(&silent, &ClientTlsFiles::default(), timeouts).expect("client");
        let failure =
            http.call(http.request("POST", "/v1/datasets/d/seal").call()).expect_err("no answer within the long wait");
        assert!(failure.message.contains("timed out"), "{failure}");

        // A node that accepts and never reads: the upload fills the socket
        // buffers (a few MiB on loopback), then its send is stuck.
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let endpoint = format!("http://{}", listener.local_addr().expect("address"));
        let http = ControlHttp::with_timeouts(&endpoint, &ClientTlsFiles::default(), short_timeouts()).expect("client");
        let upload = std::io::Read::take(std::io::repeat(0), 256 << 20);
        let failure =
            http.call(http.request("POST", "/v1/datasets/d/ingest").send(upload)).expect_err("a stuck upload gives up");
        assert!(failure.message.contains("timed out sending"), "{failure}");
        drop(listener);
    }

    #[test]
    fn endpoints_need_a_scheme() {
        let err = ControlHttp::new("127.0.0.1:7070", &ClientTlsFiles::default()).expect_err("no scheme");
        assert!(err.message.contains("http://"), "{err}");
    }
}
