//! The PGMQ worker runtime (work in progress).
