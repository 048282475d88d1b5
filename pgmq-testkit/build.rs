//! Records what the environment metadata (`src/environment.rs`: `sdk` and
//! `build` of the benchmark document and of the fault report) needs from
//! build time: the git commit of the source tree (and whether it had
//! uncommitted changes) and the rustc version, target, rustflags, and the
//! profile's opt-level and debug setting. Each is optional: a build outside a git checkout, or
//! without git installed, simply records nothing.

use std::path::Path;
use std::process::Command;

fn run(cmd: &str, args: &[&str]) -> Option<String> {
    let out = Command::new(cmd).args(args).output().ok()?;
    if !out.status.success() {
        return None;
    }
    let s = String::from_utf8(out.stdout).ok()?;
    Some(s.trim().to_owned())
}

fn main() {
    let manifest = std::env::var("CARGO_MANIFEST_DIR").unwrap_or_else(|_| ".".into());
    let git_dir = run("git", &["-C", &manifest, "rev-parse", "--absolute-git-dir"]);
    // In a linked worktree (`git worktree add`) the branch refs live in the
    // main repository's git dir, not in the worktree's: without watching
    // them, a commit in a worktree left the previous commit recorded.
    let common_dir = run(
        "git",
        &[
            "-C",
            &manifest,
            "rev-parse",
            "--path-format=absolute",
            "--git-common-dir",
        ],
    );
    for dir in [&git_dir, &common_dir].into_iter().flatten() {
        // Rerun when a commit moves HEAD (not on every `git add`: the index
        // is left out on purpose, so staging elsewhere does not rebuild).
        for f in ["HEAD", "packed-refs", "refs/heads"] {
            let p = Path::new(dir).join(f);
            if p.exists() {
                println!("cargo:rerun-if-changed={}", p.display());
            }
        }
    }
    // And when the sources of the SDK, or of the programs that record it
    // (the benchmark, the fault suite), change, so that `git_dirty` follows
    // edits.
    for src in [
        "src",
        "../pgmq-client/src",
        "../pgmq-worker/src",
        "../pgmq-bench/src",
        "../pgmq-faults/src",
        "build.rs",
    ] {
        let p = Path::new(&manifest).join(src);
        if p.exists() {
            println!("cargo:rerun-if-changed={}", p.display());
        }
    }
    if let Some(commit) = run("git", &["-C", &manifest, "rev-parse", "HEAD"]) {
        println!("cargo:rustc-env=PGMQ_TESTKIT_GIT_COMMIT={commit}");
        // Tracked files changed since that commit (untracked files do not count).
        if let Some(status) = run(
            "git",
            &[
                "-C",
                &manifest,
                "status",
                "--porcelain",
                "--untracked-files=no",
            ],
        ) {
            let dirty = if status.is_empty() { "false" } else { "true" };
            println!("cargo:rustc-env=PGMQ_TESTKIT_GIT_DIRTY={dirty}");
        }
    }
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    if let Some(v) = run(&rustc, &["-V"]) {
        println!("cargo:rustc-env=PGMQ_TESTKIT_RUSTC={v}");
    }
    if let Ok(target) = std::env::var("TARGET") {
        println!("cargo:rustc-env=PGMQ_TESTKIT_TARGET={target}");
    }
    // The flags this crate is compiled with: cargo passes them to build
    // scripts as CARGO_ENCODED_RUSTFLAGS, separated by 0x1f (whatever their
    // source: RUSTFLAGS, build.rustflags, target.<triple>.rustflags).
    println!("cargo:rerun-if-env-changed=CARGO_ENCODED_RUSTFLAGS");
    println!("cargo:rerun-if-env-changed=RUSTFLAGS");
    if let Ok(flags) = std::env::var("CARGO_ENCODED_RUSTFLAGS") {
        let flags = flags
            .split('\x1f')
            .filter(|f| !f.is_empty())
            .collect::<Vec<_>>()
            .join(" ");
        println!("cargo:rustc-env=PGMQ_TESTKIT_RUSTFLAGS={flags}");
    }
    // The profile's opt-level and debug setting, as cargo gives them to build scripts.
    if let Ok(v) = std::env::var("OPT_LEVEL") {
        println!("cargo:rustc-env=PGMQ_TESTKIT_OPT_LEVEL={v}");
    }
    if let Ok(v) = std::env::var("DEBUG") {
        println!("cargo:rustc-env=PGMQ_TESTKIT_DEBUG={v}");
    }
}
