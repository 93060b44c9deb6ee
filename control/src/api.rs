//! The HTTP/JSON control API. `sluicectl` speaks only this. Every answer
//! that is not a success is `{"error": {"code": "...", "message": "..."}}`
//! with a stable code, the framework's own refusals (malformed JSON, a
//! wrong content type, an unknown route) included.
//!
//! Access is one table, [`ROUTES`]: each operation names who may call it,
//! one middleware layer enforces it for every request, and the OpenAPI
//! document's security requirements and refusal responses are generated
//! from the same table, so the document and the node cannot disagree. An
//! operation missing from the table is refused (fail closed), and a test
//! checks the table covers every documented operation.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{ConnectInfo, DefaultBodyLimit, FromRequest, FromRequestParts, MatchedPath, Request, State};
use axum::http::{header, request::Parts, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use futures_util::StreamExt;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::auth::{self, Caller, Refusal};
use crate::catalog::CatalogError;
use crate::ingest::{Appended, IngestFormat};
use crate::openapi::Contract;
use crate::plane::{ControlError, ControlPlane};
use crate::serve::PeerIdentity;
use sluice_proto::api::DatasetKind;

pub type Shared = Arc<ControlPlane>;

/// Who may call an operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    /// Anyone (node facts clients need before they hold a credential).
    Public,
    /// Operators only.
    Operator,
    /// Operators, and readers whose grant covers the `{name}` in the path.
    DatasetReader,
    /// Operators, and a scraper's metrics token.
    Metrics,
}

/// Every operation the API serves, and who may call it.
pub const ROUTES: &[(&str, &str, Access)] = &[
    ("GET", "/v1/node", Access::Public),
    ("GET", "/openapi.json", Access::Public),
    ("GET", "/metrics", Access::Metrics),
    ("GET", "/v1/devices", Access::Operator),
    ("GET", "/v1/orphans", Access::Operator),
    ("DELETE", "/v1/orphans", Access::Operator),
    ("GET", "/v1/cluster", Access::Operator),
    ("GET", "/v1/trace", Access::Operator),
    ("GET", "/v1/policy", Access::Operator),
    ("PUT", "/v1/policy", Access::Operator),
    ("DELETE", "/v1/policy", Access::Operator),
    ("GET", "/v1/datasets", Access::Operator),
    ("POST", "/v1/datasets", Access::Operator),
    ("GET", "/v1/datasets/{name}", Access::DatasetReader),
    ("DELETE", "/v1/datasets/{name}", Access::Operator),
    ("POST", "/v1/datasets/{name}/ingest", Access::Operator),
    ("POST", "/v1/datasets/{name}/seal", Access::Operator),
    ("POST", "/v1/datasets/{name}/scrub", Access::Operator),
    ("GET", "/v1/datasets/{name}/chunks", Access::DatasetReader),
    ("GET", "/v1/datasets/{name}/index", Access::DatasetReader),
    ("POST", "/v1/datasets/{name}/index", Access::Operator),
    ("GET", "/v1/grants", Access::Operator),
    ("POST", "/v1/grants", Access::Operator),
    ("DELETE", "/v1/grants/{id}", Access::Operator),
];

/// Who may call `method path` (`path` as routed, with `{name}`), if the
/// table knows it.
pub fn access_of(method: &str, path: &str) -> Option<Access> {
    ROUTES.iter().find(|(m, p, _)| *m == method && *p == path).map(|(_, _, access)| *access)
}

