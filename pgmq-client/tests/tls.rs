//! TLS against a real server with SSL on: a throwaway cluster of its own
//! (scripts/db-tls.sh: port PGMQ_TLS_PORT, default 55438) with a private CA.
//! The test starts that cluster when it is not running and stops it again
//! afterwards; without openssl or PostgreSQL it is skipped with a reason.
//! Each `sslmode` of libpq's table is tried: the right CA connects, another
//! CA or a host name outside the certificate is refused in the verifying
//! modes, `require` without a root certificate accepts the self-signed
//! server, `disable` is refused by its `hostssl`-only pg_hba.conf.

mod common;

use std::path::PathBuf;
use std::time::Duration;

use pgmq_client::reexports::rustls;
use pgmq_client::{Client, ClientBuilder, ConnInfo, Error, Listener, Message};
use serde_json::json;

fn port() -> u16 {
    std::env::var("PGMQ_TLS_PORT")
        .ok()
        .and_then(|p| p.parse().ok())
        .unwrap_or(55438)
}

fn scripts() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../scripts")
}

/// Stops the TLS cluster on drop when this test started it.
struct Cluster {
    port: u16,
    started_here: bool,
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if self.started_here {
            let _ = std::process::Command::new("bash")
                .arg(scripts().join("db-stop.sh"))
                .env("PGMQ_DB_PORT", self.port.to_string())
                .output();
        }
    }
}

/// The TLS cluster: its port, the user and password of the DSN db-tls.sh
/// printed, and the folder of its certificates.
struct Tls {
    port: u16,
    user: String,
    password: String,
    dir: PathBuf,
}

impl Tls {
    /// A URL DSN for `host` with these query parameters.
    fn dsn(&self, host: &str, params: &str) -> String {
        let q = if params.is_empty() {
            String::new()
        } else {
            format!("?{params}")
        };
        let mut info =
            ConnInfo::parse(&format!("postgres://{host}:{}/pgmq{q}", self.port)).unwrap();
        info.set("user", &self.user).unwrap();
        info.set("password", &self.password).unwrap();
        info.to_dsn()
    }

    fn ca(&self) -> PathBuf {
        self.dir.join("ca.crt")
    }

    /// A CA that did not sign the server's certificate.
    fn other_ca(&self) -> PathBuf {
        self.dir.join("other-ca.crt")
    }
}

/// Starts (or reuses) the TLS cluster; None (with the reason printed) when
/// it cannot be had here.
async fn tls_cluster() -> Option<(Cluster, Tls)> {
    let port = port();
    let running = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .is_ok();
    let out = tokio::process::Command::new("bash")
        .arg(scripts().join("db-tls.sh"))
        .env("PGMQ_TLS_PORT", port.to_string())
        .output()
        .await;
    let cluster = Cluster {
        port,
        started_here: !running,
    };
    let printed = match out {
        Ok(o) if o.status.success() => String::from_utf8(o.stdout).unwrap(),
        Ok(o) => {
            eprintln!(
                "SKIPPED tls: scripts/db-tls.sh failed: {}",
                String::from_utf8_lossy(&o.stderr).trim()
            );
            return None;
        }
        Err(e) => {
            eprintln!("SKIPPED tls: could not run scripts/db-tls.sh: {e}");
            return None;
        }
    };
    // postgres://user:password@localhost:port/pgmq?sslmode=require
    let dsn = printed.trim();
    let login = ConnInfo::parse(dsn).expect("db-tls.sh prints a DSN");
    let (Some(user), Some(password)) = (login.get("user"), login.get("password")) else {
        panic!("db-tls.sh prints a DSN with user and password");
    };
    let (user, password) = (user.to_owned(), password.to_owned());
    let dir = PathBuf::from(format!("/tmp/pgmq-sdk-db-{port}/tls"));
    Some((
        cluster,
        Tls {
            port,
            user,
            password,
            dir,
        },
    ))
}

/// A rustls configuration that trusts only the test CA.
fn trusting(ca: &PathBuf) -> rustls::ClientConfig {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::CertificateDer;
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(ca).unwrap() {
        roots.add(cert.unwrap()).unwrap();
    }
    rustls::ClientConfig::builder_with_provider(rustls::crypto::ring::default_provider().into())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth()
}

