//! The fault campaign must be seen to go red: with a bug planted in the
//! fault worker (`--sabotage`), a short campaign without faults fails the
//! invariant that bug breaks, exits 1 and prints the command that replays
//! the seed.
//!
//! Each test starts its own throwaway cluster and proxy on ports of the
//! fault suite's own (55440-55451, and 55464-55465), so that they can run side
//! by side. Without a sabotage the same campaign passes.

use std::path::PathBuf;
use std::process::Command;

/// Runs `pgmq-faults --campaign` with `sabotage` on `port` (its proxy
/// on `port + 1`), three processes (plain, transactional, FIFO), and
/// returns the exit code, stderr and the JSON document.
fn campaign(sabotage: &str, port: u16) -> (Option<i32>, String, serde_json::Value) {
    campaign_of(sabotage, port, 3)
}

/// The same with `processes` worker processes (6: the core workload's
/// kinds).
fn campaign_of(
    sabotage: &str,
    port: u16,
    processes: usize,
) -> (Option<i32>, String, serde_json::Value) {
    campaign_with(sabotage, port, processes, "none", 11)
}

/// The same with the fault kinds `kinds` and the seed `seed`.
fn campaign_with(
    sabotage: &str,
    port: u16,
    processes: usize,
    kinds: &str,
    seed: u64,
) -> (Option<i32>, String, serde_json::Value) {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    // Everything the run writes goes into one folder, removed below.
    let dir = std::env::temp_dir().join(format!("pgmq-campaign-{port}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir(&dir).unwrap();
    let json = dir.join("campaign.json");
    let out = Command::new(env!("CARGO_BIN_EXE_pgmq-faults"))
        .args([
            "--campaign",
            "--seed",
            &seed.to_string(),
            "--duration",
            "25s",
        ])
        .args([
            "--processes",
            &processes.to_string(),
            "--fault-kinds",
            kinds,
        ])
        .args(["--sabotage", sabotage])
        .args(["--port", &port.to_string()])
        .args(["--proxy-port", &(port + 1).to_string()])
        .arg("--root")
        .arg(&root)
        .arg("--json")
        .arg(&json)
        .arg("--log-dir")
        .arg(dir.join("logs"))
        .output()
        .expect("run pgmq-faults --campaign");
    let document = std::fs::read(&json);
    let _ = std::fs::remove_dir_all(&dir);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let doc = match document {
        Ok(d) => serde_json::from_slice(&d).unwrap(),
        Err(e) => panic!(
            "no JSON document ({e}):\n{}\n{stderr}",
            String::from_utf8_lossy(&out.stdout)
        ),
    };
    (out.status.code(), stderr, doc)
}

/// The verdict of the check named `name` of the first row.
fn verdict(doc: &serde_json::Value, name: &str) -> bool {
    pass_of(doc, &doc["rows"][0]["checks"], "name", name)
}

/// The verdict of the cell row named `scenario` (`kill cell`, `extension
/// re-created`).
fn cell_verdict(doc: &serde_json::Value, scenario: &str) -> bool {
    pass_of(doc, &doc["rows"], "scenario", scenario)
}

/// The verdict of the check `name` of the cell row `scenario`.
fn cell_check(doc: &serde_json::Value, scenario: &str, name: &str) -> bool {
    let row = doc["rows"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["scenario"] == scenario)
        .unwrap_or_else(|| panic!("no row {scenario:?} in {doc}"));
    pass_of(doc, &row["checks"], "name", name)
}

/// The `pass` of the entry of `list` (in `doc`) whose `field` is `value`.
fn pass_of(doc: &serde_json::Value, list: &serde_json::Value, field: &str, value: &str) -> bool {
    list.as_array()
        .unwrap()
        .iter()
        .find(|x| x[field] == value)
        .unwrap_or_else(|| panic!("no {field} {value:?} in {doc}"))["pass"]
        .as_bool()
        .unwrap()
}

/// The common part: exit 1, a failed seed, its replay line.
fn assert_failed(code: Option<i32>, stderr: &str, doc: &serde_json::Value) {
    assert_failed_seed(code, stderr, doc, 11);
}

fn assert_failed_seed(code: Option<i32>, stderr: &str, doc: &serde_json::Value, seed: u64) {
    assert_eq!(
        code,
        Some(1),
        "a sabotaged campaign must exit 1 (a failed seed), not 0 or 2\n{stderr}"
    );
    assert_eq!(doc["pass"], false);
    assert!(
        stderr.contains(&format!(
            "replay with: pgmq-faults --campaign --seed {seed} --duration 25s"
        )),
        "a failed seed must print its replay command:\n{stderr}"
    );
}

#[test]
fn heartbeat_off_fails_duplicates_only_under_faults() {
    let (code, stderr, doc) = campaign("heartbeat-off", 55440);
    assert_failed(code, &stderr, &doc);
    // Handlers longer than the visibility timeout, no heartbeat: delivered
    // twice with no fault to explain it.
    assert!(!verdict(&doc, "duplicates only under faults"), "{doc}");
}

/// The campaign without a sabotage passes: the workload the sabotages are
/// caught by (claims that expire under their handler, handlers longer than
/// the visibility timeout, FIFO blocking runs that hang past their
/// timeout) is one a correct worker gets through: the core workload's six
/// processes.
#[test]
fn without_a_sabotage_the_campaign_passes() {
    let (code, stderr, doc) = campaign_of("none", 55442, 6);
    assert_eq!(
        code,
        Some(0),
        "the campaign without a sabotage must pass\n{stderr}\n{doc}"
    );
    assert_eq!(doc["pass"], true, "{doc}");
    assert!(verdict(&doc, "only the current delivery commits"), "{doc}");
    assert!(cell_verdict(&doc, "extension re-created"), "{doc}");
    assert!(cell_verdict(&doc, "periodic sends"), "{doc}");
    assert!(cell_verdict(&doc, "retention cell"), "{doc}");
    assert!(cell_verdict(&doc, "move cell"), "{doc}");
    assert!(cell_verdict(&doc, "key limits"), "{doc}");
    assert!(cell_verdict(&doc, "ranged drain"), "{doc}");
    assert!(cell_verdict(&doc, "short-handler priorities"), "{doc}");
}

/// Three bugs planted in pgmq-worker itself (feature `fault-injection`):
/// a handler's panic escapes its loop; the claim cursor is taken for a
/// fence (the ranged-drain cell's workers never read from the start once
/// they took a range); the fleet-limited workers' reads that carry
/// acknowledgements claim without places. Eight processes, so that the
/// two fleet-limited ones run.
#[cfg(feature = "fault-injection")]
#[test]
fn an_uncaught_panic_a_fenced_cursor_and_unplaced_claims_fail_their_invariants() {
    let (code, stderr, doc) = campaign_of("panic-uncaught,cursor-fence,handoff-unplaced", 55444, 8);
    assert_failed(code, &stderr, &doc);
    // A panic that ends its handler loop leaves its message held.
    assert!(!verdict(&doc, "no stall"), "{doc}");
    // Claims that took no place run beside those that did.
    assert!(
        !verdict(&doc, "never more runs than the fleet limit"),
        "{doc}"
    );
    // The retries below the cursor are never claimed: the drain falls
    // short (it ran, and handled the rest).
    assert!(
        !cell_check(
            &doc,
            "ranged drain",
            "a retry below the claim cursor is claimed"
        ),
        "{doc}"
    );
    let row = doc["rows"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["scenario"] == "ranged drain")
        .unwrap();
    let detail = row["checks"][0]["detail"].as_str().unwrap();
    assert!(detail.contains("handled within"), "{detail}");
}

/// Three bugs planted in pgmq-worker itself (feature `fault-injection`):
/// the acknowledgements are not fenced on their delivery; the claim loops
/// trust the last state of the pause flag read however old it is; a
/// prioritized group's claims ahead are not bounded by its visibility
/// timeout (the short-handler priority cell). The seed's faults are locks
/// of the pause flag's table (`pause-flag-locked`), under which every read
/// of the flag hangs.
#[cfg(feature = "fault-injection")]
#[test]
fn unfenced_acks_a_trusted_stale_flag_and_claims_past_vt_fail_their_invariants() {
    let (code, stderr, doc) = campaign_with(
        "fence-off,pause-stale-trusted,prio-ahead-past-vt",
        55446,
        3,
        "pause-flag-locked",
        11,
    );
    assert_failed(code, &stderr, &doc);
    // The workers claimed on through each lock.
    assert!(
        !verdict(&doc, "no claim while the reads of the pause flag hang"),
        "{doc}"
    );
    assert!(
        doc["campaign"][0]["faults_by_kind"]["pause-flag-locked"]
            .as_u64()
            .is_some_and(|n| n > 0),
        "{doc}"
    );
    // Claims waited locally until the worker gave them back unrun.
    assert!(
        !cell_check(
            &doc,
            "short-handler priorities",
            "every claim of a short-handler group runs"
        ),
        "{doc}"
    );
    // Claims that expire under their running handler (every 40th
    // transactional message): without the fence, the stale first
    // delivery's transaction commits after the second delivery started.
    assert!(!verdict(&doc, "only the current delivery commits"), "{doc}");
    // Its delete ends the message: still one row per key, none lost.
    assert!(verdict(&doc, "transactional rows exactly once"), "{doc}");
    assert!(verdict(&doc, "nothing lost"), "{doc}");
}

/// The bug of pgmq-worker's FIFO blocking loops before d4a46e7 (feature
/// `fault-injection`): a run abandoned at `handler_timeout` is acknowledged
/// without waiting for its thread, so its retry and its group's next
/// message run while it goes on (the FIFO blocking process, the sixth, on
/// which some messages hang past the timeout). The same six processes
/// without it pass ([`without_a_sabotage_the_campaign_passes`]).
#[cfg(feature = "fault-injection")]
#[test]
fn fifo_blocking_runs_not_waited_for_fail_the_fifo_invariants_and_waited_for_pass() {
    let (code, stderr, doc) = campaign_of("fifo-blocking-overlap", 55448, 6);
    assert_failed(code, &stderr, &doc);
    // The abandoned run records its handling when its hang ends, after
    // the retry and the group's next messages recorded theirs.
    assert!(!verdict(&doc, "FIFO runs never overlap"), "{doc}");
    assert!(!verdict(&doc, "FIFO successes in sequence"), "{doc}");
    assert!(verdict(&doc, "nothing lost"), "{doc}");
    assert!(verdict(&doc, "transactional rows exactly once"), "{doc}");
}

/// Unordered FIFO claims fail the FIFO invariants; and the fleet features'
/// invariants, each failed by its own planted bug: all in one run of the
/// nine processes (the fleet-limited pair and the prioritized group among
/// them) under the fleet's fault kinds, which the seed draws each at least
/// once (`campaign::tests`). Keyed retries and repeats under fresh keys
/// store a key twice; fleet-limited workers under a limit four times theirs
/// run more at once, and with a long visibility timeout hold a killed one's
/// places past the bound (the kill cell); a pause or a revocation that never took effect
/// leaves the workers claiming; a strict group starves its low queue
/// behind the high one's backlog; a re-created queue given its old keys
/// answers "duplicate" with dropped ids; PGMQ re-created with the
/// `pgmq_sdk` schema gone leaves the fleet limit nothing to call;
/// schedulers that send a tick outside the statement that moves the
/// schedule past it send ticks twice (the periodic-sends cell).
#[test]
fn fifo_and_fleet_sabotages_fail_their_invariants() {
    let sabotages = "fifo-unordered,keyed-fresh-keys,fleet-over,fleet-long-vt,pause-ignored,\
                     prio-strict,stale-keys,sdk-not-reinstalled,revoke-skipped,schedule-unfenced,key-limit-ignored";
    let seed = FLEET_SEED;
    let (code, stderr, doc) = campaign_with(
        sabotages,
        55450,
        9,
        "pause,drop-queue,revoke-grants,kill",
        seed,
    );
    assert_failed_seed(code, &stderr, &doc, seed);
    assert!(
        !verdict(&doc, "FIFO successes in sequence") || !verdict(&doc, "FIFO runs never overlap"),
        "{doc}"
    );
    for name in [
        "keyed sends store each key once",
        "a key sent after its queue's re-creation stores a new message",
        "never more runs than the fleet limit",
        "no claim after a pause took effect",
        "no claim while the pause flag cannot be read",
        "no queue of the weighted group starved",
    ] {
        assert!(!verdict(&doc, name), "{name} must fail:\n{doc}");
    }
    // `fleet-long-vt`: the kill cell's process held every place.
    assert!(!cell_verdict(&doc, "kill cell"), "{doc}");
    assert!(!cell_verdict(&doc, "extension re-created"), "{doc}");
    // `key-limit-ignored`: the key cell's workers claim without the limit.
    assert!(
        !cell_check(&doc, "key limits", "per-key limits never exceeded"),
        "{doc}"
    );
    // `schedule-unfenced`: ticks sent twice.
    assert!(!cell_verdict(&doc, "periodic sends"), "{doc}");
}

/// The retention and move cells, each failed by its own planted bug: an
/// age read in the wrong unit prunes messages younger than the age; a move
/// whose send and delete are two transactions, cut between them, doubles
/// the batch tried again. The same cells pass in
/// [`without_a_sabotage_the_campaign_passes`].
#[test]
fn retention_and_move_sabotages_fail_their_cells() {
    let (code, stderr, doc) = campaign_with("retention-young,move-split", 55464, 3, "none", 11);
    assert_eq!(code, Some(1), "a failed cell fails the campaign\n{stderr}");
    assert_eq!(doc["pass"], false);
    assert!(
        !cell_check(
            &doc,
            "retention cell",
            "retention never deletes a message younger than its age"
        ),
        "{doc}"
    );
    assert!(!cell_verdict(&doc, "move cell"), "{doc}");
    // Failed for doubling, not for losing or not finishing.
    let moved = &doc["rows"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["scenario"] == "move cell")
        .unwrap()["checks"][0]["detail"];
    let detail = moved.as_str().unwrap();
    assert!(
        detail.contains(" 0 lost")
            && !detail.contains(" 0 doubled")
            && detail.contains("finished: true"),
        "{detail}"
    );
    // The seed itself is untouched by these two.
    assert_eq!(doc["rows"][0]["pass"], true, "{doc}");
}

/// The seed of [`fifo_and_fleet_sabotages_fail_their_invariants`] (see
/// there).
const FLEET_SEED: u64 = 43359;
