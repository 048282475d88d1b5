//! `--handler db-write-tx`: consume_scaling's handlers insert their row in
//! the worker's transaction that deletes the message; every id is handled
//! once, the queue ends empty, the sink table is dropped at the end, and
//! the document validates against the schema.

mod common;

use common::{run_document, schema_errors, TempDb};

#[test]
fn the_transactional_db_write_handler_drains_every_message() {
    let db = TempDb::new("htx");
    let doc = run_document(
        &db.dsn,
        "handler_tx.json",
        &[
            "--sections",
            "consume_scaling",
            "--messages",
            "500",
            "--workers",
            "2",
            "--repeat",
            "1",
            "--warmup",
            "0",
            "--handler",
            "db-write-tx",
        ],
    );
    let runs = doc["sections"]["consume_scaling"].as_array().unwrap();
    assert_eq!(runs.len(), 1);
    let r = &runs[0];
    assert_eq!(r["handler"], "db-write-tx");
    assert_eq!(r["ledger"]["missing"], 0, "{r}");
    assert_eq!(r["ledger"]["duplicates"], 0, "{r}");
    assert_eq!(r["remaining_after"], 0, "{r}");
    let errors = schema_errors(&doc);
    assert!(errors.is_empty(), "schema violations: {errors:?}");
    assert!(db
        .query("SELECT to_regclass('pgmq_bench_handler_sink')::text")
        .iter()
        .all(|t| t.is_empty()));
}
