//! `connect_timeout` bounds the whole connection setup: a server that accepts
//! TCP connections and never answers must fail the connect in time, for the
//! pool and for the dedicated LISTEN connection alike.

use std::time::{Duration, Instant};

use pgmq_client::{Client, ClientBuilder, Error, Listener};
use tokio::net::{TcpListener, TcpStream};

/// Accepts connections and holds them open without sending a byte.
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