pub fn router(control: Shared) -> Router {
    Router::new()
        .route("/v1/node", get(node))
        .route("/metrics", get(metrics))
        .route("/openapi.json", get(openapi))
        .route("/v1/devices", get(devices))
        .route("/v1/orphans", get(orphans).delete(purge_orphans))
        .route("/v1/cluster", get(cluster))
        .route("/v1/trace", get(trace))
        .route(
            "/v1/policy",
            get(show_policy)
                .put(load_policy)
                .delete(unload_policy)
                .layer(DefaultBodyLimit::max(crate::plane::POLICY_OBJECT_BYTES_MAX)),
        )
        .route("/v1/datasets", get(list).post(create))
        .route("/v1/datasets/{name}", get(stat).delete(remove))
        .route("/v1/datasets/{name}/ingest", post(ingest).layer(DefaultBodyLimit::disable()))
        .route("/v1/datasets/{name}/seal", post(seal))
        .route("/v1/datasets/{name}/scrub", post(scrub))
        .route("/v1/datasets/{name}/chunks", get(chunks))
        .route("/v1/grants", get(list_grants).post(create_grant))
        .route("/v1/grants/{id}", axum::routing::delete(revoke_grant))
        .route(
            "/v1/datasets/{name}/index",
            get(record_index).post(stage_index).layer(DefaultBodyLimit::max(crate::plane::STAGED_INDEX_BYTES_MAX)),
        )
        .route_layer(axum::middleware::from_fn_with_state(Arc::clone(&control), authorize))
        .route_layer(axum::middleware::from_fn_with_state(Arc::new(Limits::new()), bounded))
        .fallback(no_route)
        .method_not_allowed_fallback(method_not_allowed)
        .with_state(control)
}

/// Requests the API serves at once; more are answered 503 `busy` at once.
pub const REQUESTS_IN_FLIGHT_MAX: usize = 256;
/// How long a request may take, but for the long operations
/// ([`UNTIMED`]), which report progress by finishing.
pub const REQUEST_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(60);
/// An upload that sends nothing for this long is cut off (and changes
/// nothing).
pub const UPLOAD_IDLE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);
/// Operations whose length is their work's (an upload, a seal or a scrub
/// reads every byte): bounded by the upload idle timeout, not a deadline.
const UNTIMED: &[(&str, &str)] = &[
    ("POST", "/v1/datasets/{name}/ingest"),
    ("POST", "/v1/datasets/{name}/seal"),
    ("POST", "/v1/datasets/{name}/scrub"),
];

/// The API's own bounds: requests in flight and how long each may take.
struct Limits {
    in_flight: Arc<tokio::sync::Semaphore>,
}

impl Limits {
    fn new() -> Self {
        Self { in_flight: Arc::new(tokio::sync::Semaphore::new(REQUESTS_IN_FLIGHT_MAX)) }
    }
}

async fn bounded(State(limits): State<Arc<Limits>>, request: Request, next: Next) -> Response {
    let Ok(_permit) = Arc::clone(&limits.in_flight).try_acquire_owned() else {
        return ApiError {
            status: StatusCode::SERVICE_UNAVAILABLE,
            code: "busy".into(),
            message: format!("the node serves {REQUESTS_IN_FLIGHT_MAX} API requests at once; try again"),
        }
        .into_response();
    };
    let path = request.extensions().get::<MatchedPath>().map(|p| p.as_str().to_string()).unwrap_or_default();
    let method = request.method().as_str().to_string();
    if UNTIMED.iter().any(|(m, p)| *m == method && *p == path) {
        return next.run(request).await;
    }
    match tokio::time::timeout(REQUEST_TIMEOUT, next.run(request)).await {
        Ok(response) => response,
        Err(_) => ApiError {
            status: StatusCode::SERVICE_UNAVAILABLE,
            code: "timeout".into(),
            message: format!("{method} {path} took longer than {REQUEST_TIMEOUT:?}"),
        }
        .into_response(),
    }
}

/// `GET /metrics` alone and open, for a scraper's own listen address
/// (`metrics_listen`): whoever reaches that address may read metrics.
pub fn metrics_router(control: Shared) -> Router {
    Router::new().route("/metrics", get(metrics)).fallback(no_route).with_state(control)
}

