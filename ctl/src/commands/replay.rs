//! `sluicectl replay`: the exact samples of one training step, from a saved
//! sampler state (the record-of-death workflow).

use std::path::Path;

use serde_json::Value;
use sluice_client::{RangeStatus, ReadRange};
use sluice_proto::api::DatasetRecord;

use crate::api::{runtime, Api};
use crate::error::{local, CtlError, Result};

pub fn run(
    api: &Api,
    state_path: &Path,
    step: u64,
    global_batch: Option<u64>,
    dump: Option<&Path>,
    json: bool,
) -> Result<()> {
    use sluice_client::loader::replay_step;
    use sluice_client::sampler::SamplerState;
    let bytes = std::fs::read(state_path).map_err(local(state_path))?;
    let mut state = SamplerState::from_bytes(&bytes).map_err(local(state_path))?;
    if let Some(batch) = global_batch {
        state.global_batch = batch.max(1);
    }
    let records: Vec<DatasetRecord> = api.get_json("/v1/datasets")?;
    let record =
        records.iter().find(|r| r.content_hash.as_deref() == Some(state.content_hash.as_str())).ok_or_else(|| {
            CtlError::Refused(format!("no sealed dataset on this node has content hash {}", state.content_hash))
        })?;
    let name = record.name.clone();
    let (samples, data) = runtime()?.block_on(async {
        let client = api.connect().await?;
        let dataset = client.open_with(&name, api.open_options()).await?;
        let index = match state.kind {
            sluice_client::sampler::SamplerKind::Record => Some(dataset.record_index().await?),
            sluice_client::sampler::SamplerKind::Window => None,
        };
        let samples = replay_step(&state, step, index.as_deref()).map_err(|e| CtlError::Usage(e.to_string()))?;
        let mut ranges = Vec::with_capacity(samples.len());
        let mut dest = 0u64;
        for s in &samples {
            let len = u32::try_from(s.len_bytes)
                .map_err(|_| CtlError::Failed(format!("sample {} is over 4 GiB", s.index)))?;
            ranges.push(ReadRange { offset: s.byte_offset, len, dest });
            dest += s.len_bytes;
        }
        let mut buf = vec![0u8; dest as usize];
        let statuses = dataset.read_batch(&ranges, &mut buf).await?;
        if let Some(bad) = statuses.iter().position(|s| *s != RangeStatus::Ok) {
            return Err(CtlError::Failed(format!("sample {bad}: {}", statuses[bad].name())));
        }
        Ok::<_, CtlError>((samples, buf))
    })?;
    if let Some(dir) = dump {
        std::fs::create_dir_all(dir).map_err(local(dir))?;
    }
    let mut rows = Vec::with_capacity(samples.len());
    let mut at = 0usize;
    for sample in &samples {
        let bytes = &data[at..at + sample.len_bytes as usize];
        at += sample.len_bytes as usize;
        let crc = crc32c::crc32c(bytes);
        if let Some(dir) = dump {
            let path = dir.join(format!("step{step}-{:05}.bin", sample.position));
            std::fs::write(&path, bytes).map_err(local(&path))?;
        }
        rows.push((sample, crc));
    }
    if json {
        let out: Vec<Value> = rows
            .iter()
            .map(|(s, crc)| {
                let mut v = serde_json::to_value(s).unwrap_or_default();
                v["crc32c"] = Value::from(*crc);
                v["dataset"] = Value::from(name.as_str());
                v
            })
            .collect();
        crate::outln!("{}", Value::Array(out));
    } else {
        crate::outln!("dataset {name} ({}), step {step}, global batch {}", state.content_hash, state.global_batch);
        crate::outln!(
            "{:>8} {:>14} {:>6} {:>14} {:>16} {:>10}",
            "POSITION",
            "GLOBAL_SAMPLE",
            "EPOCH",
            "INDEX",
            "BYTE_OFFSET",
            "CRC32C"
        );
        for (s, crc) in rows {
            crate::outln!(
                "{:>8} {:>14} {:>6} {:>14} {:>16}   {crc:#010x}",
                s.position,
                s.global_sample,
                s.epoch,
                s.index,
                s.byte_offset
            );
        }
    }
    Ok(())
}
