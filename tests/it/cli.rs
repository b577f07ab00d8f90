//! The binary's command line: help lists every setting, mistakes are one line naming the setting.

use std::process::{Command, Output};

/// Runs the binary with only PATH and `env` in its environment.
pub fn onramp(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_onramp"));
    c.args(args).env_clear().env("PATH", std::env::var("PATH").unwrap_or_default());
    for (k, v) in env {
        c.env(k, v);
    }
    c.output().unwrap()
}

fn stderr_line(o: &Output) -> String {
    let e = String::from_utf8_lossy(&o.stderr).to_string();
    assert_eq!(e.trim_end().lines().count(), 1, "expected one line, got: {e}");
    e.trim_end().to_string()
}

#[test]
fn help_lists_every_setting_with_its_environment_variable_and_default() {
    let o = onramp(&["serve", "--help"], &[]);
    assert!(o.status.success());
    let help = String::from_utf8_lossy(&o.stdout);
    for (env, default) in [
        ("DATABASE_URL", None),
        ("ONRAMP_DB_POOL_SIZE", Some("16")),
        ("ONRAMP_ROLE", Some("both")),
        ("ONRAMP_LISTEN", Some("0.0.0.0:8080")),
        ("ONRAMP_WORKER_CONCURRENCY", Some("32")),
        ("ONRAMP_LEASE", Some("10s")),
        ("ONRAMP_POLL_INTERVAL", Some("5s")),
        ("ONRAMP_SHUTDOWN_GRACE", Some("30s")),
        ("ONRAMP_LOG", Some("info")),
        ("ONRAMP_CONFIG", None),
    ] {
        let at = help.find(&format!("[env: {env}")).unwrap_or_else(|| panic!("{env} missing from help:\n{help}"));
        if let Some(d) = default {
            let rest = &help[at..];
            assert!(
                rest[..rest.find("\n\n").unwrap_or(rest.len())].contains(&format!("[default: {d}]")),
                "{env} default"
            );
        }
    }
}

#[test]
fn a_missing_setting_is_one_line_that_names_it() {
    let o = onramp(&["migrate"], &[]);
    assert_eq!(o.status.code(), Some(2));
    assert_eq!(stderr_line(&o), "onramp: missing setting: --database-url <URL> (environment: DATABASE_URL)");
}

#[test]
fn a_malformed_setting_from_the_environment_is_one_line_that_names_it() {
    let o = onramp(&["serve"], &[("DATABASE_URL", "postgres://x@127.0.0.1/x"), ("ONRAMP_LEASE", "soon")]);
    assert_eq!(o.status.code(), Some(2));
    let line = stderr_line(&o);
    assert!(line.contains("--lease") && line.contains("ONRAMP_LEASE") && line.contains("soon"), "{line}");
}