/// Authenticates the caller and checks the operation's access before any
/// extractor or handler runs: a refused request changes nothing and
/// costs no body read.
async fn authorize(State(control): State<Shared>, request: Request, next: Next) -> Response {
    let policy = control.access();
    let authorization = request.headers().get(header::AUTHORIZATION).map(|v| v.as_bytes().to_vec());
    let cert_name = request.extensions().get::<ConnectInfo<PeerIdentity>>().and_then(|p| p.0.cert_name.clone());
    let matched = request.extensions().get::<MatchedPath>().cloned();
    let caller = auth::authenticate(&policy, authorization.as_deref(), cert_name.as_deref(), |token| {
        control.grant_for_token(token)
    });
    let path = matched.as_ref().map_or("", MatchedPath::as_str);
    let decision = match access_of(request.method().as_str(), path) {
        Some(Access::Public) => Ok(()),
        Some(Access::Operator) => caller.require_operator(),
        Some(Access::Metrics) => caller.require_scraper(),
        Some(Access::DatasetReader) => {
            // `/v1/datasets/{name}...`: the name as sent. A name written
            // with escapes matches no grant's name, so it is refused.
            let name = request.uri().path().split('/').nth(3).unwrap_or_default();
            caller.require_reader_of(name)
        }
        None => Err(Refusal {
            status: 403,
            code: "forbidden",
            message: format!("{} {path} has no access rule; refused", request.method()),
        }),
    };
    if let Err(refusal) = decision {
        if caller != Caller::Anonymous {
            tracing::info!(method = %request.method(), path, code = refusal.code, "control API refused a call");
        }
        drain_refused_body(request).await;
        return ApiError::from(refusal).into_response();
    }
    next.run(request).await
}

/// How much of a refused request's body is read, and for how long, so a
/// client still sending reaches the refusal instead of a broken pipe.
const REFUSED_BODY_DRAIN_BYTES_MAX: usize = 1 << 20;
const REFUSED_BODY_DRAIN_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(1);

async fn drain_refused_body(request: Request) {
    let mut stream = request.into_body().into_data_stream();
    let drain = async {
        let mut drained = 0usize;
        while let Some(Ok(piece)) = stream.next().await {
            drained += piece.len();
            if drained > REFUSED_BODY_DRAIN_BYTES_MAX {
                break;
            }
        }
    };
    let _ = tokio::time::timeout(REFUSED_BODY_DRAIN_TIMEOUT, drain).await;
}

#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ApiErrorBody {
    pub error: ApiErrorDetail,
}

#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ApiErrorDetail {
    /// Stable, for programs: `unauthenticated`, `forbidden`,
    /// `unknown_dataset`, `bad_request`, ...
    pub code: String,
    /// For people.
    pub message: String,
}

pub struct ApiError {
    status: StatusCode,
    code: String,
    message: String,
}

impl From<ControlError> for ApiError {
    fn from(err: ControlError) -> Self {
        let status = match &err {
            ControlError::Catalog(CatalogError::Unknown(_)) => StatusCode::NOT_FOUND,
            ControlError::Catalog(CatalogError::Exists(_)) | ControlError::Busy(_) => StatusCode::CONFLICT,
            ControlError::State { .. } | ControlError::Empty(_) => StatusCode::CONFLICT,
            ControlError::Catalog(CatalogError::BadName(_)) | ControlError::Ingest(_) | ControlError::Records(_) => {
                StatusCode::BAD_REQUEST
            }
            ControlError::Catalog(CatalogError::Full) => StatusCode::INSUFFICIENT_STORAGE,
            ControlError::Catalog(CatalogError::GrantsFull) => StatusCode::INSUFFICIENT_STORAGE,
            ControlError::BadGrant(_) => StatusCode::BAD_REQUEST,
            ControlError::UnknownGrant(_) => StatusCode::NOT_FOUND,
            ControlError::Steering(_) => StatusCode::CONFLICT,
            ControlError::BadPolicy(_) => StatusCode::BAD_REQUEST,
            ControlError::PolicyLoadOff => StatusCode::FORBIDDEN,
            ControlError::Elsewhere { .. } => StatusCode::MISDIRECTED_REQUEST,
            ControlError::Cluster(_) => StatusCode::CONFLICT,
            _ => StatusCode::INTERNAL_SERVER_ERROR,
        };
        Self { status, code: err.code().to_string(), message: err.to_string() }
    }
}

