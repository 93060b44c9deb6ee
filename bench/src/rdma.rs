//! `bench rdma`: sluice's RDMA transport next to perftest on the same
//! soft-RoCE pair, in one run of the rig (two QEMU guests) or on real
//! hardware named by `SLUICE_HW_*`.
//!
//! Bytes flow storage → training in every row: sluice RDMA-WRITEs into the
//! training host's buffer; `ib_write_bw` runs its client on the storage host;
//! `ib_read_bw` runs its client on the training host, reading the storage
//! host's memory. The ratio is sluice's rate over the better perftest rate
//! at the same message size.

use std::path::Path;
use std::time::Duration;

use hw_tests::{Host, Rig, SLUICE_CONTROL_PORT};
use rand::RngCore;
use serde::Serialize;

const RDMA_PORT: u16 = 7472;
const DATASET_MIB: usize = 96;

#[derive(Serialize)]
struct Row {
    size_bytes: u64,
    perftest_write_gb_per_s: f64,
    perftest_read_gb_per_s: f64,
    sluice_rdma_gb_per_s: f64,
    sluice_rdma_iops: f64,
    sluice_tcp_gb_per_s: f64,
    ratio_to_perftest: f64,
}

#[derive(Serialize)]
struct Report {
    rig: String,
    seconds: u64,
    rows: Vec<Row>,
    commands: Vec<String>,
}

/// perftest's `BW average[MB/sec]` (MiB/s) from its report, as GB/s.
fn perftest_gb_per_s(report: &str, size: u64) -> Result<f64, String> {
    report
        .lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            (fields.len() >= 4 && fields[0] == size.to_string()).then(|| fields[3].parse::<f64>().ok()).flatten()
        })
        .next()
        .map(|mib_per_s| mib_per_s * 1_048_576.0 / 1e9)
        .ok_or_else(|| format!("no {size}-byte row in perftest's report:\n{report}"))
}

/// Runs one perftest pair: `server_host` waits, `client_host` connects
/// (rdma_cm, so no GID index to pick) and reports.
fn perftest(
    rig: &Rig,
    tool: &str,
    server_host: Host,
    client_host: Host,
    size: u64,
    seconds: u64,
    commands: &mut Vec<String>,
) -> Result<f64, String> {
    let device = rig.rdma_device().ok_or("the rig has no RDMA device")?;
    let args = format!("-d {device} -R -F -D {seconds} -s {size} -q 1");
    let server_addr = rig.addr(server_host);
    rig.sh(server_host, &format!("setsid {tool} {args} > /tmp/{tool}-server.log 2>&1 &")).map_err(|e| e.to_string())?;
    std::thread::sleep(Duration::from_secs(2));
    let client = format!("{tool} {args} {server_addr}");
    commands.push(format!("{} (server: {tool} {args} on {})", client, server_host.name()));
    let out = rig.exec_with(client_host, &client, Duration::from_secs(seconds + 120)).map_err(|e| e.to_string())?;
    if !out.success() {
        return Err(format!("{tool}: {}{}", out.stdout, out.stderr));
    }
    perftest_gb_per_s(&out.stdout, size)
}

/// One `sluicectl bench read` on the training host; (GB/s, IOPS).
fn sluice_read(
    rig: &Rig,
    read: &str,
    transport: &str,
    size: u64,
    batch: u32,
    seconds: u64,
    commands: &mut Vec<String>,
) -> Result<(f64, f64), String> {
    let command = format!(
        "{read} --transport {transport} --json bench read tokens --size {size} --batch {batch} --inflight 4 \
         --seconds {seconds}"
    );
    commands.push(command.clone());
    let out = rig.exec_with(Host::Training, &command, Duration::from_secs(seconds + 120)).map_err(|e| e.to_string())?;
    if !out.success() {
        return Err(format!("sluicectl bench read: {}", out.stderr));
    }
    let report: serde_json::Value =
        serde_json::from_str(out.stdout.trim()).map_err(|e| format!("{e}: {}", out.stdout))?;
    if report["transport"] != transport {
        return Err(format!("asked for {transport}, got {report}"));
    }
    Ok((report["gb_per_s"].as_f64().unwrap_or(0.0), report["iops"].as_f64().unwrap_or(0.0)))
}

