//! `pgmq-bench check` and `check-memory`: the worker runtime's performance
//! targets, evaluated from documents (never from timed unit tests).

use std::fmt::Write as _;

use crate::document::HandlerKind;
use crate::document::{Document, Host, TargetCheck};
use crate::figures::TargetContext;
use crate::report::fmt_value;

const MIB: f64 = 1024.0 * 1024.0;

/// The machine the targets' limits were set on: the project's 2-core
/// x86_64 development machine (docs/benchmark-targets.md, "The worker's
/// performance targets").
pub const TARGETS_HOST: (&str, u32) = ("x86_64", 2);

/// A note when `host` is not like the machine the targets were set on
/// (another architecture or CPU count): a met or missed target then says
/// less about the SDK than about the machine.
pub fn host_note(host: &Host) -> Option<String> {
    let (arch, cpus) = TARGETS_HOST;
    if host.arch == arch && host.cpu_count == cpus {
        return None;
    }
    Some(format!(
        "Note: the targets' limits were set on a {cpus}-CPU {arch} machine; this run is from a \
         {}-CPU {} host{}. Read them as that machine's, not this one's.\n\n",
        host.cpu_count,
        host.arch,
        host.cpu_model
            .as_deref()
            .map(|m| format!(" ({m})"))
            .unwrap_or_default()
    ))
}

/// A Markdown table of target checks.
pub fn targets_table(targets: &[TargetCheck]) -> String {
    let mut out = String::from(
        "## Targets\n\n| Target | Observed | Limit | Result |\n| --- | --- | --- | --- |\n",
    );
    for t in targets {
        let observed = t
            .observed
            .map(|v| format!("{} {}", fmt_value(v, &t.unit), t.unit))
            .unwrap_or_else(|| "–".to_owned());
        let result = match t.pass {
            Some(true) => "met".to_owned(),
            Some(false) => "MISSED".to_owned(),
            None => format!("not evaluated: {}", t.note),
        };
        let _ = writeln!(
            out,
            "| {} | {observed} | {} {} | {result} |",
            t.description,
            fmt_value(t.limit, &t.unit),
            t.unit
        );
    }
    out.push('\n');
    out
}

/// Re-evaluates the targets from the document's figures and workload.
pub fn evaluate(doc: &Document) -> Vec<TargetCheck> {
    let w = &doc.metadata.workload;
    crate::sections::targets(
        &doc.figures,
        TargetContext {
            handler: handler_of(doc),
            handler_work_ms: w.handler_work_ms,
            idle_poll_ms: w
                .options
                .get("idle_poll_ms")
                .and_then(serde_json::Value::as_u64)
                .unwrap_or_default(),
            messages: w.messages,
        },
    )
}

/// What the document's handlers did: the kind its workload records, else
/// the kind its consume_scaling runs record; documents older than
/// `--handler` had only the empty handler.
fn handler_of(doc: &Document) -> HandlerKind {
    let consume_runs = || {
        let runs: Vec<serde_json::Value> = doc.sections.runs("consume_scaling").unwrap_or_default();
        runs.iter()
            .find_map(|r| r["handler"].as_str().map(str::to_owned))
    };
    doc.metadata
        .workload
        .handler
        .clone()
        .or_else(consume_runs)
        .as_deref()
        .and_then(HandlerKind::from_name)
        .unwrap_or(HandlerKind::Empty)
}

/// `check`: the table and the exit status (1 when a target is missed, or a
/// target in `require` was not evaluated).
pub fn check(doc: &Document, require: &[String]) -> (String, i32) {
    let targets = evaluate(doc);
    let mut out = targets_table(&targets);
    if let Some(note) = host_note(&doc.metadata.host) {
        out.push_str(&note);
    }
    let mut code = 0;
    if targets.iter().any(|t| t.pass == Some(false)) {
        code = 1;
    }
    for id in require {
        match targets.iter().find(|t| &t.id == id) {
            Some(t) if t.pass.is_some() => {}
            Some(_) => {
                let _ = writeln!(out, "required target `{id}` was not evaluated in this run");
                code = 1;
            }
            None => {
                let _ = writeln!(out, "unknown target `{id}`");
                code = 1;
            }
        }
    }
    if !doc.outcome.ok {
        let _ = writeln!(
            out,
            "the run itself failed: {}",
            doc.outcome.failures.join("; ")
        );
        code = 1;
    }
    (out, code)
}

/// The consume_scaling peak RSS of a document (largest run), bytes.
fn consume_peak(doc: &Document) -> Option<u64> {
    doc.memory.per_section.get("consume_scaling").copied()
}

/// `check-memory`: the larger backlog's consume_scaling peak at most
/// `max_mib`, and at most `tolerance_pct` above the smaller's.
pub fn check_memory(
    small: &Document,
    large: &Document,
    max_mib: f64,
    tolerance_pct: f64,
) -> (String, i32) {
    let mut out = String::from("## Memory target\n\n");
    let (Some(s), Some(l)) = (consume_peak(small), consume_peak(large)) else {
        out.push_str("both documents need a consume_scaling section\n");
        return (out, 2);
    };
    let (s_mib, l_mib) = (s as f64 / MIB, l as f64 / MIB);
    let growth = (l_mib - s_mib) / s_mib * 100.0;
    let _ = writeln!(
        out,
        "| Backlog | Peak RSS while draining (MiB) |\n| --- | --- |\n| {} messages | {s_mib:.1} |\n| {} messages | {l_mib:.1} |\n",
        crate::report::thousands(small.metadata.workload.messages as f64),
        crate::report::thousands(large.metadata.workload.messages as f64),
    );
    let under = l_mib <= max_mib;
    let flat = growth <= tolerance_pct;
    let _ = writeln!(
        out,
        "- larger backlog at most {max_mib} MiB: {} ({l_mib:.1} MiB)\n- growth at most {tolerance_pct}%: {} ({growth:+.1}%)\n- method: {} / {}",
        if under { "met" } else { "MISSED" },
        if flat { "met" } else { "MISSED" },
        small.memory.method,
        large.memory.method
    );
    if large.metadata.workload.messages <= small.metadata.workload.messages {
        let _ = writeln!(
            out,
            "- warning: the second document's backlog is not the larger one"
        );
    }
    (out, if under && flat { 0 } else { 1 })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_say_so_on_a_host_unlike_theirs() {
        let mut host: Host = serde_json::from_value(serde_json::json!({
            "os": "linux", "arch": "x86_64", "cpu_count": 2
        }))
        .unwrap();
        assert_eq!(host_note(&host), None);
        host.cpu_count = 16;
        let note = host_note(&host).unwrap();
        assert!(
            note.contains("2-CPU x86_64") && note.contains("16-CPU x86_64"),
            "{note}"
        );
        host.cpu_count = 2;
        host.arch = "aarch64".into();
        assert!(host_note(&host).is_some());
    }
}
