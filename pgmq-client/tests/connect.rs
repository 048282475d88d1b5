//! Connecting and failing to: unreachable server, wrong password, PGMQ
//! missing, SQL-only or too old; pool timeouts; lost connections and what
//! their errors say about the call's outcome.

mod common;

use std::time::{Duration, Instant};

use pgmq_client::ReadOptions;
use pgmq_client::{
    Client, ClientBuilder, CommitOutcome, Error, InstallMode, Message, Pgmq, Version,
};
use serde_json::{json, Value};

use common::Queues;

const VT: Duration = Duration::from_secs(30);

/// A 127.0.0.1 port nothing listens on.
fn dead_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

#[tokio::test]
async fn unreachable_server_is_a_fast_connect_error() {
    let dsn = format!("postgres://pgmq:pgmq@127.0.0.1:{}/pgmq", dead_port());
    let start = Instant::now();
    let err = Client::builder(&dsn)
        .connect_timeout(Duration::from_secs(3))
        .connect()
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Connect(_)), "{err:?}");
    assert!(
        start.elapsed() < Duration::from_secs(2),
        "{:?}",
        start.elapsed()
    );
    assert!(err.is_transient(), "the server may come back");
    assert_eq!(err.outcome(), CommitOutcome::NotSent);
}

#[tokio::test]
async fn wrong_password_is_a_connect_error_without_the_password() {
    let secret = "Wr0ng-S3cret-pw";
    let dsn = format!("postgres://pgmq:{secret}@127.0.0.1:55432/pgmq");
    let dsn = match std::env::var("PGMQ_TEST_DSN") {
        // Same server as the other tests, wrong password.
        Ok(d) => {
            let b = ClientBuilder::new(&d).pg_config().unwrap();
            let host = match &b.get_hosts()[0] {
                tokio_postgres::config::Host::Tcp(h) => h.clone(),
                #[allow(unreachable_patterns)]
                _ => "127.0.0.1".to_owned(),
            };
            format!(
                "postgres://{}:{secret}@{host}:{}/{}",
                b.get_user().unwrap_or("pgmq"),
                b.get_ports().first().copied().unwrap_or(5432),
                b.get_dbname().unwrap_or("pgmq")
            )
        }
        Err(_) => dsn,
    };
    let builder = Client::builder(&dsn);
    assert!(!format!("{builder:?}").contains(secret));
    let err = builder.connect().await.unwrap_err();
    assert!(matches!(err, Error::Connect(_)), "{err:?}");
    assert_eq!(err.sqlstate().map(|c| c.code()), Some("28P01"));
    assert!(!err.is_transient(), "a wrong password stays wrong");
    for text in [
        err.to_string(),
        format!("{err:?}"),
        format!("{err:#?}"),
        std::error::Error::source(&err)
            .map(|s| s.to_string())
            .unwrap_or_default(),
    ] {
        assert!(!text.contains(secret), "password leaked: {text}");
    }
    // Same through a Listener.
    let err = pgmq_client::Listener::connect(&ClientBuilder::new(&dsn))
        .await
        .unwrap_err();
    assert!(!format!("{err} {err:?}").contains(secret));
    // A DSN that does not parse is a Dsn error that does not echo it.
    let err = Client::connect(&format!("postgres://pgmq:{secret}@127.0.0.1:notaport/pgmq"))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Dsn(_)), "{err:?}");
    assert!(!format!("{err} {err:?}").contains(secret));
}

#[tokio::test]
async fn unknown_database_is_not_transient() {
    let err = Client::connect(&common::dsn_for("no_such_db_here"))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Connect(_)), "{err:?}");
    assert!(!err.is_transient());
}

#[tokio::test]
async fn pgmq_missing_names_the_fix() {
    let err = Client::connect(&common::dsn_for("pgmq_none"))
        .await
        .unwrap_err();
    match &err {
        Error::PgmqMissing { database } => assert_eq!(database, "pgmq_none"),
        other => panic!("expected PgmqMissing, got {other:?}"),
    }
    assert!(err.to_string().contains("CREATE EXTENSION pgmq"), "{err}");
    // Skipping the check connects; calls then fail with a database error.
    let client = Client::builder(&common::dsn_for("pgmq_none"))
        .check_pgmq(false)
        .connect()
        .await
        .unwrap();
    assert!(client.install().is_none());
    let q = pgmq_client::QueueName::new("anything").unwrap();
    let err = client.send(&q, &1).await.unwrap_err();
    assert!(matches!(err, Error::Database { .. }), "{err:?}");
}

