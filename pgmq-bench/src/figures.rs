//! Turns the measured runs of every section into the document's flat list of
//! figures, each with its definition, and evaluates the worker's targets.

use std::collections::BTreeMap;

use crate::cli::HandlerKind;
use crate::document::{
    BaselineRun, Better, Figure, Percentiles, Rate, Sample, Sections, TargetCheck,
};

const MIB: f64 = 1024.0 * 1024.0;

/// Collects figures; runs with no measured values add nothing.
struct Figures(Vec<Figure>);

impl Figures {
    #[allow(clippy::too_many_arguments)]
    fn add(
        &mut self,
        id: String,
        section: &str,
        label: String,
        unit: &str,
        better: Better,
        definition: &str,
        runs: Vec<Sample>,
    ) {
        if let Some(f) = Figure::from_runs(id, section, label, unit, better, definition, runs) {
            self.0.push(f);
        }
    }

    fn rate<'a>(
        &mut self,
        id: &str,
        section: &str,
        label: &str,
        definition: &str,
        runs: impl Iterator<Item = (u32, &'a Rate)>,
    ) {
        let samples = runs.map(|(r, rate)| Sample::rate(r, rate)).collect();
        self.add(
            id.to_owned(),
            section,
            label.to_owned(),
            "msg/s",
            Better::Higher,
            definition,
            samples,
        );
    }

    fn percentiles<'a>(
        &mut self,
        prefix: &str,
        section: &str,
        label: &str,
        definition: &str,
        runs: impl Iterator<Item = (u32, &'a Percentiles)>,
    ) {
        let runs: Vec<(u32, &Percentiles)> = runs.collect();
        type Pick = fn(&Percentiles) -> f64;
        let picks: [(&str, Pick); 4] = [
            ("p50", |p| p.p50),
            ("p95", |p| p.p95),
            ("p99", |p| p.p99),
            ("max", |p| p.max),
        ];
        for (name, pick) in picks {
            let samples = runs
                .iter()
                .map(|(r, p)| Sample::value(*r, pick(p)))
                .collect();
            self.add(
                format!("{prefix}.{name}_ms"),
                section,
                format!("{label} {name}"),
                "ms",
                Better::Lower,
                definition,
                samples,
            );
        }
    }
}

const DEF_SEND_SINGLE: &str =
    "SDK Client::send, one message per call, each call awaited before the next: \
    messages divided by the seconds from the first call to the last reply.";
const DEF_SEND_BATCH: &str =
    "SDK Client::send_batch of --batch-size messages per call, each awaited before the \
    next: messages divided by the seconds from the first call to the last reply.";
const DEF_THROUGHPUT: &str = "Worker runtime draining a preloaded, vacuumed queue with N handlers: distinct \
    messages handled divided by the seconds from spawning the worker to the end of the handler that completed \
    the last one. The final acknowledgement drain is verified afterwards and not included.";
const DEF_HANDLER: &str =
    "Handler duration from the worker's histogram: handler start to handler end, \
    acknowledgement excluded (microsecond histogram, two significant digits).";
const DEF_WAIT_DB: &str =
    "Queue wait, database segment: enqueued_at to last_read_at of each claimed message, \
    both stamped by the database clock (no host/database clock skew).";
const DEF_WAIT_LOCAL: &str =
    "Queue wait, local segment: claim registered in the worker to handler start, \
    on the monotonic clock. The reply's transit between the two segments is in neither.";
const DEF_RATIO: &str =
    "SDK figure divided by the baseline loop's figure (plain prepared statements on one \
    connection, no SDK) of the same round: the mean of the loop runs made just before and just after \
    the SDK run when both sections run (for the worker, those around that worker run): \
    above 1 the SDK is faster than the hand-written loop.";
const DEF_BASE_SINGLE: &str =
    "No SDK: SELECT * FROM pgmq.send($1, $2) prepared once, one connection, one \
    call at a time: messages divided by the seconds from the first call to the last reply.";
const DEF_BASE_BATCH: &str =
    "No SDK: SELECT * FROM pgmq.send_batch($1, $2::jsonb[]) prepared once, one \
    connection, one call at a time.";
const DEF_BASE_CONSUME: &str = "No SDK: pgmq.read($1, $2, $3) then pgmq.delete($1, $2::bigint[]) per batch, \
    prepared once, one connection, on a preloaded, vacuumed queue of the same size: messages divided by the \
    seconds from the first read to the last delete's reply. Run beside consume_scaling, once before each \
    worker run; a round's figure is then all its runs' messages over all their seconds.";
