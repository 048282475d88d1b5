//! `pgmq archive list | prune`: a queue's archive looked at, and its old
//! rows deleted in bounded batches (the archive's retention, applied
//! once).

use std::time::Duration;

use pgmq_client::{ArchiveRetention, Client, QueueName};
use serde_json::json;

use crate::out::{Failure, Out};

/// Applies `retention` to `q`'s archive once
/// ([`Pgmq::apply_retention`](pgmq_client::Pgmq::apply_retention), the
/// code pgmq-worker's retention task runs): bounded batches, each its own
/// short transaction under the queue's retention lock; prints `{"queue",
/// "pruned", "busy"}` (`busy`: another process was pruning the queue, and
/// this run stopped). When a batch fails, the batches before it stay
/// deleted.
pub(crate) async fn prune(
    client: &Client,
    q: &QueueName,
    retention: &ArchiveRetention,
    out: &mut Out,
) -> Result<(), Failure> {
    let done = client.apply_retention(q, retention).await?;
    out.line(&json!({ "queue": q.as_str(), "pruned": done.pruned, "busy": done.busy }))
        .await
}

/// Parses an age: a whole number and a unit, `s`, `m`, `h`, `d` or `w`
/// (`90s`, `30m`, `12h`, `7d`, `2w`); a bare number is seconds.
pub(crate) fn parse_age(text: &str) -> Result<Duration, String> {
    let t = text.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (digits, unit) = t.split_at(split);
    let n: u64 = digits
        .parse()
        .map_err(|_| format!("{text:?} is not an age such as 90s, 30m, 12h, 7d or 2w"))?;
    let per = match unit {
        "" | "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86_400,
        "w" => 7 * 86_400,
        _ => {
            return Err(format!(
                "{text:?}: unknown unit {unit:?} (s, m, h, d or w, e.g. 7d)"
            ))
        }
    };
    n.checked_mul(per)
        .map(Duration::from_secs)
        .ok_or_else(|| format!("{text:?} is too long"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ages_take_a_unit() {
        assert_eq!(parse_age("90"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_age("90s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_age("30m"), Ok(Duration::from_secs(1800)));
        assert_eq!(parse_age("12h"), Ok(Duration::from_secs(43_200)));
        assert_eq!(parse_age("7d"), Ok(Duration::from_secs(604_800)));
        assert_eq!(parse_age("2w"), Ok(Duration::from_secs(1_209_600)));
        for bad in ["", "d", "7 days", "1.5h", "-1d", "7y"] {
            assert!(parse_age(bad).is_err(), "{bad}");
        }
    }
}
