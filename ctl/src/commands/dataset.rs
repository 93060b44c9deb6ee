//! `sluicectl dataset`: create, ingest, seal, list, inspect and delete.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use indicatif::{ProgressBar, ProgressStyle};
use serde_json::Value;
use sluice_proto::api::{Appended, CacheReport, DatasetKind, DatasetRecord, DatasetState};
use sluice_proto::npy;

use crate::api::Api;
use crate::cli::{DatasetCommand, Format};
use crate::error::{json_line, local, unreadable_answer, CtlError, Result};
use crate::litdata::TokenChunk;

pub fn run(api: &Api, json: bool, command: &DatasetCommand) -> Result<()> {
    match command {
        DatasetCommand::Create { name, kind, record_size, size, source, index } => {
            let mut body =
                serde_json::json!({ "name": name, "kind": kind, "record_size": record_size, "size_bytes": size });
            if !source.is_empty() {
                body["source"] = serde_json::json!(source);
                body["index"] = serde_json::json!(index);
            }
            let record: DatasetRecord = api
                .call(api.request("POST", "/v1/datasets").send_json(body))?
                .into_json()
                .map_err(unreadable_answer)?;
            let human = match &record.source {
                Some(source) => format!(
                    "created {} ({}, {} bytes from {} objects, pinned; readable now)",
                    record.name,
                    record.kind,
                    record.length_bytes,
                    source.objects.len()
                ),
                None => format!("created {} ({})", record.name, record.kind),
            };
            print_record(&record, json, &human);
        }
        DatasetCommand::Warm { name, parallel, no_wait } => warm(api, json, name, *parallel, *no_wait)?,
        DatasetCommand::Pin { name } | DatasetCommand::Unpin { name } => {
            let method = if matches!(command, DatasetCommand::Pin { .. }) { "PUT" } else { "DELETE" };
            let report: CacheReport = api
                .call(api.request(method, &format!("/v1/datasets/{name}/pin")).call())?
                .into_json()
                .map_err(unreadable_answer)?;
            if json {
                crate::outln!("{}", json_line(&report)?);
            } else {
                crate::outln!(
                    "{name} is {}; {}",
                    if report.pinned { "pinned" } else { "unpinned" },
                    cache_line(&report)
                );
            }
        }
        DatasetCommand::Ingest { name, files, format, index } => {
            // Refuse early what the node would refuse after the upload.
            let record: DatasetRecord = api.get_json(&format!("/v1/datasets/{name}"))?;
            if !matches!(record.state, DatasetState::Creating | DatasetState::Ingesting) {
                return Err(CtlError::Usage(format!(
                    "dataset {name:?} is {}; ingest needs it creating or ingesting",
                    record.state
                )));
            }
            let needs_index = record.kind == DatasetKind::Records && record.record_size_bytes.is_none();
            if needs_index && index.is_none() {
                return Err(CtlError::Usage(format!(
                    "{name} is a records dataset: send its offsets first (sluicectl dataset ingest {name} FILE --index OFFSETS)"
                )));
            }
            if let Some(index) = index {
                if files.len() != 1 {
                    return Err(CtlError::Usage("--index describes one file: give exactly one FILE with it".into()));
                }
                stage_index(api, name, index)?;
            }
            // A LitData token dataset's directory stands for its chunks, in
            // its index's order; every chunk is checked before any is sent.
            let mut sources = Vec::with_capacity(files.len());
            for file in files {
                match crate::litdata::index_of(file) {
                    Some(index) => {
                        if *format != Format::Auto {
                            return Err(CtlError::Usage(format!(
                                "{}: a LitData dataset is read by its index.json; drop --format",
                                file.display()
                            )));
                        }
                        let chunks = crate::litdata::token_chunks(&index, record.kind).map_err(CtlError::Local)?;
                        sources.extend(chunks.into_iter().map(Source::TokenChunk));
                    }
                    None => sources.push(Source::File(file.clone())),
                }
            }
            let mut results = Vec::new();
            for source in &sources {
                let (file, appended) = match source {
                    Source::File(file) => (file, ingest_file(api, name, file, *format, json)?),
                    Source::TokenChunk(chunk) => (&chunk.path, ingest_token_chunk(api, name, chunk, json)?),
                };
                results.push(serde_json::json!({ "file": file, "appended": appended }));
            }
            if json {
                crate::outln!("{}", Value::Array(results));
            }
        }
        DatasetCommand::Seal { name } => {
            let record: DatasetRecord = api
                .call(api.request("POST", &format!("/v1/datasets/{name}/seal")).call())?
                .into_json()
                .map_err(unreadable_answer)?;
            let hash = record.content_hash.clone().unwrap_or_default();
            print_record(&record, json, &format!("sealed {} ({} bytes, {hash})", record.name, record.length_bytes));
        }
        DatasetCommand::Ls => {
            let records: Vec<DatasetRecord> = api.get_json("/v1/datasets")?;
            if json {
                crate::outln!("{}", json_line(&records)?);
            } else {
                crate::outln!("{:<32} {:<11} {:<10} {:>16} {:>6}  HASH", "NAME", "KIND", "STATE", "BYTES", "FILES");
                for r in records {
                    let hash = r.content_hash.as_deref().map(|h| &h[..h.len().min(23)]).unwrap_or("-");
                    let state = serde_json::to_value(r.state).ok().and_then(|v| v.as_str().map(str::to_string));
                    crate::outln!(
                        "{:<32} {:<11} {:<10} {:>16} {:>6}  {hash}",
                        r.name,
                        r.kind.as_str(),
                        state.unwrap_or_default(),
                        r.length_bytes,
                        r.files_ingested
                    );
                }
            }
        }
        DatasetCommand::Stat { name } => {
            let record: DatasetRecord = api.get_json(&format!("/v1/datasets/{name}"))?;
            let cache: Option<CacheReport> = match record.source {
                Some(_) => Some(api.get_json(&format!("/v1/datasets/{name}/cache"))?),
                None => None,
            };
            if json {
                let mut value = serde_json::to_value(&record).map_err(|e| CtlError::Failed(e.to_string()))?;
                if let Some(cache) = &cache {
                    value["cache"] = serde_json::to_value(cache).map_err(|e| CtlError::Failed(e.to_string()))?;
                }
                crate::outln!("{value}");
            } else {
                let pretty = serde_json::to_string_pretty(&record)
                    .map_err(|e| CtlError::Failed(format!("encoding JSON: {e}")))?;
                crate::outln!("{pretty}");
                if let Some(cache) = cache {
                    crate::outln!("{}", cache_line(&cache));
                }
            }
        }
        DatasetCommand::Rm { name } => {
            api.call(api.request("DELETE", &format!("/v1/datasets/{name}")).call())?;
            if json {
                crate::outln!("{}", serde_json::json!({ "deleted": name }));
            } else {
                crate::outln!("deleted {name}");
            }
        }
    }
    Ok(())
}