impl From<Refusal> for ApiError {
    fn from(refusal: Refusal) -> Self {
        Self {
            status: StatusCode::from_u16(refusal.status).unwrap_or(StatusCode::FORBIDDEN),
            code: refusal.code.to_string(),
            message: refusal.message,
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let unauthenticated = self.status == StatusCode::UNAUTHORIZED;
        let body = ApiErrorBody { error: ApiErrorDetail { code: self.code, message: self.message } };
        let mut response = (self.status, Json(body)).into_response();
        if unauthenticated {
            response.headers_mut().insert(header::WWW_AUTHENTICATE, header::HeaderValue::from_static("Bearer"));
        }
        response
    }
}

fn bad_request(message: impl Into<String>) -> ApiError {
    ApiError { status: StatusCode::BAD_REQUEST, code: "bad_request".into(), message: message.into() }
}

fn internal(message: impl Into<String>) -> ApiError {
    ApiError { status: StatusCode::INTERNAL_SERVER_ERROR, code: "internal".into(), message: message.into() }
}

/// A framework refusal (body, path or query that does not parse) as the
/// API's JSON error, keeping the framework's status.
fn rejected(status: StatusCode, message: String) -> ApiError {
    let code = match status {
        StatusCode::PAYLOAD_TOO_LARGE => "too_large",
        StatusCode::UNSUPPORTED_MEDIA_TYPE => "unsupported_media_type",
        StatusCode::UNPROCESSABLE_ENTITY => "invalid_body",
        _ => "bad_request",
    };
    ApiError { status, code: code.into(), message }
}

async fn no_route(method: Method, uri: axum::http::Uri) -> ApiError {
    ApiError { status: StatusCode::NOT_FOUND, code: "no_route".into(), message: format!("no operation {method} {uri}") }
}

async fn method_not_allowed(method: Method, uri: axum::http::Uri) -> ApiError {
    ApiError {
        status: StatusCode::METHOD_NOT_ALLOWED,
        code: "method_not_allowed".into(),
        message: format!("{} does not take {method}", uri.path()),
    }
}

/// `Json` whose refusals are the API's JSON errors.
pub struct ApiJson<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for ApiJson<T> {
    type Rejection = ApiError;

    async fn from_request(request: Request, state: &S) -> Result<Self, Self::Rejection> {
        match Json::<T>::from_request(request, state).await {
            Ok(Json(value)) => Ok(Self(value)),
            Err(rejection) => Err(rejected(rejection.status(), rejection.body_text())),
        }
    }
}

/// `Path` whose refusals are the API's JSON errors.
pub struct ApiPath<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned + Send> FromRequestParts<S> for ApiPath<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        match axum::extract::Path::<T>::from_request_parts(parts, state).await {
            Ok(axum::extract::Path(value)) => Ok(Self(value)),
            Err(rejection) => Err(rejected(StatusCode::BAD_REQUEST, rejection.body_text())),
        }
    }
}

/// `Query` whose refusals are the API's JSON errors.
pub struct ApiQuery<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequestParts<S> for ApiQuery<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        match axum::extract::Query::<T>::from_request_parts(parts, state).await {
            Ok(axum::extract::Query(value)) => Ok(Self(value)),
            Err(rejection) => Err(rejected(StatusCode::BAD_REQUEST, rejection.body_text())),
        }
    }
}

/// A whole body under the route's limit, refusals as JSON errors.
pub struct ApiBytes(pub axum::body::Bytes);

impl<S: Send + Sync> FromRequest<S> for ApiBytes {
    type Rejection = ApiError;

    async fn from_request(request: Request, state: &S) -> Result<Self, Self::Rejection> {
        match axum::body::Bytes::from_request(request, state).await {
            Ok(bytes) => Ok(Self(bytes)),
            Err(rejection) => Err(rejected(rejection.status(), rejection.body_text())),
        }
    }
}

/// The API's OpenAPI document, generated from the handlers below; the
/// security requirements and refusals come from [`ROUTES`].
#[derive(utoipa::OpenApi)]
#[openapi(
    info(
        title = "sluice control API",
        description = "Datasets, grants and operations of one sluice node. Errors are {\"error\": {\"code\", \"message\"}} with a stable code. Operators authenticate with a bearer operator token or a client certificate (mTLS); training hosts with the bearer token of a grant."
    ),
    modifiers(&Contract),
    components(schemas(crate::ingest::IngestFormat)),
    paths(
        node,
        openapi,
        metrics,
        devices,
        orphans,
        purge_orphans,
        cluster,
        trace,
        show_policy,
        load_policy,
        unload_policy,
        list,
        create,
        stat,
        remove,
        ingest,
        seal,
        scrub,
        chunks,
        record_index,
        stage_index,
        list_grants,
        create_grant,
        revoke_grant
    )
)]
pub struct ApiDoc;

