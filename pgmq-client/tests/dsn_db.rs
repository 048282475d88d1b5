//! The DSN's promises against the real database (a server without TLS:
//! the test cluster runs with `ssl = off`):
//!
//! - `sslmode=require` is kept whatever the password holds (`?` among it),
//!   and a TLS configuration given to the builder means TLS too: both are
//!   refused by a server that cannot do TLS, as psql refuses them;
//! - the redacted DSN (its Debug output too) never shows the password, and
//!   keeps host and database;
//! - a password file or DSN file that is a FIFO is refused at once.

mod common;

use std::time::Duration;

use pgmq_client::{Client, ClientBuilder, ConnInfo, Error};

/// The test server's host and port.
fn server() -> (String, String) {
    let info = ConnInfo::parse(&common::dsn()).expect("PGMQ_TEST_DSN parses");
    (
        info.get("host").unwrap_or("127.0.0.1").to_owned(),
        info.get("port").unwrap_or("5432").to_owned(),
    )
}

/// A login role with `password`, dropped with the guard.
struct Role {
    name: String,
}

/// Runs `sql` as a role that may create roles: the DSN's own when it may
/// (a cluster of one's own, or a superuser DSN), else the throwaway
/// cluster's superuser over its socket (peer authentication as the
/// `postgres` OS user, as scripts/db-common.sh sets it up: the DSN's role
/// there is no superuser and cannot create roles).
fn as_role_admin(sql: &str) {
    let sql = sql.to_owned();
    std::thread::spawn(move || {
        let by_dsn = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(async {
                let admin = common::raw_to(&common::dsn()).await;
                admin.batch_execute(&sql).await
            });
        let Err(e) = by_dsn else { return };
        assert_eq!(
            e.code(),
            Some(&tokio_postgres::error::SqlState::INSUFFICIENT_PRIVILEGE),
            "{sql}: {e}"
        );
        let (_, port) = server();
        let dir = format!("/tmp/pgmq-sdk-db-{port}/run");
        let out = std::process::Command::new("runuser")
            .args(["-u", "postgres", "--", "psql", "-h", &dir, "-p", &port])
            .args([
                "-U",
                "postgres",
                "-d",
                "postgres",
                "-qAtX",
                "-v",
                "ON_ERROR_STOP=1",
            ])
            .args(["-c", &sql])
            .output()
            .expect("runuser and psql run");
        assert!(
            out.status.success(),
            "{sql} as the cluster's superuser: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    })
    .join()
    .unwrap();
}

impl Role {
    async fn create(password: &str) -> Role {
        let name = format!("pgmq_dsn_{}", common::unique("r").as_str());
        let quoted = password.replace('\'', "''");
        as_role_admin(&format!("CREATE ROLE {name} LOGIN PASSWORD '{quoted}'"));
        Role { name }
    }
}

impl Drop for Role {
    fn drop(&mut self) {
        as_role_admin(&format!("DROP ROLE IF EXISTS {}", self.name));
    }
}

fn chain(e: &Error) -> String {
    let mut text = format!("{e}");
    let mut src = std::error::Error::source(e);
    while let Some(s) = src {
        text.push_str(&format!(": {s}"));
        src = s.source();
    }
    text
}

#[tokio::test]
async fn sslmode_require_holds_whatever_the_password() {
    let (host, port) = server();
    for password in ["pa?ss", "pass", "a/b?c#d&e=f"] {
        let role = Role::create(password).await;
        let name = &role.name;
        // The URL as a user writes it: `?` raw in the password, as libpq reads it.
        // A `/` would end the user information: it must be escaped.
        let raw = password.replace('/', "%2F");
        let url =
            |mode: &str| format!("postgres://{name}:{raw}@{host}:{port}/postgres?sslmode={mode}");
        // The password is right: without TLS required, the role logs in.
        Client::builder(&url("prefer"))
            .check_pgmq(false)
            .connect()
            .await
            .unwrap_or_else(|e| panic!("{password:?}: {}", chain(&e)));
        // The server has no TLS: require must refuse, as psql does.
        for dsn in [
            url("require"),
            format!(
                "host={host} port={port} user={name} password='{}' dbname=postgres sslmode=require",
                password.replace('\\', "\\\\").replace('\'', "\\'")
            ),
        ] {
            let err = Client::builder(&dsn)
                .check_pgmq(false)
                .connect()
                .await
                .err()
                .unwrap_or_else(|| {
                    panic!("{password:?}: connected without TLS despite sslmode=require")
                });
            assert!(matches!(err, Error::Connect(_)), "{err:?}");
            let text = chain(&err);
            assert!(text.contains("TLS") || text.contains("SSL"), "{text}");
            assert!(!format!("{text} {err:?}").contains(password), "{text}");
        }
    }
}

#[tokio::test]
async fn a_callers_tls_configuration_refuses_a_server_without_tls() {
    use pgmq_client::reexports::rustls;
    let (host, port) = server();
    let role = Role::create("s3cret-ca").await;
    let config = rustls::ClientConfig::builder_with_provider(
        rustls::crypto::ring::default_provider().into(),
    )
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(rustls::RootCertStore::empty())
    .with_no_client_auth();
    // No sslmode (prefer), and an explicit prefer: either way TLS is required.
    for q in ["", "?sslmode=prefer"] {
        let dsn = format!(
            "postgres://{}:s3cret-ca@{host}:{port}/postgres{q}",
            role.name
        );
        let err = Client::builder(&dsn)
            .check_pgmq(false)
            .tls(config.clone())
            .connect()
            .await
            .err()
            .unwrap_or_else(|| panic!("{q}: connected without TLS despite a TLS configuration"));
        assert!(matches!(err, Error::Connect(_)), "{err:?}");
    }
    // sslmode=disable contradicts it.
    let dsn = format!(
        "postgres://{}:s3cret-ca@{host}:{port}/postgres?sslmode=disable",
        role.name
    );
    let err = Client::builder(&dsn)
        .tls(config)
        .connect()
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Config(_)), "{err:?}");
}

#[test]
fn redaction_keeps_host_and_database_and_hides_the_password() {
    for (dsn, shown) in [
        (
            "postgres://app@db/app?password=s3cret&application_name=ops@acme",
            "postgres://app:***@db/app?application_name=ops%40acme",
        ),
        (
            "postgres://app@db:5432/app?password=hunter@2x",
            "postgres://app:***@db:5432/app",
        ),
        (
            "postgres://qpw:pa?ss@127.0.0.1:5432/postgres?sslmode=require",
            "postgres://qpw:***@127.0.0.1:5432/postgres?sslmode=require",
        ),
        (
            "host=db password='hunter 2' dbname=app",
            "host=db password=*** dbname=app",
        ),
        ("postgres://app:s3cret@db/app?x=%zz", "<unparsable DSN>"),
    ] {
        assert_eq!(pgmq_client::redact_dsn(dsn), shown, "{dsn}");
        let debug = format!("{:?}", ClientBuilder::new(dsn));
        for secret in ["s3cret", "hunter", "pa?ss"] {
            assert!(!debug.contains(secret), "{debug}");
        }
        assert!(debug.contains(shown), "{debug}");
    }
}

#[test]
fn a_malformed_dsn_is_a_typed_error_never_a_panic() {
    for dsn in [
        "postgres://h/db?application_name=%zé",
        "postgres://h/db?sslmod=require",
        "host=h password='open",
        "postgres://app:s3cret@h:notaport/db",
    ] {
        let err = ClientBuilder::new(dsn).pg_config().unwrap_err();
        assert!(matches!(err, Error::Dsn(_)), "{dsn}: {err:?}");
        assert!(!format!("{err} {err:?}").contains("s3cret"));
    }
}

#[cfg(unix)]
#[tokio::test]
async fn a_fifo_is_refused_without_waiting_for_a_writer() {
    let dir = std::env::temp_dir().join(format!("pgmq-dsn-fifo-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let fifo = dir.join("fifo");
    let status = std::process::Command::new("mkfifo")
        .arg("-m")
        .arg("0600")
        .arg(&fifo)
        .status()
        .unwrap();
    assert!(status.success());
    let (host, port) = server();
    let path = fifo.clone();
    let (tx, rx) = std::sync::mpsc::channel();
    // Blocking calls, in a thread: a hang shows as a time-out, not a stuck test.
    std::thread::spawn(move || {
        let dsn_file = pgmq_client::read_dsn_file(&path, "--dsn-file");
        let pgpass = ClientBuilder::new(&format!(
            "host={host} port={port} user=nobody passfile={}",
            path.display()
        ))
        .libpq_password(true)
        .pg_config()
        .map(|c| c.get_password().is_some());
        let _ = tx.send((dsn_file, pgpass));
    });
    let got = rx.recv_timeout(Duration::from_secs(10));
    std::fs::remove_dir_all(&dir).unwrap();
    let (dsn_file, pgpass) = got.expect("reading a FIFO hung");
    assert!(
        matches!(dsn_file, Err(pgmq_client::DsnFileError::Refused(_))),
        "{dsn_file:?}"
    );
    if std::env::var_os("PGPASSWORD").is_none() {
        assert!(!pgpass.unwrap(), "a password was read from a FIFO");
    }
}