const DEF_BASE_EQUAL: &str = "No SDK, the worker's connection layout: two connections each looping \
    pgmq.read($1, $2, $3) of --batch-size and handing the ids to a third that deletes whatever has arrived with \
    one pgmq.delete($1, $2::bigint[]) at a time; plain tokio-postgres prepared statements, a preloaded, vacuumed \
    queue of the same size: messages divided by the seconds from the first read to the last delete's reply. \
    Run once before the first worker run of a round and once after the last.";
const DEF_RATIO_EQUAL: &str = "Worker throughput divided by the mean of the round's equal-layout loop runs \
    (same connections: two claiming, one deleting; no SDK): the SDK's own overhead at equal parallelism, \
    below 1 a cost, above 1 a gain.";
const DEF_IDLE_CPU: &str =
    "Process CPU time (getrusage: user + system, all threads) over the idle window \
    divided by its wall time, in percent of one core; several busy threads could exceed 100.";
const DEF_IDLE_EMPTY: &str =
    "pgmq.read calls that returned nothing, per second of the idle window (worker counter).";
const DEF_IDLE_WAKE: &str =
    "Claim-loop wake-ups (poll timer plus NOTIFY) per second of the idle window.";
const DEF_WAKEUP: &str =
    "Send call start to handler start for one message sent to an idle worker, monotonic \
    clock; the figure is the percentile over one run's samples, median over runs.";
const DEF_SUS_PROD: &str =
    "Messages the producers sent over the producer window, divided by its seconds.";
const DEF_SUS_HAND: &str =
    "Distinct messages handled over the producer window, divided by its seconds \
    (messages left at the end are drained afterwards, outside the window).";
const DEF_SUS_SLOPE: &str =
    "Least-squares slope of the sampled backlog (pgmq.metrics queue length, in flight \
    included) after the sustained warm-up: at most 10 msg/s passes.";
const DEF_SUS_SEARCH: &str = "--rate-search: sustained runs at --rate, then each --rate-step times faster, \
    until a run's verdict fails (backlog slope above 10 msg/s, or a message not handled): the highest target \
    rate whose run passed (0 when the first failed). The resolution is the step factor.";
const DEF_SUS_MAX: &str = "Largest backlog sampled (every 50 ms).";
const DEF_BACKLOG: &str = "Worker runtime (--backlog-workers handlers) draining a fresh, preloaded and vacuumed \
    queue of this many messages: distinct messages handled divided by the seconds from spawning the worker to \
    the end of the handler that completed the last one.";
const DEF_BACKLOG_RATIO: &str =
    "This backlog's drain rate divided by the smallest backlog's drain rate of the \
    same round: 1 when the rate holds as the backlog grows.";
const DEF_PROC_RATE: &str = "N separate worker processes (the bench binary's process-worker, --backlog-workers \
    handlers each, own pools) draining one preloaded, vacuumed queue of --messages: distinct messages handled by \
    all of them divided by the slowest process's seconds from its start signal to its last handler's end.";
const DEF_PROC_EVEN: &str =
    "The smallest process's handled count divided by the largest's: 1 when the work \
    was shared evenly (Jain's index is in the run record).";
const DEF_MEM: &str =
    "Peak resident set size of the bench process during the section's runs (largest run of \
    the round); see protocol.memory_method.";

fn measured<T>(runs: &[T], warmup: impl Fn(&T) -> bool) -> impl Iterator<Item = &T> {
    runs.iter().filter(move |r| !warmup(r))
}

/// Every figure of the measured runs.
pub fn build(s: &Sections) -> Vec<Figure> {
    let mut f = Figures(Vec::new());
    let worker_counts = consume_counts(s);
    sends(&mut f, s);
    consume_scaling(&mut f, s, &worker_counts);
    baselines(&mut f, s);
    ratios(&mut f, s, &worker_counts);
    idle(&mut f, s);
    wakeup(&mut f, s);
    sustained(&mut f, s);
    backlog_scaling(&mut f, s);
    worker_processes(&mut f, s);
    memory(&mut f, s);
    f.0
}

/// The handler counts of consume_scaling, ascending.
fn consume_counts(s: &Sections) -> Vec<u32> {
    let mut worker_counts: Vec<u32> = s.consume_scaling.iter().map(|r| r.workers).collect();
    worker_counts.sort_unstable();
    worker_counts.dedup();
    worker_counts
}

/// The measured baseline runs of one loop.
fn baseline_runs<'a>(
    s: &'a Sections,
    kind: &'static str,
) -> impl Iterator<Item = &'a BaselineRun> + 'a {
    measured(&s.baseline, |r| r.warmup).filter(move |r| r.kind == kind)
}

