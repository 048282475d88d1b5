//! Reading documents back: the Markdown summary, the SVG chart, the
//! comparison of two documents, and the target checks.

pub mod check;
pub mod compare;
pub mod markdown;
pub mod summary;
pub mod svg;

use std::collections::BTreeSet;
use std::fmt::Write as _;

use crate::document::{Document, Figure, Runs};

/// Formats `v` for a table in `unit`: rates without decimals and with
/// thousands separators, milliseconds with enough decimals for microseconds.
///
/// ```
/// use pgmq_bench::report::fmt_value;
/// assert_eq!(fmt_value(34712.4, "msg/s"), "34,712");
/// assert_eq!(fmt_value(0.0042, "ms"), "0.0042");
/// assert_eq!(fmt_value(1.456, "x"), "1.46");
/// ```
pub fn fmt_value(v: f64, unit: &str) -> String {
    if !v.is_finite() {
        return "n/a".to_owned();
    }
    match unit {
        "msg/s" | "msg" => thousands(v),
        "ms" => {
            let a = v.abs();
            if a >= 100.0 {
                format!("{v:.1}")
            } else if a >= 1.0 {
                format!("{v:.2}")
            } else if a >= 0.1 {
                format!("{v:.3}")
            } else {
                format!("{v:.4}")
            }
        }
        "x" | "%" | "1/s" => format!("{v:.2}"),
        "MiB" => format!("{v:.1}"),
        _ => format!("{v:.3}"),
    }
}

/// `1 measured round`, `2 measured rounds`: `n` and `what`, plural unless
/// `n` is 1.
pub(crate) fn count(n: u32, what: &str) -> String {
    format!("{n} {what}{}", if n == 1 { "" } else { "s" })
}

/// A run's round in a report's table: `2`, or `2 (warm-up)`.
pub(crate) fn round_cell(round: u32, warmup: bool) -> String {
    format!("{round}{}", if warmup { " (warm-up)" } else { "" })
}

/// `1234567.8` -> `1,234,568`.
pub fn thousands(v: f64) -> String {
    let neg = v < 0.0;
    let digits = format!("{:.0}", v.abs());
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    if neg {
        format!("-{out}")
    } else {
        out
    }
}

/// A `pg_settings` value with its unit, as `SHOW` prints it: `pg_settings`
/// gives memory in multiples of its unit (`shared_buffers` 32768 in units of
/// `8kB`, which pasted together read `327688kB`), so the value is multiplied
/// out and printed in the largest unit that divides it (`256MB`); times keep
/// their unit (`200ms`, `60s`).
///
/// ```
/// use pgmq_bench::report::fmt_setting;
/// assert_eq!(fmt_setting("32768", Some("8kB")), "256MB");
/// assert_eq!(fmt_setting("40961", Some("8kB")), "327688kB");
/// assert_eq!(fmt_setting("4096", Some("kB")), "4MB");
/// assert_eq!(fmt_setting("64", Some("16MB")), "1GB");
/// assert_eq!(fmt_setting("200", Some("ms")), "200ms");
/// assert_eq!(fmt_setting("on", None), "on");
/// assert_eq!(fmt_setting("-1", Some("kB")), "-1");
/// ```
pub fn fmt_setting(setting: &str, unit: Option<&str>) -> String {
    let Some(unit) = unit.filter(|u| !u.is_empty()) else {
        return setting.to_owned();
    };
    let Ok(n) = setting.parse::<i64>() else {
        return format!("{setting}{unit}");
    };
    if n < 0 {
        // -1 and the like mean "off" or "use another setting": no unit.
        return setting.to_owned();
    }
    let (mult, base) = unit
        .find(|c: char| !c.is_ascii_digit())
        .map(|i| (unit[..i].parse::<i64>().unwrap_or(1), &unit[i..]))
        .unwrap_or((1, unit));
    let bytes_per = match base {
        "B" => Some(1i64),
        "kB" => Some(1 << 10),
        "MB" => Some(1 << 20),
        "GB" => Some(1 << 30),
        "TB" => Some(1 << 40),
        _ => None,
    };
    let Some(per) = bytes_per else {
        // Times (ms, s, min) and anything unknown: as given.
        return if mult == 1 {
            format!("{n}{base}")
        } else {
            format!("{}{base}", n * mult)
        };
    };
    let bytes = n.saturating_mul(mult).saturating_mul(per);
    if bytes == 0 {
        return format!("0{base}");
    }
    for (name, size) in [
        ("TB", 1i64 << 40),
        ("GB", 1 << 30),
        ("MB", 1 << 20),
        ("kB", 1 << 10),
    ] {
        if bytes % size == 0 {
            return format!("{}{name}", bytes / size);
        }
    }
    format!("{bytes}B")
}

