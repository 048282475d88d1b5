//! A real short run of every section on a throwaway database, then its
//! document checked: the JSON Schema in docs/, every rate recomputable from
//! its count and seconds, figure summaries consistent with their runs, no
//! password, no queue left behind; its progress lines on a pipe, the short
//! summary it ends with; and report/compare/check and the Markdown summary
//! and comparison on it.

mod common;

use std::sync::OnceLock;

use clap::ValueEnum;
use common::{
    docs_dir, headline_labels, run, run_on, schema, short_run_args, summary_schema_errors,
    summary_validator, temp_path, TempDb,
};
use serde_json::Value;

#[derive(serde::Serialize, serde::Deserialize)]
struct ShortRun {
    text: String,
    leftover_queues: Vec<String>,
    /// What the run wrote to stderr, a pipe.
    stderr: String,
    /// What it wrote to stdout.
    stdout: String,
}

/// One short run shared by the tests of this file.
///
/// `cargo test` runs them in one process, where the `OnceLock` shares it.
/// nextest gives each test a process of its own; there the first process of
/// a run (`NEXTEST_RUN_ID`) claims the run with a file it creates
/// exclusively, and the others wait for the result it writes, so one
/// `nextest run` performs the benchmark once, never reusing an earlier one.
fn short_run() -> &'static ShortRun {
    static RUN: OnceLock<ShortRun> = OnceLock::new();
    RUN.get_or_init(|| match std::env::var("NEXTEST_RUN_ID") {
        Ok(id) => shared_across_processes(&id),
        Err(_) => perform_short_run(),
    })
}

/// The run of the nextest invocation `id`: performed by whichever test
/// process claims it first, read by the rest. A failure is shared too, so
/// every test reports the same cause instead of waiting out a timeout.
fn shared_across_processes(id: &str) -> ShortRun {
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("document-{id}"));
    std::fs::create_dir_all(&dir).unwrap();
    let (claim, done, failed) = (dir.join("claim"), dir.join("run.json"), dir.join("failed"));
    let claimed = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&claim)
        .is_ok();
    if claimed {
        match std::panic::catch_unwind(perform_short_run) {
            Ok(run) => {
                let tmp = dir.join("run.json.tmp");
                std::fs::write(&tmp, serde_json::to_string(&run).unwrap()).unwrap();
                std::fs::rename(&tmp, &done).unwrap();
                return run;
            }
            Err(panic) => {
                let why = panic
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_else(|| "the short run panicked".into());
                std::fs::write(&failed, &why).unwrap();
                std::panic::resume_unwind(panic);
            }
        }
    }
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(900);
    loop {
        if let Ok(text) = std::fs::read_to_string(&done) {
            return serde_json::from_str(&text).unwrap();
        }
        if let Ok(why) = std::fs::read_to_string(&failed) {
            panic!("the shared short run failed in another test process: {why}");
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no short run result in {} after 15 minutes",
            dir.display()
        );
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
}

