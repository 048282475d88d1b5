//! `pgmq-bench report`: a Markdown summary of one document, each table
//! followed by the definitions of its numbers.

use std::collections::BTreeSet;
use std::fmt::Write as _;

use crate::document::{
    Build, Database, Document, DurabilityClass, Figure, Host, Sdk, Storage, Workload,
};
use crate::report::{fmt_figure, fmt_value, thousands};

const GIB: f64 = 1024.0 * 1024.0 * 1024.0;
const MIB: f64 = 1024.0 * 1024.0;

fn fig<'a>(d: &'a Document, id: &str) -> Option<&'a Figure> {
    d.figure(id)
}

fn cell(d: &Document, id: &str) -> String {
    fig(d, id).map(fmt_figure).unwrap_or_else(|| "–".to_owned())
}

/// Writes the definitions of the given figures once each.
fn definitions(out: &mut String, d: &Document, ids: &[String]) {
    let mut seen = BTreeSet::new();
    for id in ids {
        if let Some(f) = fig(d, id) {
            if seen.insert(f.definition.clone()) {
                let _ = writeln!(
                    out,
                    "- *{}*: {}",
                    f.label.trim_end_matches(','),
                    f.definition
                );
            }
        }
    }
    out.push('\n');
}

fn conditions(out: &mut String, d: &Document) {
    let m = &d.metadata;
    let h = &m.host;
    let db = &m.database;
    let _ = writeln!(out, "## Conditions\n\n| | |\n| --- | --- |");
    let rows: Vec<(&str, String)> = vec![
        ("SDK", sdk_row(&m.sdk)),
        ("Build", build_row(&m.build)),
        ("Host", host_row(h)),
        ("Virtualization", virtualization_row(h)),
        (
            "CPU frequency governor",
            h.cpu_governor
                .clone()
                .unwrap_or_else(|| "not exposed".into()),
        ),
        (
            "Benchmark runtime",
            m.runtime.as_ref().map_or("unknown".into(), |r| {
                format!("tokio, {} worker threads", r.tokio_worker_threads)
            }),
        ),
        ("Load average (1 min)", load_average_row(h)),
        (
            "PostgreSQL",
            format!(
                "{} (server_version_num {})",
                db.server_version, db.server_version_num
            ),
        ),
        ("PGMQ", format!("{} ({})", db.pgmq_version, db.pgmq_install)),
        ("Data directory storage", storage_row(db.storage.as_ref())),
        ("`SELECT 1` round trip", select1_row(db)),
        ("Database", database_row(db)),
        ("Durability", durability_row(d)),
        ("Workload", workload_row(&m.workload)),
        (
            "Protocol",
            format!(
                "{} warm-up + {} measured rounds; {}; {}",
                d.protocol.warmup, d.protocol.repeat, d.protocol.statistic, d.protocol.queue_state
            ),
        ),
        ("Settings changed from defaults", changed_settings_row(db)),
        (
            "Period",
            format!(
                "{} to {}",
                m.started_at.to_rfc3339(),
                m.finished_at.to_rfc3339()
            ),
        ),
    ];
    for (k, v) in rows {
        let _ = writeln!(out, "| {k} | {} |", v.replace('|', "\\|"));
    }
    out.push('\n');
}

fn sdk_row(sdk: &Sdk) -> String {
    let commit = match (&sdk.git_commit, sdk.git_dirty) {
        (Some(c), Some(true)) => format!("{} (uncommitted changes)", &c[..c.len().min(12)]),
        (Some(c), _) => c[..c.len().min(12)].to_owned(),
        (None, _) => "unknown".to_owned(),
    };
    format!("{}, commit {commit}", sdk.version)
}

fn host_row(h: &Host) -> String {
    format!(
        "{}, kernel {}, {} × {}, {:.1} GiB{}",
        h.os_release.as_deref().unwrap_or(&h.os),
        h.kernel.as_deref().unwrap_or("?"),
        h.cpu_count,
        h.cpu_model.as_deref().unwrap_or("unknown CPU"),
        h.memory_bytes.unwrap_or(0) as f64 / GIB,
        match (&h.cgroup_cpu_max, &h.cgroup_memory_max) {
            (Some(c), Some(mm)) => format!(", cgroup cpu.max {c}, memory.max {mm}"),
            _ => String::new(),
        }
    )
}

fn load_average_row(h: &Host) -> String {
    format!(
        "{} at start, {} at end",
        h.load_average_start
            .map_or("?".into(), |v| format!("{v:.2}")),
        h.load_average_end.map_or("?".into(), |v| format!("{v:.2}"))
    )
}

fn select1_row(db: &Database) -> String {
    db.select1_round_trip
        .as_ref()
        .map_or("not measured".into(), |r| {
            format!(
                "p50 {:.0} µs, p99 {:.0} µs, mean {:.0} µs ({} round trips on one connection)",
                r.p50_us, r.p99_us, r.mean_us, r.samples
            )
        })
}

