//! The fault and bad-input suite (work in progress).
