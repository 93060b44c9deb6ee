//! Where source-backed datasets come from: object stores (S3 and
//! S3-compatible services, GCS, Azure), HTTP servers and local files, all
//! through Apache Arrow's `object_store` (signing, credentials, listing).
//!
//! Credentials and endpoints are the ecosystem's: the standard `AWS_*`
//! (`AWS_ENDPOINT_URL`, `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`,
//! `AWS_REGION`, `AWS_ALLOW_HTTP`), `GOOGLE_*` and `AZURE_*` variables of
//! the node's environment.
//!
//! At create a dataset's URLs are listed and every object pinned by size,
//! ETag and version ([`Sources::pin`]); every later fetch
//! ([`Sources::fetch`]) asks for that version only (`If-Match`) and checks
//! what came back, so a changed object fails its ranges and never serves
//! new bytes beside old ones. Fetches are retried here, with backoff, for
//! the failures that pass (a 5xx or SlowDown, a reset connection, a timed
//! out or stalled response, a body shorter than asked), not for those that
//! do not (a changed or vanished object, a refusal of credentials).

pub mod allow;
pub mod cache;
pub mod evict;
pub mod read;
mod store_error;

use std::collections::HashMap;
use std::ops::Range;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use futures_util::TryStreamExt;
use object_store::path::Path;
use object_store::{GetOptions, GetRange, ObjectStore, ObjectStoreExt, RetryConfig};
use sluice_proto::api::SourceObject;
use url::Url;

/// How fetches from sources behave; the node's config sets them.
#[derive(Clone, Debug)]
pub struct SourceOptions {
    /// One request, body included, may take this long; a stalled response
    /// is cut off then and retried.
    pub request_timeout: Duration,
    /// Attempts after the first before a fetch fails as unavailable.
    pub retries: u32,
    /// The wait before the first retry; doubled for each next one.
    pub retry_backoff: Duration,
    /// Ranged GETs in flight at once, node-wide.
    pub fetches_in_flight_max: usize,
    /// Bytes of source-backed chunks the node keeps at most (0: no
    /// budget); fills past it evict the coldest.
    pub cache_bytes_max: u64,
    /// What the node fetches from ([`allow`]).
    pub allowed: allow::SourceAllowList,
}

impl Default for SourceOptions {
    fn default() -> Self {
        Self {
            request_timeout: Duration::from_secs(30),
            retries: 4,
            retry_backoff: Duration::from_millis(100),
            fetches_in_flight_max: 16,
            cache_bytes_max: 0,
            allowed: allow::SourceAllowList::default(),
        }
    }
}

/// Objects a dataset may pin, at most: its manifest lives in the catalog.
pub const OBJECTS_PER_DATASET_MAX: usize = 100_000;

#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    #[error("source URL {url:?}: {why}")]
    BadUrl { url: String, why: String },
    #[error("listing {url}: {why}")]
    List { url: String, why: String },
    #[error("{url} holds no objects")]
    Empty { url: String },
    #[error("more than {OBJECTS_PER_DATASET_MAX} objects under the source URLs")]
    TooMany,
    #[error("{url}: {}", not_allowed(allowed))]
    NotAllowed { url: String, allowed: String },
}

fn not_allowed(allowed: &str) -> String {
    format!(
        "this node fetches only from {allowed} (its source_allow); an operator lists the bucket, host or directory \
         in the node's config"
    )
}

impl SourceError {
    /// What went wrong, for a message that names the URL already.
    fn reason(&self) -> String {
        match self {
            Self::BadUrl { why, .. } => why.clone(),
            Self::NotAllowed { allowed, .. } => not_allowed(allowed),
            other => other.to_string(),
        }
    }
}

/// Why a fetch gave no bytes.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum FetchError {
    /// The object changed or vanished since it was pinned.
    #[error("{url} changed since the dataset was created: {why}")]
    Changed { url: String, why: String },
    /// Every attempt failed, or none could be made (`attempts` 0).
    #[error("{url}: {why}{}", attempts_said(*attempts))]
    Unavailable { url: String, why: String, attempts: u32 },
}

