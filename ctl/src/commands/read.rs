//! `sluicectl read` and `scrub`: bytes of a sealed dataset, and a check of
//! every chunk of it.

use std::fs::File;
use std::io::Write;
use std::path::Path;

use sluice_client::{RangeStatus, ReadRange};
use sluice_proto::api::ScrubReport;

use crate::api::{runtime, Api};
use crate::error::{json_line, local, unreadable_answer, CtlError, Result};

/// Most bytes asked for in one batch by `read`; longer reads are streamed.
const READ_PIECE_BYTES: u64 = 64 << 20;

/// Writing the output failed (a file, or a closed pipe).
fn written(err: std::io::Error) -> CtlError {
    CtlError::Local(format!("writing the bytes read: {err}"))
}

pub fn read(api: &Api, name: &str, offset: u64, len: u64, output: Option<&Path>) -> Result<()> {
    runtime()?.block_on(async {
        let client = api.connect().await?;
        let dataset = client.open_with(name, api.open_options()).await?;
        let mut out: Box<dyn Write> = match output {
            Some(path) => Box::new(File::create(path).map_err(local(path))?),
            None => Box::new(std::io::stdout().lock()),
        };
        let mut done = 0u64;
        let mut buf = Vec::new();
        while done < len {
            let piece = (len - done).min(READ_PIECE_BYTES);
            buf.resize(piece as usize, 0);
            let ranges: Vec<ReadRange> = (0..piece.div_ceil(4 << 20))
                .map(|i| {
                    let at = i * (4 << 20);
                    ReadRange { offset: offset + done + at, len: (piece - at).min(4 << 20) as u32, dest: at }
                })
                .collect();
            let statuses = dataset.read_batch(&ranges, &mut buf).await?;
            if let Some(bad) = statuses.iter().find(|s| **s != RangeStatus::Ok) {
                return Err(CtlError::Failed(format!(
                    "reading {len} bytes at {offset} of {name}: {} (the dataset is {} bytes)",
                    bad.name(),
                    dataset.len_bytes()
                )));
            }
            out.write_all(&buf).map_err(written)?;
            done += piece;
        }
        out.flush().map_err(written)
    })
}

pub fn scrub(api: &Api, name: &str, json: bool) -> Result<()> {
    let report: ScrubReport = api
        .call(api.request("POST", &format!("/v1/datasets/{name}/scrub")).call())?
        .into_json()
        .map_err(unreadable_answer)?;
    if json {
        crate::outln!("{}", json_line(&report)?);
    } else {
        crate::outln!("{name}: {} chunks, {} bytes, {} bad", report.chunks, report.bytes, report.bad_chunks.len());
        for (chunk, status) in &report.bad_chunks {
            crate::outln!("  chunk {chunk} (bytes {}..): {status}", chunk * sluice_proto::CHUNK_SIZE_BYTES);
        }
    }
    if !report.bad_chunks.is_empty() {
        return Err(CtlError::Failed(format!("{name}: {} bad chunks", report.bad_chunks.len())));
    }

    Ok(())
}
