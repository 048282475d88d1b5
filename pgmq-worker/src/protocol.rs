//! The message protocol: what the worker reads from and writes into a
//! message's headers, and the limit on the handler-supplied text it writes.
//!
//! - [`ATTEMPTS_HEADER`]: the attempts used so far, written (fenced) with
//!   every retry and read back when the message is claimed again, so that
//!   attempts count handler runs, not PGMQ's deliveries (`read_ct`).
//! - The headers of a message archived as a dead letter when there is no
//!   dead-letter queue ([`archived_dead_letter_headers`]); those of a
//!   message moved to the dead-letter queue are built in SQL, in the
//!   completer's move statement, from the same names.
//! - [`MAX_REASON_LEN`]: handler-supplied text (errors, panics, dead-letter
//!   reasons) is cut to this many bytes before it is logged or written.

/// The header in which retries record the attempts used so far.
pub const ATTEMPTS_HEADER: &str = "x-pgmq-worker-attempts";

/// The attempts a message's header says were used (0 without one).
pub(crate) fn attempts_used(headers: Option<&serde_json::Value>) -> u32 {
    headers
        .and_then(|h| h.get(ATTEMPTS_HEADER))
        .and_then(serde_json::Value::as_u64)
        .map_or(0, |n| u32::try_from(n).unwrap_or(u32::MAX))
}

/// The headers a retry merges into the message's own: the attempts used.
pub(crate) fn retry_headers(attempt: u32) -> serde_json::Value {
    serde_json::json!({ ATTEMPTS_HEADER: attempt })
}

/// The headers merged into a dead letter archived in place (no dead-letter
/// queue, or it was dropped): why, and after how many attempts.
pub(crate) fn archived_dead_letter_headers(reason: &str, attempts: u32) -> serde_json::Value {
    serde_json::json!({ "dead_letter_reason": reason, "attempts": attempts })
}

/// The most bytes of handler-supplied text (an error's text, a panic
/// message, an `Outcome::DeadLetter` reason) that the worker logs or writes
/// into a dead-letter `reason` header: 512. Such text can quote the data
/// being handled; longer text is cut at a character boundary and ends in
/// `…`.
pub const MAX_REASON_LEN: usize = 512;

/// `reason` cut to [`MAX_REASON_LEN`] bytes.
pub(crate) fn truncate_reason(mut reason: String) -> String {
    if reason.len() > MAX_REASON_LEN {
        let mut end = MAX_REASON_LEN;
        while !reason.is_char_boundary(end) {
            end -= 1;
        }
        reason.truncate(end);
        reason.push('…');
    }
    reason
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attempts_come_from_the_header() {
        assert_eq!(attempts_used(None), 0);
        assert_eq!(attempts_used(Some(&serde_json::json!({"x": 1}))), 0);
        assert_eq!(attempts_used(Some(&retry_headers(3))), 3);
        assert_eq!(attempts_used(Some(&serde_json::json!([1, 2]))), 0);
    }

    #[test]
    fn reasons_are_cut_at_a_char_boundary() {
        let long = "é".repeat(MAX_REASON_LEN);
        let cut = truncate_reason(long);
        assert!(cut.len() <= MAX_REASON_LEN + '…'.len_utf8());
        assert!(cut.ends_with('…'));
        assert_eq!(truncate_reason("short".into()), "short");
    }
}
