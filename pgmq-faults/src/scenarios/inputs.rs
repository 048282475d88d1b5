//! Bad input before any message moves: hostile queue names (9), and
//! connections that cannot work (10).

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use pgmq_client::{Client, ClientBuilder, Error, Listener, QueueName};
use tokio::net::{TcpListener, TcpStream};

use crate::ctx::Ctx;
use crate::ledger::Tally;
use crate::report::{Check, Row};
use crate::BoxError;

/// Names no queue may have, each with what makes it hostile.
fn hostile_name_list() -> Vec<(String, &'static str)> {
    vec![
        ("orders'".into(), "single quote"),
        ("a\tb".into(), "tab"),
        (
            "x'); drop table pgmq.meta; --".into(),
            "injection with ; and --",
        ),
        ("q;".into(), "semicolon"),
        ("q--".into(), "comment dashes"),
        ("q/*c*/;".into(), "block comment and semicolon"),
        ("a".repeat(200), "200 characters"),
        ("a".repeat(48), "48 characters (one over the limit)"),
        ("очередь".into(), "Cyrillic"),
        ("queue_\u{1F600}".into(), "emoji"),
        ("caf\u{e9}".into(), "accented letter"),
        ("\u{3a9}mega".into(), "Greek letter"),
        ("line\nbreak".into(), "newline"),
        ("q\0".into(), "NUL byte"),
        ("q$1".into(), "dollar"),
        ("q\u{7f}".into(), "DEL control character"),
        (String::new(), "empty"),
    ]
}

/// What `pgmq.meta` and the pgmq schema hold.
async fn catalog(client: &Client) -> Result<(Vec<String>, i64), BoxError> {
    let conn = client.connection().await?;
    let queues = conn
        .query(
            "select queue_name || '/' || is_partitioned || '/' || is_unlogged || '/' || created_at \
             from pgmq.meta order by queue_name",
            &[],
        )
        .await?
        .iter()
        .map(|r| r.get::<_, String>(0))
        .collect();
    let relations: i64 = conn
        .query_one(
            "select count(*) from pg_class c join pg_namespace n on n.oid = c.relnamespace \
             where n.nspname = 'pgmq'",
            &[],
        )
        .await?
        .get(0);
    Ok((queues, relations))
}

/// 9: every hostile name is refused with a typed error by every way of making
/// a queue name, before any SQL; `pgmq.meta` is unchanged.
pub(crate) async fn hostile_names(ctx: &Ctx) -> Result<Row, BoxError> {
    let started = Instant::now();
    let before = catalog(&ctx.client).await?;
    let names = hostile_name_list();
    let mut refused = 0;
    let mut bad = Vec::new();
    for (name, why) in &names {
        let typed = |r: Result<QueueName, Error>| matches!(r, Err(Error::InvalidQueueName { .. }));
        let new = typed(QueueName::new(name));
        let parsed = typed(name.parse::<QueueName>());
        let converted = typed(QueueName::try_from(name.clone()));
        let json = serde_json::to_string(name)?;
        let deserialized = serde_json::from_str::<QueueName>(&json).is_err();
        if new && parsed && converted && deserialized {
            refused += 1;
        } else {
            bad.push(format!("{why}: accepted"));
        }
        // The error message shows at most 64 characters of the name.
        if let Err(e) = QueueName::new(name) {
            if e.to_string().chars().count() > 200 {
                bad.push(format!(
                    "{why}: error message of {} characters",
                    e.to_string().len()
                ));
            }
        }
    }
    // The longest legal name works and is removed again.
    let longest = QueueName::new(&"z".repeat(pgmq_client::MAX_QUEUE_NAME_LEN))?;
    let longest_ok = ctx.client.create(&longest).await.is_ok()
        && ctx.client.drop_queue(&longest).await.unwrap_or(false);
    let after = catalog(&ctx.client).await?;
    let unchanged = before == after;
    let checks = vec![
        Check::new(
            "hostile names refused with InvalidQueueName",
            refused == names.len() && bad.is_empty(),
            format!(
                "{refused} of {} refused by QueueName::new, parse, TryFrom and serde{}",
                names.len(),
                if bad.is_empty() {
                    String::new()
                } else {
                    format!(" ({})", bad.join("; "))
                }
            ),
        ),
        Check::new(
            "47-character name created and dropped",
            longest_ok,
            "the longest legal name round-trips",
        ),
        Check::new(
            "pgmq.meta unchanged",
            unchanged,
            format!(
                "{} queues and {} relations in schema pgmq before and after",
                after.0.len(),
                after.1
            ),
        ),
    ];
    Ok(Row::new(
        "9",
        "hostile queue names",
        Tally::default(),
        None,
        checks,
        started.elapsed(),
    ))
}

/// A listener that accepts TCP connections and never says a word.
async fn silent_listener() -> Result<(SocketAddr, tokio::task::JoinHandle<()>), BoxError> {
    let l = TcpListener::bind("127.0.0.1:0").await?;
    let addr = l.local_addr()?;
    let task = tokio::spawn(async move {
        let mut held: Vec<TcpStream> = Vec::new();
        while let Ok((s, _)) = l.accept().await {
            held.push(s);
        }
    });
    Ok((addr, task))
}

