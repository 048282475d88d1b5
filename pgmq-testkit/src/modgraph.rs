//! The import graph of a crate's modules, read from its `src/`, for the
//! workspace's `tests/module_graph.rs` tests: each crate states its own
//! rule (no circle; which modules may import which) in a few lines on top
//! of this reader.
//!
//! **Modules.** A module is a file of `src/` (`worker.rs`: `worker`), or a
//! file of a *layer*, a folder of `src/` with a `mod.rs` (`conn/call.rs`:
//! `conn::call`; a folder inside a layer is one module with all its files:
//! `conn/dsn/parse.rs` is `conn::dsn`). A folder of `src/` without a
//! `mod.rs` belongs to the file of its name (`sections/x.rs` beside
//! `sections.rs`: `sections`). The crate root (`lib.rs`, `main.rs`), a
//! layer's `mod.rs` and `src/bin/` are no modules: they only declare and
//! re-export.
//!
//! **Edges.** An edge `a -> b` is a path in the code of `a`'s files
//! (comments left out, so docs and intra-doc links may name anything)
//! that leads to `b`: `crate::b::x`, every item of a use tree
//! (`use crate::{b, c::{d, e}}`), `super::b` (relative to the file:
//! the crate root in `src/x.rs`, the layer in `conn/call.rs`), and a name
//! the crate root or a layer's `mod.rs` re-exports (`crate::Pgmq`,
//! `crate::conn::Error`), followed to the file it comes from.
//!
//! **Circles.** [`ModuleGraph::circles`] finds, for every module on a
//! circle, the shortest circle through it (each circle named once, as
//! `a -> b -> a`), so no module on a circle goes unnamed;
//! [`ModuleGraph::layers`] is the graph with each module counted as its
//! layer, to check the layers too.
//!
//! A crate's test:
//!
//! ```
//! use pgmq_testkit::modgraph::ModuleGraph;
//!
//! // In a crate's tests/module_graph.rs:
//! //     let graph = ModuleGraph::of_crate(env!("CARGO_MANIFEST_DIR"));
//! // Here, a crate of three files, two of which import each other:
//! let graph = ModuleGraph::from_files(
//!     "example",
//!     [
//!         ("lib.rs", "mod a;\nmod b;\nmod c;\npub use c::Thing;"),
//!         ("a.rs", "use crate::b::run;\n/// Unlike [`crate::c`], ...\npub fn go() {}"),
//!         ("b.rs", "use crate::{a, Thing};\npub fn run() {}"),
//!         ("c.rs", "pub struct Thing;"),
//!     ],
//! );
//! assert_eq!(graph.imports("b"), ["a", "c"]);
//! assert_eq!(graph.imports("a"), ["b"]);
//! // Guard the parser: a test that finds no edge passes for nothing.
//! assert!(graph.len() >= 3 && graph.edge_count() >= 3);
//! // The circle, named; `assert_no_circle` panics with the same text.
//! assert_eq!(graph.circle_lines(&[]), ["a -> b -> a"]);
//! let failed = std::panic::catch_unwind(|| graph.assert_no_circle(&[]));
//! assert!(failed.is_err());
//! // A circle through an exempt module (a builder and its product) is allowed.
//! graph.assert_no_circle(&["b"]);
//! // Who may import a module.
//! assert_eq!(graph.importers_of("c"), ["b"]);
//! graph.assert_imported_only_by("c", &["b"]);
//! ```

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::{Path, PathBuf};

/// Module name to the modules it imports.
pub type Graph = BTreeMap<String, BTreeSet<String>>;

/// The import graph of one crate's modules (see the [module docs](self)).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModuleGraph {
    name: String,
    edges: Graph,
}

