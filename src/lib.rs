//! One sluice node wired together: block driver, data plane, control plane,
//! TCP transport and HTTP API in one process. `sluiced` runs it as a daemon,
//! `sluice quickstart` embeds it, and the integration tests start it for
//! real.

pub mod admin_helper;
pub mod cluster_loops;
pub mod config;
pub mod node;
pub mod privilege;

pub use config::NodeConfig;
pub use node::Node;
