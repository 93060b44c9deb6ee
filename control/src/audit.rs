//! The audit trail of the control API and the data port: who changed
//! what or was refused what, when, from where, and what came of it, as a
//! security reviewer asks of any control plane (the Kubernetes API
//! server's audit log, etcd's request log).
//!
//! Every call that changes something (any method but GET and HEAD) and
//! every refused call (401, 403) makes one record, after its answer: the
//! caller as [`Caller`](crate::auth::Caller)'s `Display` names them (an operator by the blake3
//! prefix of their token or their certificate's CN, a grant by its id,
//! never a credential), the peer's address, the method, the path as sent
//! (no query string), the status and how long it took. Reads are not
//! recorded: readers read chunks and indexes all day. A change that got
//! no answer (its client went away mid-call, or it ran past the API's
//! time limit) is still recorded, with status 0, since what it did may
//! stand ([`AuditedCall`]'s drop).
//!
//! The data port's refusals are recorded the same way: an `Open` refused
//! for want of a grant that covers it (no token, a token that is no
//! grant, an ended grant, a bound grant without its certificate, another
//! dataset) is a record with method [`DATA_PORT_OPEN`], the dataset name
//! asked for as its path, and status 403. Opens granted are reads, and
//! are not recorded.
//!
//! A refusal's record says why (`reason`, the message the caller got,
//! which holds no credential). Refusals come from anyone who reaches a
//! port, so they are bounded: at most [`REFUSALS_RECORDED_PER_S_MAX`] a
//! second are recorded, and the number passed over is logged and carried
//! by the next record (`refusals_not_recorded`). A refused call changed
//! nothing; every other change is recorded.
//!
//! Records go to the node's log (target `sluice::audit`, level info) and,
//! with `audit_log = PATH`, as JSON lines appended to that file (0600,
//! opened at start, before privileges drop). The file is rotated as
//! logrotate does by default: moved away (or removed), the next record
//! makes a new one at `PATH` (`AuditFile`), so no record falls between
//! a copy and a truncate. A record that cannot be written is an error in
//! the log; the call it records is not undone.

use std::fs::File;
use std::io::Write;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::Serialize;

/// The method of a data-port `Open`'s record (no HTTP method is spelled so).
pub const DATA_PORT_OPEN: &str = "OPEN";

/// Most refusals recorded a second; the rest are counted.
pub const REFUSALS_RECORDED_PER_S_MAX: u32 = 100;

/// Most bytes of a path or a reason a record keeps: a client names what
/// it asks for, and a data-port name may be as long as a control frame.
pub const TEXT_BYTES_MAX: usize = 512;

/// `text`, cut at a character boundary to at most [`TEXT_BYTES_MAX`]
/// bytes and marked `…` where cut.
fn clipped(text: &str) -> std::borrow::Cow<'_, str> {
    if text.len() <= TEXT_BYTES_MAX {
        return text.into();
    }
    let mut end = TEXT_BYTES_MAX - '…'.len_utf8();
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &text[..end]).into()
}

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
    /// Why a call was refused, as its caller was told.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<&'a str>,
    /// Refusals passed over since the record before this one, if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub refusals_not_recorded: Option<u64>,
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
            path: clipped(path).into_owned(),
            started: Instant::now(),
            recorded: false,
        }
    }

    /// The call was answered with `status`: recorded if [`audited`].
    pub fn answered(self, status: u16) {
        self.answered_because(status, None);
    }

    /// The call was refused with `status` (401 or 403), for `reason`.
    pub fn refused(self, status: u16, reason: &str) {
        debug_assert!(is_refusal(status), "{status} is not a refusal");
        self.answered_because(status, Some(reason));
    }

    fn answered_because(mut self, status: u16, reason: Option<&str>) {
        if audited(&self.method, status) {
            self.record(status, reason.map(clipped).as_deref());
        }
        self.recorded = true;
    }

    fn record(&self, status: u16, reason: Option<&str>) {
        self.log.record(AuditRecord {
            unix_ms: crate::plane::now_unix_ms(),
            caller: self.caller.clone(),
            remote: self.remote.clone(),
            method: &self.method,
            path: &self.path,
            status,
            millis: self.started.elapsed().as_millis() as u64,
            reason,
            refusals_not_recorded: None,
        });
    }
}

impl Drop for AuditedCall {
    fn drop(&mut self) {
        if !self.recorded && changes(&self.method) {
            self.record(0, None);
        }
    }
}

/// Whether a call with this method may change something.
fn changes(method: &str) -> bool {
    !matches!(method, "GET" | "HEAD")
}

fn is_refusal(status: u16) -> bool {
    status == 401 || status == 403
}

/// Whether a call with this method and answer is recorded.
pub fn audited(method: &str, status: u16) -> bool {
    changes(method) || is_refusal(status)
}

/// Where records go besides the node's log, and the bound on refusals.
#[derive(Debug, Default)]
pub struct AuditLog {
    file: Option<Mutex<AuditFile>>,
    refusals: Mutex<RefusalBudget>,
}

