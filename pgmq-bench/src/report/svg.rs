//! A hand-written SVG chart of one document: worker throughput by handler
//! count (median bar, min–max whisker, the baseline loop as a dashed line)
//! and latency percentiles on a log scale (handler duration per handler
//! count, wake-up latency per mode).

use std::fmt::Write as _;

use crate::document::{Document, Figure};
use crate::report::thousands;
use crate::report::worker_counts;

const W: f64 = 1000.0;
const H: f64 = 500.0;
const PANEL_W: f64 = 470.0;
const TOP: f64 = 60.0;
const PLOT_H: f64 = 300.0;
const COLORS: [&str; 6] = [
    "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b",
];

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// A "nice" axis maximum: 1, 2 or 5 times a power of ten, at least `v`.
fn nice_max(v: f64) -> f64 {
    if v <= 0.0 {
        return 1.0;
    }
    let p = 10f64.powf(v.log10().floor());
    for m in [1.0, 1.5, 2.0, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0] {
        if m * p >= v {
            return m * p;
        }
    }
    10.0 * p
}

fn text(out: &mut String, x: f64, y: f64, anchor: &str, size: u32, s: &str) {
    let _ = writeln!(
        out,
        r#"<text x="{x:.1}" y="{y:.1}" text-anchor="{anchor}" font-size="{size}">{}</text>"#,
        esc(s)
    );
}

/// One chart panel: its title, its plot area (from `left`, `plot_w` wide,
/// from `TOP`, `PLOT_H` high), grid lines, axes and caption.
struct Panel {
    x0: f64,
    left: f64,
    plot_w: f64,
}

impl Panel {
    /// A panel whose left edge is at `x0`, its title written.
    fn start(out: &mut String, x0: f64, title: &str) -> Panel {
        text(out, x0 + PANEL_W / 2.0, 30.0, "middle", 15, title);
        Panel {
            x0,
            left: x0 + 70.0,
            plot_w: PANEL_W - 80.0,
        }
    }

    /// Says, in the middle of the plot area, that there is nothing to plot.
    fn nothing(&self, out: &mut String, what: &str) {
        text(
            out,
            self.x0 + PANEL_W / 2.0,
            TOP + PLOT_H / 2.0,
            "middle",
            13,
            what,
        );
    }

    /// A horizontal grid line at `y`, labelled `label` left of the axis.
    fn grid(&self, out: &mut String, y: f64, label: &str) {
        let _ = writeln!(
            out,
            r##"<line x1="{:.1}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="#ddd"/>"##,
            self.left,
            self.left + self.plot_w
        );
        text(out, self.left - 6.0, y + 4.0, "end", 11, label);
    }

    /// The y axis, and with `x_axis` the x axis along the bottom.
    fn axes(&self, out: &mut String, x_axis: bool) {
        let left = self.left;
        let _ = write!(
            out,
            r##"<line x1="{left:.1}" y1="{TOP:.1}" x2="{left:.1}" y2="{:.1}" stroke="#000"/>"##,
            TOP + PLOT_H
        );
        if x_axis {
            let _ = write!(
                out,
                r##"<line x1="{left:.1}" y1="{:.1}" x2="{:.1}" y2="{:.1}" stroke="#000"/>"##,
                TOP + PLOT_H,
                left + self.plot_w,
                TOP + PLOT_H
            );
        }
        out.push('\n');
    }

    /// The caption under the x axis.
    fn caption(&self, out: &mut String, s: &str) {
        text(
            out,
            self.left + self.plot_w / 2.0,
            TOP + PLOT_H + 40.0,
            "middle",
            12,
            s,
        );
    }
}

fn throughput_panel(out: &mut String, d: &Document, x0: f64) {
    let panel = Panel::start(out, x0, "Worker throughput by handler count (msg/s)");
    let (left, plot_w) = (panel.left, panel.plot_w);
    let counts = worker_counts(d);
    if counts.is_empty() {
        panel.nothing(out, "no consume_scaling data");
        return;
    }
    let fig = |w: u32| d.figure(&format!("consume_scaling.w{w}.throughput"));
    let baseline = d.figure("baseline.consume.rate").map(|f| f.median);
    let top = counts
        .iter()
        .filter_map(|w| fig(*w).map(|f| f.max))
        .chain(baseline)
        .fold(0.0, f64::max);
    let ymax = nice_max(top * 1.1);
    let y = |v: f64| TOP + PLOT_H - v / ymax * PLOT_H;
    // Axes and grid.
    for i in 0..=5 {
        let v = ymax * f64::from(i) / 5.0;
        panel.grid(out, y(v), &thousands(v));
    }
    let slot = plot_w / counts.len() as f64;
    for (i, w) in counts.iter().enumerate() {
        let Some(f) = fig(*w) else { continue };
        let cx = left + slot * (i as f64 + 0.5);
        throughput_bar(out, &y, cx, slot * 0.5, *w, f);
    }
    if let Some(b) = baseline {
        baseline_line(out, &panel, y(b), b);
    }
    panel.axes(out, true);
    panel.caption(out, "handlers (bar: median, whisker: min–max over rounds)");
}

