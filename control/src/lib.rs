//! The control plane of a node: the catalog of datasets and their
//! namespaces, ingest and sealing, the HTTP/JSON API `sluicectl` speaks, and
//! the resolver the data-plane transports open datasets through.
//!
//! It is the node's: nothing a training host links (the client, the
//! transports, `sluicectl`) may depend on it; the API's types live in
//! `sluice-proto` so they need not. Its map is `control/README.md`.

pub mod api;
pub mod audit;
pub mod auth;
pub mod catalog;
pub mod checksums;
pub mod claim;
pub mod cluster;
pub mod etcd;
pub mod grants;
pub mod hex;
pub mod identity;
pub mod index;
pub mod ingest;
pub mod metrics;
pub mod nvme;
pub mod openapi;
mod plane;
pub mod serve;
pub mod source;
pub mod token_files;
pub use sluice_proto::tar;

pub use catalog::{Catalog, CatalogError, CatalogStore, DatasetRecord, DatasetState, NamespaceRecord};
pub use plane::{
    CatalogChoice, ClusterStatus, ControlError, ControlPlane, DeviceReport, IndexSource, IngestSession, NamespacePool,
    PolicyControl, PolicyRules, ReplicaJob, ReplicaTarget, Resolver, ScrubReport, SourceSpec, TraceSource,
};
pub use sluice_proto::api::DatasetKind;
pub use sluice_proto::NodeInfo;
