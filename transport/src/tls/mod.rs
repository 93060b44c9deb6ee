//! TLS for the control API and the TCP data port: rustls with the `ring`
//! provider, configured from PEM files.
//!
//! One place builds every rustls config the node and its clients use, so
//! both listeners accept the same certificates and both clients trust the
//! same roots. A client certificate is optional at the handshake even when
//! the node knows a client CA: whether a request needs one (an operator
//! without a token, a grant bound to a certificate) is decided by
//! authorization, which then refuses with a reason instead of a bare
//! handshake failure. The identity a certificate carries is its subject's
//! common name (CN), as in Kubernetes' x509 authenticator. Certificates,
//! keys and CA files are followed as they change (`reload`): a rotated
//! pair or CA is taken up without a restart.

mod reload;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

/// Where a listener's certificate, key and (for mTLS) client CA are.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServerTlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
    /// Client certificates signed by this CA identify their holder (mTLS).
    pub client_ca: Option<PathBuf>,
}

/// What a client trusts and, for mTLS, presents.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ClientTlsFiles {
    /// CA certificates (PEM) the node's certificate must chain to; the
    /// public web roots when `None`.
    pub ca: Option<PathBuf>,
    /// This client's certificate and key (PEM), presented when asked.
    pub identity: Option<(PathBuf, PathBuf)>,
}

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("reading {what} {path}: {message}")]
    File { what: &'static str, path: String, message: String },
    #[error("{what} {path} holds no {expected}")]
    Empty { what: &'static str, path: String, expected: &'static str },
    #[error("TLS configuration: {0}")]
    Config(String),
}

fn file_error(what: &'static str, path: &Path, message: impl std::fmt::Display) -> TlsError {
    TlsError::File { what, path: path.display().to_string(), message: message.to_string() }
}

/// Every certificate in a PEM file, refusing a file with none.
pub fn load_certs(what: &'static str, path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(path)
        .map_err(|e| file_error(what, path, e))?
        .collect::<Result<_, _>>()
        .map_err(|e| file_error(what, path, e))?;
    if certs.is_empty() {
        return Err(TlsError::Empty { what, path: path.display().to_string(), expected: "PEM certificate" });
    }
    Ok(certs)
}

/// The first private key in a PEM file (PKCS#8, PKCS#1 or SEC1).
pub fn load_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    PrivateKeyDer::from_pem_file(path).map_err(|e| match e {
        rustls::pki_types::pem::Error::NoItemsFound => {
            TlsError::Empty { what: "key file", path: path.display().to_string(), expected: "PEM private key" }
        }
        other => file_error("key file", path, other),
    })
}

/// ring's provider with AES-128-GCM first: as strong as a data path
/// needs, and ~30 % less CPU per byte than AES-256-GCM (10 rounds against
/// 14), which a node serving GB/s spends on every byte. Both ends prefer
/// it, so it is what they agree on; the others stay for peers without it.
fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    use rustls::CipherSuite::{
        TLS13_AES_128_GCM_SHA256, TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256, TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256,
    };
    let mut provider = rustls::crypto::ring::default_provider();
    let aes_128 = |suite: &rustls::SupportedCipherSuite| {
        matches!(
            suite.suite(),
            TLS13_AES_128_GCM_SHA256 | TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256 | TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256
        )
    };
    provider.cipher_suites.sort_by_key(|suite| !aes_128(suite));
    Arc::new(provider)
}

fn roots(ca: Option<&Path>) -> Result<rustls::RootCertStore, TlsError> {
    let mut roots = rustls::RootCertStore::empty();
    match ca {
        Some(path) => {
            for cert in load_certs("CA file", path)? {
                roots.add(cert).map_err(|e| file_error("CA file", path, e))?;
            }
        }
        None => roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned()),
    }
    Ok(roots)
}

/// A listener's rustls config. With a client CA, clients may present a
/// certificate signed by it (and one signed by anything else fails the
/// handshake); clients without one still connect. The certificate, its
/// key and the client CA are read now and again whenever their files
/// change (`reload`).
pub fn server_config(files: &ServerTlsFiles) -> Result<Arc<rustls::ServerConfig>, TlsError> {
    let certificate = reload::ReloadingCert::certificate(&files.cert, &files.key, provider())?;
    let builder = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError::Config(e.to_string()))?;
    let builder = match &files.client_ca {
        Some(ca) => builder.with_client_cert_verifier(Arc::new(reload::ReloadingClientCa::load(ca, provider())?)),
        None => builder.with_no_client_auth(),
    };
    Ok(Arc::new(builder.with_cert_resolver(Arc::new(certificate))))
}

