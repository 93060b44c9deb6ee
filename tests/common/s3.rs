//! A real S3-compatible server for the source-backed dataset tests: moto in
//! server mode (from PyPI; `scripts/test.sh` installs it), on loopback,
//! behind a proxy of the test's own that counts the requests reaching the
//! server and injects the faults a real store has (503 SlowDown, a reset
//! mid-body, a short body, a stalled response).

use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use object_store::aws::{AmazonS3, AmazonS3Builder};
use object_store::path::Path;
use object_store::{ObjectStoreExt, PutPayload};

/// What the proxy does to one object GET instead of passing it on.
#[derive(Clone, Copy, Debug)]
pub enum Fault {
    /// 503 SlowDown, as S3 answers when throttling.
    SlowDown,
    /// The headers and half the body, then a TCP reset.
    ResetMidBody,
    /// A whole response whose body (and Content-Length) is half of it.
    ShortBody,
    /// Nothing for this long, then the response: past the node's source
    /// timeout a stalled response, within it a slow store.
    Stall(Duration),
}

/// A moto server and the fault proxy in front of it, both gone on drop.
pub struct S3 {
    moto: Child,
    pub moto_port: u16,
    /// What the node is pointed at.
    pub proxy_port: u16,
    faults: Arc<Mutex<VecDeque<Fault>>>,
    /// Fault applied to every object GET while set (after the queue).
    every: Arc<Mutex<Option<Fault>>>,
    gets: Arc<AtomicU64>,
    requests: Arc<AtomicU64>,
}

impl S3 {
    /// Starts moto on a free loopback port; `None` (the test then says
    /// what is missing and skips) where moto is not installed, unless
    /// `SLUICE_S3_REQUIRE=1`, as in CI, where that fails the test.
    pub fn start() -> Option<Self> {
        let Some(binary) =
            super::program("SLUICE_MOTO_SERVER", Some(super::in_repo("target/s3env/bin/moto_server")), "moto_server")
        else {
            let why = "moto_server is not installed (pip install 'moto[server]', or set SLUICE_MOTO_SERVER)";
            assert!(std::env::var("SLUICE_S3_REQUIRE").as_deref() != Ok("1"), "{why}");
            eprintln!("skipped: {why}");
            return None;
        };
        // moto, a Python server, takes a second or more to bind its port.
        let (moto, port) = super::start_on_free_port(
            "moto",
            Duration::from_secs(60),
            |port, log| {
                Command::new(&binary)
                    .args(["-H", "127.0.0.1", "-p", &port.to_string()])
                    .stdout(Stdio::null())
                    .stderr(log)
                    .spawn()
                    .unwrap_or_else(|e| panic!("starting {}: {e}", binary.display()))
            },
            serves_s3,
        );
        let proxy = TcpListener::bind("127.0.0.1:0").expect("proxy");
        let proxy_port = proxy.local_addr().expect("proxy addr").port();
        let s3 = Self {
            moto,
            moto_port: port,
            proxy_port,
            faults: Arc::default(),
            every: Arc::default(),
            gets: Arc::default(),
            requests: Arc::default(),
        };
        let (faults, every, gets, requests) =
            (Arc::clone(&s3.faults), Arc::clone(&s3.every), Arc::clone(&s3.gets), Arc::clone(&s3.requests));
        std::thread::spawn(move || {
            for client in proxy.incoming().flatten() {
                let (faults, every, gets, requests) =
                    (Arc::clone(&faults), Arc::clone(&every), Arc::clone(&gets), Arc::clone(&requests));
                std::thread::spawn(move || {
                    let _ = proxy_one(client, port, &faults, &every, &gets, &requests);
                });
            }
        });
        Some(s3)
    }

