//! The report: a Markdown file with one table per workload, the instruction
//! count and the microbenchmarks, and PNG plots next to it.

use std::fmt::Write as _;
use std::path::Path;

use plotters::prelude::*;

use crate::callgrind::InstructionCount;
use crate::workload::{Measurement, Workload};

/// Everything one run found.
pub struct Run {
    pub title: String,
    pub machine: Vec<(String, String)>,
    pub versions: Vec<(String, String)>,
    pub setup: Vec<String>,
    pub workloads: Vec<Workload>,
    pub measurements: Vec<Measurement>,
    /// The count with reads at the device (`O_DIRECT`): the goal's.
    pub instructions: Result<InstructionCount, String>,
    /// The same through the warmed page cache: the served path without
    /// the event loop's waits for the device.
    pub instructions_page_cache: Result<InstructionCount, String>,
    /// `(benchmark, mean ns, throughput note)`.
    pub micro: Result<Vec<(String, f64)>, String>,
}

/// The system whose figure is the local limit of a block workload.
pub const DEVICE_LIMIT: &str = "fio io_uring (local, O_DIRECT)";
/// The local limit of the same reads issued in sluice's batches, each
/// submitted whole and waited for whole.
pub const BATCHED_LIMIT: &str = "fio io_uring (local, O_DIRECT, sluice's batches)";

pub fn markdown(run: &Run) -> String {
    let mut md = format!("# {}\n\n", run.title);
    md += "## Machine\n\n| | |\n| --- | --- |\n";
    for (k, v) in &run.machine {
        let _ = writeln!(md, "| {k} | {v} |");
    }
    md += "\n## Peers (Debian packages)\n\n| peer | version |\n| --- | --- |\n";
    for (k, v) in &run.versions {
        let _ = writeln!(md, "| {k} | {v} |");
    }
    md += "\n## Setup\n\n";
    for line in &run.setup {
        let _ = writeln!(md, "- {line}");
    }
    md += "\n![throughput](throughput.png)\n\n![p99 latency](latency_p99.png)\n";
    for workload in &run.workloads {
        let rows: Vec<&Measurement> = run.measurements.iter().filter(|m| m.workload == workload.name()).collect();
        if rows.is_empty() {
            continue;
        }
        let limit = (run.measurements.iter())
            .find(|m| m.system == DEVICE_LIMIT && m.workload == workload.peer_equivalent().name())
            .map(|m| m.gb_per_s);
        let _ = writeln!(md, "\n## {}: {}\n", workload.name(), workload.describe());
        md += "| system | IOPS | GB/s | p50 µs | p99 µs | p99.9 µs | server CPU s/GB | errors | of local limit |\n";
        md += "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n";
        for m in rows {
            let cpu = m.cpu_s_per_gb.map(|c| format!("{c:.2}")).unwrap_or_else(|| "n/a".into());
            let ratio = limit.filter(|l| *l > 0.0).map(|l| format!("{:.2}", m.gb_per_s / l)).unwrap_or_default();
            let _ = writeln!(
                md,
                "| {} | {:.0} | {:.3} | {:.0} | {:.0} | {:.0} | {cpu} | {} | {ratio} |",
                m.system, m.iops, m.gb_per_s, m.latency_us_p50, m.latency_us_p99, m.latency_us_p999, m.errors
            );
        }
    }
    md += &goals_section(run);
    md += &same_batches_section(run);
    md += "\n## Instructions per served 4 KiB read (callgrind, node side)\n\n";
    for count in [&run.instructions, &run.instructions_page_cache] {
        md += &instruction_paragraph(count);
    }
    md += "The goal is the `O_DIRECT` count. Through the page cache io_uring completes each read during its \
        submission, so the core never waits for the device; the difference between the two counts is the core's \
        event-loop turns while reads are at the device (completions that arrive apart, each a turn, and more of \
        them under callgrind, which slows the node and not the device).\n";
    md += "\n## Hot-path microbenchmarks (criterion, `cargo bench -p bench --bench hot_path`)\n\n";
    match &run.micro {
        Ok(rows) => {
            md += "| benchmark | mean |\n| --- | ---: |\n";
            for (name, ns) in rows {
                let shown = if *ns >= 1000.0 { format!("{:.2} µs", ns / 1000.0) } else { format!("{ns:.1} ns") };
                let _ = writeln!(md, "| {name} | {shown} |");
            }
        }
        Err(why) => {
            let _ = writeln!(md, "not measured: {why}");
        }
    }
    md += "\n## Reading the tables\n\n\
        - Latency is per request for the peers and per batch for sluice (a batch is sluice's unit: \
        the training loop waits for all of it). At queue depth 1 both are one read.\n\
        - \"of local limit\" is GB/s over fio's local O_DIRECT io_uring on the same bytes in the same run.\n\
        - The nbd and nginx peers read through the page cache (warmed first); compare them with sluice's \
        page-cached row. The in-process row's CPU is client and node together (one process).\n\
        - Block-device peers (fio, nbd) do not run the token-window workloads: 2- and 4-byte aligned \
        windows are not block I/O.\n\
        - A workload named `…-1xN` is the reads of the one before it issued as one batch of N (by sluice, and by \
        fio issuing sluice's batches); its \"of local limit\" is against that workload's free-running fio figure.\n\
        - \"fio … sluice's batches\" issues the same reads locally as sluice's client does: one job per batch in \
        flight, each submitting its batch whole and waiting for all of it. It is the local limit of a client that \
        waits for whole batches, which the free-running fio row is not: there, each completed read is replaced at once.\n";
    md
}

