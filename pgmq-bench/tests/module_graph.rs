//! The modules of `pgmq-bench/src/` import each other without a circle,
//! apart from the registry and the settings it declares: the registry
//! (`sections/mod.rs`) lists every section with the options its file
//! declares, and the run's checked settings (`config`) are built from
//! those options, which each section then reads (`ctx.cfg.options.<it>`):
//! a builder and its product, like the worker's. Around that pair the
//! sections use the shared machinery (`kit/`) and the document's types,
//! never each other, and only the front of the benchmark (its command
//! line, settings, run, commands and reports) reaches the registry. How the graph
//! is read: `pgmq_testkit::modgraph`.

use pgmq_testkit::modgraph::ModuleGraph;

/// The registry and the settings built from it, which name each other.
const ASSEMBLY: [&str; 2] = ["sections", "config"];

#[test]
fn the_benchmark_modules_import_each_other_without_a_circle() {
    let graph = ModuleGraph::of_crate(env!("CARGO_MANIFEST_DIR"));
    assert!(
        graph.len() >= 30 && graph.edge_count() >= 60,
        "too few modules or edges found, the reader is off:\n{graph}"
    );
    graph.assert_no_circle(&ASSEMBLY);
    graph.assert_imported_only_by(
        "sections",
        &[
            "cli",
            "config",
            "run",
            "commands",
            "checks",
            "report::check",
            "report::markdown",
        ],
    );
    for module in graph.edges().keys() {
        if let Some(section) = module.strip_prefix("sections::") {
            let others: Vec<&str> = graph
                .imports(module)
                .into_iter()
                .filter(|m| {
                    m.starts_with("sections::")
                        && !["sections::section", "sections::plan"].contains(m)
                })
                .collect();
            assert!(
                others.is_empty(),
                "the section file {section} imports other sections {others:?}: \
                 what they share belongs in kit/ or the document"
            );
        }
    }
}