/// Whether the client's connections are encrypted (`pg_stat_ssl`).
async fn encrypted(client: &Client) -> bool {
    let conn = client.connection().await.unwrap();
    conn.client()
        .query_one(
            "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()",
            &[],
        )
        .await
        .unwrap()
        .get(0)
}

/// Connects with `dsn`, panicking with the error when refused.
async fn connects(dsn: &str, what: &str) -> Client {
    let c = Client::connect(dsn)
        .await
        .unwrap_or_else(|e| panic!("{what}: refused: {e} ({:?})", std::error::Error::source(&e)));
    assert!(encrypted(&c).await, "{what}: not encrypted");
    c
}

/// The text of an error and its sources.
fn chain(err: &Error) -> String {
    let mut text = err.to_string();
    let mut source = std::error::Error::source(err);
    while let Some(s) = source {
        text.push_str(" / ");
        text.push_str(&s.to_string());
        text.push_str(&format!(" {s:?}"));
        source = s.source();
    }
    text
}

/// Connecting with `dsn` fails on the server's certificate.
async fn refused_certificate(dsn: &str, what: &str, expect: &str) {
    let err = match Client::connect(dsn).await {
        Ok(_) => panic!("{what}: connected"),
        Err(e) => e,
    };
    assert!(matches!(err, Error::Connect(_)), "{what}: {err:?}");
    let text = chain(&err);
    assert!(text.contains(expect), "{what}: expected {expect}: {text}");
}

