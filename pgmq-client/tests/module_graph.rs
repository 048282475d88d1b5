//! The modules of `pgmq-client/src/` import each other without a circle,
//! file by file and layer by layer.
//!
//! The crate's files are grouped in layers, folders of `src/` with a
//! `mod.rs` (`conn/`: the connection and call path, `pgmq/`: PGMQ's
//! functions, `sdk/`: the SDK's own schema features); a module is a file
//! of a layer or of `src/` itself (how the graph is read:
//! `pgmq_testkit::modgraph`). Neither the modules nor the layers may
//! import each other in a circle, so one concept's file never reaches
//! back into a file that builds on it, and a layer never into a layer
//! above it. Run with `--nocapture` to print both graphs.

use pgmq_testkit::modgraph::ModuleGraph;

#[test]
fn the_modules_and_the_layers_import_each_other_without_a_circle() {
    let graph = ModuleGraph::of_crate(env!("CARGO_MANIFEST_DIR"));
    assert!(
        graph.len() >= 20 && graph.edge_count() >= 60,
        "too few modules or edges found, the reader is off:\n{graph}"
    );
    let layers = graph.layers();
    println!("{graph}\n{layers}");
    assert_eq!(
        layers.len(),
        3,
        "every file of src/ is in a layer:\n{layers}"
    );
    graph.assert_no_circle(&[]);
    layers.assert_no_circle(&[]);
}
