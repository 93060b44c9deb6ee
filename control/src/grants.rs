//! Access grants: the control plane issues a token per (client identity,
//! dataset); the data plane accepts an open only with a token granted for
//! that very dataset (by id, so a dataset deleted and made again under the
//! same name needs new grants). The catalog keeps a hash of each token,
//! never the token; revoking a grant refuses new opens at once and closes
//! the data-plane sessions opened with it.

use serde::{Deserialize, Serialize};

/// Most grants one node holds.
pub const GRANTS_MAX: usize = 65_536;
/// Longest client identity.
pub const CLIENT_BYTES_MAX: usize = 128;
/// Tokens start with this, so they are recognisable in configs and logs
/// (and scanners).
pub const TOKEN_PREFIX: &str = "sluice_";

/// One grant as the catalog stores it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GrantRecord {
    pub id: u64,
    /// Who the grant is for (a job, a host, a service account).
    pub client: String,
    pub dataset: String,
    pub dataset_id: u64,
    /// blake3 of the token, hex.
    pub token_hash: String,
    pub created_unix_ms: u64,
    /// When set, the token opens only from a TLS client certificate with
    /// this CN (mTLS): a token copied elsewhere opens nothing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cert_name: Option<String>,
    /// When set, the grant ends then: its token opens nothing and its
    /// sessions close, as on a revocation; the node then drops it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_unix_ms: Option<u64>,
}

impl GrantRecord {
    /// Whether the grant has ended by `now_unix_ms`.
    pub fn expired(&self, now_unix_ms: u64) -> bool {
        self.expires_unix_ms.is_some_and(|end| now_unix_ms >= end)
    }
}

pub use sluice_proto::api::GrantView;

impl From<&GrantRecord> for GrantView {
    fn from(record: &GrantRecord) -> Self {
        Self {
            id: record.id,
            client: record.client.clone(),
            dataset: record.dataset.clone(),
            created_unix_ms: record.created_unix_ms,
            cert_name: record.cert_name.clone(),
            expires_unix_ms: record.expires_unix_ms,
            token: None,
        }
    }
}

/// A fresh token: 256 bits from the OS.
pub fn new_token() -> String {
    format!("{TOKEN_PREFIX}{}", crate::hex::random::<32>())
}

pub fn token_hash(token: &str) -> String {
    blake3::hash(token.as_bytes()).to_hex().to_string()
}

pub fn valid_client(client: &str) -> bool {
    !client.is_empty() && client.len() <= CLIENT_BYTES_MAX && client.bytes().all(|b| b.is_ascii_graphic())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_fresh_and_hashed() {
        let (a, b) = (new_token(), new_token());
        assert_ne!(a, b);
        assert!(a.starts_with(TOKEN_PREFIX) && a.len() == TOKEN_PREFIX.len() + 64);
        assert_eq!(token_hash(&a), token_hash(&a));
        assert_ne!(token_hash(&a), token_hash(&b));
        assert!(!token_hash(&a).contains(&a[TOKEN_PREFIX.len()..]));
    }

    #[test]
    fn client_identities_are_bounded_and_printable() {
        assert!(valid_client("job-42/rank-0@host"));
        assert!(!valid_client(""));
        assert!(!valid_client("has space"));
        assert!(!valid_client(&"x".repeat(CLIENT_BYTES_MAX + 1)));
    }
}
