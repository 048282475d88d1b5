//! Topics: bind queues to routing-key patterns and send to every match.
//!
//! Patterns are dot-separated words where `*` matches one word and `#` zero or
//! more (`orders.*`, `logs.#`). Patterns and routing keys are bound
//! parameters; PGMQ validates them and a bad one is a [`Error::Database`] error.

use chrono::{DateTime, Utc};
use serde::Serialize;

use crate::conn::args::secs;
use crate::conn::error::Error;
use crate::conn::executor::Executor;
use crate::conn::rows::{col, first_col};
use crate::conn::statements::Stmt;
use crate::pgmq::message::{Delay, SendOptions};
use crate::pgmq::queue_name::QueueName;
use crate::pgmq::send::to_json;
use crate::Pgmq;

/// A row of `pgmq.list_topic_bindings()`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct TopicBinding {
    /// The pattern.
    pub pattern: String,
    /// The queue it routes to.
    pub queue_name: String,
    /// When it was bound.
    pub bound_at: DateTime<Utc>,
    /// The regular expression PGMQ compiled from the pattern.
    pub compiled_regex: String,
}

/// A row of `pgmq.test_routing()`: a binding a routing key matches.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct RouteMatch {
    /// The matching pattern.
    pub pattern: String,
    /// The queue it routes to.
    pub queue_name: String,
    /// The compiled regular expression.
    pub compiled_regex: String,
}

impl<E: Executor> Pgmq<E> {
    /// Routes messages whose routing key matches `pattern` to `queue`.
    ///
    /// ```no_run
    /// # async fn f(client: pgmq_client::Client) -> Result<(), pgmq_client::Error> {
    /// let q = pgmq_client::QueueName::new("eu_orders")?;
    /// client.bind_topic("orders.eu.*", &q).await?;
    /// let n = client.send_topic("orders.eu.created", &serde_json::json!({"id": 1})).await?;
    /// assert_eq!(n, 1);
    /// # Ok(()) }
    /// ```
    #[tracing::instrument(name = "pgmq.bind_topic", skip_all, fields(queue = %queue))]
    pub async fn bind_topic(&self, pattern: &str, queue: &QueueName) -> Result<(), Error> {
        let q = queue.as_str();
        self.run(Stmt::BindTopic, Some(q), &[&pattern, &q])
            .await
            .map(drop)
    }

    /// Removes a binding; false when there was none.
    #[tracing::instrument(name = "pgmq.unbind_topic", skip_all, fields(queue = %queue))]
    pub async fn unbind_topic(&self, pattern: &str, queue: &QueueName) -> Result<bool, Error> {
        let q = queue.as_str();
        let rows = self
            .run(Stmt::UnbindTopic, Some(q), &[&pattern, &q])
            .await?;
        Ok(first_col::<Option<bool>>(&rows, 0, None)?.unwrap_or(false))
    }

    /// Sends one message to every queue bound to a matching pattern; returns
    /// how many queues received it.
    pub async fn send_topic<T: Serialize + ?Sized + Sync>(
        &self,
        routing_key: &str,
        body: &T,
    ) -> Result<i32, Error> {
        self.send_topic_with(routing_key, body, &SendOptions::default())
            .await
    }

    /// [`send_topic`](Self::send_topic) with headers and a delay. PGMQ's
    /// `send_topic` takes no timestamp: a [`Delay::At`] is refused with
    /// [`Error::InvalidArgument`] (a batch takes one:
    /// [`send_batch_topic_with`](Self::send_batch_topic_with)).
    ///
    /// ```no_run
    /// # async fn f(client: pgmq_client::Client) -> Result<(), pgmq_client::Error> {
    /// use pgmq_client::SendOptions;
    /// use std::time::Duration;
    /// let opts = SendOptions::new()
    ///     .delay(Duration::from_secs(10))
    ///     .headers(serde_json::json!({"tenant": "acme"}));
    /// let queues = client.send_topic_with("orders.eu.created", &serde_json::json!({"id": 1}), &opts).await?;
    /// # Ok(()) }
    /// ```
    #[tracing::instrument(name = "pgmq.send_topic", skip_all)]
    pub async fn send_topic_with<T: Serialize + ?Sized + Sync>(
        &self,
        routing_key: &str,
        body: &T,
        opts: &SendOptions,
    ) -> Result<i32, Error> {
        let body = to_json(body, "body")?;
        let headers = self.headers_json(opts)?;
        let delay = topic_delay(opts)?;
        let rows = self
            .run(
                Stmt::SendTopic,
                None,
                &[&routing_key, &body, &headers, &delay],
            )
            .await?;
        Ok(first_col::<Option<i32>>(&rows, 0, None)?.unwrap_or(0))
    }

