//! The token files a node's access policy came from, followed as they
//! change: an operator token (or a scraper's) is added or revoked by
//! editing its file, on a running node, as an etcd user or a Kubernetes
//! service account is revoked without restarting the server. A leaked
//! operator token must not outlive the edit that removes it by more than
//! a second.
//!
//! Once a second ([`follow`], which the node runs on its control runtime)
//! the files are read again through the same checks as at start
//! ([`TokenSet::load`]: private mode, well-formed lines, at least one
//! token). A set that loads and differs from the one in use replaces it
//! for every call from then on. A file that does not load (made readable
//! by others, a malformed line, emptied, removed, half written) is logged
//! once per distinct error and the set in use stays: an edit gone wrong
//! never locks every operator out, and never lets anyone in.

use std::path::PathBuf;
use std::sync::Arc;

use crate::auth::{AccessPolicy, TokenSet};
use crate::ControlPlane;

/// Where the operator tokens (and the scraper's, if any) are read from.
#[derive(Debug)]
pub struct TokenFiles {
    operators: PathBuf,
    metrics: Option<PathBuf>,
    /// The last error logged, so a file left broken is not logged anew
    /// every second.
    last_error: Option<String>,
}

impl TokenFiles {
    pub fn new(operators: PathBuf, metrics: Option<PathBuf>) -> Self {
        Self { operators, metrics, last_error: None }
    }

    /// Reads the files and, if they load and say something new, makes
    /// them the plane's tokens.
    pub fn follow(&mut self, control: &ControlPlane) {
        let loaded = TokenSet::load(&self.operators).and_then(|operators| {
            let metrics = self.metrics.as_deref().map(TokenSet::load).transpose()?;
            Ok((operators, metrics))
        });
        let (operators, metrics) = match loaded {
            Ok(sets) => sets,
            Err(err) => {
                let err = err.to_string();
                if self.last_error.as_ref() != Some(&err) {
                    tracing::warn!(
                        "reading the token files again: {err}; the tokens in use stay until the files load \
                         (with --user, the node's user must be able to read them)"
                    );
                    self.last_error = Some(err);
                }
                return;
            }
        };
        self.last_error = None;
        let current = control.access();
        if current.operator_tokens == operators && current.metrics_tokens == metrics {
            return;
        }
        let changed = |before: usize, after: usize| format!("{before} → {after}");
        tracing::info!(
            operators = changed(current.operator_tokens.len(), operators.len()),
            scrapers = changed(
                current.metrics_tokens.as_ref().map_or(0, TokenSet::len),
                metrics.as_ref().map_or(0, TokenSet::len)
            ),
            "token files changed: using the tokens they list now"
        );
        control.set_access(AccessPolicy {
            operator_tokens: operators,
            metrics_tokens: metrics,
            ..AccessPolicy::clone(&current)
        });
    }
}

/// Follows `files` once a second until `shutdown`.
pub async fn follow(
    control: Arc<ControlPlane>,
    mut files: TokenFiles,
    mut shutdown: tokio::sync::watch::Receiver<bool>,
) {
    let mut tick = tokio::time::interval(std::time::Duration::from_secs(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = shutdown.changed() => return,
        }
        let reading = Arc::clone(&control);
        files = match tokio::task::spawn_blocking(move || {
            files.follow(&reading);
            files
        })
        .await
        {
            Ok(files) => files,
            Err(err) => return tracing::error!("following the token files: {err}"),
        };
    }
}