fn database_row(db: &Database) -> String {
    format!(
        "`{}`{}",
        db.dsn,
        if db.local_cluster {
            ", throwaway local cluster (--local)"
        } else {
            ""
        }
    )
}

fn durability_row(d: &Document) -> String {
    format!(
        "{} ({}){}",
        match d.durability.class {
            DurabilityClass::Durable => "durable",
            DurabilityClass::NonDurable => "NON-DURABLE, not comparable with durable results",
        },
        d.durability
            .settings
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(", "),
        if d.durability.unlogged_queues {
            ", unlogged queues"
        } else {
            ""
        }
    )
}

fn workload_row(w: &Workload) -> String {
    format!(
        "{} messages per consume run, {} per batch-send run, {} per single-send run, batch {}, vt {} s, \
         ~{} B JSON bodies, handlers {:?}, {}handler work {} ms, {}pool {}",
        thousands(w.messages as f64),
        thousands(w.batch_messages as f64),
        thousands(w.single_messages as f64),
        w.batch_size,
        w.visibility_timeout_s,
        w.payload_bytes,
        w.workers,
        w.handler
            .as_deref()
            .map_or(String::new(), |h| format!("handler `{h}`, ")),
        w.handler_work_ms,
        w.claim_reads
            .as_deref()
            .map_or(String::new(), |c| format!("claim reads `{c}`, ")),
        w.pool_size
    )
}

