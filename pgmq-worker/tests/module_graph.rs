//! The modules of `pgmq-worker/src/` import each other without a circle,
//! apart from the builder and the worker (the assembly: `build()` makes a
//! `Worker`, which the builder's methods return), and no part imports the
//! assembly.
//!
//! An edge is a path in code (not in comments) that names another module:
//! `use crate::lease::Leases`, `crate::metrics::run(..)`, the items of
//! `use crate::{claimer, completer}`, `super::lease` in a file module, and
//! a name the crate root re-exports (`crate::Hook` is an edge to `hooks`).

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// The modules exempt from the no-circle rule: the builder and the
/// assembly, which name each other.
const ASSEMBLY: [&str; 2] = ["builder", "worker"];

/// Who may import the assembly (`worker`): the builder, and the group,
/// which runs several workers.
const MAY_IMPORT_WORKER: [&str; 2] = ["builder", "group"];

type Graph = BTreeMap<String, BTreeSet<String>>;

/// `text` without its comments (`//` to the end of the line, which also
/// drops doc comments and their intra-doc links).
fn code_of(text: &str) -> String {
    text.lines()
        .map(|line| match line.find("//") {
            Some(i) => &line[..i],
            None => line,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The leading identifier of `s`.
fn ident(s: &str) -> &str {
    let end = s
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .unwrap_or(s.len());
    &s[..end]
}

/// The text inside the braces `s` starts with, and what follows them.
fn braced(s: &str) -> (&str, &str) {
    let mut depth = 0;
    for (i, c) in s.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => {
                depth -= 1;
                if depth == 0 {
                    return (&s[1..i], &s[i + 1..]);
                }
            }
            _ => {}
        }
    }
    (&s[1..], "")
}

/// The first segment of every top-level item of a `{a, b::c, d::{e}}` list.
fn group_heads(inner: &str) -> Vec<String> {
    let mut heads = Vec::new();
    let mut depth = 0;
    let mut start = 0;
    for (i, c) in inner.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                heads.push(ident(inner[start..i].trim()).to_owned());
                start = i + 1;
            }
            _ => {}
        }
    }
    heads.push(ident(inner[start..].trim()).to_owned());
    heads.retain(|h| !h.is_empty() && h != "self");
    heads
}

/// The names a path through `prefix` (`crate::` or `super::`) leads to
/// first, in `code`.
fn heads_after(code: &str, prefix: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = code;
    while let Some(i) = rest.find(prefix) {
        let before = rest[..i].chars().next_back();
        let after = &rest[i + prefix.len()..];
        rest = after;
        // `pgmq_client::crate_x` and the like are not this crate's paths.
        if before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':') {
            continue;
        }
        if after.starts_with('{') {
            let (inner, tail) = braced(after);
            out.extend(group_heads(inner));
            rest = tail;
        } else {
            out.push(ident(after).to_owned());
        }
    }
    out
}

/// The crate root's re-exports: item name to the module it comes from
/// (`pub use hooks::Hook;`, `pub use handle::{Monitor, WorkerHandle};`).
fn reexports(lib: &str) -> BTreeMap<String, String> {
    let mut map = BTreeMap::new();
    for stmt in code_of(lib).split(';') {
        let Some(path) = stmt.trim().strip_prefix("pub use ") else {
            continue;
        };
        let module = ident(path);
        let Some(items) = path[module.len()..].strip_prefix("::") else {
            continue;
        };
        let names = if items.starts_with('{') {
            group_heads(braced(items).0)
        } else {
            vec![items.rsplit("::").next().unwrap_or(items).to_owned()]
        };
        for name in names {
            map.insert(name, module.to_owned());
        }
    }
    map
}

/// The import graph of the crate whose files are `files` (module name to
/// source text, `lib` among them).
fn graph(files: &BTreeMap<String, String>) -> Graph {
    let modules: BTreeSet<&str> = files.keys().map(String::as_str).collect();
    let names = files.get("lib").map(|l| reexports(l)).unwrap_or_default();
    let mut g = Graph::new();
    for (module, text) in files {
        if module == "lib" {
            continue;
        }
        let code = code_of(text);
        let mut heads = heads_after(&code, "crate::");
        // In a file module `super` is the crate root; in its `mod tests`
        // it is the file itself, whose own items are no module.
        heads.extend(heads_after(&code, "super::"));
        let edges = g.entry(module.clone()).or_default();
        for head in heads {
            let target = if modules.contains(head.as_str()) {
                Some(head)
            } else {
                names.get(&head).cloned()
            };
            if let Some(t) = target.filter(|t| t != module && t != "lib") {
                edges.insert(t);
            }
        }
    }
    g
}