pub fn run(seconds: u64, out_dir: &Path) -> Result<String, String> {
    let rig = Rig::builder("bench-rdma")
        .hosts(2)
        .nvme(1, 1)
        .namespace_mib(DATASET_MIB as u64 + 32)
        .memory_mib(2048)
        .rdma(true)
        .boot()
        .map_err(|e| format!("the RDMA rig: {e}"))?;
    let sluicectl = rig.sluice_binary("sluicectl").map_err(|e| e.to_string())?;
    let namespaces = rig.namespace_devices(&rig.nvme_controllers()[0]).map_err(|e| e.to_string())?;
    let (_, device) = namespaces.first().ok_or("the rig has no namespace")?;
    let storage = rig.addr(Host::Storage);
    let endpoint = format!("http://{storage}:{SLUICE_CONTROL_PORT}");
    let mut data = vec![0u8; DATASET_MIB << 20];
    <rand::rngs::StdRng as rand::SeedableRng>::seed_from_u64(0xbe4c).fill_bytes(&mut data);
    let source = rig.share_file("data.bin", &data).map_err(|e| e.to_string())?;
    drop(data);
    rig.start_sluiced(&storage, &format!("--insecure --namespace-device {device} --rdma-listen {storage}:{RDMA_PORT}"))
        .map_err(|e| e.to_string())?;
    let ctl = |args: &str| rig.sh(Host::Storage, &format!("{sluicectl} --endpoint {endpoint} {args}"));
    ctl("dataset create tokens --kind bytes").map_err(|e| e.to_string())?;
    ctl(&format!("dataset ingest tokens {source}")).map_err(|e| e.to_string())?;
    ctl("dataset seal tokens").map_err(|e| e.to_string())?;
    let read = format!("{sluicectl} --endpoint {endpoint}");

    let mut commands = Vec::new();
    let mut rows = Vec::new();
    for (size, batch) in [(4096u64, 32u32), (1 << 20, 4)] {
        let write = perftest(&rig, "ib_write_bw", Host::Training, Host::Storage, size, seconds, &mut commands)?;
        let read_bw = perftest(&rig, "ib_read_bw", Host::Storage, Host::Training, size, seconds, &mut commands)?;
        let (rdma_gb, rdma_iops) = sluice_read(&rig, &read, "rdma", size, batch, seconds, &mut commands)?;
        let (tcp_gb, _) = sluice_read(&rig, &read, "tcp", size, batch, seconds, &mut commands)?;
        rows.push(Row {
            size_bytes: size,
            perftest_write_gb_per_s: write,
            perftest_read_gb_per_s: read_bw,
            sluice_rdma_gb_per_s: rdma_gb,
            sluice_rdma_iops: rdma_iops,
            sluice_tcp_gb_per_s: tcp_gb,
            ratio_to_perftest: rdma_gb / write.max(read_bw).max(f64::MIN_POSITIVE),
        });
    }
    let device = rig.rdma_device().unwrap_or_default();
    let rig_text = if rig.is_emulated() {
        format!("two QEMU TCG guests, soft-RoCE {device} over a datagram (UDP) netdev")
    } else {
        format!("real hardware, {device}")
    };
    let report = Report { rig: rig_text, seconds, rows, commands };
    std::fs::create_dir_all(out_dir).map_err(|e| format!("{}: {e}", out_dir.display()))?;
    let json = serde_json::to_string_pretty(&report).map_err(|e| e.to_string())?;
    std::fs::write(out_dir.join("rdma.json"), json).map_err(|e| e.to_string())?;
    let markdown = render(&report);
    std::fs::write(out_dir.join("rdma.md"), &markdown).map_err(|e| e.to_string())?;
    Ok(markdown)
}

fn render(report: &Report) -> String {
    let mut out = format!(
        "# sluice RDMA vs perftest ({}, {} s a run)\n\n\
         | size | ib_write_bw GB/s | ib_read_bw GB/s | sluice RDMA GB/s | sluice RDMA IOPS | sluice TCP GB/s | RDMA / perftest |\n\
         |---:|---:|---:|---:|---:|---:|---:|\n",
        report.rig, report.seconds
    );
    for row in &report.rows {
        out.push_str(&format!(
            "| {} | {:.3} | {:.3} | {:.3} | {:.0} | {:.3} | {:.0} % |\n",
            row.size_bytes,
            row.perftest_write_gb_per_s,
            row.perftest_read_gb_per_s,
            row.sluice_rdma_gb_per_s,
            row.sluice_rdma_iops,
            row.sluice_tcp_gb_per_s,
            row.ratio_to_perftest * 100.0
        ));
    }
    out.push_str("\nCommands (training host unless noted):\n\n");
    for command in &report.commands {
        out.push_str(&format!("- `{command}`\n"));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// perftest's report row for the size is found and MiB/s become GB/s.
    #[test]
    fn reads_perftest_average_bandwidth() {
        let report = " #bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]   MsgRate[Mpps]\n \
                      4096       12345          150.00             100.00               0.025600\n";
        let gb = perftest_gb_per_s(report, 4096).expect("row");
        assert!((gb - 0.1048576).abs() < 1e-9, "{gb}");
        assert!(perftest_gb_per_s(report, 65536).is_err());
    }
}
