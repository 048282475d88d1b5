//! `pgmq archive list | prune`: a queue's archive looked at, and its old
//! rows deleted in bounded batches.

use std::time::Duration;

use pgmq_client::{Client, QueueName};
use serde_json::json;

use crate::out::{Failure, Out};

/// Deletes the rows of `q`'s archive archived more than `older_than` ago,
/// `batch` rows per statement, each its own transaction, until a batch
/// comes back short; prints `{"queue", "pruned"}`. When a batch fails, the
/// batches before it stay deleted and the error says how many.
pub(crate) async fn prune(
    client: &Client,
    q: &QueueName,
    older_than: Duration,
    batch: usize,
    out: &mut Out,
) -> Result<(), Failure> {
    let mut pruned = 0u64;
    loop {
        let n = client
            .prune_archive_batch(q, older_than, batch)
            .await
            .map_err(|e| {
                Failure::from(e)
                    .map_msg(|m| format!("{m} ({pruned} archived message(s) deleted before)"))
            })?;
        pruned += n;
        if n < batch as u64 {
            break;
        }
    }
    out.line(&json!({ "queue": q.as_str(), "pruned": pruned }))
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