/// This document.
#[utoipa::path(get, path = "/openapi.json", tag = "operations", responses((status = 200, description = "The OpenAPI 3.1 document of this API", body = Object)))]
async fn openapi() -> impl IntoResponse {
    use utoipa::OpenApi as _;
    Json(ApiDoc::openapi())
}

#[utoipa::path(get, path = "/metrics", tag = "operations", responses((status = 200, description = "Prometheus text exposition (0.0.4)", content_type = "text/plain")))]
async fn metrics(State(control): State<Shared>) -> Result<impl IntoResponse, ApiError> {
    let text =
        tokio::task::spawn_blocking(move || control.metrics_text()).await.map_err(|e| internal(e.to_string()))?;
    Ok(([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], text))
}

#[utoipa::path(get, path = "/v1/devices", tag = "operations", responses((status = 200, body = Vec<crate::plane::DeviceReport>)))]
async fn devices(State(control): State<Shared>) -> Result<impl IntoResponse, ApiError> {
    let devices = tokio::task::spawn_blocking(move || control.devices()).await.map_err(|e| internal(e.to_string()))?;
    Ok(Json(devices))
}

#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct OrphanFile {
    pub path: String,
    pub bytes: u64,
}

#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Purged {
    pub files: u64,
    pub bytes: u64,
}

/// Files no record owns, quarantined in `DATA_DIR/orphans/` (never deleted
/// without an operator's word).
#[utoipa::path(get, path = "/v1/orphans", tag = "operations", responses((status = 200, body = Vec<OrphanFile>)))]
async fn orphans(State(control): State<Shared>) -> Result<impl IntoResponse, ApiError> {
    let files = tokio::task::spawn_blocking(move || control.orphans()).await.map_err(|e| internal(e.to_string()))?;
    Ok(Json(files.into_iter().map(|(path, bytes)| OrphanFile { path, bytes }).collect::<Vec<_>>()))
}

/// Deletes every quarantined file.
#[utoipa::path(delete, path = "/v1/orphans", tag = "operations", responses((status = 200, body = Purged)))]
async fn purge_orphans(State(control): State<Shared>) -> Result<impl IntoResponse, ApiError> {
    let (files, bytes) =
        tokio::task::spawn_blocking(move || control.purge_orphans()).await.map_err(|e| internal(e.to_string()))??;
    Ok(Json(Purged { files, bytes }))
}

#[utoipa::path(get, path = "/v1/cluster", tag = "operations", responses((status = 200, body = crate::plane::ClusterStatus), (status = 409, body = ApiErrorBody)))]
async fn cluster(State(control): State<Shared>) -> Result<Json<crate::plane::ClusterStatus>, ApiError> {
    let status = tokio::task::spawn_blocking(move || control.cluster_status())
        .await
        .map_err(|e| ApiError::from(ControlError::Cluster(e.to_string())))??;
    Ok(Json(status))
}

#[utoipa::path(get, path = "/v1/node", tag = "operations", responses((status = 200, description = "The node: name, version, data-plane address, driver, grants_required, data_tls", body = Object)))]
async fn node(State(control): State<Shared>) -> impl IntoResponse {
    Json(control.info())
}

#[utoipa::path(get, path = "/v1/datasets", tag = "datasets", responses((status = 200, body = Vec<crate::catalog::DatasetRecord>)))]
async fn list(State(control): State<Shared>) -> Result<impl IntoResponse, ApiError> {
    Ok(Json(control.list()?))
}

#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateRequest {
    /// Letters, digits, `.`, `_` and `-`, not starting with `.`.
    #[schema(pattern = "^[A-Za-z0-9_-][A-Za-z0-9._-]*$", min_length = 1, max_length = 128)]
    pub name: String,
    #[schema(value_type = DatasetKind)]
    pub kind: String,
    /// Fixed record size for `records` datasets without an index.
    #[serde(default)]
    #[schema(minimum = 1)]
    pub record_size: Option<u64>,
    /// Bytes the dataset will hold: placement takes only a namespace that
    /// holds them (the smallest such), else a file.
    #[serde(default)]
    pub size_bytes: Option<u64>,
}