/// Every `.rs` file under `dir`, as its path relative to `dir` and its
/// text, sorted by path. Panics when `dir` cannot be read: this is a test
/// helper, and a missing source tree is the test's failure.
pub fn rust_files(dir: impl AsRef<Path>) -> Vec<(PathBuf, String)> {
    fn walk(root: &Path, dir: &Path, out: &mut Vec<(PathBuf, String)>) {
        let entries =
            std::fs::read_dir(dir).unwrap_or_else(|e| panic!("cannot read {}: {e}", dir.display()));
        for entry in entries {
            let path = entry
                .unwrap_or_else(|e| panic!("cannot read {}: {e}", dir.display()))
                .path();
            if path.is_dir() {
                walk(root, &path, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let text = std::fs::read_to_string(&path)
                    .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
                let rel = path.strip_prefix(root).unwrap_or(&path).to_path_buf();
                out.push((rel, text));
            }
        }
    }
    let dir = dir.as_ref();
    let mut out = Vec::new();
    walk(dir, dir, &mut out);
    out.sort();
    out
}

/// Rust source `text` with its comments (`//` to the end of the line,
/// doc comments, nested `/* */`) blanked out; string and char literals
/// are kept, and every newline stays where it was, so line `n` of the
/// result is line `n` of `text`.
///
/// ```
/// let code = pgmq_testkit::modgraph::strip_comments(
///     "let a = \"// kept\"; // gone\n/* gone\n */ let b = '/';",
/// );
/// let lines: Vec<&str> = code.lines().map(str::trim_end).collect();
/// assert_eq!(lines, ["let a = \"// kept\";", "", "    let b = '/';"]);
/// ```
pub fn strip_comments(text: &str) -> String {
    let s: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let blank = |out: &mut String, c: char| out.push(if c == '\n' { '\n' } else { ' ' });
    let ident = |c: char| c.is_alphanumeric() || c == '_';
    let mut i = 0;
    while i < s.len() {
        let c = s[i];
        let next = s.get(i + 1).copied();
        if c == '/' && next == Some('/') {
            while i < s.len() && s[i] != '\n' {
                blank(&mut out, s[i]);
                i += 1;
            }
        } else if c == '/' && next == Some('*') {
            let mut depth = 0;
            while i < s.len() {
                if s[i] == '/' && s.get(i + 1) == Some(&'*') {
                    depth += 1;
                    out.push_str("  ");
                    i += 2;
                } else if s[i] == '*' && s.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    out.push_str("  ");
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    blank(&mut out, s[i]);
                    i += 1;
                }
            }
        } else if c == '\'' {
            // A char literal ('x', '\'', '"', '\u{1F600}') or a lifetime ('a).
            let end = if next == Some('\\') {
                let mut j = i + 3;
                while j < s.len() && s[j] != '\'' {
                    j += 1;
                }
                j + 1
            } else if s.get(i + 2) == Some(&'\'') {
                i + 3
            } else {
                i + 1
            };
            let end = end.min(s.len());
            out.extend(&s[i..end]);
            i = end;
        } else if ident(c) {
            let start = i;
            while i < s.len() && ident(s[i]) {
                i += 1;
            }
            out.extend(&s[start..i]);
            let word: String = s[start..i].iter().collect();
            if !matches!(word.as_str(), "r" | "b" | "br" | "c" | "cr") {
                continue;
            }
            let mut hashes = 0;
            if word.ends_with('r') {
                while s.get(i + hashes) == Some(&'#') {
                    hashes += 1;
                }
            }
            if s.get(i + hashes) != Some(&'"') {
                continue;
            }
            let end = if word.ends_with('r') {
                raw_string_end(&s, i + hashes + 1, hashes)
            } else {
                string_end(&s, i + 1)
            };
            out.extend(&s[i..end]);
            i = end;
        } else if c == '"' {
            let end = string_end(&s, i + 1);
            out.extend(&s[i..end]);
            i = end;
        } else {
            out.push(c);
            i += 1;
        }
    }
    out
}

/// The index after the closing quote of a plain string whose text starts
/// at `start`.
fn string_end(s: &[char], start: usize) -> usize {
    let mut i = start;
    while i < s.len() {
        match s[i] {
            '"' => return i + 1,
            '\\' => i += 2,
            _ => i += 1,
        }
    }
    s.len()
}