/// The audit file, made again at its path when it was moved or removed.
#[derive(Debug)]
struct AuditFile {
    path: PathBuf,
    file: File,
    /// The open file's device and inode: another at the path means it was
    /// rotated.
    identity: (u64, u64),
    /// Whether the failure to make the file again has been logged (once,
    /// until it succeeds: records meanwhile go on into the moved file).
    reopen_failure_logged: bool,
}

impl AuditFile {
    /// Opens `path` for appending, made 0600 if new; a file others can
    /// read is refused, as the token files are. With its identity.
    fn open(path: &Path) -> Result<(File, (u64, u64)), String> {
        let file = std::fs::OpenOptions::new()
            .append(true)
            .create(true)
            .mode(0o600)
            .open(path)
            .map_err(|e| format!("audit log {}: {e}", path.display()))?;
        let meta = file.metadata().map_err(|e| format!("audit log {}: {e}", path.display()))?;
        let mode = std::os::unix::fs::PermissionsExt::mode(&meta.permissions());
        if mode & 0o077 != 0 {
            return Err(format!(
                "audit log {} is readable by others (mode {:o}): chmod 600 it",
                path.display(),
                mode & 0o777
            ));
        }
        Ok((file, (meta.dev(), meta.ino())))
    }

    /// The file at the path now: the one open, or a new one if the open
    /// one was moved away or removed (rotated).
    fn current(&mut self) -> &mut File {
        let rotated =
            std::fs::metadata(&self.path).map_or(true, |at_path| (at_path.dev(), at_path.ino()) != self.identity);
        if rotated {
            match Self::open(&self.path) {
                Ok((file, identity)) => {
                    (self.file, self.identity) = (file, identity);
                    self.reopen_failure_logged = false;
                    tracing::info!(target: "sluice::audit", "audit log {} rotated: writing a new one", self.path.display());
                }
                Err(err) if !self.reopen_failure_logged => {
                    self.reopen_failure_logged = true;
                    tracing::error!(
                        "the audit log was moved but cannot be made again ({err}); records go on into the moved \
                         file (with --user, the node's user must be able to create files in its directory)"
                    );
                }
                Err(_) => {}
            }
        }
        &mut self.file
    }
}

/// The refusals of the current one-second window, and those passed over.
#[derive(Debug, Default)]
struct RefusalBudget {
    window_started: Option<Instant>,
    recorded_in_window: u32,
    passed_over: u64,
}

impl RefusalBudget {
    /// Whether a refusal at `now` is recorded; counts it otherwise.
    fn admit(&mut self, now: Instant) -> bool {
        if self.window_started.is_none_or(|started| now.duration_since(started) >= Duration::from_secs(1)) {
            self.window_started = Some(now);
            self.recorded_in_window = 0;
        }
        if self.recorded_in_window < REFUSALS_RECORDED_PER_S_MAX {
            self.recorded_in_window += 1;
            return true;
        }
        if self.passed_over == 0 {
            tracing::warn!(
                target: "sluice::audit",
                "more than {REFUSALS_RECORDED_PER_S_MAX} refusals a second: the rest are counted, not recorded"
            );
        }
        self.passed_over += 1;
        false
    }

    /// The refusals passed over since the last record, now told.
    fn take_passed_over(&mut self) -> Option<u64> {
        Some(std::mem::take(&mut self.passed_over)).filter(|&n| n > 0)
    }
}

impl AuditLog {
    /// Records to the node's log only.
    pub fn log_only() -> Self {
        Self::default()
    }

    /// Records also appended to `path`, made 0600 if new; an existing file
    /// others can read is refused, as the token files are.
    pub fn open(path: &Path) -> Result<Self, String> {
        let (file, identity) = AuditFile::open(path)?;
        let file = AuditFile { path: path.to_path_buf(), file, identity, reopen_failure_logged: false };
        Ok(Self { file: Some(Mutex::new(file)), refusals: Mutex::default() })
    }

