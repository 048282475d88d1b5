//! Topics: bind queues to routing-key patterns and send to every match.
//!
//! Patterns are dot-separated words where `*` matches one word and `#` zero or
//! more (`orders.*`, `logs.#`). Patterns and routing keys are bound
//! parameters; PGMQ validates them and a bad one is a [`Error::Database`] error.

use chrono::{DateTime, Utc};
use serde::Serialize;

use crate::error::{col, first_col, Error};
use crate::executor::Executor;
use crate::message::{Delay, SendOptions};
use crate::queue_name::QueueName;
use crate::send::to_json;
use crate::statements::Stmt;
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

fn delay_int(delay: Delay) -> Result<Option<i32>, Error> {
    match delay {
        Delay::None => Ok(Some(0)),
        Delay::Seconds(s) => i32::try_from(s)
            .map(Some)
            .map_err(|_| Error::InvalidArgument(format!("delay of {s} s is too long"))),
        Delay::At(_) => Ok(None),
    }
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

    /// [`send_topic`](Self::send_topic) with headers and a delay in seconds
    /// (PGMQ's `send_topic` takes no timestamp delay: `Delay::At` is refused).
    #[tracing::instrument(name = "pgmq.send_topic", skip_all)]
    pub async fn send_topic_with<T: Serialize + ?Sized + Sync>(
        &self,
        routing_key: &str,
        body: &T,
        opts: &SendOptions,
    ) -> Result<i32, Error> {
        let body = to_json(body)?;
        let headers = self.headers_json(opts.headers.as_ref())?;
        let delay = delay_int(opts.delay)?.ok_or_else(|| {
            Error::InvalidArgument("send_topic takes a delay in seconds, not a timestamp".into())
        })?;
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
    #[tracing::instrument(name = "pgmq.send_batch_topic", skip_all, fields(batch = bodies.len()))]
    pub async fn send_batch_topic<T: Serialize + Sync>(
        &self,
        routing_key: &str,
        bodies: &[T],
        headers: Option<&[serde_json::Value]>,
        delay: Delay,
    ) -> Result<Vec<(String, i64)>, Error> {
        if bodies.is_empty() {
            return Ok(Vec::new());
        }
        crate::read::check_batch(bodies.len(), "batch of")?;
        if let Some(h) = headers {
            if h.len() != bodies.len() {
                return Err(Error::InvalidArgument(format!(
                    "{} headers for {} messages",
                    h.len(),
                    bodies.len()
                )));
            }
        }
        let headers = self.batch_headers_json(headers, bodies.len())?;
        let bodies = bodies.iter().map(to_json).collect::<Result<Vec<_>, _>>()?;
        let rows = match (delay, delay_int(delay)?) {
            (Delay::At(at), _) => {
                self.run(
                    Stmt::SendBatchTopicAt,
                    None,
                    &[&routing_key, &bodies, &headers, &at],
                )
                .await?
            }
            (_, secs) => {
                let secs = secs.unwrap_or(0);
                self.run(
                    Stmt::SendBatchTopic,
                    None,
                    &[&routing_key, &bodies, &headers, &secs],
                )
                .await?
            }
        };
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
