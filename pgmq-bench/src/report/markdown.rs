//! `pgmq-bench report`: a Markdown summary of one document, each table
//! followed by the definitions of its numbers.

use std::fmt::Write as _;

use crate::document::{Build, Database, Document, DurabilityClass, Host, Sdk, Storage, Workload};
use crate::report::{cell, thousands, MIB};
use crate::sections::REGISTRY;

const GIB: f64 = 1024.0 * 1024.0 * 1024.0;
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
    for section in REGISTRY {
        section.report(d, &mut out);
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A committed document, edited as `edit` says, then rendered.
    fn rendered(edit: impl FnOnce(&mut serde_json::Value)) -> String {
        let mut v: serde_json::Value =
            serde_json::from_str(include_str!("../../tests/data/dev-machine-fbd4125.json"))
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
        baselines.retain(|b| b["kind"] != "consume_equal_layout");
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
        v["figures"] = serde_json::to_value(crate::sections::figures(&sections)).unwrap();
    }

    /// `v` as the document of a run without the sections and fields that
    /// [`with_every_section`] adds (an older or a narrower run), its
    /// figures built again from them.
    fn without_optional_parts(v: &mut serde_json::Value) {
        let s = &mut v["sections"];
        s["backlog_scaling"] = serde_json::json!([]);
        s["worker_processes"] = serde_json::json!([]);
        let baselines = s["baseline"].as_array_mut().unwrap();
        baselines.retain(|b| b["kind"] != "consume_equal_layout");
        let sustained = s["sustained"].as_array_mut().unwrap();
        sustained.retain(|r| r["rate_search_step"].is_null());
        for r in sustained {
            r.as_object_mut().unwrap().remove("db_counters");
        }
        let database = v["metadata"]["database"].as_object_mut().unwrap();
        database.remove("storage");
        database.remove("select1_round_trip");
        let sections: crate::document::Sections =
            serde_json::from_value(v["sections"].clone()).unwrap();
        v["figures"] = serde_json::to_value(crate::sections::figures(&sections)).unwrap();
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
            "| 2 | 500 | – | 300 / 200 | 0.67 | 0.96 |",
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
        let old = rendered(without_optional_parts);
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
        let old = rendered(without_optional_parts);
        assert!(
            old.contains("| Data directory storage | unknown |"),
            "{old}"
        );
    }
}
