//! The modules of `pgmq-client/src/` import each other without a circle,
//! file by file and layer by layer.
//!
//! The crate's files are grouped in layers, folders of `src/` with a
//! `mod.rs` (`conn/`, `pgmq/`, `sdk/`); a module is a file of a layer
//! (`conn::call`, `conn::dsn` for the folder `conn/dsn/`) or of `src/`
//! itself. An edge `a -> b` is any path `crate::b` in a code line of
//! `a`'s files, comments left out: `crate::conn::call::x` names
//! `conn::call`, and a name re-exported by lib.rs and a layer's `mod.rs`
//! (`crate::Pgmq`, `crate::conn::Error`) names the module it comes from.
//! Neither the modules nor the layers (each module counted as its layer)
//! may import each other in a circle, so one concept's file never reaches
//! back into a file that builds on it, and a layer never into a layer
//! above it. Run with `--nocapture` to print both graphs.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

type Graph = BTreeMap<String, BTreeSet<String>>;

fn src() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/src"))
}

/// The folders of `src/` that are layers: those with a `mod.rs`.
fn layers() -> BTreeSet<String> {
    std::fs::read_dir(src())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.join("mod.rs").is_file())
        .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
        .collect()
}

/// The module a file of `src/` belongs to (`conn/dsn/parse.rs`:
/// `conn::dsn`, `pgmq/read.rs`: `pgmq::read`); None for lib.rs, a layer's
/// `mod.rs` (re-exports only) and the binaries.
fn module_of(rel: &Path, layers: &BTreeSet<String>) -> Option<String> {
    let parts: Vec<String> = rel
        .components()
        .map(|c| {
            c.as_os_str()
                .to_string_lossy()
                .trim_end_matches(".rs")
                .to_owned()
        })
        .collect();
    match parts.as_slice() {
        [first, ..] if first == "lib" || first == "bin" => None,
        [layer, rest @ ..] if layers.contains(layer) => match rest {
            [] => None,
            [only] if only == "mod" => None,
            [file, ..] => Some(format!("{layer}::{file}")),
        },
        [first, ..] => Some(first.clone()),
        [] => None,
    }
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The code of `text`: every line but comments.
fn code(text: &str) -> String {
    text.lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n")
}

fn ident(s: &str) -> &str {
    let end = s
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .unwrap_or(s.len());
    &s[..end]
}

/// The paths after each `crate::` in `code`, up to two names each:
/// `crate::a::x` gives `a::x`, `crate::b` gives `b`, `crate::{c::y, D}`
/// gives `c::y` and `D`.
fn crate_paths(code: &str) -> Vec<String> {
    let two = |s: &str| {
        let first = ident(s);
        match s[first.len()..].strip_prefix("::").map(ident) {
            Some(second) if !second.is_empty() => format!("{first}::{second}"),
            _ => first.to_owned(),
        }
    };
    let mut out = Vec::new();
    for (i, _) in code.match_indices("crate::") {
        if code[..i].ends_with(|c: char| c.is_ascii_alphanumeric() || c == '_') {
            continue; // `pgmq_crate::`, not this crate
        }
        let rest = &code[i + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            let mut depth = 0;
            let mut item_start = true;
            for (j, c) in group.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => break,
                    '}' => depth -= 1,
                    ',' if depth == 0 => item_start = true,
                    c if item_start && !c.is_whitespace() => {
                        out.push(two(&group[j..]));
                        item_start = false;
                    }
                    _ => {}
                }
            }
        } else {
            out.push(two(rest));
        }
    }
    out
}