/// One line on a source-backed dataset's cache.
fn cache_line(cache: &CacheReport) -> String {
    let mut line = format!(
        "cache: {}/{} chunks present{}{}{}; filled {} chunks ({} bytes, mean {} µs a fill), evicted {}; source errors {}, changed {}",
        cache.chunks_present,
        cache.chunks_total,
        if cache.hydrated { ", hydrated" } else { "" },
        if cache.warming { ", warming" } else { "" },
        if cache.pinned { ", pinned" } else { "" },
        cache.chunks_filled,
        cache.bytes_filled,
        cache.fill_mean_micros,
        cache.chunks_evicted,
        cache.source_errors,
        cache.source_changed,
    );
    if let Some(err) = &cache.last_error {
        line.push_str(&format!("; last error: {err}"));
    }
    line
}

/// Starts a warm and, unless `no_wait`, follows it to the end.
fn warm(api: &Api, json: bool, name: &str, parallel: usize, no_wait: bool) -> Result<()> {
    let started: CacheReport = api
        .call(
            api.request("POST", &format!("/v1/datasets/{name}/warm"))
                .send_json(serde_json::json!({ "parallel": parallel })),
        )?
        .into_json()
        .map_err(unreadable_answer)?;
    let bar = (!json && !no_wait).then(|| {
        let bar = ProgressBar::new(started.chunks_total);
        bar.set_style(
            ProgressStyle::with_template("{msg} [{bar:40}] {pos}/{len} chunks {per_sec} eta {eta}")
                .unwrap_or_else(|_| ProgressStyle::default_bar()),
        );
        bar.set_message(format!("warming {name}"));
        bar
    });
    let mut report = started;
    while !no_wait && !report.hydrated {
        if let Some(bar) = &bar {
            bar.set_position(report.chunks_present);
        }
        if !report.warming && !report.hydrated {
            if let Some(bar) = &bar {
                bar.abandon();
            }
            return Err(CtlError::Failed(format!(
                "warming {name} stopped with {} of {} chunks present: {}; run it again to go on",
                report.chunks_present,
                report.chunks_total,
                report.last_error.as_deref().unwrap_or("no error recorded")
            )));
        }
        std::thread::sleep(std::time::Duration::from_millis(200));
        report = api.get_json(&format!("/v1/datasets/{name}/cache"))?;
    }
    if let Some(bar) = &bar {
        bar.finish_and_clear();
    }
    if json {
        crate::outln!("{}", json_line(&report)?);
    } else if report.hydrated {
        let record: DatasetRecord = api.get_json(&format!("/v1/datasets/{name}"))?;
        crate::outln!(
            "{name} is warm: {} chunks on the node, content hash {}",
            report.chunks_total,
            record.content_hash.unwrap_or_default()
        );
    } else {
        crate::outln!("{}", cache_line(&report));
    }
    Ok(())
}

