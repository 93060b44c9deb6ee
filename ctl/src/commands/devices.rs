//! `sluicectl devices`, `namespaces` and `orphans`: where datasets live,
//! and the files no record owns.

use serde_json::Value;
use sluice_proto::api::{DatasetRecord, DeviceReport, OrphanFile, Purged};

use crate::api::Api;
use crate::cli::OrphansCommand;
use crate::error::{json_line, unreadable_answer, Result};

pub fn devices(api: &Api, json: bool) -> Result<()> {
    let devices: Vec<DeviceReport> = api.get_json("/v1/devices")?;
    if json {
        crate::outln!("{}", json_line(&devices)?);
        return Ok(());
    }
    crate::outln!("{:<15} {:<40} {:>16} {:>16}  DATASETS", "KIND", "PATH", "CAPACITY", "USED");
    for d in devices {
        crate::outln!(
            "{:<15} {:<40} {:>16} {:>16}  {}",
            d.kind,
            d.path,
            d.capacity_bytes,
            d.used_bytes,
            if d.datasets.is_empty() { "-".to_string() } else { d.datasets.join(",") }
        );
    }
    Ok(())
}

pub fn orphans(api: &Api, json: bool, command: &OrphansCommand) -> Result<()> {
    match command {
        OrphansCommand::Ls => {
            let files: Vec<OrphanFile> = api.get_json("/v1/orphans")?;
            if json {
                crate::outln!("{}", json_line(&files)?);
                return Ok(());
            }
            for file in files {
                crate::outln!("{:>16}  {}", file.bytes, file.path);
            }
        }
        OrphansCommand::Purge => {
            let purged: Purged =
                api.call(api.request("DELETE", "/v1/orphans").call())?.into_json().map_err(unreadable_answer)?;
            if json {
                crate::outln!("{}", json_line(&purged)?);
            } else {
                crate::outln!("purged {} files, {} bytes", purged.files, purged.bytes);
            }
        }
    }
    Ok(())
}

pub fn namespaces(api: &Api, json: bool) -> Result<()> {
    let records: Vec<DatasetRecord> = api.get_json("/v1/datasets")?;
    if json {
        let rows: Vec<Value> = records
            .iter()
            .map(|r| serde_json::json!({ "dataset": r.name, "length_bytes": r.length_bytes, "namespace": r.namespace }))
            .collect();
        crate::outln!("{}", Value::Array(rows));
        return Ok(());
    }
    crate::outln!("{:<32} {:<7} {:<40} {:>12} {:>16}  REASON", "DATASET", "KIND", "PATH", "OFFSET", "BYTES");
    for r in records {
        crate::outln!(
            "{:<32} {:<7} {:<40} {:>12} {:>16}  {}",
            r.name,
            r.namespace.kind,
            r.namespace.path,
            r.namespace.base_offset_bytes,
            r.length_bytes,
            r.namespace.reason
        );
    }
    Ok(())
}
