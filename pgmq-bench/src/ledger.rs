//! Which message ids were handled: a lock-free bitset, so that every message
//! is accounted for (missing and duplicated ids are counted, not estimated).
//!
//! Every benchmark message carries its own id (`{"id": n, ...}`), assigned by
//! the bench from 0. Handlers call [`Ledger::mark`]; [`Ledger::report`] then
//! counts the ids of `0..expected` never marked (missing) and the marks of an
//! id already marked (duplicates). Memory: one bit per id, allocated in
//! 1 Mi-id chunks as ids arrive (128 KiB each), so an open-ended run (the
//! sustained section) needs no size up front.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};

use crate::document::LedgerReport;

const CHUNK_BITS: u64 = 1 << 20;
const WORDS_PER_CHUNK: usize = (CHUNK_BITS / 64) as usize;
/// 4096 chunks of 2^20 ids: ids up to 2^32.
const MAX_CHUNKS: usize = 4096;
const SAMPLE_IDS: usize = 20;

/// The handled-id ledger of one run.
///
/// ```
/// use pgmq_bench::ledger::Ledger;
/// let l = Ledger::new();
/// l.mark(0);
/// l.mark(2);
/// l.mark(2);
/// let r = l.report(3);
/// assert_eq!((r.missing, r.duplicates, r.distinct), (1, 1, 2));
/// assert_eq!(r.missing_ids, vec![1]);
/// ```
pub struct Ledger {
    chunks: Box<[OnceLock<Box<[AtomicU64]>>]>,
    handled: AtomicU64,
    duplicates: AtomicU64,
    unexpected: AtomicU64,
    duplicate_ids: Mutex<Vec<u64>>,
}

impl Default for Ledger {
    fn default() -> Self {
        Ledger::new()
    }
}