/// The instruction count's paragraph: one [`crate::callgrind::Source`]'s
/// runs, or why it was not measured.
fn instruction_paragraph(count: &Result<InstructionCount, String>) -> String {
    let count = match count {
        Ok(count) => count,
        Err(why) => return format!("not measured: {why}\n\n"),
    };
    format!(
        "**{}**: {:.0} instructions per read: ({} − {}) instructions / ({} − {}) reads, two runs of `sluiced --cores 1` \
         under `valgrind --tool=callgrind` serving batches of 32 random 4 KiB reads over TCP, each counted up to \
         the node's shutdown. User space only; \
         the kernel's share (io_uring, TCP) is not counted.\n\n\
         {:.0} of them per read beside verification (two more runs, leaving out `block_crc`, the CRC32C of \
         each 4 KiB block read: {:.0} a block under callgrind, which runs `crc-fast`'s SSE code, not the AVX-512 \
         code a core with it runs).\n\n\
         {:.3} heap allocations per batch on the node: ({} − {}) calls of the C allocator in the same two \
         runs, over {} batches more (start-up differs by a few allocations from run to run).\n\n\
         {:.1} calls of `epoll_wait` per batch on the node: its event loops' waits, each a sleep, a look at \
         what was ready or a wake-up by a signal (`EINTR`). Reads at the device complete apart, and each group \
         costs the core's loop more waits and a pass of its own: that, and not another path, is what the \
         `O_DIRECT` count adds to the page cache's.\n\n",
        count.source.describe(),
        count.instructions_per_read,
        count.instructions_large,
        count.instructions_small,
        count.reads_large,
        count.reads_small,
        count.instructions_per_read_beside_crc,
        count.instructions_per_read - count.instructions_per_read_beside_crc,
        count.allocations_per_batch,
        count.allocations_large,
        count.allocations_small,
        (count.reads_large - count.reads_small) / crate::callgrind::BATCH as u64,
        count.waits_per_batch,
    )
}

/// The served path's goals, each a ratio of two figures of this run.
const NBD: &str = "nbdkit + fio nbd";
const SLUICE_DIRECT: &str = "sluice TCP (O_DIRECT)";
const SLUICE_CACHED: &str = "sluice TCP (page cache)";
/// Most user-space instructions a served 4 KiB read should take beside
/// the CRC32C of its block (set before every block was verified; the CRC
/// alone is about 2,000 under callgrind).
const INSTRUCTIONS_PER_READ_GOAL: f64 = 1200.0;
/// None per batch: under one in a hundred batches is start-up's noise
/// between the two runs, not the batches'.
const ALLOCATIONS_PER_BATCH_GOAL: f64 = 0.01;

/// One goal: what is compared, the ratio measured (`None` when a figure is
/// missing from the run), the goal, and whether a higher ratio is better.
struct Goal {
    what: &'static str,
    measured: Option<f64>,
    goal: f64,
    at_least: bool,
}

