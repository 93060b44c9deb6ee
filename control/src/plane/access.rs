//! Who may call what, and grants: issue, look up by token, revoke.

use super::*;

/// Most grant-table refreshes a second that unknown tokens may cause.
const UNKNOWN_TOKEN_REFRESHES_PER_S_MAX: u32 = 8;

/// What this module owns of the plane: the access policy and this node's
/// copy of the grant table, and who hears of revocations.
pub(super) struct Access {
    /// Who may call what (operator tokens and certificates, `--insecure`).
    policy: RwLock<Arc<AccessPolicy>>,
    /// Grants by token hash, mirrored from the catalog.
    grants: RwLock<HashMap<String, GrantRecord>>,
    /// Bumped at every revocation; sessions re-check their grants.
    revocations: tokio::sync::watch::Sender<u64>,
    /// Grant-table refreshes made for unknown tokens (in a cluster) in the
    /// current one-second window, so a stream of bad tokens costs etcd at
    /// most [`UNKNOWN_TOKEN_REFRESHES_PER_S_MAX`] reads a second.
    unknown_token_refreshes: Mutex<(std::time::Instant, u32)>,
    /// Where the control API's audit records go.
    audit: RwLock<Arc<crate::audit::AuditLog>>,
}

impl Access {
    /// No grants yet (the plane loads the catalog's once it recovered),
    /// the default policy.
    pub(super) fn new() -> Self {
        Self {
            policy: RwLock::new(Arc::new(AccessPolicy::default())),
            grants: RwLock::new(HashMap::new()),
            revocations: tokio::sync::watch::Sender::new(0),
            unknown_token_refreshes: Mutex::new((std::time::Instant::now(), 0)),
            audit: RwLock::new(Arc::new(crate::audit::AuditLog::log_only())),
        }
    }

    /// Told of every revocation (the epoch it bumps).
    pub(super) fn revocations(&self) -> tokio::sync::watch::Receiver<u64> {
        self.revocations.subscribe()
    }

    /// The ids of the grants of dataset `dataset_id`.
    pub(super) fn grants_of(&self, dataset_id: u64) -> Vec<u64> {
        let grants = self.grants.read();
        grants.map(|g| g.values().filter(|g| g.dataset_id == dataset_id).map(|g| g.id).collect()).unwrap_or_default()
    }

    /// How many grants stand.
    pub(super) fn grant_count(&self) -> usize {
        self.grants.read().map(|g| g.len()).unwrap_or(0)
    }

    /// Takes the catalog's table as this node's; sessions hear of any
    /// grant it no longer has.
    pub(super) fn replace_grants(&self, fresh: Vec<GrantRecord>) {
        let fresh: HashMap<String, GrantRecord> = fresh.into_iter().map(|g| (g.token_hash.clone(), g)).collect();
        let Ok(mut map) = self.grants.write() else { return };
        let revoked = map.keys().any(|hash| !fresh.contains_key(hash));
        *map = fresh;
        drop(map);
        if revoked {
            self.revoked();
        }
    }

    fn revoked(&self) {
        self.revocations.send_modify(|epoch| *epoch += 1);
    }

    /// Whether an unknown token may refresh the table now (a few a second).
    fn unknown_token_refresh_due(&self) -> bool {
        self.unknown_token_refreshes.lock().is_ok_and(|mut window| {
            if window.0.elapsed() >= std::time::Duration::from_secs(1) {
                *window = (std::time::Instant::now(), 0);
            }
            window.1 += 1;
            window.1 <= UNKNOWN_TOKEN_REFRESHES_PER_S_MAX
        })
    }
}

impl ControlPlane {
    /// Who may call what. With `insecure`, every client that reaches the
    /// data port reads every sealed dataset and the control API checks no
    /// credential: for local development; the node says so.
    pub fn set_access(&self, policy: AccessPolicy) {
        if let Ok(mut access) = self.access.policy.write() {
            *access = Arc::new(policy);
        }
    }

    /// Where the control API's audit records go besides the node's log.
    pub fn set_audit(&self, audit: crate::audit::AuditLog) {
        if let Ok(mut current) = self.access.audit.write() {
            *current = Arc::new(audit);
        }
    }

    pub fn audit(&self) -> Arc<crate::audit::AuditLog> {
        self.access.audit.read().map(|a| Arc::clone(&a)).unwrap_or_default()
    }