#[tokio::test]
async fn sql_only_install_is_detected_and_works() {
    let dsn = common::dsn_for("pgmq_sqlonly");
    let client = Client::connect(&dsn).await.unwrap();
    let install = client.install().unwrap();
    assert_eq!(install.mode, InstallMode::SqlOnly);
    assert_eq!(install.version, Version::new(1, 13, 0));

    let qs = Queues::on(&dsn);
    let q = qs.fresh(&client, "sqlonly").await;
    let ids = client
        .send_batch(&q, &[json!({"a": 1}), json!({"a": 2})])
        .await
        .unwrap();
    let got: Vec<Message> = common::ok(client.read(&q, VT, 10).await.unwrap());
    assert_eq!(got.len(), 2);
    assert!(client.delete(&q, ids[0]).await.unwrap());
    assert!(client.archive(&q, ids[1]).await.unwrap());
    assert_eq!(client.metrics(&q).await.unwrap().total_messages, 2);
    client
        .enable_notify_insert(&q, Duration::ZERO)
        .await
        .unwrap();
    let k = format!("k{}", q.as_str());
    client.bind_topic(&format!("{k}.*"), &q).await.unwrap();
    assert_eq!(
        client
            .send_topic(&format!("{k}.x"), &json!(1))
            .await
            .unwrap(),
        1
    );
    let g: Vec<Message> = common::ok(
        client
            .read_grouped(
                &q,
                pgmq_client::GroupStrategy::RoundRobin,
                &ReadOptions::new(VT).qty(10),
            )
            .await
            .unwrap(),
    );
    assert_eq!(g.len(), 1);
    // A transaction works the same.
    let mut conn = client.connection().await.unwrap();
    let tx = conn.transaction().await.unwrap();
    Pgmq::on(&tx).send(&q, &1).await.unwrap();
    tx.rollback().await.unwrap();
    assert_eq!(client.metrics(&q).await.unwrap().queue_length, 1);
    drop(conn);
    assert!(client.drop_queue(&q).await.unwrap());
}

/// Drops a scratch database when it goes out of scope.
struct ScratchDb(String);

impl Drop for ScratchDb {
    fn drop(&mut self) {
        let name = self.0.clone();
        let _ = std::thread::spawn(move || {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap()
                .block_on(async {
                    let pg = common::raw_to(&common::dsn_for("postgres")).await;
                    let _ = pg
                        .batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
                        .await;
                })
        })
        .join();
    }
}

#[tokio::test]
async fn pgmq_too_old_is_refused() {
    let name = format!(
        "pgmq_scratch_old_{}_{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .subsec_nanos()
    );
    let admin = common::raw_to(&common::dsn_for("postgres")).await;
    admin
        .batch_execute(&format!("CREATE DATABASE {name}"))
        .await
        .unwrap();
    let _guard = ScratchDb(name.clone());
    let dsn = common::dsn_for(&name);
    {
        let pg = common::raw_to(&dsn).await;
        // A SQL-only install without any of the markers of 1.11 and later
        // (the test's role is no superuser: it cannot fake an extension's
        // version in pg_extension).
        pg.batch_execute("CREATE SCHEMA pgmq; CREATE TABLE pgmq.meta (queue_name text)")
            .await
            .unwrap();
    }
    let err = Client::connect(&dsn).await.unwrap_err();
    match &err {
        Error::PgmqTooOld { found, minimum } => {
            assert_eq!(found, "1.0.0");
            assert_eq!(minimum, &pgmq_client::MIN_SUPPORTED.to_string());
        }
        other => panic!("expected PgmqTooOld, got {other:?}"),
    }
    assert!(
        err.to_string().contains("ALTER EXTENSION pgmq UPDATE"),
        "{err}"
    );
    assert!(!err.is_transient());
}

#[tokio::test]
async fn pool_timeout_when_every_connection_is_busy() {
    let client = Client::builder(&common::dsn())
        .max_size(1)
        .pool_timeout(Duration::from_millis(300))
        .connect()
        .await
        .unwrap();
    let held = client.connection().await.unwrap();
    let q = pgmq_client::QueueName::new("whatever").unwrap();
    let start = Instant::now();
    let err = client.send(&q, &1).await.unwrap_err();
    assert!(matches!(err, Error::PoolTimeout), "{err:?}");
    assert!(start.elapsed() < Duration::from_secs(2));
    assert_eq!(err.outcome(), CommitOutcome::NotSent);
    assert!(err.is_transient());
    drop(held);
    assert!(client.queue_exists(&q).await.is_ok());
}