/// The index after the closing quote and `hashes` `#`s of a raw string
/// whose text starts at `start`.
fn raw_string_end(s: &[char], start: usize, hashes: usize) -> usize {
    let mut i = start;
    while i < s.len() {
        if s[i] == '"' && (1..=hashes).all(|k| s.get(i + k) == Some(&'#')) {
            return i + 1 + hashes;
        }
        i += 1;
    }
    s.len()
}

/// The leading identifier of `s`.
fn ident(s: &str) -> &str {
    let end = s
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .unwrap_or(s.len());
    &s[..end]
}

/// The text inside the braces `s` starts with.
fn braced(s: &str) -> &str {
    let mut depth = 0;
    for (i, c) in s.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => {
                depth -= 1;
                if depth == 0 {
                    return &s[1..i];
                }
            }
            _ => {}
        }
    }
    &s[1..]
}

/// One leaf of a use tree or path: its segments (`self` left out) and
/// the name it is used by (`as` alias, else the last segment).
#[derive(Debug)]
struct UsePath {
    segments: Vec<String>,
    name: Option<String>,
}

/// The leaves of the path or use tree `s` starts with, each after
/// `prefix`: `a::{b, c::{d as e}}` gives `a::b` and `a::c::d` (used as `e`).
fn use_paths(s: &str, prefix: Vec<String>, out: &mut Vec<UsePath>) {
    let s = s.trim_start();
    if s.starts_with('{') {
        let inner = braced(s);
        let mut depth = 0;
        let mut start = 0;
        for (i, c) in inner.char_indices() {
            match c {
                '{' => depth += 1,
                '}' => depth -= 1,
                ',' if depth == 0 => {
                    use_paths(&inner[start..i], prefix.clone(), out);
                    start = i + 1;
                }
                _ => {}
            }
        }
        if !inner[start..].trim().is_empty() {
            use_paths(&inner[start..], prefix, out);
        }
        return;
    }
    let id = ident(s);
    if id.is_empty() {
        out.push(UsePath {
            name: prefix.last().cloned(),
            segments: prefix,
        });
        return;
    }
    let mut segments = prefix;
    if id != "self" {
        segments.push(id.to_owned());
    }
    let rest = s[id.len()..].trim_start();
    if let Some(rest) = rest.strip_prefix("::") {
        use_paths(rest, segments, out);
        return;
    }
    let alias = rest
        .strip_prefix("as ")
        .map(|a| ident(a.trim_start()).to_owned());
    out.push(UsePath {
        name: alias.or_else(|| segments.last().cloned()),
        segments,
    });
}

/// Every path in `code` that starts with `crate::` or `super::`, as
/// absolute segments from the crate root; `at` is the module path of the
/// file (`["conn", "call"]` for `conn/call.rs`), which `super` climbs from.
fn crate_paths(code: &str, at: &[String]) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    for keyword in ["crate::", "super::"] {
        for (i, _) in code.match_indices(keyword) {
            let before = code[..i].chars().next_back();
            // `pgmq_crate::`, `super::super::` (read from the first), `a::crate`.
            if before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':') {
                continue;
            }
            let mut leaves = Vec::new();
            use_paths(&code[i..], Vec::new(), &mut leaves);
            for leaf in leaves {
                // `use super::*` is a test module's import of the file it
                // is in (the reader does not follow inline modules).
                if keyword == "super::" && leaf.segments == ["super"] {
                    continue;
                }
                let mut segments = leaf.segments.into_iter().peekable();
                let absolute = if segments.next_if(|s| s == "crate").is_some() {
                    segments.collect()
                } else {
                    let mut base = at.to_vec();
                    while segments.next_if(|s| s == "super").is_some() {
                        base.pop();
                    }
                    base.extend(segments);
                    base
                };
                out.push(absolute);
            }
        }
    }
    out
}