    pub fn access(&self) -> Arc<AccessPolicy> {
        self.access.policy.read().map(|a| Arc::clone(&a)).unwrap_or_default()
    }

    pub fn insecure(&self) -> bool {
        self.access().insecure
    }

    /// The live grant `token` is, if any. In a cluster a token unknown here
    /// may have been issued on another node: the table is refreshed, a
    /// bounded number of times a second for unknown tokens.
    pub fn grant_for_token(&self, token: &str) -> Option<GrantRecord> {
        let hash = grants::token_hash(token);
        let lookup = || self.access.grants.read().ok().and_then(|g| g.get(&hash).cloned());
        if let Some(grant) = lookup() {
            return Some(grant);
        }
        if self.cluster.etcd().is_none() || !token.starts_with(grants::TOKEN_PREFIX) {
            return None;
        }
        if self.access.unknown_token_refresh_due() {
            self.refresh_grants();
        }
        lookup()
    }

    /// Issues a grant of `dataset` to `client`, optionally bound to the
    /// client certificate named `cert_name` and ending `ttl` from now; the
    /// answer carries the token, which the node does not keep and cannot
    /// show again.
    pub fn issue_grant(
        &self,
        dataset: &str,
        client: &str,
        cert_name: Option<&str>,
        ttl: Option<std::time::Duration>,
    ) -> Result<GrantView, ControlError> {
        if let Some(ttl) = ttl.filter(|ttl| !sluice_proto::api::grant_ttl_in_bounds(*ttl)) {
            return Err(ControlError::BadGrant(format!(
                "a grant's lifetime of {ttl:?}: from 1 s to {} s (ten years)",
                sluice_proto::api::GRANT_TTL_S_MAX
            )));
        }
        if !grants::valid_client(client) {
            return Err(ControlError::BadGrant(format!(
                "invalid client identity {client:?}: 1-{} printable characters, no spaces",
                grants::CLIENT_BYTES_MAX
            )));
        }
        if let Some(name) = cert_name.filter(|n| !grants::valid_client(n)) {
            return Err(ControlError::BadGrant(format!(
                "invalid certificate name {name:?}: 1-{} printable characters, no spaces",
                grants::CLIENT_BYTES_MAX
            )));
        }
        let record = self.catalog.require(dataset)?;
        if record.state == DatasetState::Deleting {
            return Err(ControlError::State {
                name: dataset.into(),
                state: record.state,
                action: "granting",
                needed: "not being deleted",
            });
        }
        let token = grants::new_token();
        let created_unix_ms = now_unix_ms();
        let expires_unix_ms = ttl.map(|ttl| created_unix_ms.saturating_add(ttl.as_millis() as u64));
        let grant = self.catalog.add_grant(&mut |id| GrantRecord {
            id,
            client: client.to_string(),
            dataset: record.name.clone(),
            dataset_id: record.id,
            token_hash: grants::token_hash(&token),
            created_unix_ms,
            cert_name: cert_name.map(str::to_string),
            expires_unix_ms,
        })?;
        tracing::info!(grant = grant.id, client, dataset, "grant issued");
        let mut view = GrantView::from(&grant);
        view.token = Some(sluice_proto::codec::Secret::new(token));
        if let Ok(mut map) = self.access.grants.write() {
            map.insert(grant.token_hash.clone(), grant);
        }
        Ok(view)
    }

    pub fn list_grants(&self) -> Vec<GrantView> {
        let mut views: Vec<GrantView> =
            self.access.grants.read().map(|g| g.values().map(GrantView::from).collect()).unwrap_or_default();
        views.sort_by_key(|v| v.id);
        views
    }

    /// Revokes a grant: new opens with its token fail from now on, and the
    /// sessions opened with it are closed.
    pub fn revoke_grant(&self, id: u64) -> Result<(), ControlError> {
        let existed = self.catalog.remove_grant(id)?;
        // Gone from the catalog either way; in a cluster this node's copy
        // of the table may still hold one revoked elsewhere: drop it, and
        // close its sessions, all the same.
        let held = self.access.grants.write().map(|mut map| {
            let before = map.len();
            map.retain(|_, g| g.id != id);
            map.len() != before
        });
        if existed || held.unwrap_or(false) {
            self.access.revoked();
        }
        if !existed {
            return Err(ControlError::UnknownGrant(id));
        }
        tracing::info!(grant = id, "grant revoked");
        Ok(())
    }