fn attempts_said(attempts: u32) -> String {
    match attempts {
        0 => String::new(),
        1 => " (after 1 attempt)".to_string(),
        n => format!(" (after {n} attempts)"),
    }
}

/// The node's handles on its sources, one store per bucket or host,
/// made on first use and kept.
pub struct Sources {
    options: SourceOptions,
    stores: Mutex<HashMap<String, Arc<dyn ObjectStore>>>,
    /// Bounds the ranged GETs in flight, node-wide.
    pub(crate) fetches: Arc<tokio::sync::Semaphore>,
    /// Of those, what background fills (prefetch hints) may hold: a
    /// quarter.
    pub(crate) background_fetches: Arc<tokio::sync::Semaphore>,
    /// What source-backed chunks may take on the node.
    pub(crate) budget: Arc<evict::CacheBudget>,
}

impl std::fmt::Debug for Sources {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sources").field("options", &self.options).finish()
    }
}

impl Sources {
    pub fn new(options: SourceOptions) -> Self {
        let fetches = Arc::new(tokio::sync::Semaphore::new(options.fetches_in_flight_max.max(1)));
        let background_fetches = Arc::new(tokio::sync::Semaphore::new((options.fetches_in_flight_max / 4).max(1)));
        let budget = Arc::new(evict::CacheBudget::new(options.cache_bytes_max));
        Self { options, stores: Mutex::new(HashMap::new()), fetches, background_fetches, budget }
    }

    pub fn budget(&self) -> &Arc<evict::CacheBudget> {
        &self.budget
    }

    /// The store `url` lives in and the path inside it. Stores are kept
    /// per origin (scheme, user, host and port), so two servers on one
    /// host, or two Azure containers of one account, are two stores.
    fn locate(&self, url: &str) -> Result<(Arc<dyn ObjectStore>, Path), SourceError> {
        let bad = |why: String| SourceError::BadUrl { url: url.to_string(), why };
        let parsed = parse_source_url(url)?;
        if !self.options.allowed.permits(&parsed) {
            return Err(SourceError::NotAllowed { url: url.to_string(), allowed: self.options.allowed.describe() });
        }
        let path = Path::from_url_path(parsed.path().trim_end_matches('/')).map_err(|e| bad(e.to_string()))?;
        let origin = &parsed[..url::Position::BeforePath];
        let mut stores = self.stores.lock().map_err(|_| bad("the store table is poisoned".into()))?;
        if let Some(store) = stores.get(origin) {
            return Ok((Arc::clone(store), path));
        }
        let store = self.build(&parsed).map_err(bad)?;
        stores.insert(origin.to_string(), Arc::clone(&store));
        Ok((store, path))
    }

    fn build(&self, url: &Url) -> Result<Arc<dyn ObjectStore>, String> {
        use object_store::ClientConfigKey;
        // The retries are this module's, so that a short body or a reset
        // mid-body is retried like a 503.
        let retry = RetryConfig { max_retries: 0, ..RetryConfig::default() };
        let timeout = format!("{}ms", self.options.request_timeout.as_millis());
        let err = |e: object_store::Error| store_error::describe(&e);
        let store: Arc<dyn ObjectStore> = match url.scheme() {
            "s3" | "s3a" => {
                use object_store::aws::{AmazonS3Builder, AmazonS3ConfigKey};
                Arc::new(
                    AmazonS3Builder::from_env()
                        .with_url(url.as_str())
                        .with_retry(retry)
                        .with_config(AmazonS3ConfigKey::Client(ClientConfigKey::Timeout), timeout)
                        .build()
                        .map_err(err)?,
                )
            }
            "gs" => {
                use object_store::gcp::{GoogleCloudStorageBuilder, GoogleConfigKey};
                Arc::new(
                    GoogleCloudStorageBuilder::from_env()
                        .with_url(url.as_str())
                        .with_retry(retry)
                        .with_config(GoogleConfigKey::Client(ClientConfigKey::Timeout), timeout)
                        .build()
                        .map_err(err)?,
                )
            }
            "az" | "azure" | "abfs" | "abfss" => {
                use object_store::azure::{AzureConfigKey, MicrosoftAzureBuilder};
                Arc::new(
                    MicrosoftAzureBuilder::from_env()
                        .with_url(url.as_str())
                        .with_retry(retry)
                        .with_config(AzureConfigKey::Client(ClientConfigKey::Timeout), timeout)
                        .build()
                        .map_err(|e| format!("{}{AZURE_ACCOUNT_HINT}", store_error::describe(&e)))?,
                )
            }
            "http" | "https" => {
                let origin = &url[..url::Position::BeforePath];
                let client = object_store::ClientOptions::new()
                    .with_allow_http(url.scheme() == "http")
                    .with_timeout(self.options.request_timeout);
                Arc::new(
                    object_store::http::HttpBuilder::new()
                        .with_url(origin)
                        .with_retry(retry)
                        .with_client_options(client)
                        .build()
                        .map_err(err)?,
                )
            }
            "file" => Arc::new(object_store::local::LocalFileSystem::new()),
            other => return Err(unknown_scheme(other)),
        };
        Ok(store)
    }

