//! compare's verdict logic: a regression needs both a change beyond the
//! threshold in the wrong direction and non-overlapping ranges.

use pgmq_bench::document::{Better, Figure, Sample};
use pgmq_bench::report::compare::{judge, Verdict};

fn fig(better: Better, values: &[f64]) -> Figure {
    Figure::from_runs(
        "f",
        "consume_scaling",
        "f",
        "msg/s",
        better,
        "a figure",
        values
            .iter()
            .enumerate()
            .map(|(i, v)| Sample::value(i as u32, *v))
            .collect(),
    )
    .unwrap()
}

#[test]
fn throughput_drop_beyond_threshold_with_separate_ranges_regresses() {
    let old = fig(Better::Higher, &[1000.0, 1010.0, 990.0]);
    let new = fig(Better::Higher, &[850.0, 860.0, 840.0]);
    let (change, v) = judge(&old, &new, 10.0);
    assert_eq!(v, Verdict::Regression);
    assert!((change.unwrap() + 15.0).abs() < 0.01);
    // The same move upwards is an improvement.
    assert_eq!(judge(&new, &old, 10.0).1, Verdict::Improvement);
}

#[test]
fn overlapping_ranges_are_noise_not_regression() {
    let old = fig(Better::Higher, &[1000.0, 1010.0, 700.0]);
    let new = fig(Better::Higher, &[850.0, 860.0, 840.0]);
    assert_eq!(judge(&old, &new, 10.0).1, Verdict::Noise);
}

#[test]
fn small_changes_are_unchanged_whatever_the_ranges() {
    let old = fig(Better::Higher, &[1000.0, 1001.0, 999.0]);
    let new = fig(Better::Higher, &[950.0, 951.0, 949.0]);
    assert_eq!(judge(&old, &new, 10.0).1, Verdict::Unchanged);
    // A tighter threshold turns the same data into a regression.
    assert_eq!(judge(&old, &new, 2.0).1, Verdict::Regression);
}

#[test]
fn lower_is_better_for_latency_and_none_is_informational() {
    let old = fig(Better::Lower, &[2.0, 2.1, 1.9]);
    let new = fig(Better::Lower, &[3.0, 3.1, 2.9]);
    assert_eq!(judge(&old, &new, 10.0).1, Verdict::Regression);
    assert_eq!(judge(&new, &old, 10.0).1, Verdict::Improvement);
    let old = fig(Better::None, &[2.0]);
    let new = fig(Better::None, &[30.0]);
    assert_eq!(judge(&old, &new, 10.0).1, Verdict::Informational);
    let zero = fig(Better::Higher, &[0.0]);
    assert_eq!(judge(&zero, &new, 10.0), (None, Verdict::Informational));
}

/// A whole document (a recorded full run, `tests/data/`) whose 8-handler
/// throughput figure holds `values`, one per invocation.
fn document_with(values: &[f64]) -> pgmq_bench::document::Document {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/dev-machine-fbd4125.json");
    let mut v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let f = fig(Better::Higher, values);
    let figs = v["figures"].as_array_mut().unwrap();
    figs.retain(|x| x["id"] == "consume_scaling.w8.throughput");
    let x = &mut figs[0];
    x["median"] = f.median.into();
    x["min"] = f.min.into();
    x["max"] = f.max.into();
    x["runs"] = serde_json::to_value(&f.runs).unwrap();
    pgmq_bench::document::Document::from_json(&v.to_string(), "built").unwrap()
}

#[test]
fn a_15_percent_drop_with_overlapping_ranges_is_a_regression_at_5_invocations() {
    use pgmq_bench::report::compare::{compare, judge_with_test};
    // Old: 5 invocations around 1000 (±4%); new: 15% lower, with one
    // invocation as fast as the old ones' low end. The min–max ranges
    // overlap, so the range rule of 3-round documents calls it noise.
    let old = document_with(&[1000.0, 960.0, 1040.0, 980.0, 1020.0]);
    let new = document_with(&[850.0, 820.0, 880.0, 830.0, 990.0]);
    let (o, n) = (&old.figures[0], &new.figures[0]);
    assert!(n.max >= o.min, "the ranges overlap");
    let three = |f: &Figure| {
        fig(
            Better::Higher,
            &[f.runs[0].value, f.runs[1].value, f.runs[4].value],
        )
    };
    assert_eq!(judge(&three(o), &three(n), 10.0).1, Verdict::Noise);
    // Mann-Whitney U on the five per-invocation values: U = 2, exact
    // two-sided p = 8/252 = 0.032 < 0.05: a regression.
    let j = judge_with_test(o, n, 10.0);
    assert_eq!(j.verdict, Verdict::Regression);
    assert!((j.p_value.unwrap() - 8.0 / 252.0).abs() < 1e-9, "{j:?}");
    let (text, regressed) = compare(&old, &new, 10.0).unwrap();
    assert!(regressed, "{text}");
    assert!(
        text.contains("REGRESSION") && text.contains("0.032"),
        "{text}"
    );
    // No shift, same spread: not a regression.
    let same = document_with(&[990.0, 1030.0, 970.0, 1010.0, 1000.0]);
    let (text, regressed) = compare(&old, &same, 10.0).unwrap();
    assert!(!regressed, "{text}");
    // A 15% drop with an invocation back at the old level twice: the test
    // cannot tell (p >= 0.05), reported within spread.
    let mixed = document_with(&[850.0, 1000.0, 880.0, 830.0, 1040.0]);
    let j = judge_with_test(o, &mixed.figures[0], 10.0);
    assert_eq!(j.verdict, Verdict::Noise, "{j:?}");
}

