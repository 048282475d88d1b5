//! The page shell (title, navigation, style) and the small formatting
//! helpers the pages share. Every value goes through maud, which escapes
//! it; nothing here marks text as HTML except the fixed style sheet.

use axum::response::Html;
use maud::{html, Markup, PreEscaped, DOCTYPE};

/// The style sheet, inline (the Content-Security-Policy allows inline
/// style and no script).
const STYLE: &str = "body{font-family:system-ui,sans-serif;margin:0;color:#1d2330}\
nav{background:#1d2330;padding:.6em 1em}nav a{color:#fff;margin-right:1.2em;text-decoration:none}\
main{padding:1em 1.5em}table{border-collapse:collapse;font-size:.9em}\
th,td{border-bottom:1px solid #dde;padding:.3em .6em;text-align:left;vertical-align:top}\
td.n{text-align:right;font-variant-numeric:tabular-nums}\
pre{margin:0;max-width:40em;white-space:pre-wrap;word-break:break-all;font-size:.85em}\
.paused{color:#a15c00;font-weight:bold}.error{color:#b00020}.ok{color:#1b6e2a}\
form.action{display:inline-block;border:1px solid #dde;padding:.5em;margin:.3em .3em .3em 0}\
.muted{color:#667}.gone{color:#b00020}.stopped{color:#667}";

/// A whole page: `title`, the refresh interval if any, the body.
pub(crate) fn shell(title: &str, refresh_secs: Option<u64>, body: Markup) -> Html<String> {
    Html(
        html! {
            (DOCTYPE)
            html lang="en" {
                head {
                    meta charset="utf-8";
                    @if let Some(s) = refresh_secs {
                        meta http-equiv="refresh" content=(s);
                    }
                    title { (title) " · pgmq console" }
                    style { (PreEscaped(STYLE)) }
                }
                body {
                    nav {
                        a href="/" { "Queues" }
                        a href="/fleet" { "Fleet" }
                        a href="/schedules" { "Schedules" }
                        a href="/bench" { "Benchmarks" }
                    }
                    main {
                        h1 { (title) }
                        (body)
                    }
                }
            }
        }
        .into_string(),
    )
}

/// A duration in seconds, short: `42 s`, `7 min`, `3.5 h`, `2.1 d`.
pub(crate) fn age(secs: f64) -> String {
    match secs {
        s if s < 120.0 => format!("{s:.0} s"),
        s if s < 7200.0 => format!("{:.0} min", s / 60.0),
        s if s < 172_800.0 => format!("{:.1} h", s / 3600.0),
        s => format!("{:.1} d", s / 86_400.0),
    }
}

/// A count that stopped at `cap`: `≥ cap` then.
pub(crate) fn count(n: i64, cap: i64) -> String {
    if n >= cap {
        format!("≥ {n}")
    } else {
        n.to_string()
    }
}

/// JSON text indented for reading (as given when it does not parse).
pub(crate) fn pretty(json: &str) -> String {
    serde_json::from_str::<serde_json::Value>(json)
        .and_then(|v| serde_json::to_string_pretty(&v))
        .unwrap_or_else(|_| json.to_owned())
}

/// Percent-encodes a query value.
pub(crate) fn enc(s: &str) -> String {
    serde_urlencoded::to_string([("v", s)])
        .map(|e| e.trim_start_matches("v=").to_owned())
        .unwrap_or_default()
}

/// The hidden CSRF field and the confirmation box every action form has.
pub(crate) fn guard_fields(csrf: &str, what: &str) -> Markup {
    html! {
        input type="hidden" name="csrf" value=(csrf);
        label { input type="checkbox" name="confirm" value="yes" required; " " (what) }
        " "
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_are_escaped() {
        let m = guard_fields("\"><script>", "x");
        assert!(!m.into_string().contains("<script>"));
        assert_eq!(count(100, 100), "≥ 100");
        assert_eq!(age(30.0), "30 s");
    }
}
