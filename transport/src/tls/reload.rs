//! What TLS reads from files, followed as the files change, so a rotated
//! certificate or CA is used without a restart: a listener's certificate
//! (the control API, the data port), a client's identity for mTLS (the
//! node's etcd client, a training job's certificate-bound grant), the
//! CA a listener checks client certificates against (`tls_client_ca`),
//! and the CA a client checks the node or etcd against (`--ca-file`,
//! `etcd_ca`).
//!
//! Certificates are short-lived where they are managed: cert-manager
//! renews at two thirds of a 90-day life and rewrites the Secret's files
//! in place (a symlink swap in the pod's volume), and etcd and the
//! Kubernetes components pick the new pair up as they run. A node that
//! read its pair once at start would serve the old one until it expired,
//! and every client would then fail at once. A CA is rotated by first
//! trusting a bundle of the old and the new one (trust-manager writes
//! it), then issuing from the new; the Kubernetes API server follows its
//! `--client-ca-file` so.
//!
//! So each is looked up at each handshake ([`Followed`]): at most once
//! every [`RECHECK`] one handshake looks at the files (device, inode,
//! length, mtime, following links). If any changed, they are read again
//! and, if they load (a key that matches its certificate, a CA file of
//! certificates), used from then on. Files that do not load (a key written
//! after its certificate, a file half copied) are logged and what is in
//! use is kept; the next change is tried again.
//!
//! A listener whose client CA is followed names no CA in its certificate
//! request (the `certificate_authorities` hint may be empty): a client
//! presents the certificate it was given either way.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::ResolvesClientCert;
use rustls::crypto::CryptoProvider;
use rustls::crypto::WebPkiSupportedAlgorithms;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls::{DigitallySignedStruct, DistinguishedName, SignatureScheme};

use super::{load_certs, load_key, roots, TlsError};

/// How often, at most, a handshake looks whether the files changed.
pub const RECHECK: Duration = Duration::from_secs(1);

/// What identifies one version of a file: a rewrite changes its mtime or
/// length, a replacement (rename, symlink swap) its inode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct FileStamp {
    device: u64,
    inode: u64,
    len: u64,
    mtime_ns: i128,
}

fn stamp_of(path: &Path) -> Option<FileStamp> {
    let meta = std::fs::metadata(path).ok()?;
    Some(FileStamp {
        device: meta.dev(),
        inode: meta.ino(),
        len: meta.len(),
        mtime_ns: i128::from(meta.mtime()) * 1_000_000_000 + i128::from(meta.mtime_nsec()),
    })
}

/// Most files one followed thing is read from (a certificate and its key).
const FILES_MAX: usize = 2;

/// The files' stamps as last looked at (`None`: no such file, or unused).
type Stamps = [Option<FileStamp>; FILES_MAX];

struct Watch {
    next_check: Instant,
    seen: Stamps,
}

/// How a followed thing is read from its files.
type Read<T> = Box<dyn Fn() -> Result<T, TlsError> + Send + Sync>;

/// Something read from one or two files, read again when they change
/// (at most once every [`RECHECK`], by the handshake that finds it due).
pub(super) struct Followed<T> {
    /// What it is, for the log: "TLS certificate", "client CA".
    what: &'static str,
    paths: Vec<PathBuf>,
    read: Read<T>,
    current: RwLock<Arc<T>>,
    watch: Mutex<Watch>,
}

impl<T> std::fmt::Debug for Followed<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Followed").field("what", &self.what).field("paths", &self.paths).finish()
    }
}

impl<T> Followed<T> {
    /// Reads it now: files that do not load are an error at start, where
    /// the operator sees it.
    fn load(what: &'static str, paths: &[&Path], read: Read<T>) -> Result<Self, TlsError> {
        assert!(!paths.is_empty() && paths.len() <= FILES_MAX, "{what}: {} files", paths.len());
        let paths: Vec<PathBuf> = paths.iter().map(|p| p.to_path_buf()).collect();
        let seen = stamps(&paths);
        let current = read()?;
        Ok(Self {
            what,
            paths,
            read,
            current: RwLock::new(Arc::new(current)),
            watch: Mutex::new(Watch { next_check: Instant::now() + RECHECK, seen }),
        })
    }

