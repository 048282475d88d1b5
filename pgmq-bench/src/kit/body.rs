//! The message bodies: every body is `{"id": n, "pad": "xxx…"}`. `id` is
//! assigned by the bench from 0 so that handlers can record it in a
//! [`Ledger`](crate::ledger::Ledger), and `pad` brings the body to
//! `--payload-bytes`.

use serde::{Deserialize, Serialize};

/// A message body as sent.
#[derive(Debug, Clone, Copy, Serialize)]
pub(crate) struct OutBody<'a> {
    /// The bench's id of the message.
    pub(crate) id: u64,
    /// Padding to the payload size.
    pub(crate) pad: &'a str,
}

/// A message body as handlers read it (the padding is skipped).
#[derive(Debug, Clone, Copy, Deserialize)]
pub(crate) struct InBody {
    /// The bench's id of the message.
    pub(crate) id: u64,
}

/// The id ranges `0..n` in batches of `size`.
pub(crate) fn id_batches(n: u64, size: u64) -> impl Iterator<Item = std::ops::Range<u64>> {
    let size = size.max(1);
    (0..n.div_ceil(size)).map(move |b| b * size..((b + 1) * size).min(n))
}

/// Bytes of `{"id": 123456, "pad": ""}` as PostgreSQL prints jsonb.
const BODY_OVERHEAD: u32 = 25;

/// The padding that brings a body to about `payload_bytes`.
pub(crate) fn padding(payload_bytes: u32) -> String {
    "x".repeat(payload_bytes.saturating_sub(BODY_OVERHEAD) as usize)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn id_batches_cover_every_id_once() {
        let v: Vec<_> = id_batches(5, 2).collect();
        assert_eq!(v, vec![0..2, 2..4, 4..5]);
    }

    #[test]
    fn body_size_is_close_to_the_target() {
        let pad = padding(100);
        let text = serde_json::to_string(&OutBody {
            id: 123_456,
            pad: &pad,
        })
        .unwrap();
        // serde_json prints without spaces, PostgreSQL with: within a few bytes.
        assert!((95..=100).contains(&text.len()), "{}", text.len());
        assert_eq!(padding(10), "");
    }
}
