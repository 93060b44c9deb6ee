//! `sluicectl policy`: the lane-steering policy, shown, swapped, unloaded.

use serde_json::Value;

use crate::api::Api;
use crate::cli::PolicyCommand;
use crate::error::{local, unreadable_answer, Result};

pub fn run(api: &Api, json: bool, command: &PolicyCommand) -> Result<()> {
    let answer: Value = match command {
        PolicyCommand::Show => api.get_json("/v1/policy")?,
        PolicyCommand::Load { object } => {
            let bytes = std::fs::read(object).map_err(local(object))?;
            let name = object.file_name().map_or_else(|| "policy".into(), |n| n.to_string_lossy().into_owned());
            let request = api
                .request("PUT", "/v1/policy")
                .query("name", &name)
                .set("content-type", "application/octet-stream")
                .send_bytes(&bytes);
            api.call(request)?.into_json().map_err(unreadable_answer)?
        }
        PolicyCommand::Unload => {
            api.call(api.request("DELETE", "/v1/policy").call())?.into_json().map_err(unreadable_answer)?
        }
    };
    if json {
        println!("{answer}");
        return Ok(());
    }
    match command {
        PolicyCommand::Show if answer["available"] == false => {
            println!("no steering: {}", answer["reason"].as_str().unwrap_or("unknown"));
        }
        PolicyCommand::Show => {
            let policy = &answer["policy"];
            match policy["name"].as_str() {
                Some(name) => println!(
                    "policy {name} ({}, {} bytes)",
                    policy["object_hash"].as_str().unwrap_or(""),
                    policy["object_bytes"]
                ),
                None => println!("no policy: lanes by batch size"),
            }
            let flows = &answer["flows"];
            println!(
                "flows: {} open; decided {} latency, {} bulk ({} entries undecided)",
                flows["open"], flows["latency"], flows["bulk"], flows["undecided"]
            );
            let connections = &answer["connections"];
            println!(
                "connections accepted: {} on latency-lane workers, {} on bulk-lane workers",
                connections["latency_workers"], connections["bulk_workers"]
            );
            println!("policy swaps since start: {}", answer["swaps"]);
        }
        PolicyCommand::Load { .. } => {
            println!(
                "policy {} attached ({})",
                answer["name"].as_str().unwrap_or(""),
                answer["object_hash"].as_str().unwrap_or("")
            );
        }
        PolicyCommand::Unload => match answer["unloaded"]["name"].as_str() {
            Some(name) => println!("policy {name} detached; lanes by batch size"),
            None => println!("no policy was attached; lanes by batch size"),
        },
    }
    Ok(())
}