/// The names a root or `mod.rs` file re-exports (`pub use`, `pub(crate)
/// use`), each with the path it comes from, relative to that file.
fn reexports(code: &str) -> BTreeMap<String, Vec<String>> {
    let mut out = BTreeMap::new();
    for stmt in code.split(';') {
        let mut stmt = stmt.trim();
        // `#[doc(inline)]` and other attributes before the `use`.
        while stmt.starts_with("#[") {
            match stmt.find(']') {
                Some(end) => stmt = stmt[end + 1..].trim_start(),
                None => break,
            }
        }
        let Some(tree) = ["pub use ", "pub(crate) use "]
            .iter()
            .find_map(|p| stmt.strip_prefix(p))
        else {
            continue;
        };
        let mut leaves = Vec::new();
        use_paths(tree, Vec::new(), &mut leaves);
        for leaf in leaves {
            if let Some(name) = leaf.name {
                out.insert(name, leaf.segments);
            }
        }
    }
    out
}

/// Whether a layer's `mod.rs` holds items of its own (a function, a type,
/// a constant, a macro), beyond declaring and re-exporting its files: it is
/// then a module of the graph, named after the layer, whose imports count
/// and which the paths to its items lead to.
fn holds_code(code: &str) -> bool {
    code.lines().map(str::trim_start).any(|l| {
        let l = l
            .strip_prefix("pub(crate) ")
            .or_else(|| l.strip_prefix("pub "))
            .unwrap_or(l);
        [
            "fn ",
            "async fn ",
            "struct ",
            "enum ",
            "trait ",
            "const ",
            "static ",
            "impl",
            "macro_rules!",
            "type ",
        ]
        .iter()
        .any(|k| l.starts_with(k))
    })
}

/// What a crate's files declare: its modules, its layers, and the names
/// its root and each layer's `mod.rs` re-export.
struct Crate {
    modules: BTreeSet<String>,
    root: BTreeMap<String, Vec<String>>,
    of_layer: BTreeMap<String, BTreeMap<String, Vec<String>>>,
}

/// Where a file of `src/` sits: the root, a layer's `mod.rs`, a module
/// (its graph name and its Rust module path), or nowhere (`bin/`).
enum Place {
    Root,
    LayerMod(String),
    Module { name: String, path: Vec<String> },
    Outside,
}

fn place(rel: &Path, layers: &BTreeSet<String>) -> Place {
    let parts: Vec<String> = rel
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    let stem = |p: &str| p.trim_end_matches(".rs").to_owned();
    // The Rust module path: `conn/dsn/mod.rs` is `conn::dsn`.
    let mut path: Vec<String> = parts.iter().map(|p| stem(p)).collect();
    if path.last().is_some_and(|l| l == "mod") {
        path.pop();
    }
    match parts.as_slice() {
        [] => Place::Outside,
        [first, ..] if first == "bin" => Place::Outside,
        [only] if only == "lib.rs" || only == "main.rs" => Place::Root,
        [layer, rest @ ..] if layers.contains(layer) => match rest {
            [] => Place::Outside,
            [only] if only == "mod.rs" => Place::LayerMod(layer.clone()),
            [file, ..] => Place::Module {
                name: format!("{layer}::{}", stem(file)),
                path,
            },
        },
        [first, ..] => Place::Module {
            name: stem(first),
            path,
        },
    }
}

impl Crate {
    /// The module an absolute path leads to, following re-exports.
    fn resolve(&self, path: &[String], depth: usize) -> Option<String> {
        let (first, rest) = path.split_first()?;
        if depth > 8 {
            return None;
        }
        if let Some(names) = self.of_layer.get(first) {
            // The layer's own `mod.rs`, when it holds code of its own.
            let own = || self.modules.get(first).cloned();
            let Some(second) = rest.first() else {
                return own();
            };
            let module = format!("{first}::{second}");
            if self.modules.contains(&module) {
                return Some(module);
            }
            let Some(from) = names.get(second) else {
                return own();
            };
            let from = match from.first().map(String::as_str) {
                Some("crate") => from[1..].to_vec(),
                _ => std::iter::once(first.clone())
                    .chain(from.iter().cloned())
                    .collect(),
            };
            return self.resolve(&from, depth + 1);
        }
        if self.modules.contains(first) {
            return Some(first.clone());
        }
        let from = self.root.get(first)?;
        let from = match from.first().map(String::as_str) {
            Some("crate") => &from[1..],
            _ => from,
        };
        self.resolve(from, depth + 1)
    }
}

