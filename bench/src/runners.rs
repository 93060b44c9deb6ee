//! How each kind of client drives a workload and reports it: sluice's own
//! client, fio (local io_uring and nbd), and wrk with range requests.

use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use sluice_client::Client;
use sluicectl::readbench::{self, BenchParams, ReadPattern};

use crate::procs::output;
use crate::workload::{Measurement, Workload};

/// Runs `workload` through sluice's client against the node at `endpoint`.
pub async fn sluice(
    system: &str,
    endpoint: &str,
    dataset: &str,
    workload: Workload,
    seconds: f64,
    server_cpu: &dyn Fn() -> f64,
) -> Result<Measurement, String> {
    let client = Client::connect(endpoint).await.map_err(|e| e.to_string())?;
    let dataset = Arc::new(client.open(dataset).await.map_err(|e| e.to_string())?);
    let (batch, inflight) = workload.sluice_shape();
    let params = BenchParams {
        size_bytes: workload.size_bytes(),
        batch,
        inflight,
        duration: Duration::from_secs_f64(seconds),
        align_bytes: workload.align_bytes(),
        seed: 0xbe7c4,
        pattern: if workload.sequential() { ReadPattern::Sequential } else { ReadPattern::Random },
        batches_per_worker: None,
        verify_against: None,
    };
    let cpu_before = server_cpu();
    let report = readbench::run(dataset, params).await.map_err(|e| e.to_string())?;
    let cpu = server_cpu() - cpu_before;
    Ok(Measurement {
        system: system.into(),
        workload: workload.name(),
        seconds: report.seconds,
        iops: report.iops,
        gb_per_s: report.gb_per_s,
        latency_us_p50: report.batch_latency_us_p50 as f64,
        latency_us_p99: report.batch_latency_us_p99 as f64,
        latency_us_p999: report.batch_latency_us_p999 as f64,
        cpu_s_per_gb: per_gb(cpu, report.bytes),
        errors: report.failed_ranges,
    })
}

fn per_gb(cpu_seconds: f64, bytes: u64) -> Option<f64> {
    (bytes > 0 && cpu_seconds >= 0.0).then(|| cpu_seconds / (bytes as f64 / 1e9))
}

/// Where fio reads: a local file or an NBD export.
pub enum FioTarget<'a> {
    File { path: &'a Path, direct: bool },
    Nbd { uri: &'a str },
}

/// How fio keeps the workload's reads in flight.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FioQueue {
    /// One job at the workload's queue depth: each read that completes is
    /// replaced at once, so the device always has the whole depth.
    Free,
    /// As sluice's client issues the workload: one job per batch in flight,
    /// each submitting a whole batch and waiting for all of it before the
    /// next (`iodepth_batch_submit` = `iodepth_batch_complete_min` = the
    /// batch). The device's queue drains while a batch waits for its
    /// slowest read, as it does under any client that waits for batches.
    SluiceBatches,
}

/// fio at the workload's queue depth, kept as `queue` says. With
/// `server_cpu`, CPU is the server's; without, fio's own (local reads have
/// no server).
pub fn fio(
    system: &str,
    target: FioTarget<'_>,
    size_bytes: u64,
    workload: Workload,
    seconds: f64,
    server_cpu: Option<&dyn Fn() -> f64>,
    queue: FioQueue,
) -> Result<Measurement, String> {
    let mut command = Command::new("fio");
    command.args(["--name=peer", "--time_based", "--output-format=json", "--invalidate=0", "--group_reporting"]);
    match queue {
        FioQueue::Free => {
            command.args(["--numjobs=1".to_string(), format!("--iodepth={}", workload.queue_depth())]);
        }
        FioQueue::SluiceBatches => {
            let (batch, in_flight) = workload.sluice_shape();
            command.args([
                format!("--numjobs={in_flight}"),
                format!("--iodepth={batch}"),
                format!("--iodepth_batch_submit={batch}"),
                format!("--iodepth_batch_complete_min={batch}"),
            ]);
        }
    }
    match target {
        FioTarget::File { path, direct } => {
            command.arg(format!("--filename={}", path.display()));
            command.args(["--ioengine=io_uring", &format!("--direct={}", u8::from(direct))]);
        }
        FioTarget::Nbd { uri } => {
            command.args(["--ioengine=nbd", &format!("--uri={uri}")]);
        }
    }
    command.args([
        format!("--rw={}", if workload.sequential() { "read" } else { "randread" }),
        format!("--bs={}", workload.size_bytes()),
        format!("--size={size_bytes}"),
        format!("--runtime={}", seconds.ceil().max(1.0) as u64),
    ]);
    let cpu_before = server_cpu.map(|f| f());
    let text = output(&mut command)?;
    // Engines may print notes before the JSON document.
    let json_start = text.find("\n{").map(|i| i + 1).or_else(|| text.starts_with('{').then_some(0));
    let json: Value = serde_json::from_str(&text[json_start.unwrap_or(0)..])
        .map_err(|e| format!("fio's JSON ({e}): {}", text.chars().take(300).collect::<String>()))?;
    let job = &json["jobs"][0];
    let read = &job["read"];
    let runtime_s = read["runtime"].as_f64().unwrap_or(0.0) / 1e3;
    let bytes = read["io_bytes"].as_u64().unwrap_or(0);
    let pct = |p: &str| read["clat_ns"]["percentile"][p].as_f64().unwrap_or(0.0) / 1e3;
    let cpu = match (server_cpu, cpu_before) {
        (Some(f), Some(before)) => f() - before,
        _ => (job["usr_cpu"].as_f64().unwrap_or(0.0) + job["sys_cpu"].as_f64().unwrap_or(0.0)) / 100.0 * runtime_s,
    };
    Ok(Measurement {
        system: system.into(),
        workload: workload.name(),
        seconds: runtime_s,
        iops: read["iops"].as_f64().unwrap_or(0.0),
        gb_per_s: read["bw_bytes"].as_f64().unwrap_or(0.0) / 1e9,
        latency_us_p50: pct("50.000000"),
        latency_us_p99: pct("99.000000"),
        latency_us_p999: pct("99.900000"),
        cpu_s_per_gb: per_gb(cpu, bytes),
        errors: job["error"].as_u64().unwrap_or(0),
    })
}