/// A circle among the modules not in `exempt`, as `a -> b -> a`.
fn circle(g: &Graph, exempt: &[&str]) -> Option<String> {
    fn visit(
        g: &Graph,
        exempt: &[&str],
        node: &str,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<String> {
        if let Some(at) = path.iter().position(|p| p == node) {
            let mut c = path[at..].to_vec();
            c.push(node.to_owned());
            return Some(c.join(" -> "));
        }
        if done.contains(node) {
            return None;
        }
        path.push(node.to_owned());
        for next in g.get(node).into_iter().flatten() {
            if exempt.contains(&next.as_str()) {
                continue;
            }
            if let Some(c) = visit(g, exempt, next, path, done) {
                return Some(c);
            }
        }
        path.pop();
        done.insert(node.to_owned());
        None
    }
    let mut done = BTreeSet::new();
    for node in g.keys().filter(|n| !exempt.contains(&n.as_str())) {
        if let Some(c) = visit(g, exempt, node, &mut Vec::new(), &mut done) {
            return Some(c);
        }
    }
    None
}

fn worker_sources() -> BTreeMap<String, String> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "rs"))
        .map(|p| {
            let name = p.file_stem().unwrap().to_string_lossy().into_owned();
            (name, std::fs::read_to_string(&p).unwrap())
        })
        .collect()
}

#[test]
fn the_worker_modules_import_each_other_without_a_circle() {
    let files = worker_sources();
    assert!(files.len() >= 20, "src read wrong: {:?}", files.keys());
    let g = graph(&files);
    let edges: usize = g.values().map(BTreeSet::len).sum();
    assert!(edges >= 30, "too few edges found, the parser is off: {g:?}");
    if let Some(c) = circle(&g, &ASSEMBLY) {
        panic!("a circle in pgmq-worker's imports: {c}\n{g:#?}");
    }
    let importers: Vec<&String> = g
        .iter()
        .filter(|(m, to)| to.contains("worker") && !MAY_IMPORT_WORKER.contains(&m.as_str()))
        .map(|(m, _)| m)
        .collect();
    assert!(
        importers.is_empty(),
        "parts import the assembly (worker.rs): {importers:?}"
    );
    let builder_importers: Vec<&String> = g
        .iter()
        .filter(|(m, to)| to.contains("builder") && !ASSEMBLY.contains(&m.as_str()))
        .map(|(m, _)| m)
        .collect();
    assert!(
        builder_importers.is_empty(),
        "parts import the builder: {builder_importers:?}"
    );
}

#[test]
fn the_parser_finds_every_kind_of_edge_and_a_circle() {
    let files: BTreeMap<String, String> = [
        ("lib", "mod a;\npub use c::{Thing, Other};\npub use d::Item;\n"),
        (
            "a",
            "//! [`x`](crate::z)\nuse crate::{b, c::X as Y};\nfn f() { crate::e::g(); let _ = pgmq_client::crate_x; }\n",
        ),
        ("b", "use super::d;\nfn h(_: crate::Thing) {}\n"),
        ("c", "// use crate::a;\nmod tests { use super::*; }\n"),
        ("d", "use crate::Item;\n"),
        ("e", "use crate::a::F;\n"),
        ("z", ""),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v.to_owned()))
    .collect();
    let g = graph(&files);
    let to = |m: &str| g[m].iter().map(String::as_str).collect::<Vec<_>>();
    assert_eq!(to("a"), ["b", "c", "e"]);
    assert_eq!(to("b"), ["c", "d"]);
    assert!(to("c").is_empty() && to("d").is_empty());
    assert_eq!(circle(&g, &[]).as_deref(), Some("a -> e -> a"));
    assert_eq!(circle(&g, &["e"]), None);
}