    /// What is in use, after taking up the files' new version if they
    /// changed since the last look and it is due; a handshake that finds
    /// another looking goes on with what is in use.
    fn get(&self) -> Option<Arc<T>> {
        self.follow_files();
        self.current.read().ok().map(|current| Arc::clone(&current))
    }

    fn follow_files(&self) {
        let Ok(mut watch) = self.watch.try_lock() else { return };
        let now = Instant::now();
        if now < watch.next_check {
            return;
        }
        watch.next_check = now + RECHECK;
        // Stamped before reading: a change during the read is seen at the
        // next look and read again.
        let stamp = stamps(&self.paths);
        if stamp == watch.seen {
            return;
        }
        watch.seen = stamp;
        let first = self.paths[0].display();
        match (self.read)() {
            Ok(fresh) => {
                if let Ok(mut current) = self.current.write() {
                    *current = Arc::new(fresh);
                }
                tracing::info!(file = %first, "{} changed on disk: using the new one", self.what);
            }
            Err(err) => tracing::warn!(
                file = %first,
                "{} files changed but do not load ({err}); keeping the one in use until they change again",
                self.what
            ),
        }
    }
}

fn stamps(paths: &[PathBuf]) -> Stamps {
    let mut stamps = [None; FILES_MAX];
    for (stamp, path) in stamps.iter_mut().zip(paths) {
        *stamp = stamp_of(path);
    }
    stamps
}

/// The certificate a listener serves or a client presents.
pub(super) type ReloadingCert = Followed<CertifiedKey>;

impl ReloadingCert {
    pub(super) fn certificate(
        cert_path: &Path,
        key_path: &Path,
        provider: Arc<CryptoProvider>,
    ) -> Result<Self, TlsError> {
        let (cert, key) = (cert_path.to_path_buf(), key_path.to_path_buf());
        let read = Box::new(move || load_pair(&cert, &key, &provider));
        Followed::load("TLS certificate", &[cert_path, key_path], read)
    }
}

impl ResolvesServerCert for ReloadingCert {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        self.get()
    }
}

impl ResolvesClientCert for ReloadingCert {
    fn resolve(&self, _root_hints: &[&[u8]], _schemes: &[rustls::SignatureScheme]) -> Option<Arc<CertifiedKey>> {
        self.get()
    }

    fn has_certs(&self) -> bool {
        true
    }
}

/// A handshake's signature checks, which do not depend on the CA: the
/// provider's algorithms, as rustls' own WebPKI verifiers use them.
macro_rules! signature_checks {
    () => {
        fn verify_tls12_signature(
            &self,
            message: &[u8],
            cert: &CertificateDer<'_>,
            dss: &DigitallySignedStruct,
        ) -> Result<HandshakeSignatureValid, rustls::Error> {
            rustls::crypto::verify_tls12_signature(message, cert, dss, &self.algorithms)
        }

        fn verify_tls13_signature(
            &self,
            message: &[u8],
            cert: &CertificateDer<'_>,
            dss: &DigitallySignedStruct,
        ) -> Result<HandshakeSignatureValid, rustls::Error> {
            rustls::crypto::verify_tls13_signature(message, cert, dss, &self.algorithms)
        }

        fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
            self.algorithms.supported_schemes()
        }
    };
}

/// A listener's check of client certificates against `tls_client_ca`.
/// A client without a certificate is let through to authorization, as
/// [`super::server_config`] says.
#[derive(Debug)]
pub(super) struct ReloadingClientCa {
    verifier: Followed<Arc<dyn ClientCertVerifier>>,
    algorithms: WebPkiSupportedAlgorithms,
}

impl ReloadingClientCa {
    pub(super) fn load(ca_path: &Path, provider: Arc<CryptoProvider>) -> Result<Self, TlsError> {
        let (ca, algorithms) = (ca_path.to_path_buf(), provider.signature_verification_algorithms);
        let read = Box::new(move || {
            let roots = Arc::new(roots(Some(&ca))?);
            let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(roots, Arc::clone(&provider))
                .allow_unauthenticated()
                .build()
                .map_err(|e| TlsError::Config(format!("client CA {}: {e}", ca.display())))?;
            Ok(verifier)
        });
        Ok(Self { verifier: Followed::load("client CA", &[ca_path], read)?, algorithms })
    }
}

