//! The API's handlers, one per operation, and the OpenAPI document made
//! from them.

use super::*;

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
        warm,
        cache,
        caches,
        pin,
        unpin,
        prefetch,
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
pub(super) async fn openapi() -> impl IntoResponse {
    use utoipa::OpenApi as _;
    Json(ApiDoc::openapi())
}

#[utoipa::path(get, path = "/metrics", tag = "operations", responses((status = 200, description = "Prometheus text exposition (0.0.4)", content_type = "text/plain")))]
pub(super) async fn metrics(State(control): State<Shared>) -> Result<impl IntoResponse, ApiError> {
    let text =
        tokio::task::spawn_blocking(move || control.metrics_text()).await.map_err(|e| internal(e.to_string()))?;
    Ok(([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], text))
}

#[utoipa::path(get, path = "/v1/devices", tag = "operations", responses((status = 200, body = Vec<crate::plane::DeviceReport>)))]
pub(super) async fn devices(State(control): State<Shared>) -> Result<impl IntoResponse, ApiError> {
    let devices = tokio::task::spawn_blocking(move || control.devices()).await.map_err(|e| internal(e.to_string()))?;
    Ok(Json(devices))
}

/// Files no record owns, quarantined in `DATA_DIR/orphans/` (never deleted
/// without an operator's word).
#[utoipa::path(get, path = "/v1/orphans", tag = "operations", responses((status = 200, body = Vec<OrphanFile>)))]
pub(super) async fn orphans(State(control): State<Shared>) -> Result<impl IntoResponse, ApiError> {
    let files = tokio::task::spawn_blocking(move || control.orphans()).await.map_err(|e| internal(e.to_string()))?;
    Ok(Json(files.into_iter().map(|(path, bytes)| OrphanFile { path, bytes }).collect::<Vec<_>>()))
}

/// Deletes every quarantined file.
#[utoipa::path(delete, path = "/v1/orphans", tag = "operations", responses((status = 200, body = Purged)))]
pub(super) async fn purge_orphans(State(control): State<Shared>) -> Result<impl IntoResponse, ApiError> {
    let (files, bytes) =
        tokio::task::spawn_blocking(move || control.purge_orphans()).await.map_err(|e| internal(e.to_string()))??;
    Ok(Json(Purged { files, bytes }))
}

#[utoipa::path(get, path = "/v1/cluster", tag = "operations", responses((status = 200, body = crate::plane::ClusterStatus), (status = 409, body = ApiErrorBody)))]
pub(super) async fn cluster(State(control): State<Shared>) -> Result<Json<crate::plane::ClusterStatus>, ApiError> {
    let status = tokio::task::spawn_blocking(move || control.cluster_status())
        .await
        .map_err(|e| ApiError::from(ControlError::Cluster(e.to_string())))??;
    Ok(Json(status))
}

#[utoipa::path(get, path = "/v1/node", tag = "operations", responses((status = 200, description = "The node: name, version, data-plane address, driver, grants_required, data_tls", body = Object)))]
pub(super) async fn node(State(control): State<Shared>) -> impl IntoResponse {
    Json(control.info())
}

#[utoipa::path(get, path = "/v1/datasets", tag = "datasets", responses((status = 200, body = Vec<crate::catalog::DatasetRecord>)))]
pub(super) async fn list(State(control): State<Shared>) -> Result<impl IntoResponse, ApiError> {
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
    /// Makes a source-backed dataset: object URLs (`s3://bucket/key`,
    /// `s3://bucket/prefix/` for every object under it in key order,
    /// `gs://`, `az://`, `https://`, `file://`), listed and pinned now.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub source: Vec<String>,
    /// A source-backed `records` dataset's offsets object (`n + 1` u64,
    /// raw or `.npy`) over the concatenated objects.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub index: Option<String>,
}

#[utoipa::path(post, path = "/v1/datasets", tag = "datasets", request_body = CreateRequest, responses((status = 201, body = crate::catalog::DatasetRecord), (status = 409, body = ApiErrorBody), (status = 507, body = ApiErrorBody)))]
pub(super) async fn create(
    State(control): State<Shared>,
    ApiJson(request): ApiJson<CreateRequest>,
) -> Result<impl IntoResponse, ApiError> {
    let kind: DatasetKind = request.kind.parse().map_err(bad_request)?;
    if !request.source.is_empty() {
        let spec = crate::plane::SourceSpec { urls: request.source, index: request.index };
        let created = control.create_from_source(&request.name, kind, request.record_size, spec).await?;
        return Ok((StatusCode::CREATED, Json(created)));
    }
    if request.index.is_some() {
        return Err(bad_request("index names a source-backed records dataset's offsets object: give source too"));
    }
    let created = tokio::task::spawn_blocking(move || {
        control.create_with(&request.name, kind, request.record_size, request.size_bytes)
    })
    .await
    .map_err(|e| internal(e.to_string()))??;
    Ok((StatusCode::CREATED, Json(created)))
}