impl ModuleGraph {
    /// The graph of the crate whose manifest is in `manifest_dir` (pass
    /// `env!("CARGO_MANIFEST_DIR")`), read from its `src/`.
    pub fn of_crate(manifest_dir: impl AsRef<Path>) -> Self {
        let dir = manifest_dir.as_ref();
        let name = dir
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        Self::from_files(name, rust_files(dir.join("src")))
    }

    /// The graph of a crate named `name` whose `src/` holds `files`
    /// (path relative to `src/`, text).
    pub fn from_files<P: AsRef<Path>, T: AsRef<str>>(
        name: impl Into<String>,
        files: impl IntoIterator<Item = (P, T)>,
    ) -> Self {
        let files: Vec<(PathBuf, String)> = files
            .into_iter()
            .map(|(p, t)| (p.as_ref().to_path_buf(), strip_comments(t.as_ref())))
            .collect();
        let layers: BTreeSet<String> = files
            .iter()
            .filter_map(|(p, _)| {
                let mut parts = p.components().map(|c| c.as_os_str().to_string_lossy());
                match (parts.next(), parts.next(), parts.next()) {
                    (Some(layer), Some(m), None) if m == "mod.rs" && layer != "bin" => {
                        Some(layer.into_owned())
                    }
                    _ => None,
                }
            })
            .collect();
        let mut krate = Crate {
            modules: BTreeSet::new(),
            root: BTreeMap::new(),
            of_layer: BTreeMap::new(),
        };
        let places: Vec<(Place, &String)> = files
            .iter()
            .map(|(p, code)| (place(p, &layers), code))
            .collect();
        for (place, code) in &places {
            match place {
                Place::Root => krate.root.extend(reexports(code)),
                Place::LayerMod(layer) => {
                    krate
                        .of_layer
                        .entry(layer.clone())
                        .or_default()
                        .extend(reexports(code));
                    if holds_code(code) {
                        krate.modules.insert(layer.clone());
                    }
                }
                Place::Module { name, .. } => {
                    krate.modules.insert(name.clone());
                }
                Place::Outside => {}
            }
        }
        let mut edges = Graph::new();
        for (place, code) in &places {
            let (name, path) = match place {
                Place::Module { name, path } => (name, path.clone()),
                Place::LayerMod(layer) if krate.modules.contains(layer) => {
                    (layer, vec![layer.clone()])
                }
                _ => continue,
            };
            let path = &path;
            let to = edges.entry(name.clone()).or_default();
            for target in crate_paths(code, path) {
                if let Some(t) = krate.resolve(&target, 0).filter(|t| t != name) {
                    to.insert(t);
                }
            }
        }
        ModuleGraph {
            name: name.into(),
            edges,
        }
    }

    /// Module name to the modules it imports.
    pub fn edges(&self) -> &Graph {
        &self.edges
    }

    /// The number of modules.
    pub fn len(&self) -> usize {
        self.edges.len()
    }

    /// Whether no module was found.
    pub fn is_empty(&self) -> bool {
        self.edges.is_empty()
    }

    /// The number of edges.
    pub fn edge_count(&self) -> usize {
        self.edges.values().map(BTreeSet::len).sum()
    }

    /// The modules `module` imports.
    pub fn imports(&self, module: &str) -> Vec<&str> {
        self.edges
            .get(module)
            .into_iter()
            .flatten()
            .map(String::as_str)
            .collect()
    }

