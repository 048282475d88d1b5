//! Acknowledgements carried by the next claim, under a fleet-wide limit of
//! places.
//!
//! Under [`FleetLimit::max_running`](pgmq_client::FleetLimit::max_running)
//! a place is taken from a message's claim until its acknowledgement
//! commits, so each place waits, between two runs, for the delete's round
//! trip and commit and then for the next claim's. The handoff lets one
//! statement do both: the completer offers a batch of deletes here and
//! wakes one parked claim loop (or the next to park); the first loop about
//! to read takes the batch and reads with `pgmq_sdk.ack_read_limited`,
//! which deletes (fenced, as the completer's own delete) and claims in one
//! transaction; the loop then tells the completer which ids were deleted.
//! That read took every place the deletes freed, so the completer wakes no
//! other loop for them.
//!
//! A loop takes a batch only right before a read it was going to make
//! anyway, after every check a read passes (not paused, not stopping, room
//! in the claim queue), so the handoff claims nothing a plain read would
//! not. When no loop takes the batch within [`TAKE_WITHIN`] (the loops are
//! paused, stopping, waiting for room, or all reading), the completer takes
//! it back and writes it itself. When the statement fails, the completer
//! writes the batch as it writes any, and an unknown outcome makes it ask
//! which rows are still there, as after its own failed tries. A database
//! whose `pgmq_sdk` schema lacks the function turns the handoff off for the
//! worker's life: the acknowledgements then go out as before.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use pgmq_client::Receipt;
use tokio::sync::{oneshot, Notify};

/// How long an offered batch waits for a claim loop before the completer
/// takes it back: about one limited read, so that a loop finishing a read
/// can take it, and an acknowledgement is never held much longer than the
/// write it replaces.
pub(crate) const TAKE_WITHIN: Duration = Duration::from_millis(2);

/// What became of a batch a claim loop took.
#[derive(Debug)]
pub(crate) enum Outcome {
    /// Deleted, these ids (the rest matched no delivery: lost claims).
    Written(Vec<i64>),
    /// The statement failed; `unknown` when it may have committed.
    Failed { unknown: bool },
}

/// A batch waiting for a claim loop.
struct Pending {
    /// Which offer this is, so that a completer takes back only its own.
    id: u64,
    acks: Vec<Receipt>,
    reply: oneshot::Sender<Outcome>,
}

/// A batch a claim loop took: its deletes, and where their outcome goes.
pub(crate) struct Taken {
    pub acks: Vec<Receipt>,
    reply: oneshot::Sender<Outcome>,
}

impl Taken {
    /// Tells the completer what became of the batch.
    pub(crate) fn reply(self, outcome: Outcome) {
        let _ = self.reply.send(outcome);
    }
}

/// The slot between the completer and the claim loops (one batch at a
/// time).
#[derive(Default)]
pub(crate) struct Handoff {
    slot: Mutex<Option<Pending>>,
    next_id: AtomicU64,
    off: AtomicBool,
    /// Wakes one parked claim loop when a batch is offered.
    offered: Notify,
}

impl Handoff {
    /// Offers `acks` to the claim loops and wakes one. None when no loop
    /// took them (the completer writes them); otherwise what the loop's
    /// statement did. A loop that took them and ended without saying counts
    /// as a failure of unknown outcome.
    pub(crate) async fn offer(&self, acks: &[Receipt]) -> Option<Outcome> {
        if self.off.load(Ordering::Relaxed) || acks.is_empty() {
            return None;
        }
        let (tx, mut rx) = oneshot::channel();
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        {
            let mut slot = self.slot.lock().expect("handoff slot");
            if slot.is_some() {
                // Another batch waits already: write this one directly.
                return None;
            }
            *slot = Some(Pending {
                id,
                acks: acks.to_vec(),
                reply: tx,
            });
        }
        self.offered.notify_one();
        tokio::select! {
            r = &mut rx => return Some(r.unwrap_or(Outcome::Failed { unknown: true })),
            () = tokio::time::sleep(TAKE_WITHIN) => {}
        }
        {
            let mut slot = self.slot.lock().expect("handoff slot");
            if slot.as_ref().is_some_and(|p| p.id == id) {
                *slot = None;
                return None;
            }
        }
        // Taken meanwhile: its statement is on its way.
        Some(rx.await.unwrap_or(Outcome::Failed { unknown: true }))
    }

    /// Resolves when a batch is offered: a parked claim loop's wake-up (one
    /// loop per offer; an offer while none is parked wakes the next).
    pub(crate) async fn offered(&self) {
        self.offered.notified().await;
    }

    /// The batch waiting, for a claim loop about to read.
    pub(crate) fn take(&self) -> Option<Taken> {
        if self.off.load(Ordering::Relaxed) {
            return None;
        }
        let p = self.slot.lock().expect("handoff slot").take()?;
        Some(Taken {
            acks: p.acks,
            reply: p.reply,
        })
    }

    /// Turns the handoff off for good (the database lacks its function).
    pub(crate) fn turn_off(&self) {
        self.off.store(true, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::Utc;

    fn receipts(n: i64) -> Vec<Receipt> {
        (0..n)
            .map(|msg_id| Receipt {
                msg_id,
                read_at: Utc::now(),
            })
            .collect()
    }

    #[tokio::test]
    async fn a_batch_no_loop_takes_comes_back() {
        let h = Handoff::default();
        assert!(h.offer(&receipts(3)).await.is_none());
        assert!(h.take().is_none(), "taken back: nothing left in the slot");
    }

    #[tokio::test]
    async fn a_taken_batch_waits_for_its_outcome() {
        let h = std::sync::Arc::new(Handoff::default());
        let h2 = std::sync::Arc::clone(&h);
        let loop_ = tokio::spawn(async move {
            loop {
                if let Some(t) = h2.take() {
                    assert_eq!(t.acks.len(), 2);
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    t.reply(Outcome::Written(vec![0]));
                    return;
                }
                tokio::task::yield_now().await;
            }
        });
        match h.offer(&receipts(2)).await {
            Some(Outcome::Written(ids)) => assert_eq!(ids, [0]),
            other => panic!("{other:?}"),
        }
        loop_.await.unwrap();
    }

    #[tokio::test]
    async fn a_loop_that_drops_a_batch_leaves_its_outcome_unknown() {
        let h = std::sync::Arc::new(Handoff::default());
        let h2 = std::sync::Arc::clone(&h);
        tokio::spawn(async move {
            loop {
                if let Some(t) = h2.take() {
                    drop(t);
                    return;
                }
                tokio::task::yield_now().await;
            }
        });
        assert!(matches!(
            h.offer(&receipts(1)).await,
            Some(Outcome::Failed { unknown: true })
        ));
    }

    #[tokio::test]
    async fn turned_off_it_offers_nothing() {
        let h = Handoff::default();
        h.turn_off();
        assert!(h.offer(&receipts(1)).await.is_none());
        assert!(h.take().is_none());
    }
}
