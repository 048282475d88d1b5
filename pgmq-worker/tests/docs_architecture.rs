//! docs/architecture-modules.md's module tables name every file of
//! `pgmq-worker/src/` and `pgmq-client/src/`, and only files that exist:
//! each table row starts with a file (`` `db.rs` ``), a file of a layer
//! (`` `conn/call.rs` ``: a folder of `src/` with a `mod.rs` is a layer,
//! whose files have a row each) or another folder (`` `bin/pgmq/` ``,
//! `` `conn/dsn/` ``), compared with the entries of the crate's `src/`.

use std::collections::BTreeSet;
use std::path::Path;

fn workspace() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
}

/// The first cells of the table that follows `heading` in `doc`, without
/// their backticks.
fn table_rows(doc: &str, heading: &str) -> BTreeSet<String> {
    let section = doc
        .split(&format!("\n{heading}\n"))
        .nth(1)
        .unwrap_or_else(|| panic!("docs/architecture-modules.md has no heading {heading:?}"));
    section
        .lines()
        .skip_while(|line| !line.starts_with('|'))
        .take_while(|line| line.starts_with('|'))
        .skip(2)
        .filter_map(|line| {
            let cell = line.split('|').nth(1)?.trim();
            Some(cell.strip_prefix('`')?.strip_suffix('`')?.to_owned())
        })
        .collect()
}

/// The `.rs` files of `dir` (by their path from `dir`, with `prefix`
/// before it), the files of its layers (folders with a `mod.rs`, at the
/// top only) the same way, and its other folders as `name/` followed by
/// their single subfolder when there is one (`bin/pgmq/`).
fn source_entries(dir: &Path) -> BTreeSet<String> {
    entries(dir, "", true)
}

fn entries(dir: &Path, prefix: &str, top: bool) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if path.is_dir() && top && path.join("mod.rs").is_file() {
            out.extend(entries(&path, &format!("{prefix}{name}/"), false));
        } else if path.is_dir() {
            let subdirs: Vec<String> = std::fs::read_dir(&path)
                .unwrap()
                .map(|e| e.unwrap().path())
                .filter(|p| p.is_dir())
                .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
                .collect();
            match subdirs.as_slice() {
                [only] => out.insert(format!("{prefix}{name}/{only}/")),
                _ => out.insert(format!("{prefix}{name}/")),
            };
        } else if name.ends_with(".rs") {
            out.insert(format!("{prefix}{name}"));
        }
    }
    out
}

/// What differs between the rows and the files, one line each.
fn mismatches(rows: &BTreeSet<String>, files: &BTreeSet<String>, crate_dir: &str) -> Vec<String> {
    let undocumented = files
        .difference(rows)
        .map(|f| format!("{crate_dir}/src/{f} has no row in docs/architecture-modules.md"));
    let missing = rows.difference(files).map(|r| {
        format!(
            "docs/architecture-modules.md has a row for {crate_dir}/src/{r}, which does not exist"
        )
    });
    undocumented.chain(missing).collect()
}

#[test]
fn the_module_tables_match_the_source_files() {
    let doc = std::fs::read_to_string(workspace().join("docs/architecture-modules.md")).unwrap();
    let mut problems = Vec::new();
    for (heading, crate_dir) in [
        ("## pgmq-worker, module by module", "pgmq-worker"),
        ("## pgmq-client, module by module", "pgmq-client"),
    ] {
        let rows = table_rows(&doc, heading);
        let files = source_entries(&workspace().join(crate_dir).join("src"));
        assert!(files.len() >= 10, "{crate_dir}/src read wrong: {files:?}");
        assert!(rows.len() >= 10, "no table under {heading}: {rows:?}");
        problems.extend(mismatches(&rows, &files, crate_dir));
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn a_layers_files_have_a_row_each() {
    let dir = std::env::temp_dir().join(format!("docs_architecture_{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    for folder in ["conn/dsn", "bin/pgmq", "assets"] {
        std::fs::create_dir_all(dir.join(folder)).unwrap();
    }
    for file in [
        "lib.rs",
        "conn/mod.rs",
        "conn/call.rs",
        "conn/dsn/mod.rs",
        "bin/pgmq/main.rs",
        "assets/x.rs",
    ] {
        std::fs::write(dir.join(file), "").unwrap();
    }
    let found = source_entries(&dir);
    std::fs::remove_dir_all(&dir).unwrap();
    let want: BTreeSet<String> = [
        "lib.rs",
        "conn/mod.rs",
        "conn/call.rs",
        "conn/dsn/",
        "bin/pgmq/",
        "assets/",
    ]
    .map(String::from)
    .into();
    assert_eq!(found, want);
}

#[test]
fn a_missing_or_extra_row_is_caught() {
    let doc = "intro\n## Mods\n\ntext\n\n| module | what |\n| --- | --- |\n| `a.rs` | x |\n| `gone.rs` | y |\n\nafter\n";
    let rows = table_rows(doc, "## Mods");
    let files: BTreeSet<String> = ["a.rs", "new.rs"].map(String::from).into();
    let found = mismatches(&rows, &files, "c");
    assert_eq!(
        found,
        [
            "c/src/new.rs has no row in docs/architecture-modules.md",
            "docs/architecture-modules.md has a row for c/src/gone.rs, which does not exist",
        ]
    );
}