    /// Whether grant `id` still stands: not revoked, not past its end.
    pub fn grant_live(&self, id: u64) -> bool {
        let now = now_unix_ms();
        self.access.grants.read().is_ok_and(|g| g.values().any(|g| g.id == id && !g.expired(now)))
    }

    /// Ends the grants past their end: dropped from this node's table and
    /// the catalog, their sessions closed as on a revocation. Run once a
    /// second; a grant is refused from its end on whether or not this ran
    /// (every check compares the end with the clock).
    pub fn expire_grants(&self) {
        let now = now_unix_ms();
        // Looked at under the read lock: opens check grants meanwhile.
        let any_ended = self.access.grants.read().is_ok_and(|map| map.values().any(|g| g.expired(now)));
        if !any_ended {
            return;
        }
        let Ok(mut map) = self.access.grants.write() else { return };
        let ended: Vec<u64> = map.values().filter(|g| g.expired(now)).map(|g| g.id).collect();
        map.retain(|_, g| !g.expired(now));
        drop(map);
        self.access.revoked();
        for id in ended {
            // In a cluster every node may try; the first removes it.
            match self.catalog.remove_grant(id) {
                Ok(_) => tracing::info!(grant = id, "grant ended"),
                Err(err) => tracing::warn!(grant = id, "removing an ended grant from the catalog: {err}"),
            }
        }
    }

    /// The grant `token` gives for `dataset` (checked against the dataset's
    /// id, not only its name), or why there is none. An unknown dataset
    /// and one the grant does not cover get the same answer, so a grant
    /// holder cannot probe which names exist. A refusal leaves an audit
    /// record, as one on the control API does.
    pub(super) fn check_grant(
        &self,
        dataset: &str,
        token: Option<&str>,
        peer: &Peer,
    ) -> Result<Option<u64>, OpenError> {
        if self.insecure() {
            return Ok(None);
        }
        self.grant_decision(dataset, token, peer.cert_name.as_deref()).map_err(|(caller, message)| {
            crate::audit::AuditedCall::begin(
                self.audit(),
                caller.to_string(),
                peer.addr.map(|addr| addr.to_string()),
                crate::audit::DATA_PORT_OPEN,
                dataset,
            )
            .refused(403, &message);
            OpenError { code: ErrorCode::AccessDenied, message }
        })
    }

    /// [`Self::check_grant`]'s decision: the grant, or who was refused (as
    /// an audit record names them) and why.
    fn grant_decision(
        &self,
        dataset: &str,
        token: Option<&str>,
        cert_name: Option<&str>,
    ) -> Result<Option<u64>, (crate::auth::Caller, String)> {
        use crate::auth::Caller;
        let Some(token) = token else {
            return Err((
                Caller::Anonymous,
                format!(
                    "reading {dataset} needs a grant: this node checks access (issue one with \
                     `sluicectl grant create {dataset} --client ID` and pass its token, e.g. SLUICE_TOKEN)"
                ),
            ));
        };
        let Some(grant) = self.grant_for_token(token) else {
            return Err((
                Caller::Invalid(String::new()),
                format!("the token given for {dataset} is not a grant on this node (revoked or never issued)"),
            ));
        };
        let holder =
            || Caller::Reader { grant: grant.id, dataset: grant.dataset.clone(), dataset_id: grant.dataset_id };
        if grant.expired(now_unix_ms()) {
            return Err((holder(), format!("the grant given for {dataset} has ended: ask for a new one")));
        }
        if let Some(bound) = grant.cert_name.as_deref().filter(|bound| cert_name != Some(*bound)) {
            return Err((
                holder(),
                format!(
                    "this grant is bound to the client certificate {bound:?}; connect over TLS with that certificate"
                ),
            ));
        }
        let covered = self.catalog.get(dataset).ok().flatten().is_some_and(|record| record.id == grant.dataset_id);
        if !covered {
            return Err((holder(), format!("this grant does not cover a dataset named {dataset:?}")));
        }
        tracing::debug!(grant = grant.id, client = grant.client, dataset, "open granted");
        Ok(Some(grant.id))
    }
}