/// Issues a grant; the response is the only place its token appears.
#[utoipa::path(post, path = "/v1/grants", tag = "grants", request_body = GrantRequest, responses((status = 201, description = "The grant, with its token (shown only here)", body = sluice_proto::api::GrantView), (status = 404, body = ApiErrorBody), (status = 409, body = ApiErrorBody), (status = 507, body = ApiErrorBody)))]
pub(super) async fn create_grant(
    State(control): State<Shared>,
    ApiJson(request): ApiJson<GrantRequest>,
) -> Result<impl IntoResponse, ApiError> {
    let grant = tokio::task::spawn_blocking(move || {
        let ttl = control.access().grant_ttl(request.ttl_s.map(std::time::Duration::from_secs));
        control.issue_grant(&request.dataset, &request.client, request.cert_name.as_deref(), ttl)
    })
    .await
    .map_err(|e| internal(e.to_string()))??;
    Ok((StatusCode::CREATED, Json(grant)))
}

#[utoipa::path(get, path = "/v1/grants", tag = "grants", responses((status = 200, body = Vec<sluice_proto::api::GrantView>)))]
pub(super) async fn list_grants(State(control): State<Shared>) -> impl IntoResponse {
    Json(control.list_grants())
}

#[utoipa::path(delete, path = "/v1/grants/{id}", tag = "grants", params(("id" = u64, Path, description = "grant id")), responses((status = 204, description = "Revoked; sessions under it are closed"), (status = 404, body = ApiErrorBody)))]
pub(super) async fn revoke_grant(
    State(control): State<Shared>,
    ApiPath(id): ApiPath<u64>,
) -> Result<impl IntoResponse, ApiError> {
    tokio::task::spawn_blocking(move || control.revoke_grant(id)).await.map_err(|e| internal(e.to_string()))??;
    Ok(StatusCode::NO_CONTENT)
}

#[utoipa::path(get, path = "/v1/datasets/{name}", tag = "datasets", params(("name" = String, Path)), responses((status = 200, body = crate::catalog::DatasetRecord), (status = 404, body = ApiErrorBody)))]
pub(super) async fn stat(
    State(control): State<Shared>,
    ApiPath(name): ApiPath<String>,
) -> Result<impl IntoResponse, ApiError> {
    Ok(Json(control.get(&name)?))
}

#[derive(Debug, Default, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct WarmRequest {
    /// Runs of chunks (up to 4 MiB each) fetched at once; 4 if not given.
    #[serde(default)]
    #[schema(minimum = 1, maximum = 256)]
    pub parallel: Option<usize>,
}

/// Starts filling every chunk of a source-backed dataset from its source
/// (idempotent; a restart goes on with it). Its progress is
/// `GET .../cache`; once complete, the dataset has its content hash.
#[utoipa::path(post, path = "/v1/datasets/{name}/warm", tag = "datasets", params(("name" = String, Path)), request_body = WarmRequest, responses((status = 202, body = sluice_proto::api::CacheReport), (status = 404, body = ApiErrorBody), (status = 502, body = ApiErrorBody)))]
pub(super) async fn warm(
    State(control): State<Shared>,
    ApiPath(name): ApiPath<String>,
    ApiJson(request): ApiJson<WarmRequest>,
) -> Result<impl IntoResponse, ApiError> {
    let parallel = request.parallel.unwrap_or(4);
    if !(1..=256).contains(&parallel) {
        return Err(bad_request("parallel is 1 to 256"));
    }
    Ok((StatusCode::ACCEPTED, Json(control.warm(&name, parallel).await?)))
}

/// How much of a source-backed dataset is on the node, and its fills.
#[utoipa::path(get, path = "/v1/datasets/{name}/cache", tag = "datasets", params(("name" = String, Path)), responses((status = 200, body = sluice_proto::api::CacheReport), (status = 404, body = ApiErrorBody), (status = 502, body = ApiErrorBody)))]
pub(super) async fn cache(
    State(control): State<Shared>,
    ApiPath(name): ApiPath<String>,
) -> Result<impl IntoResponse, ApiError> {
    Ok(Json(control.cache_report(&name).await?))
}