/// send_single and send_batch: the SDK rates.
fn sends(f: &mut Figures, s: &Sections) {
    f.rate(
        "send_single.rate",
        "send_single",
        "Single send",
        DEF_SEND_SINGLE,
        measured(&s.send_single, |r| r.warmup).map(|r| (r.round, &r.rate)),
    );
    f.rate(
        "send_batch.rate",
        "send_batch",
        "Batch send",
        DEF_SEND_BATCH,
        measured(&s.send_batch, |r| r.warmup).map(|r| (r.round, &r.rate)),
    );
}

/// consume_scaling: throughput and latency percentiles per handler count.
fn consume_scaling(f: &mut Figures, s: &Sections, worker_counts: &[u32]) {
    for w in worker_counts {
        let runs = || measured(&s.consume_scaling, |r| r.warmup).filter(move |r| r.workers == *w);
        let p = format!("consume_scaling.w{w}");
        f.rate(
            &format!("{p}.throughput"),
            "consume_scaling",
            &format!("Worker throughput, {w} handlers"),
            DEF_THROUGHPUT,
            runs().map(|r| (r.round, &r.rate)),
        );
        f.percentiles(
            &format!("{p}.handler"),
            "consume_scaling",
            &format!("Handler duration, {w} handlers,"),
            DEF_HANDLER,
            runs().map(|r| (r.round, &r.handler_ms)),
        );
        f.percentiles(
            &format!("{p}.queue_wait_db"),
            "consume_scaling",
            &format!("Queue wait (database), {w} handlers,"),
            DEF_WAIT_DB,
            runs().map(|r| (r.round, &r.queue_wait_db_ms)),
        );
        f.percentiles(
            &format!("{p}.queue_wait_local"),
            "consume_scaling",
            &format!("Queue wait (local), {w} handlers,"),
            DEF_WAIT_LOCAL,
            runs().map(|r| (r.round, &r.queue_wait_local_ms)),
        );
    }
}

/// The baseline loops: one rate per loop and round.
fn baselines(f: &mut Figures, s: &Sections) {
    let base = |kind: &'static str| baseline_runs(s, kind);
    // One value per round: a round with several runs of a loop (the
    // consume loop beside each worker run) counts their messages over their
    // seconds together.
    for (kind, label, def) in [
        ("send_single", "Baseline single send", DEF_BASE_SINGLE),
        ("send_batch", "Baseline batch send", DEF_BASE_BATCH),
        ("consume", "Baseline read + delete", DEF_BASE_CONSUME),
        (
            "consume_equal_layout",
            "Equal-layout read + delete (2 claim, 1 delete connection)",
            DEF_BASE_EQUAL,
        ),
    ] {
        let mut per_round: BTreeMap<u32, (u64, f64)> = BTreeMap::new();
        for r in base(kind) {
            let e = per_round.entry(r.round).or_default();
            e.0 += r.rate.count;
            e.1 += r.rate.elapsed_s;
        }
        let rates: Vec<(u32, Rate)> = per_round
            .into_iter()
            .map(|(round, (count, secs))| (round, Rate::new(count, secs)))
            .collect();
        f.rate(
            &format!("baseline.{kind}.rate"),
            "baseline",
            label,
            def,
            rates.iter().map(|(round, rate)| (*round, rate)),
        );
    }
}

/// Every SDK figure over its reference loop: sends, and the worker per
/// handler count against the consume loop and the equal-layout loop.
fn ratios(f: &mut Figures, s: &Sections, worker_counts: &[u32]) {
    let ratio = |sdk: Vec<(u32, f64)>, kind: &'static str, workers: Option<u32>| -> Vec<Sample> {
        sdk.into_iter()
            .filter_map(|(round, v)| {
                reference_rate(s, kind, round, workers).map(|b| Sample::value(round, v / b))
            })
            .collect()
    };
    let sdk_single = measured(&s.send_single, |r| r.warmup)
        .map(|r| (r.round, r.rate.rate_per_s))
        .collect();
    f.add(
        "send_single.vs_baseline".into(),
        "send_single",
        "Single send vs baseline".into(),
        "x",
        Better::Higher,
        DEF_RATIO,
        ratio(sdk_single, "send_single", None),
    );
    let sdk_batch = measured(&s.send_batch, |r| r.warmup)
        .map(|r| (r.round, r.rate.rate_per_s))
        .collect();
    f.add(
        "send_batch.vs_baseline".into(),
        "send_batch",
        "Batch send vs baseline".into(),
        "x",
        Better::Higher,
        DEF_RATIO,
        ratio(sdk_batch, "send_batch", None),
    );
    for w in worker_counts {
        let sdk = measured(&s.consume_scaling, |r| r.warmup)
            .filter(|r| r.workers == *w)
            .map(|r| (r.round, r.rate.rate_per_s))
            .collect();
        f.add(
            format!("consume_scaling.w{w}.vs_baseline"),
            "consume_scaling",
            format!("Worker, {w} handlers, vs baseline read + delete"),
            "x",
            Better::Higher,
            DEF_RATIO,
            ratio(sdk, "consume", Some(*w)),
        );
        let sdk = measured(&s.consume_scaling, |r| r.warmup)
            .filter(|r| r.workers == *w)
            .map(|r| (r.round, r.rate.rate_per_s))
            .collect();
        f.add(
            format!("consume_scaling.w{w}.vs_equal_layout"),
            "consume_scaling",
            format!("Worker, {w} handlers, vs equal-layout no-SDK loop (SDK overhead)"),
            "x",
            Better::Higher,
            DEF_RATIO_EQUAL,
            ratio(sdk, "consume_equal_layout", None),
        );
    }
}

