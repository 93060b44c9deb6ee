//! `sluicectl grant`: issue, list and revoke access grants.

use sluice_proto::api::{GrantRequest, GrantView};

use crate::api::Api;
use crate::cli::GrantCommand;
use crate::error::{json_line, unreadable_answer, Result};

pub fn run(api: &Api, json: bool, command: &GrantCommand) -> Result<()> {
    match command {
        GrantCommand::Create { dataset, client, cert_name, ttl } => {
            let body = GrantRequest {
                dataset: dataset.clone(),
                client: client.clone(),
                cert_name: cert_name.clone(),
                ttl_s: *ttl,
            };
            let grant: GrantView =
                api.call(api.request("POST", "/v1/grants").send_json(body))?.into_json().map_err(unreadable_answer)?;
            if json {
                crate::outln!("{}", json_line(&grant)?);
            } else {
                crate::outln!("grant {} of {dataset} to {client}", grant.id);
                if let Some(end) = grant.expires_unix_ms {
                    crate::outln!("ends at {end} (unix ms)");
                }
                crate::outln!(
                    "token (shown once; pass it as --token or SLUICE_TOKEN): {}",
                    grant.token.as_ref().map_or("", |t| t.expose())
                );
            }
        }
        GrantCommand::Ls => {
            let grants: Vec<GrantView> = api.get_json("/v1/grants")?;
            if json {
                crate::outln!("{}", json_line(&grants)?);
            } else {
                crate::outln!(
                    "{:>6}  {:<32} {:<40} {:<16} ENDS (unix ms)",
                    "ID",
                    "DATASET",
                    "CLIENT",
                    "CREATED (unix ms)"
                );
                for g in grants {
                    let ends = g.expires_unix_ms.map_or_else(|| "when revoked".to_string(), |end| end.to_string());
                    crate::outln!("{:>6}  {:<32} {:<40} {:<16} {ends}", g.id, g.dataset, g.client, g.created_unix_ms);
                }
            }
        }
        GrantCommand::Revoke { id } => {
            api.call(api.request("DELETE", &format!("/v1/grants/{id}")).call())?;
            if json {
                crate::outln!("{}", serde_json::json!({ "revoked": id }));
            } else {
                crate::outln!("revoked grant {id}");
            }
        }
    }
    Ok(())
}
