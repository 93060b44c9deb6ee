//! `sluicectl cluster`: live members and each dataset's copies.

use sluice_proto::api::ClusterStatus;

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
        let copies: Vec<String> = d
            .copies
            .iter()
            .map(|c| {
                format!("{}:{}{}", c.node, if c.ready { "ready" } else { "syncing" }, if c.live { "" } else { "*" })
            })
            .collect();
        crate::outln!("{:<32} {:<10} {:<24} {}", d.name, d.state.to_string(), d.placement.join(","), copies.join(" "));
    }
    Ok(())
}