/// The reference of a ratio: for a worker run, the mean of the consume
/// loops run just before and just after it (either alone when the other is
/// missing, as in older documents); for a send run, the mean of the round's
/// runs of its loop (one before and one after it). None when the loop did
/// not run in that round or measured nothing.
fn reference_rate(
    s: &Sections,
    kind: &'static str,
    round: u32,
    workers: Option<u32>,
) -> Option<f64> {
    let of_round = || baseline_runs(s, kind).filter(move |r| r.round == round);
    let mean_rate = |keep: &dyn Fn(&BaselineRun) -> bool| {
        let (n, sum) = of_round()
            .filter(|r| keep(r))
            .fold((0u32, 0.0), |(n, sum), r| (n + 1, sum + r.rate.rate_per_s));
        (n > 0).then(|| sum / f64::from(n))
    };
    let bracket = workers
        .and_then(|w| mean_rate(&|r| r.paired_workers == Some(w) || r.follows_workers == Some(w)));
    bracket
        .or_else(|| mean_rate(&|r| r.paired_workers.is_none() && r.follows_workers.is_none()))
        .or_else(|| of_round().next().map(|r| r.rate.rate_per_s))
        .filter(|v| *v > 0.0)
}

/// idle_worker: CPU, empty reads and wake-ups.
fn idle(f: &mut Figures, s: &Sections) {
    let idle = || measured(&s.idle_worker, |r| r.warmup);
    f.add(
        "idle_worker.cpu_percent".into(),
        "idle_worker",
        "Idle process CPU".into(),
        "%",
        Better::Lower,
        DEF_IDLE_CPU,
        idle()
            .map(|r| Sample::value(r.round, r.cpu_percent))
            .collect(),
    );
    f.add(
        "idle_worker.empty_reads_per_s".into(),
        "idle_worker",
        "Idle empty reads".into(),
        "1/s",
        Better::None,
        DEF_IDLE_EMPTY,
        idle()
            .map(|r| Sample::rate(r.round, &r.empty_reads))
            .collect(),
    );
    f.add(
        "idle_worker.wakeups_per_s".into(),
        "idle_worker",
        "Idle wake-ups".into(),
        "1/s",
        Better::None,
        DEF_IDLE_WAKE,
        idle().map(|r| Sample::rate(r.round, &r.wakeups)).collect(),
    );
}

/// wakeup_latency: percentiles per mode.
fn wakeup(f: &mut Figures, s: &Sections) {
    for mode in ["poll", "notify"] {
        let label = if mode == "poll" {
            "Wake-up, polling only,"
        } else {
            "Wake-up, LISTEN/NOTIFY,"
        };
        f.percentiles(
            &format!("wakeup_latency.{mode}"),
            "wakeup_latency",
            label,
            DEF_WAKEUP,
            measured(&s.wakeup_latency, |r| r.warmup)
                .filter(|r| r.mode == mode)
                .map(|r| (r.round, &r.latency_ms)),
        );
    }
}

/// sustained: the rate search, the rates, the backlog slope and maximum.
fn sustained(f: &mut Figures, s: &Sections) {
    let sus = || measured(&s.sustained, |r| r.warmup || r.rate_search_step.is_some());
    // The rate search: per round, the highest target rate whose verdict passed.
    let mut best: BTreeMap<u32, f64> = BTreeMap::new();
    for r in measured(&s.sustained, |r| r.warmup).filter(|r| r.rate_search_step.is_some()) {
        let e = best.entry(r.round).or_insert(0.0);
        if r.verdict.pass {
            *e = e.max(r.target_rate_per_s.unwrap_or(0.0));
        }
    }
    f.add(
        "sustained.rate_search.highest_passing".into(),
        "sustained",
        "Highest sustained producer rate that passed".into(),
        "msg/s",
        Better::Higher,
        DEF_SUS_SEARCH,
        best.into_iter()
            .map(|(round, v)| Sample::value(round, v))
            .collect(),
    );
    f.rate(
        "sustained.produced_rate",
        "sustained",
        "Sustained produced",
        DEF_SUS_PROD,
        sus().map(|r| (r.round, &r.produced)),
    );
    f.rate(
        "sustained.handled_rate",
        "sustained",
        "Sustained handled",
        DEF_SUS_HAND,
        sus().map(|r| (r.round, &r.handled)),
    );
    f.add(
        "sustained.backlog_slope".into(),
        "sustained",
        "Sustained backlog slope".into(),
        "msg/s",
        Better::None,
        DEF_SUS_SLOPE,
        sus()
            .filter_map(|r| r.backlog_slope_per_s.map(|v| Sample::value(r.round, v)))
            .collect(),
    );
    f.add(
        "sustained.backlog_max".into(),
        "sustained",
        "Sustained largest backlog".into(),
        "msg",
        Better::Lower,
        DEF_SUS_MAX,
        sus()
            .map(|r| Sample::value(r.round, r.backlog_max as f64))
            .collect(),
    );
}

