//! The modules of `pgmq-client/src/` import each other without a circle.
//!
//! An edge `a -> b` is any path `crate::b` (or `crate::Name` re-exported
//! from `b` in lib.rs) in a code line of `a`'s files, comments left out, so
//! one concept's file never reaches back into a file that builds on it. Run
//! with `--nocapture` to print the graph.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

fn src() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/src"))
}

/// The top-level module a file of `src/` belongs to (`dsn/parse.rs`: `dsn`);
/// None for lib.rs and the binaries.
fn module_of(rel: &Path) -> Option<String> {
    let first = rel.components().next()?.as_os_str().to_string_lossy();
    if first == "lib.rs" || first == "bin" {
        return None;
    }
    Some(first.trim_end_matches(".rs").to_owned())
}

fn rust_files(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
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

/// The first names after each `crate::` in `code`: `crate::a::x` gives `a`,
/// `crate::{a::x, B}` gives `a` and `B`.
fn crate_paths(code: &str) -> Vec<String> {
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
                        out.push(ident(&group[j..]).to_owned());
                        item_start = false;
                    }
                    _ => {}
                }
            }
        } else {
            out.push(ident(rest).to_owned());
        }
    }
    out
}

/// Names lib.rs re-exports, with the module each comes from.
fn reexports(lib: &str, modules: &BTreeSet<String>) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let lib = code(lib);
    for stmt in lib.split(';') {
        let Some(rest) = stmt.trim().strip_prefix("pub use ") else {
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

fn graph() -> BTreeMap<String, BTreeSet<String>> {
    let mut files = Vec::new();
    rust_files(src(), &mut files);
    let modules: BTreeSet<String> = files
        .iter()
        .filter_map(|f| module_of(f.strip_prefix(src()).unwrap()))
        .collect();
    let lib = std::fs::read_to_string(src().join("lib.rs")).unwrap();
    let names = reexports(&lib, &modules);
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for file in &files {
        let Some(from) = module_of(file.strip_prefix(src()).unwrap()) else {
            continue;
        };
        let text = code(&std::fs::read_to_string(file).unwrap());
        let edges = graph.entry(from.clone()).or_default();
        for name in crate_paths(&text) {
            let to = if modules.contains(&name) {
                Some(name)
            } else {
                names.get(&name).cloned()
            };
            if let Some(to) = to.filter(|to| *to != from) {
                edges.insert(to);
            }
        }
    }
    graph
}

/// A circle through `start`, when there is one.
fn circle(
    graph: &BTreeMap<String, BTreeSet<String>>,
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

#[test]
fn the_modules_import_each_other_without_a_circle() {
    let graph = graph();
    for (from, to) in &graph {
        let to: Vec<&str> = to.iter().map(String::as_str).collect();
        println!("{from} -> {}", to.join(", "));
    }
    let circles: Vec<String> = graph
        .keys()
        .filter_map(|m| circle(&graph, m, m, &mut vec![m.clone()], &mut BTreeSet::new()))
        .map(|c| c.join(" -> "))
        .collect();
    assert!(
        circles.is_empty(),
        "import circles:\n{}",
        circles.join("\n")
    );
}

#[test]
fn paths_are_read_from_code_not_comments() {
    let text =
        "use crate::a::x;\n// crate::b\nuse crate::{c::y, D, e::{f, g}};\nlet n = crate::h::z();";
    assert_eq!(crate_paths(&code(text)), ["a", "c", "D", "e", "h"]);
}
