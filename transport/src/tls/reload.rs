//! A certificate that follows its files, so a rotated certificate is
//! served without a restart: a listener's (the control API, the data
//! port) and a client's identity for mTLS (the node's etcd client, a
//! training job's certificate-bound grant).
//!
//! Certificates are short-lived where they are managed: cert-manager
//! renews at two thirds of a 90-day life and rewrites the Secret's files
//! in place (a symlink swap in the pod's volume), and etcd and the
//! Kubernetes components pick the new pair up as they run. A node that
//! read its pair once at start would serve the old one until it expired,
//! and every client would then fail at once.
//!
//! So the certificate is resolved at each handshake: at most
//! once every [`RECHECK`] one handshake looks at the two files (device,
//! inode, length, mtime, following links). If either changed, the pair is
//! read again and, if the key matches the certificate, served from then
//! on. A pair that does not load (a key written after its certificate, a
//! file half copied) is logged and the pair in use is kept; the next
//! change to either file is tried again. The client CA is read at start
//! only.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use rustls::client::ResolvesClientCert;
use rustls::crypto::CryptoProvider;
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;

use super::{load_certs, load_key, TlsError};

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

/// The certificate and key files' stamps as last looked at.
type PairStamp = (Option<FileStamp>, Option<FileStamp>);

struct Watch {
    next_check: Instant,
    seen: PairStamp,
}

/// The certificate a listener serves or a client presents, read again
/// when its files change.
pub(super) struct ReloadingCert {
    cert_path: PathBuf,
    key_path: PathBuf,
    provider: Arc<CryptoProvider>,
    current: RwLock<Arc<CertifiedKey>>,
    watch: Mutex<Watch>,
}

impl std::fmt::Debug for ReloadingCert {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReloadingCert").field("cert", &self.cert_path).field("key", &self.key_path).finish()
    }
}

impl ReloadingCert {
    /// Reads the pair now: a pair that does not load is an error at
    /// start, where the operator sees it.
    pub(super) fn load(cert_path: &Path, key_path: &Path, provider: Arc<CryptoProvider>) -> Result<Self, TlsError> {
        let seen = (stamp_of(cert_path), stamp_of(key_path));
        let current = load_pair(cert_path, key_path, &provider)?;
        Ok(Self {
            cert_path: cert_path.to_path_buf(),
            key_path: key_path.to_path_buf(),
            provider,
            current: RwLock::new(Arc::new(current)),
            watch: Mutex::new(Watch { next_check: Instant::now() + RECHECK, seen }),
        })
    }

    /// Takes up the files' new pair if they changed since the last look,
    /// at most once every [`RECHECK`]; a handshake that finds another
    /// looking goes on with the pair in use.
    fn follow_files(&self) {
        let Ok(mut watch) = self.watch.try_lock() else { return };
        let now = Instant::now();
        if now < watch.next_check {
            return;
        }
        watch.next_check = now + RECHECK;
        // Stamped before reading: a change during the read is seen at the
        // next look and read again.
        let stamp = (stamp_of(&self.cert_path), stamp_of(&self.key_path));
        if stamp == watch.seen {
            return;
        }
        watch.seen = stamp;
        match load_pair(&self.cert_path, &self.key_path, &self.provider) {
            Ok(pair) => {
                if let Ok(mut current) = self.current.write() {
                    *current = Arc::new(pair);
                }
                tracing::info!(cert = %self.cert_path.display(), "TLS certificate changed on disk: using the new one");
            }
            Err(err) => tracing::warn!(
                cert = %self.cert_path.display(),
                "TLS certificate files changed but do not load ({err}); keeping the certificate in use until they change again"
            ),
        }
    }
}

impl ReloadingCert {
    fn pair(&self) -> Option<Arc<CertifiedKey>> {
        self.follow_files();
        self.current.read().ok().map(|pair| Arc::clone(&pair))
    }
}

impl ResolvesServerCert for ReloadingCert {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        self.pair()
    }
}

impl ResolvesClientCert for ReloadingCert {
    fn resolve(&self, _root_hints: &[&[u8]], _schemes: &[rustls::SignatureScheme]) -> Option<Arc<CertifiedKey>> {
        self.pair()
    }

    fn has_certs(&self) -> bool {
        true
    }
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
        let cert = ReloadingCert::load(&cert_path, &key_path, provider).expect("load");
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
}