fn perform_short_run() -> ShortRun {
    let db = TempDb::new("doc");
    let path = temp_path("benchmark.json");
    let out = run_on(&db.dsn, &short_run_args(path.to_str().unwrap()));
    // A 2-second sustained fit cannot resolve 10 msg/s: its verdict may
    // fail on noise (exit 1, and the document says why). Nothing else may.
    let ok = out.status.success()
        || (out.status.code() == Some(1)
            && path.exists()
            && only_slope_failures(
                &serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap(),
            ));
    assert!(
        ok,
        "the short run failed ({:?}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    ShortRun {
        text: std::fs::read_to_string(&path).unwrap(),
        leftover_queues: db.bench_queues(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
    }
}

/// Whether every recorded failure is a sustained backlog-slope verdict.
fn only_slope_failures(doc: &Value) -> bool {
    doc["outcome"]["failures"]
        .as_array()
        .unwrap()
        .iter()
        .all(|f| f.as_str().unwrap().contains("backlog slope"))
}

fn doc() -> Value {
    serde_json::from_str(&short_run().text).unwrap()
}

/// Progress reaches a pipe as whole lines: every step `[k/N]` once and in
/// order, each with its estimate of the time left, and each run's rate.
#[test]
fn progress_reaches_a_pipe_as_numbered_steps() {
    let err = &short_run().stderr;
    assert!(!err.contains('\r'), "a carriage return on a pipe");
    // "profile default: S sections, 1 warm-up round and 2 measured rounds, N steps; ..."
    let (sections, n): (usize, usize) = err
        .lines()
        .find_map(|l| l.split_once("profile default: "))
        .and_then(|(_, rest)| rest.split_once(" sections, 1 warm-up round and 2 measured rounds, "))
        .and_then(|(s, rest)| Some((s.parse().ok()?, rest.split_once(" steps;")?.0.parse().ok()?)))
        .unwrap_or_else(|| panic!("no profile line: {err}"));
    assert_eq!(sections, pgmq_bench::sections::names().count());
    // 2 rounds of the sections that run on their own (all but baseline,
    // whose runs sit in the send and consume sections'), and the warm-up's
    // few.
    let own = sections - 1;
    assert!(n > 2 * own && n < 3 * own, "{n} steps");
    let steps: Vec<(usize, usize)> = err
        .lines()
        .filter(|l| l.contains("left (an estimate)"))
        .filter_map(|l| {
            let (_, rest) = l.split_once("] [")?;
            let (k, rest) = rest.split_once('/')?;
            let (n, _) = rest.split_once(']')?;
            Some((k.parse().ok()?, n.parse().ok()?))
        })
        .collect();
    let want: Vec<(usize, usize)> = (1..=n).map(|k| (k, n)).collect();
    assert_eq!(steps, want, "{err}");
    for run in ["round 2/2 send_single: ", "round 1/2 consume_scaling w=2: "] {
        assert!(
            err.lines().any(|l| l.contains(run) && l.contains(" msg/s")),
            "no rate of {run}: {err}"
        );
    }
}

/// The run ends with the short summary, the document's path and the
/// command for the full report.
#[test]
fn the_run_ends_with_its_summary_and_the_full_report_command() {
    let out = &short_run().stdout;
    let lines: Vec<&str> = out.lines().collect();
    assert!(lines[0].starts_with("### pgmq-bench: SDK "), "{out}");
    assert!(lines[0].contains(", default profile: "), "{out}");
    assert!(lines.len() <= 25 + 3, "{out}");
    let n = lines.len();
    assert!(lines[n - 2].starts_with("Document: ") && lines[n - 2].ends_with("benchmark.json"));
    assert!(lines[n - 1].starts_with("Full report: ") && lines[n - 1].contains(" report "));
}

/// A copy of the short run's document marked ok (its 2-second sustained
/// fit may fail on noise: see `short_run`), in a file of its own.
fn ok_copy() -> (Value, common::TempPath) {
    let mut ok_doc = doc();
    ok_doc["outcome"]["ok"] = Value::from(true);
    ok_doc["outcome"]["failures"] = serde_json::json!([]);
    let path = temp_path("ok.json");
    std::fs::write(&path, serde_json::to_string(&ok_doc).unwrap()).unwrap();
    (ok_doc, path)
}

/// A copy of `doc` whose throughputs (median, min and max) are divided by
/// `by`, in a file of its own.
fn slowed_copy(doc: &Value, by: f64) -> common::TempPath {
    let mut slow = doc.clone();
    for f in slow["figures"].as_array_mut().unwrap() {
        if f["unit"] == "msg/s" && f["better"] == "higher" {
            for k in ["median", "min", "max"] {
                f[k] = Value::from(f[k].as_f64().unwrap() / by);
            }
        }
    }
    let path = temp_path("slow.json");
    std::fs::write(&path, serde_json::to_string(&slow).unwrap()).unwrap();
    path
}

/// The labels of the headline figures `doc` has.
fn headline_of(doc: &Value) -> Vec<&'static str> {
    let ids: Vec<&str> = doc["figures"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["id"].as_str().unwrap())
        .collect();
    pgmq_bench::report::summary::HEADLINE
        .iter()
        .filter(|(id, _)| ids.contains(id))
        .map(|(_, label)| *label)
        .collect()
}

