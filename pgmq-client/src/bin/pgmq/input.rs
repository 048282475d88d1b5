//! `pgmq send`: JSON lines in, batches of `send_batch_with` out.

use chrono::{DateTime, Utc};
use std::time::Duration;

use pgmq_client::{Client, Delay, QueueName, SendOptions};
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncRead, BufReader};

use crate::out::exit_for;
use crate::{fail, Exit, Failure, Out};

pub(crate) struct SendOpts {
    pub envelope: bool,
    pub delay: Option<u32>,
    pub batch: usize,
}

/// One line with `--envelope`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Envelope {
    body: Box<RawValue>,
    #[serde(default)]
    headers: Option<Value>,
    #[serde(default)]
    delay: Option<DelaySpec>,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum DelaySpec {
    Seconds(u32),
    At(DateTime<Utc>),
}

/// Messages sharing a delay and the presence of headers: one statement.
struct Batch {
    delay: Delay,
    bodies: Vec<Box<RawValue>>,
    headers: Option<Vec<Value>>,
    /// The input line of each message.
    lines: Vec<usize>,
}

/// Why a batch was not sent, naming its lines: the bad one when the
/// client found it, the batch's range when the server refused it.
fn batch_failure(e: &pgmq_client::Error, lines: &[usize], sent: usize) -> String {
    let (first, last) = (lines[0], lines[lines.len() - 1]);
    let unsent = if first == last {
        format!("line {first} was not sent")
    } else {
        format!("none of lines {first}-{last} (one batch) was sent")
    };
    let before = format!("{sent} message(s) before line {first} were sent");
    match e {
        pgmq_client::Error::UnstorableText {
            index: Some(i),
            field,
            source: None,
            ..
        } => format!(
            "line {}: a NUL character (\\u0000) in its {}, which PostgreSQL cannot store; \
             {unsent}; {before}",
            lines[*i],
            field.unwrap_or("message")
        ),
        pgmq_client::Error::UnstorableText { .. } => {
            format!("one of lines {first}-{last}: {e}; {unsent}; {before}")
        }
        _ => format!("{e} ({unsent}; {before})"),
    }
}

/// Describes a JSON error by kind and position only: the line's content is
/// the payload and is never echoed.
fn describe(e: &serde_json::Error) -> String {
    use serde_json::error::Category;
    let kind = match e.classify() {
        Category::Syntax => "not valid JSON",
        Category::Eof => "JSON cut short",
        Category::Data => "unexpected JSON shape",
        Category::Io => "unreadable",
    };
    format!("{kind} (column {})", e.column())
}

fn parse(
    line: &str,
    n: usize,
    opts: &SendOpts,
) -> Result<(Delay, Box<RawValue>, Option<Value>), Failure> {
    let default_delay = Delay::After(Duration::from_secs(opts.delay.map_or(0, u64::from)));
    if !opts.envelope {
        let body: Box<RawValue> = serde_json::from_str(line)
            .map_err(|e| Failure::new(Exit::Other, format!("line {n}: {}", describe(&e))))?;
        return Ok((default_delay, body, None));
    }
    let env: Envelope = serde_json::from_str(line).map_err(|e| {
        Failure::new(Exit::Other, format!(
            "line {n}: {}; with --envelope each line is {{\"body\": ..., \"headers\": {{...}}, \"delay\": seconds or RFC 3339 time}}",
            describe(&e)
        ))
    })?;
    if let Some(h) = &env.headers {
        if !h.is_object() && !h.is_null() {
            return fail(format!("line {n}: \"headers\" must be a JSON object"));
        }
    }
    let delay = match env.delay {
        None => default_delay,
        Some(DelaySpec::Seconds(s)) => Delay::After(Duration::from_secs(u64::from(s))),
        Some(DelaySpec::At(t)) => Delay::At(t),
    };
    Ok((delay, env.body, env.headers.filter(|h| !h.is_null())))
}

async fn flush(
    client: &Client,
    q: &QueueName,
    batch: &mut Option<Batch>,
    sent: &mut usize,
    out: &mut Out,
) -> Result<(), Failure> {
    let Some(b) = batch.take() else {
        return Ok(());
    };
    let mut opts = SendOptions::new().delay(b.delay);
    opts.headers_each = b.headers;
    let ids = client
        .send_batch_with(q, &b.bodies, &opts)
        .await
        .map_err(|e| Failure::new(exit_for(&e), batch_failure(&e, &b.lines, *sent)))?;
    *sent += ids.len();
    for id in ids {
        out.line(&id).await?;
    }
    out.flush().await
}

/// Sends every non-empty line of `input` to `q`; prints the new ids.
pub(crate) async fn send_lines(
    client: &Client,
    q: &QueueName,
    input: impl AsyncRead + Unpin,
    opts: &SendOpts,
    out: &mut Out,
) -> Result<(), Failure> {
    let mut lines = BufReader::new(input).lines();
    let mut batch: Option<Batch> = None;
    let mut sent = 0usize;
    let mut n = 0usize;
    loop {
        let line = match lines.next_line().await {
            Ok(Some(line)) => line,
            Ok(None) => break,
            Err(e) => {
                flush(client, q, &mut batch, &mut sent, out).await?;
                return fail(format!(
                    "reading line {}: {e} ({sent} message(s) sent)",
                    n + 1
                ));
            }
        };
        n += 1;
        if line.trim().is_empty() {
            continue;
        }
        let (delay, body, headers) = match parse(&line, n, opts) {
            Ok(parsed) => parsed,
            Err(f) => {
                flush(client, q, &mut batch, &mut sent, out).await?;
                return fail(format!("{} ({sent} message(s) before it were sent)", f.msg));
            }
        };
        let fits = batch.as_ref().is_some_and(|b| {
            b.delay == delay
                && b.headers.is_some() == headers.is_some()
                && b.bodies.len() < opts.batch
        });
        if !fits {
            flush(client, q, &mut batch, &mut sent, out).await?;
            batch = Some(Batch {
                delay,
                bodies: Vec::with_capacity(opts.batch),
                headers: headers.as_ref().map(|_| Vec::with_capacity(opts.batch)),
                lines: Vec::with_capacity(opts.batch),
            });
        }
        let b = batch.as_mut().expect("a batch was just opened");
        b.bodies.push(body);
        b.lines.push(n);
        if let (Some(hs), Some(h)) = (&mut b.headers, headers) {
            hs.push(h);
        }
    }
    flush(client, q, &mut batch, &mut sent, out).await
}
