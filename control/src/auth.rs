//! Who is calling the control API, and what each kind of caller may do.
//!
//! Two roles, as the design names them: the *operator* (an operator bearer
//! token from `--admin-tokens`, or a client certificate whose CN is in
//! `operator_cert_names`) administers everything; a *reader* (a training
//! host) holds a grant's token and may read that one dataset's record,
//! chunk checksums and index. `GET /v1/node` and `GET /openapi.json` are
//! open to anyone. Every request passes [`authenticate`] once, in one
//! middleware layer; each route then asks for the role it needs, and a
//! refusal has a stable code: `unauthenticated` (401: no credential, or one
//! that is not valid) or `forbidden` (403: a valid credential of the wrong
//! role or for another dataset). Like etcd and Kubernetes, nothing is
//! decided by where a request comes from.
//!
//! Secrets are compared in constant time: operator tokens are kept as
//! blake3 hashes and a presented token's hash is compared with each of
//! them with `subtle`, all of them every time. Grant tokens are found by
//! their hash (the catalog keeps only hashes), which reveals nothing about
//! any token.

use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use subtle::ConstantTimeEq;

use crate::grants::{self, GrantRecord};

/// The operator token a node makes for itself at first start when it is
/// given neither `--admin-tokens` nor `--insecure`, in its data directory.
pub const ADMIN_TOKEN_FILE: &str = "admin.token";

/// Most operator tokens one file may list.
pub const OPERATOR_TOKENS_MAX: usize = 1024;

#[derive(Debug, thiserror::Error)]
pub enum AuthSetupError {
    #[error("{path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "{path} is readable by group or others (mode {mode:o}); operator tokens must be private: chmod 600 {path}"
    )]
    Exposed { path: String, mode: u32 },
    #[error("{path} line {line}: {why}")]
    Malformed { path: String, line: usize, why: String },
    #[error("{path} lists no operator token")]
    Empty { path: String },
    #[error("{path} lists more than {OPERATOR_TOKENS_MAX} operator tokens")]
    TooMany { path: String },
}

fn io_error(path: &Path) -> impl FnOnce(std::io::Error) -> AuthSetupError + '_ {
    move |source| AuthSetupError::Io { path: path.display().to_string(), source }
}

/// A set of bearer tokens, kept only as blake3 hashes.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct TokenSet {
    hashes: Vec<[u8; 32]>,
}

impl std::fmt::Debug for TokenSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "TokenSet({} tokens)", self.hashes.len())
    }
}

impl TokenSet {
    /// Reads a token file: one token per line, either the token itself or
    /// `blake3:<64 hex digits>` of it; blank lines and `#` comments are
    /// skipped. The file must not be readable by group or others.
    pub fn load(path: &Path) -> Result<Self, AuthSetupError> {
        let mode = std::fs::metadata(path).map_err(io_error(path))?.permissions().mode();
        if mode & 0o077 != 0 {
            return Err(AuthSetupError::Exposed { path: path.display().to_string(), mode: mode & 0o777 });
        }
        let text = std::fs::read_to_string(path).map_err(io_error(path))?;
        let mut hashes = Vec::new();
        for (index, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let malformed = |why: &str| AuthSetupError::Malformed {
                path: path.display().to_string(),
                line: index + 1,
                why: why.to_string(),
            };
            let hash = match line.strip_prefix("blake3:") {
                Some(hex) => crate::hex::decode_32(hex).ok_or_else(|| malformed("blake3: needs 64 hex digits"))?,
                None if line.len() < 16 => return Err(malformed("a token needs at least 16 characters")),
                None if line.bytes().any(|b| !b.is_ascii_graphic()) => {
                    return Err(malformed("a token is printable ASCII without spaces"))
                }
                None => *blake3::hash(line.as_bytes()).as_bytes(),
            };
            hashes.push(hash);
            if hashes.len() > OPERATOR_TOKENS_MAX {
                return Err(AuthSetupError::TooMany { path: path.display().to_string() });
            }
        }
        if hashes.is_empty() {
            return Err(AuthSetupError::Empty { path: path.display().to_string() });
        }
        Ok(Self { hashes })
    }