#[test]
fn compare_refuses_a_failed_run_and_lists_every_condition() {
    use pgmq_bench::report::compare::{compare, differences};
    let old = document_with(&[1000.0; 5]);
    let mut v = serde_json::to_value(document_with(&[1000.0; 5])).unwrap();
    v["metadata"]["workload"]["payload_bytes"] = 500.into();
    v["metadata"]["host"]["cpu_count"] = 64.into();
    let changed = pgmq_bench::document::Document::from_json(&v.to_string(), "x").unwrap();
    let d = differences(&old, &changed);
    let keys: Vec<&str> = d.iter().map(|(k, _, _)| k.as_str()).collect();
    assert!(
        keys.contains(&"metadata.workload.payload_bytes"),
        "{keys:?}"
    );
    assert!(keys.contains(&"metadata.host.cpu_count"), "{keys:?}");
    v["outcome"]["ok"] = false.into();
    v["outcome"]["failures"] = serde_json::json!(["consume_scaling: 2 duplicate deliveries"]);
    let failed = pgmq_bench::document::Document::from_json(&v.to_string(), "x").unwrap();
    let err = compare(&old, &failed, 10.0).unwrap_err().to_string();
    assert!(
        err.contains("outcome.ok is false") && err.contains("duplicate"),
        "{err}"
    );
}

/// `document_with` run with `--handler handler` (recorded as the workload
/// and the command line record it), writing `output`.
fn run_with_handler(handler: &str, output: &str) -> pgmq_bench::document::Document {
    let mut v = serde_json::to_value(document_with(&[1000.0; 3])).unwrap();
    v["metadata"]["workload"]["handler"] = handler.into();
    v["metadata"]["command"] = serde_json::json!([
        "target/release/pgmq-bench",
        "--dsn",
        "postgres://bench@db/bench",
        "--output",
        output,
        "--sections",
        "consume_scaling",
        "--handler",
        handler
    ]);
    pgmq_bench::document::Document::from_json(&v.to_string(), "built").unwrap()
}

#[test]
fn compare_shows_a_different_handler_and_no_difference_of_output_path() {
    use pgmq_bench::report::compare::{compare, differences};
    let empty = run_with_handler("empty", "a.json");
    let db_write = run_with_handler("db-write", "b.json");
    let d = differences(&empty, &db_write);
    assert!(
        d.contains(&(
            "metadata.workload.handler".into(),
            "empty".into(),
            "db-write".into()
        )),
        "{d:?}"
    );
    let command = d
        .iter()
        .find(|(k, _, _)| k == "metadata.command")
        .expect("the command lines differ");
    assert_eq!(command.1, "--sections consume_scaling --handler empty");
    assert_eq!(command.2, "--sections consume_scaling --handler db-write");
    assert_eq!(d.len(), 2, "{d:?}");
    let (text, _) = compare(&empty, &db_write, 10.0).unwrap();
    assert!(
        text.contains("| metadata.workload.handler | empty | db-write |"),
        "{text}"
    );
    // One option changed, seen twice: not "more than one condition".
    assert!(!text.contains("More than one condition"), "{text}");
    // Where the document went is not a condition.
    assert!(differences(&empty, &run_with_handler("empty", "elsewhere.json")).is_empty());
}

#[test]
fn aggregate_keeps_every_invocation_and_holds_their_medians() {
    let docs: Vec<_> = [1000.0, 960.0, 1040.0, 980.0, 1020.0]
        .iter()
        .map(|v| document_with(&[*v, *v + 1.0, *v - 1.0]))
        .collect();
    let agg = pgmq_bench::commands::aggregate_documents(&docs).unwrap();
    assert_eq!(agg.invocations.len(), 5);
    assert_eq!(agg.protocol.invocations, Some(5));
    let f = agg.figure("consume_scaling.w8.throughput").unwrap();
    let vals: Vec<f64> = f.runs.iter().map(|s| s.value).collect();
    assert_eq!(vals, vec![1000.0, 960.0, 1040.0, 980.0, 1020.0]);
    assert_eq!(f.median, 1000.0);
    // The aggregate validates against the schema and reads back.
    let schema: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../docs/benchmark.v1.schema.json"),
        )
        .unwrap(),
    )
    .unwrap();
    let v = serde_json::to_value(&agg).unwrap();
    let validator = jsonschema::validator_for(&schema).unwrap();
    let errors: Vec<String> = validator.iter_errors(&v).map(|e| e.to_string()).collect();
    assert!(errors.is_empty(), "{errors:?}");
    pgmq_bench::document::Document::from_json(&v.to_string(), "aggregate").unwrap();
    // An aggregate is not aggregated again.
    assert!(pgmq_bench::commands::aggregate_documents(&[agg.clone(), agg]).is_err());
}
