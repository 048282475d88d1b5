//! The non-benchmark subcommands: read documents, print Markdown on stdout,
//! return the exit status.

use crate::cli::{AggregateArgs, CheckArgs, CheckMemoryArgs, CompareArgs, ReportArgs, SummaryArgs};
use crate::document::{Document, Figure, MemorySummary, Sample, Sections};
use crate::error::{Error, Result};
use crate::report::{check, compare, markdown, summary as short, svg};

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

/// `compare`: the table (or with `--markdown` the headline verdicts) on
/// stdout; 1 on a regression.
pub async fn compare(args: CompareArgs) -> Result<i32> {
    let old = Document::read(&args.old).await?;
    let new = Document::read(&args.new).await?;
    let (text, regressed) = if args.markdown {
        let names = (
            args.old.display().to_string(),
            args.new.display().to_string(),
        );
        compare::headline(&old, &new, args.threshold, (&names.0, &names.1))?
    } else {
        compare::compare(&old, &new, args.threshold)?
    };
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

/// `summary`: the document's summary as JSON, or with `--markdown` the short
/// Markdown, to a file or standard output.
pub async fn summary(args: SummaryArgs) -> Result<i32> {
    let doc = Document::read(&args.run).await?;
    let text = if args.markdown {
        short::markdown(&doc)
    } else {
        let mut json = serde_json::to_string_pretty(&doc.summary())
            .map_err(|e| Error::json("the summary", e))?;
        json.push('\n');
        json
    };
    match &args.output {
        Some(path) => tokio::fs::write(path, text)
            .await
            .map_err(|e| Error::io(format!("writing {}", path.display()), e))?,
        None => print!("{text}"),
    }
    Ok(0)
}

/// `schema`: the benchmark.v1 document's JSON Schema on stdout.
pub fn schema() -> Result<i32> {
    let text = serde_json::to_string_pretty(&crate::sections::schema())
        .map_err(|e| Error::json("the schema", e))?;
    println!("{text}");
    Ok(0)
}

/// `check-memory`: the memory target from two documents; 1 when missed.
pub async fn check_memory(args: CheckMemoryArgs) -> Result<i32> {
    let small = Document::read(&args.small).await?;
    let large = Document::read(&args.large).await?;
    let (text, code) = check::check_memory(&small, &large, args.max_mib, args.tolerance_pct);
    print!("{text}");
    Ok(code)
}

/// `aggregate`: N invocations' documents merged into one that keeps every
/// run (`invocations`, each document whole) and whose figures hold one value
/// per invocation: that invocation's median. `compare` then tests the
/// per-invocation medians (Mann-Whitney with 5 or more a side).
pub async fn aggregate(args: AggregateArgs) -> Result<i32> {
    let mut docs = Vec::new();
    for p in &args.runs {
        docs.push(Document::read(p).await?);
    }
    let doc = aggregate_documents(&docs)?;
    crate::run::write_document(&doc, &args.output).await?;
    eprintln!(
        "pgmq-bench aggregate: {} invocations -> {} ({})",
        docs.len(),
        args.output.display(),
        if doc.outcome.ok { "ok" } else { "FAILED" }
    );
    Ok(if doc.outcome.ok { 0 } else { 1 })
}

/// The merge behind `aggregate`.
pub fn aggregate_documents(docs: &[Document]) -> Result<Document> {
    let first = mergeable_first(docs)?;
    let mut out = first.clone();
    out.metadata.started_at = docs
        .iter()
        .map(|d| d.metadata.started_at)
        .min()
        .unwrap_or(out.metadata.started_at);
    out.metadata.finished_at = docs
        .iter()
        .map(|d| d.metadata.finished_at)
        .max()
        .unwrap_or(out.metadata.finished_at);
    merge_outcomes(&mut out, first, docs);
    out.figures = per_invocation_figures(first, docs);
    out.protocol.invocations = Some(docs.len() as u32);
    out.protocol.statistic = format!(
        "median over {} invocations of each invocation's median over its measured rounds",
        docs.len()
    );
    out.protocol.spread = "min and max over the invocations' medians, each kept in figures[].runs (round = \
                           invocation index); every invocation's whole document is in `invocations`"
        .into();
    out.memory = merged_memory(first, docs);
    out.sections = Sections::default();
    out.targets = check::evaluate(&out);
    out.invocations = docs
        .iter()
        .map(|d| serde_json::to_value(d).map_err(|e| Error::json("an invocation", e)))
        .collect::<Result<Vec<_>>>()?;
    Ok(out)
}

/// The first of `docs`, once they are known to be two or more
/// single-invocation documents.
fn mergeable_first(docs: &[Document]) -> Result<&Document> {
    let Some(first) = docs.first() else {
        return Err(Error::Config("aggregate needs documents".into()));
    };
    if docs.len() < 2 {
        return Err(Error::Config("aggregate needs at least 2 documents".into()));
    }
    if docs.iter().any(|d| !d.invocations.is_empty()) {
        return Err(Error::Refused(
            "aggregate takes single-invocation documents, not aggregates".into(),
        ));
    }
    Ok(first)
}

/// `out`'s outcome from every invocation's: their failures and warnings
/// prefixed with the invocation, a failure for a durability class other than
/// the first's, a warning for each other recorded condition that differs.
fn merge_outcomes(out: &mut Document, first: &Document, docs: &[Document]) {
    out.outcome.failures.clear();
    out.outcome.warnings.clear();
    for (i, d) in docs.iter().enumerate() {
        for f in &d.outcome.failures {
            out.outcome.failures.push(format!("invocation {i}: {f}"));
        }
        for w in &d.outcome.warnings {
            out.outcome.warnings.push(format!("invocation {i}: {w}"));
        }
        if d.durability.class != first.durability.class {
            out.outcome.failures.push(format!(
                "invocation {i}: durability class differs from invocation 0's"
            ));
        }
        for (k, a, b) in compare::differences(first, d) {
            if !compare::measured_condition(&k) {
                out.outcome
                    .warnings
                    .push(format!("invocation {i}: {k} is {b}, invocation 0's is {a}"));
            }
        }
    }
    out.outcome.ok = out.outcome.failures.is_empty();
}

/// One value per invocation (its median) for each figure every invocation
/// has.
fn per_invocation_figures(first: &Document, docs: &[Document]) -> Vec<Figure> {
    first
        .figures
        .iter()
        .filter_map(|f0| {
            let runs: Vec<Sample> = docs
                .iter()
                .enumerate()
                .map(|(i, d)| d.figure(&f0.id).map(|f| Sample::value(i as u32, f.median)))
                .collect::<Option<Vec<Sample>>>()?;
            Figure::from_runs(
                f0.id.clone(),
                f0.section.clone(),
                f0.label.clone(),
                f0.unit.clone(),
                f0.better,
                format!(
                    "{} Aggregate: one value per invocation, that invocation's median; the figure's median is \
                     the median of those.",
                    f0.definition
                ),
                runs,
            )
        })
        .collect()
}

/// The largest peak of any invocation, overall and per section.
fn merged_memory(first: &Document, docs: &[Document]) -> MemorySummary {
    MemorySummary {
        method: first.memory.method.clone(),
        overall_peak_rss_bytes: docs
            .iter()
            .map(|d| d.memory.overall_peak_rss_bytes)
            .max()
            .unwrap_or(0),
        per_section: {
            let mut m = std::collections::BTreeMap::new();
            for d in docs {
                for (k, v) in &d.memory.per_section {
                    let e = m.entry(k.clone()).or_insert(0u64);
                    *e = (*e).max(*v);
                }
            }
            m
        },
    }
}