    /// The modules that import `module`.
    pub fn importers_of(&self, module: &str) -> Vec<&str> {
        self.edges
            .iter()
            .filter(|(_, to)| to.contains(module))
            .map(|(from, _)| from.as_str())
            .collect()
    }

    /// The graph with each module counted as its layer (`conn::call`:
    /// `conn`; a module of `src/` stays itself).
    pub fn layers(&self) -> Self {
        let layer = |m: &str| m.split("::").next().unwrap_or(m).to_owned();
        let mut edges = Graph::new();
        for (from, to) in &self.edges {
            let from = layer(from);
            let into = edges.entry(from.clone()).or_default();
            into.extend(to.iter().map(|t| layer(t)).filter(|t| *t != from));
        }
        ModuleGraph {
            name: format!("{} (layers)", self.name),
            edges,
        }
    }

    /// The circles among the modules not in `exempt`: for each module on
    /// one, the shortest circle through it, each circle once, from its
    /// smallest module: `["a", "b", "a"]`. Empty when there is none.
    pub fn circles(&self, exempt: &[&str]) -> Vec<Vec<String>> {
        let allowed = |m: &str| !exempt.contains(&m);
        let mut found = BTreeSet::new();
        for start in self.edges.keys().filter(|m| allowed(m)) {
            // The shortest way back to `start`, breadth first.
            let mut came_from: BTreeMap<&str, &str> = BTreeMap::new();
            let mut frontier = vec![start.as_str()];
            let mut closed = None;
            'search: while !frontier.is_empty() {
                let mut next_frontier = Vec::new();
                for at in frontier {
                    for next in self.edges.get(at).into_iter().flatten() {
                        if !allowed(next) {
                            continue;
                        }
                        if next == start {
                            closed = Some(at);
                            break 'search;
                        }
                        if !came_from.contains_key(next.as_str()) {
                            came_from.insert(next, at);
                            next_frontier.push(next.as_str());
                        }
                    }
                }
                frontier = next_frontier;
            }
            let Some(mut at) = closed else {
                continue;
            };
            let mut circle = vec![at.to_owned()];
            while at != start {
                at = came_from[at];
                circle.push(at.to_owned());
            }
            circle.reverse();
            // From its smallest module, so each circle is found once.
            let smallest = (0..circle.len()).min_by_key(|&i| &circle[i]).unwrap_or(0);
            circle.rotate_left(smallest);
            circle.push(circle[0].clone());
            found.insert(circle);
        }
        found.into_iter().collect()
    }

    /// [`circles`](Self::circles), each as `a -> b -> a`.
    pub fn circle_lines(&self, exempt: &[&str]) -> Vec<String> {
        self.circles(exempt)
            .into_iter()
            .map(|c| c.join(" -> "))
            .collect()
    }

    /// Panics, naming each circle and the modules' imports, when modules
    /// not in `exempt` import each other in a circle.
    #[track_caller]
    pub fn assert_no_circle(&self, exempt: &[&str]) {
        let found = self.circle_lines(exempt);
        assert!(
            found.is_empty(),
            "{}: modules import each other in a circle (a module that builds on \
             another must not be imported by it; move what both need into a module \
             of its own):\n  {}\nthe imports:\n{self}",
            self.name,
            found.join("\n  "),
        );
    }

    /// Panics, naming the others, when a module not in `allowed` imports
    /// `module`.
    #[track_caller]
    pub fn assert_imported_only_by(&self, module: &str, allowed: &[&str]) {
        let others: Vec<&str> = self
            .importers_of(module)
            .into_iter()
            .filter(|m| !allowed.contains(m))
            .collect();
        assert!(
            others.is_empty(),
            "{}: only {allowed:?} may import `{module}`, but {others:?} do",
            self.name,
        );
    }
}

