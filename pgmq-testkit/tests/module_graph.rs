//! The modules of `pgmq-testkit/src/` import each other without a
//! circle (how the graph is read: the crate's own `modgraph`).

use pgmq_testkit::modgraph::ModuleGraph;

#[test]
fn the_testkit_modules_import_each_other_without_a_circle() {
    let graph = ModuleGraph::of_crate(env!("CARGO_MANIFEST_DIR"));
    assert!(
        graph.len() >= 5,
        "too few modules found, the reader is off:\n{graph}"
    );
    println!("{graph}");
    graph.assert_no_circle(&[]);
}
