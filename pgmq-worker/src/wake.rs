//! The claim loops' wake-up: sent by the notifier (an insert was
//! notified), by a claim loop that read a full batch (the backlog is back)
//! and, with group-ordered claims, by whatever acknowledged a message (its
//! group's next one is claimable); received by every parked claim loop.
//!
//! A counter in a watch channel, marked seen just before each read: one that
//! arrives during a read makes the loop read again instead of parking, so
//! none is lost.

use tokio::sync::watch;

/// Wakes the parked claim loops of one worker; cheap to clone.
#[derive(Clone)]
pub(crate) struct Wake {
    tx: watch::Sender<u64>,
}

impl Default for Wake {
    fn default() -> Self {
        Wake {
            tx: watch::channel(0u64).0,
        }
    }
}

impl Wake {
    /// Wakes every parked claim loop (and makes a loop with a read in
    /// flight read again instead of parking).
    pub(crate) fn wake(&self) {
        self.tx.send_modify(|g| *g = g.wrapping_add(1));
    }

    /// A claim loop's end of it.
    pub(crate) fn subscribe(&self) -> watch::Receiver<u64> {
        self.tx.subscribe()
    }
}
