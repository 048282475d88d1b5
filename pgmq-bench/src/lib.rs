//! The benchmark harness behind the `pgmq-bench` binary (work in progress).

pub mod faults;