#[test]
fn summary_in_markdown_and_json() {
    let (doc, path) = ok_copy();
    let path = path.to_str().unwrap();
    let out = run(&["summary", "--markdown", path]);
    assert_eq!(out.status.code(), Some(0));
    let md = String::from_utf8(out.stdout).unwrap();
    assert!(
        md.lines().count() <= 25,
        "{} lines:\n{md}",
        md.lines().count()
    );
    // The short run has 1 and 2 handlers: every headline figure but the
    // 8-handler ones.
    let labels = headline_of(&doc);
    assert_eq!(labels.len(), headline_labels().len() - 2, "{labels:?}");
    for label in headline_labels() {
        assert_eq!(
            md.contains(&format!("\n| {label} | ")),
            labels.contains(&label),
            "{label}:\n{md}"
        );
    }
    assert!(
        md.contains("PostgreSQL 15.") && md.contains(", PGMQ "),
        "{md}"
    );
    assert!(
        md.contains("\nTargets (limits set for --full on a 2-core x86_64 machine): "),
        "{md}"
    );
    // The JSON form validates against its schema, and the schema is not
    // vacuous.
    let out = run(&["summary", path]);
    assert_eq!(out.status.code(), Some(0));
    let summary: Value = serde_json::from_slice(&out.stdout).unwrap();
    let errors = summary_schema_errors(&summary);
    assert!(errors.is_empty(), "{errors:#?}");
    assert_eq!(summary["profile"], "default");
    assert_eq!(summary["headline"].as_array().unwrap().len(), labels.len());
    let validator = summary_validator();
    for (pointer, bad) in [
        ("/figures/0/unit", Value::from("furlongs")),
        ("/host/cpu_count", Value::from("two")),
        ("/profile", Value::from("medium")),
    ] {
        let mut broken = summary.clone();
        *broken.pointer_mut(pointer).unwrap() = bad;
        assert!(!validator.is_valid(&broken), "{pointer}");
    }
}

