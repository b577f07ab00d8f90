//! A binary of this workspace for a test to run as a process: the path an environment variable
//! names (scripts/test sets them), else built with cargo. Shared by the test crates (`#[path]`).

use std::path::PathBuf;
use std::process::Stdio;

/// How the system test builds: the release binaries of the workspace in one build (as
/// scripts/test).
#[allow(dead_code)] // not every crate that includes this builds for release
pub const RELEASE: &[&str] = &["--release", "--workspace", "--bins"];

/// The absolute path of a binary of this workspace: `$<env>` if set, else built with `cargo build
/// --locked <cargo_args>` (where cargo puts it, whatever the target directory).
pub fn binary(env: &str, bin: &str, cargo_args: &[&str]) -> PathBuf {
    if let Some(p) = std::env::var_os(env) {
        let p = PathBuf::from(p);
        assert!(p.is_file(), "{env}={} is not a file", p.display());
        // absolute: a test links to it and runs it from other directories
        return std::path::absolute(&p).unwrap_or(p);
    }
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    eprintln!("tests: {env} is not set; building {bin} with cargo build --locked {}", cargo_args.join(" "));
    let out = std::process::Command::new(cargo)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .args(["build", "--locked", "--message-format=json-render-diagnostics"])
        .args(cargo_args)
        .stderr(Stdio::inherit())
        .output()
        .expect("run cargo");
    assert!(out.status.success(), "cargo build of {bin} failed");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|m| m["reason"] == "compiler-artifact" && m["target"]["name"] == bin)
        .find_map(|m| m["executable"].as_str().map(PathBuf::from))
        .unwrap_or_else(|| panic!("cargo built no executable {bin}"))
}