    /// Lists `urls` (a URL ending in `/` is every object under it, in key
    /// order) and pins each object: size, ETag, version. Data bytes are the
    /// whole object until the caller says otherwise (`.npy` headers).
    ///
    /// Under a prefix, objects of no bytes are passed over: they hold no
    /// data, and they are what consoles and tools write as "folders"
    /// (`prefix/sub/`), which would otherwise stand in the dataset as
    /// objects of their own. Named one by one, every object is kept.
    pub async fn pin(&self, urls: &[String]) -> Result<Vec<SourceObject>, SourceError> {
        let mut objects = Vec::new();
        for url in urls {
            let (store, path) = self.locate(url)?;
            let list_err = |e: object_store::Error| {
                let hint = credentials_hint(url, |name| std::env::var_os(name).is_some());
                let why = format!("{}{}", store_error::describe(&e), hint.unwrap_or_default());
                SourceError::List { url: url.clone(), why }
            };
            let mut metas = if url.ends_with('/') {
                let prefix = (!path.as_ref().is_empty()).then_some(&path);
                let mut metas: Vec<_> = store
                    .list(prefix)
                    .try_filter(|meta| std::future::ready(meta.size > 0))
                    .try_collect()
                    .await
                    .map_err(list_err)?;
                metas.sort_by(|a, b| a.location.cmp(&b.location));
                metas
            } else {
                match store.head(&path).await {
                    Ok(meta) => vec![meta],
                    Err(err @ object_store::Error::NotFound { .. }) => {
                        return Err(not_an_object(&*store, &path, url, err).await);
                    }
                    Err(err) => return Err(list_err(err)),
                }
            };
            if metas.is_empty() {
                return Err(SourceError::Empty { url: url.clone() });
            }
            let base = parse_source_url(url)?;
            for meta in metas.drain(..) {
                if objects.len() == OBJECTS_PER_DATASET_MAX {
                    return Err(SourceError::TooMany);
                }
                objects.push(SourceObject {
                    url: object_url(&base, &meta.location),
                    size_bytes: meta.size,
                    e_tag: meta.e_tag,
                    version: meta.version,
                    data_offset_bytes: 0,
                    data_bytes: meta.size,
                });
            }
        }
        Ok(objects)
    }

    /// Bytes `range` of `object` as pinned, retried with backoff.
    pub async fn fetch(&self, object: &SourceObject, range: Range<u64>) -> Result<Bytes, FetchError> {
        assert!(range.start < range.end && range.end <= object.size_bytes, "fetch past the object");
        let unavailable = |why: String, attempts| FetchError::Unavailable { url: object.url.clone(), why, attempts };
        let (store, path) = self.locate(&object.url).map_err(|e| unavailable(e.reason(), 0))?;
        let mut backoff = self.options.retry_backoff;
        let mut attempt = 0;
        loop {
            attempt += 1;
            match fetch_once(&*store, &path, object, range.clone()).await {
                Ok(bytes) => return Ok(bytes),
                Err(Attempt::Final(err)) => return Err(err),
                Err(Attempt::Passing(why)) if attempt > self.options.retries => {
                    return Err(unavailable(why, attempt));
                }
                Err(Attempt::Passing(why)) => {
                    tracing::warn!(url = object.url, attempt, why, "source fetch failed; retrying");
                    tokio::time::sleep(backoff).await;
                    backoff = backoff.saturating_mul(2);
                }
            }
        }
    }
}

