//! A dead-letter queue's page: its letters grouped by reason, each with its
//! message and headers; redrive one, a selection or all back to their
//! source queue (the `pgmq redrive` semantics: what cannot move stays, a
//! lost COMMIT is said), or delete a selection.

use axum::extract::{Path, Query, State};
use axum::response::Html;
use maud::{html, Markup};
use pgmq_client::{Error, QueueName, RedriveOptions};
use serde_json::{json, Value};

use crate::layout::{count, enc, guard_fields, pretty, shell};
use crate::pages::{bounded, posted};
use crate::safety::Fields;
use crate::{AppState, ConsoleError};

/// The query of the page: one reason's letters only, where the list starts.
#[derive(serde::Deserialize)]
pub(crate) struct Params {
    reason: Option<String>,
    #[serde(default)]
    after: i64,
}

/// A header of a letter as text.
fn header(h: Option<&Value>, key: &str) -> String {
    match h.and_then(|h| h.get(key)) {
        Some(Value::String(s)) => s.clone(),
        Some(v) => v.to_string(),
        None => String::new(),
    }
}

/// `GET /dead/{name}`.
pub(crate) async fn page(
    State(st): State<AppState>,
    Path(name): Path<String>,
    Query(p): Query<Params>,
) -> Result<Html<String>, ConsoleError> {
    let queue = QueueName::new(&name)?;
    let (cap, rows) = (st.opts.count_cap, st.opts.row_limit);
    let filter = p.reason.as_ref().map(|r| json!({ "reason": r }));
    bounded!(st, conn, tx, pg);
    let reasons = pg.dead_letter_reasons(&queue, cap, rows as i64).await?;
    let letters = pg.look(&queue, p.after, filter.as_ref(), rows, cap).await?;
    drop(tx);
    let base = format!("/dead/{}", queue.as_str());
    let read_only = st.opts.read_only;
    let letters_table = html! {
        table {
            thead { tr {
                @if !read_only { th {} }
                th { "msg_id" } th { "reason" } th { "attempts" } th { "source queue" }
                th { "body" } th { "headers" }
            } }
            tbody {
                @for m in &letters {
                    tr {
                        @if !read_only {
                            td { input type="checkbox" name="id" value=(m.msg_id); }
                        }
                        td.n { (m.msg_id) }
                        td { (header(m.headers.as_ref(), "reason")) }
                        td.n { (header(m.headers.as_ref(), "attempts")) }
                        td { (header(m.headers.as_ref(), "source_queue")) }
                        td { pre { (pretty(m.body.get())) } }
                        td { @if let Some(h) = &m.headers {
                            pre { (serde_json::to_string_pretty(h).unwrap_or_default()) }
                        } }
                    }
                }
            }
        }
    };
    let body = html! {
        p.muted { "Dead letters grouped by their reason header (among the first " (cap) ")." }
        table #reasons {
            thead { tr { th { "reason" } th { "letters" } th { "msg_ids" } } }
            tbody {
                @for r in &reasons {
                    tr {
                        td {
                            @match &r.reason {
                                Some(reason) => {
                                    a href=(format!("{base}?reason={}", enc(reason))) { (reason) }
                                }
                                None => { span.muted { "(no reason)" } }
                            }
                        }
                        td.n { (count(r.count, cap)) }
                        td { (r.first_msg_id) " – " (r.last_msg_id) }
                    }
                }
            }
        }
        @if let Some(r) = &p.reason {
            p { "Showing reason " b { (r) } ". " a href=(base) { "All reasons" } }
        }
        h2 { "Letters" }
        @if read_only {
            div #letters { (letters_table) }
        } @else {
            form #letters method="post" action=(format!("{base}/redrive")) {
                (letters_table)
                p {
                    (guard_fields(&st.csrf, "I mean it"))
                    button #redrive-selected { "Redrive selected" }
                    " "
                    button #delete-selected formaction=(format!("{base}/delete")) { "Delete selected" }
                }
            }
        }
        @if !read_only {
            form.action #redrive-all method="post" action=(format!("{base}/redrive")) {
                input type="hidden" name="all" value="yes";
                (guard_fields(&st.csrf, "move every dead letter back to its source queue"))
                button { "Redrive all" }
            }
        }
    };
    Ok(shell(
        &format!("Dead letters: {}", queue.as_str()),
        None,
        body,
    ))
}

