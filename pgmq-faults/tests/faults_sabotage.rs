//! The fault suite must be seen to go red: with the fault worker sabotaged
//! (`--sabotage skip-ledger`: one message in a thousand acknowledged without
//! being recorded), one scenario reports FAIL, the lost message is counted,
//! and the process exits 1.
//!
//! It starts its own throwaway cluster on port 55462 (the suite's cluster in
//! CI is 55433; pgmq-worker's restart test, which may run at the same time,
//! takes 55435), and runs scenario 8, which uses no proxy.

use std::path::PathBuf;
use std::process::Command;

#[test]
fn sabotaged_worker_makes_the_suite_fail() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    // Everything the run writes goes into one folder, removed below.
    let dir = std::env::temp_dir().join(format!("pgmq-faults-sabotage-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir(&dir).unwrap();
    let json = dir.join("faults.json");
    let logs = dir.join("logs");
    let out = Command::new(env!("CARGO_BIN_EXE_pgmq-faults"))
        .args(["--quick", "--scenarios", "8"])
        .args(["--sabotage", "skip-ledger"])
        .args(["--port", "55462", "--proxy-port", "55463"])
        .arg("--root")
        .arg(&root)
        .arg("--json")
        .arg(&json)
        .arg("--log-dir")
        .arg(&logs)
        .output()
        .expect("run pgmq-faults");
    let document = std::fs::read(&json);
    let logs_kept = logs.is_dir();
    let _ = std::fs::remove_dir_all(&dir);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(1),
        "a sabotaged run must exit 1 (a failed row), not 0 or 2 (harness error)\n{stdout}\n{stderr}"
    );
    assert!(
        stdout.contains("| FAIL |"),
        "the table must show FAIL:\n{stdout}"
    );
    // A failed run keeps its worker logs, and says where.
    assert!(logs_kept, "the worker logs of a failed run were removed");
    assert!(
        stderr.contains("worker logs kept in"),
        "a failed run must name its logs:\n{stderr}"
    );
    let doc: serde_json::Value =
        serde_json::from_slice(&document.expect("the JSON document")).unwrap();
    assert_eq!(doc["pass"], false);
    assert_eq!(doc["sabotage"], "SkipLedger");
    let row = &doc["rows"][0];
    assert_eq!(row["scenario"], "8");
    assert_eq!(row["pass"], false);
    // 1,000 messages, keys 0..999: key 999 is the one the sabotage drops.
    assert_eq!(row["lost"], 1, "{row}");
    assert_eq!(row["lost_sample"], serde_json::json!([999]));
}
