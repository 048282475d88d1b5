//! Every setting of pgmq-worker's `WorkerBuilder` has its field in the
//! harnesses' worker spec (`WorkerSettings`, named after the builder's
//! method, with `_ms` for a duration), so that a new setting cannot be
//! added to the builder and forgotten in the spec the benchmark's and the
//! fault suite's child processes are built from.

use std::path::Path;

/// Builder methods that are not settings a spec carries, and why.
const NOT_SETTINGS: &[(&str, &str)] = &[
    ("hook", "code, not data: a harness installs its own"),
    ("panic_once_in", "fault-injection switch"),
    ("resume_handler_panics", "fault-injection switch"),
    ("fence_off", "fault-injection switch"),
    ("fifo_blocking_wait_off", "fault-injection switch"),
    ("claim_cursor_fence", "fault-injection switch"),
    ("claim_handoff_unplaced", "fault-injection switch"),
    ("trust_stale_pause_flag", "fault-injection switch"),
    ("claims_ahead_past_vt", "fault-injection switch"),
    ("build", "not a setting"),
];

/// The names of `WorkerBuilder`'s `pub fn x(mut self, ..)` methods (the
/// handler attachments take `self` with a handler type and are left out).
fn builder_settings() -> Vec<String> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../pgmq-worker/src/builder.rs");
    let text = std::fs::read_to_string(&path).unwrap();
    text.lines()
        .filter_map(|l| l.trim().strip_prefix("pub fn "))
        .filter(|rest| rest.contains("(mut self"))
        .map(|rest| rest[..rest.find('(').unwrap()].to_owned())
        .filter(|name| name.chars().all(|c| c.is_ascii_lowercase() || c == '_'))
        .collect()
}

#[test]
fn every_builder_setting_is_in_the_spec() {
    let spec = include_str!("../src/spec.rs");
    let settings = builder_settings();
    assert!(
        settings.len() >= 30,
        "read too few builder settings: {settings:?}"
    );
    let missing: Vec<&String> = settings
        .iter()
        .filter(|name| NOT_SETTINGS.iter().all(|(n, _)| n != name))
        .filter(|name| {
            let field = [format!("{name}:"), format!("{name}_ms:")];
            let declared = field.iter().any(|f| spec.contains(&format!("pub {f}")));
            // Its line in `apply` reads `s.<field>`.
            let applied = field
                .iter()
                .any(|f| spec.contains(&format!("s.{}", f.trim_end_matches(':'))));
            !(declared && applied)
        })
        .collect();
    assert!(
        missing.is_empty(),
        "WorkerBuilder settings without a field in pgmq-testkit/src/spec.rs's WorkerSettings \
         (add the field and its line in WorkerSettings::apply): {missing:?}"
    );
}