/// How one attempt failed.
enum Attempt {
    /// Worth another attempt.
    Passing(String),
    /// Not.
    Final(FetchError),
}

async fn fetch_once(
    store: &dyn ObjectStore,
    path: &Path,
    object: &SourceObject,
    range: Range<u64>,
) -> Result<Bytes, Attempt> {
    let changed = |why: String| Attempt::Final(FetchError::Changed { url: object.url.clone(), why });
    let options = GetOptions {
        if_match: object.e_tag.clone(),
        version: object.version.clone(),
        range: Some(GetRange::Bounded(range.clone())),
        ..GetOptions::default()
    };
    let result = match store.get_opts(path, options).await {
        Ok(result) => result,
        Err(err) => return Err(classify(err, &object.url, changed)),
    };
    // A store that ignores If-Match still says which version it sent.
    if let (Some(pinned), Some(got)) = (&object.e_tag, &result.meta.e_tag) {
        if !same_etag(pinned, got) {
            return Err(changed(format!("ETag {got}, pinned {pinned}")));
        }
    }
    if result.meta.size != object.size_bytes {
        return Err(changed(format!("{} bytes, pinned {}", result.meta.size, object.size_bytes)));
    }
    let bytes = result.bytes().await.map_err(|e| classify(e, &object.url, changed))?;
    let asked = range.end - range.start;
    if bytes.len() as u64 != asked {
        return Err(Attempt::Passing(format!("a body of {} bytes for {asked} asked", bytes.len())));
    }
    Ok(bytes)
}

/// Whether a response's ETag names the version pinned: the same tag,
/// quoted or not. Stores differ in what their listings say, where the
/// pinned tag comes from: S3's and GCS's are quoted as HTTP writes them,
/// Azure's are bare (`0x8DC…`) though the `ETag` headers of its responses
/// are quoted, and `object_store`'s local files have bare tags throughout.
/// (The pinned tag goes into `If-Match` as its store gave it, which that
/// store matches.)
fn same_etag(pinned: &str, got: &str) -> bool {
    fn unquoted(tag: &str) -> &str {
        tag.strip_prefix('"').and_then(|t| t.strip_suffix('"')).unwrap_or(tag)
    }
    unquoted(pinned) == unquoted(got)
}

fn classify(err: object_store::Error, url: &str, changed: impl Fn(String) -> Attempt) -> Attempt {
    use object_store::Error as E;
    match err {
        E::NotFound { .. } => changed("it is gone".into()),
        E::Precondition { .. } | E::NotModified { .. } => changed("its ETag no longer matches".into()),
        E::PermissionDenied { .. } | E::Unauthenticated { .. } => {
            let why = store_error::describe(&err);
            Attempt::Final(FetchError::Unavailable { url: url.to_string(), why, attempts: 1 })
        }
        other => Attempt::Passing(store_error::describe(&other)),
    }
}

/// The schemes [`Sources::build`] makes a store for.
const SCHEMES: [&str; 10] = ["s3", "s3a", "gs", "az", "azure", "abfs", "abfss", "http", "https", "file"];

fn unknown_scheme(scheme: &str) -> String {
    format!("scheme {scheme}: expected s3, gs, az, http, https or file")
}

