//! `sluicectl bench read`: random or sequential reads through the client.

use std::sync::Arc;

use serde_json::Value;

use crate::api::{runtime_with_workers, Api};
use crate::error::{CtlError, Result};
use crate::readbench::{self, BenchParams};

pub fn read(api: &Api, name: &str, params: BenchParams, client_threads: usize, json: bool) -> Result<()> {
    runtime_with_workers(client_threads)?.block_on(async {
        let client = api.connect().await?;
        let dataset = Arc::new(client.open_with(name, api.open_options()).await?);
        let report = readbench::run(dataset, params).await?;
        if json {
            let mut value =
                serde_json::to_value(&report).map_err(|e| CtlError::Failed(format!("encoding JSON: {e}")))?;
            value["transport"] = Value::from(client.transport());
            value["transport_reason"] = Value::from(client.transport_reason());
            value["dataset"] = Value::from(name);
            crate::outln!("{value}");
        } else {
            crate::outln!(
                "{name} over {} from {} ({})",
                client.transport(),
                client.node().name,
                client.transport_reason()
            );
            crate::out!("{}", report.render());
        }
        Ok(())
    })
}