    /// Reads `DATA_DIR/admin.token`, making it first (a fresh token, mode
    /// 0600, created exclusively so two starts cannot both write it).
    /// Returns the set and whether the file was made now.
    pub fn load_or_create(data_dir: &Path) -> Result<(Self, PathBuf, bool), AuthSetupError> {
        let path = data_dir.join(ADMIN_TOKEN_FILE);
        let created = match std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(&path) {
            Ok(mut file) => {
                let token = grants::new_token();
                file.write_all(format!("{token}\n").as_bytes()).map_err(io_error(&path))?;
                file.sync_all().map_err(io_error(&path))?;
                true
            }
            Err(err) if err.kind() == std::io::ErrorKind::AlreadyExists => false,
            Err(err) => return Err(io_error(&path)(err)),
        };
        Ok((Self::load(&path)?, path, created))
    }

    /// One token, as given (for the quickstart's embedded node and tests).
    pub fn from_token(token: &str) -> Self {
        Self { hashes: vec![*blake3::hash(token.as_bytes()).as_bytes()] }
    }

    /// How many tokens the set holds.
    pub fn len(&self) -> usize {
        self.hashes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.hashes.is_empty()
    }

    /// Whether `token` is one of the set, in time that depends only on the
    /// set's size.
    pub fn contains(&self, token: &str) -> bool {
        let presented = blake3::hash(token.as_bytes());
        let mut found = subtle::Choice::from(0);
        for hash in &self.hashes {
            found |= hash.ct_eq(presented.as_bytes());
        }
        found.into()
    }
}

/// How the node decides who may call what.
#[derive(Clone, Debug, Default)]
pub struct AccessPolicy {
    /// `--insecure`: no authentication at all (local development).
    pub insecure: bool,
    pub operator_tokens: TokenSet,
    /// Client-certificate CNs that are operators (mTLS).
    pub operator_cert_names: Vec<String>,
    /// A scraper's own bearer tokens for `GET /metrics`.
    pub metrics_tokens: Option<TokenSet>,
    /// The longest lifetime of a grant issued through the API; `None`:
    /// grants may stand until revoked.
    pub grant_ttl_max: Option<std::time::Duration>,
    /// Which `Host`s the node answers: every one for a node that checks
    /// credentials, fewer for an `--insecure` node (see [`HostCheck`]).
    pub hosts: HostCheck,
}

/// The `Host` (or `:authority`) names an `--insecure` node answers, so a
/// web page that rebinds its own name to the node's address (DNS
/// rebinding, etcd's CVE-2018-1099) reaches nothing: the browser sends
/// that page's name as `Host`, and no credential stops it on such a node.
/// A node that checks credentials needs no such check: a page cannot
/// attach them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum HostCheck {
    /// Every name: a node that checks credentials.
    #[default]
    Any,
    /// An `--insecure` node on loopback: `localhost` and loopback IPs.
    Loopback,
    /// An `--insecure` node off loopback: IP literals (a page cannot
    /// rebind an address), `localhost`, and the names listed
    /// (`insecure_hosts`, compared without case).
    Listed(Vec<String>),
}

impl HostCheck {
    /// Whether a request addressed to `authority` (`Host` with or without
    /// a port; none, as HTTP/1.0 allows, is refused) is answered.
    pub fn allows(&self, authority: Option<&str>) -> bool {
        let host = || {
            let authority = authority?.parse::<axum::http::uri::Authority>().ok()?;
            Some(authority.host().trim_start_matches('[').trim_end_matches(']').to_string())
        };
        match self {
            Self::Any => true,
            Self::Loopback => host().is_some_and(|host| loopback_name(&host)),
            Self::Listed(names) => host().is_some_and(|host| {
                loopback_name(&host)
                    || host.parse::<std::net::IpAddr>().is_ok()
                    || names.iter().any(|name| name.eq_ignore_ascii_case(&host))
            }),
        }
    }

