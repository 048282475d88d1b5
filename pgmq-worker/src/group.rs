//! Many queues in one process: several workers, one pool, one LISTEN
//! connection, one shutdown.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use futures::stream::{FuturesUnordered, StreamExt};
use pgmq_client::{Client, Listener, QueueName};
use serde::de::DeserializeOwned;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::backoff::ErrorBackoff;
use crate::error::Error;
use crate::handle::Monitor;
use crate::notifier::HubEvent;
use crate::shutdown::{ShutdownHandle, ShutdownReport, Signals};
use crate::worker::Worker;

type Run = Box<
    dyn FnOnce(
            CancellationToken,
            Option<mpsc::UnboundedReceiver<HubEvent>>,
        ) -> Pin<Box<dyn Future<Output = Result<ShutdownReport, Error>> + Send>>
        + Send,
>;

struct Member {
    queue: QueueName,
    notified: bool,
    stop: ShutdownHandle,
    monitor: Monitor,
    run: Run,
}

/// Several workers, each on its own queue with its own handler type,
/// concurrency and settings, run as one: they share the client's pool
/// (build them all from clones of one [`Client`]), the workers with
/// [`WakeUp::Notify`](crate::WakeUp::Notify) share one LISTEN connection
/// (outside the pool, reconnected with backoff), and one shutdown stops
/// them all, each draining as it would alone.
///
/// Size the pool for the sum of the workers' needs (each: `claimers` +
/// `ack_flushers` + 1, see the builder's docs); the LISTEN connection is one
/// for the whole group instead of one per queue.
///
/// ```no_run
/// # async fn f(client: pgmq_client::Client) -> Result<(), pgmq_worker::Error> {
/// use pgmq_client::{Message, QueueName};
/// use pgmq_worker::{Outcome, WakeUp, Worker, WorkerGroup};
///
/// #[derive(serde::Deserialize)]
/// struct Email { to: String }
/// #[derive(serde::Deserialize)]
/// struct Invoice { id: u64 }
///
/// let emails: Worker<Email> = Worker::builder(client.clone(), QueueName::new("emails")?)
///     .wake_up(WakeUp::Notify)
///     .handler(|m: Message<Email>| async move {
///         println!("mail {}", m.body.to);
///         Ok(Outcome::Delete)
///     })
///     .build()?;
/// let invoices: Worker<Invoice> = Worker::builder(client.clone(), QueueName::new("invoices")?)
///     .concurrency(2)
///     .wake_up(WakeUp::Notify)
///     .handler(|m: Message<Invoice>| async move {
///         println!("invoice {}", m.body.id);
///         Ok(Outcome::Archive)
///     })
///     .build()?;
/// let group = WorkerGroup::new(client).with_worker(emails).with_worker(invoices);
/// for (queue, monitor) in group.monitors() {
///     println!("{queue}: {} handled so far", monitor.stats().handled);
/// }
/// let reports = group.run_until_signal().await?;
/// # Ok(()) }
/// ```
pub struct WorkerGroup {
    client: Client,
    members: Vec<Member>,
}

impl std::fmt::Debug for WorkerGroup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let queues: Vec<&str> = self.members.iter().map(|m| m.queue.as_str()).collect();
        f.debug_struct("WorkerGroup")
            .field("queues", &queues)
            .finish_non_exhaustive()
    }
}

impl WorkerGroup {
    /// An empty group; `client` opens the shared LISTEN connection.
    pub fn new(client: Client) -> Self {
        WorkerGroup {
            client,
            members: Vec::new(),
        }
    }

