//! A paced stream: a worker on a client of its own draining a fresh queue
//! that a producer keeps feeding ([`produce`]), and the measured windows
//! of it, sampled every second with the database's counters around them.
//! The sections that follow a worker under a steady load (steady_stream,
//! pinned_horizon) run their streams with it and differ only in the
//! worker's settings, the producer's pace and what they do between windows.

use std::sync::Arc;
use std::time::{Duration, Instant};

use pgmq_client::{Client, QueueName};
use pgmq_testkit::spec::{WorkerSettings, WorkerSpec};
use pgmq_worker::{Outcome, ShutdownReport, WorkerHandle};
use tokio_util::sync::CancellationToken;

use crate::error::{Error, Result};
use crate::kit::load::{produce, Pace, Stream};
use crate::kit::snapshot::{db_clock_offset_us, every_second, ServerWindow, SteadyServer};
use crate::kit::tally::{QueueWaits, Tally};
use crate::kit::worker::worker_on;
use crate::kit::Ctx;

/// A tally of every handled id whose handlers each await `work`, recording
/// each call's queue wait on the database's clock.
pub(crate) async fn clocked_tally(ctx: &Ctx, work: Duration) -> Result<Arc<Tally>> {
    let offset_us = db_clock_offset_us(&ctx.admin).await?;
    Ok(Tally::with_waits(
        u64::MAX,
        work,
        QueueWaits::new(offset_us),
    ))
}

/// What a stream's worker is: the queue's name prefix (its pool's
/// application name is `pgmq-bench-<prefix>`), its pool's size (None: the
/// client's default), what each handler call sleeps, the worker's settings
/// and how a success is acknowledged.
pub(crate) struct StreamSpec<'a> {
    /// The fresh queue's name prefix.
    pub(crate) prefix: &'a str,
    /// Connections in the worker's pool (None: the client's default).
    pub(crate) pool: Option<u32>,
    /// What each handler call sleeps.
    pub(crate) sleep: Duration,
    /// The worker's settings (every one not given at its default).
    pub(crate) settings: WorkerSettings,
    /// How a handler acknowledges a success.
    pub(crate) ack: Outcome,
}

/// A running stream: its queue, what was sent into it and handled, and the
/// worker draining it (the memory meter running since its start).
pub(crate) struct StreamRun {
    /// The fresh queue.
    pub(crate) q: QueueName,
    /// Sent and handled so far.
    pub(crate) stream: Arc<Stream>,
    /// The worker.
    pub(crate) handle: WorkerHandle,
    client: Client,
}

/// A producer task feeding a stream, and what stops it.
pub(crate) struct Producer {
    task: tokio::task::JoinHandle<Result<()>>,
    stop: CancellationToken,
}

impl Producer {
    /// Whether it ended (it only ends on its own with an error).
    pub(crate) fn is_finished(&self) -> bool {
        self.task.is_finished()
    }

    /// Stops it and waits for it: its error, or its panic as
    /// `Error::Panicked`.
    pub(crate) async fn stop(self) -> Result<()> {
        self.stop.cancel();
        joined(self.task.await)
    }
}

/// A joined producer task's result: its error, or its panic as
/// `Error::Panicked`.
pub(crate) fn joined(r: std::result::Result<Result<()>, tokio::task::JoinError>) -> Result<()> {
    match r {
        Ok(r) => r,
        Err(e) => Err(Error::Panicked(format!("producer: {e}"))),
    }
}

