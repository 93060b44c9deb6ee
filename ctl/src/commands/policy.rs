//! `sluicectl policy`: the lane-steering policy, shown, swapped, unloaded.

use sluice_proto::api::{PolicyInfo, PolicyReport, Unloaded};

use crate::api::Api;
use crate::cli::PolicyCommand;
use crate::error::{json_line, local, unreadable_answer, Result};

pub fn run(api: &Api, json: bool, command: &PolicyCommand) -> Result<()> {
    match command {
        PolicyCommand::Show => {
            let report: PolicyReport = api.get_json("/v1/policy")?;
            if json {
                crate::outln!("{}", json_line(&report)?);
            } else {
                crate::out!("{}", render_report(&report));
            }
        }
        PolicyCommand::Load { object } => {
            let bytes = std::fs::read(object).map_err(local(object))?;
            let name = object.file_name().map_or_else(|| "policy".into(), |n| n.to_string_lossy().into_owned());
            let request = api
                .request("PUT", "/v1/policy")
                .query("name", &name)
                .set("content-type", "application/octet-stream")
                .send_bytes(&bytes);
            let loaded: PolicyInfo = api.call(request)?.into_json().map_err(unreadable_answer)?;
            if json {
                crate::outln!("{}", json_line(&loaded)?);
            } else {
                crate::outln!("policy {} attached ({})", loaded.name, loaded.object_hash);
            }
        }
        PolicyCommand::Unload => {
            let answer: Unloaded =
                api.call(api.request("DELETE", "/v1/policy").call())?.into_json().map_err(unreadable_answer)?;
            if json {
                crate::outln!("{}", json_line(&answer)?);
            } else {
                match answer.unloaded {
                    Some(policy) => crate::outln!("policy {} detached; lanes by batch size", policy.name),
                    None => crate::outln!("no policy was attached; lanes by batch size"),
                }
            }
        }
    }
    Ok(())
}

fn render_report(report: &PolicyReport) -> String {
    if !report.available {
        return format!("no steering: {}\n", report.reason.as_deref().unwrap_or("unknown"));
    }
    let mut out = match &report.policy {
        Some(p) => format!("policy {} ({}, {} bytes)\n", p.name, p.object_hash, p.object_bytes),
        None => "no policy: lanes by batch size\n".to_string(),
    };
    let (flows, connections) = (&report.flows, &report.connections);
    out.push_str(&format!(
        "flows: {} open; decided {} latency, {} bulk ({} entries undecided)\n",
        flows.open, flows.latency, flows.bulk, flows.undecided
    ));
    out.push_str(&format!(
        "connections accepted: {} on latency-lane workers, {} on bulk-lane workers\n",
        connections.latency_workers, connections.bulk_workers
    ));
    out.push_str(&format!("policy swaps since start: {}\n", report.swaps));
    out
}
