//! The bench's output: Markdown tables for people, JSON for tools, and an
//! SVG strip chart of every takeover trial against its bound.

use std::fmt::Write;
use std::io::IsTerminal;
use std::time::Duration;

use serde::Serialize;

/// One timed scenario: every trial's figure, and what it is held against.
#[derive(Debug, Clone, Serialize)]
pub struct Series {
    pub scenario: String,
    #[serde(serialize_with = "as_ms_list")]
    pub samples: Vec<Duration>,
    /// The bound docs/behaviour.md gives for these timings (E2-E6, N10), ms.
    pub bound_ms: u64,
    /// leasehold's own goal, ms at p99, where it sets one.
    pub goal_ms: Option<u64>,
}

fn as_ms_list<S: serde::Serializer>(v: &[Duration], s: S) -> Result<S::Ok, S::Error> {
    s.collect_seq(v.iter().map(|d| d.as_secs_f64() * 1000.0))
}

impl Series {
    pub fn new(scenario: &str, bound_ms: u64, goal_ms: Option<u64>) -> Self {
        Self {
            scenario: scenario.to_owned(),
            samples: Vec::new(),
            bound_ms,
            goal_ms,
        }
    }

    pub fn push(&mut self, d: Duration) {
        self.samples.push(d);
    }

    fn sorted(&self) -> Vec<Duration> {
        let mut s = self.samples.clone();
        s.sort();
        s
    }

    pub fn p(&self, pct: f64) -> Duration {
        percentile(&self.sorted(), pct)
    }

    /// Within the bound of docs/behaviour.md at the maximum.
    pub fn within_bound(&self) -> bool {
        self.p(100.0) <= Duration::from_millis(self.bound_ms)
    }

    pub fn goal_met(&self) -> Option<bool> {
        self.goal_ms
            .map(|g| self.p(99.0) <= Duration::from_millis(g))
    }
}

/// One figure that is not a set of trials (cost, messaging).
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    pub scenario: String,
    pub goal: String,
    pub measured: String,
    pub met: Option<bool>,
}

impl Row {
    pub fn new(scenario: String, goal: String, measured: String, met: Option<bool>) -> Self {
        Self {
            scenario,
            goal,
            measured,
            met,
        }
    }
}

fn cell_ms(d: Duration) -> String {
    let v = d.as_secs_f64() * 1000.0;
    if v < 10.0 {
        format!("{v:.2}")
    } else {
        format!("{v:.0}")
    }
}

fn verdict(met: Option<bool>) -> &'static str {
    match met {
        Some(true) => "yes",
        Some(false) => "**missed**",
        None => "–",
    }
}

pub fn markdown(series: &[Series], rows: &[Row]) -> String {
    let mut out = String::new();
    if !series.is_empty() {
        let _ = writeln!(
            out,
            "| scenario | trials | p50 ms | p99 ms | max ms | spec bound ms | within bound | goal p99 ms | goal met |"
        );
        let _ = writeln!(out, "|---|---|---|---|---|---|---|---|---|");
        for s in series {
            let _ = writeln!(
                out,
                "| {} | {} | {} | {} | {} | {} | {} | {} | {} |",
                s.scenario,
                s.samples.len(),
                cell_ms(s.p(50.0)),
                cell_ms(s.p(99.0)),
                cell_ms(s.p(100.0)),
                s.bound_ms,
                if s.within_bound() { "yes" } else { "**no**" },
                s.goal_ms.map_or("–".to_owned(), |g| format!("≤ {g}")),
                verdict(s.goal_met()),
            );
        }
        out.push('\n');
    }
    if !rows.is_empty() {
        let _ = writeln!(out, "| scenario | goal | measured | goal met |");
        let _ = writeln!(out, "|---|---|---|---|");
        for r in rows {
            let _ = writeln!(
                out,
                "| {} | {} | {} | {} |",
                r.scenario,
                r.goal,
                r.measured,
                verdict(r.met)
            );
        }
    }
    out
}

#[derive(Serialize)]
struct Json<'a> {
    timings: &'a leasehold_engine::ElectionConfig,
    node_lease_ms: u64,
    trials: usize,
    takeover: Vec<JsonSeries<'a>>,
    figures: &'a [Row],
}

#[derive(Serialize)]
struct JsonSeries<'a> {
    #[serde(flatten)]
    series: &'a Series,
    p50_ms: f64,
    p99_ms: f64,
    max_ms: f64,
    within_bound: bool,
    goal_met: Option<bool>,
}

pub fn json(
    timings: &leasehold_engine::ElectionConfig,
    node_lease_ms: u64,
    trials: usize,
    series: &[Series],
    rows: &[Row],
) -> String {
    let f = |d: Duration| d.as_secs_f64() * 1000.0;
    let doc = Json {
        timings,
        node_lease_ms,
        trials,
        takeover: series
            .iter()
            .map(|s| JsonSeries {
                series: s,
                p50_ms: f(s.p(50.0)),
                p99_ms: f(s.p(99.0)),
                max_ms: f(s.p(100.0)),
                within_bound: s.within_bound(),
                goal_met: s.goal_met(),
            })
            .collect(),
        figures: rows,
    };
    serde_json::to_string_pretty(&doc).unwrap_or_default() + "\n"
}