/// One handler count's bar (median) centred on `cx`, `bw` wide, with its
/// min–max whisker and its median and handler-count labels; `y` maps a rate
/// to its height.
fn throughput_bar(out: &mut String, y: &impl Fn(f64) -> f64, cx: f64, bw: f64, w: u32, f: &Figure) {
    let _ = writeln!(
        out,
        r##"<rect x="{:.1}" y="{:.1}" width="{bw:.1}" height="{:.1}" fill="#1f77b4"><title>{} handlers: median {} msg/s (min {}, max {})</title></rect>"##,
        cx - bw / 2.0,
        y(f.median),
        (TOP + PLOT_H - y(f.median)).max(0.0),
        w,
        thousands(f.median),
        thousands(f.min),
        thousands(f.max)
    );
    let _ = writeln!(
        out,
        r##"<line x1="{cx:.1}" y1="{:.1}" x2="{cx:.1}" y2="{:.1}" stroke="#000" stroke-width="1.5"/>"##,
        y(f.min),
        y(f.max)
    );
    for v in [f.min, f.max] {
        let _ = writeln!(
            out,
            r##"<line x1="{:.1}" y1="{:.1}" x2="{:.1}" y2="{:.1}" stroke="#000" stroke-width="1.5"/>"##,
            cx - 6.0,
            y(v),
            cx + 6.0,
            y(v)
        );
    }
    text(out, cx, y(f.max) - 6.0, "middle", 11, &thousands(f.median));
    text(out, cx, TOP + PLOT_H + 18.0, "middle", 12, &w.to_string());
}

/// The baseline loop's rate `b` as a dashed line across the plot at height
/// `yb`, and its legend entry above the plot.
fn baseline_line(out: &mut String, panel: &Panel, yb: f64, b: f64) {
    let (left, plot_w) = (panel.left, panel.plot_w);
    let _ = writeln!(
        out,
        r##"<line x1="{left:.1}" y1="{yb:.1}" x2="{:.1}" y2="{yb:.1}" stroke="#d62728" stroke-dasharray="6 4" stroke-width="1.5"/>"##,
        left + plot_w,
    );
    let ly = TOP - 14.0;
    let _ = writeln!(
        out,
        r##"<line x1="{left:.1}" y1="{ly:.1}" x2="{:.1}" y2="{ly:.1}" stroke="#d62728" stroke-dasharray="6 4" stroke-width="1.5"/>"##,
        left + 24.0
    );
    text(
        out,
        left + 30.0,
        ly + 4.0,
        "start",
        11,
        &format!(
            "baseline: read + delete on 1 connection, no SDK ({} msg/s)",
            thousands(b)
        ),
    );
}

/// The percentiles the latency panel plots, left to right.
const QUANTILES: [&str; 4] = ["p50", "p95", "p99", "max"];

/// One line of the latency panel: its legend label, its value per entry of
/// [`QUANTILES`], and whether it is a dashed wake-up line.
struct Series {
    label: String,
    vals: Vec<f64>,
    dashed: bool,
}

/// The latency series of a document: handler duration per handler count,
/// then wake-up latency per mode, each only when all its percentiles are there.
fn latency_series(d: &Document) -> Vec<Series> {
    let medians = |prefix: &str| -> Option<Vec<f64>> {
        QUANTILES
            .iter()
            .map(|q| d.figure(&format!("{prefix}.{q}_ms")).map(|f| f.median))
            .collect()
    };
    let mut series = Vec::new();
    for w in worker_counts(d) {
        if let Some(vals) = medians(&format!("consume_scaling.w{w}.handler")) {
            series.push(Series {
                label: format!("handler, {w} handlers"),
                vals,
                dashed: false,
            });
        }
    }
    for (mode, label) in [("poll", "wake-up, polling"), ("notify", "wake-up, NOTIFY")] {
        if let Some(vals) = medians(&format!("wakeup_latency.{mode}")) {
            series.push(Series {
                label: label.to_owned(),
                vals,
                dashed: true,
            });
        }
    }
    series
}

/// A log-scale y axis from `10^lo` to `10^hi` ms over the plot's height.
struct LogScale {
    lo: f64,
    hi: f64,
}

impl LogScale {
    /// The whole decades around the positive values, at least one decade;
    /// none without a positive value.
    fn around(series: &[Series]) -> Option<LogScale> {
        let positive: Vec<f64> = series
            .iter()
            .flat_map(|s| s.vals.iter().copied())
            .filter(|v| *v > 0.0)
            .collect();
        if positive.is_empty() {
            return None;
        }
        let lo = positive
            .iter()
            .copied()
            .fold(f64::INFINITY, f64::min)
            .log10()
            .floor();
        let hi = positive
            .iter()
            .copied()
            .fold(0.0, f64::max)
            .log10()
            .ceil()
            .max(lo + 1.0);
        Some(LogScale { lo, hi })
    }

