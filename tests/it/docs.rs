//! The documents a clone has: every link in README.md and docs/ leads to a file of the repository
//! (nothing outside it), and the runbook table (docs/runbook.md) names only flow steps this build
//! runs, doctor checks it makes and tests that exist.

use std::path::PathBuf;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn documents() -> Vec<PathBuf> {
    let mut docs = vec![root().join("README.md")];
    for e in std::fs::read_dir(root().join("docs")).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_some_and(|x| x == "md") {
            docs.push(p);
        }
    }
    docs
}

/// The targets of `[text](target)` links in a Markdown text.
fn links(text: &str) -> Vec<String> {
    let mut out = vec![];
    let mut rest = text;
    while let Some(i) = rest.find("](") {
        rest = &rest[i + 2..];
        if let Some(end) = rest.find(')') {
            out.push(rest[..end].to_string());
            rest = &rest[end..];
        }
    }
    out
}

#[test]
fn links_stay_inside_the_repository_and_resolve() {
    let mut bad = vec![];
    for doc in documents() {
        let text = std::fs::read_to_string(&doc).unwrap();
        for link in links(&text) {
            if link.starts_with("http://") || link.starts_with("https://") || link.starts_with('#') {
                continue;
            }
            let file = link.split('#').next().unwrap();
            let target = doc.parent().unwrap().join(file);
            let inside = target.canonicalize().is_ok_and(|t| t.starts_with(root().canonicalize().unwrap()));
            if !inside {
                bad.push(format!("{}: {link}", doc.strip_prefix(root()).unwrap().display()));
            }
        }
        // a path into the workspace beside the repository is a link a clone cannot follow
        for needle in ["../shared", "shared/seed"] {
            if text.contains(needle) {
                bad.push(format!("{}: mentions {needle}", doc.strip_prefix(root()).unwrap().display()));
            }
        }
    }
    assert!(bad.is_empty(), "links that leave the repository or lead nowhere: {bad:#?}");
}

/// The backticked references of the runbook table: `kind:step`, `doctor:check`, `tests/…rs::fn`.
fn references(text: &str) -> Vec<String> {
    text.lines()
        .filter(|l| l.starts_with('|'))
        .flat_map(|l| l.split('`').skip(1).step_by(2).map(str::to_string).collect::<Vec<_>>())
        .collect()
}

/// The ids of every check `onramp doctor --json` reports (the Slurm ones read from the test
/// cluster; without a Kubernetes API the pod checks are listed as not checked, ids and all).
fn doctor_checks() -> Vec<String> {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_onramp"))
        .args(["doctor", "--slurm-via", "local", "--json"])
        .env_remove("ONRAMP_CONFIG")
        .env_remove("ONRAMP_KUBECONFIG")
        .env_remove("ONRAMP_TENANTS")
        .output()
        .unwrap();
    let report: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("doctor --json: {e}: {}", String::from_utf8_lossy(&out.stderr)));
    report["findings"].as_array().unwrap().iter().map(|f| f["id"].as_str().unwrap().to_string()).collect()
}

#[test]
fn the_runbook_table_names_real_steps_checks_and_tests() {
    let text = std::fs::read_to_string(root().join("docs/runbook.md")).unwrap();
    let registry = onramp::flows::declare_all(onramp::flows::registry());
    let doctor = doctor_checks();
    let (mut steps, mut checks, mut tests, mut bad) = (0, 0, 0, vec![]);
    for r in references(&text) {
        if let Some((file, func)) = r.split_once("::").filter(|(f, _)| f.starts_with("tests/")) {
            tests += 1;
            let body = std::fs::read_to_string(root().join(file)).unwrap_or_default();
            if !body.contains(&format!("fn {func}(")) {
                bad.push(format!("no test {func} in {file}"));
            }
        } else if let Some(check) = r.strip_prefix("doctor:") {
            checks += 1;
            if !doctor.iter().any(|c| c == check) {
                bad.push(format!("no doctor check {check:?} (doctor reports {doctor:?})"));
            }
        } else if let Some((kind, step)) = r.split_once(':').filter(|(k, _)| k.contains('.')) {
            steps += 1;
            if !registry.steps(kind).is_some_and(|s| s.contains(&step)) {
                bad.push(format!("no step {step} in flow {kind}"));
            }
        }
    }
    assert!(bad.is_empty(), "docs/runbook.md names what does not exist: {bad:#?}");
    assert!(
        steps >= 20 && checks >= 10 && tests >= 15,
        "the table is thin: {steps} steps, {checks} checks, {tests} tests"
    );
}