#[test]
fn compare_in_markdown_gives_one_verdict_line_per_headline_figure() {
    let (doc, ok_path) = ok_copy();
    let ok = ok_path.to_str().unwrap();
    let labels = headline_of(&doc);
    let verdicts = |text: &str| -> Vec<String> {
        text.lines()
            .filter(|l| l.starts_with("- "))
            .map(str::to_owned)
            .collect()
    };
    let out = run(&["compare", "--markdown", ok, ok]);
    assert_eq!(out.status.code(), Some(0));
    let text = String::from_utf8(out.stdout).unwrap();
    let lines = verdicts(&text);
    assert_eq!(lines.len(), labels.len(), "{text}");
    for (line, label) in lines.iter().zip(&labels) {
        assert!(line.starts_with(&format!("- {label}: ")), "{line}");
        assert!(line.ends_with(": unchanged"), "{line}");
    }
    assert!(text.contains("**Verdict: no regression**"), "{text}");
    // Every rate a hundredth: the rate lines say REGRESSION, and the exit
    // status. (A short run on a loaded machine can spread its rounds by
    // ten times, which would leave a tenth within the spread.)
    let slow_path = slowed_copy(&doc, 100.0);
    let out = run(&["compare", "--markdown", ok, slow_path.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    let text = String::from_utf8(out.stdout).unwrap();
    let lines = verdicts(&text);
    assert_eq!(lines.len(), labels.len(), "{text}");
    let single = lines
        .iter()
        .find(|l| l.starts_with("- Single send: "))
        .unwrap();
    assert!(single.ends_with("msg/s (-99.0%): REGRESSION"), "{single}");
    assert!(text.contains("**Verdict: regression**"), "{text}");
}

#[test]
fn output_validates_against_the_json_schema() {
    let schema = schema();
    let validator = jsonschema::validator_for(&schema).expect("the schema compiles");
    let doc = doc();
    let errors: Vec<String> = validator
        .iter_errors(&doc)
        .map(|e| format!("{} at {}", e, e.instance_path()))
        .collect();
    assert!(
        errors.is_empty(),
        "schema violations:\n{}",
        errors.join("\n")
    );
    // The schema is not vacuous: a broken document fails.
    let mut broken = doc.clone();
    broken["figures"][0]["runs"][0]["value"] = Value::String("fast".into());
    assert!(!validator.is_valid(&broken));
    let mut broken = doc;
    broken["schema"] = Value::String("pgmq-bench.benchmark.v0".into());
    assert!(!validator.is_valid(&broken));
}

/// Every property of the schema named `name`, with its path.
fn properties_named<'a>(
    v: &'a Value,
    name: &str,
    path: String,
    out: &mut Vec<(String, &'a Value)>,
) {
    match v {
        Value::Object(m) => {
            if let Some(Value::Object(props)) = m.get("properties") {
                if let Some(p) = props.get(name) {
                    out.push((path.clone(), p));
                }
            }
            for (k, c) in m {
                properties_named(c, name, format!("{path}.{k}"), out);
            }
        }
        Value::Array(a) => {
            for (i, c) in a.iter().enumerate() {
                properties_named(c, name, format!("{path}[{i}]"), out);
            }
        }
        _ => {}
    }
}

/// The strings of `$defs.<def>`: its `enum`, or the `const` of each of
/// its `oneOf` (an enum whose values are described one by one).
fn schema_enum(schema: &Value, def: &str) -> Vec<String> {
    let d = &schema["$defs"][def];
    let values: Vec<&Value> = match d["enum"].as_array() {
        Some(values) => values.iter().collect(),
        None => d["oneOf"]
            .as_array()
            .unwrap_or_else(|| panic!("no $defs.{def}.enum or oneOf"))
            .iter()
            .map(|v| &v["const"])
            .collect(),
    };
    values
        .iter()
        .map(|v| v.as_str().unwrap().to_owned())
        .collect()
}

/// Whether the property schema `p` refers to `$defs.<def>`, itself or
/// as the non-null case of an optional value.
fn refers_to(p: &Value, def: &str) -> bool {
    let target = format!("#/$defs/{def}");
    p["$ref"] == target.as_str()
        || p["anyOf"]
            .as_array()
            .is_some_and(|a| a.iter().any(|s| s["$ref"] == target.as_str()))
}

/// The committed schema is the one the binary generates from the
/// document's types; regenerate it with the command in the message.
#[test]
fn committed_schema_is_the_generated_one() {
    let generated = pgmq_bench::sections::schema();
    assert!(
        schema() == generated,
        "docs/benchmark.v1.schema.json differs from the schema generated from the document's \
         types; regenerate it: cargo run -p pgmq-bench -- schema > docs/benchmark.v1.schema.json"
    );
}

/// The schema's enums of command-line values are the Rust enums' values
/// (and the registered sections' names), every section has its runs'
/// schema, and every property holding one of those values refers to its
/// definition: a value the binary can write cannot fail validation.
#[test]
fn schema_enums_are_the_rust_enums() {
    use pgmq_bench::cli::{ClaimReadsArg, HandlerKind};
    let schema = schema();
    let handlers: Vec<String> = HandlerKind::value_variants()
        .iter()
        .map(|h| h.name().to_owned())
        .collect();
    assert_eq!(schema_enum(&schema, "HandlerKind"), handlers);
    let sections: Vec<String> = pgmq_bench::sections::names().map(str::to_owned).collect();
    assert_eq!(schema_enum(&schema, "SectionName"), sections);
    let runs = &schema["$defs"]["Sections"]["properties"];
    for name in &sections {
        assert!(
            runs[name]["items"]["$ref"].is_string(),
            "sections.{name}: {}",
            runs[name]
        );
    }
    let claim_reads: Vec<String> = ClaimReadsArg::value_variants()
        .iter()
        .map(|c| c.name().to_owned())
        .collect();
    assert_eq!(schema_enum(&schema, "ClaimReadsArg"), claim_reads);
    for (name, def, least) in [
        ("handler", "HandlerKind", 4),
        ("claim_reads", "ClaimReadsArg", 2),
    ] {
        let mut found = Vec::new();
        properties_named(&schema, name, "$".into(), &mut found);
        assert!(found.len() >= least, "{found:?}");
        for (path, p) in found {
            assert!(refers_to(p, def), "{path}: {p}");
        }
    }
}

/// Every object with count, elapsed_s and rate_per_s.
fn rates<'a>(v: &'a Value, path: String, out: &mut Vec<(String, &'a Value)>) {
    match v {
        Value::Object(m) => {
            if m.contains_key("count")
                && m.contains_key("elapsed_s")
                && m.contains_key("rate_per_s")
            {
                out.push((path.clone(), v));
            }
            for (k, c) in m {
                rates(c, format!("{path}.{k}"), out);
            }
        }
        Value::Array(a) => {
            for (i, c) in a.iter().enumerate() {
                rates(c, format!("{path}[{i}]"), out);
            }
        }
        _ => {}
    }
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-9 * a.abs().max(b.abs()).max(1.0)
}

#[test]
fn every_rate_is_recomputable_from_count_and_seconds() {
    let doc = doc();
    let mut found = Vec::new();
    rates(&doc, "$".into(), &mut found);
    // Sends, consume runs, baselines, idle counters, sustained totals and intervals.
    assert!(found.len() > 30, "only {} rate objects", found.len());
    for (path, r) in &found {
        let count = r["count"].as_u64().unwrap() as f64;
        let secs = r["elapsed_s"].as_f64().unwrap();
        let rate = r["rate_per_s"].as_f64().unwrap();
        assert!(secs > 0.0, "{path}: no elapsed time");
        assert!(
            close(rate, count / secs),
            "{path}: {rate} != {count} / {secs}"
        );
    }
    let mut rate_samples = 0;
    for f in doc["figures"].as_array().unwrap() {
        let id = f["id"].as_str().unwrap();
        let runs = f["runs"].as_array().unwrap();
        let values: Vec<f64> = runs.iter().map(|r| r["value"].as_f64().unwrap()).collect();
        for r in runs {
            if let (Some(c), Some(s)) = (r.get("count"), r.get("elapsed_s")) {
                rate_samples += 1;
                let v = r["value"].as_f64().unwrap();
                assert!(
                    close(v, c.as_f64().unwrap() / s.as_f64().unwrap()),
                    "{id}: {r}"
                );
            }
        }
        if f["unit"] == "msg/s" && !id.ends_with("backlog_slope") {
            assert!(
                runs.iter().all(|r| r.get("count").is_some()),
                "{id}: a rate without its count"
            );
        }
        // median/min/max summarise the runs.
        let (min, max) = values
            .iter()
            .fold((f64::MAX, f64::MIN), |(a, b), v| (a.min(*v), b.max(*v)));
        assert!(close(f["min"].as_f64().unwrap(), min), "{id} min");
        assert!(close(f["max"].as_f64().unwrap(), max), "{id} max");
        let med = f["median"].as_f64().unwrap();
        assert!(med >= min && med <= max, "{id} median outside its range");
        assert_eq!(
            runs.len(),
            2,
            "{id}: one value per measured round (--repeat 2)"
        );
    }
    assert!(
        rate_samples >= 20,
        "only {rate_samples} rate samples in figures"
    );
}

/// A ratio is the SDK run's rate over the mean of the loop runs made just
/// before and just after it, in the same round.
#[test]
fn ratios_use_the_loops_around_each_run() {
    let doc = doc();
    let s = &doc["sections"];
    let base = s["baseline"].as_array().unwrap();
    let mut checked = 0;
    for r in s["consume_scaling"].as_array().unwrap() {
        if r["warmup"] == true {
            continue;
        }
        let rate_of = |field: &str| {
            let b = base
                .iter()
                .find(|b| {
                    b["kind"] == "consume"
                        && b["warmup"] == false
                        && b["round"] == r["round"]
                        && b[field] == r["workers"]
                })
                .unwrap();
            b["rate_per_s"].as_f64().unwrap()
        };
        let reference = (rate_of("paired_workers") + rate_of("follows_workers")) / 2.0;
        let want = r["rate_per_s"].as_f64().unwrap() / reference;
        let id = format!("consume_scaling.w{}.vs_baseline", r["workers"]);
        let got = round_value(&doc, &id, &r["round"]);
        assert!((got - want).abs() < 1e-9 * want, "{id}: {got} != {want}");
        checked += 1;
    }
    assert_eq!(checked, 4);
    // A send ratio: over the mean of the round's two runs of its loop.
    for kind in ["send_single", "send_batch"] {
        for r in s[kind].as_array().unwrap() {
            if r["warmup"] == true {
                continue;
            }
            let around: Vec<f64> = base
                .iter()
                .filter(|b| b["kind"] == kind && b["warmup"] == false && b["round"] == r["round"])
                .map(|b| b["rate_per_s"].as_f64().unwrap())
                .collect();
            assert_eq!(around.len(), 2, "{kind}");
            let want = r["rate_per_s"].as_f64().unwrap() / (around[0] + around[1]) * 2.0;
            let id = format!("{kind}.vs_baseline");
            let got = round_value(&doc, &id, &r["round"]);
            assert!((got - want).abs() < 1e-9 * want, "{id}: {got} != {want}");
        }
    }
}

/// The value of figure `id` in `round`.
fn round_value(doc: &Value, id: &str, round: &Value) -> f64 {
    let fig = doc["figures"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["id"] == id)
        .unwrap();
    fig["runs"]
        .as_array()
        .unwrap()
        .iter()
        .find(|x| &x["round"] == round)
        .unwrap()["value"]
        .as_f64()
        .unwrap()
}

#[test]
fn run_is_complete_accounted_for_and_clean() {
    let doc = doc();
    assert_eq!(doc["schema"], "pgmq-bench.benchmark.v1");
    assert!(only_slope_failures(&doc), "{}", doc["outcome"]);
    let s = &doc["sections"];
    // 1 warm-up + 2 measured rounds of the throughput sections, 2 measured
    // rounds of the others (they do not warm up).
    assert_eq!(s["send_single"].as_array().unwrap().len(), 3);
    assert_eq!(s["send_batch"][0]["count"], 3000);
    assert_eq!(s["consume_scaling"].as_array().unwrap().len(), 6);
    // Per round: each send loop before and after its SDK run, and the
    // consume loop once before each of the two worker runs and once after
    // the last: every SDK run sits between two loop runs.
    // Plus the equal-layout loop before the first and after the last
    // worker run of each round.
    assert_eq!(s["baseline"].as_array().unwrap().len(), 27);
    let equal = s["baseline"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|b| b["kind"] == "consume_equal_layout");
    for b in equal {
        assert_eq!(b["ledger"]["missing"], 0);
        assert_eq!(b["ledger"]["duplicates"], 0);
        assert_eq!(b["in_queue_after"], 0);
    }
    for kind in ["send_single", "send_batch"] {
        let runs = s["baseline"].as_array().unwrap().iter();
        assert_eq!(runs.filter(|b| b["kind"] == kind).count(), 6, "{kind}");
    }
    for r in s["consume_scaling"].as_array().unwrap() {
        for field in ["paired_workers", "follows_workers"] {
            let around = s["baseline"].as_array().unwrap().iter().filter(|b| {
                b["kind"] == "consume"
                    && b["round"] == r["round"]
                    && b["warmup"] == r["warmup"]
                    && b[field] == r["workers"]
            });
            assert_eq!(around.count(), 1, "no baseline with {field} for {r}");
        }
    }
    assert_eq!(s["idle_worker"].as_array().unwrap().len(), 2);
    assert_eq!(s["wakeup_latency"].as_array().unwrap().len(), 4);
    assert_eq!(s["sustained"].as_array().unwrap().len(), 2);
    assert!(s["sustained"]
        .as_array()
        .unwrap()
        .iter()
        .all(|r| r["warmup"] == false));
    for r in s["consume_scaling"].as_array().unwrap() {
        assert_eq!(r["ledger"]["missing"], 0);
        assert_eq!(r["ledger"]["distinct"], 2000);
        assert_eq!(r["remaining_after"], 0);
        assert!(r["handler_ms"]["samples"].as_u64().unwrap() >= 2000);
        assert!(r["queue_wait_db_ms"]["samples"].as_u64().unwrap() >= 2000);
    }
    for r in s["wakeup_latency"].as_array().unwrap() {
        assert!(r["samples_ms"].as_array().unwrap().len() >= 20);
    }
    for r in s["sustained"].as_array().unwrap() {
        assert_eq!(r["ledger"]["missing"], 0);
        assert_eq!(r["ledger"]["distinct"], r["produced"]["count"]);
        // Per interval: RSS always; latency percentiles wherever messages
        // were handled (at 1,000 msg/s, in every full second).
        let iv = r["intervals"].as_array().unwrap();
        assert!(iv.iter().all(|i| i["rss_bytes"].as_u64().unwrap() > 0));
        let with = |k: &str| {
            iv.iter()
                .filter(|i| i[k]["samples"].as_u64().is_some())
                .count()
        };
        assert!(
            with("handler_ms") >= 2 && with("queue_wait_ms") >= 2,
            "{iv:?}"
        );
        for i in iv.iter().filter(|i| i["queue_wait_ms"].is_object()) {
            let q = &i["queue_wait_ms"];
            assert!(q["p50"].as_f64().unwrap() <= q["p99"].as_f64().unwrap());
        }
    }
    // backlog_scaling: both sizes in each measured round (the smallest
    // three times: the pooled reference), drained exactly.
    assert_eq!(s["backlog_scaling"].as_array().unwrap().len(), 8);
    for r in s["backlog_scaling"].as_array().unwrap() {
        assert_eq!(r["ledger"]["missing"], 0);
        assert_eq!(r["ledger"]["distinct"], r["ledger"]["expected"]);
        assert_eq!(r["remaining_after"], 0);
    }
    assert!(doc["figures"]
        .as_array()
        .unwrap()
        .iter()
        .any(|f| f["id"] == "backlog_scaling.n3000.vs_smallest"));
    // worker_processes: 1 and 2 processes per round, every message once.
    let wp = s["worker_processes"].as_array().unwrap();
    assert_eq!(wp.len(), 4);
    for r in wp {
        assert_eq!(r["ledger"]["distinct"], 2000);
        assert_eq!(r["ledger"]["duplicates"], 0);
        assert_eq!(r["remaining_after"], 0);
        let per = r["per_process"].as_array().unwrap();
        assert_eq!(per.len() as u64, r["processes"].as_u64().unwrap());
        let sum: u64 = per
            .iter()
            .map(|p| p["rate"]["count"].as_u64().unwrap())
            .sum();
        assert_eq!(sum, 2000);
    }
    // batch_handler: its three modes in every round, each effect once.
    let bh = s["batch_handler"].as_array().unwrap();
    assert_eq!(bh.len(), 9);
    for r in bh {
        assert_eq!(r["ledger"]["distinct"], 2000);
        assert_eq!(
            (r["sink_rows"].as_i64(), r["sink_distinct"].as_i64()),
            (Some(2000), Some(2000))
        );
        assert_eq!(r["remaining_after"], 0);
    }
    assert_eq!(doc["durability"]["class"], "durable");
    assert!(doc["durability"]["settings"]["fsync"].is_string());
    assert!(
        doc["metadata"]["database"]["server_version_num"]
            .as_i64()
            .unwrap()
            >= 150000
    );
    assert!(doc["memory"]["overall_peak_rss_bytes"].as_u64().unwrap() > 1 << 20);
    // Conditions measured at run time.
    let m = &doc["metadata"];
    let w = &m["workload"];
    assert_eq!(w["handler"], "empty");
    assert_eq!(w["profile"], "default");
    assert_eq!(w["backlog_sizes"], serde_json::json!([1000, 3000]));
    assert_eq!(w["backlog_workers"], 2);
    assert_eq!(w["processes"], serde_json::json!([1, 2]));
    assert_eq!(w["rate_search"]["enabled"], false);
    assert_eq!(w["claim_reads"], "bounded", "the worker's default");
    assert!(m["runtime"]["tokio_worker_threads"].as_u64().unwrap() >= 1);
    assert!(m["build"]["opt_level"].is_string() && m["build"]["rustflags"].is_string());
    assert!(m["host"]["virtualization"].is_object());
    assert_eq!(m["database"]["select1_round_trip"]["samples"], 200);
    assert!(
        m["database"]["select1_round_trip"]["p50_us"]
            .as_f64()
            .unwrap()
            > 0.0
    );
    let st = &m["database"]["storage"];
    assert!(
        st["filesystem"].is_string() || st["reason"].is_string(),
        "{st}"
    );
    // No password anywhere, no queue left behind.
    let password = common::dsn_parts(&common::test_dsn()).password;
    assert!(
        !short_run().text.contains(&password),
        "the password leaked into the document"
    );
    assert!(short_run().text.contains("pgmq:***@"));
    assert!(
        short_run().leftover_queues.is_empty(),
        "{:?}",
        short_run().leftover_queues
    );
}

#[test]
fn report_compare_and_check_read_the_document() {
    // compare and check refuse a failed run; the short run's 2-second
    // sustained fit may fail on noise (see short_run), so the comparisons
    // below read a copy marked ok, and the original only when it is.
    let (ok_doc, ok_path) = ok_copy();
    let mut failed = doc();
    failed["outcome"]["ok"] = Value::from(false);
    failed["outcome"]["failures"] = serde_json::json!(["consume_scaling: 3 duplicate deliveries"]);
    let failed_path = temp_path("failed.json");
    std::fs::write(&failed_path, serde_json::to_string(&failed).unwrap()).unwrap();
    for args in [
        vec![
            "compare",
            ok_path.to_str().unwrap(),
            failed_path.to_str().unwrap(),
        ],
        vec![
            "compare",
            failed_path.to_str().unwrap(),
            ok_path.to_str().unwrap(),
        ],
        vec!["check", failed_path.to_str().unwrap()],
    ] {
        let out = run(&args);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("outcome.ok is false"),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let short = temp_path("benchmark.json");
    std::fs::write(&short, &short_run().text).unwrap();
    let svg = temp_path("chart.svg");
    let out = run(&[
        "report",
        short.to_str().unwrap(),
        "--svg",
        svg.to_str().unwrap(),
    ]);
    assert!(out.status.success());
    let md = String::from_utf8(out.stdout).unwrap();
    for needle in [
        "## Worker scaling",
        "## Worker vs the equal-layout loop",
        "## Backlog scaling",
        "## Worker processes",
        "## Wake-up latency",
        "## Sustained",
        "## Targets",
        "durable",
    ] {
        assert!(md.contains(needle), "report lacks {needle}");
    }
    let svg = std::fs::read_to_string(svg).unwrap();
    assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));

    let path = ok_path.to_str().unwrap().to_owned();
    // A document compared with itself: nothing regresses.
    let out = run(&["compare", &path, &path]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("no regression"));

    // Halve every throughput in a copy: compare flags regressions and exits 1.
    let slow_path = slowed_copy(&ok_doc, 2.0);
    let out = run(&["compare", &path, slow_path.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stdout).contains("REGRESSION"));

    // Durable against non-durable: refused.
    let mut nd: Value = ok_doc.clone();
    nd["durability"]["class"] = Value::from("non_durable");
    nd["durability"]["comparable"] = Value::from(false);
    nd["durability"]["reasons"] = serde_json::json!(["fsync is off"]);
    let nd_path = temp_path("nondurable.json");
    std::fs::write(&nd_path, serde_json::to_string(&nd).unwrap()).unwrap();
    let out = run(&["compare", &path, nd_path.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("non-durable"));

    // check evaluates the targets it can; exit status reflects them.
    let out = run(&["check", &path]);
    assert!(matches!(out.status.code(), Some(0 | 1)));
    assert!(String::from_utf8_lossy(&out.stdout).contains("| Target |"));
}

#[test]
fn committed_results_validate_and_parse() {
    let schema = schema();
    let validator = jsonschema::validator_for(&schema).unwrap();
    let mut seen = 0;
    for entry in std::fs::read_dir(docs_dir().join("results")).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().and_then(|e| e.to_str()) != Some("json") {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        let v: Value = serde_json::from_str(&text).unwrap();
        let errors: Vec<String> = validator.iter_errors(&v).map(|e| e.to_string()).collect();
        assert!(errors.is_empty(), "{}: {errors:?}", path.display());
        pgmq_bench::document::Document::from_json(&text, "committed result").unwrap();
        seen += 1;
    }
    assert!(seen >= 1, "no committed result in docs/results");
}