/// `url` parsed as a source: an object or a prefix, with nothing after
/// its path. A `?` or `#` in a key is written `%3F` or `%23`; a query
/// string (a presigned URL's signature, say) is refused rather than
/// dropped, since `object_store` asks by path alone.
fn parse_source_url(url: &str) -> Result<Url, SourceError> {
    let bad = |why: String| SourceError::BadUrl { url: url.to_string(), why };
    let parsed = Url::parse(url).map_err(|e| bad(e.to_string()))?;
    if !SCHEMES.contains(&parsed.scheme()) {
        return Err(bad(unknown_scheme(parsed.scheme())));
    }
    if parsed.password().is_some() {
        return Err(bad(
            "a password in a source URL would be kept in the catalog and shown by dataset stat: give the node \
             credentials in its environment"
                .into(),
        ));
    }
    if parsed.query().is_some() || parsed.fragment().is_some() {
        return Err(bad(
            "a source URL names an object or a prefix and nothing more: no query string (presigned URLs are not \
             taken; give the node credentials instead) and no fragment (write a '?' or '#' in a key as %3F or %23)"
                .into(),
        ));
    }
    Ok(parsed)
}

/// The URL of the object at `location` in the store `base` names: each
/// segment of the key percent-encoded, so that [`Sources::locate`] finds
/// the same key again whatever it holds (`#`, `?`, `%`, spaces).
fn object_url(base: &Url, location: &Path) -> String {
    let mut url = base.clone();
    match url.path_segments_mut() {
        Ok(mut segments) => {
            segments.clear().extend(location.parts());
        }
        // A URL with no host (`s3:x`) parses but names no store.
        Err(()) => return format!("{}/{location}", &base[..url::Position::BeforePath]),
    }
    url.into()
}

/// What to do where no Azure store could be made: nearly always no
/// account was named, and `object_store`'s words for that name no
/// variable.
const AZURE_ACCOUNT_HINT: &str = "; give the node its storage account in AZURE_STORAGE_ACCOUNT_NAME (with \
     AZURE_STORAGE_ACCOUNT_KEY, AZURE_STORAGE_SAS_TOKEN, a service principal's AZURE_CLIENT_ID, \
     AZURE_CLIENT_SECRET and AZURE_TENANT_ID, a workload identity or a managed identity), or in the URL \
     (abfss://CONTAINER@ACCOUNT.dfs.core.windows.net/...); AZURE_STORAGE_USE_EMULATOR=true for Azurite";

/// What to do where an S3 request failed and the node's environment names
/// an AWS profile but no credentials `object_store` reads: it reads no
/// profile and no `~/.aws` file, so such a node asks the instance
/// metadata service and fails there with words about a token.
fn credentials_hint(url: &str, set: impl Fn(&str) -> bool) -> Option<&'static str> {
    let s3 = url.starts_with("s3://") || url.starts_with("s3a://");
    let read = ["AWS_ACCESS_KEY_ID", "AWS_WEB_IDENTITY_TOKEN_FILE", "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI"];
    let credentials = read.iter().any(|name| set(name)) || set("AWS_CONTAINER_CREDENTIALS_FULL_URI");
    (s3 && set("AWS_PROFILE") && !credentials).then_some(
        "; AWS_PROFILE is set, but no profile or ~/.aws file is read: give the node AWS_ACCESS_KEY_ID and \
         AWS_SECRET_ACCESS_KEY (`aws configure export-credentials --format env` prints a profile's), a web \
         identity (AWS_WEB_IDENTITY_TOKEN_FILE and AWS_ROLE_ARN) or an instance role",
    )
}

/// Why `url`, which names no object, failed: where objects lie under it
/// as a prefix, the error says to end it with `/`; where listing fails
/// too, it says why, since a HEAD's 404 has no body to tell a missing
/// object from a missing bucket.
async fn not_an_object(store: &dyn ObjectStore, path: &Path, url: &str, err: object_store::Error) -> SourceError {
    let err = store_error::describe(&err);
    let why = match store.list(Some(path)).try_next().await {
        Ok(Some(_)) => {
            format!("no object is named so, but objects lie under it: end the URL with '/' to take every one ({err})")
        }
        Ok(None) => err,
        Err(listing) => format!("{err}; listing under it: {}", store_error::describe(&listing)),
    };
    SourceError::List { url: url.to_string(), why }
}

#[cfg(test)]
mod tests;
