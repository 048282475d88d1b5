//! Workers of the benchmark's handlers: a worker is described by a
//! [`WorkerSpec`] (pgmq-testkit's, so that a worker setting is mirrored in
//! one place for the in-process workers and the worker processes alike),
//! and its handlers feed a [`Tally`], after the `--handler` workload.

use std::sync::Arc;

use pgmq_client::{Client, Message};
use pgmq_testkit::spec::{self, ClaimReadsSpec, WorkerSettings, WorkerSpec};
use pgmq_worker::{Outcome, Worker, WorkerBuilder};

use crate::document::WorkerCounters;
use crate::document::{ClaimReadsArg, HandlerKind};
use crate::error::{Error, Result};
use crate::kit::body::InBody;
use crate::kit::sink::Sink;
use crate::kit::tally::Tally;
use crate::kit::Ctx;

/// Milliseconds of `d`, as a worker spec holds durations.
pub(crate) fn ms(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// The spec's handler kind of the `--handler` workload: `db-write-tx`
/// inserts in the worker's transaction, the others run a handler with a
/// context.
pub(crate) fn handler_kind(h: HandlerKind) -> spec::HandlerKind {
    match h {
        HandlerKind::DbWriteTx => spec::HandlerKind::Transactional,
        HandlerKind::Empty | HandlerKind::DbWrite => spec::HandlerKind::Context,
    }
}

/// The spec's name of a `--claim-reads` choice.
pub(crate) fn claim_reads(a: ClaimReadsArg) -> ClaimReadsSpec {
    match a {
        ClaimReadsArg::Bounded => ClaimReadsSpec::Bounded,
        ClaimReadsArg::FromStart => ClaimReadsSpec::FromStart,
        ClaimReadsArg::Function => ClaimReadsSpec::Function,
    }
}

impl Ctx {
    /// A worker of `concurrency` handlers on `q` as the run's settings say:
    /// the `--handler` kind, `--batch-size`, `--vt` and `--claim-reads`
    /// (absent: the worker's default), every other setting at its default.
    pub(crate) fn worker_spec(&self, q: &pgmq_client::QueueName, concurrency: u32) -> WorkerSpec {
        let cfg = &self.cfg;
        WorkerSpec {
            handler: handler_kind(cfg.handler),
            settings: WorkerSettings {
                concurrency: Some(concurrency as usize),
                batch_size: Some(cfg.batch_size as usize),
                visibility_timeout_ms: Some(ms(cfg.vt())),
                claim_reads: cfg.claim_reads.map(claim_reads),
                ..WorkerSettings::default()
            },
            ..WorkerSpec::new(q.as_str())
        }
    }

    /// The worker of `spec` on the SDK client, its handlers writing to the
    /// run's sink (with `--handler db-write`) and feeding `tally`.
    pub(crate) fn worker(&self, spec: &WorkerSpec, tally: &Arc<Tally>) -> Result<Worker<InBody>> {
        let sink = self.sink.clone();
        let b = worker_on(self.client.clone(), spec, tally, sink, Outcome::Delete)?;
        Ok(b.build()?)
    }
}

/// The builder of `spec` on `client` (its queue checked, its settings
/// applied), for a handler the caller attaches.
pub(crate) fn builder(client: Client, spec: &WorkerSpec) -> Result<WorkerBuilder<InBody>> {
    spec.builder(client)
        .map_err(|e| Error::Config(format!("the worker's settings: {e}")))
}

/// The worker of `spec` on `client` whose handlers write to `sink` (when
/// given), feed `tally` and end in `ack`; with a
/// [`Transactional`](spec::HandlerKind::Transactional) handler, whose
/// handlers insert into the sink table in the worker's transaction that
/// also deletes the message.
pub(crate) fn worker_on(
    client: Client,
    spec: &WorkerSpec,
    tally: &Arc<Tally>,
    sink: Option<Arc<Sink>>,
    ack: Outcome,
) -> Result<WorkerBuilder<InBody>> {
    let t = tally.clone();
    let b = builder(client, spec)?;
    if spec.handler == spec::HandlerKind::Transactional {
        return Ok(b.transactional_handler(TxSink(t)));
    }
    Ok(b.handler(move |msg: Message<InBody>| {
        let (t, sink, ack) = (t.clone(), sink.clone(), ack.clone());
        async move {
            t.started(msg.enqueued_at);
            if let Some(s) = &sink {
                s.write(msg.body.id).await?;
            }
            t.handle(msg.body.id).await;
            Ok(ack)
        }
    }))
}

/// `--handler db-write-tx`: the sink insert in the worker's transaction.
struct TxSink(Arc<Tally>);

impl pgmq_worker::TransactionalHandler<InBody> for TxSink {
    async fn handle(
        &self,
        msg: Message<InBody>,
        tx: &pgmq_client::Transaction<'_>,
        _ctx: pgmq_worker::Context,
    ) -> std::result::Result<Outcome, pgmq_worker::HandlerError> {
        // Unprepared with its type given: one round trip, as the db-write
        // sink's prepared insert.
        self.0.started(msg.enqueued_at);
        let id = msg.body.id as i64;
        tx.query_typed(TX_INSERT, &[(&id, tokio_postgres::types::Type::INT8)])
            .await?;
        self.0.handle(msg.body.id).await;
        Ok(Outcome::Delete)
    }
}

/// The insert of `--handler db-write-tx`, into [`SINK_TABLE`](crate::kit::sink::SINK_TABLE).
const TX_INSERT: &str = "INSERT INTO pgmq_bench_handler_sink (id) VALUES ($1)";

/// The worker's counters, as the document records them.
pub(crate) fn counters(s: &pgmq_worker::StatsSnapshot) -> WorkerCounters {
    WorkerCounters {
        claimed: s.claimed,
        handled: s.handled,
        succeeded: s.succeeded,
        failed: s.failed,
        deleted: s.deleted,
        released: s.released,
        decode_failures: s.decode_failures,
        reads: s.reads,
        empty_reads: s.empty_reads,
        wakeups_poll: s.wakeups_poll,
        wakeups_notify: s.wakeups_notify,
        expired_unstarted: s.expired_unstarted,
        acks_failed: s.acks_failed,
        reads_from_start: s.reads_from_start,
    }
}