/// `median (min–max)` of a figure.
pub fn fmt_figure(f: &Figure) -> String {
    if f.runs.len() <= 1 || (f.min == f.max) {
        fmt_value(f.median, &f.unit)
    } else {
        format!(
            "{} ({}–{})",
            fmt_value(f.median, &f.unit),
            fmt_value(f.min, &f.unit),
            fmt_value(f.max, &f.unit)
        )
    }
}

/// The workload fields `W` of `d` when it holds the figure `id`: what a
/// section's part of the report is written from, None when the figure is
/// absent or the fields do not parse.
pub(crate) fn workload_if<W: serde::de::DeserializeOwned>(d: &Document, id: &str) -> Option<W> {
    fig(d, id)?;
    d.metadata.workload.options_of::<W>().ok()
}

/// A section's runs in `d` and the workload fields `W` they ran with: what
/// its part of the report is written from, None when it has no runs or
/// either does not parse.
pub(crate) fn runs_and_workload<T, W>(d: &Document, runs: &Runs<T>) -> Option<(Vec<T>, W)>
where
    T: serde::Serialize + serde::de::DeserializeOwned,
    W: serde::de::DeserializeOwned,
{
    let runs = runs.of(&d.sections).ok().filter(|r| !r.is_empty())?;
    Some((runs, d.metadata.workload.options_of::<W>().ok()?))
}

pub(crate) fn fig<'a>(d: &'a Document, id: &str) -> Option<&'a Figure> {
    d.figure(id)
}

pub(crate) fn cell(d: &Document, id: &str) -> String {
    fig(d, id).map(fmt_figure).unwrap_or_else(|| "–".to_owned())
}

/// Writes the definitions of the given figures once each.
pub(crate) fn definitions(out: &mut String, d: &Document, ids: &[String]) {
    let mut seen = BTreeSet::new();
    for id in ids {
        if let Some(f) = fig(d, id) {
            if seen.insert(f.definition.clone()) {
                let _ = writeln!(
                    out,
                    "- *{}*: {}",
                    f.label.trim_end_matches(','),
                    f.definition
                );
            }
        }
    }
    out.push('\n');
}

/// The numbers `<prefix><n><suffix>` among the figure ids, ascending.
pub(crate) fn figure_keys(d: &Document, prefix: &str, suffix: &str) -> Vec<u64> {
    crate::figures::counts_in_ids(&d.figures, prefix, suffix)
}

pub(crate) const MIB: f64 = 1024.0 * 1024.0;

/// Handler counts present in the document, ascending.
pub fn worker_counts(d: &Document) -> Vec<u32> {
    figure_keys(d, "consume_scaling.w", ".throughput")
        .into_iter()
        .map(|n| n as u32)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thousands_separators() {
        assert_eq!(thousands(0.0), "0");
        assert_eq!(thousands(999.4), "999");
        assert_eq!(thousands(1000.0), "1,000");
        assert_eq!(thousands(-1234567.0), "-1,234,567");
    }

    #[test]
    fn units() {
        assert_eq!(fmt_value(409.232, "ms"), "409.2");
        assert_eq!(fmt_value(10.1499, "ms"), "10.15");
        assert_eq!(fmt_value(f64::NAN, "ms"), "n/a");
        assert_eq!(fmt_value(12.345, "MiB"), "12.3");
    }
}