fn goals(run: &Run) -> Vec<Goal> {
    let figure = |workload: Workload, system: &str| {
        run.measurements
            .iter()
            .find(|m| m.workload == workload.name() && m.system == system)
            .map(|m| if m.iops > 0.0 { m.iops } else { m.gb_per_s })
            .filter(|v| *v > 0.0)
    };
    let ratio = |a: Option<f64>, b: Option<f64>| a.zip(b).map(|(a, b)| a / b);
    let qd1 = Workload::Random4k { queue_depth: 1 };
    let qd32 = Workload::Random4k { queue_depth: 32 };
    let qd32_one_batch = Workload::Random4kOneBatch { queue_depth: 32 };
    let qd256 = Workload::Random4k { queue_depth: 256 };
    // One fio-local read plus one nbd round trip: what a served read at
    // queue depth 1 cannot beat.
    let served_limit = figure(qd1, DEVICE_LIMIT).zip(figure(qd1, NBD)).map(|(fio, nbd)| 1.0 / (1.0 / fio + 1.0 / nbd));
    vec![
        Goal {
            what: "4 KiB QD 1, page cache: sluice / nbdkit",
            measured: ratio(figure(qd1, SLUICE_CACHED), figure(qd1, NBD)),
            goal: 1.0,
            at_least: true,
        },
        Goal {
            what: "4 KiB QD 1, O_DIRECT: sluice / served limit (1 / (1/fio + 1/nbd))",
            measured: ratio(figure(qd1, SLUICE_DIRECT), served_limit),
            goal: 0.9,
            at_least: true,
        },
        Goal {
            what: "4 KiB QD 32 (8 x 4), O_DIRECT: sluice / fio local",
            measured: ratio(figure(qd32, SLUICE_DIRECT), figure(qd32, DEVICE_LIMIT)),
            goal: 0.9,
            at_least: true,
        },
        Goal {
            what: "4 KiB QD 32 (1 x 32), O_DIRECT: sluice / fio local",
            measured: ratio(figure(qd32_one_batch, SLUICE_DIRECT), figure(qd32, DEVICE_LIMIT)),
            goal: 0.9,
            at_least: true,
        },
        Goal {
            what: "4 KiB QD 256, O_DIRECT: sluice / fio local",
            measured: ratio(figure(qd256, SLUICE_DIRECT), figure(qd256, DEVICE_LIMIT)),
            goal: 0.95,
            at_least: true,
        },
        Goal {
            what: "1 MiB sequential, page cache: sluice / nbdkit",
            measured: ratio(figure(Workload::Sequential1m, SLUICE_CACHED), figure(Workload::Sequential1m, NBD)),
            goal: 1.0,
            at_least: true,
        },
        Goal {
            what: "user-space instructions per served 4 KiB read (O_DIRECT), beside its block's CRC32C",
            measured: run.instructions.as_ref().ok().map(|c| c.instructions_per_read_beside_crc),
            goal: INSTRUCTIONS_PER_READ_GOAL,
            at_least: false,
        },
        Goal {
            what: "heap allocations per batch on the node",
            // A difference of two noisy start-ups can come out below zero.
            measured: run.instructions.as_ref().ok().map(|c| c.allocations_per_batch.max(0.0)),
            goal: ALLOCATIONS_PER_BATCH_GOAL,
            at_least: false,
        },
    ]
}

fn goals_section(run: &Run) -> String {
    let mut md = String::from("\n## The served path's goals, as ratios in this run\n\n| goal | measured | wanted | met |\n| --- | ---: | ---: | --- |\n");
    for goal in goals(run) {
        let wanted = if goal.at_least { format!("≥ {}", goal.goal) } else { format!("≤ {}", goal.goal) };
        let (measured, met) = match goal.measured {
            Some(m) => {
                let met = if goal.at_least { m >= goal.goal } else { m <= goal.goal };
                (if m >= 100.0 { format!("{m:.0}") } else { format!("{m:.2}") }, if met { "yes" } else { "no" })
            }
            None => ("n/a".to_string(), "not measured"),
        };
        let _ = writeln!(md, "| {} | {measured} | {wanted} | {met} |", goal.what);
    }
    md
}

/// The batched workloads against fio issuing the same batches locally:
/// what the network and the node cost, apart from what waiting for whole
/// batches costs any client (the second column).
fn same_batches_section(run: &Run) -> String {
    let iops = |workload: Workload, system: &str| {
        (run.measurements.iter())
            .find(|m| m.workload == workload.name() && m.system == system)
            .map(|m| m.iops)
            .filter(|v| *v > 0.0)
    };
    let shown = |ratio: Option<f64>| ratio.map(|r| format!("{r:.2}")).unwrap_or_else(|| "n/a".into());
    let mut md = String::from(
        "\n## Against the same batches issued locally\n\n\
         | workload | sluice TCP (O_DIRECT) / fio, sluice's batches | fio, sluice's batches / fio free-running |\n\
         | --- | ---: | ---: |\n",
    );
    for &workload in run.workloads.iter().filter(|w| w.batched_random()) {
        let batched = iops(workload, BATCHED_LIMIT);
        let sluice = iops(workload, SLUICE_DIRECT).zip(batched).map(|(s, b)| s / b);
        let batching = batched.zip(iops(workload.peer_equivalent(), DEVICE_LIMIT)).map(|(b, f)| b / f);
        let _ = writeln!(md, "| {} | {} | {} |", workload.name(), shown(sluice), shown(batching));
    }
    md
}