    /// Records `record`, unless it is a refusal past this second's
    /// [`REFUSALS_RECORDED_PER_S_MAX`].
    pub fn record(&self, mut record: AuditRecord<'_>) {
        if let Ok(mut refusals) = self.refusals.lock() {
            if is_refusal(record.status) && !refusals.admit(Instant::now()) {
                return;
            }
            record.refusals_not_recorded = refusals.take_passed_over();
        }
        tracing::info!(
            target: "sluice::audit",
            caller = %record.caller,
            remote = record.remote.as_deref().unwrap_or("-"),
            method = record.method,
            path = record.path,
            status = record.status,
            millis = record.millis,
            reason = record.reason.unwrap_or("-"),
            refusals_not_recorded = record.refusals_not_recorded.unwrap_or(0),
            "audited call"
        );
        let Some(file) = &self.file else { return };
        let mut line = match serde_json::to_vec(&record) {
            Ok(line) => line,
            Err(err) => return tracing::error!("audit record: {err}"),
        };
        line.push(b'\n');
        // One write of the whole line on an O_APPEND file: records never
        // interleave, whatever the number of calls at once.
        let Ok(mut file) = file.lock() else { return tracing::error!("the audit log's lock is poisoned") };
        if let Err(err) = file.current().write_all(&line) {
            tracing::error!("writing the audit log {}: {err}", file.path.display());
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
            log.record(AuditRecord {
                unix_ms: 1,
                caller: "operator token blake3:0011223344556677".into(),
                remote: Some("127.0.0.1:5000".into()),
                method: "POST",
                path: "/v1/datasets",
                status,
                millis: 2,
                reason: (status == 403).then_some("this call is for operators"),
                refusals_not_recorded: None,
            });
        }
        drop(log);
        let text = std::fs::read_to_string(&path).expect("read");
        let lines: Vec<serde_json::Value> = text.lines().map(|l| serde_json::from_str(l).expect("json")).collect();
        assert_eq!(lines.len(), 2);
        assert_eq!(lines[1]["status"], 403);
        assert_eq!(lines[1]["reason"], "this call is for operators");
        assert!(lines[0].get("reason").is_none() && lines[0].get("refusals_not_recorded").is_none());
        let mode = std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(&path).expect("meta").permissions());
        assert_eq!(mode & 0o777, 0o600);
        AuditLog::open(&path).expect("reopened, appended to");

        std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o644)).expect("chmod");
        let err = AuditLog::open(&path).expect_err("readable by others");
        assert!(err.contains("chmod 600"), "{err}");
    }

    /// Moved away or removed, as logrotate does, the file is made again
    /// at its path (private) by the next record; the moved one keeps what
    /// was written before.
    #[test]
    fn a_rotated_file_is_made_again_at_its_path() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("audit.jsonl");
        let log = Arc::new(AuditLog::open(&path).expect("open"));
        let change = |path: &str| AuditedCall::begin(Arc::clone(&log), "anonymous".into(), None, "POST", path);
        change("/v1/first").answered(201);
        std::fs::rename(&path, dir.path().join("audit.jsonl.1")).expect("rotate");
        change("/v1/second").answered(201);
        std::fs::remove_file(&path).expect("remove");
        change("/v1/third").answered(201);
        let read = |name: &str| std::fs::read_to_string(dir.path().join(name)).expect("read");
        assert!(read("audit.jsonl.1").contains("/v1/first") && !read("audit.jsonl.1").contains("/v1/second"));
        assert!(read("audit.jsonl").contains("/v1/third") && !read("audit.jsonl").contains("/v1/first"));
        let mode = std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(&path).expect("meta").permissions());
        assert_eq!(mode & 0o777, 0o600);
    }

    #[test]
    fn long_text_is_clipped_at_a_character_boundary() {
        assert_eq!(clipped("short"), "short");
        let long = "é".repeat(TEXT_BYTES_MAX);
        let cut = clipped(&long);
        assert!(cut.len() <= TEXT_BYTES_MAX && cut.ends_with('…') && cut.starts_with("éé"), "{cut}");
    }

    /// A second holds at most the budget of refusals; the rest are counted
    /// and told by the next record; a new second starts a new budget.
    #[test]
    fn refusals_past_the_budget_are_counted_and_told_by_the_next_record() {
        let mut budget = RefusalBudget::default();
        let start = Instant::now();
        let admitted = (0..REFUSALS_RECORDED_PER_S_MAX + 5).filter(|_| budget.admit(start)).count();
        assert_eq!(admitted, REFUSALS_RECORDED_PER_S_MAX as usize);
        assert!(!budget.admit(start + Duration::from_millis(999)), "still the same second");
        assert!(budget.admit(start + Duration::from_secs(1)), "a new second");
        assert_eq!(budget.take_passed_over(), Some(6));
        assert_eq!(budget.take_passed_over(), None, "told once");

        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("audit.jsonl");
        let log = Arc::new(AuditLog::open(&path).expect("open"));
        let call = |method: &str| AuditedCall::begin(Arc::clone(&log), "anonymous".into(), None, method, "/v1/x");
        for _ in 0..REFUSALS_RECORDED_PER_S_MAX + 3 {
            call(DATA_PORT_OPEN).refused(403, "no grant");
        }
        call("POST").answered(201);
        let text = std::fs::read_to_string(&path).expect("read");
        let lines: Vec<serde_json::Value> = text.lines().map(|l| serde_json::from_str(l).expect("json")).collect();
        assert_eq!(lines.len(), REFUSALS_RECORDED_PER_S_MAX as usize + 1, "{text}");
        let last = lines.last().expect("the change");
        assert_eq!((last["status"].as_u64(), last["refusals_not_recorded"].as_u64()), (Some(201), Some(3)));
        assert_eq!((lines[0]["method"].as_str(), lines[0]["reason"].as_str()), (Some("OPEN"), Some("no grant")));
    }
}
