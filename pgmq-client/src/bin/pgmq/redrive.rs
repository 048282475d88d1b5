//! `pgmq redrive`: dead letters back to their source queue, one
//! transaction per batch, by the library's [`pgmq_client::Redrive`] (what
//! cannot move is left untouched, a lost COMMIT is said); this module
//! prints a line per message moved and the summary.

use pgmq_client::{Client, Error, QueueName, RedriveOptions};
use serde_json::json;

use crate::{fail, Exit, Failure, Out};

pub(crate) struct Opts {
    pub dlq: QueueName,
    pub to: Option<QueueName>,
    pub batch: usize,
    pub limit: Option<usize>,
    pub dry_run: bool,
    /// Move to several source queues without asking.
    pub yes: bool,
}

/// Moves the dead letters of `opts.dlq` back, batch by batch, printing a line
/// per message moved and a summary on stderr.
pub(crate) async fn run(client: &Client, opts: &Opts, out: &mut Out) -> Result<(), Failure> {
    let mut ro = RedriveOptions::new()
        .batch(opts.batch)
        .dry_run(opts.dry_run);
    ro.to = opts.to.clone();
    ro.limit = opts.limit;
    let mut run = client.redrive(&opts.dlq, ro).await?;
    if opts.to.is_none() && !opts.yes {
        let names = run.source_queues().await?;
        if names.len() > 1 {
            return Err(Failure::new(
                Exit::Refused,
                format!(
                    "the messages name {} source queues ({}): pass --yes to move each back to \
                     its own, or --to QUEUE to send them all to one",
                    names.len(),
                    names.join(", ")
                ),
            ));
        }
    }
    let (mut moved, mut skipped) = (0usize, 0usize);
    loop {
        match run.next_batch().await {
            Ok(Some(b)) => {
                for (id, why) in &b.left {
                    eprintln!("pgmq: redrive: message {id} stays: {why}");
                }
                skipped += b.left.len();
                moved += b.moved.len();
                for m in &b.moved {
                    let line = match m.new_msg_id {
                        Some(new) => {
                            json!({"msg_id": m.msg_id, "queue": m.queue, "new_msg_id": new})
                        }
                        None => json!({"msg_id": m.msg_id, "queue": m.queue}),
                    };
                    out.line(&line).await?;
                }
                out.flush().await?;
            }
            Ok(None) => break,
            Err(e @ Error::RedriveOutcomeUnknown(_)) => {
                return fail(format!("{e}; {moved} moved before"))
            }
            Err(e) => {
                return fail(format!(
                    "{e}; nothing of this batch was moved ({moved} moved before)"
                ))
            }
        }
    }
    report(opts, moved, skipped);
    Ok(())
}

/// The summary on stderr: how many moved (or would), how many stay.
fn report(opts: &Opts, moved: usize, skipped: usize) {
    let verb = if opts.dry_run { "would move" } else { "moved" };
    let left = if skipped == 0 {
        String::new()
    } else {
        format!("; {skipped} left in place")
    };
    eprintln!(
        "pgmq: redrive: {verb} {moved} message(s) from {}{left}",
        opts.dlq
    );
}
