//! The queues page: every queue (up to the limit) with its depth, in
//! flight, oldest message's age, archive size, pause and dead-letter
//! queue, those that need attention first.

use std::collections::HashMap;

use axum::extract::{Query, State};
use axum::response::Html;
use maud::html;

use crate::layout::{age, count, shell};
use crate::pages::bounded;
use crate::{chart, AppState, ConsoleError};

/// The query of the queues page: a part of the name to look for.
#[derive(serde::Deserialize)]
pub(crate) struct Params {
    q: Option<String>,
}

/// `GET /`.
pub(crate) async fn page(
    State(st): State<AppState>,
    Query(p): Query<Params>,
) -> Result<Html<String>, ConsoleError> {
    let cap = st.opts.count_cap;
    let name = p.q.as_deref().filter(|s| !s.is_empty());
    bounded!(st, conn, tx, pg);
    let (mut queues, total) = pg.queue_overview(st.opts.queue_limit, name, cap).await?;
    let sdk = pg.sdk_schema_present().await?;
    let paused: HashMap<String, Option<String>> = if sdk {
        pg.paused_queues()
            .await?
            .into_iter()
            .map(|p| (p.queue_name, p.reason))
            .collect()
    } else {
        HashMap::new()
    };
    drop(tx);
    st.rates
        .record(std::time::Instant::now(), crate::rates::of(&queues), cap);
    // Attention: the oldest waiting message first, then the deepest.
    queues.sort_by(|a, b| {
        let age = |o: Option<f64>| o.unwrap_or(-1.0);
        age(b.oldest_age_secs)
            .total_cmp(&age(a.oldest_age_secs))
            .then(b.depth.cmp(&a.depth))
            .then(a.queue_name.cmp(&b.queue_name))
    });
    let depth_of: HashMap<&str, i64> = queues
        .iter()
        .map(|q| (q.queue_name.as_str(), q.depth))
        .collect();
    let widest = queues.iter().map(|q| q.depth).max().unwrap_or(0);
    let refresh = (!st.opts.refresh.is_zero()).then(|| st.opts.refresh.as_secs().max(1));
    let body = html! {
        form method="get" action="/" {
            input type="search" name="q" value=[name] placeholder="queue name contains";
            " " button { "Find" }
        }
        p.muted {
            (queues.len()) " of " (total) " queues shown; counts stop at " (cap) "."
            @if !sdk { " The pgmq_sdk schema is not installed: pausing is unavailable." }
        }
        table #queues {
            thead { tr {
                th { "queue" } th { "depth" } th {} th { "in flight" } th { "oldest" }
                th { "in/s" } th { "out/s" } th { "in, last minutes" }
                th { "archive" } th { "paused" } th { "dead letters" }
            } }
            tbody {
                @for q in &queues {
                    @let dlq = format!("{}_dlq", q.queue_name);
                    tr {
                        td { a href=(format!("/queues/{}", q.queue_name)) { (q.queue_name) } }
                        td.n { (count(q.depth, cap)) }
                        td { (chart::bar(q.depth, q.in_flight, widest, 120)) }
                        td.n { (count(q.in_flight, cap)) }
                        td.n { (q.oldest_age_secs.map(age).unwrap_or_default()) }
                        @let history = st.rates.history(&q.queue_name);
                        @let latest = history.last();
                        td.n.rate_in { (latest.map(|r| format!("{:.1}", r.in_per_s)).unwrap_or_default()) }
                        td.n.rate_out { (latest.and_then(|r| r.out_per_s).map(|v| format!("{v:.1}")).unwrap_or_default()) }
                        td {
                            @if history.len() > 1 {
                                (chart::spark(&history.iter().map(|r| r.in_per_s).collect::<Vec<_>>(), 80, 16))
                            }
                        }
                        td.n { (count(q.archive_size, cap)) }
                        td {
                            @if let Some(reason) = paused.get(&q.queue_name) {
                                span.paused { "paused" }
                                @if let Some(r) = reason { " (" (r) ")" }
                            }
                        }
                        td {
                            @if let Some(d) = depth_of.get(dlq.as_str()) {
                                a href=(format!("/dead/{dlq}")) { (count(*d, cap)) }
                            } @else if q.queue_name.ends_with("_dlq") {
                                a href=(format!("/dead/{}", q.queue_name)) { "open" }
                            }
                        }
                    }
                }
            }
        }
    };
    Ok(shell("Queues", refresh, body))
}
