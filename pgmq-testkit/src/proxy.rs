//! A TCP proxy between clients and the server that can cut every live
//! connection at once, refuse new ones for a while, or blackhole everything
//! (forward nothing in either direction while keeping every connection open,
//! as a silently dropping network path would), or delay every chunk (a slow
//! path: requests and replies land late): network faults on demand.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

struct Shared {
    upstream: SocketAddr,
    accepting: AtomicBool,
    /// Bumped by every cut; each connection task ends when it changes.
    cut: watch::Sender<u64>,
    /// While true nothing is forwarded either way; bytes wait, nothing closes.
    blackhole: watch::Sender<bool>,
    /// Milliseconds every chunk waits before it is written, either way.
    latency_ms: AtomicU64,
    live: AtomicUsize,
    cut_total: AtomicU64,
    refused_total: AtomicU64,
}

/// A running proxy; dropping it stops it and cuts its connections.
pub struct Proxy {
    addr: SocketAddr,
    shared: Arc<Shared>,
    accept_task: JoinHandle<()>,
}

impl Proxy {
    /// Listens on `listen` and forwards every connection to `upstream`.
    pub async fn start(listen: SocketAddr, upstream: SocketAddr) -> std::io::Result<Proxy> {
        let listener = TcpListener::bind(listen).await?;
        let addr = listener.local_addr()?;
        let (cut, _) = watch::channel(0u64);
        let (blackhole, _) = watch::channel(false);
        let shared = Arc::new(Shared {
            upstream,
            accepting: AtomicBool::new(true),
            cut,
            blackhole,
            latency_ms: AtomicU64::new(0),
            live: AtomicUsize::new(0),
            cut_total: AtomicU64::new(0),
            refused_total: AtomicU64::new(0),
        });
        let s = shared.clone();
        let accept_task = tokio::spawn(async move {
            loop {
                let Ok((client, _)) = listener.accept().await else {
                    continue;
                };
                if !s.accepting.load(Ordering::SeqCst) {
                    // Refused: reset at once, before the server is even contacted.
                    let _ = client.set_zero_linger();
                    drop(client);
                    s.refused_total.fetch_add(1, Ordering::Relaxed);
                    continue;
                }
                tokio::spawn(forward(s.clone(), client));
            }
        });
        Ok(Proxy {
            addr,
            shared,
            accept_task,
        })
    }

    /// The address clients connect to.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Resets every live connection (both sides); returns how many there were.
    pub fn cut_all(&self) -> usize {
        let n = self.shared.live.load(Ordering::SeqCst);
        self.shared.cut.send_modify(|g| *g += 1);
        self.shared.cut_total.fetch_add(n as u64, Ordering::Relaxed);
        n
    }

    /// Whether new connections are forwarded (true) or reset at once (false).
    pub fn set_accepting(&self, yes: bool) {
        self.shared.accepting.store(yes, Ordering::SeqCst);
    }

    /// Blackholes (true) or restores (false) every connection, live and new:
    /// while on, no byte is forwarded in either direction and no connection
    /// is closed or reset; what was sent meanwhile is delivered on restore.
    pub fn set_blackhole(&self, on: bool) {
        self.shared.blackhole.send_replace(on);
    }

    /// Delays every chunk read from either side by `latency` before it is
    /// written to the other, on every connection, live and new (zero: none).
    /// Chunks stay in order; a connection's throughput drops with it.
    pub fn set_latency(&self, latency: std::time::Duration) {
        self.shared
            .latency_ms
            .store(latency.as_millis() as u64, Ordering::SeqCst);
    }

    /// Live connections.
    pub fn live(&self) -> usize {
        self.shared.live.load(Ordering::SeqCst)
    }

    /// Connections cut and refused so far.
    pub fn totals(&self) -> (u64, u64) {
        (
            self.shared.cut_total.load(Ordering::Relaxed),
            self.shared.refused_total.load(Ordering::Relaxed),
        )
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.accept_task.abort();
        self.shared.cut.send_modify(|g| *g += 1);
    }
}