    /// What a refused request is told.
    pub fn refusal(&self, authority: Option<&str>) -> String {
        let which = match self {
            Self::Any => "any name",
            Self::Loopback => "localhost or a loopback IP, as it listens on loopback",
            Self::Listed(_) => "an IP address, localhost or a name in insecure_hosts (--insecure-host)",
        };
        format!(
            "this --insecure node answers only requests addressed to {which}, not {:?} (a page that rebinds its \
             own name to this node reaches nothing)",
            authority.unwrap_or("")
        )
    }
}

/// `localhost` or a loopback IP (brackets already taken off).
fn loopback_name(host: &str) -> bool {
    host.eq_ignore_ascii_case("localhost") || host.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

/// A name `insecure_hosts` may hold: a DNS name as `Host` carries it, no
/// port, scheme or wildcard, at most 253 bytes.
pub fn check_insecure_host(name: &str) -> Result<(), String> {
    let label_ok = |label: &str| {
        (1..=63).contains(&label.len())
            && label.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
            && !label.starts_with('-')
            && !label.ends_with('-')
    };
    if name.len() <= 253 && name.split('.').all(label_ok) {
        Ok(())
    } else {
        Err(format!("insecure_hosts: {name:?} is not a host name (letters, digits, '-' and '.'; no port or scheme)"))
    }
}

impl AccessPolicy {
    /// The lifetime a grant asked for with `asked` gets: the longest
    /// allowed when none is asked for or a longer one is. One outside the
    /// API's bounds is left as asked, for the grant to be refused.
    pub fn grant_ttl(&self, asked: Option<std::time::Duration>) -> Option<std::time::Duration> {
        match (asked, self.grant_ttl_max) {
            (Some(asked), Some(max)) if sluice_proto::api::grant_ttl_in_bounds(asked) => Some(asked.min(max)),
            (None, max) => max,
            (asked, _) => asked,
        }
    }
}

/// Which operator made a call, as an audit record names them: never the
/// token, but the first 16 hex digits of its blake3 (what
/// `admin_tokens` holds where it keeps hashes; `b3sum` of the token
/// otherwise), or the CN of the client certificate.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Operator {
    Token { blake3_prefix: String },
    Certificate { common_name: String },
}

impl Operator {
    fn by_token(token: &str) -> Self {
        let hash = blake3::hash(token.as_bytes());
        Self::Token { blake3_prefix: crate::hex::encode(&hash.as_bytes()[..8]) }
    }
}

/// The caller of one request, once authenticated.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Caller {
    /// A node started `--insecure`: every caller may do everything.
    Unchecked,
    Operator(Operator),
    /// A grant holder: reads one dataset.
    Reader {
        grant: u64,
        dataset: String,
        dataset_id: u64,
    },
    /// A scraper's metrics token: `GET /metrics` only.
    Scraper,
    /// No credential at all.
    Anonymous,
    /// A credential that does not authenticate, and why.
    Invalid(String),
}

/// A refused request: the HTTP status and stable code the API answers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    pub status: u16,
    pub code: &'static str,
    pub message: String,
}

impl Refusal {
    fn unauthenticated(message: String) -> Self {
        Self { status: 401, code: "unauthenticated", message }
    }

    fn forbidden(message: String) -> Self {
        Self { status: 403, code: "forbidden", message }
    }
}

