//! One module per command group.

pub mod bench;
pub mod cluster;
pub mod dataset;
pub mod devices;
pub mod grant;
pub mod man;
pub mod policy;
pub mod read;
pub mod replay;
pub mod top;