/// The database settings whose source is not a default or this client.
fn changed_settings_row(db: &Database) -> String {
    db.settings
        .iter()
        .filter(|s| !matches!(s.source.as_str(), "default" | "client" | "session"))
        .map(|s| {
            format!(
                "{}={}",
                s.name,
                crate::report::fmt_setting(&s.setting, s.unit.as_deref())
            )
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// Per run, what its one-second intervals recorded: the median interval
/// and the worst one, so a stall or a creeping RSS shows without printing
/// every second (the document has them all).
fn sustained_intervals(out: &mut String, d: &Document) {
    let runs: Vec<_> = d
        .sections
        .sustained
        .iter()
        .filter(|r| {
            r.intervals
                .iter()
                .any(|i| i.handler_ms.is_some() || i.rss_bytes.is_some())
        })
        .collect();
    if runs.is_empty() {
        return;
    }
    let _ = writeln!(
        out,
        "Per one-second interval (median over the run's intervals / worst interval):\n\n\
         | Round | Intervals | Handler p50 (ms) | Handler p99 (ms) | Queue wait p50 (ms) | Queue wait p99 (ms) | RSS first → last (largest), MiB |\n\
         | --- | --- | --- | --- | --- | --- | --- |"
    );
    let both = |vals: Vec<f64>| match crate::stats::median_min_max(&vals) {
        Some((med, _, max)) => format!("{} / {}", fmt_value(med, "ms"), fmt_value(max, "ms")),
        None => "–".to_owned(),
    };
    for r in runs {
        let iv = &r.intervals;
        let pick = |f: &dyn Fn(&crate::document::Interval) -> Option<f64>| {
            both(iv.iter().filter_map(f).collect())
        };
        let rss: Vec<u64> = iv.iter().filter_map(|i| i.rss_bytes).collect();
        let rss = match (rss.first(), rss.last(), rss.iter().max()) {
            (Some(a), Some(b), Some(m)) => format!(
                "{:.1} → {:.1} ({:.1})",
                *a as f64 / MIB,
                *b as f64 / MIB,
                *m as f64 / MIB
            ),
            _ => "–".to_owned(),
        };
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} | {rss} |",
            sustained_round(r),
            iv.len(),
            pick(&|i| i.handler_ms.map(|p| p.p50)),
            pick(&|i| i.handler_ms.map(|p| p.p99)),
            pick(&|i| i.queue_wait_ms.map(|p| p.p50)),
            pick(&|i| i.queue_wait_ms.map(|p| p.p99)),
        );
    }
    let _ = writeln!(
        out,
        "\n- *Handler p50/p99 per interval*: handler run time (start to end of the handler call, as the worker \
         measures it) of the calls recorded in that second.\n\
         - *Queue wait p50/p99 per interval*: the message's `enqueued_at` (database clock) to the start of its \
         handler call (this host's clock, moved onto the database's by an offset measured before the run), of \
         the calls that started in that second.\n\
         - *RSS*: the bench process's resident set size at the end of each interval.\n"
    );
}

fn build_row(b: &Build) -> String {
    let mut s = format!(
        "{}, {}",
        b.profile,
        b.rustc.as_deref().unwrap_or("rustc unknown")
    );
    if let Some(o) = &b.opt_level {
        let _ = write!(s, ", opt-level {o}");
    }
    if let Some(d) = &b.debug_info {
        let _ = write!(s, ", debug {d}");
    }
    match b.rustflags.as_deref() {
        Some("") => s.push_str(", no RUSTFLAGS"),
        Some(f) => {
            let _ = write!(s, ", RUSTFLAGS `{f}`");
        }
        None => {}
    }
    s
}

fn virtualization_row(h: &Host) -> String {
    let Some(v) = &h.virtualization else {
        return "unknown".into();
    };
    let mut parts = Vec::new();
    if let Some(vm) = &v.vm {
        parts.push(format!("VM: {vm}"));
    }
    if let Some(c) = &v.container {
        parts.push(format!("container: {c}"));
    }
    if let Some(f) = v.hypervisor_cpu_flag {
        parts.push(format!(
            "hypervisor CPU flag {}",
            if f { "set" } else { "not set" }
        ));
    }
    let dmi: Vec<&str> = [v.sys_vendor.as_deref(), v.product_name.as_deref()]
        .into_iter()
        .flatten()
        .collect();
    if !dmi.is_empty() {
        parts.push(format!("DMI: {}", dmi.join(" ")));
    }
    if parts.is_empty() {
        "unknown".into()
    } else {
        parts.join(", ")
    }
}

fn storage_row(st: Option<&Storage>) -> String {
    let Some(st) = st else {
        return "unknown".into();
    };
    let mut parts = Vec::new();
    if let Some(f) = &st.filesystem {
        parts.push(f.clone());
    }
    if let Some(d) = &st.block_device {
        parts.push(format!(
            "on {d}{}",
            st.device_bus
                .as_deref()
                .map_or(String::new(), |b| format!(" ({b})"))
        ));
    }
    if let Some(r) = st.rotational {
        parts.push(if r { "rotational" } else { "non-rotational" }.into());
    }
    let mut s = if parts.is_empty() {
        "unknown".to_owned()
    } else {
        parts.join(", ")
    };
    if let Some(r) = &st.reason {
        let _ = write!(s, " ({r})");
    }
    s
}

/// The Markdown summary: the outcome, the conditions, one part per section
/// the document holds, memory and the targets.
pub fn render(d: &Document) -> String {
    let mut out = String::new();
    outcome(&mut out, d);
    conditions(&mut out, d);
    sends(&mut out, d);
    worker_scaling(&mut out, d);
    equal_layout(&mut out, d);
    backlog_scaling(&mut out, d);
    worker_processes(&mut out, d);
    idle(&mut out, d);
    wakeup(&mut out, d);
    sustained(&mut out, d);
    memory(&mut out, d);
    if !d.targets.is_empty() {
        out.push_str(&super::check::targets_table(&d.targets));
        if let Some(note) = super::check::host_note(&d.metadata.host) {
            out.push_str(&note);
        }
    }
    out
}

/// The title, the outcome, and every failure and warning.
fn outcome(out: &mut String, d: &Document) {
    let _ = writeln!(out, "# pgmq-bench result\n");
    let _ = writeln!(
        out,
        "**Outcome: {}.** Figures are `median (min–max)` over {} measured round(s) after {} warm-up round(s).\n",
        if d.outcome.ok { "ok" } else { "FAILED" },
        d.protocol.repeat,
        d.protocol.warmup
    );
    for f in &d.outcome.failures {
        let _ = writeln!(out, "- FAILED: {f}");
    }
    for w in &d.outcome.warnings {
        let _ = writeln!(out, "- warning: {w}");
    }
    if !d.outcome.failures.is_empty() || !d.outcome.warnings.is_empty() {
        out.push('\n');
    }
}

/// Single and batch sends beside their baseline loops.
fn sends(out: &mut String, d: &Document) {
    let send_ids: Vec<String> = [
        "send_single.rate",
        "send_single.vs_baseline",
        "baseline.send_single.rate",
        "send_batch.rate",
        "send_batch.vs_baseline",
        "baseline.send_batch.rate",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    if !send_ids.iter().any(|id| fig(d, id).is_some()) {
        return;
    }
    let _ = writeln!(
        out,
        "## Sends\n\n| | SDK (msg/s) | baseline, no SDK (msg/s) | SDK / baseline |\n| --- | --- | --- | --- |"
    );
    for (label, kind) in [("Single send", "send_single"), ("Batch send", "send_batch")] {
        if fig(d, &format!("{kind}.rate")).is_some()
            || fig(d, &format!("baseline.{kind}.rate")).is_some()
        {
            let _ = writeln!(
                out,
                "| {label} | {} | {} | {} |",
                cell(d, &format!("{kind}.rate")),
                cell(d, &format!("baseline.{kind}.rate")),
                cell(d, &format!("{kind}.vs_baseline"))
            );
        }
    }
    out.push('\n');
    definitions(out, d, &send_ids);
}

/// consume_scaling: throughput, its ratio to the baseline loop and the
/// latency percentiles per handler count.
fn worker_scaling(out: &mut String, d: &Document) {
    let counts = worker_counts(d);
    if counts.is_empty() {
        return;
    }
    let _ = writeln!(
        out,
        "## Worker scaling (consume_scaling)\n\n\
         | Handlers | Throughput (msg/s) | vs baseline | Handler p50 / p95 / p99 / max (ms) | \
         Queue wait, database p50 / p95 / p99 / max (ms) | Queue wait, local p50 / p95 / p99 / max (ms) |\n\
         | --- | --- | --- | --- | --- | --- |"
    );
    let mut ids = Vec::new();
    for w in &counts {
        let p = format!("consume_scaling.w{w}");
        let pct = |what: &str| {
            ["p50", "p95", "p99", "max"]
                .iter()
                .map(|q| {
                    fig(d, &format!("{p}.{what}.{q}_ms"))
                        .map(|f| fmt_value(f.median, "ms"))
                        .unwrap_or_else(|| "–".into())
                })
                .collect::<Vec<_>>()
                .join(" / ")
        };
        let _ = writeln!(
            out,
            "| {w} | {} | {} | {} | {} | {} |",
            cell(d, &format!("{p}.throughput")),
            cell(d, &format!("{p}.vs_baseline")),
            pct("handler"),
            pct("queue_wait_db"),
            pct("queue_wait_local")
        );
        ids.extend([
            format!("{p}.throughput"),
            format!("{p}.vs_baseline"),
            format!("{p}.handler.p50_ms"),
            format!("{p}.queue_wait_db.p50_ms"),
            format!("{p}.queue_wait_local.p50_ms"),
        ]);
    }
    let _ = writeln!(
        out,
        "\nBaseline read + delete on one connection: {} msg/s. Latency columns show medians over rounds.\n",
        cell(d, "baseline.consume.rate")
    );
    ids.push("baseline.consume.rate".into());
    definitions(out, d, &ids);
}

/// The worker against the no-SDK loop on its own connection layout, per
/// handler count: what the SDK costs or gains at equal parallelism.
fn equal_layout(out: &mut String, d: &Document) {
    let ids: Vec<String> = worker_counts(d)
        .iter()
        .map(|w| format!("consume_scaling.w{w}.vs_equal_layout"))
        .filter(|id| fig(d, id).is_some())
        .collect();
    if ids.is_empty() {
        return;
    }
    let _ = writeln!(
        out,
        "## Worker vs the equal-layout loop\n\n\
         Equal-layout read + delete (2 claim connections, 1 delete connection, no SDK): {} msg/s.\n\n\
         | Handlers | Worker / equal layout |\n| --- | --- |",
        cell(d, "baseline.consume_equal_layout.rate")
    );
    for id in &ids {
        let w = id
            .strip_prefix("consume_scaling.w")
            .and_then(|s| s.strip_suffix(".vs_equal_layout"))
            .unwrap_or("?");
        let _ = writeln!(out, "| {w} | {} |", cell(d, id));
    }
    out.push('\n');
    let mut defs = ids;
    defs.push("baseline.consume_equal_layout.rate".into());
    definitions(out, d, &defs);
}

/// The numbers `<prefix><n><suffix>` among the figure ids, ascending.
fn figure_keys(d: &Document, prefix: &str, suffix: &str) -> Vec<u64> {
    let mut v: Vec<u64> = d
        .figures
        .iter()
        .filter_map(|f| {
            f.id.strip_prefix(prefix)?
                .strip_suffix(suffix)?
                .parse()
                .ok()
        })
        .collect();
    v.sort_unstable();
    v.dedup();
    v
}

/// backlog_scaling: the drain rate per backlog size and its ratio to the
/// smallest size's rate.
fn backlog_scaling(out: &mut String, d: &Document) {
    let sizes = figure_keys(d, "backlog_scaling.n", ".throughput");
    let Some(smallest) = sizes.first() else {
        return;
    };
    let w = &d.metadata.workload;
    let mut how = Vec::new();
    if let Some(n) = w.backlog_workers {
        how.push(format!("{n} handlers"));
    }
    if let Some(c) = &w.claim_reads {
        how.push(format!("claim reads `{c}`"));
    }
    let _ = writeln!(
        out,
        "## Backlog scaling (backlog_scaling)\n\n{}| Backlog (messages) | Drain rate (msg/s) | vs {} |\n| --- | --- | --- |",
        if how.is_empty() {
            String::new()
        } else {
            format!("{}.\n\n", how.join(", "))
        },
        thousands(*smallest as f64)
    );
    let mut ids = Vec::new();
    for n in &sizes {
        let rate = format!("backlog_scaling.n{n}.throughput");
        let ratio = format!("backlog_scaling.n{n}.vs_smallest");
        let _ = writeln!(
            out,
            "| {} | {} | {} |",
            thousands(*n as f64),
            cell(d, &rate),
            if n == smallest {
                "1 (the reference)".to_owned()
            } else {
                cell(d, &ratio)
            }
        );
        ids.extend([rate, ratio]);
    }
    out.push('\n');
    definitions(out, d, &ids);
}

/// worker_processes: the combined rate per process count, each process's
/// own rate, and how evenly they shared the work.
fn worker_processes(out: &mut String, d: &Document) {
    let counts = figure_keys(d, "worker_processes.p", ".throughput");
    if counts.is_empty() {
        return;
    }
    let _ = writeln!(
        out,
        "## Worker processes (worker_processes)\n\n\
         | Processes | Combined rate (msg/s) | Per-process rates (msg/s), per round | Smallest / largest | Jain's index |\n\
         | --- | --- | --- | --- | --- |"
    );
    let mut ids = Vec::new();
    for n in &counts {
        let runs: Vec<_> = d
            .sections
            .worker_processes
            .iter()
            .filter(|r| !r.warmup && u64::from(r.processes) == *n)
            .collect();
        let per_process = runs
            .iter()
            .map(|r| {
                r.per_process
                    .iter()
                    .map(|p| thousands(p.rate.rate_per_s))
                    .collect::<Vec<_>>()
                    .join(" / ")
            })
            .collect::<Vec<_>>()
            .join("; ");
        let jain: Vec<f64> = runs.iter().map(|r| r.jain_index).collect();
        let rate = format!("worker_processes.p{n}.throughput");
        let even = format!("worker_processes.p{n}.min_over_max");
        let _ = writeln!(
            out,
            "| {n} | {} | {} | {} | {} |",
            cell(d, &rate),
            if per_process.is_empty() {
                "–".to_owned()
            } else {
                per_process
            },
            cell(d, &even),
            crate::stats::median_min_max(&jain)
                .map_or("–".to_owned(), |(med, _, _)| fmt_value(med, "x"))
        );
        ids.extend([rate, even]);
    }
    let _ = writeln!(
        out,
        "\nJain's index is (Σx)² / (n·Σx²) of the processes' handled counts, median over rounds: 1 when even, \
         1/n when one process did everything.\n"
    );
    processes_server(out, d, &counts);
    definitions(out, d, &ids);
}

/// worker_processes: the database's own counters per message, per process
/// count and round (why the rates are what they are).
fn processes_server(out: &mut String, d: &Document, counts: &[u64]) {
    let runs: Vec<_> = d
        .sections
        .worker_processes
        .iter()
        .filter(|r| !r.warmup && counts.contains(&u64::from(r.processes)))
        .filter_map(|r| r.server.as_ref().map(|s| (r, s)))
        .collect();
    if runs.is_empty() {
        return;
    }
    let _ = writeln!(
        out,
        "The database's own counters per message handled (queue table and its indexes; \
         transactions in the database):\n\n\
         | Processes | Round | Shared buffers | Index rows fetched | Transactions | Reads per process |\n\
         | --- | --- | --- | --- | --- | --- |"
    );
    for (r, s) in runs {
        let reads = r
            .per_process
            .iter()
            .map(|p| thousands(p.worker.reads as f64))
            .collect::<Vec<_>>()
            .join(" / ");
        let _ = writeln!(
            out,
            "| {} | {} | {:.1} | {:.2} | {:.3} | {reads} |",
            r.processes, r.round, s.buffers_per_msg, s.index_rows_per_msg, s.transactions_per_msg
        );
    }
    out.push('\n');
}

/// idle_worker: CPU, empty reads and wake-ups of a worker with no work.
fn idle(out: &mut String, d: &Document) {
    if fig(d, "idle_worker.cpu_percent").is_none() {
        return;
    }
    let w = &d.metadata.workload;
    let _ = writeln!(
        out,
        "## Idle worker\n\n{} s window, {} ms polling, notifications off.\n\n\
         | Process CPU (% of one core) | Empty reads/s | Wake-ups/s |\n| --- | --- | --- |\n| {} | {} | {} |\n",
        w.idle_seconds,
        w.idle_poll_ms,
        cell(d, "idle_worker.cpu_percent"),
        cell(d, "idle_worker.empty_reads_per_s"),
        cell(d, "idle_worker.wakeups_per_s")
    );
    definitions(
        out,
        d,
        &[
            "idle_worker.cpu_percent".into(),
            "idle_worker.empty_reads_per_s".into(),
            "idle_worker.wakeups_per_s".into(),
        ],
    );
}

/// wakeup_latency: send-to-handler latency, polling and NOTIFY.
fn wakeup(out: &mut String, d: &Document) {
    if fig(d, "wakeup_latency.poll.p50_ms").is_none()
        && fig(d, "wakeup_latency.notify.p50_ms").is_none()
    {
        return;
    }
    let w = &d.metadata.workload;
    let _ = writeln!(
        out,
        "## Wake-up latency\n\n{} samples per mode and round, poll interval (and NOTIFY fallback) {} ms.\n\n\
         | Mode | p50 (ms) | p95 (ms) | p99 (ms) | max (ms) |\n| --- | --- | --- | --- | --- |",
        w.wakeup_samples, w.wakeup_poll_ms
    );
    for (mode, label) in [("poll", "Polling only"), ("notify", "LISTEN/NOTIFY")] {
        let _ = writeln!(
            out,
            "| {label} | {} | {} | {} | {} |",
            cell(d, &format!("wakeup_latency.{mode}.p50_ms")),
            cell(d, &format!("wakeup_latency.{mode}.p95_ms")),
            cell(d, &format!("wakeup_latency.{mode}.p99_ms")),
            cell(d, &format!("wakeup_latency.{mode}.max_ms"))
        );
    }
    out.push('\n');
    definitions(out, d, &["wakeup_latency.poll.p50_ms".into()]);
}

/// A sustained run's round, flagged when a warm-up or a rate-search step.
fn sustained_round(r: &crate::document::SustainedRun) -> String {
    let mut s = r.round.to_string();
    if r.warmup {
        s.push_str(" (warm-up)");
    }
    if let Some(k) = r.rate_search_step {
        let _ = write!(s, " (search step {k})");
    }
    s
}

/// sustained: each run's rates, slope and verdict, its intervals, the
/// database's counters and the rate search's result.
fn sustained(out: &mut String, d: &Document) {
    if d.sections.sustained.is_empty() {
        return;
    }
    let _ = writeln!(
        out,
        "## Sustained\n\n| Round | Duration (s) | Target rate | Produced/s | Handled/s | Backlog slope ± std. error (msg/s) | \
         Largest backlog | Produced = handled | Verdict |\n| --- | --- | --- | --- | --- | --- | --- | --- | --- |"
    );
    for r in &d.sections.sustained {
        let _ = writeln!(
            out,
            "| {} | {:.1} | {} | {} | {} | {} | {} | {} | {} |",
            sustained_round(r),
            r.duration_s,
            r.target_rate_per_s
                .map_or("unpaced".to_owned(), |v| format!("{} msg/s", thousands(v))),
            thousands(r.produced.rate_per_s),
            thousands(r.handled.rate_per_s),
            match (r.backlog_slope_per_s, r.backlog_slope_stderr_per_s) {
                (Some(v), Some(se)) => format!("{v:+.2} ± {se:.2}"),
                (Some(v), None) => format!("{v:+.2}"),
                _ => "n/a".to_owned(),
            },
            thousands(r.backlog_max as f64),
            if r.ledger.distinct == r.produced.count && r.ledger.missing == 0 {
                format!("yes ({})", thousands(r.produced.count as f64))
            } else {
                format!(
                    "NO ({} produced, {} handled)",
                    r.produced.count, r.ledger.distinct
                )
            },
            if r.verdict.pass { "pass" } else { "FAIL" }
        );
    }
    out.push('\n');
    rate_search(out, d);
    sustained_intervals(out, d);
    db_counters(out, d);
    definitions(
        out,
        d,
        &[
            "sustained.produced_rate".into(),
            "sustained.handled_rate".into(),
            "sustained.backlog_slope".into(),
            "sustained.rate_search.highest_passing".into(),
        ],
    );
}

/// The rate search's highest passing producer rate, when it ran.
fn rate_search(out: &mut String, d: &Document) {
    let id = "sustained.rate_search.highest_passing";
    if fig(d, id).is_none() {
        return;
    }
    let settings = d
        .metadata
        .workload
        .rate_search
        .as_ref()
        .map_or(String::new(), |s| {
            format!(
                " (steps {}× apart, at most {})",
                fmt_value(s.step, "x"),
                s.steps_max
            )
        });
    let _ = writeln!(
        out,
        "Rate search{settings}: highest producer rate that passed {} msg/s.\n",
        cell(d, id)
    );
}

/// The database's own counters over each sustained run that read them.
fn db_counters(out: &mut String, d: &Document) {
    let runs: Vec<_> = d
        .sections
        .sustained
        .iter()
        .filter_map(|r| r.db_counters.as_ref().map(|c| (r, c)))
        .collect();
    if runs.is_empty() {
        return;
    }
    let _ = writeln!(
        out,
        "Database counters over each run:\n\n\
         | Round | WAL written (MiB) | Checkpoints | Queue autovacuums | Queue autoanalyzes | Queue dead tuples at end |\n\
         | --- | --- | --- | --- | --- | --- |"
    );
    let n = |v: Option<u64>| v.map_or("–".to_owned(), |v| thousands(v as f64));
    for (r, c) in runs {
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} |",
            sustained_round(r),
            c.wal_bytes
                .map_or("–".to_owned(), |b| format!("{:.1}", b as f64 / MIB)),
            n(c.checkpoints),
            n(c.queue_autovacuum_count),
            n(c.queue_autoanalyze_count),
            n(c.queue_dead_tuples)
        );
    }
    let _ = writeln!(
        out,
        "\n- *WAL written*: the whole cluster's (other databases' activity included), from the difference of \
         `pg_current_wal_lsn()`.\n\
         - *Queue autovacuums, autoanalyzes, dead tuples*: `pg_stat_user_tables` of the run's queue table (a new \
         table per run).\n"
    );
}