/// backlog_scaling: per size, the drain rate and its ratio to the
/// smallest size's rate of the same round.
fn backlog_scaling(f: &mut Figures, s: &Sections) {
    let mut sizes: Vec<u64> = s
        .backlog_scaling
        .iter()
        .map(|r| r.ledger.expected)
        .collect();
    sizes.sort_unstable();
    sizes.dedup();
    let backlog = || measured(&s.backlog_scaling, |r| r.warmup);
    for n in &sizes {
        f.rate(
            &format!("backlog_scaling.n{n}.throughput"),
            "backlog_scaling",
            &format!(
                "Drain rate, backlog of {}",
                crate::report::thousands(*n as f64)
            ),
            DEF_BACKLOG,
            backlog()
                .filter(|r| r.ledger.expected == *n)
                .map(|r| (r.round, &r.rate)),
        );
    }
    if let Some(smallest) = sizes.first() {
        for n in sizes.iter().skip(1) {
            let runs = backlog()
                .filter(|r| r.ledger.expected == *n)
                .filter_map(|r| {
                    let base =
                        backlog().find(|b| b.round == r.round && b.ledger.expected == *smallest)?;
                    (base.rate.rate_per_s > 0.0)
                        .then(|| Sample::value(r.round, r.rate.rate_per_s / base.rate.rate_per_s))
                })
                .collect();
            f.add(
                format!("backlog_scaling.n{n}.vs_smallest"),
                "backlog_scaling",
                format!(
                    "Drain rate, backlog of {} vs {}",
                    crate::report::thousands(*n as f64),
                    crate::report::thousands(*smallest as f64)
                ),
                "x",
                Better::Higher,
                DEF_BACKLOG_RATIO,
                runs,
            );
        }
    }
}

/// worker_processes: combined rate and evenness per process count.
fn worker_processes(f: &mut Figures, s: &Sections) {
    let mut procs: Vec<u32> = s.worker_processes.iter().map(|r| r.processes).collect();
    procs.sort_unstable();
    procs.dedup();
    let wp = || measured(&s.worker_processes, |r| r.warmup);
    for n in &procs {
        f.rate(
            &format!("worker_processes.p{n}.throughput"),
            "worker_processes",
            &format!("Combined drain rate, {n} processes"),
            DEF_PROC_RATE,
            wp().filter(|r| r.processes == *n)
                .map(|r| (r.round, &r.rate)),
        );
        f.add(
            format!("worker_processes.p{n}.min_over_max"),
            "worker_processes",
            format!("Work share, smallest / largest process, {n} processes"),
            "x",
            Better::None,
            DEF_PROC_EVEN,
            wp().filter(|r| r.processes == *n)
                .map(|r| Sample::value(r.round, r.min_over_max))
                .collect(),
        );
    }
}

/// Peak RSS per section and round.
fn memory(f: &mut Figures, s: &Sections) {
    for (section, peaks) in peaks_by_round(s) {
        f.add(
            format!("memory.{section}.peak_rss_mib"),
            &section,
            format!("Peak RSS, {section}"),
            "MiB",
            Better::Lower,
            DEF_MEM,
            peaks
                .into_iter()
                .map(|(round, b)| Sample::value(round, b as f64 / MIB))
                .collect(),
        );
    }
}