/// A client's rustls config. A CA file, and the client's own certificate
/// and key, are read now and again whenever their files change; without
/// a CA file the public web roots are trusted.
pub fn client_config(files: &ClientTlsFiles) -> Result<Arc<rustls::ClientConfig>, TlsError> {
    let builder = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError::Config(e.to_string()))?;
    let builder = match &files.ca {
        Some(ca) => builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(reload::ReloadingServerCa::load(ca, provider())?)),
        None => builder.with_root_certificates(roots(None)?),
    };
    let config = match &files.identity {
        Some((cert, key)) => {
            builder.with_client_cert_resolver(Arc::new(reload::ReloadingCert::certificate(cert, key, provider())?))
        }
        None => builder.with_no_client_auth(),
    };
    Ok(Arc::new(config))
}

/// The identity a verified peer certificate carries: its subject CN.
pub fn certificate_name(cert: &CertificateDer<'_>) -> Option<String> {
    let (_, parsed) = x509_parser::parse_x509_certificate(cert.as_ref()).ok()?;
    let name = parsed.subject().iter_common_name().next()?.as_str().ok()?.to_string();
    Some(name)
}

/// The CN of the leaf certificate a TLS peer presented, if it presented one.
pub fn peer_name(certs: Option<&[CertificateDer<'_>]>) -> Option<String> {
    certs.and_then(|chain| chain.first()).and_then(certificate_name)
}

/// The TLS server name for a host as written in an endpoint or address
/// (a DNS name or an IP literal, brackets allowed).
pub fn server_name(host: &str) -> Result<rustls::pki_types::ServerName<'static>, TlsError> {
    let host = host.trim_start_matches('[').trim_end_matches(']');
    rustls::pki_types::ServerName::try_from(host.to_string())
        .map_err(|e| TlsError::Config(format!("{host:?} is not a TLS server name: {e}")))
}

/// What a failed client handshake means to the person who ran the client:
/// a certificate the CA given does not vouch for says so and names the
/// settings, instead of a bare "invalid peer certificate".
pub fn handshake_error_words(err: &std::io::Error) -> String {
    let inner = err.get_ref().and_then(|e| e.downcast_ref::<rustls::Error>());
    match inner {
        Some(rustls::Error::InvalidCertificate(why)) => format!(
            "the node's certificate is not trusted ({why:?}): pass the CA that signed it \
             (--ca-file or SLUICE_CA_FILE), and reach the node by a name or IP its certificate carries"
        ),
        Some(other) => other.to_string(),
        None => err.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A file that exists but holds no certificate or key is refused with
    /// what was expected, not a TLS error later at the first handshake.
    #[test]
    fn empty_pem_files_are_refused_by_name() {
        let dir = tempfile_dir();
        let empty = dir.join("empty.pem");
        std::fs::write(&empty, "not a pem file\n").expect("write");
        let err = load_certs("certificate file", &empty).expect_err("no certificate");
        assert!(err.to_string().contains("holds no PEM certificate"), "{err}");
        let err = load_key(&empty).expect_err("no key");
        assert!(err.to_string().contains("holds no PEM private key"), "{err}");
        let err = load_certs("CA file", &dir.join("absent.pem")).expect_err("absent");
        assert!(err.to_string().contains("reading CA file"), "{err}");
    }

    /// AES-128-GCM is offered first (TLS 1.3, then 1.2); nothing is dropped.
    #[test]
    fn aes_128_gcm_comes_first() {
        let suites = &provider().cipher_suites;
        assert_eq!(suites[0].suite(), rustls::CipherSuite::TLS13_AES_128_GCM_SHA256);
        assert_eq!(suites.len(), rustls::crypto::ring::default_provider().cipher_suites.len());
    }

    #[test]
    fn server_names_take_hosts_and_ip_literals() {
        assert!(server_name("localhost").is_ok());
        assert!(server_name("127.0.0.1").is_ok());
        assert!(server_name("[::1]").is_ok());
        assert!(server_name("bad host").is_err());
    }

    fn tempfile_dir() -> PathBuf {
        let dir = std::env::temp_dir().join(format!("sluice-tls-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        dir
    }
}