impl ClientCertVerifier for ReloadingClientCa {
    fn client_auth_mandatory(&self) -> bool {
        false
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        // The subjects of a CA that may change under this borrow cannot
        // be lent out; the hint is optional.
        &[]
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        let verifier = self.verifier.get().ok_or_else(|| rustls::Error::General("client CA lock poisoned".into()))?;
        verifier.verify_client_cert(end_entity, intermediates, now)
    }

    signature_checks!();
}

/// A client's check of the node's (or etcd's) certificate against its
/// CA file.
#[derive(Debug)]
pub(super) struct ReloadingServerCa {
    verifier: Followed<Arc<rustls::client::WebPkiServerVerifier>>,
    algorithms: WebPkiSupportedAlgorithms,
}

impl ReloadingServerCa {
    pub(super) fn load(ca_path: &Path, provider: Arc<CryptoProvider>) -> Result<Self, TlsError> {
        let (ca, algorithms) = (ca_path.to_path_buf(), provider.signature_verification_algorithms);
        let read = Box::new(move || {
            let roots = Arc::new(roots(Some(&ca))?);
            rustls::client::WebPkiServerVerifier::builder_with_provider(roots, Arc::clone(&provider))
                .build()
                .map_err(|e| TlsError::Config(format!("CA file {}: {e}", ca.display())))
        });
        Ok(Self { verifier: Followed::load("CA file", &[ca_path], read)?, algorithms })
    }
}

impl ServerCertVerifier for ReloadingServerCa {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let verifier = self.verifier.get().ok_or_else(|| rustls::Error::General("CA lock poisoned".into()))?;
        verifier.verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now)
    }

    signature_checks!();
}

