//! `sluicectl cluster`: live members, each dataset's copies, and the
//! datasets this node's build cannot read (a newer build's, during a
//! rolling upgrade).

use sluice_proto::api::{ClusterStatus, CopyStatus};

use crate::api::Api;
use crate::error::{json_line, Result};

pub fn run(api: &Api, json: bool) -> Result<()> {
    let status: ClusterStatus = api.get_json("/v1/cluster")?;
    if json {
        crate::outln!("{}", json_line(&status)?);
        return Ok(());
    }
    if status.node.is_empty() {
        crate::outln!("a single node (catalog: {}); start nodes with --etcd to form a cluster", status.catalog);
        return Ok(());
    }
    crate::outln!("node {} ; catalog {} ; {} copies per dataset", status.node, status.catalog, status.replication);
    crate::outln!("{:<20} {:<32} DATA", "MEMBER", "CONTROL");
    for m in &status.members {
        crate::outln!("{:<20} {:<32} {}", m.node, m.control_endpoint, m.data_addr);
    }
    crate::outln!("{:<32} {:<10} {:<24} COPIES (node:ready/syncing, * = not live)", "DATASET", "STATE", "PLACEMENT");
    for d in &status.datasets {
        crate::outln!("{:<32} {:<10} {:<24} {}", d.name, d.state.to_string(), d.placement.join(","), copies(&d.copies));
    }
    if !status.foreign_datasets.is_empty() {
        crate::outln!(
            "{} datasets this build cannot read (a newer build wrote them?); nodes of that build serve them",
            status.foreign_datasets.len()
        );
        crate::outln!("{:<32} {:<10} {:<24} WHY", "DATASET", "ID", "COPIES");
        for d in &status.foreign_datasets {
            crate::outln!("{:<32} {:<10} {:<24} {}", d.name, d.id, copies(&d.copies), d.why);
        }
    }
    Ok(())
}

/// Copies as `node:ready` or `node:syncing`, `*` after a node not live.
fn copies(copies: &[CopyStatus]) -> String {
    let shown: Vec<String> = copies
        .iter()
        .map(|c| format!("{}:{}{}", c.node, if c.ready { "ready" } else { "syncing" }, if c.live { "" } else { "*" }))
        .collect();
    shown.join(" ")
}
