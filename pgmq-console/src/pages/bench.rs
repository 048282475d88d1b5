//! The benchmark page: one `benchmark.v1` document (or two, to compare),
//! given at start (`--bench-doc PATH`), as charts: throughput at 1, 2, 4
//! and 8 handlers, the claim-wait and handler latency percentiles, the
//! wake-up latencies, and the targets with their limits.

use axum::extract::{Query, State};
use axum::response::Html;
use maud::{html, Markup};
use serde_json::Value;

use crate::chart::{bars, Series};
use crate::layout::shell;
use crate::{AppState, ConsoleError};

/// The schema a document must declare.
pub const BENCH_SCHEMA: &str = "pgmq-bench.benchmark.v1";

/// Reads a benchmark document: JSON whose `schema` is
/// `pgmq-bench.benchmark.v1`.
pub(crate) fn parse(text: &str) -> Result<Value, ConsoleError> {
    let v: Value = serde_json::from_str(text)
        .map_err(|e| ConsoleError::BadRequest(format!("not JSON: {e}")))?;
    match v.get("schema").and_then(Value::as_str) {
        Some(BENCH_SCHEMA) => Ok(v),
        other => Err(ConsoleError::BadRequest(format!(
            "not a {BENCH_SCHEMA} document (schema {other:?})"
        ))),
    }
}

/// The median of figure `id`, if the document has it.
fn median(doc: &Value, id: &str) -> Option<f64> {
    doc.get("figures")?
        .as_array()?
        .iter()
        .find(|f| f.get("id").and_then(Value::as_str) == Some(id))?
        .get("median")?
        .as_f64()
}

/// Which documents to show: `a`, and `b` to compare.
#[derive(serde::Deserialize)]
pub(crate) struct Params {
    #[serde(default)]
    a: usize,
    b: Option<usize>,
}

const HANDLERS: [u32; 4] = [1, 2, 4, 8];

/// `GET /bench`.
pub(crate) async fn page(
    State(st): State<AppState>,
    Query(p): Query<Params>,
) -> Result<Html<String>, ConsoleError> {
    let docs = &st.opts.bench_docs;
    if docs.is_empty() {
        let body = html! {
            p { "No benchmark document was given: start the console with "
                code { "--bench-doc PATH" } " (once or twice, to compare)." }
        };
        return Ok(shell("Benchmarks", None, body));
    }
    let pick = |i: usize| {
        docs.get(i)
            .ok_or_else(|| ConsoleError::BadRequest(format!("no document {i}")))
    };
    let mut shown = vec![pick(p.a)?];
    if let Some(b) = p.b {
        shown.push(pick(b)?);
    }
    let names: Vec<String> = shown.iter().map(|(n, _)| n.clone()).collect();
    let per_handler = |fig: &str| -> Vec<Series> {
        shown
            .iter()
            .map(|(name, doc)| Series {
                name: name.clone(),
                values: HANDLERS
                    .iter()
                    .map(|w| median(doc, &format!("consume_scaling.w{w}.{fig}")))
                    .collect(),
            })
            .collect()
    };
    let labels: Vec<String> = HANDLERS.iter().map(|w| format!("{w} handlers")).collect();
    let pct = ["p50", "p95", "p99"];
    let latency = |what: &str| -> Vec<Series> {
        shown
            .iter()
            .flat_map(|(name, doc)| {
                pct.iter().map(move |p| Series {
                    name: format!("{name} {p}"),
                    values: HANDLERS
                        .iter()
                        .map(|w| median(doc, &format!("consume_scaling.w{w}.{what}.{p}_ms")))
                        .collect(),
                })
            })
            .collect()
    };
    let wake_labels = vec![
        "poll p50".to_owned(),
        "poll p99".to_owned(),
        "notify p50".to_owned(),
        "notify p99".to_owned(),
    ];
    let wake: Vec<Series> = shown
        .iter()
        .map(|(name, doc)| Series {
            name: name.clone(),
            values: [
                "poll.p50_ms",
                "poll.p99_ms",
                "notify.p50_ms",
                "notify.p99_ms",
            ]
            .iter()
            .map(|f| median(doc, &format!("wakeup_latency.{f}")))
            .collect(),
        })
        .collect();
    let body = html! {
        p {
            "Documents: "
            @for (i, (name, _)) in docs.iter().enumerate() {
                a href=(format!("/bench?a={i}")) { (name) } " "
                @if i != p.a { "(" a href=(format!("/bench?a={}&b={i}", p.a)) { "compare" } ") " }
            }
        }
        p.muted { "Showing " (names.join(" against ")) ". Each value is the median over the measured rounds." }
        h2 { "Throughput by handler count (msg/s)" }
        div #scaling { (bars(&labels, &per_handler("throughput"), "msg/s")) }
        h2 { "Claim wait in the database, percentiles (ms)" }
        div #latency { (bars(&labels, &latency("queue_wait_db"), "ms")) }
        h2 { "Handler time, percentiles (ms)" }
        (bars(&labels, &latency("handler"), "ms"))
        h2 { "Wake-up latency (ms)" }
        (bars(&wake_labels, &wake, "ms"))
        h2 { "Targets" }
        @for (name, doc) in &shown { (targets(name, doc)) }
    };
    Ok(shell("Benchmarks", None, body))
}

/// A document's targets: each with what was observed, its limit and
/// whether it passed.
fn targets(name: &str, doc: &Value) -> Markup {
    let empty = Vec::new();
    let list = doc
        .get("targets")
        .and_then(Value::as_array)
        .unwrap_or(&empty);
    let num = |v: Option<&Value>| {
        v.and_then(Value::as_f64)
            .map(|x| format!("{x:.3}"))
            .unwrap_or_else(|| "–".into())
    };
    html! {
        h3 { (name) }
        table.targets {
            thead { tr { th { "target" } th { "observed" } th { "limit" } th { "unit" } th { "result" } } }
            tbody {
                @for t in list {
                    @let pass = t.get("pass").and_then(Value::as_bool);
                    tr {
                        td { (t.get("description").and_then(Value::as_str).unwrap_or_default()) }
                        td.n { (num(t.get("observed"))) }
                        td.n { (num(t.get("limit"))) }
                        td { (t.get("unit").and_then(Value::as_str).unwrap_or_default()) }
                        td {
                            @match pass {
                                Some(true) => span.ok { "pass" },
                                Some(false) => span.error { "FAIL" },
                                None => span.muted { "not measured" },
                            }
                        }
                    }
                }
            }
        }
    }
}