fn print_record(record: &DatasetRecord, json: bool, human: &str) {
    if json {
        crate::outln!("{}", serde_json::to_string(record).unwrap_or_default());
    } else {
        crate::outln!("{human}");
    }
}

/// Sends a records file's offsets ahead of the file itself.
fn stage_index(api: &Api, name: &str, path: &Path) -> Result<()> {
    let bytes = std::fs::read(path).map_err(local(path))?;
    let npy = path.extension().is_some_and(|e| e.eq_ignore_ascii_case("npy"));
    let request = api
        .request("POST", &format!("/v1/datasets/{name}/index"))
        .query("format", if npy { "npy" } else { "raw" })
        .set("Content-Type", "application/octet-stream")
        .send_bytes(&bytes);
    api.call(request)?;
    Ok(())
}

/// Whether `path` is zstd-compressed by its name (`.zst`, `.zstd`): such a
/// file is decompressed as it is sent (a Mosaic shard written with
/// `compression="zstd"` is `shard.NNNNN.mds.zstd`).
fn zstd_compressed(path: &Path) -> bool {
    path.extension().is_some_and(|e| e.eq_ignore_ascii_case("zst") || e.eq_ignore_ascii_case("zstd"))
}

/// `path`'s bytes as the node is to have them: decompressed when its name
/// says zstd.
fn decoded<R: Read + Send + 'static>(path: &Path, read: R) -> Result<Box<dyn Read + Send>> {
    if zstd_compressed(path) {
        Ok(Box::new(zstd::stream::read::Decoder::new(read).map_err(local(path))?))
    } else {
        Ok(Box::new(read))
    }
}

/// What one `ingest` argument stands for.
enum Source {
    /// A file sent whole (a `.npy` header the node strips).
    File(PathBuf),
    /// A LitData chunk's tokens, past its header.
    TokenChunk(TokenChunk),
}

/// Streams one LitData chunk's tokens to the node, as raw bytes.
fn ingest_token_chunk(api: &Api, name: &str, chunk: &TokenChunk, json: bool) -> Result<Appended> {
    let path = &chunk.path;
    let mut file = File::open(path).map_err(local(path))?;
    file.seek(SeekFrom::Start(chunk.data_offset_bytes)).map_err(local(path))?;
    let progress = progress_bar(path, chunk.data_bytes);
    let tokens: Box<dyn Read + Send> = Box::new(progress.wrap_read(file.take(chunk.data_bytes)));
    let appended = send(api, name, Upload { path, bytes: tokens, format: "raw", data_offset: 0, progress }, json)?;
    if appended.data_bytes != chunk.data_bytes {
        return Err(CtlError::Failed(format!(
            "{}: {} token bytes sent where its header promised {}: the chunk changed while it was sent; \
             delete {name} and ingest again",
            path.display(),
            appended.data_bytes,
            chunk.data_bytes
        )));
    }
    Ok(appended)
}

