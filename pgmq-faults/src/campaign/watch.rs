//! The campaign's sampler: every second, on a monitoring session of its
//! own, the connections of each worker process against what it may hold,
//! and per queue the messages held far out, held long, ready, and handed
//! back by a requeue. It also tends the worker processes (replaces those
//! that crashed).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use pgmq_client::QueueName;

use super::model::{Role, Sample, REQUEUE_BOUND, ROLES};
use super::slots::Slots;
use crate::ctx::session;

/// Every second until `stop`: tends the worker processes and takes a
/// sample of them and of `queues` on a session to `dsn`. Returns the
/// samples.
pub(crate) fn sample(
    slots: Arc<Slots>,
    dsn: String,
    queues: [QueueName; ROLES],
    mut stop: tokio::sync::watch::Receiver<bool>,
) -> tokio::task::JoinHandle<Vec<Sample>> {
    tokio::spawn(async move {
        let mut watch = Watch {
            dsn,
            conn: None,
            seen: HashMap::new(),
        };
        let mut samples = Vec::new();
        loop {
            slots.tend().await;
            let limits = slots.limits().await;
            if let Some(s) = watch.sample(&queues, &limits).await {
                samples.push(s);
            }
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                _ = stop.changed() => break,
            }
        }
        samples
    })
}

/// Whether a message seen invisible (`now`) was handed back by a requeue:
/// no delivery holds it, or since it was last seen (`was`) under the same
/// read its attempts header rose (a retry) or its `read_ct` fell (a snooze
/// or release undid the read).
fn handed_back(was: Option<&Seen>, now: &Seen) -> bool {
    now.read_at.is_none()
        || was.is_some_and(|was| {
            was.read_at == now.read_at
                && (was.requeued || now.attempts > was.attempts || now.read_ct < was.read_ct)
        })
}

/// An invisible message as the sampler last saw it.
struct Seen {
    read_at: Option<DateTime<Utc>>,
    read_ct: i32,
    attempts: Option<i64>,
    requeued: bool,
}

/// A monitoring session of the campaign's own, with a statement timeout,
/// reconnected after any failure.
struct Watch {
    dsn: String,
    conn: Option<tokio_postgres::Client>,
    /// Per queue and message id, what the last sample saw.
    seen: HashMap<(usize, i64), Seen>,
}

impl Watch {
    async fn conn(&mut self) -> Option<&tokio_postgres::Client> {
        if self.conn.as_ref().is_none_or(|c| c.is_closed()) {
            self.conn = None;
            let c = session(&self.dsn, "pgmq-campaign-watch").await.ok()?;
            c.batch_execute("set statement_timeout = '2s'").await.ok()?;
            self.conn = Some(c);
        }
        self.conn.as_ref()
    }

    async fn sample(
        &mut self,
        queues: &[QueueName; ROLES],
        limits: &HashMap<String, i64>,
    ) -> Option<Sample> {
        let at = Utc::now();
        let c = self.conn().await?;
        let rows = c
            .query(
                "select application_name, count(*) from pg_stat_activity \
                 where application_name like 'pgmq-campaign-w%' group by 1",
                &[],
            )
            .await
            .ok()?;
        let conns = rows
            .iter()
            .filter_map(|r| {
                let name: String = r.get(0);
                let n: i64 = r.get(1);
                limits.get(&name).map(|max| (name, n, *max))
            })
            .collect();
        let mut far_vt = [0; ROLES];
        let mut held_long = [0; ROLES];
        let mut ready = [0; ROLES];
        for (i, q) in queues.iter().enumerate() {
            let sql = format!(
                "select count(*) filter (where vt > clock_timestamp() + interval '15 s'), \
                        count(*) filter (where vt > clock_timestamp() \
                                           and last_read_at < clock_timestamp() - interval '30 s'), \
                        count(*) filter (where vt <= clock_timestamp()) \
                 from {}",
                q.quoted_table()
            );
            // A locked table times out: that queue is skipped this time.
            if let Ok(r) = c.query_one(sql.as_str(), &[]).await {
                far_vt[i] = r.get(0);
                held_long[i] = r.get(1);
                ready[i] = r.get(2);
            }
        }
        let (requeued, requeued_far) = self.requeued(queues).await;
        Some(Sample {
            at,
            conns,
            far_vt,
            held_long,
            ready,
            requeued,
            requeued_far,
        })
    }

    /// The invisible messages that a requeue handed back, per queue, and
    /// those whose visibility timeout is beyond now + [`REQUEUE_BOUND`]. A
    /// message was handed back when no delivery holds it (`last_read_at`
    /// NULL), or when, since an earlier sample, its attempts header rose (a
    /// retry) or its `read_ct` fell (a snooze or release) while
    /// `last_read_at` stayed that of the same read: the delivery ended, and
    /// nothing but a new read may hold the message past its delay.
    async fn requeued(
        &mut self,
        queues: &[QueueName; ROLES],
    ) -> ([i64; ROLES], Vec<(Role, i64, i64)>) {
        let mut counts = [0; ROLES];
        let mut far = Vec::new();
        let bound = REQUEUE_BOUND.as_millis() as f64;
        for (i, q) in queues.iter().enumerate() {
            let Some(c) = self.conn.as_ref() else {
                break;
            };
            let sql = format!(
                "select msg_id, read_ct, last_read_at, headers ->> $1::text, \
                        extract(epoch from vt - clock_timestamp())::float8 * 1000 \
                 from {} where vt > clock_timestamp()",
                q.quoted_table()
            );
            let Ok(rows) = c
                .query(sql.as_str(), &[&pgmq_worker::ATTEMPTS_HEADER])
                .await
            else {
                continue;
            };
            for r in rows {
                let id: i64 = r.get(0);
                let now = Seen {
                    read_ct: r.get(1),
                    read_at: r.get(2),
                    attempts: r.get::<_, Option<String>>(3).and_then(|a| a.parse().ok()),
                    requeued: false,
                };
                let ahead: f64 = r.get(4);
                let requeued = handed_back(self.seen.get(&(i, id)), &now);
                if requeued {
                    counts[i] += 1;
                    if ahead > bound {
                        far.push((Role::ALL[i], id, ahead as i64));
                    }
                }
                self.seen.insert((i, id), Seen { requeued, ..now });
            }
        }
        (counts, far)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_requeue_is_told_from_a_held_delivery() {
        let read = Some(Utc::now());
        let seen = |read_at, read_ct, attempts: Option<i64>, requeued| Seen {
            read_at,
            read_ct,
            attempts,
            requeued,
        };
        let held = seen(read, 2, Some(1), false);
        // The same delivery, extended by the heartbeat: still held.
        assert!(!handed_back(Some(&held), &seen(read, 2, Some(1), false)));
        assert!(!handed_back(None, &held));
        // A retry landed (attempts header rose), a snooze or release
        // (read undone), or the requeue ended the delivery (no read).
        assert!(handed_back(Some(&held), &seen(read, 2, Some(2), false)));
        assert!(handed_back(Some(&held), &seen(read, 1, Some(1), false)));
        assert!(handed_back(None, &seen(None, 1, Some(1), false)));
        // Still the ended delivery's read at the next sample: still handed back.
        let after = seen(read, 2, Some(2), true);
        assert!(handed_back(Some(&after), &seen(read, 2, Some(2), false)));
        // A new read holds it again.
        let again = seen(
            Some(Utc::now() + chrono::Duration::seconds(1)),
            3,
            Some(2),
            false,
        );
        assert!(!handed_back(Some(&after), &again));
    }
}