/// The pair in the files, its key checked against its certificate.
fn load_pair(cert_path: &Path, key_path: &Path, provider: &CryptoProvider) -> Result<CertifiedKey, TlsError> {
    let certs = load_certs("certificate file", cert_path)?;
    let key = load_key(key_path)?;
    CertifiedKey::from_der(certs, key, provider)
        .map_err(|e| TlsError::Config(format!("{} with {}: {e}", cert_path.display(), key_path.display())))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A certificate for localhost and its key, as PEM.
    fn pair() -> (String, String) {
        let certified = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).expect("certificate");
        (certified.cert.pem(), certified.key_pair.serialize_pem())
    }

    fn serving(cert: &ReloadingCert) -> Vec<u8> {
        cert.current.read().expect("lock").cert[0].to_vec()
    }

    /// Looks at the files now, as the first handshake after [`RECHECK`]
    /// would.
    fn look(cert: &ReloadingCert) {
        cert.watch.lock().expect("lock").next_check = Instant::now();
        cert.follow_files();
    }

    /// Writes `content` and dates it `second`, so that two writes within
    /// one tick of the file system's clock still differ as a rotation's
    /// (days apart) do.
    fn write(path: &Path, content: &str, second: u64) {
        std::fs::write(path, content).expect("write");
        let file = std::fs::File::options().write(true).open(path).expect("open");
        file.set_modified(std::time::UNIX_EPOCH + Duration::from_secs(second)).expect("set mtime");
    }

    fn der(pem: &str) -> Vec<u8> {
        use rustls::pki_types::pem::PemObject;
        rustls::pki_types::CertificateDer::from_pem_slice(pem.as_bytes()).expect("pem").to_vec()
    }

    #[test]
    fn a_rotated_pair_is_served_once_both_files_agree_and_a_broken_one_never() {
        let dir = std::env::temp_dir().join(format!("sluice-tls-reload-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let (cert_path, key_path) = (dir.join("tls.crt"), dir.join("tls.key"));
        let (first_cert, first_key) = pair();
        write(&cert_path, &first_cert, 1);
        write(&key_path, &first_key, 1);
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let cert = ReloadingCert::certificate(&cert_path, &key_path, provider).expect("load");
        assert_eq!(serving(&cert), der(&first_cert));

        cert.follow_files();
        assert_eq!(serving(&cert), der(&first_cert), "nothing changed");

        // A rotation written file by file: the certificate first, its key
        // not yet. The old pair stays.
        let (second_cert, second_key) = pair();
        write(&cert_path, &second_cert, 2);
        look(&cert);
        assert_eq!(serving(&cert), der(&first_cert), "a certificate without its key is not served");
        write(&key_path, &second_key, 2);
        look(&cert);
        assert_eq!(serving(&cert), der(&second_cert), "the new pair, once its key is there");

        // Replaced by a rename (a new inode), as a Secret volume does.
        let (third_cert, third_key) = pair();
        std::fs::write(dir.join("new.crt"), &third_cert).expect("write");
        std::fs::write(dir.join("new.key"), &third_key).expect("write");
        std::fs::rename(dir.join("new.key"), &key_path).expect("rename");
        std::fs::rename(dir.join("new.crt"), &cert_path).expect("rename");
        look(&cert);
        assert_eq!(serving(&cert), der(&third_cert));

        // A broken or missing file keeps the pair in use.
        write(&cert_path, "half a file", 4);
        look(&cert);
        assert_eq!(serving(&cert), der(&third_cert));
        std::fs::remove_file(&key_path).expect("remove");
        look(&cert);
        assert_eq!(serving(&cert), der(&third_cert));
        std::fs::remove_dir_all(&dir).expect("cleanup");
    }

    /// A CA (its PEM) and a certificate it signed for localhost, as DER.
    fn signed_by_a_new_ca(client: bool) -> (String, CertificateDer<'static>) {
        use rcgen::{BasicConstraints, CertificateParams, ExtendedKeyUsagePurpose, IsCa, KeyPair};
        let mut ca_params = CertificateParams::new(Vec::<String>::new()).expect("params");
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let ca_key = KeyPair::generate().expect("key");
        let ca = ca_params.self_signed(&ca_key).expect("CA");
        let mut leaf_params = CertificateParams::new(vec!["localhost".to_string()]).expect("params");
        leaf_params.extended_key_usages =
            vec![if client { ExtendedKeyUsagePurpose::ClientAuth } else { ExtendedKeyUsagePurpose::ServerAuth }];
        let leaf = leaf_params.signed_by(&KeyPair::generate().expect("key"), &ca, &ca_key).expect("leaf");
        (ca.pem(), leaf.der().clone())
    }

    /// A listener's client CA and a client's CA file are followed: after a
    /// bundle of the old and the new CA, both sign; after the new alone,
    /// only it does; a broken file keeps the CA in use.
    #[test]
    fn rotated_cas_are_trusted_as_their_files_say() {
        let dir = std::env::temp_dir().join(format!("sluice-tls-ca-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let provider = || Arc::new(rustls::crypto::ring::default_provider());
        let now = UnixTime::now();
        let localhost = ServerName::try_from("localhost").expect("name");

        let client_ca = dir.join("client-ca.pem");
        let (old_ca, old_client) = signed_by_a_new_ca(true);
        let (new_ca, new_client) = signed_by_a_new_ca(true);
        write(&client_ca, &old_ca, 1);
        let listener = ReloadingClientCa::load(&client_ca, provider()).expect("load");
        let admits = |cert: &CertificateDer<'_>| {
            listener.verifier.watch.lock().expect("lock").next_check = Instant::now();
            listener.verify_client_cert(cert, &[], now).is_ok()
        };
        assert!(admits(&old_client) && !admits(&new_client), "the old CA only");
        write(&client_ca, &format!("{old_ca}{new_ca}"), 2);
        assert!(admits(&old_client) && admits(&new_client), "the bundle: both");
        write(&client_ca, &new_ca, 3);
        assert!(!admits(&old_client) && admits(&new_client), "the new CA only");
        write(&client_ca, "half a file", 4);
        assert!(!admits(&old_client) && admits(&new_client), "a broken file keeps the CA in use");
        assert!(!listener.client_auth_mandatory(), "a client without a certificate goes on to authorization");

        let server_ca = dir.join("ca.pem");
        let (old_ca, old_server) = signed_by_a_new_ca(false);
        let (new_ca, new_server) = signed_by_a_new_ca(false);
        write(&server_ca, &old_ca, 1);
        let client = ReloadingServerCa::load(&server_ca, provider()).expect("load");
        let trusts = |cert: &CertificateDer<'_>| {
            client.verifier.watch.lock().expect("lock").next_check = Instant::now();
            client.verify_server_cert(cert, &[], &localhost, &[], now).is_ok()
        };
        assert!(trusts(&old_server) && !trusts(&new_server));
        write(&server_ca, &new_ca, 2);
        assert!(!trusts(&old_server) && trusts(&new_server));
        std::fs::remove_dir_all(&dir).expect("cleanup");
    }
}
