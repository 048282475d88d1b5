//! Notifications: PGMQ's insert trigger (`enable_notify_insert` and friends),
//! and a dedicated LISTEN connection to receive them.
//!
//! Pooled connections are unsuitable for LISTEN: a notification arrives on the
//! connection that listens, and a pooled connection is handed to other callers
//! between uses. [`Listener`] owns one connection of its own.

use std::time::Duration;

use chrono::{DateTime, Utc};
use futures::StreamExt;
use tokio::sync::mpsc;
use tokio_postgres::AsyncMessage;
use tokio_postgres_rustls::MakeRustlsConnect;

use crate::conn::args::millis;
use crate::conn::error::Error;
use crate::conn::executor::Executor;
use crate::conn::rows::col;
use crate::conn::statements::Stmt;
use crate::conn::version::Version;
use crate::pgmq::queue_name::{quote_ident, QueueName, NOTIFY_KEEPS_CASE};
use crate::Pgmq;

/// A row of `pgmq.list_notify_insert_throttles()`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct NotifyThrottle {
    /// The queue.
    pub queue_name: String,
    /// Minimum time between two notifications, milliseconds (0: every insert).
    pub throttle_interval_ms: i32,
    /// When the last notification was sent.
    pub last_notified_at: DateTime<Utc>,
}

impl<E: Executor> Pgmq<E> {
    /// Makes PGMQ notify `queue.insert_channel()` on insert, at most once per
    /// `throttle` (zero: on every insert).
    ///
    /// ```no_run
    /// # async fn f(client: pgmq_client::Client) -> Result<(), pgmq_client::Error> {
    /// use std::time::Duration;
    /// let q = pgmq_client::QueueName::new("orders")?;
    /// client.enable_notify_insert(&q, Duration::from_millis(100)).await?;
    /// # Ok(()) }
    /// ```
    #[tracing::instrument(name = "pgmq.enable_notify_insert", skip_all, fields(queue = %queue))]
    pub async fn enable_notify_insert(
        &self,
        queue: &QueueName,
        throttle: Duration,
    ) -> Result<(), Error> {
        self.set_notify_throttle(Stmt::EnableNotifyInsert, queue, throttle)
            .await
    }

    /// Removes the insert trigger.
    #[tracing::instrument(name = "pgmq.disable_notify_insert", skip_all, fields(queue = %queue))]
    pub async fn disable_notify_insert(&self, queue: &QueueName) -> Result<(), Error> {
        let q = queue.as_str();
        self.run(Stmt::DisableNotifyInsert, Some(q), &[&q])
            .await
            .map(drop)
    }

    /// Changes the throttle of an enabled insert trigger.
    #[tracing::instrument(name = "pgmq.update_notify_insert", skip_all, fields(queue = %queue))]
    pub async fn update_notify_insert(
        &self,
        queue: &QueueName,
        throttle: Duration,
    ) -> Result<(), Error> {
        self.set_notify_throttle(Stmt::UpdateNotifyInsert, queue, throttle)
            .await
    }

    /// Runs `stmt` (enable or update the insert trigger), which takes the
    /// queue and the throttle in milliseconds.
    async fn set_notify_throttle(
        &self,
        stmt: Stmt,
        queue: &QueueName,
        throttle: Duration,
    ) -> Result<(), Error> {
        let q = queue.as_str();
        let ms = millis(throttle, "throttle")?;
        self.run(stmt, Some(q), &[&q, &ms]).await.map(drop)
    }

    /// Queues with an insert trigger, and their throttles.
    pub async fn list_notify_insert_throttles(&self) -> Result<Vec<NotifyThrottle>, Error> {
        let rows = self.run(Stmt::ListNotifyInsertThrottles, None, &[]).await?;
        rows.iter()
            .map(|r| {
                Ok(NotifyThrottle {
                    queue_name: col(r, 0)?,
                    throttle_interval_ms: col(r, 1)?,
                    last_notified_at: col(r, 2)?,
                })
            })
            .collect()
    }
}

/// A notification received on a [`Listener`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Notification {
    /// The channel, e.g. `pgmq.q_orders.INSERT`.
    pub channel: String,
    /// The payload (empty for PGMQ's insert notifications).
    pub payload: String,
}

/// Notifications of one dedicated connection; ends when the connection closes.
#[derive(Debug)]
pub struct NotificationStream {
    rx: mpsc::UnboundedReceiver<Notification>,
}

impl NotificationStream {
    /// The next notification; None once the connection has closed.
    pub async fn recv(&mut self) -> Option<Notification> {
        self.rx.recv().await
    }
}

/// Opens a connection whose notifications feed a [`NotificationStream`].
pub(crate) async fn connect_listener(
    config: &tokio_postgres::Config,
    tls: MakeRustlsConnect,
) -> Result<(tokio_postgres::Client, NotificationStream), Error> {
    let (client, mut connection) = crate::conn::connection::connect_each(config, &tls)
        .await
        .map_err(Error::Connect)?;
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        let mut messages = futures::stream::poll_fn(move |cx| connection.poll_message(cx));
        while let Some(msg) = messages.next().await {
            match msg {
                Ok(AsyncMessage::Notification(n)) => {
                    let _ = tx.send(Notification {
                        channel: n.channel().to_owned(),
                        payload: n.payload().to_owned(),
                    });
                }
                Ok(_) => {}
                Err(e) => {
                    tracing::debug!(error = %e, "listener connection ended");
                    break;
                }
            }
        }
    });
    Ok((client, NotificationStream { rx }))
}

