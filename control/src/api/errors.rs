//! The API's one error shape, and extractors that answer in it when a
//! request is malformed (bad JSON, path, query or body).

use super::*;

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
    pub(super) status: StatusCode,
    pub(super) code: String,
    pub(super) message: String,
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
            // The source, not this node, failed or does not fit.
            ControlError::Source(_) => StatusCode::BAD_GATEWAY,
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

pub(super) fn bad_request(message: impl Into<String>) -> ApiError {
    ApiError { status: StatusCode::BAD_REQUEST, code: "bad_request".into(), message: message.into() }
}

pub(super) fn internal(message: impl Into<String>) -> ApiError {
    ApiError { status: StatusCode::INTERNAL_SERVER_ERROR, code: "internal".into(), message: message.into() }
}

/// A framework refusal (body, path or query that does not parse) as the
/// API's JSON error, keeping the framework's status.
pub(super) fn rejected(status: StatusCode, message: String) -> ApiError {
    let code = match status {
        StatusCode::PAYLOAD_TOO_LARGE => "too_large",
        StatusCode::UNSUPPORTED_MEDIA_TYPE => "unsupported_media_type",
        StatusCode::UNPROCESSABLE_ENTITY => "invalid_body",
        _ => "bad_request",
    };
    ApiError { status, code: code.into(), message }
}

pub(super) async fn no_route(method: Method, uri: axum::http::Uri) -> ApiError {
    ApiError { status: StatusCode::NOT_FOUND, code: "no_route".into(), message: format!("no operation {method} {uri}") }
}

pub(super) async fn method_not_allowed(method: Method, uri: axum::http::Uri) -> ApiError {
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