/// The names `text` (lib.rs or a layer's `mod.rs`) re-exports with
/// `pub use module::{...}` (or `pub use module::Name`), with the module
/// each comes from, among `modules`.
fn reexports(text: &str, modules: &BTreeSet<String>) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for stmt in code(text).split(';') {
        let stmt = stmt.trim();
        let stmt = stmt.strip_prefix("#[doc(inline)]").unwrap_or(stmt).trim();
        let Some(rest) = stmt.strip_prefix("pub use ") else {
            continue;
        };
        let module = ident(rest);
        if !modules.contains(module) {
            continue;
        }
        let names = rest[module.len()..].trim_start_matches("::");
        let names = names.trim_start_matches('{').trim_end_matches('}');
        for name in names.split(',') {
            // `redact as redact_dsn`: the name used is the last word.
            if let Some(used) = name.split_whitespace().last() {
                out.insert(used.to_owned(), module.to_owned());
            }
        }
    }
    out
}

/// The module a path found after `crate::` names, if any: a module
/// (`conn::call`, `trace`), a layer's re-export (`conn::Error`), or a
/// re-export of lib.rs (`Pgmq`), followed to the file it comes from.
fn resolve(
    path: &str,
    modules: &BTreeSet<String>,
    root: &BTreeMap<String, String>,
    of_layer: &BTreeMap<String, BTreeMap<String, String>>,
) -> Option<String> {
    let (first, second) = match path.split_once("::") {
        Some((a, b)) => (a, Some(b)),
        None => (path, None),
    };
    if let Some(names) = of_layer.get(first) {
        let second = second?;
        let module = format!("{first}::{second}");
        if modules.contains(&module) {
            return Some(module);
        }
        return names.get(second).map(|m| format!("{first}::{m}"));
    }
    if modules.contains(first) {
        return Some(first.to_owned());
    }
    let from = root.get(first)?;
    match of_layer.get(from) {
        Some(names) => names.get(first).map(|m| format!("{from}::{m}")),
        None => Some(from.clone()),
    }
}

/// The import graph of the crate's modules.
fn graph() -> Graph {
    let layers = layers();
    let mut files = Vec::new();
    rust_files(src(), &mut files);
    let of = |f: &PathBuf| module_of(f.strip_prefix(src()).unwrap(), &layers);
    let modules: BTreeSet<String> = files.iter().filter_map(of).collect();
    // lib.rs re-exports from layers and top-level modules; a layer's
    // mod.rs from its files.
    let top: BTreeSet<String> = modules
        .iter()
        .filter(|m| !m.contains("::"))
        .cloned()
        .chain(layers.iter().cloned())
        .collect();
    let root = reexports(
        &std::fs::read_to_string(src().join("lib.rs")).unwrap(),
        &top,
    );
    let of_layer: BTreeMap<String, BTreeMap<String, String>> = layers
        .iter()
        .map(|layer| {
            let files: BTreeSet<String> = modules
                .iter()
                .filter_map(|m| m.strip_prefix(&format!("{layer}::")))
                .map(str::to_owned)
                .collect();
            let text = std::fs::read_to_string(src().join(layer).join("mod.rs")).unwrap();
            (layer.clone(), reexports(&text, &files))
        })
        .collect();
    let mut graph = Graph::new();
    for file in &files {
        let Some(from) = of(file) else {
            continue;
        };
        let text = code(&std::fs::read_to_string(file).unwrap());
        let edges = graph.entry(from.clone()).or_default();
        for path in crate_paths(&text) {
            if let Some(to) = resolve(&path, &modules, &root, &of_layer).filter(|to| *to != from) {
                edges.insert(to);
            }
        }
    }
    graph
}

/// `graph` with each module counted as its layer (`conn::call`: `conn`).
fn layer_graph(graph: &Graph) -> Graph {
    let layer = |m: &str| m.split("::").next().unwrap_or(m).to_owned();
    let mut out = Graph::new();
    for (from, to) in graph {
        let from = layer(from);
        let edges = out.entry(from.clone()).or_default();
        edges.extend(to.iter().map(|t| layer(t)).filter(|t| *t != from));
    }
    out
}

