//! The modules of `pgmq-faults/src/` import each other without a circle:
//! the campaign's parts (plan, workload, slots, nemesis, watch, fleet,
//! invariants) take what they share from `campaign::model`, never from
//! the runner (`campaign/mod.rs`), and the scenarios take theirs from
//! `scenarios::run`, never from their table. (The folders are groups,
//! not layers: the report records the campaign's seeds, and the campaign
//! writes report rows.) How the graph is read:
//! `pgmq_testkit::modgraph`.

use pgmq_testkit::modgraph::ModuleGraph;

#[test]
fn the_fault_suite_modules_import_each_other_without_a_circle() {
    let graph = ModuleGraph::of_crate(env!("CARGO_MANIFEST_DIR"));
    assert!(
        graph.len() >= 20 && graph.edge_count() >= 40,
        "too few modules or edges found, the reader is off:\n{graph}"
    );
    graph.assert_no_circle(&[]);
    // The runners: nothing imports them but the crate's front.
    graph.assert_imported_only_by("campaign", &["cli", "report"]);
    graph.assert_imported_only_by("scenarios", &["cli", "campaign::nemesis"]);
}