/// 10: a wrong password, a closed port, a server that never answers, and a
/// database without PGMQ: each a clear, typed error within the connect
/// timeout, and the password in no error text.
pub(crate) async fn connect_failures(ctx: &Ctx) -> Result<Row, BoxError> {
    let started = Instant::now();
    let timeout = Duration::from_secs(2);
    // A password to look for in every error's Display and Debug.
    let secret = format!("pw{}secret", std::process::id());
    // A port the system just handed out, that nothing listens on any more.
    let closed_port = TcpListener::bind("127.0.0.1:0").await?.local_addr()?.port();
    let (silent, silent_task) = silent_listener().await?;
    let cases = connect_cases(ctx, &secret, closed_port, silent);
    let mut checks = Vec::new();
    for (what, dsn, expected) in &cases {
        checks.push(connect_check(what, dsn, *expected, timeout, &secret).await);
    }
    checks.push(listener_check(silent, &secret, timeout).await);
    silent_task.abort();
    Ok(Row::new(
        "10",
        "bad password / closed port / silent server / no PGMQ",
        Tally::default(),
        None,
        checks,
        started.elapsed(),
    ))
}

/// Whether a connect error is the one a case expects.
type Expect = fn(&Error) -> bool;

/// The connections of scenario 10 that cannot work: what each is, its DSN
/// (with `secret` as the password where it is wrong) and the error expected.
fn connect_cases(
    ctx: &Ctx,
    secret: &str,
    closed_port: u16,
    silent: SocketAddr,
) -> Vec<(&'static str, String, Expect)> {
    let port = ctx.cluster.port();
    vec![
        (
            "wrong password",
            format!("postgres://pgmq:{secret}@127.0.0.1:{port}/pgmq"),
            |e| matches!(e, Error::Connect(_)) && !e.is_transient(),
        ),
        (
            "closed port",
            format!("postgres://pgmq:{secret}@127.0.0.1:{closed_port}/pgmq"),
            |e| matches!(e, Error::Connect(_)),
        ),
        (
            "server that never answers",
            format!("postgres://pgmq:{secret}@{silent}/pgmq"),
            |e| matches!(e, Error::Connect(_) | Error::PoolTimeout),
        ),
        (
            // The real password: the connection succeeds and PGMQ is looked for.
            "database without PGMQ",
            ctx.cluster.dsn_for("pgmq_none"),
            |e| matches!(e, Error::PgmqMissing { .. }),
        ),
    ]
}

/// Connects to `dsn` once: the expected error, within `timeout` (and half a
/// second), without `secret` in its Display or Debug.
async fn connect_check(
    what: &str,
    dsn: &str,
    expected: Expect,
    timeout: Duration,
    secret: &str,
) -> Check {
    let t = Instant::now();
    let res = tokio::time::timeout(
        timeout + Duration::from_secs(5),
        Client::builder(dsn).connect_timeout(timeout).connect(),
    )
    .await;
    let took = t.elapsed();
    let (ok, detail) = match res {
        Err(_) => (false, format!("hung: no answer after {} s", took.as_secs())),
        Ok(Ok(_)) => (false, "connected".to_owned()),
        Ok(Err(e)) => {
            let display = e.to_string();
            let debug = format!("{e:?}");
            let leaks = display.contains(secret) || debug.contains(secret);
            let in_time = took <= timeout + Duration::from_millis(500);
            (
                expected(&e) && in_time && !leaks,
                format!(
                    "{} ms, {}{}: {display}",
                    took.as_millis(),
                    if in_time {
                        "within the timeout"
                    } else {
                        "SLOWER than the timeout"
                    },
                    if leaks { ", PASSWORD SHOWN" } else { "" }
                ),
            )
        }
    };
    Check::new(what, ok, detail)
}

/// The LISTEN connection has its own connect path: to the `silent` server it
/// must time out too, without `secret` in its error.
async fn listener_check(silent: SocketAddr, secret: &str, timeout: Duration) -> Check {
    let t = Instant::now();
    let builder = ClientBuilder::new(&format!("postgres://pgmq:{secret}@{silent}/pgmq"))
        .connect_timeout(timeout);
    let res = tokio::time::timeout(
        timeout + Duration::from_secs(5),
        Listener::connect(&builder),
    )
    .await;
    let took = t.elapsed();
    match res {
        Err(_) => Check::new(
            "listener to a server that never answers",
            false,
            format!("hung: no answer after {} s", took.as_secs()),
        ),
        Ok(Ok(_)) => Check::new(
            "listener to a server that never answers",
            false,
            "connected",
        ),
        Ok(Err(e)) => {
            let leaks = e.to_string().contains(secret) || format!("{e:?}").contains(secret);
            Check::new(
                "listener to a server that never answers",
                took <= timeout + Duration::from_millis(500) && !leaks,
                format!("{} ms: {e}", took.as_millis()),
            )
        }
    }
}
