//! The HTTP/JSON control API. `sluicectl` speaks only this. Errors are
//! `{"error": {"code": "...", "message": "..."}}` with a stable code.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{DefaultBodyLimit, Path, Query, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use futures_util::StreamExt;
use serde::{Deserialize, Serialize};

use crate::catalog::CatalogError;
use crate::ingest::{Appended, IngestFormat};
use crate::kind::DatasetKind;
use crate::node::{ControlError, ControlPlane};

pub type Shared = Arc<ControlPlane>;

pub fn router(control: Shared) -> Router {
    Router::new()
        .route("/v1/node", get(node))
        .route("/metrics", get(metrics))
        .route("/openapi.json", get(openapi))
        .route("/v1/devices", get(devices))
        .route("/v1/cluster", get(cluster))
        .route("/v1/trace", get(trace))
        .route(
            "/v1/policy",
            get(show_policy)
                .put(load_policy)
                .delete(unload_policy)
                .layer(DefaultBodyLimit::max(crate::node::POLICY_OBJECT_BYTES_MAX)),
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
            get(record_index).post(stage_index).layer(DefaultBodyLimit::max(crate::node::STAGED_INDEX_BYTES_MAX)),
        )
        .with_state(control)
}

#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ApiErrorBody {
    pub error: ApiErrorDetail,
}

#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ApiErrorDetail {
    pub code: String,
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
            ControlError::Elsewhere { .. } => StatusCode::MISDIRECTED_REQUEST,
            ControlError::Cluster(_) => StatusCode::CONFLICT,
            _ => StatusCode::INTERNAL_SERVER_ERROR,
        };
        Self { status, code: err.code().to_string(), message: err.to_string() }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = ApiErrorBody { error: ApiErrorDetail { code: self.code, message: self.message } };
        (self.status, Json(body)).into_response()
    }
}

fn bad_request(message: impl Into<String>) -> ApiError {
    ApiError { status: StatusCode::BAD_REQUEST, code: "bad_request".into(), message: message.into() }
}

/// The API's OpenAPI document, generated from the handlers below.
#[derive(utoipa::OpenApi)]
#[openapi(
    info(
        title = "sluice control API",
        description = "Datasets, grants and operations of one sluice node. Errors are {\"error\": {\"code\", \"message\"}} with a stable code."
    ),
    paths(
        node,
        metrics,
        devices,
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

async fn openapi() -> impl IntoResponse {
    use utoipa::OpenApi as _;
    Json(ApiDoc::openapi())
}

#[utoipa::path(get, path = "/metrics", tag = "operations", responses((status = 200, description = "Prometheus text exposition (0.0.4)", content_type = "text/plain")))]
async fn metrics(State(control): State<Shared>) -> impl IntoResponse {
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], control.metrics_text())
}

#[utoipa::path(get, path = "/v1/devices", tag = "operations", responses((status = 200, body = Vec<crate::node::DeviceReport>)))]
async fn devices(State(control): State<Shared>) -> impl IntoResponse {
    Json(control.devices())
}

#[utoipa::path(get, path = "/v1/cluster", tag = "operations", responses((status = 200, body = crate::node::ClusterStatus), (status = 500, body = ApiErrorBody)))]
async fn cluster(State(control): State<Shared>) -> Result<Json<crate::node::ClusterStatus>, ApiError> {
    let status = tokio::task::spawn_blocking(move || control.cluster_status())
        .await
        .map_err(|e| ApiError::from(ControlError::Cluster(e.to_string())))??;
    Ok(Json(status))
}

#[utoipa::path(get, path = "/v1/node", tag = "operations", responses((status = 200, description = "The node: name, version, data-plane address, driver, grants_required", body = Object)))]
async fn node(State(control): State<Shared>) -> impl IntoResponse {
    Json(control.info())
}

#[utoipa::path(get, path = "/v1/datasets", tag = "datasets", responses((status = 200, body = Vec<crate::catalog::DatasetRecord>)))]
async fn list(State(control): State<Shared>) -> Result<impl IntoResponse, ApiError> {
    Ok(Json(control.list()?))
}

#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct CreateRequest {
    pub name: String,
    pub kind: String,
    /// Fixed record size for `records` datasets without an index.
    #[serde(default)]
    pub record_size: Option<u64>,
    /// Bytes the dataset will hold: placement takes only a namespace that
    /// holds them (the smallest such), else a file.
    #[serde(default)]
    pub size_bytes: Option<u64>,
}

