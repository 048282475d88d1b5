//! `pgmq schedule list | add | pause | resume | remove | fire`: periodic
//! sends (`pgmq_client::Schedule`) listed and changed, and one firing pass
//! run by hand.

use std::time::Duration;

use clap::Subcommand;
use pgmq_client::{Cadence, Client, Schedule};
use serde_json::{json, Value};

use crate::out::{col, json as json_col, time, Exit, Failure, Out};

#[derive(Subcommand)]
pub(crate) enum ScheduleAction {
    /// The schedules, one JSON object each: name, queue, cadence, paused,
    /// next and last tick, messages sent.
    List {
        /// An aligned table for people instead of JSON lines.
        #[arg(long)]
        table: bool,
    },
    /// Create a schedule, or replace the spec of the one of that name (it
    /// starts over from now; paused stays paused). Prints {"schedule",
    /// "created": bool}.
    Add {
        /// The schedule's name.
        name: String,
        /// The queue it sends to.
        queue: String,
        /// A cron expression: five fields, or six with seconds first
        /// ("0 9 * * MON-FRI", "*/10 * * * * *", "@hourly").
        #[arg(long, conflicts_with = "every", required_unless_present = "every")]
        cron: Option<String>,
        /// The cron expression's time zone (IANA name).
        #[arg(long, default_value = "UTC", requires = "cron")]
        tz: String,
        /// A fixed interval instead: a whole number and s, m, h, d or w
        /// (ticks on its multiples since the Unix epoch).
        #[arg(long, value_name = "INTERVAL", value_parser = crate::archive::parse_age)]
        every: Option<Duration>,
        /// The message body each tick sends (JSON).
        #[arg(long, default_value = "{}", value_parser = parse_json)]
        message: Value,
        /// The headers each tick sends (a JSON object).
        #[arg(long, value_parser = parse_json)]
        headers: Option<Value>,
        /// Missed ticks sent after a gap besides the latest (0 skips them).
        #[arg(long, default_value_t = pgmq_client::DEFAULT_CATCH_UP)]
        catch_up: u32,
    },
    /// Pause a schedule: it sends nothing, and ticks due while paused are
    /// never sent. Prints {"schedule", "paused": true, "changed": bool}.
    Pause { name: String },
    /// Resume a paused schedule from now. Prints {"schedule", "paused":
    /// false, "changed": bool}.
    Resume { name: String },
    /// Remove a schedule. Prints {"schedule", "removed": true}.
    Remove { name: String },
    /// Run one firing pass, as a scheduler does: send every due tick the
    /// role may send, once for the fleet. Prints {"schedule", "msg_id",
    /// "tick"} per message sent.
    Fire {
        /// The most schedules fired.
        #[arg(long, default_value_t = 100)]
        max: usize,
    },
}

fn parse_json(text: &str) -> Result<Value, String> {
    serde_json::from_str(text).map_err(|e| format!("not JSON: {e}"))
}

/// Runs `pgmq schedule ACTION`.
pub(crate) async fn run(
    client: &Client,
    action: ScheduleAction,
    out: &mut Out,
) -> Result<(), Failure> {
    match action {
        ScheduleAction::List { table } => list(client, table, out).await,
        ScheduleAction::Add {
            name,
            queue,
            cron,
            tz,
            every,
            message,
            headers,
            catch_up,
        } => {
            let cadence = match (cron, every) {
                (Some(expr), _) => Cadence::cron(&expr, &tz)?,
                (None, Some(d)) => Cadence::every(d)?,
                (None, None) => unreachable!("clap requires --cron or --every"),
            };
            let mut s = Schedule::new(&name, crate::queue(&queue)?, cadence)?
                .message(message)
                .catch_up(catch_up);
            if let Some(h) = headers {
                s = s.headers(h);
            }
            let created = client.put_schedule(&s).await?;
            out.line(&json!({ "schedule": name, "created": created }))
                .await
        }
        ScheduleAction::Pause { name } => {
            let changed = client.pause_schedule(&name).await?;
            exists(client, &name, changed).await?;
            out.line(&json!({ "schedule": name, "paused": true, "changed": changed }))
                .await
        }
        ScheduleAction::Resume { name } => {
            let changed = client.resume_schedule(&name).await?;
            exists(client, &name, changed).await?;
            out.line(&json!({ "schedule": name, "paused": false, "changed": changed }))
                .await
        }
        ScheduleAction::Remove { name } => {
            let removed = client.remove_schedule(&name).await?;
            exists(client, &name, removed).await?;
            out.line(&json!({ "schedule": name, "removed": true }))
                .await
        }
        ScheduleAction::Fire { max } => {
            let pass = client.fire_due_schedules(max).await?;
            for (name, t) in &pass.sent {
                out.line(&json!({ "schedule": name, "msg_id": t.msg_id, "tick": t.tick }))
                    .await?;
            }
            match pass.failed.first() {
                Some((name, e)) => Err(Failure::new(Exit::Other, format!("schedule {name}: {e}"))),
                None => Ok(()),
            }
        }
    }
}

/// Fails with exit status 3 when a call that changed nothing did so
/// because there is no schedule `name` (that the role may see).
async fn exists(client: &Client, name: &str, changed: bool) -> Result<(), Failure> {
    if changed || client.schedules().await?.iter().any(|s| s.name == name) {
        return Ok(());
    }
    Err(Failure::new(
        Exit::NotFound,
        format!("there is no schedule {name:?}"),
    ))
}

async fn list(client: &Client, table: bool, out: &mut Out) -> Result<(), Failure> {
    let rows: Vec<Value> = client
        .schedules()
        .await?
        .into_iter()
        .map(|s| {
            json!({
                "schedule": s.name,
                "queue": s.queue_name,
                "cadence": s.cadence.map(|c| c.to_string()),
                "paused": s.paused,
                "next_tick": s.next_tick,
                "last_tick": s.last_tick,
                "sent": s.sent,
                "catch_up": s.catch_up,
                "message": s.message,
                "headers": s.headers,
            })
        })
        .collect();
    let cols = [
        col("SCHEDULE", "schedule"),
        col("QUEUE", "queue"),
        col("CADENCE", "cadence"),
        col("PAUSED", "paused"),
        time("NEXT_TICK", "next_tick"),
        time("LAST_TICK", "last_tick"),
        col("SENT", "sent"),
        json_col("MESSAGE", "message"),
    ];
    out.rows(table, &cols, &rows).await
}