#[utoipa::path(post, path = "/v1/datasets", tag = "datasets", request_body = CreateRequest, responses((status = 201, body = crate::catalog::DatasetRecord), (status = 409, body = ApiErrorBody), (status = 507, body = ApiErrorBody)))]
async fn create(
    State(control): State<Shared>,
    ApiJson(request): ApiJson<CreateRequest>,
) -> Result<impl IntoResponse, ApiError> {
    let kind: DatasetKind = request.kind.parse().map_err(bad_request)?;
    let created = tokio::task::spawn_blocking(move || {
        control.create_with(&request.name, kind, request.record_size, request.size_bytes)
    })
    .await
    .map_err(|e| internal(e.to_string()))??;
    Ok((StatusCode::CREATED, Json(created)))
}

#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct GrantRequest {
    #[schema(pattern = "^[A-Za-z0-9_-][A-Za-z0-9._-]*$", min_length = 1, max_length = 128)]
    pub dataset: String,
    /// Who the grant is for: a job, host or service identity (printable
    /// ASCII, no spaces).
    #[schema(pattern = "^[!-~]+$", min_length = 1, max_length = 128)]
    pub client: String,
    /// Bind the grant to the client certificate with this CN: its token
    /// then opens only from a TLS connection that presents it.
    #[serde(default)]
    #[schema(pattern = "^[!-~]+$", min_length = 1, max_length = 128)]
    pub cert_name: Option<String>,
}

/// Issues a grant; the response is the only place its token appears.
#[utoipa::path(post, path = "/v1/grants", tag = "grants", request_body = GrantRequest, responses((status = 201, description = "The grant, with its token (shown only here)", body = crate::grants::GrantView), (status = 404, body = ApiErrorBody), (status = 409, body = ApiErrorBody), (status = 507, body = ApiErrorBody)))]
async fn create_grant(
    State(control): State<Shared>,
    ApiJson(request): ApiJson<GrantRequest>,
) -> Result<impl IntoResponse, ApiError> {
    let grant = tokio::task::spawn_blocking(move || {
        control.issue_grant(&request.dataset, &request.client, request.cert_name.as_deref())
    })
    .await
    .map_err(|e| internal(e.to_string()))??;
    Ok((StatusCode::CREATED, Json(grant)))
}

#[utoipa::path(get, path = "/v1/grants", tag = "grants", responses((status = 200, body = Vec<crate::grants::GrantView>)))]
async fn list_grants(State(control): State<Shared>) -> impl IntoResponse {
    Json(control.list_grants())
}

#[utoipa::path(delete, path = "/v1/grants/{id}", tag = "grants", params(("id" = u64, Path, description = "grant id")), responses((status = 204, description = "Revoked; sessions under it are closed"), (status = 404, body = ApiErrorBody)))]
async fn revoke_grant(State(control): State<Shared>, ApiPath(id): ApiPath<u64>) -> Result<impl IntoResponse, ApiError> {
    tokio::task::spawn_blocking(move || control.revoke_grant(id)).await.map_err(|e| internal(e.to_string()))??;
    Ok(StatusCode::NO_CONTENT)
}

#[utoipa::path(get, path = "/v1/datasets/{name}", tag = "datasets", params(("name" = String, Path)), responses((status = 200, body = crate::catalog::DatasetRecord), (status = 404, body = ApiErrorBody)))]
async fn stat(State(control): State<Shared>, ApiPath(name): ApiPath<String>) -> Result<impl IntoResponse, ApiError> {
    Ok(Json(control.get(&name)?))
}