#[test]
fn the_settings_file_is_read_and_its_mistakes_name_file_and_line() {
    let dir = std::env::temp_dir().join(format!("onramp-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("onramp.env");
    std::fs::write(&file, "DATABASE_URL=postgres://x@127.0.0.1/x\nONRAMP_ROLE=sideways\n").unwrap();
    let o = onramp(&["serve", "--config", file.to_str().unwrap()], &[]);
    let line = stderr_line(&o);
    assert!(line.contains("sideways") && line.contains("ONRAMP_ROLE"), "{line}");
    std::fs::write(&file, "# ok\nthis is not a setting\n").unwrap();
    let o = onramp(&["migrate"], &[("ONRAMP_CONFIG", file.to_str().unwrap())]);
    assert!(stderr_line(&o).ends_with("onramp.env:2: expected NAME=value"));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_database_that_does_not_answer_is_one_line_without_the_password() {
    let o = onramp(&["migrate"], &[("DATABASE_URL", "postgres://onramp:hunter2@127.0.0.1:1/onramp")]);
    assert_eq!(o.status.code(), Some(1));
    let line = stderr_line(&o);
    assert!(line.starts_with("onramp: cannot connect to PostgreSQL at onramp@127.0.0.1:1/onramp"), "{line}");
    assert!(!line.contains("hunter2"));
}

const TENANTS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/deploy/authentik/tenants.example.yaml");

/// Two tenants' Kubernetes names collide: `serve` does not start, and says in one line which
/// setting to change.
#[test]
fn a_registry_whose_kubernetes_names_collide_stops_onramp_in_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tenants.yaml");
    let yaml = "tenants:\n  - { name: foo, group: g1 }\n  - name: bar\n    group: g2\n    kubernetes: { namespace: tenant-foo }\n";
    std::fs::write(&path, yaml).unwrap();
    let env = [
        ("DATABASE_URL", "postgres://x@127.0.0.1:1/x"),
        ("ONRAMP_TENANTS", path.to_str().unwrap()),
        ("ONRAMP_AUTHENTIK_URL", "http://127.0.0.1:1"),
        ("ONRAMP_AUTHENTIK_TOKEN", "t"),
        ("ONRAMP_WEBHOOK_TOKENS", "t"),
    ];
    let o = onramp(&["serve"], &env);
    assert!(!o.status.success());
    let line = stderr_line(&o);
    assert!(
        line.ends_with(
            "line 5: tenants[1].kubernetes.namespace: namespace tenant-foo is already tenant foo's; two tenants \
             cannot share it: set tenants[1].kubernetes.namespace"
        ),
        "{line}"
    );
}

#[test]
fn plan_prints_a_flows_commands_in_order_and_changes_nothing() {
    let o = onramp(&["plan", "user.onboard", "--tenant", "foo", "--user", "alice", "--tenants", TENANTS], &[]);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{out}\n{}", String::from_utf8_lossy(&o.stderr));
    assert!(o.stderr.is_empty(), "the plan logs nothing: {}", String::from_utf8_lossy(&o.stderr));
    // the runbook's order: association after the propagation wait, then quota, $HOME, smoke test
    let at = |s: &str| out.find(s).unwrap_or_else(|| panic!("{s:?} missing from\n{out}"));
    assert!(at("wait 1m (durable timer)") < at("+ slurm          sacctmgr -i add user alice Account="));
    assert!(at("sacctmgr -i add user alice") < at("+ storage        weka fs quota set /home/alice"));
    assert!(at("quota set /home/alice") < at("+ login/tenant-foo mv -T -- /home/.onramp-new-alice /home/alice"));
    assert!(at("mv -T") < at("sudo -u alice -i sbatch --test-only"));
    // the names it acts on, from the registry
    assert!(at("names: namespace tenant-foo · secret tenant-foo-authorized-keys") < at("1. preflight"));
    assert!(out.contains("login pod/login-0 (deploy/login) · slurmcluster cluster-tenant-foo"), "{out}");

    let o = onramp(
        &["plan", "user.offboard", "--tenant", "foo", "--user", "alice", "--tenants", TENANTS, "--json"],
        &[("ONRAMP_RETENTION", "30d")],
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let p: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let steps: Vec<&str> = p["steps"].as_array().unwrap().iter().map(|s| s["step"].as_str().unwrap()).collect();
    let first = |s: &str| steps.iter().position(|x| *x == s).unwrap_or_else(|| panic!("{s} missing: {steps:?}"));
    assert!(first("block") < first("cancel_pending") && first("drain") < first("retention"));
    assert!(first("snapshot_home") < first("delete") && first("archive") < first("delete"));
    let retention = &p["steps"][first("retention")]["then"];
    assert_eq!(retention, "wait 30d (durable timer), then run the step again");

    for (args, says) in [
        (vec!["plan", "user.dance", "--tenant", "foo", "--user", "alice"], "no plan for flow \"user.dance\""),
        (vec!["plan", "user.onboard", "--tenant", "foo"], "user.onboard needs a user"),
        (vec!["plan", "tenant.onboard", "--tenant", "nope"], "tenant nope is not in the tenant registry"),
        (vec!["plan", "user.onboard", "--tenant", "foo", "--user", "Bad;Name"], "--user:"),
    ] {
        let mut args = args.clone();
        args.extend(["--tenants", TENANTS]);
        let o = onramp(&args, &[]);
        assert!(!o.status.success());
        let line = stderr_line(&o);
        assert!(line.contains(says), "{args:?}: {line}");
    }
}