impl crate::Client {
    /// Opens a [`Listener`](crate::Listener): one dedicated connection (outside
    /// the pool) with this client's settings, for LISTEN.
    ///
    /// Fails with [`Error::Config`] for a client made by
    /// [`Client::from_pool`](crate::Client::from_pool) (the pool does not tell its settings); use
    /// [`Listener::connect`](crate::Listener::connect) then.
    ///
    /// ```no_run
    /// # async fn f(client: pgmq_client::Client) -> Result<(), pgmq_client::Error> {
    /// let q = pgmq_client::QueueName::new("orders")?;
    /// let mut listener = client.listener().await?;
    /// listener.listen(&q).await?;
    /// # Ok(()) }
    /// ```
    pub async fn listener(&self) -> Result<Listener, Error> {
        let Some(settings) = self.executor().dedicated() else {
            return Err(Error::Config(
                "this client was made from a caller's pool (Client::from_pool); \
                 open the listener with Listener::connect"
                    .into(),
            ));
        };
        Listener::from_config(&settings.0, settings.1.clone()).await
    }
}

impl crate::ClientBuilder {
    /// Opens one dedicated connection outside the pool (for LISTEN, say), and
    /// returns it with the stream of its asynchronous messages (notifications).
    pub async fn connect_dedicated(
        &self,
    ) -> Result<(tokio_postgres::Client, NotificationStream), Error> {
        connect_listener(&self.pg_config()?, self.make_tls()?).await
    }
}

/// One dedicated connection that LISTENs on queues' insert channels.
///
/// ```no_run
/// # async fn f() -> Result<(), pgmq_client::Error> {
/// use pgmq_client::{ClientBuilder, Listener, QueueName};
/// let q = QueueName::new("orders")?;
/// let mut listener = Listener::connect(&ClientBuilder::new("postgres://app@db/app")).await?;
/// listener.listen(&q).await?;
/// while let Some(n) = listener.recv().await {
///     println!("something arrived on {}", n.channel);
/// }
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct Listener {
    client: tokio_postgres::Client,
    stream: NotificationStream,
    /// The installed PGMQ's version, read on first `listen` (None when it
    /// could not be read: the newest channel naming is assumed).
    version: tokio::sync::OnceCell<Option<Version>>,
}

impl Listener {
    /// Opens the dedicated connection with `builder`'s DSN, timeouts and TLS.
    pub async fn connect(builder: &crate::ClientBuilder) -> Result<Listener, Error> {
        let (client, stream) = builder.connect_dedicated().await?;
        Ok(Listener::new(client, stream))
    }

    /// Opens the dedicated connection with these settings.
    pub(crate) async fn from_config(
        config: &tokio_postgres::Config,
        tls: MakeRustlsConnect,
    ) -> Result<Listener, Error> {
        let (client, stream) = connect_listener(config, tls).await?;
        Ok(Listener::new(client, stream))
    }

    fn new(client: tokio_postgres::Client, stream: NotificationStream) -> Listener {
        Listener {
            client,
            stream,
            version: tokio::sync::OnceCell::new(),
        }
    }

    /// The channel `queue`'s inserts are notified on by the installed PGMQ
    /// (read once per connection). A PGMQ that never notifies the queue (a
    /// name with uppercase letters before 1.13.1) gets a warning, and the
    /// channel a newer one would use.
    async fn channel(&self, queue: &QueueName) -> String {
        let version = *self
            .version
            .get_or_init(|| async {
                crate::conn::version::detect(&self.client)
                    .await
                    .ok()
                    .map(|i| i.version)
            })
            .await;
        let Some(v) = version else {
            return queue.insert_channel();
        };
        queue.insert_channel_for(v).unwrap_or_else(|| {
            tracing::warn!(
                queue = %queue,
                pgmq = %v,
                "PGMQ before {NOTIFY_KEEPS_CASE} sends no insert notifications for a queue \
                 whose name has uppercase letters: upgrade PGMQ (ALTER EXTENSION pgmq UPDATE); \
                 until then only polling finds its messages"
            );
            queue.insert_channel()
        })
    }

    /// LISTENs on `queue`'s insert channel as the installed PGMQ names it
    /// ([`QueueName::insert_channel_for`]; the version is read on the first
    /// call). The channel is quoted as an identifier ([`quote_ident`]).
    /// With a PGMQ that never notifies this queue (a name with uppercase
    /// letters before 1.13.1) it warns and listens on the channel a newer
    /// PGMQ uses.
    pub async fn listen(&self, queue: &QueueName) -> Result<(), Error> {
        let sql = format!("LISTEN {}", quote_ident(&self.channel(queue).await));
        self.client
            .batch_execute(&sql)
            .await
            .map_err(Error::from_pg)
    }

    /// Stops listening on `queue`'s insert channel.
    pub async fn unlisten(&self, queue: &QueueName) -> Result<(), Error> {
        let sql = format!("UNLISTEN {}", quote_ident(&self.channel(queue).await));
        self.client
            .batch_execute(&sql)
            .await
            .map_err(Error::from_pg)
    }

    /// The next notification; None once the connection is lost (reconnect then).
    pub async fn recv(&mut self) -> Option<Notification> {
        self.stream.recv().await
    }

    /// Whether the connection has closed.
    pub fn is_closed(&self) -> bool {
        self.client.is_closed()
    }
}
