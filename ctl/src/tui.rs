//! `sluicectl top`'s terminal UI (ratatui): the node's eBPF trace per
//! dataset and lane, refreshed every interval, with the latency and size
//! histograms of the selected row and the count of slow batches kept;
//! below them the cache tier of the source-backed datasets.

use std::time::{Duration, Instant};

use ratatui::crossterm::event::{self, Event, KeyCode, KeyEventKind};
use ratatui::layout::{Constraint, Layout};
use ratatui::style::{Modifier, Style};
use ratatui::widgets::{BarChart, Block, Paragraph, Row, Table, TableState};
use ratatui::Frame;
use sluice_proto::api::{CacheReport, TraceEntry, TraceSnapshot};

use crate::cache_view::{self, CacheRates};
use crate::trace_view::{self, TraceRates};

/// What one refresh fetches: `GET /v1/trace` and `GET /v1/caches`; as
/// JSON (`top --json`), the trace's fields and `caches` beside them.
#[derive(serde::Serialize)]
pub struct Snapshot {
    #[serde(flatten)]
    pub trace: TraceSnapshot,
    pub caches: Vec<CacheReport>,
}

/// What the UI remembers between snapshots.
#[derive(Default)]
pub struct TopState {
    trace_rates: TraceRates,
    cache_rates: CacheRates,
    table: TableState,
}

impl TopState {
    /// Takes a new snapshot: rates are the difference from the last.
    pub fn update(&mut self, snapshot: &Snapshot, interval_s: f64) {
        self.cache_rates.update(&snapshot.caches, interval_s);
        self.trace_rates.update(&snapshot.trace, interval_s);
        let rows = snapshot.trace.entries.len();
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

/// `(label, count)` bars of a log2 histogram whose bucket i holds values
/// up to 2^(i+1), trimmed to the buckets in use.
fn log2_bars(counts: &[u64]) -> Vec<(String, u64)> {
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
    let trace = &snapshot.trace;
    if !trace.available {
        let reason = trace.reason.as_deref().unwrap_or("unknown");
        frame.render_widget(
            Paragraph::new(format!("no trace: {reason}")).block(Block::bordered().title("sluice top")),
            table_area,
        );
        return;
    }
    let rows = state.trace_rates.rows(trace);
    let widths = [
        Constraint::Min(16),
        Constraint::Length(8),
        Constraint::Length(10),
        Constraint::Length(9),
        Constraint::Length(12),
        Constraint::Length(14),
        Constraint::Length(7),
        Constraint::Length(11),
        Constraint::Length(15),
    ];
    let table = Table::new(rows.into_iter().map(Row::new), widths)
        .header(Row::new(trace_view::HEADER).style(Style::default().add_modifier(Modifier::BOLD)))
        .row_highlight_style(Style::default().add_modifier(Modifier::REVERSED))
        .block(Block::bordered().title("sluice top: small-read traffic from the node's eBPF probes"));
    frame.render_stateful_widget(table, table_area, &mut state.table);

    let [latency_area, size_area] =
        Layout::horizontal([Constraint::Percentage(50), Constraint::Percentage(50)]).areas(charts_area);
    let selected = state.table.selected().and_then(|i| trace.entries.get(i));
    let title = |what: &str| match selected {
        Some(e) => format!("{what} — {} / {}", e.name(), e.lane.name()),
        None => what.to_string(),
    };
    let latency = |e: &TraceEntry| log2_bars(&e.latency_log2_us);
    let size = |e: &TraceEntry| log2_bars(&e.size_log2);
    for (area, bars_of, what) in [
        (latency_area, &latency as &dyn Fn(&TraceEntry) -> Vec<(String, u64)>, "batch latency (us, log2)"),
        (size_area, &size, "read size (bytes, log2)"),
    ] {
        let bars = selected.map(bars_of).unwrap_or_default();
        let data: Vec<(&str, u64)> = bars.iter().map(|(l, c)| (l.as_str(), *c)).collect();
        let chart = BarChart::default().block(Block::bordered().title(title(what))).bar_width(5).bar_gap(1).data(&data);
        frame.render_widget(chart, area);
    }
    frame.render_widget(Paragraph::new(trace_view::kernel_line(&trace.kernel)), kernel_area);
    frame.render_widget(
        Paragraph::new(format!("{}    q: quit   up/down: select", trace_view::slow_line(trace))),
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
                        KeyCode::Down | KeyCode::Char('j') => state.step(true, snapshot.trace.entries.len()),
                        KeyCode::Up | KeyCode::Char('k') => state.step(false, snapshot.trace.entries.len()),
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
        Snapshot { trace: trace_view::tests::snapshot(batches), caches: Vec::new() }
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
        let trace = TraceSnapshot::unavailable("eBPF tracing is off");
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
        let bars = log2_bars(&[0, 0, 4, 0, 9, 0]);
        assert_eq!(bars, vec![("8".to_string(), 4), ("16".to_string(), 0), ("32".to_string(), 9)]);
        assert!(log2_bars(&[]).is_empty());
    }
}