/// The caches of every source-backed dataset on the node.
#[utoipa::path(get, path = "/v1/caches", tag = "datasets", responses((status = 200, body = Vec<sluice_proto::api::CacheReport>), (status = 502, body = ApiErrorBody)))]
pub(super) async fn caches(State(control): State<Shared>) -> Result<impl IntoResponse, ApiError> {
    Ok(Json(control.cache_reports()?))
}

/// Largest prefetch hint: 65,536 ranges.
pub const PREFETCH_HINT_BYTES_MAX: usize = 65_536 * 12;

#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Prefetching {
    /// Chunks not on the node that are now being filled.
    pub chunks_queued: u64,
}

/// A loader's hint of the byte ranges its next steps read (12 bytes each:
/// a little-endian u64 offset and u32 length): the node fills the missing
/// chunks of a source-backed dataset ahead of the reads.
#[utoipa::path(post, path = "/v1/datasets/{name}/prefetch", tag = "datasets", params(("name" = String, Path)), request_body(content = Vec<u8>, description = "(u64 offset, u32 len) little-endian entries", content_type = "application/octet-stream"), responses((status = 202, body = Prefetching), (status = 400, body = ApiErrorBody), (status = 404, body = ApiErrorBody)))]
pub(super) async fn prefetch(
    State(control): State<Shared>,
    ApiPath(name): ApiPath<String>,
    body: axum::body::Bytes,
) -> Result<impl IntoResponse, ApiError> {
    if !body.len().is_multiple_of(12) {
        return Err(bad_request(format!("{} bytes is not a list of 12-byte ranges", body.len())));
    }
    let ranges = body
        .chunks_exact(12)
        .map(|e| sluice_dataplane::ByteRange {
            offset_bytes: u64::from_le_bytes(e[..8].try_into().unwrap_or([0; 8])),
            len_bytes: u32::from_le_bytes(e[8..].try_into().unwrap_or([0; 4])),
        })
        .collect();
    let chunks_queued = control.prefetch(&name, ranges)?;
    Ok((StatusCode::ACCEPTED, Json(Prefetching { chunks_queued })))
}

/// Pins a source-backed dataset: its chunks are never evicted.
#[utoipa::path(put, path = "/v1/datasets/{name}/pin", tag = "datasets", params(("name" = String, Path)), responses((status = 200, body = sluice_proto::api::CacheReport), (status = 404, body = ApiErrorBody), (status = 502, body = ApiErrorBody)))]
pub(super) async fn pin(
    State(control): State<Shared>,
    ApiPath(name): ApiPath<String>,
) -> Result<impl IntoResponse, ApiError> {
    Ok(Json(control.pin(&name, true)?))
}

/// Unpins a source-backed dataset: its coldest chunks may be evicted again.
#[utoipa::path(delete, path = "/v1/datasets/{name}/pin", tag = "datasets", params(("name" = String, Path)), responses((status = 200, body = sluice_proto::api::CacheReport), (status = 404, body = ApiErrorBody), (status = 502, body = ApiErrorBody)))]
pub(super) async fn unpin(
    State(control): State<Shared>,
    ApiPath(name): ApiPath<String>,
) -> Result<impl IntoResponse, ApiError> {
    Ok(Json(control.pin(&name, false)?))
}

