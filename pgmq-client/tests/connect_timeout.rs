//! `connect_timeout` bounds the whole connection setup: a server that accepts
//! TCP connections and never answers must fail the connect in time, for the
//! pool and for the dedicated LISTEN connection alike. It applies per host,
//! as in libpq: with such a server first in the host list, the second host
//! (the test database) is tried once the first attempt timed out.

mod common;

use std::time::{Duration, Instant};

use pgmq_client::{Client, ClientBuilder, ConnInfo, Error, Listener};
use tokio::net::{TcpListener, TcpStream};

/// Accepts connections and holds them open without sending a byte: from
/// the client's side, a host that drops packets after the TCP handshake,
/// whose attempt only a time-out ends.
async fn silent_server() -> std::net::SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let mut held: Vec<TcpStream> = Vec::new();
        while let Ok((s, _)) = listener.accept().await {
            held.push(s);
        }
    });
    addr
}

#[tokio::test]
async fn pool_connect_to_a_silent_server_times_out() {
    let addr = silent_server().await;
    let dsn = format!("postgres://app:s3cr3t-pw@{addr}/app");
    let t = Instant::now();
    let res = tokio::time::timeout(
        Duration::from_secs(10),
        Client::builder(&dsn)
            .connect_timeout(Duration::from_millis(500))
            .connect(),
    )
    .await
    .expect("connect must not hang past its timeout");
    let took = t.elapsed();
    let err = res.expect_err("nothing answered");
    assert!(matches!(err, Error::Connect(_)), "{err:?}");
    assert!(err.is_transient());
    assert!(took < Duration::from_secs(2), "took {took:?}");
    assert!(!err.to_string().contains("s3cr3t-pw"));
    assert!(!format!("{err:?}").contains("s3cr3t-pw"));
}

#[tokio::test]
async fn listener_connect_to_a_silent_server_times_out() {
    let addr = silent_server().await;
    let builder = ClientBuilder::new(&format!("postgres://app:s3cr3t-pw@{addr}/app"))
        .connect_timeout(Duration::from_millis(500));
    let t = Instant::now();
    let res = tokio::time::timeout(Duration::from_secs(10), Listener::connect(&builder))
        .await
        .expect("listener connect must not hang past its timeout");
    let took = t.elapsed();
    let Err(err) = res else {
        panic!("nothing answered, yet the listener connected")
    };
    assert!(matches!(err, Error::Connect(_)), "{err:?}");
    assert!(took < Duration::from_secs(2), "took {took:?}");
}

#[tokio::test]
async fn connect_timeout_applies_per_host() {
    let info = ConnInfo::parse(&common::dsn()).unwrap();
    let host = info.get("host").unwrap_or("127.0.0.1").to_owned();
    let port = info.get("port").unwrap_or("5432").to_owned();
    let silent = silent_server().await;
    let user = info.get("user").unwrap().to_owned();
    let password = info.get("password").unwrap_or("").to_owned();
    let db = info.get("dbname").unwrap_or("postgres").to_owned();
    let kv = |timeout: &str| {
        format!(
            "host={},{host} port={},{port} user={user} password='{}' dbname={db}{timeout}",
            silent.ip(),
            silent.port(),
            password.replace('\\', "\\\\").replace('\'', "\\'")
        )
    };
    // The builder's bound, per host: the second host is reached.
    let t = Instant::now();
    let client = tokio::time::timeout(
        Duration::from_secs(20),
        Client::builder(&kv(""))
            .connect_timeout(Duration::from_millis(700))
            .connect(),
    )
    .await
    .expect("connect must not hang")
    .unwrap_or_else(|e| panic!("the second host was not tried: {}", e));
    drop(client);
    assert!(t.elapsed() < Duration::from_secs(15), "{:?}", t.elapsed());
    // The DSN's own connect_timeout (2 s) is used, not the builder's 10 minutes.
    let builder =
        ClientBuilder::new(&kv(" connect_timeout=2")).connect_timeout(Duration::from_secs(600));
    assert_eq!(
        builder.pg_config().unwrap().get_connect_timeout(),
        Some(&Duration::from_secs(2))
    );
    let client = tokio::time::timeout(Duration::from_secs(30), builder.clone().connect())
        .await
        .expect("the DSN's connect_timeout must end the first host's attempt")
        .unwrap_or_else(|e| panic!("{}", e));
    drop(client);
    // The dedicated LISTEN connection, likewise.
    let listener = tokio::time::timeout(Duration::from_secs(30), Listener::connect(&builder))
        .await
        .expect("listener connect must not hang");
    assert!(listener.is_ok(), "listener: {:?}", listener.err());
}
