//! The schedules page: every periodic send (`pgmq_sdk.schedules`) the
//! connected role may see, with its cadence, its next and last tick, how
//! many ticks it sent, and pause / resume.

use axum::extract::{Path, State};
use axum::response::{Html, IntoResponse, Redirect, Response};
use maud::html;
use pgmq_client::Error;

use crate::layout::{enc, guard_fields, shell};
use crate::pages::bounded;
use crate::safety::Fields;
use crate::{AppState, ConsoleError};

/// `GET /schedules`.
pub(crate) async fn page(State(st): State<AppState>) -> Result<Html<String>, ConsoleError> {
    bounded!(st, conn, tx, pg);
    let schedules = match pg.schedules().await {
        Ok(mut s) => {
            s.truncate(st.opts.row_limit);
            Ok(s)
        }
        Err(Error::SdkSchemaMissing { .. }) => {
            Err("no schedules: the pgmq_sdk schema is not installed (pgmq install-sdk)")
        }
        Err(e) => return Err(e.into()),
    };
    drop(tx);
    let time = |t: Option<chrono::DateTime<chrono::Utc>>| {
        t.map(|t| t.format("%Y-%m-%d %H:%M:%S").to_string())
            .unwrap_or_default()
    };
    let body = html! {
        p.muted { "Periodic sends: each tick is sent once for the whole fleet by whichever scheduler runs it." }
        @match &schedules {
            Err(why) => { p.error { (why) } }
            Ok(list) => {
                table #schedules {
                    thead { tr {
                        th { "name" } th { "queue" } th { "cadence" } th { "state" }
                        th { "next tick" } th { "last tick" } th { "sent" } th { "catch-up" }
                        @if !st.opts.read_only { th { "action" } }
                    } }
                    tbody {
                        @for s in list {
                            @let base = format!("/schedules/{}", enc(&s.name));
                            tr {
                                td { (s.name) }
                                td { a href=(format!("/queues/{}", s.queue_name)) { (s.queue_name) } }
                                td { (s.cadence.as_ref().map(ToString::to_string).unwrap_or_default()) }
                                td { @if s.paused { span.paused { "paused" } } @else { "active" } }
                                td { (time(s.next_tick)) }
                                td { (time(s.last_tick)) }
                                td.n { (s.sent) }
                                td.n { (s.catch_up) }
                                @if !st.opts.read_only {
                                    td {
                                        @if s.paused {
                                            form.action method="post" action=(format!("{base}/resume")) {
                                                (guard_fields(&st.csrf, "send this schedule's ticks again"))
                                                button.resume { "Resume" }
                                            }
                                        } @else {
                                            form.action method="post" action=(format!("{base}/pause")) {
                                                (guard_fields(&st.csrf, "send none of this schedule's ticks"))
                                                button.pause { "Pause" }
                                            }
                                        }
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
    };
    Ok(shell("Schedules", None, body))
}

/// `POST /schedules/{name}/pause`: with the CSRF token and the confirmation.
pub(crate) async fn pause(
    State(st): State<AppState>,
    Path(name): Path<String>,
    body: String,
) -> Result<Response, ConsoleError> {
    Fields::parse(&body)?.check(&st)?;
    st.client.pause_schedule(&name).await?;
    Ok(Redirect::to("/schedules").into_response())
}

/// `POST /schedules/{name}/resume`: with the CSRF token and the confirmation.
pub(crate) async fn resume(
    State(st): State<AppState>,
    Path(name): Path<String>,
    body: String,
) -> Result<Response, ConsoleError> {
    Fields::parse(&body)?.check(&st)?;
    st.client.resume_schedule(&name).await?;
    Ok(Redirect::to("/schedules").into_response())
}