    /// The height of `v`, values below the axis drawn at its bottom.
    fn y(&self, v: f64) -> f64 {
        let (lo, hi) = (self.lo, self.hi);
        let l = v.max(10f64.powf(lo)).log10();
        TOP + PLOT_H - (l - lo) / (hi - lo) * PLOT_H
    }

    /// A grid line per decade, labelled with its value.
    fn grid(&self, out: &mut String, panel: &Panel) {
        let mut e = self.lo;
        while e <= self.hi {
            let v = 10f64.powf(e);
            let label = if v >= 1.0 {
                format!("{v:.0}")
            } else {
                format!("{v}")
            };
            panel.grid(out, self.y(v), &label);
            e += 1.0;
        }
    }
}

fn latency_panel(out: &mut String, d: &Document, x0: f64) {
    let panel = Panel::start(out, x0, "Latency percentiles (ms, log scale)");
    let (left, plot_w) = (panel.left, panel.plot_w);
    let series = latency_series(d);
    let Some(scale) = LogScale::around(&series) else {
        panel.nothing(out, "no latency data");
        return;
    };
    scale.grid(out, &panel);
    let x = |i: usize| left + plot_w * (i as f64 + 0.5) / QUANTILES.len() as f64;
    for (i, q) in QUANTILES.iter().enumerate() {
        text(out, x(i), TOP + PLOT_H + 18.0, "middle", 12, q);
    }
    for (k, s) in series.iter().enumerate() {
        latency_line(out, &panel, &scale, &x, k, s);
    }
    panel.axes(out, false);
    panel.caption(out, "percentile (medians over rounds)");
}

/// Series number `k`: its line and points (`x` maps a percentile's index to
/// its position) and its legend entry, two entries a row under the caption.
fn latency_line(
    out: &mut String,
    panel: &Panel,
    scale: &LogScale,
    x: &impl Fn(usize) -> f64,
    k: usize,
    s: &Series,
) {
    let (left, plot_w) = (panel.left, panel.plot_w);
    let (label, vals, dashed) = (&s.label, &s.vals, s.dashed);
    let color = if dashed {
        if label.contains("NOTIFY") {
            "#000"
        } else {
            "#777"
        }
    } else {
        COLORS[k % COLORS.len()]
    };
    let points: Vec<String> = vals
        .iter()
        .enumerate()
        .map(|(i, v)| format!("{:.1},{:.1}", x(i), scale.y(*v)))
        .collect();
    let _ = writeln!(
        out,
        r#"<polyline points="{}" fill="none" stroke="{color}" stroke-width="2"{}/>"#,
        points.join(" "),
        if dashed {
            r#" stroke-dasharray="6 4""#
        } else {
            ""
        }
    );
    for (i, v) in vals.iter().enumerate() {
        let _ = writeln!(
            out,
            r#"<circle cx="{:.1}" cy="{:.1}" r="3" fill="{color}"><title>{}: {} {v} ms</title></circle>"#,
            x(i),
            scale.y(*v),
            esc(label),
            QUANTILES[i]
        );
    }
    let ly = TOP + PLOT_H + 62.0 + 15.0 * (k / 2) as f64;
    let lx = left + (plot_w / 2.0) * (k % 2) as f64;
    let _ = writeln!(
        out,
        r#"<line x1="{lx:.1}" y1="{ly:.1}" x2="{:.1}" y2="{ly:.1}" stroke="{color}" stroke-width="2"{}/>"#,
        lx + 14.0,
        if dashed {
            r#" stroke-dasharray="4 2""#
        } else {
            ""
        }
    );
    text(out, lx + 17.0, ly + 4.0, "start", 10, label);
}

/// The SVG document.
pub fn render(d: &Document) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" viewBox="0 0 {W} {H}" font-family="sans-serif">"#
    );
    let _ = writeln!(out, r##"<rect width="100%" height="100%" fill="#fff"/>"##);
    throughput_panel(&mut out, d, 0.0);
    latency_panel(&mut out, d, PANEL_W + 40.0);
    let m = &d.metadata;
    text(
        &mut out,
        10.0,
        H - 10.0,
        "start",
        10,
        &format!(
            "pgmq-bench {} {} · PostgreSQL {} · PGMQ {} · {} × {} · {} warm-up + {} rounds · {}",
            m.sdk.version,
            m.build.profile,
            m.database.server_version_num,
            m.database.pgmq_version,
            m.host.cpu_count,
            m.host.cpu_model.as_deref().unwrap_or("?"),
            d.protocol.warmup,
            d.protocol.repeat,
            m.started_at.format("%Y-%m-%d %H:%M UTC")
        ),
    );
    out.push_str("</svg>\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nice_maxima() {
        assert_eq!(nice_max(0.0), 1.0);
        assert_eq!(nice_max(3.2), 4.0);
        assert_eq!(nice_max(28_000.0), 30_000.0);
        assert_eq!(nice_max(45_000.0), 50_000.0);
        assert_eq!(nice_max(100.0), 100.0);
        assert_eq!(esc("a<b&c"), "a&lt;b&amp;c");
    }
}
