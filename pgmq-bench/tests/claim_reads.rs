//! `--claim-reads function`: backlog_scaling and worker_processes (whose
//! child processes get the option too) drain every message on PGMQ's
//! `pgmq.read` path, and the document records the path and validates.

mod common;

use common::{run_document, schema_errors, TempDb};

#[test]
fn the_function_read_path_drains_backlogs_and_processes() {
    let db = TempDb::new("claim");
    let doc = run_document(
        &db.dsn,
        "claim_reads.json",
        &[
            "--sections",
            "backlog_scaling,worker_processes",
            "--backlog-sizes",
            "300,600",
            "--backlog-workers",
            "2",
            "--messages",
            "400",
            "--processes",
            "2",
            "--processes-messages",
            "400",
            "--repeat",
            "1",
            "--warmup",
            "0",
            "--claim-reads",
            "function",
        ],
    );
    assert_eq!(doc["metadata"]["workload"]["claim_reads"], "function");
    let s = &doc["sections"];
    let backlog = s["backlog_scaling"].as_array().unwrap();
    // The smallest size three times (the pooled reference), then the other.
    assert_eq!(backlog.len(), 4);
    let processes = s["worker_processes"].as_array().unwrap();
    assert_eq!(processes.len(), 1);
    for r in backlog.iter().chain(processes) {
        assert_eq!(r["ledger"]["missing"], 0, "{r}");
        assert_eq!(r["ledger"]["duplicates"], 0, "{r}");
        assert_eq!(r["remaining_after"], 0, "{r}");
    }
    let errors = schema_errors(&doc);
    assert!(errors.is_empty(), "schema violations: {errors:?}");
}
