//! `pgmq-bench`: thin binary over the `pgmq_bench` library.

fn main() {
    eprintln!("pgmq-bench: not implemented yet");
    std::process::exit(2);
}