/// Per section, per measured round: the largest run peak.
fn peaks_by_round(s: &Sections) -> BTreeMap<String, Vec<(u32, u64)>> {
    let mut out: BTreeMap<String, BTreeMap<u32, u64>> = BTreeMap::new();
    let mut put = |section: &str, round: u32, warmup: bool, peak: u64| {
        if !warmup {
            let e = out
                .entry(section.to_owned())
                .or_default()
                .entry(round)
                .or_default();
            *e = (*e).max(peak);
        }
    };
    for r in &s.send_single {
        put("send_single", r.round, r.warmup, r.peak_rss_bytes);
    }
    for r in &s.send_batch {
        put("send_batch", r.round, r.warmup, r.peak_rss_bytes);
    }
    for r in &s.consume_scaling {
        put("consume_scaling", r.round, r.warmup, r.peak_rss_bytes);
    }
    for r in &s.baseline {
        put("baseline", r.round, r.warmup, r.peak_rss_bytes);
    }
    for r in &s.idle_worker {
        put("idle_worker", r.round, r.warmup, r.peak_rss_bytes);
    }
    for r in &s.wakeup_latency {
        put("wakeup_latency", r.round, r.warmup, r.peak_rss_bytes);
    }
    for r in &s.sustained {
        put("sustained", r.round, r.warmup, r.peak_rss_bytes);
    }
    for r in &s.backlog_scaling {
        put("backlog_scaling", r.round, r.warmup, r.peak_rss_bytes);
    }
    out.into_iter()
        .map(|(k, v)| (k, v.into_iter().collect()))
        .collect()
}

/// Largest run peak per section, warm-up runs included.
pub fn section_peaks(s: &Sections) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    let mut put = |section: &str, peak: u64| {
        let e = out.entry(section.to_owned()).or_insert(0u64);
        *e = (*e).max(peak);
    };
    s.send_single
        .iter()
        .for_each(|r| put("send_single", r.peak_rss_bytes));
    s.send_batch
        .iter()
        .for_each(|r| put("send_batch", r.peak_rss_bytes));
    s.consume_scaling
        .iter()
        .for_each(|r| put("consume_scaling", r.peak_rss_bytes));
    s.baseline
        .iter()
        .for_each(|r| put("baseline", r.peak_rss_bytes));
    s.idle_worker
        .iter()
        .for_each(|r| put("idle_worker", r.peak_rss_bytes));
    s.wakeup_latency
        .iter()
        .for_each(|r| put("wakeup_latency", r.peak_rss_bytes));
    s.sustained
        .iter()
        .for_each(|r| put("sustained", r.peak_rss_bytes));
    s.backlog_scaling
        .iter()
        .for_each(|r| put("backlog_scaling", r.peak_rss_bytes));
    out
}

/// The inputs of the target checks that are not figures.
#[derive(Debug, Clone, Copy)]
pub struct TargetContext {
    /// `--handler`: what each handler call did.
    pub handler: HandlerKind,
    /// `--handler-work-ms`.
    pub handler_work_ms: u64,
    /// `--idle-poll-ms`.
    pub idle_poll_ms: u64,
    /// `--messages`.
    pub messages: u64,
}

#[allow(clippy::too_many_arguments)]
fn check(
    id: &str,
    description: &str,
    observed: Option<f64>,
    limit: f64,
    unit: &str,
    pass: impl Fn(f64) -> bool,
    applies: Result<(), String>,
    note: &str,
) -> TargetCheck {
    let (observed, pass, note) = match (applies, observed) {
        (Err(why), _) => (None, None, why),
        (Ok(()), None) => (None, None, "not measured in this run".to_owned()),
        (Ok(()), Some(v)) => (Some(v), Some(pass(v)), note.to_owned()),
    };
    TargetCheck {
        id: id.to_owned(),
        description: description.to_owned(),
        observed,
        limit,
        unit: unit.to_owned(),
        pass,
        note,
    }
}

/// Whether the targets stated for an empty handler apply: the handler does
/// nothing (`--handler empty`) and awaits nothing (`--handler-work-ms 0`).
fn empty_handler(ctx: TargetContext) -> Result<(), String> {
    match (ctx.handler, ctx.handler_work_ms) {
        (HandlerKind::Empty, 0) => Ok(()),
        (HandlerKind::Empty, ms) => Err(format!(
            "needs an empty handler (this run used --handler-work-ms {ms})"
        )),
        (kind, _) => Err(format!(
            "needs an empty handler (this run used --handler {})",
            kind.name()
        )),
    }
}

/// The lowest 8-handler / 1-handler throughput ratio that counts as "not
/// below". With an empty handler the claimers set the pace whatever the
/// handler count, so the two medians are the same figure twice up to the
/// rounds' own spread, and a strict `>= 1.0` would fail on that spread
/// alone; the fall the target guards against is far larger than this
/// margin (docs/benchmarks.md, "The worker's performance targets").
pub const W8_NOISE_FLOOR: f64 = 0.95;

/// The pgmq-worker performance targets, evaluated on the medians of one
/// document. The memory target needs two documents: `check-memory`.
pub fn targets(figures: &[Figure], ctx: TargetContext) -> Vec<TargetCheck> {
    let empty_handler = empty_handler(ctx);
    let mut checks = handler_count_checks(figures, ctx, &empty_handler);
    checks.extend(idle_and_wakeup_checks(figures, ctx));
    checks.extend(rate_and_memory_checks(figures, ctx, &empty_handler));
    checks
}