/// Draws one PNG per metric, a panel per workload, a bar per system.
pub fn plots(run: &Run, dir: &Path) -> Result<(), String> {
    register_font()?;
    plot(run, &dir.join("throughput.png"), "GB/s", |m| m.gb_per_s)?;
    plot(run, &dir.join("latency_p99.png"), "p99 latency, µs", |m| m.latency_us_p99)
}

fn register_font() -> Result<(), String> {
    const FONT: &str = "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf";
    let bytes = std::fs::read(FONT).map_err(|e| format!("{FONT} (Debian package fonts-dejavu-core): {e}"))?;
    // plotters keeps the font for the life of the process.
    let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
    plotters::style::register_font("sans-serif", FontStyle::Normal, bytes)
        .map_err(|_| format!("{FONT} is not a font plotters can read"))
}

const PALETTE: [RGBColor; 7] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(127, 127, 127),
];

fn plot(run: &Run, path: &Path, unit: &str, value: impl Fn(&Measurement) -> f64) -> Result<(), String> {
    let err = |e: &dyn std::fmt::Display| format!("{}: {e}", path.display());
    let systems: Vec<String> = run.measurements.iter().fold(Vec::new(), |mut seen, m| {
        if !seen.contains(&m.system) {
            seen.push(m.system.clone());
        }
        seen
    });
    let root = BitMapBackend::new(path, (1500, 1000)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(&e))?;
    let panels = root.split_evenly((2, run.workloads.len().div_ceil(2)));
    for (panel, workload) in panels.iter().zip(&run.workloads) {
        let rows: Vec<(usize, f64)> = systems
            .iter()
            .enumerate()
            .filter_map(|(i, s)| {
                run.measurements.iter().find(|m| &m.system == s && m.workload == workload.name()).map(|m| (i, value(m)))
            })
            .collect();
        let max = rows.iter().map(|(_, v)| *v).fold(0.0, f64::max).max(1e-9) * 1.15;
        let mut chart = ChartBuilder::on(panel)
            .caption(workload.name(), ("sans-serif", 20))
            .margin(12)
            .x_label_area_size(36)
            .y_label_area_size(210)
            .build_cartesian_2d(0f64..max, (0..systems.len()).into_segmented())
            .map_err(|e| err(&e))?;
        chart
            .configure_mesh()
            .disable_y_mesh()
            .y_labels(systems.len())
            .y_label_formatter(&|v| match v {
                SegmentValue::CenterOf(i) => systems.get(*i).cloned().unwrap_or_default(),
                _ => String::new(),
            })
            .x_desc(unit)
            .label_style(("sans-serif", 13))
            .draw()
            .map_err(|e| err(&e))?;
        chart
            .draw_series(rows.iter().map(|(i, v)| {
                let color = PALETTE[i % PALETTE.len()];
                let mut bar =
                    Rectangle::new([(0.0, SegmentValue::Exact(*i)), (*v, SegmentValue::Exact(i + 1))], color.filled());
                bar.set_margin(6, 6, 0, 0);
                bar
            }))
            .map_err(|e| err(&e))?;
    }
    root.present().map_err(|e| err(&e))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn measured(system: &str, workload: Workload, iops: f64) -> Measurement {
        Measurement {
            system: system.into(),
            workload: workload.name(),
            seconds: 1.0,
            iops,
            gb_per_s: iops * f64::from(workload.size_bytes()) / 1e9,
            latency_us_p50: 0.0,
            latency_us_p99: 0.0,
            latency_us_p999: 0.0,
            cpu_s_per_gb: None,
            errors: 0,
        }
    }

    /// A run of these workloads and figures, with nothing else measured.
    fn run_of(workloads: Vec<Workload>, measurements: Vec<Measurement>) -> Run {
        Run {
            title: String::new(),
            machine: Vec::new(),
            versions: Vec::new(),
            setup: Vec::new(),
            workloads,
            measurements,
            instructions: Err("not run".into()),
            instructions_page_cache: Err("not run".into()),
            micro: Err("not run".into()),
        }
    }

    /// The served limit at QD 1 is one local read plus one round trip; a
    /// figure missing from the run leaves its goal unmeasured, never met.
    #[test]
    fn goals_are_ratios_of_the_same_run() {
        let qd1 = Workload::Random4k { queue_depth: 1 };
        let run = run_of(
            vec![qd1],
            vec![
                measured(DEVICE_LIMIT, qd1, 20_000.0),
                measured(NBD, qd1, 20_000.0),
                measured(SLUICE_DIRECT, qd1, 9_000.0),
                measured(SLUICE_CACHED, qd1, 25_000.0),
                measured(DEVICE_LIMIT, Workload::Random4k { queue_depth: 32 }, 100_000.0),
                measured(SLUICE_DIRECT, Workload::Random4kOneBatch { queue_depth: 32 }, 95_000.0),
            ],
        );
        let goals = goals(&run);
        let served = goals[1].measured.expect("served limit");
        assert!((served - 0.9).abs() < 1e-9, "9 000 against a limit of 10 000: {served}");
        assert_eq!(goals[0].measured, Some(1.25));
        assert!(goals[2].measured.is_none() && goals[5].measured.is_none());
        let one_batch = goals[3].measured.expect("QD 32 as one batch against fio's QD 32");
        assert!((one_batch - 0.95).abs() < 1e-9, "{one_batch}");
        let md = goals_section(&run);
        assert!(md.contains("| 0.90 | ≥ 0.9 | yes |"), "{md}");
        assert!(md.contains("| n/a | ≤ 1200 | not measured |"), "{md}");
    }

    fn counted(source: crate::callgrind::Source, beside_crc: f64) -> InstructionCount {
        InstructionCount {
            source,
            reads_small: 6400,
            reads_large: 32000,
            instructions_small: 0,
            instructions_large: 0,
            instructions_per_read: beside_crc + 1930.0,
            instructions_per_read_beside_crc: beside_crc,
            allocations_small: 0,
            allocations_large: 0,
            allocations_per_batch: 0.0,
            waits_per_batch: 2.0,
        }
    }

    /// The goal is the count with reads at the device; the page-cache
    /// count is reported beside it and never stands in for it.
    #[test]
    fn the_instruction_goal_is_the_device_count() {
        use crate::callgrind::Source;
        let mut run = run_of(Vec::new(), Vec::new());
        run.instructions_page_cache = Ok(counted(Source::PageCache, 1000.0));
        let goal = |run: &Run| goals(run).into_iter().find(|g| g.what.starts_with("user-space instructions"));
        assert_eq!(goal(&run).expect("goal row").measured, None, "no device count: not measured");
        run.instructions = Ok(counted(Source::Device, 1336.0));
        assert_eq!(goal(&run).expect("goal row").measured, Some(1336.0));
        let md = markdown(&run);
        let device = md.find("**O_DIRECT, reads at the device**: 3266").expect("device paragraph");
        let cached = md.find("**through the page cache, warmed**: 2930").expect("page-cache paragraph");
        assert!(device < cached, "the goal's count comes first");
        assert!(md.contains("| 1336 | ≤ 1200 | no |"), "{md}");
    }

    /// Each batched workload is compared with fio issuing the same batches,
    /// and those with fio's free-running figure for the same reads.
    #[test]
    fn batched_workloads_are_compared_with_the_same_batches() {
        let qd32 = Workload::Random4k { queue_depth: 32 };
        let one_batch = Workload::Random4kOneBatch { queue_depth: 32 };
        let run = run_of(
            vec![Workload::Random4k { queue_depth: 1 }, qd32, one_batch],
            vec![
                measured(DEVICE_LIMIT, qd32, 100_000.0),
                measured(BATCHED_LIMIT, qd32, 80_000.0),
                measured(SLUICE_DIRECT, qd32, 60_000.0),
                measured(BATCHED_LIMIT, one_batch, 50_000.0),
            ],
        );
        let md = same_batches_section(&run);
        assert!(md.contains("| 4k-random-qd32 | 0.75 | 0.80 |"), "{md}");
        assert!(md.contains("| 4k-random-qd32-1x32 | n/a | 0.50 |"), "{md}");
        assert!(!md.contains("| 4k-random-qd1 |"), "queue depth 1 is not batched: {md}");
    }
}
