//! Charts as inline SVG built on the server from numbers only (no text from
//! the database goes into them unescaped).

use maud::{html, Markup};

/// A horizontal bar of `width` pixels: `part` of `whole` filled, and
/// `inner` of it (in flight, say) in a darker shade.
pub(crate) fn bar(part: i64, inner: i64, whole: i64, width: u32) -> Markup {
    let scale = |n: i64| {
        if whole <= 0 {
            0.0
        } else {
            (n.clamp(0, whole) as f64 / whole as f64) * f64::from(width)
        }
    };
    let (w, wi) = (scale(part), scale(inner.min(part)));
    html! {
        svg width=(width) height="10" role="img" aria-label="depth" {
            rect x="0" y="0" width=(width) height="10" fill="#eef" {}
            rect x="0" y="0" width=(format!("{w:.1}")) height="10" fill="#7b8fd6" {}
            rect x="0" y="0" width=(format!("{wi:.1}")) height="10" fill="#2f3f8f" {}
        }
    }
}

/// A line of `values` (oldest first) scaled to the largest, `width` by
/// `height` pixels: a queue's recent rate at a glance.
pub(crate) fn spark(values: &[f64], width: u32, height: u32) -> Markup {
    let max = values.iter().fold(0.0_f64, |m, v| m.max(*v));
    let (w, h) = (f64::from(width), f64::from(height));
    let step = w / (values.len().max(2) - 1) as f64;
    let points: Vec<String> = values
        .iter()
        .enumerate()
        .map(|(i, v)| {
            let y = if max > 0.0 {
                h - 1.0 - (h - 2.0) * v / max
            } else {
                h - 1.0
            };
            format!("{:.1},{:.1}", step * i as f64, y)
        })
        .collect();
    html! {
        svg width=(width) height=(height) role="img" aria-label="rate" {
            rect x="0" y="0" width=(width) height=(height) fill="#f4f6fb" {}
            polyline points=(points.join(" ")) fill="none" stroke="#2f3f8f" stroke-width="1.5" {}
        }
    }
}

/// A named series of values, one per label (None: not measured).
pub(crate) struct Series {
    pub(crate) name: String,
    pub(crate) values: Vec<Option<f64>>,
}

/// The series' colours, in turn.
const COLOURS: [&str; 6] = [
    "#2f3f8f", "#d9822b", "#7b8fd6", "#f0b27a", "#1b6e2a", "#a0c88f",
];

/// A grouped bar chart: a group per label, a bar per series, scaled to the
/// largest value, with the value over each bar and a legend. Labels and
/// names are text, escaped like any other.
pub(crate) fn bars(labels: &[String], series: &[Series], unit: &str) -> Markup {
    let (w, h, top, bottom, left) = (720.0_f64, 260.0_f64, 20.0, 40.0, 10.0);
    let max = series
        .iter()
        .flat_map(|s| s.values.iter().flatten())
        .fold(0.0_f64, |m, v| m.max(*v));
    let group_w = (w - left) / labels.len().max(1) as f64;
    let bar_w = (group_w * 0.8 / series.len().max(1) as f64).max(1.0);
    let y = |v: f64| {
        if max > 0.0 {
            (h - top - bottom) * v / max
        } else {
            0.0
        }
    };
    let legend_h = 16.0 * series.len() as f64;
    html! {
        svg width=(w) height=(h + legend_h) role="img" aria-label=(unit) {
            @for (i, label) in labels.iter().enumerate() {
                @let gx = left + group_w * i as f64;
                @for (j, s) in series.iter().enumerate() {
                    @if let Some(Some(v)) = s.values.get(i) {
                        @let bh = y(*v);
                        @let x = gx + group_w * 0.1 + bar_w * j as f64;
                        rect x=(format!("{x:.1}")) y=(format!("{:.1}", h - bottom - bh))
                            width=(format!("{:.1}", bar_w - 1.0)) height=(format!("{bh:.1}"))
                            fill=(COLOURS[j % COLOURS.len()]) {}
                        text x=(format!("{:.1}", x + bar_w / 2.0)) y=(format!("{:.1}", h - bottom - bh - 3.0))
                            font-size="9" text-anchor="middle" { (short(*v)) }
                    }
                }
                text x=(format!("{:.1}", gx + group_w / 2.0)) y=(format!("{:.1}", h - bottom + 16.0))
                    font-size="12" text-anchor="middle" { (label) }
            }
            @for (j, s) in series.iter().enumerate() {
                @let ly = h + 12.0 + 16.0 * j as f64 - 10.0;
                rect x=(left) y=(format!("{ly:.1}")) width="10" height="10" fill=(COLOURS[j % COLOURS.len()]) {}
                text x=(left + 16.0) y=(format!("{:.1}", ly + 9.0)) font-size="11" { (s.name) " (" (unit) ")" }
            }
        }
    }
}

/// A value in a few characters: `12.3k`, `456`, `7.89`.
fn short(v: f64) -> String {
    match v.abs() {
        a if a >= 10_000.0 => format!("{:.1}k", v / 1000.0),
        a if a >= 100.0 => format!("{v:.0}"),
        a if a >= 1.0 => format!("{v:.1}"),
        _ => format!("{v:.2}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grouped_bars_escape_names_and_skip_missing_values() {
        let labels = vec!["1 handlers".to_owned(), "2 handlers".to_owned()];
        let s = vec![Series {
            name: "<b>".into(),
            values: vec![Some(100.0), None],
        }];
        let svg = bars(&labels, &s, "msg/s").into_string();
        assert!(svg.contains("&lt;b&gt;") && !svg.contains("<b>"));
        assert_eq!(
            svg.matches("<rect").count(),
            2,
            "one bar and one legend box"
        );
    }

    #[test]
    fn a_bar_never_overflows() {
        let s = bar(500, 10, 100, 120).into_string();
        assert!(s.contains("width=\"120.0\""));
        let s = bar(1, 0, 0, 120).into_string();
        assert!(s.contains("width=\"0.0\""));
    }
}
