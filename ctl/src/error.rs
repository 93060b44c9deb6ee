//! What can go wrong in a `sluicectl` command, and the exit code each
//! gives, so scripts can tell a refusal from an outage from a bad file.

use std::fmt::Display;
use std::path::Path;
use std::process::ExitCode;

use sluice_client::http::ApiFailure;
use sluice_client::ClientError;

/// `--help`'s table of exit codes (clap prints it after the options).
pub const EXIT_CODES_HELP: &str = "\
Exit codes:
  0  done
  1  the command ran and found a problem: a bad chunk, a range that did not read, a checksum mismatch
  2  usage: arguments that do not fit together or do not fit the dataset
  3  the node refused the request (unknown dataset, no grant or token, a conflict)
  4  the node could not be reached or failed (connection, TLS, transport, a 5xx)
  5  a local file could not be read or written (stdout too)
141  stdout's reader went away (`sluicectl dataset ls | head`), as for any tool SIGPIPE ends";

#[derive(Debug, thiserror::Error)]
pub enum CtlError {
    /// Exit 1.
    #[error("{0}")]
    Failed(String),
    /// Exit 2.
    #[error("{0}")]
    Usage(String),
    /// Exit 3.
    #[error("{0}")]
    Refused(String),
    /// Exit 4.
    #[error("{0}")]
    Unavailable(String),
    /// Exit 5.
    #[error("{0}")]
    Local(String),
}

pub type Result<T> = std::result::Result<T, CtlError>;

impl CtlError {
    pub fn exit_code(&self) -> ExitCode {
        ExitCode::from(match self {
            Self::Failed(_) => 1,
            Self::Usage(_) => 2,
            Self::Refused(_) => 3,
            Self::Unavailable(_) => 4,
            Self::Local(_) => 5,
        })
    }
}

impl From<ApiFailure> for CtlError {
    /// A 4xx is the node's refusal; anything else (no answer, a 5xx) is the
    /// node's failure.
    fn from(failure: ApiFailure) -> Self {
        match failure.status {
            Some(400..=499) => Self::Refused(failure.to_string()),
            _ => Self::Unavailable(failure.to_string()),
        }
    }
}

impl From<ClientError> for CtlError {
    /// The node's refusals (a 4xx from the control API, a refused open on
    /// the data port) are refusals wherever they came from; the rest is
    /// the node or the path to it failing.
    fn from(err: ClientError) -> Self {
        use sluice_client::TransportError;
        use sluice_proto::ErrorCode;
        match &err {
            ClientError::Destination { .. } | ClientError::Setting(_) => Self::Usage(err.to_string()),
            ClientError::Control { status: Some(400..=499), .. } => Self::Refused(err.to_string()),
            ClientError::Transport(TransportError::Refused { code, .. })
                if !matches!(code, ErrorCode::Internal | ErrorCode::Busy) =>
            {
                Self::Refused(err.to_string())
            }
            _ => Self::Unavailable(err.to_string()),
        }
    }
}

/// A local file's error, naming the file.
pub fn local<E: Display>(path: &Path) -> impl FnOnce(E) -> CtlError + '_ {
    move |err| CtlError::Local(format!("{}: {err}", path.display()))
}

/// The node answered with something this `sluicectl` cannot read.
pub fn unreadable_answer<E: Display>(err: E) -> CtlError {
    CtlError::Unavailable(format!("reading the node's answer: {err}"))
}

/// One line of JSON.
pub fn json_line<T: serde::Serialize>(value: &T) -> Result<String> {
    serde_json::to_string(value).map_err(|e| CtlError::Failed(format!("encoding JSON: {e}")))
}
