//! A real Azure Blob Storage-compatible server for the source-backed
//! dataset tests: Azurite, Microsoft's own emulator (from the npm
//! registry; `scripts/test.sh` installs it), on loopback, with its
//! well-known development account. The node reaches it as any Azure
//! client reaches the emulator (`AZURE_STORAGE_USE_EMULATOR`,
//! `AZURITE_BLOB_STORAGE_URL`); the test makes and changes blobs with
//! `object_store`'s own Azure client.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, SystemTime};

use base64::Engine as _;
use object_store::azure::{MicrosoftAzure, MicrosoftAzureBuilder};
use object_store::path::Path;
use object_store::{ObjectStoreExt, PutPayload};

/// The emulator's development account, the same in every Azurite.
const ACCOUNT: &str = "devstoreaccount1";
const ACCOUNT_KEY: &str = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==";
/// The REST API version the container requests name.
const API_VERSION: &str = "2021-08-06";

/// An Azurite blob server, gone on drop with everything it held (it keeps
/// its blobs in memory).
pub struct Azurite {
    child: Child,
    pub port: u16,
}

impl Azurite {
    /// Starts Azurite on a free loopback port; `None` (the test then says
    /// what is missing and skips) where it is not installed, unless
    /// `SLUICE_AZURE_REQUIRE=1`, as in CI, where that fails the test.
    pub fn start() -> Option<Self> {
        // The suite's own install, or SLUICE_AZURITE, or the PATH.
        let installed = super::in_repo("target/azurite/node_modules/.bin/azurite-blob");
        let Some(binary) = super::program("SLUICE_AZURITE", Some(installed), "azurite-blob") else {
            let why = "azurite-blob is not installed (npm install azurite, or set SLUICE_AZURITE)";
            assert!(std::env::var("SLUICE_AZURE_REQUIRE").as_deref() != Ok("1"), "{why}");
            eprintln!("skipped: {why}");
            return None;
        };
        let (child, port) = super::start_on_free_port(
            "azurite",
            Duration::from_secs(60),
            |port, log| {
                Command::new(&binary)
                    .args(["--blobHost", "127.0.0.1", "--blobPort", &port.to_string()])
                    .args(["--inMemoryPersistence", "--silent", "--disableTelemetry", "--skipApiVersionCheck"])
                    .stdout(Stdio::null())
                    .stderr(log)
                    .spawn()
                    .unwrap_or_else(|e| panic!("starting {}: {e}", binary.display()))
            },
            serves_blobs,
        );
        Some(Self { child, port })
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}/{ACCOUNT}", self.port)
    }

    /// Makes a container. `object_store` makes none, so this is the one
    /// request the test signs itself (Shared Key, with the account's key).
    fn create_container(&self, container: &str) {
        let date = httpdate::fmt_http_date(SystemTime::now());
        // Shared Key's string to sign for a PUT with no body and no
        // standard headers: the verb, eleven empty header lines, the
        // `x-ms-` headers in order, then the resource with its query.
        let string_to_sign = format!(
            "PUT{}\nx-ms-date:{date}\nx-ms-version:{API_VERSION}\n/{ACCOUNT}/{ACCOUNT}/{container}\nrestype:container",
            "\n".repeat(11)
        );
        let key = base64::engine::general_purpose::STANDARD.decode(ACCOUNT_KEY).expect("the emulator's key");
        let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, &key);
        let signature = ring::hmac::sign(&key, string_to_sign.as_bytes());
        let signature = base64::engine::general_purpose::STANDARD.encode(signature.as_ref());
        ureq::put(&format!("{}/{container}?restype=container", self.url()))
            .set("x-ms-date", &date)
            .set("x-ms-version", API_VERSION)
            .set("Authorization", &format!("SharedKey {ACCOUNT}:{signature}"))
            .send_bytes(&[])
            .unwrap_or_else(|e| panic!("creating container {container}: {e}"));
    }

    /// A client of the emulator. Not `with_use_emulator`, which reads
    /// the emulator's address from this process's environment, shared by
    /// tests that each run an Azurite of their own: the account's address,
    /// name and key are given, as for any account.
    fn store(&self, container: &str) -> MicrosoftAzure {
        MicrosoftAzureBuilder::new()
            .with_endpoint(self.url())
            .with_allow_http(true)
            .with_account(ACCOUNT)
            .with_access_key(ACCOUNT_KEY)
            .with_container_name(container)
            .build()
            .expect("store")
    }
}

impl super::stores::StoreServer for Azurite {
    fn scheme(&self) -> &'static str {
        "az"
    }

    /// What points a node (or any Azure client) at the emulator.
    fn env(&self) -> Vec<(String, String)> {
        vec![
            ("AZURE_STORAGE_USE_EMULATOR".to_string(), "true".to_string()),
            ("AZURITE_BLOB_STORAGE_URL".to_string(), format!("http://127.0.0.1:{}", self.port)),
        ]
    }

    fn create_bucket(&self, container: &str) {
        self.create_container(container);
    }

    fn put(&self, container: &str, name: &str, bytes: &[u8]) {
        let payload = PutPayload::from(bytes.to_vec());
        runtime().block_on(self.store(container).put(&Path::from(name), payload)).expect("put blob");
    }

    fn delete(&self, container: &str, name: &str) {
        runtime().block_on(self.store(container).delete(&Path::from(name))).expect("delete blob");
    }
}

impl Drop for Azurite {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Whether `port` answers as Azurite's blob service: any answer (an
/// unsigned listing is refused) that names it as its server.
fn serves_blobs(port: u16) -> bool {
    let answer =
        match ureq::get(&format!("http://127.0.0.1:{port}/{ACCOUNT}?comp=list")).timeout(Duration::from_secs(5)).call()
        {
            Ok(response) | Err(ureq::Error::Status(_, response)) => response,
            Err(_) => return false,
        };
    answer.header("server").is_some_and(|server| server.contains("Azurite-Blob"))
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime")
}