impl std::fmt::Debug for Ledger {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ledger")
            .field("handled", &self.handled())
            .field("duplicates", &self.duplicates.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

impl Ledger {
    /// An empty ledger.
    pub fn new() -> Ledger {
        Ledger {
            chunks: (0..MAX_CHUNKS).map(|_| OnceLock::new()).collect(),
            handled: AtomicU64::new(0),
            duplicates: AtomicU64::new(0),
            unexpected: AtomicU64::new(0),
            duplicate_ids: Mutex::new(Vec::new()),
        }
    }

    fn chunk(&self, index: usize) -> &[AtomicU64] {
        self.chunks[index].get_or_init(|| (0..WORDS_PER_CHUNK).map(|_| AtomicU64::new(0)).collect())
    }

    /// Records that `id` was handled; returns false when it had been already
    /// (a duplicate) or lies beyond the ledger's range.
    pub fn mark(&self, id: u64) -> bool {
        self.handled.fetch_add(1, Ordering::Relaxed);
        let chunk = (id / CHUNK_BITS) as usize;
        if chunk >= MAX_CHUNKS {
            self.unexpected.fetch_add(1, Ordering::Relaxed);
            return false;
        }
        let bit = id % CHUNK_BITS;
        let word = &self.chunk(chunk)[(bit / 64) as usize];
        let mask = 1u64 << (bit % 64);
        let before = word.fetch_or(mask, Ordering::Relaxed);
        if before & mask != 0 {
            self.duplicates.fetch_add(1, Ordering::Relaxed);
            let mut ids = self.duplicate_ids.lock().unwrap_or_else(|e| e.into_inner());
            if ids.len() < SAMPLE_IDS {
                ids.push(id);
            }
            return false;
        }
        true
    }

    /// Handler calls recorded so far (duplicates included).
    pub fn handled(&self) -> u64 {
        self.handled.load(Ordering::Relaxed)
    }

    /// Whether `id` was marked.
    #[cfg(test)]
    pub fn contains(&self, id: u64) -> bool {
        let chunk = (id / CHUNK_BITS) as usize;
        if chunk >= MAX_CHUNKS {
            return false;
        }
        let Some(words) = self.chunks[chunk].get() else {
            return false;
        };
        let bit = id % CHUNK_BITS;
        words[(bit / 64) as usize].load(Ordering::Relaxed) & (1u64 << (bit % 64)) != 0
    }

    /// Every id marked, ascending.
    pub fn ids(&self) -> Vec<u64> {
        let mut out = Vec::new();
        for (c, slot) in self.chunks.iter().enumerate() {
            let Some(words) = slot.get() else { continue };
            for (w, word) in words.iter().enumerate() {
                let mut bits = word.load(Ordering::Relaxed);
                while bits != 0 {
                    let b = u64::from(bits.trailing_zeros());
                    out.push(c as u64 * CHUNK_BITS + w as u64 * 64 + b);
                    bits &= bits - 1;
                }
            }
        }
        out
    }

    /// Accounting against the ids `0..expected`.
    pub fn report(&self, expected: u64) -> LedgerReport {
        let mut distinct = 0u64;
        let mut in_range = 0u64;
        let mut missing_ids = Vec::new();
        for (c, slot) in self.chunks.iter().enumerate() {
            let base = c as u64 * CHUNK_BITS;
            let Some(words) = slot.get() else {
                if base < expected && missing_ids.len() < SAMPLE_IDS {
                    let end = expected.min(base + CHUNK_BITS);
                    missing_ids.extend((base..end).take(SAMPLE_IDS - missing_ids.len()));
                }
                continue;
            };
            for (w, word) in words.iter().enumerate() {
                let bits = word.load(Ordering::Relaxed);
                let word_base = base + w as u64 * 64;
                distinct += u64::from(bits.count_ones());
                if word_base >= expected {
                    continue;
                }
                let valid = (expected - word_base).min(64);
                let mask = if valid == 64 {
                    u64::MAX
                } else {
                    (1u64 << valid) - 1
                };
                in_range += u64::from((bits & mask).count_ones());
                if missing_ids.len() < SAMPLE_IDS && bits & mask != mask {
                    for b in 0..valid {
                        if bits & (1 << b) == 0 && missing_ids.len() < SAMPLE_IDS {
                            missing_ids.push(word_base + b);
                        }
                    }
                }
            }
        }
        let mut duplicate_ids = self
            .duplicate_ids
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        duplicate_ids.sort_unstable();
        LedgerReport {
            expected,
            handled: self.handled(),
            distinct,
            missing: expected - in_range,
            duplicates: self.duplicates.load(Ordering::Relaxed),
            unexpected: self.unexpected.load(Ordering::Relaxed) + (distinct - in_range),
            missing_ids,
            duplicate_ids,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn all_marked() {
        let l = Ledger::new();
        for id in 0..200_000 {
            assert!(l.mark(id));
        }
        let r = l.report(200_000);
        assert_eq!(r.missing, 0);
        assert_eq!(r.duplicates, 0);
        assert_eq!(r.distinct, 200_000);
        assert_eq!(r.handled, 200_000);
        assert!(r.missing_ids.is_empty());
    }

    #[test]
    fn missing_across_chunks_and_beyond_range() {
        let l = Ledger::new();
        for id in (0..3 * CHUNK_BITS).filter(|i| *i != 5 && *i != CHUNK_BITS + 7) {
            l.mark(id);
        }
        let r = l.report(3 * CHUNK_BITS + 2);
        assert_eq!(r.missing, 4);
        assert_eq!(
            r.missing_ids,
            vec![5, CHUNK_BITS + 7, 3 * CHUNK_BITS, 3 * CHUNK_BITS + 1]
        );
        l.mark(10 * CHUNK_BITS);
        let r = l.report(3 * CHUNK_BITS);
        assert_eq!(r.unexpected, 1);
        assert!(!l.mark(u64::MAX));
        assert_eq!(l.report(3 * CHUNK_BITS).unexpected, 2);
    }

    #[test]
    fn duplicates_counted_with_ids() {
        let l = Ledger::new();
        assert!(l.mark(3));
        assert!(!l.mark(3));
        assert!(!l.mark(3));
        assert!(l.contains(3));
        assert!(!l.contains(4));
        l.mark(CHUNK_BITS + 65);
        assert_eq!(l.ids(), vec![3, CHUNK_BITS + 65]);
        let r = l.report(4);
        assert_eq!(r.duplicates, 2);
        assert_eq!(r.duplicate_ids, vec![3, 3]);
        assert_eq!(r.missing, 3);
        assert_eq!(r.handled, 4);
    }

    #[test]
    fn concurrent_marks() {
        let l = std::sync::Arc::new(Ledger::new());
        let threads: Vec<_> = (0..4)
            .map(|t| {
                let l = l.clone();
                std::thread::spawn(move || {
                    for id in (t..100_000).step_by(4) {
                        l.mark(id);
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let r = l.report(100_000);
        assert_eq!((r.missing, r.duplicates, r.distinct), (0, 0, 100_000));
    }
}