/// A circle through `start`, when there is one.
fn circle(
    graph: &Graph,
    start: &str,
    at: &str,
    path: &mut Vec<String>,
    seen: &mut BTreeSet<String>,
) -> Option<Vec<String>> {
    for next in graph.get(at).into_iter().flatten() {
        if next == start {
            let mut found = path.clone();
            found.push(start.to_owned());
            return Some(found);
        }
        if seen.insert(next.clone()) {
            path.push(next.clone());
            if let Some(found) = circle(graph, start, next, path, seen) {
                return Some(found);
            }
            path.pop();
        }
    }
    None
}

fn circles(graph: &Graph) -> Vec<String> {
    graph
        .keys()
        .filter_map(|m| circle(graph, m, m, &mut vec![m.clone()], &mut BTreeSet::new()))
        .map(|c| c.join(" -> "))
        .collect()
}

fn print(graph: &Graph) {
    for (from, to) in graph {
        let to: Vec<&str> = to.iter().map(String::as_str).collect();
        println!("{from} -> {}", to.join(", "));
    }
}

#[test]
fn the_modules_and_the_layers_import_each_other_without_a_circle() {
    let graph = graph();
    let edges: usize = graph.values().map(BTreeSet::len).sum();
    assert!(
        graph.len() >= 20 && edges >= 60,
        "too few modules or edges found, the parser is off: {graph:?}"
    );
    print(&graph);
    let layers = layer_graph(&graph);
    println!();
    print(&layers);
    let found = circles(&graph);
    assert!(found.is_empty(), "import circles:\n{}", found.join("\n"));
    let found = circles(&layers);
    assert!(
        found.is_empty(),
        "layers importing each other:\n{}",
        found.join("\n")
    );
}

#[test]
fn paths_are_read_from_code_not_comments() {
    let text = "use crate::a::x;\n// crate::b\nuse crate::{c::y, D, e::{f, g}};\nlet n = crate::h::z();\nlet m = crate::Top;";
    assert_eq!(
        crate_paths(&code(text)),
        ["a::x", "c::y", "D", "e", "h::z", "Top"]
    );
}

#[test]
fn paths_lead_to_the_files_they_name() {
    let modules: BTreeSet<String> = ["conn::call", "conn::error", "pgmq::read", "trace"]
        .map(String::from)
        .into();
    let layers: BTreeSet<String> = ["conn", "pgmq"].map(String::from).into();
    let top: BTreeSet<String> = layers.iter().cloned().chain(["trace".into()]).collect();
    let root = reexports(
        "mod conn;\n#[doc(inline)]\npub use pgmq::trace;\npub use conn::{Error, redact as redact_dsn};\npub use pgmq::Read;",
        &top,
    );
    let of_layer = BTreeMap::from([
        (
            "conn".to_owned(),
            reexports(
                "pub use error::{Error, redact};",
                &["call", "error"].map(String::from).into(),
            ),
        ),
        (
            "pgmq".to_owned(),
            reexports("pub use read::Read;", &["read"].map(String::from).into()),
        ),
    ]);
    let to = |p: &str| resolve(p, &modules, &root, &of_layer);
    assert_eq!(to("conn::call").as_deref(), Some("conn::call"));
    assert_eq!(to("conn::Error").as_deref(), Some("conn::error"));
    assert_eq!(to("Error").as_deref(), Some("conn::error"));
    assert_eq!(to("Read").as_deref(), Some("pgmq::read"));
    assert_eq!(to("trace").as_deref(), Some("trace"));
    assert_eq!(to("conn").as_deref(), None);
    assert_eq!(to("Unknown").as_deref(), None);
    let graph = Graph::from([
        ("conn::call".into(), ["conn::error".into()].into()),
        ("pgmq::read".into(), ["conn::call".into()].into()),
        ("conn::error".into(), ["pgmq::read".into()].into()),
    ]);
    assert_eq!(circles(&graph).len(), 3);
    assert_eq!(
        layer_graph(&graph),
        Graph::from([
            ("conn".into(), ["pgmq".into()].into()),
            ("pgmq".into(), ["conn".into()].into()),
        ])
    );
}
