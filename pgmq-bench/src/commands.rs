//! The non-benchmark subcommands: read documents, print Markdown on stdout,
//! return the exit status.

use crate::cli::{CheckArgs, CheckMemoryArgs, CompareArgs, ReportArgs};
use crate::document::Document;
use crate::error::{Error, Result};
use crate::report::{check, compare, markdown, svg};

/// `report`: the Markdown summary on stdout, the SVG chart to `--svg`.
pub async fn report(args: ReportArgs) -> Result<i32> {
    let doc = Document::read(&args.run).await?;
    print!("{}", markdown::render(&doc));
    if let Some(path) = &args.svg {
        tokio::fs::write(path, svg::render(&doc))
            .await
            .map_err(|e| Error::io(format!("writing {}", path.display()), e))?;
    }
    Ok(0)
}

/// `compare`: the table on stdout; 1 on a regression.
pub async fn compare(args: CompareArgs) -> Result<i32> {
    let old = Document::read(&args.old).await?;
    let new = Document::read(&args.new).await?;
    let (text, regressed) = compare::compare(&old, &new, args.threshold)?;
    print!("{text}");
    Ok(i32::from(regressed))
}

/// `check`: the targets table on stdout; 1 when one is missed. A document
/// whose run failed (`outcome.ok` false) is refused (exit 2).
pub async fn check(args: CheckArgs) -> Result<i32> {
    let doc = Document::read(&args.run).await?;
    compare::refuse_failed(&doc, &args.run.display().to_string())?;
    let (text, code) = check::check(&doc, &args.require);
    print!("{text}");
    Ok(code)
}

/// `check-memory`: the memory target from two documents; 1 when missed.
pub async fn check_memory(args: CheckMemoryArgs) -> Result<i32> {
    let small = Document::read(&args.small).await?;
    let large = Document::read(&args.large).await?;
    let (text, code) = check::check_memory(&small, &large, args.max_mib, args.tolerance_pct);
    print!("{text}");
    Ok(code)
}