/// Streams one file to the node, then compares the node's CRC32C of the
/// data with the one computed here while sending.
fn ingest_file(api: &Api, name: &str, path: &Path, format: Format, json: bool) -> Result<Appended> {
    let file = File::open(path).map_err(local(path))?;
    let size = file.metadata().map(|m| m.len()).map_err(local(path))?;
    let npy = match format {
        Format::Npy => true,
        Format::Raw => false,
        Format::Auto => {
            let unpacked = if zstd_compressed(path) { path.file_stem().map(Path::new) } else { Some(path) };
            unpacked.and_then(Path::extension).is_some_and(|e| e.eq_ignore_ascii_case("npy"))
        }
    };
    let data_offset = if npy {
        let mut head = Vec::with_capacity(npy::HEADER_BYTES_MAX);
        let opened = File::open(path).map_err(local(path))?;
        decoded(path, opened)?.take(npy::HEADER_BYTES_MAX as u64).read_to_end(&mut head).map_err(local(path))?;
        npy::parse_header(&head).map(|h| h.data_offset_bytes as u64).map_err(local(path))?
    } else {
        0
    };
    let progress = progress_bar(path, size);
    // The bar counts the file's own bytes, compressed or not.
    let bytes = decoded(path, progress.wrap_read(file))?;
    let format = if npy { "npy" } else { "raw" };
    send(api, name, Upload { path, bytes, format, data_offset, progress }, json)
}

/// A bar of `size` bytes, named by `path`.
fn progress_bar(path: &Path, size: u64) -> ProgressBar {
    let progress = ProgressBar::new(size);
    progress.set_style(
        ProgressStyle::with_template("{msg} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec} eta {eta}")
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
    );
    progress.set_message(path.display().to_string());
    progress
}

/// One file's bytes on their way to the node.
struct Upload<'a> {
    path: &'a Path,
    bytes: Box<dyn Read + Send>,
    /// The `format` the node reads them in (`raw` or `npy`).
    format: &'static str,
    /// Leading bytes the node strips (a `.npy` header).
    data_offset: u64,
    progress: ProgressBar,
}

/// Sends `upload`, then compares the node's CRC32C of the data it kept
/// (past the bytes it strips) with the one computed here while sending.
fn send(api: &Api, name: &str, upload: Upload<'_>, json: bool) -> Result<Appended> {
    let Upload { path, bytes, format, data_offset, progress } = upload;
    let reader = CrcReader { inner: bytes, skip: data_offset, crc: 0 };
    let crc = Arc::new(std::sync::Mutex::new(0u32));
    let reader = SharedCrc { reader, out: Arc::clone(&crc) };
    let request = api
        .request("POST", &format!("/v1/datasets/{name}/ingest"))
        .query("format", format)
        .set("Content-Type", "application/octet-stream")
        .send(reader);
    progress.finish_and_clear();
    let appended: Appended = api.call(request)?.into_json().map_err(unreadable_answer)?;
    let sent = *crc.lock().map_err(|_| CtlError::Failed("the checksum's lock is poisoned".into()))?;
    if appended.data_crc32c != sent {
        return Err(CtlError::Failed(format!(
            "{}: checksum mismatch: sent crc32c {sent:#010x}, node stored {:#010x}",
            path.display(),
            appended.data_crc32c
        )));
    }
    if !json {
        crate::outln!(
            "ingested {}: {} bytes (crc32c {:#010x} verified); {name} is now {} bytes",
            path.display(),
            appended.data_bytes,
            sent,
            appended.length_bytes
        );
    }
    Ok(appended)
}

/// CRC32C of what passes through, after the first `skip` bytes.
struct CrcReader<R> {
    inner: R,
    skip: u64,
    crc: u32,
}

impl<R: Read> Read for CrcReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        let skip = (self.skip.min(n as u64)) as usize;
        self.skip -= skip as u64;
        self.crc = crc32c::crc32c_append(self.crc, &buf[skip..n]);
        Ok(n)
    }
}

/// Publishes the running CRC so it can be read after the request consumed
/// the reader.
struct SharedCrc<R> {
    reader: CrcReader<R>,
    out: Arc<std::sync::Mutex<u32>>,
}

impl<R: Read> Read for SharedCrc<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.reader.read(buf)?;
        if let Ok(mut out) = self.out.lock() {
            *out = self.reader.crc;
        }
        Ok(n)
    }
}
