//! The modules of `pgmq-worker/src/` import each other without a circle,
//! apart from the builder and the worker (the assembly: `build()` makes a
//! `Worker`, which the builder's methods return), and no part imports the
//! assembly: only the builder and the group (which runs several workers)
//! import `worker`, only `worker` imports `builder`. How the graph is
//! read: `pgmq_testkit::modgraph`.

use pgmq_testkit::modgraph::ModuleGraph;

#[test]
fn the_worker_modules_import_each_other_without_a_circle() {
    let graph = ModuleGraph::of_crate(env!("CARGO_MANIFEST_DIR"));
    assert!(
        graph.len() >= 20 && graph.edge_count() >= 30,
        "too few modules or edges found, the reader is off:\n{graph}"
    );
    graph.assert_no_circle(&["builder", "worker"]);
    graph.assert_imported_only_by("worker", &["builder", "group"]);
    graph.assert_imported_only_by("builder", &["worker"]);
}
