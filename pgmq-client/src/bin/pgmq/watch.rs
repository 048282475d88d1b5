//! `pgmq watch`: a table of every queue, refreshed: depth, oldest message,
//! in flight, rates in and out since the last refresh, paused or not.

use std::collections::HashMap;
use std::io::IsTerminal;
use std::time::Duration;

use chrono::{DateTime, Utc};
use pgmq_client::{Client, QueueMetrics};
use serde_json::{json, Value};

use crate::out::{col, render, Col, Failure, Out};

/// What one refresh keeps of a queue for the next one's rates.
#[derive(Clone, Copy)]
struct Seen {
    /// Messages ever sent (the id sequence's position).
    total: i64,
    /// Messages in the queue.
    length: i64,
    /// When, on the database clock.
    at: DateTime<Utc>,
}

/// Messages per second in (sent) and out (deleted, archived, purged)
/// between two looks at a queue; None for either when it cannot be told
/// (no time passed, or the queue was dropped and created again).
fn rates(before: Seen, now: Seen) -> (Option<f64>, Option<f64>) {
    let secs = (now.at - before.at).num_milliseconds() as f64 / 1000.0;
    let sent = now.total - before.total;
    if secs <= 0.0 || sent < 0 {
        return (None, None);
    }
    // Whatever was sent and is no longer there went out. A send that
    // rolled back takes an id too, so it counts as in and out.
    let gone = (sent - (now.length - before.length)).max(0);
    (Some(sent as f64 / secs), Some(gone as f64 / secs))
}

const COLS: [Col; 8] = [
    col("QUEUE", "queue"),
    col("DEPTH", "depth"),
    col("VISIBLE", "visible"),
    col("IN_FLIGHT", "in_flight"),
    col("OLDEST_S", "oldest_s"),
    col("IN/S", "in_per_s"),
    col("OUT/S", "out_per_s"),
    col("PAUSED", "paused"),
];

fn rate(r: Option<f64>) -> Value {
    r.map_or(Value::Null, |r| json!(format!("{r:.1}")))
}

/// The table's row for one queue.
fn row(m: &QueueMetrics, before: Option<Seen>, paused: Option<bool>) -> Value {
    let now = Seen {
        total: m.total_messages,
        length: m.queue_length,
        at: m.scrape_time,
    };
    let (r_in, r_out) = before.map_or((None, None), |b| rates(b, now));
    json!({
        "queue": m.queue_name,
        "depth": m.queue_length,
        "visible": m.queue_visible_length,
        // Hidden until their vt: being handled, or sent with a delay.
        "in_flight": m.queue_length - m.queue_visible_length,
        "oldest_s": m.oldest_msg_age_sec,
        "in_per_s": rate(r_in),
        "out_per_s": rate(r_out),
        "paused": paused.map(|p| if p { "yes" } else { "no" }),
    })
}

/// The paused queues' names; None when the database has no pgmq_sdk
/// schema (then nothing can be paused, and the column shows `-`).
async fn paused(client: &Client) -> Result<Option<Vec<String>>, Failure> {
    match client.paused_queues().await {
        Ok(p) => Ok(Some(p.into_iter().map(|p| p.queue_name).collect())),
        Err(pgmq_client::Error::SdkSchemaMissing { .. }) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// Refreshes every `interval`, `count` times (None: until interrupted).
/// On a terminal each refresh replaces the last; otherwise the tables
/// follow one another, a blank line apart.
pub(crate) async fn run(
    client: &Client,
    interval: Duration,
    count: Option<u64>,
    out: &mut Out,
) -> Result<(), Failure> {
    let terminal = std::io::stdout().is_terminal();
    let mut seen: HashMap<String, Seen> = HashMap::new();
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut done = 0u64;
    while count.is_none_or(|c| done < c) {
        tick.tick().await;
        let mut metrics = client.metrics_all().await?;
        metrics.sort_by(|a, b| a.queue_name.cmp(&b.queue_name));
        let paused = paused(client).await?;
        let rows: Vec<Value> = metrics
            .iter()
            .map(|m| {
                let p = paused.as_ref().map(|p| p.contains(&m.queue_name));
                row(m, seen.get(&m.queue_name).copied(), p)
            })
            .collect();
        seen = metrics
            .iter()
            .map(|m| {
                let s = Seen {
                    total: m.total_messages,
                    length: m.queue_length,
                    at: m.scrape_time,
                };
                (m.queue_name.clone(), s)
            })
            .collect();
        let at = metrics.first().map_or_else(Utc::now, |m| m.scrape_time);
        let mut text = String::new();
        if terminal {
            // Cursor home, clear the screen.
            text.push_str("\x1b[H\x1b[2J");
        } else if done > 0 {
            text.push('\n');
        }
        text.push_str(&format!(
            "{}  every {:.1} s, {} queue(s)\n",
            at.format("%Y-%m-%d %H:%M:%S UTC"),
            interval.as_secs_f64(),
            metrics.len()
        ));
        text.push_str(&render(&COLS, &rows));
        out.text(&text).await?;
        out.flush().await?;
        done += 1;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seen(total: i64, length: i64, ms: i64) -> Seen {
        Seen {
            total,
            length,
            at: DateTime::from_timestamp_millis(1_700_000_000_000 + ms).unwrap(),
        }
    }

    #[test]
    fn rates_count_sends_in_and_what_left_out() {
        // 20 sent in 2 s, the queue 4 longer: 16 went out.
        assert_eq!(
            rates(seen(100, 10, 0), seen(120, 14, 2000)),
            (Some(10.0), Some(8.0))
        );
        // Nothing sent, 6 removed.
        assert_eq!(
            rates(seen(100, 10, 0), seen(100, 4, 1000)),
            (Some(0.0), Some(6.0))
        );
        // Dropped and created again: the id sequence went back.
        assert_eq!(rates(seen(100, 10, 0), seen(3, 3, 1000)), (None, None));
        // No time between the looks.
        assert_eq!(rates(seen(1, 1, 0), seen(2, 2, 0)), (None, None));
    }
}
