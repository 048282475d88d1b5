//! The command line of `pgmq-faults`: the suite's options (or, with
//! `--campaign`, the campaign's), and the hidden `worker` subcommand the
//! suite re-executes this binary with for each worker process.

use clap::{Parser, Subcommand};

use super::FaultsArgs;

/// `pgmq-faults`: the fault and bad-input suite, and the randomized fault
/// campaign, on a throwaway cluster of its own.
///
/// Without a subcommand it runs the suite (the fixed scenarios, or with
/// `--campaign` the campaign); the `worker` subcommand is the suite's
/// worker process, not for use by hand.
#[derive(Debug, Parser)]
#[command(
    name = "pgmq-faults",
    version,
    about = "Fault and bad-input suite and fault campaign for pgmq-client and pgmq-worker, \
             on a throwaway PostgreSQL/PGMQ cluster of its own",
    args_conflicts_with_subcommands = true
)]
#[non_exhaustive]
pub struct Cli {
    /// The worker subcommand; none runs the suite.
    #[command(subcommand)]
    pub command: Option<Command>,
    /// The suite's options (when no subcommand is given).
    #[command(flatten)]
    pub suite: FaultsArgs,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// The worker process of the suite (started by the suite, not by hand).
    #[command(hide = true)]
    Worker {
        /// Its settings, as JSON (pgmq-testkit's child protocol).
        spec: String,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_suite_and_the_campaign_parse_without_a_subcommand() {
        let cli = Cli::try_parse_from(["pgmq-faults", "--root", ".", "--quick"]).unwrap();
        assert!(cli.command.is_none());
        assert!(cli.suite.quick && !cli.suite.campaign);
        let cli = Cli::try_parse_from([
            "pgmq-faults",
            "--root",
            ".",
            "--campaign",
            "--seed",
            "1,2",
            "--duration",
            "25s",
            "--json",
            "x.json",
        ])
        .unwrap();
        assert!(cli.suite.campaign);
        assert_eq!(cli.suite.seed, vec![1, 2]);
        assert_eq!(cli.suite.duration, Some(std::time::Duration::from_secs(25)));
        // The suite's options are not the worker's.
        assert!(Cli::try_parse_from(["pgmq-faults", "--quick", "worker"]).is_err());
    }

    #[test]
    fn the_worker_subcommand_takes_one_json_spec() {
        let q = pgmq_client::QueueName::new("faults_q").unwrap();
        let dlq = pgmq_client::QueueName::new("faults_q_dlq").unwrap();
        let args = crate::worker::FaultSpec::for_queue(&q, &dlq, "run-1", "2");
        let json = serde_json::to_string(&args).unwrap();
        let cli = Cli::try_parse_from(["pgmq-faults", "worker", json.as_str()]).unwrap();
        let Some(Command::Worker { spec }) = cli.command else {
            panic!("not the worker subcommand");
        };
        assert_eq!(spec, json);
    }
}
