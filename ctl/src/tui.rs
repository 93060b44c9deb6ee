//! `sluicectl top`'s terminal UI (ratatui): the node's eBPF trace per
//! dataset and lane, refreshed every interval, with the latency and size
//! histograms of the selected row and the count of slow batches kept;
//! below them the cache tier of the source-backed datasets.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use ratatui::crossterm::event::{self, Event, KeyCode, KeyEventKind};
use ratatui::layout::{Constraint, Layout};
use ratatui::style::{Modifier, Style};
use ratatui::widgets::{BarChart, Block, Paragraph, Row, Table, TableState};
use ratatui::Frame;
use serde_json::Value;
use sluice_proto::api::CacheReport;

use crate::cache_view::{self, CacheRates};

/// What one refresh fetches: `GET /v1/trace` and `GET /v1/caches`.
pub struct Snapshot {
    pub trace: Value,
    pub caches: Vec<CacheReport>,
}

/// What the UI remembers between snapshots.
#[derive(Default)]
pub struct TopState {
    previous: HashMap<(u64, String), u64>,
    rates: HashMap<(u64, String), f64>,
    cache_rates: CacheRates,
    table: TableState,
}

impl TopState {
    /// Takes a new snapshot: batch rates are the difference from the last.
    pub fn update(&mut self, snapshot: &Snapshot, interval_s: f64) {
        self.cache_rates.update(&snapshot.caches, interval_s);
        let snapshot = &snapshot.trace;
        for entry in entries(snapshot) {
            let key = (entry["dataset_id"].as_u64().unwrap_or(0), entry["lane"].as_str().unwrap_or("?").to_string());
            let batches = entry["batches"].as_u64().unwrap_or(0);
            if let Some(before) = self.previous.insert(key.clone(), batches) {
                self.rates.insert(key, batches.saturating_sub(before) as f64 / interval_s.max(0.1));
            }
        }
        let rows = entries(snapshot).len();
        match self.table.selected() {
            _ if rows == 0 => self.table.select(None),
            None => self.table.select(Some(0)),
            Some(i) if i >= rows => self.table.select(Some(rows - 1)),
            Some(_) => {}
        }
    }

    fn step(&mut self, down: bool, rows: usize) {
        let i = self.table.selected().unwrap_or(0);
        let next = if down { (i + 1).min(rows.saturating_sub(1)) } else { i.saturating_sub(1) };
        self.table.select(Some(next));
    }
}

fn entries(snapshot: &Value) -> &[Value] {
    snapshot["entries"].as_array().map(Vec::as_slice).unwrap_or(&[])
}

fn name_of(entry: &Value) -> String {
    entry["dataset"]
        .as_str()
        .map(str::to_string)
        .unwrap_or_else(|| format!("#{}", entry["dataset_id"].as_u64().unwrap_or(0)))
}

/// `(label, count)` bars of a log2 histogram whose bucket i holds values
/// up to 2^(i+1), trimmed to the buckets in use.
fn log2_bars(histogram: &Value) -> Vec<(String, u64)> {
    let counts: Vec<u64> = histogram.as_array().into_iter().flatten().map(|v| v.as_u64().unwrap_or(0)).collect();
    let first = counts.iter().position(|c| *c > 0);
    let last = counts.iter().rposition(|c| *c > 0);
    let (Some(first), Some(last)) = (first, last) else { return Vec::new() };
    (first..=last)
        .map(|i| {
            let upper = 2u64 << i;
            let label = if upper >= 1 << 20 {
                format!("{}M", upper >> 20)
            } else if upper >= 1 << 10 {
                format!("{}K", upper >> 10)
            } else {
                upper.to_string()
            };
            (label, counts[i])
        })
        .collect()
}

/// The upper bound of the log2 bucket holding quantile `q` (0..=1) of
/// `histogram`, whose bucket i holds values up to 2^(i+1).
pub fn log2_quantile(histogram: &Value, q: f64) -> Option<u64> {
    let counts: Vec<u64> = histogram.as_array().into_iter().flatten().map(|v| v.as_u64().unwrap_or(0)).collect();
    let total: u64 = counts.iter().sum();
    let target = ((total as f64) * q).ceil().max(1.0) as u64;
    let mut seen = 0;
    for (bucket, count) in counts.iter().enumerate() {
        seen += count;
        if total > 0 && seen >= target {
            return Some(2u64 << bucket);
        }
    }
    None
}

/// One line on the kernel's side of the node's I/O (io_uring tracepoints),
/// shown beside the probes' per-batch view.
pub fn kernel_line(snapshot: &Value) -> String {
    let kernel = &snapshot["kernel"];
    if kernel["available"] != Value::Bool(true) {
        return format!("kernel io_uring: not traced ({})", kernel["reason"].as_str().unwrap_or("no data"));
    }
    let quantile = |q| log2_quantile(&kernel["latency_log2_us"], q).map_or("-".into(), |v| format!("<{v}"));
    format!(
        "kernel io_uring (1 in {} timed): {} requests, {} errors, request latency p50 {} us, p99 {} us",
        kernel["sampled_one_in"].as_u64().unwrap_or(1),
        kernel["requests"],
        kernel["errors"],
        quantile(0.5),
        quantile(0.99)
    )
}