/// Decides who a request is from its `Authorization` header and, over
/// mTLS, the CN of its client certificate. `grant_for` finds a live grant
/// by token.
pub fn authenticate(
    policy: &AccessPolicy,
    authorization: Option<&[u8]>,
    peer_name: Option<&str>,
    grant_for: impl FnOnce(&str) -> Option<GrantRecord>,
) -> Caller {
    if policy.insecure {
        return Caller::Unchecked;
    }
    if let Some(header) = authorization {
        let Some(token) = std::str::from_utf8(header).ok().and_then(|h| h.strip_prefix("Bearer ")).map(str::trim)
        else {
            return Caller::Invalid("the Authorization header must be `Bearer TOKEN`".into());
        };
        if policy.operator_tokens.contains(token) {
            return Caller::Operator(Operator::by_token(token));
        }
        if policy.metrics_tokens.as_ref().is_some_and(|set| set.contains(token)) {
            return Caller::Scraper;
        }
        return match grant_for(token) {
            Some(grant) if grant.expired(crate::plane::now_unix_ms()) => {
                Caller::Invalid("this grant has ended: ask for a new one".into())
            }
            Some(grant) => match &grant.cert_name {
                Some(bound) if peer_name != Some(bound.as_str()) => Caller::Invalid(format!(
                    "this grant is bound to the client certificate {bound:?}; connect with that certificate"
                )),
                _ => Caller::Reader { grant: grant.id, dataset: grant.dataset, dataset_id: grant.dataset_id },
            },
            None => Caller::Invalid("the token is neither an operator token nor a live grant".into()),
        };
    }
    match peer_name {
        Some(name) if policy.operator_cert_names.iter().any(|n| n == name) => {
            Caller::Operator(Operator::Certificate { common_name: name.to_string() })
        }
        _ => Caller::Anonymous,
    }
}

/// Who a caller is, in an audit record: no credential appears.
impl std::fmt::Display for Caller {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Unchecked => write!(f, "anyone (the node is --insecure)"),
            Self::Operator(Operator::Token { blake3_prefix }) => write!(f, "operator token blake3:{blake3_prefix}"),
            Self::Operator(Operator::Certificate { common_name }) => {
                write!(f, "operator certificate CN={common_name}")
            }
            Self::Reader { grant, dataset, .. } => write!(f, "grant {grant} on {dataset}"),
            Self::Scraper => write!(f, "metrics token"),
            Self::Anonymous => write!(f, "anonymous"),
            Self::Invalid(_) => write!(f, "an invalid credential"),
        }
    }
}

impl Caller {
    fn unauthenticated(&self, what: &str) -> Refusal {
        match self {
            Self::Invalid(why) => Refusal::unauthenticated(why.clone()),
            _ => Refusal::unauthenticated(format!(
                "{what} needs a credential: `Authorization: Bearer TOKEN` (sluicectl: SLUICE_ADMIN_TOKEN or \
                 --admin-token-file for operators, SLUICE_TOKEN or --token for a grant)"
            )),
        }
    }

    /// Administrative calls: operators only.
    pub fn require_operator(&self) -> Result<(), Refusal> {
        match self {
            Self::Unchecked | Self::Operator(_) => Ok(()),
            Self::Reader { .. } | Self::Scraper => {
                Err(Refusal::forbidden("this call is for operators; the credential given is not an operator's".into()))
            }
            Self::Anonymous | Self::Invalid(_) => Err(self.unauthenticated("this call")),
        }
    }

    /// A dataset's record, chunks and index: operators, and readers whose
    /// grant covers that dataset. A reader asking for another name is
    /// refused the same way whether that dataset exists or not.
    pub fn require_reader_of(&self, dataset: &str) -> Result<(), Refusal> {
        match self {
            Self::Unchecked | Self::Operator(_) => Ok(()),
            Self::Reader { dataset: granted, .. } if granted == dataset => Ok(()),
            Self::Reader { .. } | Self::Scraper => {
                Err(Refusal::forbidden(format!("the credential given does not cover a dataset named {dataset:?}")))
            }
            Self::Anonymous | Self::Invalid(_) => Err(self.unauthenticated("reading a dataset's record")),
        }
    }

