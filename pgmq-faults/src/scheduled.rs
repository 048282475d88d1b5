//! The campaign's schedulers of periodic sends, as the fault worker
//! process runs them: pgmq-worker's `Scheduler` beside the worker
//! ([`config`]), or, with the `schedule-unfenced` sabotage, a scheduler
//! with the planted bug ([`unfenced`]): it sends each due tick on its own,
//! outside the statement that moves the schedule past it, and moves the
//! schedule only later. A tick another scheduler reads meanwhile, or that
//! a scheduler killed in between leaves, is sent twice.

use std::time::Duration;

use pgmq_client::{Client, SendOptions, SCHEDULE_HEADER, TICK_HEADER};
use pgmq_worker::SchedulerConfig;

/// How long the sabotaged scheduler waits between its sends and moving
/// the schedule: the window in which another scheduler sends the same
/// tick.
const UNFENCED_GAP: Duration = Duration::from_millis(300);

/// The scheduler beside a fault worker: a pass every `poll`.
pub(crate) fn config(poll: Duration) -> SchedulerConfig {
    SchedulerConfig::default()
        .poll_interval(poll)
        .db_timeout(Duration::from_secs(3))
}

/// The sabotaged scheduler: every `poll`, sends each due tick's message
/// with plain sends, waits [`UNFENCED_GAP`], then moves the schedule past
/// the ticks without sending. Runs until the process ends; errors are
/// logged and the next pass tries again.
pub(crate) async fn unfenced(client: Client, poll: Duration) {
    loop {
        if let Err(e) = unfenced_pass(&client).await {
            tracing::warn!(error = %e, "sabotaged scheduler pass failed");
        }
        tokio::time::sleep(poll).await;
    }
}

async fn unfenced_pass(client: &Client) -> Result<(), pgmq_client::Error> {
    let due = client.due_schedules(100).await?;
    if due.iter().all(|d| d.ticks.is_empty()) {
        for d in &due {
            client.fire(d).await?;
        }
        return Ok(());
    }
    let specs = client.schedules().await?;
    for d in &due {
        let Some(s) = specs.iter().find(|s| s.name == d.name) else {
            continue;
        };
        let q = pgmq_client::QueueName::new(&s.queue_name)?;
        for t in &d.ticks {
            let mut headers = s.headers.clone().unwrap_or_else(|| serde_json::json!({}));
            headers[SCHEDULE_HEADER] = serde_json::json!(d.name);
            headers[TICK_HEADER] = serde_json::json!(pgmq_client::tick_key(*t));
            client
                .send_with(&q, &s.message, &SendOptions::new().headers(headers))
                .await?;
        }
    }
    tokio::time::sleep(UNFENCED_GAP).await;
    for d in &due {
        client.fire(&d.advance_only()).await?;
    }
    Ok(())
}