/// Draws one frame.
pub fn draw(frame: &mut Frame<'_>, snapshot: &Snapshot, state: &mut TopState) {
    let cache_rows = if snapshot.caches.is_empty() { 0 } else { snapshot.caches.len() as u16 + 3 };
    let [table_area, charts_area, kernel_area, cache_area, footer_area] = Layout::vertical([
        Constraint::Min(5),
        Constraint::Length(12),
        Constraint::Length(1),
        Constraint::Length(cache_rows),
        Constraint::Length(1),
    ])
    .areas(frame.area());
    draw_caches(frame, cache_area, &state.cache_rates.rows(&snapshot.caches));
    let snapshot = &snapshot.trace;
    if snapshot["available"] != Value::Bool(true) {
        let reason = snapshot["reason"].as_str().unwrap_or("unknown");
        frame.render_widget(
            Paragraph::new(format!("no trace: {reason}")).block(Block::bordered().title("sluice top")),
            table_area,
        );
        return;
    }
    let rows: Vec<Row<'_>> = entries(snapshot)
        .iter()
        .map(|e| {
            let key = (e["dataset_id"].as_u64().unwrap_or(0), e["lane"].as_str().unwrap_or("?").to_string());
            let rate = state.rates.get(&key).map(|r| format!("{r:.0}")).unwrap_or_else(|| "-".into());
            Row::new(vec![
                name_of(e),
                key.1,
                e["batches"].to_string(),
                rate,
                e["ranges"].to_string(),
                e["bytes"].to_string(),
                e["failed_ranges"].to_string(),
            ])
        })
        .collect();
    let widths = [
        Constraint::Min(16),
        Constraint::Length(8),
        Constraint::Length(10),
        Constraint::Length(9),
        Constraint::Length(12),
        Constraint::Length(14),
        Constraint::Length(7),
    ];
    let table = Table::new(rows, widths)
        .header(
            Row::new(vec!["DATASET", "LANE", "BATCHES", "BATCH/S", "RANGES", "BYTES", "FAILED"])
                .style(Style::default().add_modifier(Modifier::BOLD)),
        )
        .row_highlight_style(Style::default().add_modifier(Modifier::REVERSED))
        .block(Block::bordered().title("sluice top: small-read traffic from the node's eBPF probes"));
    frame.render_stateful_widget(table, table_area, &mut state.table);

    let [latency_area, size_area] =
        Layout::horizontal([Constraint::Percentage(50), Constraint::Percentage(50)]).areas(charts_area);
    let selected = state.table.selected().and_then(|i| entries(snapshot).get(i));
    let title = |what: &str| match selected {
        Some(e) => format!("{what} — {} / {}", name_of(e), e["lane"].as_str().unwrap_or("?")),
        None => what.to_string(),
    };
    for (area, key, what) in [
        (latency_area, "latency_log2_us", "batch latency (us, log2)"),
        (size_area, "size_log2", "read size (bytes, log2)"),
    ] {
        let bars = selected.map(|e| log2_bars(&e[key])).unwrap_or_default();
        let data: Vec<(&str, u64)> = bars.iter().map(|(l, c)| (l.as_str(), *c)).collect();
        let chart = BarChart::default().block(Block::bordered().title(title(what))).bar_width(5).bar_gap(1).data(&data);
        frame.render_widget(chart, area);
    }
    frame.render_widget(Paragraph::new(kernel_line(snapshot)), kernel_area);
    let slow = snapshot["slow_batches"].as_array().map_or(0, Vec::len);
    frame.render_widget(
        Paragraph::new(format!("slow batches (>= 10 ms) kept: {slow}    q: quit   up/down: select")),
        footer_area,
    );
}

/// The cache tier's table; nothing when no dataset is source-backed.
fn draw_caches(frame: &mut Frame<'_>, area: ratatui::layout::Rect, rows: &[[String; 9]]) {
    if rows.is_empty() {
        return;
    }
    let widths = [
        Constraint::Min(16),
        Constraint::Length(8),
        Constraint::Length(7),
        Constraint::Length(10),
        Constraint::Length(10),
        Constraint::Length(10),
        Constraint::Length(8),
        Constraint::Length(7),
        Constraint::Min(8),
    ];
    let table = Table::new(rows.iter().map(|r| Row::new(r.clone())), widths)
        .header(Row::new(cache_view::HEADER).style(Style::default().add_modifier(Modifier::BOLD)))
        .block(Block::bordered().title("cache tier: source-backed datasets (ERRORS: unavailable/changed)"));
    frame.render_widget(table, area);
}

