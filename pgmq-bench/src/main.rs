//! `pgmq-bench`: parse, dispatch, exit. Everything else is in the library.

use pgmq_bench::cli::{Cli, Command};
use pgmq_bench::{commands, run};

fn main() {
    let cli = Cli::parse_args();
    pgmq_bench::init_tracing();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("pgmq-bench: cannot start the async runtime: {e}");
            std::process::exit(1);
        }
    };
    let code = runtime.block_on(async move {
        let result = match cli.command {
            None => run::run(cli.run).await,
            Some(Command::Run(args)) => run::run(args).await,
            Some(Command::Compare(args)) => commands::compare(args).await,
            Some(Command::Report(args)) => commands::report(args).await,
            Some(Command::Check(args)) => commands::check(args).await,
            Some(Command::CheckMemory(args)) => commands::check_memory(args).await,
            Some(Command::Aggregate(args)) => commands::aggregate(args).await,
            Some(Command::Summary(args)) => commands::summary(args).await,
            Some(Command::Schema) => commands::schema(),
            Some(Command::ProcessWorker { spec }) => {
                return pgmq_bench::sections::process_worker_main(&spec)
                    .await
                    .unwrap_or_else(|e| {
                        eprintln!("pgmq-bench process-worker: {e}");
                        1
                    })
            }
        };
        result.unwrap_or_else(|e| {
            eprintln!("pgmq-bench: {e}");
            e.exit_code()
        })
    });
    drop(runtime);
    std::process::exit(code);
}