#[utoipa::path(post, path = "/v1/datasets", tag = "datasets", request_body = CreateRequest, responses((status = 201, body = crate::catalog::DatasetRecord), (status = 400, body = ApiErrorBody), (status = 409, body = ApiErrorBody)))]
async fn create(
    State(control): State<Shared>,
    Json(request): Json<CreateRequest>,
) -> Result<impl IntoResponse, ApiError> {
    let kind: DatasetKind = request.kind.parse().map_err(bad_request)?;
    Ok((StatusCode::CREATED, Json(control.create_with(&request.name, kind, request.record_size, request.size_bytes)?)))
}

#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct GrantRequest {
    pub dataset: String,
    /// Who the grant is for: a job, host or service identity.
    pub client: String,
}

/// Issues a grant; the response is the only place its token appears.
#[utoipa::path(post, path = "/v1/grants", tag = "grants", request_body = GrantRequest, responses((status = 201, description = "The grant, with its token (shown only here)", body = crate::grants::GrantView), (status = 400, body = ApiErrorBody), (status = 404, body = ApiErrorBody)))]
async fn create_grant(
    State(control): State<Shared>,
    Json(request): Json<GrantRequest>,
) -> Result<impl IntoResponse, ApiError> {
    Ok((StatusCode::CREATED, Json(control.issue_grant(&request.dataset, &request.client)?)))
}

#[utoipa::path(get, path = "/v1/grants", tag = "grants", responses((status = 200, body = Vec<crate::grants::GrantView>)))]
async fn list_grants(State(control): State<Shared>) -> impl IntoResponse {
    Json(control.list_grants())
}

#[utoipa::path(delete, path = "/v1/grants/{id}", tag = "grants", params(("id" = u64, Path, description = "grant id")), responses((status = 204, description = "Revoked; sessions under it are closed"), (status = 404, body = ApiErrorBody)))]
async fn revoke_grant(State(control): State<Shared>, Path(id): Path<u64>) -> Result<impl IntoResponse, ApiError> {
    control.revoke_grant(id)?;
    Ok(StatusCode::NO_CONTENT)
}

#[utoipa::path(get, path = "/v1/datasets/{name}", tag = "datasets", params(("name" = String, Path)), responses((status = 200, body = crate::catalog::DatasetRecord), (status = 404, body = ApiErrorBody)))]
async fn stat(State(control): State<Shared>, Path(name): Path<String>) -> Result<impl IntoResponse, ApiError> {
    Ok(Json(control.get(&name)?))
}

#[utoipa::path(delete, path = "/v1/datasets/{name}", tag = "datasets", params(("name" = String, Path)), responses((status = 204, description = "Deleted; its namespace released and its grants revoked"), (status = 404, body = ApiErrorBody)))]
async fn remove(State(control): State<Shared>, Path(name): Path<String>) -> Result<impl IntoResponse, ApiError> {
    control.delete(&name).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// How much of a refused upload is read before answering.
const REFUSED_UPLOAD_DRAIN_BYTES_MAX: usize = 64 << 20;

#[derive(Debug, Deserialize)]
struct IngestQuery {
    format: Option<IngestFormat>,
}

/// Appends the request body (one file) to the dataset. Committed only when
/// the whole body arrived and checked out; a cut-off upload changes nothing.
#[utoipa::path(post, path = "/v1/datasets/{name}/ingest", tag = "datasets", params(("name" = String, Path), ("format" = Option<crate::ingest::IngestFormat>, Query)), request_body(content = Vec<u8>, description = "One file", content_type = "application/octet-stream"), responses((status = 200, body = crate::ingest::Appended), (status = 400, body = ApiErrorBody), (status = 409, body = ApiErrorBody)))]
async fn ingest(
    State(control): State<Shared>,
    Path(name): Path<String>,
    Query(query): Query<IngestQuery>,
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
    while let Some(piece) = stream.next().await {
        let piece = piece.map_err(|e| bad_request(format!("upload cut off: {e}")))?;
        session.push(&piece)?;
    }
    Ok(Json(session.finish()?))
}

#[utoipa::path(post, path = "/v1/datasets/{name}/seal", tag = "datasets", params(("name" = String, Path)), responses((status = 200, body = crate::catalog::DatasetRecord), (status = 409, body = ApiErrorBody)))]
async fn seal(State(control): State<Shared>, Path(name): Path<String>) -> Result<impl IntoResponse, ApiError> {
    let sealing = Arc::clone(&control);
    let record = tokio::task::spawn_blocking(move || sealing.seal(&name)).await.map_err(|e| ApiError {
        status: StatusCode::INTERNAL_SERVER_ERROR,
        code: "internal".into(),
        message: e.to_string(),
    })??;
    Ok(Json(record))
}

/// The manifest's chunk checksums as little-endian u32s.
#[utoipa::path(get, path = "/v1/datasets/{name}/chunks", tag = "datasets", params(("name" = String, Path)), responses((status = 200, description = "CRC32C per 64 KiB chunk, little-endian u32", content_type = "application/octet-stream"), (status = 404, body = ApiErrorBody)))]
async fn chunks(State(control): State<Shared>, Path(name): Path<String>) -> Result<impl IntoResponse, ApiError> {
    let crcs = control.chunk_crcs(&name)?;
    let bytes: Vec<u8> = crcs.iter().flat_map(|c| c.to_le_bytes()).collect();
    Ok(([(header::CONTENT_TYPE, "application/octet-stream")], bytes))
}

/// The sample index of a `records` or `wds` dataset: `(offset, len)` pairs
/// of little-endian u64s.
#[utoipa::path(get, path = "/v1/datasets/{name}/index", tag = "datasets", params(("name" = String, Path)), responses((status = 200, description = "(offset, len) little-endian u64 pairs per sample", content_type = "application/octet-stream"), (status = 400, body = ApiErrorBody)))]
async fn record_index(State(control): State<Shared>, Path(name): Path<String>) -> Result<impl IntoResponse, ApiError> {
    let bytes = control.record_index_raw(&name)?;
    Ok(([(header::CONTENT_TYPE, "application/octet-stream")], bytes))
}

#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Staged {
    pub records: u64,
}

