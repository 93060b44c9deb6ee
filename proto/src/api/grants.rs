//! Access grants as the control API takes and shows them
//! (`POST /v1/grants`, `GET /v1/grants`).

use serde::{Deserialize, Serialize};

use crate::codec::Secret;

/// The longest a grant may stand: ten years.
pub const GRANT_TTL_S_MAX: u64 = 10 * 365 * 24 * 3600;

/// Whether a grant may be given `ttl` as its lifetime: from 1 s to
/// [`GRANT_TTL_S_MAX`].
pub fn grant_ttl_in_bounds(ttl: std::time::Duration) -> bool {
    !ttl.is_zero() && ttl <= std::time::Duration::from_secs(GRANT_TTL_S_MAX)
}

/// A request for a grant of one dataset to one client identity.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct GrantRequest {
    #[cfg_attr(
        feature = "openapi",
        schema(pattern = "^[A-Za-z0-9_-][A-Za-z0-9._-]*$", min_length = 1, max_length = 128)
    )]
    pub dataset: String,
    /// Who the grant is for: a job, host or service identity (printable
    /// ASCII, no spaces).
    #[cfg_attr(feature = "openapi", schema(pattern = "^[!-~]+$", min_length = 1, max_length = 128))]
    pub client: String,
    /// Bind the grant to the client certificate with this CN: its token
    /// then opens only from a TLS connection that presents it.
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(pattern = "^[!-~]+$", min_length = 1, max_length = 128))]
    pub cert_name: Option<String>,
    /// Seconds the grant stands from now; past them its token opens
    /// nothing and the sessions opened with it close, as on a revocation.
    /// Without it, the grant stands until revoked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(minimum = 1, maximum = 315_360_000))]
    pub ttl_s: Option<u64>,
}

/// What the API shows of a grant (never the token's hash).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct GrantView {
    pub id: u64,
    pub client: String,
    pub dataset: String,
    pub created_unix_ms: u64,
    /// The client certificate CN the grant is bound to, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cert_name: Option<String>,
    /// When the grant ends, if it was given a lifetime.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_unix_ms: Option<u64>,
    /// Present only in the answer to the request that created the grant
    /// (never shown by `Debug`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<String>))]
    pub token: Option<Secret>,
}