#[utoipa::path(delete, path = "/v1/datasets/{name}", tag = "datasets", params(("name" = String, Path)), responses((status = 204, description = "Deleted; its namespace released and its grants revoked"), (status = 404, body = ApiErrorBody), (status = 409, body = ApiErrorBody)))]
pub(super) async fn remove(
    State(control): State<Shared>,
    ApiPath(name): ApiPath<String>,
) -> Result<impl IntoResponse, ApiError> {
    control.delete(&name).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// How much of a refused upload is read before answering.
const REFUSED_UPLOAD_DRAIN_BYTES_MAX: usize = 64 << 20;

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
pub(super) struct IngestQuery {
    /// How the body is read: `raw` bytes, or a `.npy` array.
    format: Option<IngestFormat>,
}

/// Appends the request body (one file) to the dataset. Committed only when
/// the whole body arrived and checked out; a cut-off upload changes nothing.
#[utoipa::path(post, path = "/v1/datasets/{name}/ingest", tag = "datasets", params(("name" = String, Path), IngestQuery), request_body(content = Vec<u8>, description = "One file", content_type = "application/octet-stream"), responses((status = 200, body = crate::ingest::Appended), (status = 404, body = ApiErrorBody), (status = 409, body = ApiErrorBody)))]
pub(super) async fn ingest(
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
pub(super) async fn seal(
    State(control): State<Shared>,
    ApiPath(name): ApiPath<String>,
) -> Result<impl IntoResponse, ApiError> {
    let record =
        tokio::task::spawn_blocking(move || control.seal(&name)).await.map_err(|e| internal(e.to_string()))??;
    Ok(Json(record))
}

/// The manifest's chunk checksums as little-endian u32s.
#[utoipa::path(get, path = "/v1/datasets/{name}/chunks", tag = "datasets", params(("name" = String, Path)), responses((status = 200, description = "CRC32C per 64 KiB chunk, little-endian u32", content_type = "application/octet-stream"), (status = 404, body = ApiErrorBody)))]
pub(super) async fn chunks(
    State(control): State<Shared>,
    ApiPath(name): ApiPath<String>,
) -> Result<impl IntoResponse, ApiError> {
    let crcs = control.chunk_crcs(&name)?;
    let bytes: Vec<u8> = crcs.iter().flat_map(|c| c.to_le_bytes()).collect();
    Ok(([(header::CONTENT_TYPE, "application/octet-stream")], bytes))
}

/// The sample index of a `records`, `wds` or `mds` dataset: `(offset, len)` pairs
/// of little-endian u64s.
#[utoipa::path(get, path = "/v1/datasets/{name}/index", tag = "datasets", params(("name" = String, Path)), responses((status = 200, description = "(offset, len) little-endian u64 pairs per sample", content_type = "application/octet-stream"), (status = 404, body = ApiErrorBody)))]
pub(super) async fn record_index(
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
pub(super) async fn stage_index(
    State(control): State<Shared>,
    ApiPath(name): ApiPath<String>,
    ApiQuery(query): ApiQuery<IngestQuery>,
    ApiBytes(body): ApiBytes,
) -> Result<Json<Staged>, ApiError> {
    let records = control.stage_offsets(&name, &body, query.format.unwrap_or(IngestFormat::Raw))?;
    Ok(Json(Staged { records }))
}

/// The lane-steering policy attached now, or why there is none.
#[utoipa::path(get, path = "/v1/policy", tag = "operations", responses((status = 200, description = "policy, decision counts and swaps", body = sluice_proto::api::PolicyReport)))]
pub(super) async fn show_policy(State(control): State<Shared>) -> impl IntoResponse {
    Json(control.policy())
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
pub(super) struct PolicyQuery {
    /// A name to show for it (the file name).
    #[param(max_length = 128)]
    name: Option<String>,
}

/// Swaps the lane-steering policy at run time: the body is a BPF object
/// with a uprobe `lane_policy` and the maps of `sluice_steer.h`. Only on a
/// node started with `policy_load = true`; the object is checked (program
/// type, maps, helpers, allowlist) before anything reaches the kernel.
#[utoipa::path(put, path = "/v1/policy", tag = "operations", params(PolicyQuery), request_body(content = Vec<u8>, content_type = "application/octet-stream"), responses((status = 200, body = sluice_proto::api::PolicyInfo), (status = 409, body = ApiErrorBody), (status = 413, body = ApiErrorBody)))]
pub(super) async fn load_policy(
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
#[utoipa::path(delete, path = "/v1/policy", tag = "operations", responses((status = 200, body = sluice_proto::api::Unloaded), (status = 409, body = ApiErrorBody)))]
pub(super) async fn unload_policy(State(control): State<Shared>) -> Result<impl IntoResponse, ApiError> {
    Ok(Json(control.unload_policy()?))
}

/// Verifies every chunk of a sealed dataset as read through the data plane.
#[utoipa::path(post, path = "/v1/datasets/{name}/scrub", tag = "datasets", params(("name" = String, Path)), responses((status = 200, body = crate::plane::ScrubReport), (status = 404, body = ApiErrorBody), (status = 409, body = ApiErrorBody), (status = 421, description = "No complete copy on this node (elsewhere): the message names the nodes that hold one", body = ApiErrorBody)))]
pub(super) async fn scrub(
    State(control): State<Shared>,
    ApiPath(name): ApiPath<String>,
) -> Result<impl IntoResponse, ApiError> {
    Ok(Json(control.scrub(&name).await?))
}

/// Live small-read traffic from the eBPF probes (`sluicectl top`).
#[utoipa::path(get, path = "/v1/trace", tag = "operations", responses((status = 200, description = "eBPF trace snapshot, or why there is none", body = sluice_proto::api::TraceSnapshot)))]
pub(super) async fn trace(State(control): State<Shared>) -> impl IntoResponse {
    Json(control.trace_snapshot())
}