impl StreamRun {
    /// A fresh queue and the worker of `spec` draining it on a client of
    /// its own, spawned with the memory meter begun.
    pub(crate) async fn start(ctx: &Ctx, spec: StreamSpec<'_>) -> Result<StreamRun> {
        let q = ctx.guard.fresh(spec.prefix).await?;
        let mut builder = ctx
            .target
            .builder()
            .application_name(&format!("pgmq-bench-{}", spec.prefix));
        if let Some(n) = spec.pool {
            builder = builder.max_size(n);
        }
        let client = builder.connect().await?;
        let tally = clocked_tally(ctx, spec.sleep).await?;
        let worker_spec = WorkerSpec {
            settings: spec.settings,
            ..WorkerSpec::new(q.as_str())
        };
        let w = worker_on(client.clone(), &worker_spec, &tally, None, spec.ack)?.build()?;
        ctx.meter.begin();
        let handle = w.spawn();
        Ok(StreamRun {
            q,
            stream: Stream::new(tally),
            handle,
            client,
        })
    }

    /// Starts a producer sending bodies padded with `pad` as `pace` says.
    pub(crate) fn produce(&self, ctx: &Arc<Ctx>, pad: &str, pace: Pace) -> Producer {
        let stop = CancellationToken::new();
        let task = tokio::spawn(produce(
            ctx.clone(),
            self.q.clone(),
            pad.to_owned(),
            pace,
            Arc::clone(&self.stream),
            stop.clone(),
        ));
        Producer { task, stop }
    }

    /// Stops `producer`, shuts the worker down and drops the queue: the
    /// worker's report and the peak RSS since the start. The producer's
    /// error comes after the queue is dropped.
    pub(crate) async fn finish(
        self,
        ctx: &Ctx,
        producer: Producer,
    ) -> Result<(ShutdownReport, u64)> {
        producer.stop.cancel();
        let produced = producer.task.await;
        let report = self.handle.shutdown().await?;
        let peak = ctx.meter.end();
        drop(self.client);
        ctx.guard.release(&self.q).await?;
        joined(produced)?;
        Ok((report, peak))
    }

    /// One measured window of `length` (cut short when `producer` ends):
    /// the claim latencies recorded in it, the backlog and the completions
    /// sampled each second, and the database's counters over it.
    pub(crate) async fn window(&self, ctx: &Ctx, length: Duration, producer: &Producer) -> Window {
        let (q, stream) = (&self.q, &*self.stream);
        let waits = stream.tally.waits.as_ref().expect("a tally with waits");
        waits.take();
        let mut server = ServerWindow::open(ctx, q).await;
        let start = Instant::now();
        let (d0, s0) = (stream.tally.distinct(), stream.sent());
        let (mut backlog, mut per_second) = (Vec::new(), Vec::new());
        let mut last = d0;
        let mut tick = every_second();
        while start.elapsed() < length && !producer.is_finished() {
            let left = length.saturating_sub(start.elapsed());
            tokio::select! {
                _ = tick.tick() => {}
                () = tokio::time::sleep(left) => {}
            }
            let done = stream.tally.distinct();
            backlog.push(stream.sent().saturating_sub(done));
            per_second.push((done - last) as f64);
            last = done;
            server.sample(ctx, q).await;
        }
        let elapsed_s = start.elapsed().as_secs_f64();
        let completed = stream.tally.distinct() - d0;
        let produced = stream.sent() - s0;
        let claims = waits.take();
        let server = server.close(ctx, q, completed).await;
        Window {
            elapsed_s,
            backlog_start: s0.saturating_sub(d0),
            completed,
            produced,
            backlog,
            per_second,
            claims,
            server,
        }
    }
}

/// What a measured window of a stream saw.
pub(crate) struct Window {
    /// Its seconds.
    pub(crate) elapsed_s: f64,
    /// The backlog (sent minus handled) at its start.
    pub(crate) backlog_start: u64,
    /// Messages whose handler finished in it.
    pub(crate) completed: u64,
    /// Messages sent in it.
    pub(crate) produced: u64,
    /// The backlog sampled each second.
    pub(crate) backlog: Vec<u64>,
    /// Completions of each second.
    pub(crate) per_second: Vec<f64>,
    /// Claim latencies (`enqueued_at` to handler start), microseconds.
    pub(crate) claims: hdrhistogram::Histogram<u64>,
    /// The database's counters over it, per message completed.
    pub(crate) server: SteadyServer,
}
