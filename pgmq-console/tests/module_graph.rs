//! The modules of `pgmq-console/src/` import each other without a circle
//! (how the graph is read: pgmq-testkit's `modgraph`), so that a page, the
//! layout, the charts and the safety checks can each change on their own.

use pgmq_testkit::modgraph::ModuleGraph;

#[test]
fn the_console_modules_import_each_other_without_a_circle() {
    let graph = ModuleGraph::of_crate(env!("CARGO_MANIFEST_DIR"));
    assert!(
        graph.len() >= 6,
        "too few modules found, the reader is off:\n{graph}"
    );
    println!("{graph}");
    graph.assert_no_circle(&[]);
}