/// The backend pid of a connection.
async fn pid(c: &tokio_postgres::Client) -> i32 {
    c.query_one("SELECT pg_backend_pid()", &[])
        .await
        .unwrap()
        .get(0)
}

async fn terminate(pid: i32) {
    let pg = common::raw().await;
    let ok: bool = common::scalar(&pg, "SELECT pg_terminate_backend($1)", &[&pid]).await;
    assert!(ok);
}

async fn wait_closed(c: &tokio_postgres::Client) {
    let start = Instant::now();
    while !c.is_closed() {
        assert!(start.elapsed() < Duration::from_secs(5), "still open");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn a_terminated_connection_fails_the_call_and_the_pool_recovers() {
    let client = Client::builder(&common::dsn())
        .max_size(2)
        .connect()
        .await
        .unwrap();
    let qs = Queues::new();
    let q = qs.fresh(&client, "lost").await;

    // Known closed before the call: certainly not sent.
    let conn = client.connection().await.unwrap();
    terminate(pid(conn.client()).await).await;
    wait_closed(conn.client()).await;
    let err = Pgmq::on(&conn)
        .send(&q, &json!({"x": 1}))
        .await
        .unwrap_err();
    match &err {
        Error::ConnectionLost { outcome, .. } => assert_eq!(*outcome, CommitOutcome::NotSent),
        other => panic!("expected ConnectionLost, got {other:?}"),
    }
    assert!(err.is_transient());
    drop(conn);
    // The pool discards it and the next call works.
    let id = client.send(&q, &json!({"x": 2})).await.unwrap();
    assert!(client.delete(&q, id).await.unwrap());
    assert_eq!(
        client.metrics(&q).await.unwrap().queue_length,
        0,
        "x1 never arrived"
    );

    // Terminated just before the call, without waiting: still ConnectionLost.
    let conn = client.connection().await.unwrap();
    terminate(pid(conn.client()).await).await;
    let err = Pgmq::on(&conn)
        .send(&q, &json!({"x": 3}))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::ConnectionLost { .. }), "{err:?}");
    drop(conn);
    client.send(&q, &json!({"x": 4})).await.unwrap();
}

#[tokio::test]
async fn pool_passes_over_connections_closed_while_idle() {
    let app = format!("pgmq-test-idle-{}", std::process::id());
    let client = Client::builder(&common::dsn())
        .max_size(2)
        .application_name(&app)
        .connect()
        .await
        .unwrap();
    let qs = Queues::new();
    let q = qs.fresh(&client, "idle").await;
    // Two idle connections in the pool.
    {
        let a = client.connection().await.unwrap();
        let b = client.connection().await.unwrap();
        drop((a, b));
    }
    assert_eq!(client.pool().state().idle_connections, 2);
    let pg = common::raw().await;
    let killed: i64 = common::scalar(
        &pg,
        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = $1",
        &[&app],
    )
    .await;
    assert_eq!(killed, 2);
    tokio::time::sleep(Duration::from_millis(200)).await;
    // Every idle connection is dead; the call still succeeds on a new one.
    let id = client.send(&q, &1).await.unwrap();
    assert!(client.delete(&q, id).await.unwrap());
}

#[tokio::test]
async fn connection_lost_mid_call_has_an_unknown_outcome() {
    let client = common::client().await;
    let qs = Queues::new();
    let q = qs.fresh(&client, "midcall").await;
    let conn = client.connection_owned().await.unwrap();
    let backend = pid(conn.client()).await;
    let q2 = q.clone();
    let call = tokio::spawn(async move {
        // Polls on the server for up to 10 s: in flight when it is cut.
        Pgmq::on(&conn)
            .read_with::<Value>(
                &q2,
                &ReadOptions::new(VT)
                    .qty(1)
                    .poll(Duration::from_secs(10), Duration::from_millis(50)),
            )
            .await
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let start = Instant::now();
    terminate(backend).await;
    let err = call.await.unwrap().unwrap_err();
    assert!(start.elapsed() < Duration::from_secs(3));
    match &err {
        Error::ConnectionLost { outcome, .. } => assert_eq!(*outcome, CommitOutcome::Unknown),
        other => panic!("expected ConnectionLost, got {other:?}"),
    }
    assert_eq!(err.outcome(), CommitOutcome::Unknown);
    assert!(err.is_transient());
    client.send(&q, &1).await.unwrap();
}
