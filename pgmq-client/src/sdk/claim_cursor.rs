//! Claim cursors: one row per queue in `pgmq_sdk.claim_cursors` that hands
//! each claim read of a fleet its own range of `msg_id`s
//! ([`ReadFrom::Ranged`](crate::ReadFrom::Ranged)).
//!
//! Claim reads that start at one bound at the same time (several workers
//! draining one backlog, each after the queue's claim frontier) step over
//! each other's rows: `FOR UPDATE SKIP LOCKED` fetches every row another
//! read in flight has locked, tests its lock and passes on, so a read's
//! walk grows with the number of reads in flight, not with what it
//! returns. A read that first takes a range from the cursor starts where
//! the ranges handed out before it end, past the rows the reads still in
//! flight are locking.
//!
//! The cursor is a hint, never a fence. The range's start is the higher of
//! the cursor and the caller's own bound, and the cursor moves on by the
//! quantity asked for, in a statement of its own (an unlogged row: no WAL
//! and no flush, and its lock is held only for that statement). A read
//! that comes back short pulls the cursor back to where it ended, so that
//! it follows the queue's tail rather than running ahead of it. Messages
//! below a range (retries, expired claims, a range whose read failed or
//! returned less) are not seen by ranged reads: the caller reads from the
//! start now and then, as it must after any bound.
//!
//! Taking and pulling back the cursor needs UPDATE on the queue's table
//! (what a claim needs anyway); see docs/security.md.

use crate::conn::error::Error;
use crate::conn::executor::Executor;
use crate::conn::rows::first_col;
use crate::conn::statements::Stmt;
use crate::pgmq::queue_name::QueueName;
use crate::Pgmq;

const FEATURE: &str = "claim cursors";

impl<E: Executor> Pgmq<E> {
    /// Takes a range of `width` `msg_id`s from `queue`'s claim cursor: its
    /// start, the higher of the cursor and `after` (the cursor then stands
    /// `width` past it).
    pub(crate) async fn claim_range(
        &self,
        queue: &QueueName,
        after: i64,
        width: i64,
    ) -> Result<i64, Error> {
        let q = queue.as_str();
        let rows = self
            .run(Stmt::ClaimRange, Some(q), &[&q, &after, &width])
            .await
            .map_err(|e| e.in_sdk(FEATURE))?;
        Ok(first_col::<Option<i64>>(&rows, 0, None)?.unwrap_or(after))
    }

    /// Pulls `queue`'s claim cursor back to `to` when it stands higher.
    pub(crate) async fn rewind_claim_cursor(
        &self,
        queue: &QueueName,
        to: i64,
    ) -> Result<(), Error> {
        let q = queue.as_str();
        self.run(Stmt::RewindClaimCursor, Some(q), &[&q, &to])
            .await
            .map_err(|e| e.in_sdk(FEATURE))?;
        Ok(())
    }
}