#[tokio::test]
async fn tls_modes_against_a_server_with_ssl() {
    let Some((cluster, tls)) = tls_cluster().await else {
        return;
    };
    let ca = tls.ca().display().to_string();
    let other = tls.other_ca().display().to_string();
    let no_default_root = std::env::var_os("HOME")
        .map(|h| !PathBuf::from(h).join(".postgresql/root.crt").exists())
        .unwrap_or(true);

    // verify-full with the right CA (sslrootcert): chain and host name
    // checked; localhost and 127.0.0.1 are both in the certificate.
    for host in ["localhost", "127.0.0.1"] {
        connects(
            &tls.dsn(host, &format!("sslmode=verify-full&sslrootcert={ca}")),
            &format!("verify-full {host}"),
        )
        .await;
    }
    // The key=value form too.
    let kv = format!(
        "host=localhost port={} dbname=pgmq user={} password={} sslmode=verify-full sslrootcert='{ca}'",
        tls.port,
        tls.user,
        tls.password,
    );
    connects(&kv, "verify-full key=value").await;

    // A name the certificate does not hold (the address is right):
    // verify-full refuses, verify-ca (chain only) accepts.
    let wrong_name = |mode: &str, root: &str| {
        tls.dsn(
            "db.wrong.invalid",
            &format!("hostaddr=127.0.0.1&sslmode={mode}&sslrootcert={root}"),
        )
    };
    refused_certificate(
        &wrong_name("verify-full", &ca),
        "verify-full, wrong host name",
        "NotValidForName",
    )
    .await;
    connects(&wrong_name("verify-ca", &ca), "verify-ca, wrong host name").await;
    connects(
        &tls.dsn("localhost", &format!("sslmode=verify-ca&sslrootcert={ca}")),
        "verify-ca",
    )
    .await;

    // A CA that did not sign the server's certificate: every mode given that
    // root refuses (require with a root certificate checks the chain, as
    // libpq does).
    for mode in ["verify-full", "verify-ca", "require", "prefer"] {
        refused_certificate(
            &tls.dsn("localhost", &format!("sslmode={mode}&sslrootcert={other}")),
            &format!("{mode} with another CA"),
            "certificate",
        )
        .await;
    }

    // Verifying modes without any root certificate are refused before
    // connecting: no fallback to public roots.
    if no_default_root {
        for mode in ["verify-full", "verify-ca"] {
            let err = Client::connect(&tls.dsn("localhost", &format!("sslmode={mode}")))
                .await
                .unwrap_err();
            assert!(matches!(err, Error::Config(_)), "{mode}: {err:?}");
            assert!(err.to_string().contains("root certificate"), "{err}");
        }
    }
    // sslrootcert=system: the system's store does not hold the private CA.
    match Client::connect(&tls.dsn("localhost", "sslrootcert=system")).await {
        Ok(_) => panic!("sslrootcert=system accepted a private CA"),
        Err(Error::Config(text)) => assert!(text.contains("system"), "{text}"),
        Err(e) => assert!(chain(&e).contains("UnknownIssuer"), "{}", chain(&e)),
    }
    let err = Client::connect(&tls.dsn("localhost", "sslrootcert=system&sslmode=verify-ca"))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Config(_)), "{err:?}");

    // require, prefer (the default) and allow without a root certificate
    // encrypt without checking, as libpq does: the self-signed server is
    // accepted.
    if no_default_root {
        for mode in ["require", "prefer", "allow", ""] {
            let params = if mode.is_empty() {
                String::new()
            } else {
                format!("sslmode={mode}")
            };
            connects(&tls.dsn("localhost", &params), &format!("sslmode={mode}")).await;
        }
    }

    // disable against a server that takes TCP only over TLS (hostssl):
    // refused by the server.
    let err = Client::connect(&tls.dsn("127.0.0.1", "sslmode=disable"))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Connect(_)), "{err:?}");
    assert!(chain(&err).contains("pg_hba.conf"), "{}", chain(&err));

    // channel_binding=require: SCRAM-SHA-256-PLUS over TLS works.
    connects(
        &tls.dsn(
            "localhost",
            &format!("sslmode=verify-full&sslrootcert={ca}&channel_binding=require"),
        ),
        "channel_binding=require",
    )
    .await;
    if no_default_root {
        connects(
            &tls.dsn("localhost", "sslmode=require&channel_binding=require"),
            "require + channel_binding=require",
        )
        .await;
    }

    // A configuration given with ClientBuilder::tls decides the checks.
    let client = Client::builder(&tls.dsn("localhost", "sslmode=require"))
        .tls(trusting(&tls.ca()))
        .connect()
        .await
        .unwrap();
    assert!(encrypted(&client).await);
    let q = common::unique("tls");
    client.create(&q).await.unwrap();
    let id = client.send(&q, &json!({"over": "tls"})).await.unwrap();
    let got: Vec<Message> = common::ok(client.read(&q, Duration::from_secs(30), 1).await.unwrap());
    assert_eq!(common::ids(&got), [id]);

    // A LISTEN connection over TLS receives notifications.
    client
        .enable_notify_insert(&q, Duration::ZERO)
        .await
        .unwrap();
    let mut l = Listener::connect(&ClientBuilder::new(&tls.dsn(
        "localhost",
        &format!("sslmode=verify-full&sslrootcert={ca}"),
    )))
    .await
    .unwrap();
    l.listen(&q).await.unwrap();
    client.send(&q, &1).await.unwrap();
    let n = tokio::time::timeout(Duration::from_secs(3), l.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(n.channel, q.insert_channel());
    client.drop_queue(&q).await.unwrap();
    drop(cluster);
}

/// The main test cluster has SSL off: `sslmode=require` is refused cleanly.
#[tokio::test]
async fn require_against_a_server_without_ssl_is_a_connect_error() {
    let pg = common::raw().await;
    let ssl: String = common::scalar(&pg, "SHOW ssl", &[]).await;
    if ssl == "on" {
        eprintln!("SKIPPED: the test database has ssl on");
        return;
    }
    let dsn = common::dsn();
    let dsn = if dsn.contains('?') {
        format!("{dsn}&sslmode=require")
    } else {
        format!("{dsn}?sslmode=require")
    };
    let err = Client::connect(&dsn).await.unwrap_err();
    assert!(matches!(err, Error::Connect(_)), "{err:?}");
    // prefer (the default) falls back to plain there.
    let c = Client::connect(&common::dsn()).await.unwrap();
    assert!(!encrypted(&c).await);
    // channel_binding=require refuses a password sent without channel
    // binding (plain connection, no SCRAM-SHA-256-PLUS).
    let dsn = common::dsn();
    let sep = if dsn.contains('?') { '&' } else { '?' };
    let err = Client::connect(&format!("{dsn}{sep}channel_binding=require"))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Connect(_)), "{err:?}");
    assert!(chain(&err).contains("channel binding"), "{}", chain(&err));
}