    /// Adds a worker (built from a clone of the group's client, so that it
    /// shares its pool).
    pub fn with_worker<T: DeserializeOwned + Send + 'static>(mut self, worker: Worker<T>) -> Self {
        let queue = worker.queue().clone();
        let notified = worker.notified();
        let stop = worker.shutdown_handle();
        let monitor = worker.monitor();
        let run: Run = Box::new(move |signal: CancellationToken, hub| {
            Box::pin(async move { worker.run_with(signal.cancelled_owned(), hub).await })
        });
        self.members.push(Member {
            queue,
            notified,
            stop,
            monitor,
            run,
        });
        self
    }

    /// Each worker's queue and [`Monitor`] (statistics and health), usable
    /// while the group runs.
    pub fn monitors(&self) -> Vec<(QueueName, Monitor)> {
        self.members
            .iter()
            .map(|m| (m.queue.clone(), m.monitor.clone()))
            .collect()
    }

    /// A handle that stops every worker of the group, gracefully or at once.
    pub fn shutdown_handle(&self) -> GroupShutdown {
        GroupShutdown {
            handles: self.members.iter().map(|m| m.stop.clone()).collect(),
        }
    }

    /// Runs every worker until `signal` completes, then shuts them all down
    /// gracefully (at the same time) and returns their reports, in the
    /// order added. When a worker fails to start, stops with an error or
    /// panics, the others are shut down gracefully at once (without waiting
    /// for `signal`) and the first such error is returned.
    pub async fn run_until<F: Future>(self, signal: F) -> Result<Vec<ShutdownReport>, Error> {
        let stop_all = CancellationToken::new();
        let hub_stop = CancellationToken::new();
        let mut subscribers = Vec::new();
        let mut runs = FuturesUnordered::new();
        for (i, m) in self.members.into_iter().enumerate() {
            let events = if m.notified {
                let (tx, rx) = mpsc::unbounded_channel();
                subscribers.push((m.queue.clone(), tx));
                Some(rx)
            } else {
                None
            };
            let task = tokio::spawn((m.run)(stop_all.clone(), events));
            runs.push(async move { (i, task.await) });
        }
        let hub = (!subscribers.is_empty())
            .then(|| tokio::spawn(hub(self.client.clone(), subscribers, hub_stop.clone())));
        let mut reports: Vec<Option<ShutdownReport>> = (0..runs.len()).map(|_| None).collect();
        let mut first_err = None;
        let mut signal = std::pin::pin!(signal);
        let mut signalled = false;
        loop {
            tokio::select! {
                next = runs.next() => {
                    let Some((i, joined)) = next else { break };
                    let result = joined.unwrap_or_else(|e| {
                        Err(Error::Task(format!("a worker task ended abnormally: {e}")))
                    });
                    match result {
                        Ok(report) => reports[i] = Some(report),
                        Err(e) => {
                            // One member down stops the group: a service
                            // should not run on with part of its queues
                            // unserved.
                            stop_all.cancel();
                            first_err.get_or_insert(e);
                        }
                    }
                }
                _ = &mut signal, if !signalled => {
                    signalled = true;
                    stop_all.cancel();
                }
            }
        }
        hub_stop.cancel();
        if let Some(h) = hub {
            let _ = h.await;
        }
        match first_err {
            Some(e) => Err(e),
            None => Ok(reports.into_iter().flatten().collect()),
        }
    }

    /// Runs until SIGINT or SIGTERM, then shuts every worker down
    /// gracefully; a second signal escalates all of them
    /// ([`ShutdownHandle::immediate`]).
    pub async fn run_until_signal(self) -> Result<Vec<ShutdownReport>, Error> {
        let all = self.shutdown_handle();
        let mut signals = Signals::install();
        let escalation = async {
            signals.recv().await;
            tracing::info!(
                "signal received: stopping every worker gracefully (a second one stops at once)"
            );
            all.graceful();
            signals.recv().await;
            tracing::warn!("second signal: stopping every worker at once");
            all.immediate();
        };
        let run = self.run_until(std::future::pending::<()>());
        tokio::pin!(run);
        tokio::select! {
            res = &mut run => res,
            () = escalation => run.await,
        }
    }
}

/// Stops every worker of a [`WorkerGroup`] (from
/// [`WorkerGroup::shutdown_handle`]).
#[derive(Debug, Clone)]
pub struct GroupShutdown {
    handles: Vec<ShutdownHandle>,
}

impl GroupShutdown {
    /// Starts every worker's graceful shutdown.
    pub fn graceful(&self) {
        for h in &self.handles {
            h.graceful();
        }
    }

    /// Stops every worker at once (see [`ShutdownHandle::immediate`]).
    pub fn immediate(&self) {
        for h in &self.handles {
            h.immediate();
        }
    }
}

/// The group's one LISTEN connection: listens on every notified worker's
/// channel and forwards each notification to that worker; reconnects with
/// backoff (100 ms doubling to 10 s) and tells every worker when it is back.
async fn hub(
    client: Client,
    subscribers: Vec<(QueueName, mpsc::UnboundedSender<HubEvent>)>,
    stop: CancellationToken,
) {
    let by_channel: HashMap<String, mpsc::UnboundedSender<HubEvent>> = subscribers
        .iter()
        .map(|(q, tx)| (q.insert_channel(), tx.clone()))
        .collect();
    let mut backoff = ErrorBackoff::new(Duration::from_millis(100), Duration::from_secs(10));
    let mut first = true;
    loop {
        let opened = crate::notifier::connect_with_backoff(
            &stop,
            &mut backoff,
            "the group's LISTEN connection",
            || open(&client, &subscribers),
        )
        .await;
        let Some(mut listener) = opened else {
            return;
        };
        if !first {
            tracing::info!("the group's LISTEN connection is back");
            for tx in by_channel.values() {
                let _ = tx.send(HubEvent::Reconnected);
            }
        }
        first = false;
        loop {
            let n = tokio::select! {
                biased;
                _ = stop.cancelled() => return,
                n = listener.recv() => n,
            };
            match n {
                Some(n) => {
                    if let Some(tx) = by_channel.get(&n.channel) {
                        let _ = tx.send(HubEvent::Notified);
                    }
                }
                None => {
                    tracing::warn!("the group's LISTEN connection was lost; reconnecting");
                    break;
                }
            }
        }
    }
}

async fn open(
    client: &Client,
    subscribers: &[(QueueName, mpsc::UnboundedSender<HubEvent>)],
) -> Result<Listener, pgmq_client::Error> {
    let listener = client.listener().await?;
    for (q, _) in subscribers {
        listener.listen(q).await?;
    }
    Ok(listener)
}