/// The median of the figure `id`, if the document has it.
fn median_of(figures: &[Figure], id: &str) -> Option<f64> {
    figures.iter().find(|f| f.id == id).map(|f| f.median)
}

/// The smallest median worker / one-connection-loop ratio over the handler
/// counts run.
fn min_vs_baseline(figures: &[Figure]) -> Option<f64> {
    let counts: Vec<u32> = {
        let mut v: Vec<u32> = figures
            .iter()
            .filter_map(|f| {
                f.id.strip_prefix("consume_scaling.w")?
                    .strip_suffix(".vs_baseline")?
                    .parse()
                    .ok()
            })
            .collect();
        v.sort_unstable();
        v
    };
    counts
        .iter()
        .filter_map(|w| median_of(figures, &format!("consume_scaling.w{w}.vs_baseline")))
        .reduce(f64::min)
}

/// Whether the backlog targets apply: the smallest backlog drained is 100,000.
fn backlog_from_100k(figures: &[Figure]) -> Result<(), String> {
    let smallest_backlog = figures
        .iter()
        .filter_map(|f| {
            f.id.strip_prefix("backlog_scaling.n")?
                .strip_suffix(".throughput")?
                .parse::<u64>()
                .ok()
        })
        .min();
    match smallest_backlog {
        Some(100_000) => Ok(()),
        _ => Err("needs backlog_scaling with sizes 100000 and 1000000".to_owned()),
    }
}

/// The targets on how the worker's rate grows with its handler count.
fn handler_count_checks(
    figures: &[Figure],
    ctx: TargetContext,
    empty_handler: &Result<(), String>,
) -> Vec<TargetCheck> {
    let med = |id: &str| median_of(figures, id);
    let min_ratio = min_vs_baseline(figures);
    let t1 = med("consume_scaling.w1.throughput");
    let t8 = med("consume_scaling.w8.throughput");
    let w8_over_w1 = t1.zip(t8).filter(|(a, _)| *a > 0.0).map(|(a, b)| b / a);
    vec![
        check(
            "worker_vs_baseline",
            "Worker with default settings reaches at least 1.4x the one-connection read + delete loop at every handler count",
            min_ratio,
            1.4,
            "x",
            |v| v >= 1.4,
            empty_handler.clone(),
            "smallest median ratio over the handler counts run",
        ),
        check(
            "w8_not_below_w1",
            "8 handlers never fall below the 1-handler throughput",
            w8_over_w1,
            W8_NOISE_FLOOR,
            "x",
            |v| v >= W8_NOISE_FLOOR,
            empty_handler.clone(),
            "median throughput at 8 handlers divided by the median at 1; with an empty handler both drain at the claimers' pace, so a ratio down to 0.95 is run-to-run noise, not a fall (the collapse this guards against, a polling connection per handler, is a drop by half or more)",
        ),
        check(
            "handler_1ms_w8_7x",
            "With a handler that awaits 1 ms, 8 handlers reach at least 7x the 1-handler rate",
            w8_over_w1,
            7.0,
            "x",
            |v| v >= 7.0,
            if ctx.handler == HandlerKind::Empty && ctx.handler_work_ms == 1 {
                Ok(())
            } else {
                Err("needs --handler empty with --handler-work-ms 1".to_owned())
            },
            "median throughput at 8 handlers divided by the median at 1",
        ),
    ]
}

/// The targets on the idle worker's cost and its NOTIFY wake-up.
fn idle_and_wakeup_checks(figures: &[Figure], ctx: TargetContext) -> Vec<TargetCheck> {
    let med = |id: &str| median_of(figures, id);
    let poll_250 = if ctx.idle_poll_ms == 250 {
        Ok(())
    } else {
        Err(format!(
            "needs --idle-poll-ms 250 (this run used {})",
            ctx.idle_poll_ms
        ))
    };
    vec![
        check(
            "idle_cpu",
            "Idle with 250 ms polling: at most 1% of one core",
            med("idle_worker.cpu_percent"),
            1.0,
            "%",
            |v| v <= 1.0,
            poll_250.clone(),
            "median over runs",
        ),
        check(
            "idle_empty_reads",
            "Idle with 250 ms polling: about 4 empty reads a second (3 to 5 accepted)",
            med("idle_worker.empty_reads_per_s"),
            4.0,
            "1/s",
            |v| (3.0..=5.0).contains(&v),
            poll_250,
            "median over runs",
        ),
        check(
            "notify_wakeup_p50",
            "A NOTIFY wake-up reaches the handler within 5 ms at the median",
            med("wakeup_latency.notify.p50_ms"),
            5.0,
            "ms",
            |v| v <= 5.0,
            Ok(()),
            "median over runs of each run's p50",
        ),
    ]
}

