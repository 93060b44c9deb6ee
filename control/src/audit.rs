//! The control API's audit trail: who changed what, when, from where, and
//! what came of it, as a security reviewer asks of any control plane (the
//! Kubernetes API server's audit log, etcd's request log).
//!
//! Every call that changes something (any method but GET and HEAD) and
//! every refused call (401, 403) makes one record, after its answer: the
//! caller as [`Caller`]'s `Display` names them (an operator by the blake3
//! prefix of their token or their certificate's CN, a grant by its id,
//! never a credential), the peer's address, the method, the path as sent
//! (no query string), the status and how long it took. Reads are not
//! recorded: readers read chunks and indexes all day. A change that got
//! no answer (its client went away mid-call, or it ran past the API's
//! time limit) is still recorded, with status 0, since what it did may
//! stand ([`AuditedCall`]'s drop).
//!
//! Records go to the node's log (target `sluice::audit`, level info) and,
//! with `audit_log = PATH`, as JSON lines appended to that file (0600,
//! opened at start, before privileges drop; rotate it by copy and
//! truncate). A record that cannot be written is an error in the log; the
//! call it records is not undone.

use std::fs::File;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use serde::Serialize;

/// One audited call.
#[derive(Debug, Serialize)]
pub struct AuditRecord<'a> {
    pub unix_ms: u64,
    pub caller: String,
    pub remote: Option<String>,
    pub method: &'a str,
    pub path: &'a str,
    pub status: u16,
    pub millis: u64,
}

/// One call on its way: recorded once answered ([`AuditedCall::answered`])
/// or, for a change, when dropped without an answer.
pub struct AuditedCall {
    log: Arc<AuditLog>,
    caller: String,
    remote: Option<String>,
    method: String,
    path: String,
    started: Instant,
    recorded: bool,
}

impl AuditedCall {
    pub fn begin(log: Arc<AuditLog>, caller: String, remote: Option<String>, method: &str, path: &str) -> Self {
        Self {
            log,
            caller,
            remote,
            method: method.to_string(),
            path: path.to_string(),
            started: Instant::now(),
            recorded: false,
        }
    }

    /// The call was answered with `status`: recorded if [`audited`].
    pub fn answered(mut self, status: u16) {
        if audited(&self.method, status) {
            self.record(status);
        }
        self.recorded = true;
    }

    fn record(&self, status: u16) {
        self.log.record(&AuditRecord {
            unix_ms: crate::plane::now_unix_ms(),
            caller: self.caller.clone(),
            remote: self.remote.clone(),
            method: &self.method,
            path: &self.path,
            status,
            millis: self.started.elapsed().as_millis() as u64,
        });
    }
}

impl Drop for AuditedCall {
    fn drop(&mut self) {
        if !self.recorded && changes(&self.method) {
            self.record(0);
        }
    }
}

/// Whether a call with this method may change something.
fn changes(method: &str) -> bool {
    !matches!(method, "GET" | "HEAD")
}

/// Whether a call with this method and answer is recorded.
pub fn audited(method: &str, status: u16) -> bool {
    changes(method) || status == 401 || status == 403
}

/// Where records go besides the node's log.
#[derive(Debug, Default)]
pub struct AuditLog {
    file: Option<(PathBuf, Mutex<File>)>,
}

impl AuditLog {
    /// Records to the node's log only.
    pub fn log_only() -> Self {
        Self::default()
    }

    /// Records also appended to `path`, made 0600 if new; an existing file
    /// others can read is refused, as the token files are.
    pub fn open(path: &Path) -> Result<Self, String> {
        let file = std::fs::OpenOptions::new()
            .append(true)
            .create(true)
            .mode(0o600)
            .open(path)
            .map_err(|e| format!("audit log {}: {e}", path.display()))?;
        let mode = file.metadata().map_err(|e| format!("audit log {}: {e}", path.display()))?.permissions();
        let mode = std::os::unix::fs::PermissionsExt::mode(&mode);
        if mode & 0o077 != 0 {
            return Err(format!(
                "audit log {} is readable by others (mode {:o}): chmod 600 it",
                path.display(),
                mode & 0o777
            ));
        }
        Ok(Self { file: Some((path.to_path_buf(), Mutex::new(file))) })
    }

    pub fn record(&self, record: &AuditRecord<'_>) {
        tracing::info!(
            target: "sluice::audit",
            caller = %record.caller,
            remote = record.remote.as_deref().unwrap_or("-"),
            method = record.method,
            path = record.path,
            status = record.status,
            millis = record.millis,
            "control API call"
        );
        let Some((path, file)) = &self.file else { return };
        let mut line = match serde_json::to_vec(record) {
            Ok(line) => line,
            Err(err) => return tracing::error!("audit record: {err}"),
        };
        line.push(b'\n');
        // One write of the whole line on an O_APPEND file: records never
        // interleave, whatever the number of calls at once.
        let written = file
            .lock()
            .map_err(|_| "poisoned".to_string())
            .and_then(|mut f| f.write_all(&line).map_err(|e| e.to_string()));
        if let Err(err) = written {
            tracing::error!("writing the audit log {}: {err}", path.display());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn changes_and_refusals_are_audited_reads_are_not() {
        assert!(audited("POST", 200) && audited("DELETE", 404) && audited("PUT", 500));
        assert!(audited("GET", 401) && audited("GET", 403));
        assert!(!audited("GET", 200) && !audited("GET", 404) && !audited("HEAD", 200));
    }

    /// A change answered is recorded with its status; one dropped without
    /// an answer, with status 0; a read answered or dropped, not at all.
    #[test]
    fn a_change_that_got_no_answer_is_recorded_all_the_same() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("audit.jsonl");
        let log = Arc::new(AuditLog::open(&path).expect("open"));
        let call = |method: &str| AuditedCall::begin(Arc::clone(&log), "anonymous".into(), None, method, "/v1/x");
        call("DELETE").answered(204);
        drop(call("DELETE"));
        call("GET").answered(200);
        drop(call("GET"));
        let text = std::fs::read_to_string(&path).expect("read");
        let statuses: Vec<u64> = text
            .lines()
            .map(|l| serde_json::from_str::<serde_json::Value>(l).expect("json")["status"].as_u64().expect("status"))
            .collect();
        assert_eq!(statuses, [204, 0], "{text}");
    }

    #[test]
    fn records_append_as_json_lines_to_a_private_file() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("audit.jsonl");
        let log = AuditLog::open(&path).expect("open");
        for status in [201, 403] {
            log.record(&AuditRecord {
                unix_ms: 1,
                caller: "operator token blake3:0011223344556677".into(),
                remote: Some("127.0.0.1:5000".into()),
                method: "POST",
                path: "/v1/datasets",
                status,
                millis: 2,
            });
        }
        drop(log);
        let text = std::fs::read_to_string(&path).expect("read");
        let lines: Vec<serde_json::Value> = text.lines().map(|l| serde_json::from_str(l).expect("json")).collect();
        assert_eq!(lines.len(), 2);
        assert_eq!(lines[1]["status"], 403);
        let mode = std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(&path).expect("meta").permissions());
        assert_eq!(mode & 0o777, 0o600);
        AuditLog::open(&path).expect("reopened, appended to");

        std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o644)).expect("chmod");
        let err = AuditLog::open(&path).expect_err("readable by others");
        assert!(err.contains("chmod 600"), "{err}");
    }
}
