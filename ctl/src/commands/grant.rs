//! `sluicectl grant`: issue, list and revoke access grants.

use serde_json::Value;

use crate::api::Api;
use crate::cli::GrantCommand;
use crate::error::{unreadable_answer, Result};

pub fn run(api: &Api, json: bool, command: &GrantCommand) -> Result<()> {
    match command {
        GrantCommand::Create { dataset, client, cert_name } => {
            let body = serde_json::json!({ "dataset": dataset, "client": client, "cert_name": cert_name });
            let grant: Value =
                api.call(api.request("POST", "/v1/grants").send_json(body))?.into_json().map_err(unreadable_answer)?;
            if json {
                println!("{grant}");
            } else {
                println!("grant {} of {dataset} to {client}", grant["id"]);
                println!(
                    "token (shown once; pass it as --token or SLUICE_TOKEN): {}",
                    grant["token"].as_str().unwrap_or("")
                );
            }
        }
        GrantCommand::Ls => {
            let grants: Vec<Value> = api.get_json("/v1/grants")?;
            if json {
                println!("{}", Value::Array(grants));
            } else {
                println!("{:>6}  {:<32} {:<40} CREATED (unix ms)", "ID", "DATASET", "CLIENT");
                for g in grants {
                    println!(
                        "{:>6}  {:<32} {:<40} {}",
                        g["id"],
                        g["dataset"].as_str().unwrap_or(""),
                        g["client"].as_str().unwrap_or(""),
                        g["created_unix_ms"]
                    );
                }
            }
        }
        GrantCommand::Revoke { id } => {
            api.call(api.request("DELETE", &format!("/v1/grants/{id}")).call())?;
            if json {
                println!("{}", serde_json::json!({ "revoked": id }));
            } else {
                println!("revoked grant {id}");
            }
        }
    }
    Ok(())
}
