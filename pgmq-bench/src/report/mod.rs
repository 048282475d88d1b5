//! Reading documents back: the Markdown summary, the SVG chart, the
//! comparison of two documents, and the target checks.

pub mod check;
pub mod compare;
pub mod markdown;
pub mod svg;

use crate::document::Figure;

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