/// Holds the offsets of the next `records` file ingested into the dataset.
#[utoipa::path(post, path = "/v1/datasets/{name}/index", tag = "datasets", params(("name" = String, Path), ("format" = Option<crate::ingest::IngestFormat>, Query)), request_body(content = Vec<u8>, description = "n + 1 little-endian u64 offsets of the next records file", content_type = "application/octet-stream"), responses((status = 200, body = Staged), (status = 400, body = ApiErrorBody)))]
async fn stage_index(
    State(control): State<Shared>,
    Path(name): Path<String>,
    Query(query): Query<IngestQuery>,
    body: axum::body::Bytes,
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
struct PolicyQuery {
    /// A name to show for it (the file name).
    name: Option<String>,
}

/// Swaps the lane-steering policy at run time: the body is a BPF object
/// with a uprobe `lane_policy` and the maps of `sluice_steer.h`.
#[utoipa::path(put, path = "/v1/policy", tag = "operations", params(PolicyQuery), request_body(content = Vec<u8>, content_type = "application/octet-stream"), responses((status = 200, body = Object), (status = 400, body = ApiErrorBody), (status = 409, body = ApiErrorBody)))]
async fn load_policy(
    State(control): State<Shared>,
    Query(query): Query<PolicyQuery>,
    body: axum::body::Bytes,
) -> Result<impl IntoResponse, ApiError> {
    let name = query.name.unwrap_or_else(|| "unnamed".into());
    let loaded = tokio::task::spawn_blocking(move || control.load_policy(&name, &body))
        .await
        .map_err(|e| bad_request(format!("policy load task: {e}")))??;
    Ok(Json(loaded))
}

/// Detaches the policy: the batch-size threshold decides lanes again.
#[utoipa::path(delete, path = "/v1/policy", tag = "operations", responses((status = 200, body = Object), (status = 409, body = ApiErrorBody)))]
async fn unload_policy(State(control): State<Shared>) -> Result<impl IntoResponse, ApiError> {
    Ok(Json(control.unload_policy()?))
}

/// Verifies every chunk of a sealed dataset as read through the data plane.
#[utoipa::path(post, path = "/v1/datasets/{name}/scrub", tag = "datasets", params(("name" = String, Path)), responses((status = 200, body = crate::node::ScrubReport), (status = 409, body = ApiErrorBody)))]
async fn scrub(State(control): State<Shared>, Path(name): Path<String>) -> Result<impl IntoResponse, ApiError> {
    Ok(Json(control.scrub(&name).await?))
}

/// Live small-read traffic from the eBPF probes (`sluicectl top`).
#[utoipa::path(get, path = "/v1/trace", tag = "operations", responses((status = 200, description = "eBPF trace snapshot, or why there is none", body = Object)))]
async fn trace(State(control): State<Shared>) -> impl IntoResponse {
    Json(control.trace_snapshot())
}