#[utoipa::path(delete, path = "/v1/datasets/{name}", tag = "datasets", params(("name" = String, Path)), responses((status = 204, description = "Deleted; its namespace released and its grants revoked"), (status = 404, body = ApiErrorBody), (status = 409, body = ApiErrorBody)))]
async fn remove(State(control): State<Shared>, ApiPath(name): ApiPath<String>) -> Result<impl IntoResponse, ApiError> {
    control.delete(&name).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// How much of a refused upload is read before answering.
const REFUSED_UPLOAD_DRAIN_BYTES_MAX: usize = 64 << 20;

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
struct IngestQuery {
    /// How the body is read: `raw` bytes, or a `.npy` array.
    format: Option<IngestFormat>,
}

/// Appends the request body (one file) to the dataset. Committed only when
/// the whole body arrived and checked out; a cut-off upload changes nothing.
#[utoipa::path(post, path = "/v1/datasets/{name}/ingest", tag = "datasets", params(("name" = String, Path), IngestQuery), request_body(content = Vec<u8>, description = "One file", content_type = "application/octet-stream"), responses((status = 200, body = crate::ingest::Appended), (status = 404, body = ApiErrorBody), (status = 409, body = ApiErrorBody)))]
async fn ingest(
    State(control): State<Shared>,
    ApiPath(name): ApiPath<String>,
    ApiQuery(query): ApiQuery<IngestQuery>,
    body: Body,
) -> Result<Json<Appended>, ApiError> {
    let mut stream = body.into_data_stream();
    let mut session = match control.begin_ingest(&name, query.format.unwrap_or(IngestFormat::Raw)) {
        Ok(session) => session,
        Err(err) => {
            // Read (and drop) a bounded part of the upload so the client
            // reaches the point of reading this error instead of failing
            // its send on a closed connection.
            let mut drained = 0usize;
            while let Some(Ok(piece)) = stream.next().await {
                drained += piece.len();
                if drained > REFUSED_UPLOAD_DRAIN_BYTES_MAX {
                    break;
                }
            }
            return Err(err.into());
        }
    };
    loop {
        let next = tokio::time::timeout(UPLOAD_IDLE_TIMEOUT, stream.next())
            .await
            .map_err(|_| bad_request(format!("upload stalled: nothing for {UPLOAD_IDLE_TIMEOUT:?}")))?;
        let Some(piece) = next else { break };
        let piece = piece.map_err(|e| bad_request(format!("upload cut off: {e}")))?;
        session.push(&piece)?;
    }
    Ok(Json(session.finish()?))
}

#[utoipa::path(post, path = "/v1/datasets/{name}/seal", tag = "datasets", params(("name" = String, Path)), responses((status = 200, body = crate::catalog::DatasetRecord), (status = 404, body = ApiErrorBody), (status = 409, body = ApiErrorBody)))]
async fn seal(State(control): State<Shared>, ApiPath(name): ApiPath<String>) -> Result<impl IntoResponse, ApiError> {
    let record =
        tokio::task::spawn_blocking(move || control.seal(&name)).await.map_err(|e| internal(e.to_string()))??;
    Ok(Json(record))
}

/// The manifest's chunk checksums as little-endian u32s.
#[utoipa::path(get, path = "/v1/datasets/{name}/chunks", tag = "datasets", params(("name" = String, Path)), responses((status = 200, description = "CRC32C per 64 KiB chunk, little-endian u32", content_type = "application/octet-stream"), (status = 404, body = ApiErrorBody)))]
async fn chunks(State(control): State<Shared>, ApiPath(name): ApiPath<String>) -> Result<impl IntoResponse, ApiError> {
    let crcs = control.chunk_crcs(&name)?;
    let bytes: Vec<u8> = crcs.iter().flat_map(|c| c.to_le_bytes()).collect();
    Ok(([(header::CONTENT_TYPE, "application/octet-stream")], bytes))
}

/// The sample index of a `records` or `wds` dataset: `(offset, len)` pairs
/// of little-endian u64s.
#[utoipa::path(get, path = "/v1/datasets/{name}/index", tag = "datasets", params(("name" = String, Path)), responses((status = 200, description = "(offset, len) little-endian u64 pairs per sample", content_type = "application/octet-stream"), (status = 404, body = ApiErrorBody)))]
async fn record_index(
    State(control): State<Shared>,
    ApiPath(name): ApiPath<String>,
) -> Result<impl IntoResponse, ApiError> {
    // Streamed a piece at a time from the index file: an index of a
    // billion records is never built in memory.
    let source = Arc::new(control.record_index_source(&name)?);
    let total = source.entries();
    let pieces = futures_util::stream::unfold(0u64, move |at| {
        let source = Arc::clone(&source);
        async move {
            if at >= total {
                return None;
            }
            let count = (total - at).min(crate::plane::INDEX_PIECE_ENTRIES);
            let piece = tokio::task::spawn_blocking(move || source.read(at, count))
                .await
                .unwrap_or_else(|e| Err(std::io::Error::other(e.to_string())));
            Some((piece.map(axum::body::Bytes::from), at + count))
        }
    });
    let length = total * crate::index::ENTRY_BYTES;
    Ok((
        [(header::CONTENT_TYPE, "application/octet-stream".to_string()), (header::CONTENT_LENGTH, length.to_string())],
        Body::from_stream(pieces),
    ))
}

#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Staged {
    pub records: u64,
}

