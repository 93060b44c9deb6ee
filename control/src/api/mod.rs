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

use crate::auth::{self, Refusal};
use crate::catalog::CatalogError;
use crate::ingest::{Appended, IngestFormat};
use crate::openapi::Contract;
use crate::plane::{ControlError, ControlPlane};
use sluice_proto::api::{DatasetKind, GrantRequest, OrphanFile, Purged};
use sluice_serve::Peer;

mod errors;
mod handlers;

pub use errors::*;
pub use handlers::*;

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
    ("POST", "/v1/datasets/{name}/warm", Access::Operator),
    ("GET", "/v1/datasets/{name}/cache", Access::DatasetReader),
    ("GET", "/v1/caches", Access::Operator),
    ("PUT", "/v1/datasets/{name}/pin", Access::Operator),
    ("POST", "/v1/datasets/{name}/prefetch", Access::DatasetReader),
    ("DELETE", "/v1/datasets/{name}/pin", Access::Operator),
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
        .route("/v1/datasets/{name}/warm", post(warm))
        .route("/v1/datasets/{name}/cache", get(cache))
        .route("/v1/caches", get(caches))
        .route("/v1/datasets/{name}/pin", axum::routing::put(pin).delete(unpin))
        .route(
            "/v1/datasets/{name}/prefetch",
            post(prefetch).layer(DefaultBodyLimit::max(handlers::PREFETCH_HINT_BYTES_MAX)),
        )
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
/// Every request but the long ones ([`LONG_OPERATIONS`]) has this long;
/// an upload idle for [`UPLOAD_IDLE_TIMEOUT`] is cut off. Shared with the
/// clients, which wait by the same bounds.
pub use sluice_proto::api::{LONG_OPERATIONS, REQUEST_TIMEOUT, UPLOAD_IDLE_TIMEOUT};

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
    if LONG_OPERATIONS.iter().any(|(m, p)| *m == method && *p == path) {
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
    let cert_name = request.extensions().get::<ConnectInfo<Peer>>().and_then(|p| p.0.cert_name.clone());
    let matched = request.extensions().get::<MatchedPath>().cloned();
    let caller = auth::authenticate(&policy, authorization.as_deref(), cert_name.as_deref(), |token| {
        control.grant_for_token(token)
    });
    let path = matched.as_ref().map_or("", MatchedPath::as_str);
    let host = request.headers().get(header::HOST).and_then(|h| h.to_str().ok()).or(request.uri().host());
    let decision = if request.headers().contains_key(header::ORIGIN) {
        Err(browser_refusal())
    } else if !policy.hosts.allows(host) {
        Err(Refusal { status: 403, code: "forbidden", message: policy.hosts.refusal(host) })
    } else {
        match access_of(request.method().as_str(), path) {
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
        }
    };
    let remote = request.extensions().get::<ConnectInfo<Peer>>().and_then(|p| p.0.addr);
    // Recorded when answered, or (a change) when dropped unanswered.
    let call = crate::audit::AuditedCall::begin(
        control.audit(),
        caller.to_string(),
        remote.map(|addr| addr.to_string()),
        request.method().as_str(),
        request.uri().path(),
    );
    match decision {
        Err(refusal) => {
            drain_refused_body(request).await;
            call.refused(refusal.status, &refusal.message);
            ApiError::from(refusal).into_response()
        }
        Ok(()) => {
            let response = next.run(request).await;
            call.answered(response.status().as_u16());
            response
        }
    }
}

/// The refusal of a request a browser made. Browsers send `Origin` with
/// every POST, PUT and DELETE (and cross-site reads); sluice's clients
/// never do. A page a browser loaded must not drive the API: it would
/// act with the browser's client certificate (an operator's, over mTLS),
/// or, through DNS rebinding, reach an `--insecure` node on loopback (as
/// etcd's CVE-2018-1098 and CVE-2018-1099 did).
fn browser_refusal() -> Refusal {
    Refusal {
        status: 403,
        code: "forbidden",
        message: "the control API does not serve browsers: a request with an Origin header is refused".into(),
    }
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