/// A strip chart: one line per scenario on a shared logarithmic time axis
/// (0.1 ms to 10 s), a dot per trial, the bound of docs/behaviour.md as a red bar and the
/// goal, where there is one, as a green bar.
pub fn svg(series: &[Series], title: &str) -> String {
    const LEFT: f64 = 380.0;
    const WIDTH: f64 = 560.0;
    const ROW: f64 = 34.0;
    const TOP: f64 = 48.0;
    let (lo, hi) = (-1.0_f64, 4.0_f64); // log10 ms
    let x = |d_ms: f64| LEFT + (d_ms.max(0.1).log10().clamp(lo, hi) - lo) / (hi - lo) * WIDTH;
    let height = TOP + ROW * series.len() as f64 + 60.0;
    let total_width = LEFT + WIDTH + 30.0;
    let mut out = String::new();
    let _ = writeln!(
        out,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{total_width}" height="{height}" viewBox="0 0 {total_width} {height}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(out, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let _ = writeln!(
        out,
        r#"<text x="10" y="20" font-size="14" font-weight="bold">{}</text>"#,
        escape(title)
    );
    // Grid: decades from 0.1 ms to 10 s.
    let axis_y = TOP + ROW * series.len() as f64;
    for (i, label) in ["0.1 ms", "1 ms", "10 ms", "100 ms", "1 s", "10 s"]
        .iter()
        .enumerate()
    {
        let gx = x(10f64.powi(i as i32 - 1));
        let _ = writeln!(
            out,
            r##"<line x1="{gx:.1}" y1="{}" x2="{gx:.1}" y2="{axis_y:.1}" stroke="#ddd"/><text x="{gx:.1}" y="{:.1}" text-anchor="middle" fill="#555">{label}</text>"##,
            TOP - 10.0,
            axis_y + 16.0
        );
    }
    for (i, s) in series.iter().enumerate() {
        let cy = TOP + ROW * i as f64 + ROW / 2.0;
        let _ = writeln!(
            out,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"#,
            LEFT - 10.0,
            cy + 4.0,
            escape(&s.scenario)
        );
        let bx = x(s.bound_ms as f64);
        let _ = writeln!(
            out,
            r##"<line x1="{bx:.1}" y1="{:.1}" x2="{bx:.1}" y2="{:.1}" stroke="#c00" stroke-width="3"><title>spec bound {} ms</title></line>"##,
            cy - 12.0,
            cy + 12.0,
            s.bound_ms
        );
        if let Some(g) = s.goal_ms {
            let gx = x(g as f64);
            let _ = writeln!(
                out,
                r##"<line x1="{gx:.1}" y1="{:.1}" x2="{gx:.1}" y2="{:.1}" stroke="#080" stroke-width="3"><title>goal p99 ≤ {g} ms</title></line>"##,
                cy - 12.0,
                cy + 12.0
            );
        }
        for (k, d) in s.samples.iter().enumerate() {
            let v = d.as_secs_f64() * 1000.0;
            // A little vertical jitter, deterministic, so equal values show.
            let jitter = ((k * 7) % 9) as f64 - 4.0;
            let _ = writeln!(
                out,
                r##"<circle cx="{:.1}" cy="{:.1}" r="3" fill="#1f5fbf" fill-opacity="0.6"><title>{v:.2} ms</title></circle>"##,
                x(v),
                cy + jitter
            );
        }
    }
    let _ = writeln!(
        out,
        r##"<text x="{LEFT}" y="{:.1}" fill="#555">dots: trials · red: the spec's bound · green: leasehold's p99 goal · log scale</text>"##,
        axis_y + 40.0
    );
    out.push_str("</svg>\n");
    out
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// The value at percentile `p` (0-100) of sorted durations.
pub fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = ((p / 100.0) * (sorted.len() - 1) as f64).round() as usize;
    sorted[rank.min(sorted.len() - 1)]
}

/// A duration in milliseconds, as the tables show it.
pub fn ms(d: Duration) -> String {
    format!("{:.3} ms", d.as_secs_f64() * 1000.0)
}

/// A fresh key prefix per run, so a bench never touches other data.
pub fn prefix() -> String {
    format!("leasehold-bench-{:08x}", fastrand::u32(..))
}

/// Progress on standard error: one line per step (rewritten in place on a
/// terminal), so the tables on standard output stay clean.
pub fn progress(what: &str) {
    if std::io::stderr().is_terminal() {
        eprint!("\r\x1b[2Kbench: {what}");
    } else {
        eprintln!("bench: {what}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn series() -> Series {
        let mut s = Series::new("crash <x>", 1200, Some(10));
        for ms in [3, 5, 4, 12] {
            s.push(Duration::from_millis(ms));
        }
        s
    }

    #[test]
    fn the_table_says_when_a_goal_is_missed() {
        let md = markdown(&[series()], &[]);
        assert!(
            md.contains("| crash <x> | 4 | 5.00 | 12 | 12 | 1200 | yes | ≤ 10 | **missed** |"),
            "{md}"
        );
    }

    #[test]
    fn the_chart_has_a_dot_per_trial_and_escapes_names() {
        let svg = svg(&[series()], "t");
        assert_eq!(svg.matches("<circle").count(), 4);
        assert!(svg.contains("crash &lt;x&gt;"));
    }
}