/// wrk issuing one HTTP range request per workload read (random or
/// sequential offsets from a Lua script), as many connections as the
/// workload's queue depth.
pub fn wrk(
    system: &str,
    url: &str,
    file_bytes: u64,
    workload: Workload,
    seconds: f64,
    work_dir: &Path,
    server_cpu: &dyn Fn() -> f64,
) -> Result<Measurement, String> {
    let size = u64::from(workload.size_bytes());
    let align = workload.align_bytes();
    let slots = (file_bytes - size) / align;
    let script = format!(
        r#"-- one range request per call; random or walking offsets
local size, align, slots, sequential = {size}, {align}, {slots}, {sequential}
local cursor = nil
request = function()
  local slot
  if sequential then
    if cursor == nil then cursor = math.random(0, slots) end
    slot = cursor
    cursor = cursor + 1
    if cursor > slots then cursor = 0 end
  else
    slot = math.random(0, slots)
  end
  local first = slot * align
  return wrk.format("GET", nil, {{ ["Range"] = "bytes=" .. first .. "-" .. (first + size - 1) }})
end
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format("BENCH %d %d %d %.1f %.1f %.1f %d\n", summary.requests, summary.bytes, summary.duration,
    latency:percentile(50), latency:percentile(99), latency:percentile(99.9),
    e.connect + e.read + e.write + e.status + e.timeout))
end
"#,
        sequential = workload.sequential()
    );
    let script_path = work_dir.join(format!("wrk-{}.lua", workload.name()));
    std::fs::write(&script_path, script).map_err(|e| e.to_string())?;
    let connections = workload.queue_depth();
    let threads = connections.min(2);
    let cpu_before = server_cpu();
    let out = output(Command::new("wrk").args([
        "-t",
        &threads.to_string(),
        "-c",
        &connections.to_string(),
        "-d",
        &format!("{}s", seconds.ceil().max(1.0) as u64),
        "-s",
        &script_path.display().to_string(),
        url,
    ]))?;
    let cpu = server_cpu() - cpu_before;
    let line = out.lines().find_map(|l| l.strip_prefix("BENCH ")).ok_or_else(|| format!("wrk said: {out}"))?;
    let f: Vec<f64> = line.split_whitespace().filter_map(|v| v.parse().ok()).collect();
    let [requests, bytes, duration_us, p50, p99, p999, errors] = f[..] else {
        return Err(format!("wrk summary: {line}"));
    };
    let seconds = duration_us / 1e6;
    // Response bytes include HTTP headers; count payload only.
    let payload = requests * size as f64;
    let _ = bytes;
    Ok(Measurement {
        system: system.into(),
        workload: workload.name(),
        seconds,
        iops: requests / seconds,
        gb_per_s: payload / seconds / 1e9,
        latency_us_p50: p50,
        latency_us_p99: p99,
        latency_us_p999: p999,
        cpu_s_per_gb: per_gb(cpu, payload as u64),
        errors: errors as u64,
    })
}