/// The targets against the equal-layout reference, on batch sends, on the
/// large backlog and on memory.
fn rate_and_memory_checks(
    figures: &[Figure],
    ctx: TargetContext,
    empty_handler: &Result<(), String>,
) -> Vec<TargetCheck> {
    let med = |id: &str| median_of(figures, id);
    vec![
        check(
            "consume_w8_vs_equal_layout",
            "With 8 handlers the worker reaches at least 1.1x the equal-layout reference (the worker's connection layout without the SDK, on PGMQ's functions)",
            med("consume_scaling.w8.vs_equal_layout"),
            1.1,
            "x",
            |v| v >= 1.1,
            empty_handler.clone(),
            "median over rounds of the worker's rate divided by the mean of the round's equal-layout runs",
        ),
        check(
            "send_batch_vs_baseline",
            "Batch sends reach at least 0.95x the no-SDK batch loop",
            med("send_batch.vs_baseline"),
            0.95,
            "x",
            |v| v >= 0.95,
            Ok(()),
            "median over rounds of the per-round ratio",
        ),
        check(
            "backlog_1m_vs_100k",
            "Draining 1,000,000 messages runs at least 0.85x the rate of draining 100,000",
            med("backlog_scaling.n1000000.vs_smallest"),
            0.85,
            "x",
            |v| v >= 0.85,
            backlog_from_100k(figures),
            "median over rounds of the 1,000,000 drain rate divided by the same round's 100,000 drain rate",
        ),
        check(
            "consume_peak_rss",
            "Peak RSS while draining the backlog at most 64 MiB (the target names 1,000,000 messages; check-memory compares two sizes)",
            med("memory.consume_scaling.peak_rss_mib"),
            64.0,
            "MiB",
            |v| v <= 64.0,
            Ok(()),
            &format!("median over runs, backlog of {} messages", ctx.messages),
        ),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ratio(id: &str, v: f64) -> Figure {
        Figure::from_runs(
            id,
            "consume_scaling",
            id,
            "x",
            Better::Higher,
            "a ratio",
            vec![Sample::value(0, v)],
        )
        .unwrap()
    }

    fn ctx(handler: HandlerKind, handler_work_ms: u64) -> TargetContext {
        TargetContext {
            handler,
            handler_work_ms,
            idle_poll_ms: 250,
            messages: 1000,
        }
    }

    /// The targets stated for an empty handler are judged only on runs
    /// whose handler does nothing and awaits nothing.
    #[test]
    fn empty_handler_targets_need_an_empty_handler_kind_and_no_work() {
        let figures = [
            ratio("consume_scaling.w1.vs_baseline", 2.0),
            ratio("consume_scaling.w8.vs_baseline", 2.0),
            ratio("consume_scaling.w8.vs_equal_layout", 1.5),
            ratio("consume_scaling.w1.throughput", 100.0),
            ratio("consume_scaling.w8.throughput", 800.0),
        ];
        let judged = |c: TargetContext| -> Vec<(String, Option<bool>, String)> {
            targets(&figures, c)
                .into_iter()
                .filter(|t| {
                    ["worker_vs_baseline", "consume_w8_vs_equal_layout"].contains(&t.id.as_str())
                })
                .map(|t| (t.id, t.pass, t.note))
                .collect()
        };
        let empty = judged(ctx(HandlerKind::Empty, 0));
        assert_eq!(empty.len(), 2);
        assert!(
            empty.iter().all(|(_, pass, _)| *pass == Some(true)),
            "{empty:?}"
        );
        for kind in [HandlerKind::DbWrite, HandlerKind::DbWriteTx] {
            for (id, pass, note) in judged(ctx(kind, 0)) {
                assert_eq!(pass, None, "{id} judged with --handler {}", kind.name());
                assert!(note.contains(kind.name()), "{id}: {note}");
            }
        }
        for (id, pass, note) in judged(ctx(HandlerKind::Empty, 1)) {
            assert_eq!(pass, None, "{id} judged with --handler-work-ms 1");
            assert!(note.contains("--handler-work-ms 1"), "{id}: {note}");
        }
        let one_ms = |c: TargetContext| {
            let t = targets(&figures, c)
                .into_iter()
                .find(|t| t.id == "handler_1ms_w8_7x")
                .unwrap();
            (t.pass, t.note)
        };
        assert_eq!(one_ms(ctx(HandlerKind::Empty, 1)).0, Some(true));
        let (pass, note) = one_ms(ctx(HandlerKind::DbWrite, 1));
        assert_eq!(pass, None);
        assert!(note.starts_with("needs --handler empty"), "{note}");
    }
}
