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