/// Peak RSS per section.
fn memory(out: &mut String, d: &Document) {
    let _ = writeln!(
        out,
        "## Memory\n\nMethod: `{}`. Overall peak RSS: {:.1} MiB.\n\n| Section | Peak RSS, median over rounds (MiB) | Largest run (MiB) |\n| --- | --- | --- |",
        d.memory.method,
        d.memory.overall_peak_rss_bytes as f64 / MIB
    );
    for (section, peak) in &d.memory.per_section {
        let _ = writeln!(
            out,
            "| {section} | {} | {:.1} |",
            cell(d, &format!("memory.{section}.peak_rss_mib")),
            *peak as f64 / MIB
        );
    }
    out.push('\n');
}

/// Handler counts present in the document, ascending.
pub fn worker_counts(d: &Document) -> Vec<u32> {
    let mut v: Vec<u32> = d
        .figures
        .iter()
        .filter_map(|f| {
            f.id.strip_prefix("consume_scaling.w")?
                .strip_suffix(".throughput")?
                .parse()
                .ok()
        })
        .collect();
    v.sort_unstable();
    v.dedup();
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A committed document, edited as `edit` says, then rendered.
    fn rendered(edit: impl FnOnce(&mut serde_json::Value)) -> String {
        let mut v: serde_json::Value = serde_json::from_str(include_str!(
            "../../../docs/results/dev-machine-3a1360c.json"
        ))
        .unwrap();
        edit(&mut v);
        render(&Document::from_json(&v.to_string(), "test").unwrap())
    }

    /// `v`'s sections with backlog_scaling, worker_processes, equal-layout
    /// loops, database counters and a rate search added, and its figures
    /// built again from them.
    fn with_every_section(v: &mut serde_json::Value) {
        use serde_json::json;
        let s = &mut v["sections"];
        let consume = s["consume_scaling"][4].clone();
        assert_eq!(consume["warmup"], false);
        let mut backlog = Vec::new();
        for round in 0..2 {
            for (n, secs) in [(1000u64, 1.0), (3000, 6.0)] {
                let mut r = consume.clone();
                r["round"] = round.into();
                r["count"] = n.into();
                r["elapsed_s"] = secs.into();
                r["rate_per_s"] = (n as f64 / secs).into();
                r["ledger"]["expected"] = n.into();
                backlog.push(r);
            }
        }
        s["backlog_scaling"] = backlog.into();
        let share = |index: u32, count: u64| {
            json!({
                "index": index,
                "rate": {"count": count, "elapsed_s": 2.0, "rate_per_s": count as f64 / 2.0},
                "share": count as f64 / 1000.0, "stalled": false,
                "worker": consume["worker"], "handler_ms": consume["handler_ms"],
                "peak_rss_bytes": 1 << 20
            })
        };
        s["worker_processes"] = json!([{
            "round": 0, "warmup": false, "processes": 2, "workers_per_process": 2,
            "handler": "empty", "handler_work_ms": 0,
            "count": 1000, "elapsed_s": 2.0, "rate_per_s": 500.0,
            "per_process": [share(0, 600), share(1, 400)],
            "min_over_max": 400.0 / 600.0, "jain_index": 0.96,
            "ledger": consume["ledger"], "remaining_after": 0, "preload_s": 0.1, "vacuum_s": 0.1
        }]);
        let baselines = s["baseline"].as_array_mut().unwrap();
        let template = baselines
            .iter()
            .find(|b| b["kind"] == "consume" && b["warmup"] == false)
            .unwrap()
            .clone();
        let w8: Vec<(u64, f64)> = s["consume_scaling"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|r| r["warmup"] == false && r["workers"] == 8)
            .map(|r| {
                (
                    r["round"].as_u64().unwrap(),
                    r["rate_per_s"].as_f64().unwrap(),
                )
            })
            .collect();
        let baselines = s["baseline"].as_array_mut().unwrap();
        for (round, rate) in w8 {
            let mut b = template.clone();
            b["kind"] = "consume_equal_layout".into();
            b["round"] = round.into();
            b["count"] = 100_000.into();
            b["elapsed_s"] = (100_000.0 * 1.25 / rate).into();
            b["rate_per_s"] = (rate / 1.25).into();
            b.as_object_mut().unwrap().remove("paired_workers");
            b.as_object_mut().unwrap().remove("follows_workers");
            baselines.push(b);
        }
        let sustained = s["sustained"].as_array_mut().unwrap();
        sustained[0]["db_counters"] = json!({
            "wal_bytes": 3 * (1 << 20), "checkpoints": 1, "queue_autovacuum_count": 2,
            "queue_autoanalyze_count": null, "queue_dead_tuples": 1234
        });
        for (step, rate, pass) in [(0u32, 1000.0, true), (1, 1500.0, false)] {
            let mut r = sustained[0].clone();
            r["rate_search_step"] = step.into();
            r["target_rate_per_s"] = rate.into();
            r["verdict"]["pass"] = pass.into();
            sustained.push(r);
        }
        v["metadata"]["workload"]["backlog_workers"] = 2.into();
        v["metadata"]["workload"]["claim_reads"] = "function".into();
        v["metadata"]["workload"]["handler"] = "empty".into();
        v["metadata"]["workload"]["rate_search"] =
            json!({"enabled": true, "step": 1.5, "steps_max": 8});
        let sections: crate::document::Sections =
            serde_json::from_value(v["sections"].clone()).unwrap();
        v["figures"] = serde_json::to_value(crate::figures::build(&sections)).unwrap();
    }

    #[test]
    fn every_section_present_renders_its_table() {
        let md = rendered(with_every_section);
        for want in [
            "## Backlog scaling (backlog_scaling)",
            "2 handlers, claim reads `function`.",
            "| Backlog (messages) | Drain rate (msg/s) | vs 1,000 |",
            "| 1,000 | 1,000 | 1 (the reference) |",
            "| 3,000 | 500 | 0.50 |",
            "## Worker processes (worker_processes)",
            "| 2 | 500 | 300 / 200 | 0.67 | 0.96 |",
            "## Worker vs the equal-layout loop",
            "| 8 | 1.25 |",
            "Rate search (steps 1.50× apart, at most 8): highest producer rate that passed 1,000 msg/s.",
            "| 0 (search step 1) |",
            "| Round | WAL written (MiB) | Checkpoints |",
            "| 0 | 3.0 | 1 | 2 | – | 1,234 |",
            "handler `empty`, handler work 0 ms, claim reads `function`, pool",
        ] {
            assert!(md.contains(want), "{want} not in\n{md}");
        }
        // Without those sections, none of their tables.
        let old = rendered(|_| {});
        for absent in [
            "## Backlog scaling",
            "## Worker processes",
            "## Worker vs the equal-layout loop",
            "Rate search",
            "WAL written",
        ] {
            assert!(!old.contains(absent), "{absent} in\n{old}");
        }
        assert!(old.contains("## Sustained") && old.contains("## Worker scaling"));
    }

    #[test]
    fn settings_print_with_their_units_multiplied_out() {
        let md = rendered(|v| {
            let rows = v["metadata"]["database"]["settings"]
                .as_array_mut()
                .unwrap();
            rows.retain(|r| !matches!(r["name"].as_str(), Some("shared_buffers" | "work_mem")));
            for (name, setting, unit) in [
                ("shared_buffers", "40961", "8kB"),
                ("work_mem", "4096", "kB"),
                ("checkpoint_timeout", "300", "s"),
            ] {
                rows.push(serde_json::json!({
                    "name": name, "setting": setting, "unit": unit, "source": "configuration file"
                }));
            }
        });
        let line = md
            .lines()
            .find(|l| l.starts_with("| Settings changed from defaults"))
            .unwrap();
        for want in [
            "shared_buffers=327688kB",
            "work_mem=4MB",
            "checkpoint_timeout=300s",
        ] {
            assert!(line.contains(want), "{want} not in {line}");
        }
        assert!(
            !line.contains("409618kB") && !line.contains("40968kB"),
            "{line}"
        );
    }

    #[test]
    fn conditions_show_the_measured_environment() {
        let md = rendered(|v| {
            let m = &mut v["metadata"];
            m["build"]["rustflags"] = "-C target-cpu=native".into();
            m["build"]["opt_level"] = "3".into();
            m["build"]["debug_info"] = "false".into();
            m["host"]["cpu_governor"] = "performance".into();
            m["host"]["virtualization"] = serde_json::json!({
                "vm": "kvm", "container": "none", "hypervisor_cpu_flag": true,
                "sys_vendor": null, "product_name": null
            });
            m["runtime"] = serde_json::json!({"tokio_worker_threads": 2});
            m["database"]["storage"] = serde_json::json!({
                "filesystem": "ext4", "block_device": "vda", "device_bus": "virtio",
                "rotational": false, "reason": null
            });
            m["database"]["select1_round_trip"] = serde_json::json!({
                "samples": 200, "p50_us": 61.2, "p99_us": 140.9, "mean_us": 70.4
            });
        });
        for want in [
            "opt-level 3, debug false, RUSTFLAGS `-C target-cpu=native`",
            "| Virtualization | VM: kvm, container: none, hypervisor CPU flag set |",
            "| CPU frequency governor | performance |",
            "tokio, 2 worker threads",
            "| Data directory storage | ext4, on vda (virtio), non-rotational |",
            "p50 61 µs, p99 141 µs, mean 70 µs (200 round trips on one connection)",
        ] {
            assert!(md.contains(want), "{want} not in\n{md}");
        }
        // An older document, without them, still renders.
        let old = rendered(|_| {});
        assert!(
            old.contains("| Data directory storage | unknown |"),
            "{old}"
        );
    }
}
