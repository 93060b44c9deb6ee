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

/// How long one control request may take.
const HTTP_TIMEOUT: Duration = Duration::from_secs(30);

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
    agent: ureq::Agent,
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
        let endpoint = endpoint.trim_end_matches('/').to_string();
        let local = |message: String| ApiFailure { status: None, code: None, message };
        let mut builder = ureq::AgentBuilder::new().timeout(HTTP_TIMEOUT);
        let tls = if endpoint.starts_with("https://") || tls_files.ca.is_some() || tls_files.identity.is_some() {
            let config = tls::client_config(tls_files).map_err(|e| local(e.to_string()))?;
            builder = builder.tls_config(Arc::clone(&config));
            Some(config)
        } else {
            None
        };
        if !endpoint.starts_with("http://") && !endpoint.starts_with("https://") {
            return Err(local(format!("endpoint {endpoint:?} must start with http:// or https://")));
        }
        Ok(Self { endpoint, agent: builder.build(), tls, bearer: None })
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

    /// A request to `path`, with the bearer credential set.
    pub fn request(&self, method: &str, path: &str) -> ureq::Request {
        let request = self.agent.request(method, &format!("{}{path}", self.endpoint));
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

    /// `GET path`, the whole body.
    pub fn get_bytes(&self, path: &str) -> Result<Vec<u8>, ApiFailure> {
        let mut bytes = Vec::new();
        std::io::Read::read_to_end(&mut self.get(path)?.into_reader(), &mut bytes).map_err(|e| ApiFailure {
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

    #[test]
    fn endpoints_need_a_scheme() {
        let err = ControlHttp::new("127.0.0.1:7070", &ClientTlsFiles::default()).expect_err("no scheme");
        assert!(err.message.contains("http://"), "{err}");
    }
}
