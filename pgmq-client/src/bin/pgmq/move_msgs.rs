//! `pgmq move`: messages from one queue to another, by ids, by a JSON
//! filter or all, one transaction per batch ([`Pgmq::move_batch`](pgmq_client::Pgmq::move_batch): sent to
//! the target and deleted from the source, or neither).
//!
//! Batches walk msg_id upwards from a cursor and stop at the highest msg_id
//! there was when the run began, so the run ends even while new messages
//! arrive.

use pgmq_client::{Client, CommitOutcome, MoveBatch, MoveSelection, QueueName};
use serde_json::json;

use crate::{fail, Exit, Failure, Out};

pub(crate) struct Opts {
    pub from: QueueName,
    pub to: QueueName,
    pub select: MoveSelection,
    pub batch: usize,
    pub limit: Option<usize>,
}

/// The highest msg_id in `q` now (0 when empty): a run goes no further.
pub(crate) async fn highest_id(client: &Client, q: &QueueName) -> Result<i64, Failure> {
    // The table name comes from a validated QueueName, quoted.
    let sql = format!(
        "SELECT coalesce(pg_catalog.max(msg_id), 0) FROM {}",
        q.quoted_table()
    );
    let conn = client.connection().await?;
    let row = conn
        .query_one(&sql, &[])
        .await
        .map_err(pgmq_client::Error::from)?;
    Ok(row.try_get(0).map_err(pgmq_client::Error::from)?)
}

/// Moves the selected messages, batch by batch, printing
/// `{"msg_id", "queue", "new_msg_id"}` per message moved and a summary on
/// stderr.
pub(crate) async fn run(client: &Client, opts: &Opts, out: &mut Out) -> Result<(), Failure> {
    if opts.from == opts.to {
        return Err(Failure::new(
            Exit::Usage,
            format!("moving {} to itself", opts.from),
        ));
    }
    let existing = client.list_queues().await?;
    for q in [&opts.from, &opts.to] {
        if !existing.iter().any(|e| e.queue_name == q.as_str()) {
            return Err(Failure::new(
                Exit::NotFound,
                format!("queue {q} does not exist"),
            ));
        }
    }
    let upto = highest_id(client, &opts.from).await?;
    let (mut after, mut moved) = (0i64, 0usize);
    loop {
        let want = match opts.limit {
            Some(limit) if moved >= limit => break,
            Some(limit) => opts.batch.min(limit - moved),
            None => opts.batch,
        };
        let batch = MoveBatch::new(opts.select.clone())
            .after(after)
            .upto(upto)
            .limit(want);
        let done = match client.move_batch(&opts.from, &opts.to, &batch).await {
            Ok(done) => done,
            Err(e) if e.outcome() == CommitOutcome::Unknown => {
                return fail(format!(
                    "{e}: the outcome of this batch is unknown (the connection was lost): \
                     messages of {} with msg_id above {after} are either still there or in {} \
                     (never both); {moved} moved before",
                    opts.from, opts.to
                ))
            }
            Err(e) => {
                return Err(Failure::from(e).map_msg(|m| {
                    format!("{m}; nothing of this batch was moved ({moved} moved before)")
                }))
            }
        };
        let Some(last) = done.last() else { break };
        after = last.msg_id;
        moved += done.len();
        for m in &done {
            out.line(
                &json!({"msg_id": m.msg_id, "queue": opts.to.as_str(), "new_msg_id": m.new_msg_id}),
            )
            .await?;
        }
        out.flush().await?;
    }
    eprintln!(
        "pgmq: move: moved {moved} message(s) from {} to {}",
        opts.from, opts.to
    );
    Ok(())
}
