//! `sluicectl cluster`: live members and each dataset's copies.

use sluice_proto::api::ClusterStatus;

use crate::api::Api;
use crate::error::{json_line, Result};

pub fn run(api: &Api, json: bool) -> Result<()> {
    let status: ClusterStatus = api.get_json("/v1/cluster")?;
    if json {
        println!("{}", json_line(&status)?);
        return Ok(());
    }
    if status.node.is_empty() {
        println!("a single node (catalog: {}); start nodes with --etcd to form a cluster", status.catalog);
        return Ok(());
    }
    println!("node {} ; catalog {} ; {} copies per dataset", status.node, status.catalog, status.replication);
    println!("{:<20} {:<32} DATA", "MEMBER", "CONTROL");
    for m in &status.members {
        println!("{:<20} {:<32} {}", m.node, m.control_endpoint, m.data_addr);
    }
    println!("{:<32} {:<10} {:<24} COPIES (node:ready/syncing, * = not live)", "DATASET", "STATE", "PLACEMENT");
    for d in &status.datasets {
        let copies: Vec<String> = d
            .copies
            .iter()
            .map(|c| {
                format!("{}:{}{}", c.node, if c.ready { "ready" } else { "syncing" }, if c.live { "" } else { "*" })
            })
            .collect();
        println!("{:<32} {:<10} {:<24} {}", d.name, d.state.to_string(), d.placement.join(","), copies.join(" "));
    }
    Ok(())
}
