//! The exceptions a Python user sees: each failure a class of its own, with
//! the node's reason in the message, so a job can tell a missing grant from
//! a node that went away without parsing text.

use pyo3::create_exception;
use pyo3::exceptions::{PyIOError, PyValueError};
use pyo3::PyErr;
use sluice_client::loader::LoaderError;
use sluice_client::{ClientError, TransportError};
use sluice_proto::codec::ErrorCode;

create_exception!(sluice, SluiceError, PyIOError, "Any failure of sluice to reach or read a dataset (an OSError).");
create_exception!(
    sluice,
    AccessDenied,
    SluiceError,
    "The node refused: no grant, or a grant that does not cover this."
);
create_exception!(sluice, UnknownDataset, SluiceError, "No sealed dataset of that name on the node.");
create_exception!(sluice, NodeUnavailable, SluiceError, "The node could not be reached, or the connection was lost.");
create_exception!(sluice, WrongKind, SluiceError, "The dataset is not of the kind this loader reads.");
create_exception!(sluice, StateMismatch, SluiceError, "A saved state that belongs to another dataset or sampler.");
create_exception!(
    sluice,
    ReadFailed,
    PyValueError,
    "A range could not be read: out of the dataset, or a failed check (a ValueError: the request was wrong)."
);
create_exception!(sluice, Forked, SluiceError, "A native object used in a process it was not made in.");

/// The exception for a client failure.
pub fn client(err: ClientError) -> PyErr {
    let message = err.to_string();
    match &err {
        ClientError::Transport(TransportError::Refused { code, .. }) => refused(*code, message),
        ClientError::Transport(_) => NodeUnavailable::new_err(message),
        ClientError::Control { status: Some(401 | 403), .. } => AccessDenied::new_err(message),
        ClientError::Control { status: Some(404), .. } => UnknownDataset::new_err(message),
        ClientError::Control { status: None, .. } => NodeUnavailable::new_err(message),
        ClientError::Control { .. } | ClientError::BadAddress(_) | ClientError::Rdma(_) => {
            SluiceError::new_err(message)
        }
        ClientError::Destination { .. } | ClientError::Setting(_) => PyValueError::new_err(message),
    }
}

fn refused(code: ErrorCode, message: String) -> PyErr {
    match code {
        ErrorCode::AccessDenied => AccessDenied::new_err(message),
        ErrorCode::UnknownDataset | ErrorCode::NotSealed => UnknownDataset::new_err(message),
        ErrorCode::Busy => NodeUnavailable::new_err(message),
        _ => SluiceError::new_err(message),
    }
}

/// The exception for a loader failure.
pub fn loader(err: LoaderError) -> PyErr {
    let message = err.to_string();
    match err {
        LoaderError::Client(err) => client(err),
        LoaderError::Kind(_) => WrongKind::new_err(message),
        LoaderError::WrongDataset { .. } | LoaderError::WrongSampler | LoaderError::MixtureStates { .. } => {
            StateMismatch::new_err(message)
        }
        LoaderError::Sampler(_)
        | LoaderError::EmptyEpoch
        | LoaderError::EmptyMixture
        | LoaderError::MixtureSteps { .. }
        | LoaderError::MixtureRanks { .. } => PyValueError::new_err(message),
        LoaderError::Read { .. } | LoaderError::Index { .. } => ReadFailed::new_err(message),
        LoaderError::Task(_) | LoaderError::End(_) => SluiceError::new_err(message),
    }
}