    /// The environment that points a node (or any AWS client) at the proxy.
    pub fn env(&self) -> Vec<(String, String)> {
        [
            ("AWS_ENDPOINT_URL", format!("http://127.0.0.1:{}", self.proxy_port)),
            ("AWS_ALLOW_HTTP", "true".into()),
            ("AWS_ACCESS_KEY_ID", "testing".into()),
            ("AWS_SECRET_ACCESS_KEY", "testing".into()),
            ("AWS_REGION", "us-east-1".into()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect()
    }

    /// A client of the server itself, past the proxy: what the test uses
    /// to make and change objects.
    fn store(&self, bucket: &str) -> AmazonS3 {
        AmazonS3Builder::new()
            .with_endpoint(format!("http://127.0.0.1:{}", self.moto_port))
            .with_allow_http(true)
            .with_bucket_name(bucket)
            .with_region("us-east-1")
            .with_access_key_id("testing")
            .with_secret_access_key("testing")
            .build()
            .expect("store")
    }

    pub fn create_bucket(&self, bucket: &str) {
        ureq::put(&format!("http://127.0.0.1:{}/{bucket}", self.moto_port)).call().expect("create bucket");
    }

    /// Writes (or overwrites) an object.
    pub fn put(&self, bucket: &str, key: &str, bytes: &[u8]) {
        let store = self.store(bucket);
        let payload = PutPayload::from(bytes.to_vec());
        runtime().block_on(store.put(&Path::from(key), payload)).expect("put object");
    }

    /// Writes an object whose key is given percent-encoded, exactly as it
    /// goes in the request path (so a key may hold `#`, `?` or `%`),
    /// readable without credentials, as an `http://` source reads it.
    pub fn put_public(&self, bucket: &str, encoded_key: &str, bytes: &[u8]) {
        ureq::put(&format!("http://127.0.0.1:{}/{bucket}/{encoded_key}", self.moto_port))
            .set("x-amz-acl", "public-read")
            .send_bytes(bytes)
            .unwrap_or_else(|e| panic!("put {encoded_key}: {e}"));
    }

    pub fn delete(&self, bucket: &str, key: &str) {
        runtime().block_on(self.store(bucket).delete(&Path::from(key))).expect("delete object");
    }

    /// Faults for the next object GETs, one each, in order.
    pub fn inject(&self, faults: &[Fault]) {
        self.faults.lock().expect("faults").extend(faults.iter().copied());
    }

    /// A fault for every object GET from now on (`None` to stop).
    pub fn always(&self, fault: Option<Fault>) {
        *self.every.lock().expect("every") = fault;
    }

    /// Object GETs that reached the server.
    pub fn gets(&self) -> u64 {
        self.gets.load(Ordering::SeqCst)
    }

    /// Requests of any kind that reached the proxy.
    pub fn requests(&self) -> u64 {
        self.requests.load(Ordering::SeqCst)
    }
}

impl Drop for S3 {
    fn drop(&mut self) {
        let _ = self.moto.kill();
        let _ = self.moto.wait();
    }
}

/// Whether `port` answers `GET /` with S3's bucket listing, as moto does.
fn serves_s3(port: u16) -> bool {
    ureq::get(&format!("http://127.0.0.1:{port}/"))
        .timeout(Duration::from_secs(5))
        .call()
        .ok()
        .and_then(|r| r.into_string().ok())
        .is_some_and(|body| body.contains("ListAllMyBucketsResult"))
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime")
}

/// One request from the client: passed to moto on a connection of its own
/// (`Connection: close`), its response read whole, then (for an object
/// GET) changed as the next fault says; the client connection closes after.
fn proxy_one(
    client: TcpStream,
    moto_port: u16,
    faults: &Mutex<VecDeque<Fault>>,
    every: &Mutex<Option<Fault>>,
    gets: &AtomicU64,
    requests: &AtomicU64,
) -> std::io::Result<()> {
    let mut reader = BufReader::new(client.try_clone()?);
    let mut head = Vec::new();
    let mut content_length = 0usize;
    let mut request_line = String::new();
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line)? == 0 {
            return Ok(());
        }
        if request_line.is_empty() {
            request_line = line.clone();
        }
        let lower = line.to_ascii_lowercase();
        if let Some(value) = lower.strip_prefix("content-length:") {
            content_length = value.trim().parse().unwrap_or(0);
        }
        if lower.starts_with("connection:") {
            continue;
        }
        if line == "\r\n" {
            head.extend_from_slice(b"Connection: close\r\n\r\n");
            break;
        }
        head.extend_from_slice(line.as_bytes());
    }
    let mut body = vec![0u8; content_length];
    reader.read_exact(&mut body)?;
    requests.fetch_add(1, Ordering::SeqCst);
    let mut parts = request_line.split_whitespace();
    let (method, target) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    // An object GET: a key after the bucket, and no listing query.
    let object_get = method == "GET" && target.trim_start_matches('/').contains('/') && !target.contains("list-type");
    let fault = if object_get {
        gets.fetch_add(1, Ordering::SeqCst);
        let queued = faults.lock().ok().and_then(|mut f| f.pop_front());
        queued.or_else(|| every.lock().ok().and_then(|e| *e))
    } else {
        None
    };
    if let Some(Fault::SlowDown) = fault {
        let body = "<Error><Code>SlowDown</Code><Message>Please reduce your request rate.</Message></Error>";
        let mut client = client;
        write!(
            client,
            "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/xml\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        )?;
        return Ok(());
    }
    let mut upstream = TcpStream::connect(("127.0.0.1", moto_port))?;
    upstream.write_all(&head)?;
    upstream.write_all(&body)?;
    let mut response = Vec::new();
    upstream.read_to_end(&mut response)?;
    let split = response.windows(4).position(|w| w == b"\r\n\r\n").map_or(response.len(), |p| p + 4);
    let (headers, payload) = response.split_at(split);
    let mut client = client;
    match fault {
        Some(Fault::ResetMidBody) => {
            client.write_all(headers)?;
            client.write_all(&payload[..payload.len() / 2])?;
            client.flush()?;
            socket2::SockRef::from(&client).set_linger(Some(Duration::ZERO))?;
        }
        Some(Fault::ShortBody) => {
            let half = payload.len() / 2;
            let text = String::from_utf8_lossy(headers);
            let rewritten: String = text
                .split("\r\n")
                .map(|line| {
                    if line.to_ascii_lowercase().starts_with("content-length:") {
                        format!("Content-Length: {half}")
                    } else {
                        line.to_string()
                    }
                })
                .collect::<Vec<_>>()
                .join("\r\n");
            client.write_all(rewritten.as_bytes())?;
            client.write_all(&payload[..half])?;
        }
        Some(Fault::Stall(pause)) => {
            std::thread::sleep(pause);
            client.write_all(&response)?;
        }
        _ => client.write_all(&response)?,
    }
    Ok(())
}