    /// `GET /metrics`: operators and the scraper's token.
    pub fn require_scraper(&self) -> Result<(), Refusal> {
        match self {
            Self::Scraper => Ok(()),
            _ => self.require_operator(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grant(id: u64, dataset: &str, cert_name: Option<&str>) -> GrantRecord {
        GrantRecord {
            id,
            client: "job".into(),
            dataset: dataset.into(),
            dataset_id: id * 10,
            token_hash: String::new(),
            created_unix_ms: 0,
            cert_name: cert_name.map(str::to_string),
            expires_unix_ms: None,
        }
    }

    fn policy() -> AccessPolicy {
        AccessPolicy {
            insecure: false,
            operator_tokens: TokenSet::from_token("operator-token-0123456789"),
            operator_cert_names: vec!["ops-alice".into()],
            metrics_tokens: Some(TokenSet::from_token("scraper-token-0123456789")),
            grant_ttl_max: None,
            hosts: HostCheck::Any,
        }
    }

    #[test]
    fn insecure_nodes_answer_only_names_no_page_can_rebind() {
        let loopback =
            ["localhost", "LOCALHOST:7070", "127.0.0.1", "127.0.0.1:7070", "127.9.9.9:1", "[::1]:7070", "[::1]"];
        let names = ["attacker.example", "attacker.example:7070", "localhost.attacker.example", "", "a b"];
        let listed = HostCheck::Listed(vec!["sluice-0.storage.internal".into()]);
        for host in loopback {
            assert!(HostCheck::Loopback.allows(Some(host)) && listed.allows(Some(host)), "{host}");
        }
        for host in ["10.0.0.1:7070", "[fd00::1]:7070", "SLUICE-0.storage.internal:7070", "sluice-0.storage.internal"] {
            assert!(!HostCheck::Loopback.allows(Some(host)), "{host}");
            assert!(listed.allows(Some(host)), "{host}");
        }
        for host in names.iter().chain(["sluice-0.storage.internal.attacker.example", "storage.internal"].iter()) {
            assert!(!HostCheck::Loopback.allows(Some(host)) && !listed.allows(Some(host)), "{host}");
        }
        assert!(!HostCheck::Loopback.allows(None) && !listed.allows(None), "no Host at all");
        for host in names.iter().chain(loopback.iter()) {
            assert!(HostCheck::Any.allows(Some(host)), "{host}");
        }
        assert!(HostCheck::Any.allows(None));
    }

    #[test]
    fn listed_insecure_hosts_are_names_alone() {
        for name in ["sluice", "sluice-0.storage.internal", "a1.b2"] {
            assert!(check_insecure_host(name).is_ok(), "{name}");
        }
        for name in ["", "sluice:7070", "http://sluice", "*.internal", "-a.b", "a..b", "a b", &"a".repeat(64)] {
            assert!(check_insecure_host(name).is_err(), "{name:?}");
        }
    }

    #[test]
    fn a_grant_lifetime_is_cut_to_the_longest_allowed() {
        let hours = |h: u64| Some(std::time::Duration::from_secs(h * 3600));
        let open = policy();
        assert_eq!((open.grant_ttl(None), open.grant_ttl(hours(5))), (None, hours(5)));
        let capped = AccessPolicy { grant_ttl_max: hours(24), ..policy() };
        assert_eq!(capped.grant_ttl(None), hours(24));
        assert_eq!(capped.grant_ttl(hours(48)), hours(24));
        assert_eq!(capped.grant_ttl(hours(5)), hours(5));
    }

    /// Each credential gets its role, and each role exactly its calls.
    #[test]
    fn roles_are_decided_by_credential() {
        let p = policy();
        let none = |_: &str| None;
        let op = authenticate(&p, Some(b"Bearer operator-token-0123456789"), None, none);
        let prefix = crate::hex::encode(&blake3::hash(b"operator-token-0123456789").as_bytes()[..8]);
        assert_eq!(op, Caller::Operator(Operator::Token { blake3_prefix: prefix.clone() }));
        assert_eq!(op.to_string(), format!("operator token blake3:{prefix}"), "named by its hash, never itself");
        assert!(op.require_operator().is_ok() && op.require_reader_of("any").is_ok());

        let reader = authenticate(&p, Some(b"Bearer sluice_x"), None, |_| Some(grant(1, "a", None)));
        assert_eq!(reader.require_reader_of("a"), Ok(()));
        assert_eq!(reader.require_reader_of("b").map_err(|r| (r.status, r.code)), Err((403, "forbidden")));
        assert_eq!(reader.require_operator().map_err(|r| r.code), Err("forbidden"));

        let anon = authenticate(&p, None, None, none);
        assert_eq!(anon, Caller::Anonymous);
        assert_eq!(anon.require_operator().map_err(|r| (r.status, r.code)), Err((401, "unauthenticated")));
        assert_eq!(anon.require_reader_of("a").map_err(|r| r.code), Err("unauthenticated"));

        let wrong = authenticate(&p, Some(b"Bearer nope"), None, none);
        assert!(matches!(wrong, Caller::Invalid(_)));
        assert_eq!(wrong.require_operator().map_err(|r| r.status), Err(401));
        let malformed = authenticate(&p, Some(b"Basic abc"), None, none);
        assert!(matches!(malformed, Caller::Invalid(_)));

        let cert_op = authenticate(&p, None, Some("ops-alice"), none);
        assert_eq!(cert_op, Caller::Operator(Operator::Certificate { common_name: "ops-alice".into() }));
        assert_eq!(authenticate(&p, None, Some("mallory"), none), Caller::Anonymous);

        let scraper = authenticate(&p, Some(b"Bearer scraper-token-0123456789"), None, none);
        assert!(scraper.require_scraper().is_ok());
        assert_eq!(scraper.require_operator().map_err(|r| r.code), Err("forbidden"));
        assert_eq!(op.require_scraper(), Ok(()));
    }

    /// A grant bound to certificate X does not authenticate from Y or from
    /// no certificate, even with the right token.
    #[test]
    fn bound_grants_need_their_certificate() {
        let p = policy();
        let bound = || Some(grant(2, "a", Some("trainer-x")));
        assert!(matches!(authenticate(&p, Some(b"Bearer t"), Some("trainer-y"), |_| bound()), Caller::Invalid(_)));
        assert!(matches!(authenticate(&p, Some(b"Bearer t"), None, |_| bound()), Caller::Invalid(_)));
        assert!(matches!(authenticate(&p, Some(b"Bearer t"), Some("trainer-x"), |_| bound()), Caller::Reader { .. }));
    }

    #[test]
    fn insecure_nodes_check_nothing() {
        let p = AccessPolicy { insecure: true, ..AccessPolicy::default() };
        assert_eq!(authenticate(&p, None, None, |_| None), Caller::Unchecked);
    }

    /// Token files: plain tokens and blake3 hashes, comments, and a file
    /// others can read refused.
    #[test]
    fn token_files_are_private_and_parsed() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("tokens");
        let hash = blake3::hash(b"second-operator-token").to_hex();
        std::fs::write(&path, format!("# operators\nfirst-operator-token\n\nblake3:{hash}\n")).expect("write");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).expect("chmod");
        assert!(matches!(TokenSet::load(&path), Err(AuthSetupError::Exposed { .. })));
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).expect("chmod");
        let set = TokenSet::load(&path).expect("load");
        assert!(set.contains("first-operator-token") && set.contains("second-operator-token"));
        assert!(!set.contains("third") && !format!("{set:?}").contains("first"));

        std::fs::write(&path, "short\n").expect("write");
        assert!(matches!(TokenSet::load(&path), Err(AuthSetupError::Malformed { line: 1, .. })));
        std::fs::write(&path, "blake3:abcd\n").expect("write");
        assert!(matches!(TokenSet::load(&path), Err(AuthSetupError::Malformed { .. })));
        std::fs::write(&path, "# nothing\n").expect("write");
        assert!(matches!(TokenSet::load(&path), Err(AuthSetupError::Empty { .. })));
    }

    /// The first start makes admin.token 0600; later starts read it back.
    #[test]
    fn first_start_makes_a_private_token() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (first, path, created) = TokenSet::load_or_create(dir.path()).expect("create");
        assert!(created);
        assert_eq!(std::fs::metadata(&path).expect("stat").permissions().mode() & 0o777, 0o600);
        let token = std::fs::read_to_string(&path).expect("read");
        assert!(first.contains(token.trim()));
        let (again, _, created) = TokenSet::load_or_create(dir.path()).expect("load");
        assert!(!created && again.contains(token.trim()));
    }
}