/// Holds the offsets of the next `records` file ingested into the dataset.
#[utoipa::path(post, path = "/v1/datasets/{name}/index", tag = "datasets", params(("name" = String, Path), IngestQuery), request_body(content = Vec<u8>, description = "n + 1 little-endian u64 offsets of the next records file", content_type = "application/octet-stream"), responses((status = 200, body = Staged), (status = 404, body = ApiErrorBody), (status = 409, body = ApiErrorBody), (status = 413, body = ApiErrorBody)))]
async fn stage_index(
    State(control): State<Shared>,
    ApiPath(name): ApiPath<String>,
    ApiQuery(query): ApiQuery<IngestQuery>,
    ApiBytes(body): ApiBytes,
) -> Result<Json<Staged>, ApiError> {
    let records = control.stage_offsets(&name, &body, query.format.unwrap_or(IngestFormat::Raw))?;
    Ok(Json(Staged { records }))
}

/// The lane-steering policy attached now, or why there is none.
#[utoipa::path(get, path = "/v1/policy", tag = "operations", responses((status = 200, description = "policy, decision counts and swaps", body = Object)))]
async fn show_policy(State(control): State<Shared>) -> impl IntoResponse {
    Json(control.policy())
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
struct PolicyQuery {
    /// A name to show for it (the file name).
    #[param(max_length = 128)]
    name: Option<String>,
}

/// Swaps the lane-steering policy at run time: the body is a BPF object
/// with a uprobe `lane_policy` and the maps of `sluice_steer.h`. Only on a
/// node started with `policy_load = true`; the object is checked (program
/// type, maps, helpers, allowlist) before anything reaches the kernel.
#[utoipa::path(put, path = "/v1/policy", tag = "operations", params(PolicyQuery), request_body(content = Vec<u8>, content_type = "application/octet-stream"), responses((status = 200, body = Object), (status = 409, body = ApiErrorBody), (status = 413, body = ApiErrorBody)))]
async fn load_policy(
    State(control): State<Shared>,
    ApiQuery(query): ApiQuery<PolicyQuery>,
    ApiBytes(body): ApiBytes,
) -> Result<impl IntoResponse, ApiError> {
    let name = query.name.unwrap_or_else(|| "unnamed".into());
    let loaded = tokio::task::spawn_blocking(move || control.load_policy(&name, &body))
        .await
        .map_err(|e| internal(format!("policy load task: {e}")))??;
    Ok(Json(loaded))
}

/// Detaches the policy: the batch-size threshold decides lanes again.
#[utoipa::path(delete, path = "/v1/policy", tag = "operations", responses((status = 200, body = Object), (status = 409, body = ApiErrorBody)))]
async fn unload_policy(State(control): State<Shared>) -> Result<impl IntoResponse, ApiError> {
    Ok(Json(control.unload_policy()?))
}

/// Verifies every chunk of a sealed dataset as read through the data plane.
#[utoipa::path(post, path = "/v1/datasets/{name}/scrub", tag = "datasets", params(("name" = String, Path)), responses((status = 200, body = crate::plane::ScrubReport), (status = 404, body = ApiErrorBody), (status = 409, body = ApiErrorBody), (status = 421, description = "No complete copy on this node (elsewhere): the message names the nodes that hold one", body = ApiErrorBody)))]
async fn scrub(State(control): State<Shared>, ApiPath(name): ApiPath<String>) -> Result<impl IntoResponse, ApiError> {
    Ok(Json(control.scrub(&name).await?))
}

/// Live small-read traffic from the eBPF probes (`sluicectl top`).
#[utoipa::path(get, path = "/v1/trace", tag = "operations", responses((status = 200, description = "eBPF trace snapshot, or why there is none", body = Object)))]
async fn trace(State(control): State<Shared>) -> impl IntoResponse {
    Json(control.trace_snapshot())
}
