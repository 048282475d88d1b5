//! The safety rules: no run without an explicit database; owned queues only;
//! the guard refuses leftovers, cleans them on request, and drops its queues
//! on panic and on Ctrl-C.

mod common;

use std::time::{Duration, Instant};

use common::{bench, run, run_on, smallest_run_args, temp_path, TempDb};

#[test]
fn refuses_without_an_explicit_dsn() {
    let out = run(&["--sections", "send_single"]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--dsn") && err.contains("--local"), "{err}");
    // PGMQ_TEST_DSN is not a substitute.
    let out = bench()
        .env("PGMQ_TEST_DSN", common::test_dsn())
        .args(["--sections", "send_single"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn local_refuses_the_shared_port() {
    let out = run(&["--local", "--local-port", "55432"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("55432"));
}

#[test]
fn guard_refuses_leftovers_and_cleans_them_on_request() {
    let db = TempDb::new("guard");
    db.query("SELECT pgmq.create('pgmq_bench_leftover')");
    let output = temp_path("b.json");
    let args = smallest_run_args(output.to_str().unwrap());
    let out = run_on(&db.dsn, &args);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("pgmq_bench_leftover") && err.contains("--clean"),
        "{err}"
    );
    assert_eq!(
        db.bench_queues(),
        vec!["pgmq_bench_leftover"],
        "refusal changed nothing"
    );
    assert!(!output.exists());

    let mut with_clean = args.to_vec();
    with_clean.push("--clean");
    let out = run_on(&db.dsn, &with_clean);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(db.bench_queues().is_empty());
    assert!(output.exists());
    // Queues that are not the bench's are never touched.
    db.query("SELECT pgmq.create('someone_elses')");
    let out = run_on(&db.dsn, &args);
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(
        db.query("SELECT count(*) FROM pgmq.meta WHERE queue_name = 'someone_elses'"),
        vec!["1"]
    );
}

#[test]
fn guard_drops_its_queues_when_the_body_panics() {
    let db = TempDb::new("panic");
    let rt = tokio::runtime::Runtime::new().unwrap();
    let dsn = db.dsn.clone();
    let result = rt.block_on(async move {
        let client = pgmq_client::Client::connect(&dsn).await.unwrap();
        let (guard, cleaned) = pgmq_bench::guard::Guard::acquire(client, false, false)
            .await
            .unwrap();
        assert!(cleaned.is_empty());
        let g = guard.clone();
        guard
            .run(async move {
                g.fresh("panics").await?;
                panic!("deliberate");
                #[allow(unreachable_code)]
                Ok(())
            })
            .await
    });
    match result {
        Err(pgmq_bench::Error::Panicked(msg)) => assert!(msg.contains("deliberate")),
        other => panic!("expected a panic error, got {other:?}"),
    }
    assert!(db.bench_queues().is_empty());
}

#[test]
fn ctrl_c_drops_the_queues_and_exits_130() {
    let db = TempDb::new("sigint");
    let output = temp_path("b.json");
    let mut child = bench()
        .env("PGMQ_BENCH_DSN", &db.dsn)
        .args([
            "--output",
            output.to_str().unwrap(),
            "--sections",
            "sustained",
            "--duration",
            "60s",
            "--rate",
            "200",
            "--repeat",
            "1",
            "--warmup",
            "0",
        ])
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while db.bench_queues().is_empty() {
        assert!(
            Instant::now() < deadline,
            "the sustained queue never appeared"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    std::thread::sleep(Duration::from_millis(500));
    let killed = std::process::Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(130));
    assert!(db.bench_queues().is_empty(), "{:?}", db.bench_queues());
    assert!(!output.exists(), "no document for an interrupted run");
}
