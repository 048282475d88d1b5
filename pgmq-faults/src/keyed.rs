//! Keyed sends retried until they land: the producers of scenario 11b and
//! of the campaign's fleet workload send each message under a
//! deduplication key and try a failed call again, with the same keys,
//! after every failure that is transient or of unknown outcome. A try that
//! committed before its answer was lost is then answered "duplicate" with
//! the stored message's id, so that the retries neither lose nor double a
//! message.

use std::future::Future;
use std::time::{Duration, Instant};

use pgmq_client::{CommitOutcome, Sent};

use crate::ledger::{ProduceOutcome, Produced};

/// How long a deduplication key holds: longer than a scenario or a seed
/// runs.
pub(crate) const KEY_WINDOW: Duration = Duration::from_secs(3600);

/// How a keyed producer retries one call.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Retry {
    /// A call still failing after this long is given up: far longer than a
    /// cut or a refusal lasts.
    pub limit: Duration,
    /// The pause before the next try.
    pub pause: Duration,
}

/// One try of a call, as the producer made it.
pub(crate) enum Try {
    /// The client answered.
    Answered(Result<Vec<Sent>, pgmq_client::Error>),
    /// The producer stopped waiting for the answer: its outcome is unknown.
    TimedOut,
    /// The producer did not make the try: the call is over (the campaign's
    /// keyed queue was re-created since the call's first try).
    Stopped,
}

/// What the tries of one or more keyed producers came to.
#[derive(Debug, Default)]
pub(crate) struct Tries {
    /// Tries made: first sends and retries.
    pub tries: u64,
    /// Failed tries whose outcome was unknown (in flight at a cut, or timed
    /// out), retried.
    pub unknown: u64,
    /// Failed tries without effect (not sent, or refused), retried too.
    pub no_effect: u64,
    /// Calls given up: an error neither transient nor of unknown outcome,
    /// or still failing after [`Retry::limit`].
    pub gave_up: u64,
    /// Calls the producer stopped between two tries ([`Try::Stopped`]).
    pub stopped: u64,
}

impl Tries {
    /// Adds another producer's tries.
    pub(crate) fn merge(&mut self, o: &Tries) {
        self.tries += o.tries;
        self.unknown += o.unknown;
        self.no_effect += o.no_effect;
        self.gave_up += o.gave_up;
        self.stopped += o.stopped;
    }
}

/// A call that landed: the client's answer to its last try, and how many
/// tries it took.
pub(crate) struct Landed {
    pub sent: Vec<Sent>,
    pub tries: u32,
}

/// Makes one keyed call: `attempt(n)` makes its try number `n` (from 0),
/// again after every failure that is transient or of unknown outcome,
/// [`Retry::pause`] apart, until one is answered or [`Retry::limit`] has
/// passed. Failed tries are noted in `produced`'s errors and counted in
/// `tries`. On failure, the outcome to record for the call's keys: unknown
/// when any try's was, since that try may have committed.
pub(crate) async fn send_retrying<F, Fut>(
    retry: Retry,
    tries: &mut Tries,
    produced: &mut Produced,
    mut attempt: F,
) -> Result<Landed, ProduceOutcome>
where
    F: FnMut(u32) -> Fut,
    Fut: Future<Output = Try>,
{
    let started = Instant::now();
    let mut unknown = false;
    let mut n = 0u32;
    loop {
        let (outcome, retryable) = match attempt(n).await {
            Try::Stopped => {
                tries.stopped += 1;
                return Err(unknown_or(unknown, ProduceOutcome::NotSent));
            }
            Try::Answered(Ok(sent)) => {
                tries.tries += 1;
                return Ok(Landed { sent, tries: n + 1 });
            }
            Try::Answered(Err(e)) => {
                produced.note_error(&e);
                let retryable = e.outcome() == CommitOutcome::Unknown || e.is_transient();
                (ProduceOutcome::of_error(&e), retryable)
            }
            Try::TimedOut => {
                *produced.errors.entry("Timeout".into()).or_default() += 1;
                (ProduceOutcome::Unknown, true)
            }
        };
        tries.tries += 1;
        if outcome == ProduceOutcome::Unknown {
            tries.unknown += 1;
            unknown = true;
        } else {
            tries.no_effect += 1;
        }
        if !retryable || started.elapsed() > retry.limit {
            tries.gave_up += 1;
            return Err(unknown_or(unknown, outcome));
        }
        n += 1;
        tokio::time::sleep(retry.pause).await;
    }
}

/// `outcome`, or unknown when an earlier try's outcome was.
fn unknown_or(unknown: bool, outcome: ProduceOutcome) -> ProduceOutcome {
    if unknown {
        ProduceOutcome::Unknown
    } else {
        outcome
    }
}

/// Records a keyed call's keys: committed with the ids it answered, or
/// with the outcome of its failure.
pub(crate) fn record(produced: &mut Produced, keys: &[i64], res: &Result<Landed, ProduceOutcome>) {
    match res {
        Ok(l) => produced.record(keys, &Ok(l.sent.iter().map(|s| s.msg_id).collect())),
        Err(o) => produced.record_as(keys, *o),
    }
}