impl fmt::Display for ModuleGraph {
    /// One line per module: `a -> b, c`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (from, to) in &self.edges {
            let to: Vec<&str> = to.iter().map(String::as_str).collect();
            writeln!(f, "  {from} -> {}", to.join(", "))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn graph(files: &[(&str, &str)]) -> ModuleGraph {
        ModuleGraph::from_files("t", files.iter().copied())
    }

    #[test]
    fn every_kind_of_path_is_an_edge_and_comments_are_not() {
        let g = graph(&[
            ("lib.rs", "mod a;\npub use c::{Thing, Other};\npub use d::Item;\n"),
            (
                "a.rs",
                "//! [`x`](crate::z)\nuse crate::{b, c::X as Y};\n/* crate::d */\nfn f() { crate::e::g(); let _ = pgmq_client::crate_x; }\n",
            ),
            ("b.rs", "use super::d;\nfn h(_: crate::Thing) {}\n"),
            ("c.rs", "// use crate::a;\nmod tests { use super::*; }\n"),
            ("d.rs", "use crate::Item;\n"),
            ("e.rs", "use crate::a::F;\n"),
            ("z.rs", ""),
        ]);
        assert_eq!(g.imports("a"), ["b", "c", "e"]);
        assert_eq!(g.imports("b"), ["c", "d"]);
        assert!(g.imports("c").is_empty() && g.imports("d").is_empty());
        assert_eq!(g.circle_lines(&[]), ["a -> e -> a"]);
        assert!(g.circles(&["e"]).is_empty());
    }

    #[test]
    fn layers_and_reexports_lead_to_the_files_they_name() {
        let g = graph(&[
            (
                "lib.rs",
                "mod conn;\n#[doc(inline)]\npub use pgmq::trace;\npub use conn::{Error, redact as redact_dsn};\npub use pgmq::Read;",
            ),
            ("conn/mod.rs", "mod call; mod error;\npub use error::{Error, redact};"),
            ("conn/call.rs", "use super::error::Error;\nuse crate::pgmq::{read::x, trace};"),
            ("conn/error.rs", "fn f() { crate::redact_dsn(); }"),
            ("conn/dsn/mod.rs", "mod parse;"),
            ("conn/dsn/parse.rs", "use super::super::call; use super::Other;"),
            ("pgmq/mod.rs", "pub use self::read::Read;"),
            ("pgmq/read.rs", "use crate::{Error, Read, conn::call};"),
            ("pgmq/trace.rs", "use crate::top::f;"),
            ("top.rs", "use crate::trace; use crate::conn; use crate::Unknown;"),
            ("bin/pgmq/main.rs", "use crate::top;"),
        ]);
        assert_eq!(
            g.imports("conn::call"),
            ["conn::error", "pgmq::read", "pgmq::trace"]
        );
        assert!(g.imports("conn::error").is_empty());
        assert_eq!(g.imports("conn::dsn"), ["conn::call"]);
        assert_eq!(g.imports("pgmq::read"), ["conn::call", "conn::error"]);
        assert_eq!(g.imports("top"), ["pgmq::trace"]);
        assert_eq!(g.len(), 6);
        assert_eq!(
            g.circle_lines(&[]),
            [
                "conn::call -> pgmq::read -> conn::call",
                "pgmq::trace -> top -> pgmq::trace"
            ]
        );
        let layers = g.layers();
        assert_eq!(layers.imports("conn"), ["pgmq"]);
        assert_eq!(layers.imports("pgmq"), ["conn", "top"]);
        assert_eq!(
            layers.circle_lines(&[]),
            ["conn -> pgmq -> conn", "pgmq -> top -> pgmq"]
        );
    }

    #[test]
    fn a_circle_is_named_once_by_its_shortest_way() {
        let g = graph(&[
            ("a.rs", "use crate::b;"),
            ("b.rs", "use crate::c;"),
            ("c.rs", "use crate::{a, b};"),
        ]);
        assert_eq!(g.circle_lines(&[]), ["a -> b -> c -> a", "b -> c -> b"]);
        assert_eq!(g.importers_of("b"), ["a", "c"]);
    }
}
