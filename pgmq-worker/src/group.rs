//! Many queues in one process: several workers, one pool, one LISTEN
//! connection, one shutdown.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
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
use crate::priority::{Gate, Priority, Share};
use crate::shutdown::{ShutdownHandle, ShutdownReport, Signals};
use crate::worker::Worker;

type Run = Box<
    dyn FnOnce(
            CancellationToken,
            Option<mpsc::UnboundedReceiver<HubEvent>>,
            Option<Share>,
        ) -> Pin<Box<dyn Future<Output = Result<ShutdownReport, Error>> + Send>>
        + Send,
>;

struct Member {
    queue: QueueName,
    notified: bool,
    stop: ShutdownHandle,
    monitor: Monitor,
    run: Run,
    /// Its weight or rank under the group's [`Priority`]; None when added
    /// with `with_worker` (1 in a prioritized group).
    priority: Option<u32>,
    /// Its handler loops (the default group capacity is the smallest).
    concurrency: usize,
    /// Its visibility timeout (claims wait for a run within a quarter of
    /// the shortest).
    visibility: Duration,
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
    priority: Option<Priority>,
}

impl std::fmt::Debug for WorkerGroup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let queues: Vec<&str> = self.members.iter().map(|m| m.queue.as_str()).collect();
        f.debug_struct("WorkerGroup")
            .field("queues", &queues)
            .field("priority", &self.priority)
            .finish_non_exhaustive()
    }
}

impl WorkerGroup {
    /// An empty group; `client` opens the shared LISTEN connection.
    pub fn new(client: Client) -> Self {
        WorkerGroup {
            client,
            members: Vec::new(),
            priority: None,
        }
    }

    /// Divides one handler capacity among the group's queues by
    /// priority: [`Priority::strict`] or [`Priority::weighted`] (see
    /// [`Priority`] and docs/fleet-priorities.md). Each
    /// worker's weight or rank is the number given to
    /// [`with_worker_priority`](Self::with_worker_priority) (1 for
    /// [`with_worker`](Self::with_worker)). Without it every worker claims
    /// and handles on its own, as far as its own `concurrency` goes.
    ///
    /// ```no_run
    /// # async fn f(client: pgmq_client::Client, urgent: pgmq_worker::Worker<u64>,
    /// #   bulk: pgmq_worker::Worker<u64>) -> Result<(), pgmq_worker::Error> {
    /// use pgmq_worker::{Priority, WorkerGroup};
    ///
    /// // `bulk` gets handlers only while `urgent` has no message ready.
    /// let group = WorkerGroup::new(client)
    ///     .priority(Priority::strict())
    ///     .with_worker_priority(urgent, 2)
    ///     .with_worker_priority(bulk, 1);
    /// group.run_until_signal().await?;
    /// # Ok(()) }
    /// ```
    pub fn priority(mut self, policy: Priority) -> Self {
        self.priority = Some(policy);
        self
    }

    /// Adds a worker with its `priority`: its weight under
    /// [`Priority::weighted`] (its share is its weight over the sum of the
    /// group's weights; 0 counts as 1), its rank under
    /// [`Priority::strict`] (higher first). A group given no
    /// [`priority`](Self::priority) policy becomes [`Priority::weighted`].
    ///
    /// ```no_run
    /// # async fn f(client: pgmq_client::Client, orders: pgmq_worker::Worker<u64>,
    /// #   reports: pgmq_worker::Worker<u64>) -> Result<(), pgmq_worker::Error> {
    /// use pgmq_worker::WorkerGroup;
    ///
    /// // Weighted 3:1 over the workers' smallest `concurrency`.
    /// let group = WorkerGroup::new(client)
    ///     .with_worker_priority(orders, 3)
    ///     .with_worker_priority(reports, 1);
    /// group.run_until_signal().await?;
    /// # Ok(()) }
    /// ```
    pub fn with_worker_priority<T: DeserializeOwned + Send + 'static>(
        mut self,
        worker: Worker<T>,
        priority: u32,
    ) -> Self {
        self = self.with_worker(worker);
        if let Some(m) = self.members.last_mut() {
            m.priority = Some(priority);
        }
        self
    }

    /// Adds a worker (built from a clone of the group's client, so that it
    /// shares its pool).
    pub fn with_worker<T: DeserializeOwned + Send + 'static>(mut self, worker: Worker<T>) -> Self {
        let queue = worker.queue().clone();
        let notified = worker.notified();
        let stop = worker.shutdown_handle();
        let monitor = worker.monitor();
        let concurrency = worker.concurrency();
        let visibility = worker.visibility_timeout();
        let run: Run = Box::new(move |signal: CancellationToken, hub, share| {
            Box::pin(async move {
                worker
                    .with_share(share)
                    .run_with(signal.cancelled_owned(), hub)
                    .await
            })
        });
        self.members.push(Member {
            queue,
            notified,
            stop,
            monitor,
            run,
            priority: None,
            concurrency,
            visibility,
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
        let gate = self.gate();
        for (i, m) in self.members.into_iter().enumerate() {
            let events = if m.notified {
                let (tx, rx) = mpsc::unbounded_channel();
                subscribers.push((m.queue.clone(), tx));
                Some(rx)
            } else {
                None
            };
            let share = gate.as_ref().map(|g| Share::new(g, i));
            let task = tokio::spawn((m.run)(stop_all.clone(), events, share));
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

    /// The shared capacity of a prioritized group; None without priorities.
    fn gate(&self) -> Option<Arc<Gate>> {
        let explicit = self.members.iter().any(|m| m.priority.is_some());
        let policy = self
            .priority
            .clone()
            .or_else(|| explicit.then(Priority::default))?;
        let levels: Vec<u32> = self
            .members
            .iter()
            .map(|m| m.priority.unwrap_or(1))
            .collect();
        let smallest = self.members.iter().map(|m| m.concurrency).min();
        let capacity = policy.capacity().or(smallest).unwrap_or(1);
        let visibility = self.members.iter().map(|m| m.visibility).min();
        Some(Gate::new(
            &policy,
            &levels,
            capacity,
            visibility.unwrap_or(Duration::MAX),
        ))
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
