//! The fleet page: the workers that keep a presence record
//! (pgmq-worker's `WorkerBuilder::presence`), the most recently seen
//! first; one not seen for [`ConsoleOptions::gone_after`](crate::ConsoleOptions::gone_after)
//! is shown as gone.

use axum::extract::State;
use axum::response::Html;
use maud::html;
use pgmq_client::Error;

use crate::layout::{age, shell};
use crate::pages::bounded;
use crate::{AppState, ConsoleError};

/// `GET /fleet`.
pub(crate) async fn page(State(st): State<AppState>) -> Result<Html<String>, ConsoleError> {
    let gone_after = st.opts.gone_after.as_secs_f64();
    bounded!(st, conn, tx, pg);
    let workers = match pg.fleet(st.opts.row_limit).await {
        Ok(w) => Ok(w),
        Err(Error::SdkSchemaMissing { .. }) => Err(
            "no presence records: the pgmq_sdk schema (version 7 or later) is not installed \
             (pgmq install-sdk)",
        ),
        Err(e) if e.sqlstate().is_some_and(|c| c.code() == "42P01") => Err(
            "no presence records: the pgmq_sdk schema is older than version 7 (pgmq install-sdk)",
        ),
        Err(e) => return Err(e.into()),
    };
    drop(tx);
    let refresh = (!st.opts.refresh.is_zero()).then(|| st.opts.refresh.as_secs().max(1));
    let body = html! {
        p.muted {
            "Workers that keep a presence record, the latest first. One not seen for "
            (age(gone_after)) " is shown as gone."
        }
        @match &workers {
            Err(why) => { p.error { (why) } }
            Ok(workers) => {
                table #fleet {
                    thead { tr {
                        th { "state" } th { "host" } th { "pid" } th { "queue" } th { "concurrency" }
                        th { "claims/s" } th { "acks/s" } th { "claimed" } th { "acked" }
                        th { "failed" } th { "last seen" }
                    } }
                    tbody {
                        @for w in workers {
                            @let seen = w.seen_secs_ago.unwrap_or(f64::MAX);
                            @let state = if w.stopped_at.is_some() {
                                "stopped"
                            } else if seen > gone_after {
                                "gone"
                            } else if w.paused {
                                "paused"
                            } else if w.limited {
                                "running (limited)"
                            } else {
                                "running"
                            };
                            tr {
                                td class=(state.split(' ').next().unwrap_or_default()) { (state) }
                                td { (w.host) }
                                td.n { (w.pid) }
                                td { a href=(format!("/queues/{}", w.queue_name)) { (w.queue_name) } }
                                td.n { (w.concurrency) }
                                td.n { (format!("{:.1}", w.claims_per_sec)) }
                                td.n { (format!("{:.1}", w.acks_per_sec)) }
                                td.n { (w.claimed) }
                                td.n { (w.acked) }
                                td.n { (w.failed) }
                                td.n { (age(seen.min(1e9))) " ago" }
                            }
                        }
                    }
                }
            }
        }
    };
    Ok(shell("Fleet", refresh, body))
}