/// The msg_ids a form selected (`id` fields).
fn selected(f: &Fields) -> Result<Vec<i64>, ConsoleError> {
    f.all("id")
        .map(|v| {
            v.parse::<i64>()
                .map_err(|_| ConsoleError::BadRequest(format!("not a msg_id: {v:?}")))
        })
        .collect()
}

/// `POST /dead/{name}/redrive`: the selected letters (`id` fields) or all
/// (`all=yes`) back to their source queues, batch by batch; the page says
/// what moved, what stayed and why, and an outcome that is unknown.
pub(crate) async fn redrive(
    State(st): State<AppState>,
    Path(name): Path<String>,
    body: String,
) -> Result<Html<String>, ConsoleError> {
    let (queue, f) = posted(&st, &name, &body)?;
    let ids = selected(&f)?;
    let all = f.get("all") == Some("yes");
    if ids.is_empty() && !all {
        return Err(ConsoleError::BadRequest("no letter selected".into()));
    }
    let mut opts = RedriveOptions::new();
    if !all {
        opts = opts.only(ids);
    }
    let mut run = st.client.redrive(&queue, opts).await?;
    let (mut moved, mut left, mut failure) = (Vec::new(), Vec::new(), None);
    loop {
        match run.next_batch().await {
            Ok(Some(b)) => {
                moved.extend(b.moved);
                left.extend(b.left);
            }
            Ok(None) => break,
            Err(e @ Error::RedriveOutcomeUnknown(_)) => {
                failure = Some(e.to_string());
                break;
            }
            Err(e) => {
                failure = Some(format!("{e}; nothing of that batch was moved"));
                break;
            }
        }
    }
    let base = format!("/dead/{}", queue.as_str());
    let body = html! {
        p #summary.ok { "Moved " (moved.len()) " letter(s); " (left.len()) " left in place." }
        @if let Some(e) = &failure { p #failure.error { (e) } }
        (outcome_table(&moved, &left))
        p { a href=(base) { "Back to the dead letters" } }
    };
    Ok(shell("Redrive", None, body))
}

/// What moved where and what stayed, as a table.
fn outcome_table(moved: &[pgmq_client::RedriveMoved], left: &[(i64, String)]) -> Markup {
    html! {
        table #outcome {
            thead { tr { th { "msg_id" } th { "outcome" } } }
            tbody {
                @for m in moved {
                    tr { td.n { (m.msg_id) } td {
                        "to " a href=(format!("/queues/{}", m.queue)) { (m.queue) }
                        @if let Some(n) = m.new_msg_id { " as " (n) }
                    } }
                }
                @for (id, why) in left {
                    tr { td.n { (id) } td { "stays: " (why) } }
                }
            }
        }
    }
}

/// `POST /dead/{name}/delete`: the selected letters deleted.
pub(crate) async fn delete(
    State(st): State<AppState>,
    Path(name): Path<String>,
    body: String,
) -> Result<Html<String>, ConsoleError> {
    let (queue, f) = posted(&st, &name, &body)?;
    let ids = selected(&f)?;
    if ids.is_empty() {
        return Err(ConsoleError::BadRequest("no letter selected".into()));
    }
    let deleted = st.client.delete_batch(&queue, &ids).await?;
    let base = format!("/dead/{}", queue.as_str());
    let body = html! {
        p #summary.ok { "Deleted " (deleted.len()) " of " (ids.len()) " selected letter(s)." }
        p { a href=(base) { "Back to the dead letters" } }
    };
    Ok(shell("Delete", None, body))
}