async fn forward(s: Arc<Shared>, mut client: TcpStream) {
    let mut cut = s.cut.subscribe();
    cut.borrow_and_update();
    let Ok(mut server) = TcpStream::connect(s.upstream).await else {
        let _ = client.set_zero_linger();
        return;
    };
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    s.live.fetch_add(1, Ordering::SeqCst);
    let (mut client_rx, mut client_tx) = client.split();
    let (mut server_rx, mut server_tx) = server.split();
    let up = pump(&mut client_rx, &mut server_tx, s.blackhole.subscribe(), &s);
    let down = pump(&mut server_rx, &mut client_tx, s.blackhole.subscribe(), &s);
    tokio::select! {
        _ = futures::future::join(up, down) => {}
        _ = cut.changed() => {
            // A cut: reset both sides, as a dropped network path or a dead
            // middlebox would.
            let _ = client.set_zero_linger();
            let _ = server.set_zero_linger();
        }
    }
    s.live.fetch_sub(1, Ordering::SeqCst);
}

/// Copies one direction until EOF or an error, holding every chunk while the
/// blackhole is on (before reading, so that the kernel buffers fill and the
/// sender stalls, and before writing what was read), and delaying every
/// chunk by the latency set when it was read.
async fn pump<R, W>(rx: &mut R, tx: &mut W, mut blackhole: watch::Receiver<bool>, s: &Shared)
where
    R: tokio::io::AsyncRead + Unpin,
    W: tokio::io::AsyncWrite + Unpin,
{
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        if blackhole.wait_for(|on| !on).await.is_err() {
            return;
        }
        let n = match rx.read(&mut buf).await {
            Ok(0) | Err(_) => {
                let _ = tx.shutdown().await;
                return;
            }
            Ok(n) => n,
        };
        let latency = s.latency_ms.load(Ordering::SeqCst);
        if latency > 0 {
            tokio::time::sleep(std::time::Duration::from_millis(latency)).await;
        }
        if blackhole.wait_for(|on| !on).await.is_err() {
            return;
        }
        if tx.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn forwards_cuts_and_refuses() {
        let echo = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let upstream = echo.local_addr().unwrap();
        tokio::spawn(async move {
            loop {
                let (mut s, _) = echo.accept().await.unwrap();
                tokio::spawn(async move {
                    let mut buf = [0u8; 64];
                    while let Ok(n) = s.read(&mut buf).await {
                        if n == 0 || s.write_all(&buf[..n]).await.is_err() {
                            break;
                        }
                    }
                });
            }
        });
        let proxy = Proxy::start("127.0.0.1:0".parse().unwrap(), upstream)
            .await
            .unwrap();
        let mut c = TcpStream::connect(proxy.addr()).await.unwrap();
        c.write_all(b"ping").await.unwrap();
        let mut buf = [0u8; 4];
        c.read_exact(&mut buf).await.unwrap();
        assert_eq!(&buf, b"ping");
        assert_eq!(proxy.cut_all(), 1);
        let mut rest = Vec::new();
        // The cut connection ends (reset or EOF), it does not hang.
        let r = tokio::time::timeout(std::time::Duration::from_secs(5), c.read_to_end(&mut rest))
            .await
            .unwrap();
        assert!(r.is_err() || rest.is_empty());

        proxy.set_accepting(false);
        let mut c = TcpStream::connect(proxy.addr()).await.unwrap();
        let _ = c.write_all(b"x").await;
        let mut one = [0u8; 1];
        let r = tokio::time::timeout(std::time::Duration::from_secs(5), c.read(&mut one))
            .await
            .unwrap();
        assert!(matches!(r, Ok(0) | Err(_)));
        proxy.set_accepting(true);
        let mut c = TcpStream::connect(proxy.addr()).await.unwrap();
        c.write_all(b"pong").await.unwrap();
        c.read_exact(&mut buf).await.unwrap();
        assert_eq!(&buf, b"pong");
        assert_eq!(proxy.totals(), (1, 1));

        // Blackholed: the connection stays open, nothing comes back; restored,
        // what was sent meanwhile arrives.
        proxy.set_blackhole(true);
        c.write_all(b"held").await.unwrap();
        let r = tokio::time::timeout(std::time::Duration::from_millis(300), c.read(&mut one)).await;
        assert!(r.is_err(), "nothing may pass a blackhole");
        proxy.set_blackhole(false);
        let mut held = [0u8; 4];
        c.read_exact(&mut held).await.unwrap();
        assert_eq!(&held, b"held");

        // Delayed: the echo comes back, no sooner than twice the latency.
        proxy.set_latency(std::time::Duration::from_millis(100));
        let t = std::time::Instant::now();
        c.write_all(b"slow").await.unwrap();
        c.read_exact(&mut held).await.unwrap();
        assert_eq!(&held, b"slow");
        assert!(t.elapsed() >= std::time::Duration::from_millis(200));
        proxy.set_latency(std::time::Duration::ZERO);
    }
}