/// Runs the UI until `q` or Esc: fetches a snapshot every `interval`.
pub fn run(mut fetch: impl FnMut() -> Result<Snapshot, String>, interval: Duration) -> Result<(), String> {
    let mut terminal = ratatui::init();
    let mut state = TopState::default();
    let outcome = (|| -> Result<(), String> {
        loop {
            let snapshot = fetch()?;
            state.update(&snapshot, interval.as_secs_f64());
            terminal.draw(|frame| draw(frame, &snapshot, &mut state)).map_err(|e| e.to_string())?;
            let next = Instant::now() + interval;
            while let Some(left) = next.checked_duration_since(Instant::now()) {
                if !event::poll(left).map_err(|e| e.to_string())? {
                    break;
                }
                if let Event::Key(key) = event::read().map_err(|e| e.to_string())? {
                    if key.kind != KeyEventKind::Press {
                        continue;
                    }
                    match key.code {
                        KeyCode::Char('q') | KeyCode::Esc => return Ok(()),
                        KeyCode::Down | KeyCode::Char('j') => state.step(true, entries(&snapshot.trace).len()),
                        KeyCode::Up | KeyCode::Char('k') => state.step(false, entries(&snapshot.trace).len()),
                        _ => {}
                    }
                    terminal.draw(|frame| draw(frame, &snapshot, &mut state)).map_err(|e| e.to_string())?;
                }
            }
        }
    })();
    ratatui::restore();
    outcome
}

#[cfg(test)]
mod tests {
    use ratatui::backend::TestBackend;
    use ratatui::Terminal;

    use super::*;

    fn snapshot(batches: u64) -> Snapshot {
        Snapshot { trace: trace(batches), caches: Vec::new() }
    }

    fn trace(batches: u64) -> Value {
        serde_json::json!({
            "available": true,
            "entries": [
                {"dataset_id": 1, "dataset": "wiki", "lane": "latency", "batches": batches, "ranges": 64 * batches,
                 "bytes": 262144 * batches, "failed_ranges": 0,
                 "size_log2": [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 64], "latency_log2_us": [0, 0, 0, 0, 0, 0, 0, 0, 3, 5]},
                {"dataset_id": 2, "dataset": "books", "lane": "bulk", "batches": 2, "ranges": 2,
                 "bytes": 2097152, "failed_ranges": 1, "size_log2": [], "latency_log2_us": []}
            ],
            "slow_batches": [{"dataset_id": 1}],
            "kernel": {"available": true, "requests": 100, "errors": 0, "sampled_one_in": 8,
                       "latency_log2_us": [0, 0, 0, 0, 0, 50, 49, 0, 1]}
        })
    }

    fn screen(terminal: &Terminal<TestBackend>) -> String {
        let buffer = terminal.backend().buffer();
        buffer.content().iter().map(|cell| cell.symbol()).collect::<String>()
    }

    #[test]
    fn shows_rows_rates_and_the_selected_histograms() {
        let mut terminal = Terminal::new(TestBackend::new(120, 30)).expect("terminal");
        let mut state = TopState::default();
        state.update(&snapshot(10), 1.0);
        state.update(&snapshot(25), 1.0);
        terminal.draw(|f| draw(f, &snapshot(25), &mut state)).expect("draw");
        let text = screen(&terminal);
        assert!(text.contains("wiki") && text.contains("books"), "rows: {text}");
        assert!(text.contains("15"), "batch rate 25 - 10 over 1 s: {text}");
        assert!(text.contains("batch latency (us, log2) — wiki / latency"), "selected row's histogram: {text}");
        assert!(text.contains("1K"), "latency bucket labels: {text}");
        assert!(text.contains("slow batches (>= 10 ms) kept: 1"));
        assert!(
            text.contains(
                "kernel io_uring (1 in 8 timed): 100 requests, 0 errors, request latency p50 <64 us, p99 <128 us"
            ),
            "{text}"
        );
        state.step(true, 2);
        terminal.draw(|f| draw(f, &snapshot(25), &mut state)).expect("draw");
        assert!(screen(&terminal).contains("— books / bulk"), "selection moves down");
    }

    #[test]
    fn says_why_there_is_no_trace() {
        let mut terminal = Terminal::new(TestBackend::new(100, 20)).expect("terminal");
        let trace = serde_json::json!({"available": false, "reason": "eBPF tracing is off"});
        let snapshot = Snapshot { trace, caches: vec![cache_view::tests::report("web", 100, 1 << 20)] };
        terminal.draw(|f| draw(f, &snapshot, &mut TopState::default())).expect("draw");
        let text = screen(&terminal);
        assert!(text.contains("no trace: eBPF tracing is off"), "{text}");
        assert!(
            text.contains("cache tier") && text.contains("web") && text.contains("25.0%"),
            "caches without a trace: {text}"
        );
    }

    #[test]
    fn log2_bars_trim_to_the_buckets_in_use() {
        let bars = log2_bars(&serde_json::json!([0, 0, 4, 0, 9, 0]));
        assert_eq!(bars, vec![("8".to_string(), 4), ("16".to_string(), 0), ("32".to_string(), 9)]);
        assert!(log2_bars(&serde_json::json!([])).is_empty());
    }
}