    /// Sends a batch to every queue bound to a matching pattern; returns
    /// `(queue_name, msg_id)` for each message stored.
    ///
    /// ```no_run
    /// # async fn f(client: pgmq_client::Client) -> Result<(), pgmq_client::Error> {
    /// let stored = client.send_batch_topic("logs.app", &["started", "ready"]).await?;
    /// for (queue, id) in stored {
    ///     println!("{queue}: {id}");
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn send_batch_topic<T: Serialize + Sync>(
        &self,
        routing_key: &str,
        bodies: &[T],
    ) -> Result<Vec<(String, i64)>, Error> {
        self.send_batch_topic_with(routing_key, bodies, &SendOptions::default())
            .await
    }

    /// [`send_batch_topic`](Self::send_batch_topic) with a delay (seconds
    /// or a timestamp) and headers (the same for each message, or one per
    /// message with [`SendOptions::headers_each`]).
    ///
    /// ```no_run
    /// # async fn f(client: pgmq_client::Client) -> Result<(), pgmq_client::Error> {
    /// use pgmq_client::SendOptions;
    /// let at = chrono::Utc::now() + chrono::Duration::minutes(1);
    /// let opts = SendOptions::new().delay(at).headers(serde_json::json!({"source": "api"}));
    /// client.send_batch_topic_with("logs.app", &["a", "b"], &opts).await?;
    /// # Ok(()) }
    /// ```
    #[tracing::instrument(name = "pgmq.send_batch_topic", skip_all, fields(batch = bodies.len()))]
    pub async fn send_batch_topic_with<T: Serialize + Sync>(
        &self,
        routing_key: &str,
        bodies: &[T],
        opts: &SendOptions,
    ) -> Result<Vec<(String, i64)>, Error> {
        let send = (Stmt::SendBatchTopic, Stmt::SendBatchTopicAt);
        let rows = self
            .run_batch_send(send, None, &[&routing_key], bodies, opts, &[])
            .await?;
        rows.iter().map(|r| Ok((col(r, 0)?, col(r, 1)?))).collect()
    }

    /// Bindings, of all queues or of one.
    pub async fn list_topic_bindings(
        &self,
        queue: Option<&QueueName>,
    ) -> Result<Vec<TopicBinding>, Error> {
        let rows = match queue {
            None => self.run(Stmt::ListTopicBindings, None, &[]).await?,
            Some(q) => {
                let q = q.as_str();
                self.run(Stmt::ListTopicBindingsFor, None, &[&q]).await?
            }
        };
        rows.iter()
            .map(|r| {
                Ok(TopicBinding {
                    pattern: col(r, 0)?,
                    queue_name: col(r, 1)?,
                    bound_at: col(r, 2)?,
                    compiled_regex: col(r, 3)?,
                })
            })
            .collect()
    }

    /// Which bindings `routing_key` would match, without sending anything.
    pub async fn test_routing(&self, routing_key: &str) -> Result<Vec<RouteMatch>, Error> {
        let rows = self.run(Stmt::TestRouting, None, &[&routing_key]).await?;
        rows.iter()
            .map(|r| {
                Ok(RouteMatch {
                    pattern: col(r, 0)?,
                    queue_name: col(r, 1)?,
                    compiled_regex: col(r, 2)?,
                })
            })
            .collect()
    }
}

/// The delay of a single topic send in seconds: PGMQ's `send_topic` takes
/// no timestamp, so a [`Delay::At`] is refused.
pub(crate) fn topic_delay(opts: &SendOptions) -> Result<i32, Error> {
    match opts.delay {
        Delay::After(d) => secs(d, "delay"),
        Delay::At(_) => Err(Error::InvalidArgument(
            "send_topic takes a delay in seconds, not a timestamp".into(),
        )),
    }
}
