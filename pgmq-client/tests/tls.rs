//! TLS against a real server with SSL on: a throwaway cluster of its own
//! (scripts/db-tls.sh: port PGMQ_TLS_PORT, default 55438) with a private CA.
//! The test starts that cluster when it is not running and stops it again
//! afterwards; without openssl or PostgreSQL it is skipped with a reason.

mod common;

use std::path::PathBuf;
use std::time::Duration;

use pgmq_client::reexports::rustls;
use pgmq_client::{Client, ClientBuilder, Error, Listener, Message};
use serde_json::json;

use common::Queues;

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

/// Starts (or reuses) the TLS cluster; None (with the reason printed) when
/// it cannot be had here.
async fn tls_cluster() -> Option<(Cluster, PathBuf)> {
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
    match out {
        Ok(o) if o.status.success() => {}
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
    }
    let ca = PathBuf::from(format!("/tmp/pgmq-sdk-db-{port}/tls/ca.crt"));
    Some((cluster, ca))
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

#[tokio::test]
async fn tls_modes_against_a_server_with_ssl() {
    let Some((cluster, ca)) = tls_cluster().await else {
        return;
    };
    let base = |host: &str, mode: &str| {
        let q = if mode.is_empty() {
            String::new()
        } else {
            format!("?sslmode={mode}")
        };
        format!("postgres://pgmq:pgmq@{host}:{}/pgmq{q}", cluster.port)
    };

    // require + a configuration that trusts the private CA: encrypted, works.
    let dsn = base("localhost", "require");
    let client = Client::builder(&dsn)
        .tls(trusting(&ca))
        .connect()
        .await
        .unwrap();
    assert!(encrypted(&client).await);
    let qs = Queues::on(&base("127.0.0.1", "disable"));
    let q = qs.fresh(&client, "tls").await;
    let id = client.send(&q, &json!({"over": "tls"})).await.unwrap();
    let got: Vec<Message> = common::ok(client.read(&q, Duration::from_secs(30), 1).await.unwrap());
    assert_eq!(common::ids(&got), [id]);

    // verify-full with the CA: host name and chain checked (localhost and
    // 127.0.0.1 are both in the certificate).
    for host in ["localhost", "127.0.0.1"] {
        let c = Client::builder(&base(host, "verify-full"))
            .tls(trusting(&ca))
            .connect()
            .await
            .unwrap_or_else(|e| panic!("{host}: {e}"));
        assert!(encrypted(&c).await);
    }

    // Without the CA, verify-full and verify-ca refuse the unknown issuer.
    for mode in ["verify-full", "verify-ca"] {
        let err = Client::connect(&base("localhost", mode)).await.unwrap_err();
        assert!(matches!(err, Error::Connect(_)), "{mode}: {err:?}");
        let text = format!("{err} {:?}", std::error::Error::source(&err));
        assert!(
            text.to_lowercase().contains("certificate") || text.contains("UnknownIssuer"),
            "{mode}: {text}"
        );
    }

    // require and prefer (the default) encrypt without checking, as libpq
    // does: a DSN that works with psql works here.
    for mode in ["require", "prefer", ""] {
        let c = Client::connect(&base("localhost", mode))
            .await
            .unwrap_or_else(|e| panic!("sslmode={mode}: {e}"));
        assert!(encrypted(&c).await, "sslmode={mode}");
    }
    // disable: plain.
    let plain = Client::connect(&base("127.0.0.1", "disable"))
        .await
        .unwrap();
    assert!(!encrypted(&plain).await);

    // A LISTEN connection over TLS receives notifications.
    client
        .enable_notify_insert(&q, Duration::ZERO)
        .await
        .unwrap();
    let mut l = Listener::connect(
        &ClientBuilder::new(&base("localhost", "verify-full")).tls(trusting(&ca)),
    )
    .await
    .unwrap();
    l.listen(&q).await.unwrap();
    client.send(&q, &1).await.unwrap();
    let n = tokio::time::timeout(Duration::from_secs(3), l.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(n.channel, q.insert_channel());
    drop(qs);
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
}
