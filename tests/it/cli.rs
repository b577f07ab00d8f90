//! The binary's command line: help lists every setting, mistakes are one line naming the setting.

use std::process::{Command, Output};
use std::time::Duration;

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
        ("ONRAMP_WORKER_CONCURRENCY", Some("512")),
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

/// Runs the binary like [`onramp`] against the database at `url`, with `extra` in its environment.
fn against(url: &str, args: &[&str], extra: &[(&str, &str)]) -> Output {
    let mut env = vec![("DATABASE_URL", url)];
    env.extend_from_slice(extra);
    let o = onramp(args, &env);
    assert!(o.status.success(), "{args:?}: {}", String::from_utf8_lossy(&o.stderr));
    o
}

/// Three selftest jobs run by a worker: one waiting for approval, one failed, one succeeded.
async fn three_jobs(db: &crate::common::TestDb) -> (i64, i64, i64) {
    use onramp::engine::{Actor, NewJob};
    use serde_json::json;
    let engine = crate::common::engine(db, onramp::flows::registry());
    let worker = crate::common::TestWorker::start(&engine, crate::common::worker_config("w", Duration::from_secs(5)));
    let job = |subject: &str, input| NewJob::new("selftest", subject, input, Actor::cli("test"));
    let ids: Vec<i64> = engine
        .enqueue(&[
            job("demo/approve", json!({ "approval": true })),
            job("demo/fail", json!({ "fail_attempts": 9 })),
            job("demo/ok", json!({})),
        ])
        .await
        .unwrap()
        .iter()
        .map(|e| e.id)
        .collect();
    let s = Duration::from_secs(30);
    crate::common::wait_state(&engine, ids[0], "needs_approval", s).await;
    crate::common::wait_state(&engine, ids[1], "failed", s).await;
    crate::common::wait_state(&engine, ids[2], "succeeded", s).await;
    worker.shutdown().await;
    (ids[0], ids[1], ids[2])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_list_has_a_header_a_reason_column_and_json() {
    let db = crate::common::TestDb::new().await;
    let (approve, fail, ok) = three_jobs(&db).await;
    let o = against(&db.url, &["jobs", "list"], &[]);
    let text = String::from_utf8(o.stdout).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    let header: Vec<&str> = lines[0].split_whitespace().collect();
    assert_eq!(header, ["ID", "STATE", "KIND", "SUBJECT", "STEP", "AGE", "REASON"], "{text}");
    let row =
        |id: i64| *lines.iter().find(|l| l.starts_with(&format!("{id} "))).unwrap_or_else(|| panic!("{id}: {text}"));
    assert!(row(approve).ends_with("waiting for approval: selftest: asked for approval"), "{text}");
    let gave_up = "gave up after 5 attempts: selftest: injected failure 5";
    assert!(row(fail).contains("failed") && row(fail).ends_with(gave_up), "{text}");
    assert!(row(ok).contains("succeeded"), "{text}");
    // the reason column starts at the same place in every row
    let at = lines[0].find("REASON").unwrap();
    assert_eq!(&row(fail)[at..], gave_up, "{text}");

    let o = against(&db.url, &["jobs", "list", "--json", "--state", "needs_approval"], &[]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let jobs = v["jobs"].as_array().unwrap();
    assert_eq!(jobs.len(), 1, "{v}");
    assert_eq!((jobs[0]["id"].as_i64(), jobs[0]["state"].as_str()), (Some(approve), Some("needs_approval")));
    assert_eq!(jobs[0]["reason"], "waiting for approval: selftest: asked for approval");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_show_reads_as_steps_attempts_and_errors_and_json_is_the_record() {
    let db = crate::common::TestDb::new().await;
    let (_, fail, _) = three_jobs(&db).await;
    let o = against(&db.url, &["jobs", "show", &fail.to_string()], &[]);
    let text = String::from_utf8(o.stdout).unwrap();
    assert!(
        text.starts_with(&format!("job {fail} · selftest · demo/fail\nstate:       failed at step work (attempt 5)")),
        "{text}"
    );
    assert!(text.contains("reason:      gave up after 5 attempts: selftest: injected failure 5"), "{text}");
    for attempt in 1..=5 {
        let line = format!("work                   attempt {attempt:<3} ");
        assert!(text.contains(&line), "attempt {attempt} missing:\n{text}");
        let error = if attempt < 5 { "" } else { "gave up after 5 attempts: " };
        assert!(text.contains(&format!("        error: {error}selftest: injected failure {attempt}\n")), "{text}");
    }
    assert!(text.contains("\naudit trail\n") && text.contains("by cli:test"), "{text}");
    assert!(!text.contains('{') || text.contains("input:"), "no raw JSON but the input line:\n{text}");
    assert!(text.lines().count() < 60, "{text}");

    let o = against(&db.url, &["jobs", "show", &fail.to_string(), "--json"], &[]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["job"]["id"].as_i64(), Some(fail));
    assert_eq!(v["steps"].as_array().unwrap().iter().filter(|s| s["step"] == "work").count(), 5);
    assert!(v["events"].as_array().is_some_and(|e| !e.is_empty()));
}

/// `onramp jobs show 9 | head -1`: the reader goes away; the command ends quietly, no panic.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_closed_stdout_ends_every_printing_command_quietly() {
    let db = crate::common::TestDb::new().await;
    let (approve, fail, _) = three_jobs(&db).await;
    let (approve, fail) = (approve.to_string(), fail.to_string());
    let commands: Vec<Vec<&str>> = vec![
        vec!["jobs", "show", &fail],
        vec!["jobs", "show", &fail, "--json"],
        vec!["jobs", "list"],
        vec!["jobs", "list", "--json"],
        vec!["jobs", "approve", &approve],
        vec!["token", "list"],
        vec!["plan", "user.onboard", "--tenant", "foo", "--user", "alice", "--tenants", TENANTS],
    ];
    for args in commands {
        let mut child = Command::new(env!("CARGO_BIN_EXE_onramp"))
            .args(&args)
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .env("DATABASE_URL", &db.url)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        // the reader is gone before the command writes a byte
        drop(child.stdout.take());
        let o = child.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!err.contains("panicked") && !err.contains("Broken pipe"), "{args:?}: {err}");
        assert_eq!(o.status.code(), Some(0), "{args:?}: {err}");
    }
    // the same through a shell's `| head -1`
    let sh =
        format!("'{}' jobs show {fail} | head -1; echo \"status ${{PIPESTATUS[0]}}\"", env!("CARGO_BIN_EXE_onramp"));
    let o = Command::new("bash").args(["-c", &sh]).env("DATABASE_URL", &db.url).output().unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.starts_with(&format!("job {fail} · selftest")) && out.ends_with("status 0\n"), "{out}");
    assert!(!String::from_utf8_lossy(&o.stderr).contains("panicked"), "{o:?}");
}

/// The audit trail names the person: `$SUDO_USER`, then `$USER`, then the uid's login name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_audit_actor_is_the_login_name() {
    let db = crate::common::TestDb::new().await;
    let (approve, fail, _) = three_jobs(&db).await;
    let actor_of = |id: i64, to: &'static str| {
        let pool = db.pool.clone();
        async move {
            sqlx::query_scalar::<_, String>(
                "select actor from job_events where job_id = $1 and to_state = $2 order by id desc limit 1",
            )
            .bind(id)
            .bind(to)
            .fetch_one(&pool)
            .await
            .unwrap()
        }
    };
    against(&db.url, &["jobs", "approve", &approve.to_string()], &[("SUDO_USER", "bob"), ("USER", "root")]);
    assert_eq!(actor_of(approve, "pending").await, "cli:bob");
    let o = against(&db.url, &["jobs", "retry", &fail.to_string()], &[("USER", "carol")]);
    assert!(String::from_utf8_lossy(&o.stdout).ends_with("by cli:carol\n"), "{o:?}");
    assert_eq!(actor_of(fail, "pending").await, "cli:carol");
    // neither set (cron, a container): the name of the user id that runs it
    let me = Command::new("id").arg("-un").output().unwrap();
    let me = String::from_utf8(me.stdout).unwrap().trim().to_string();
    against(&db.url, &["jobs", "cancel", &fail.to_string(), "--reason", "test"], &[]);
    assert_eq!(actor_of(fail, "cancelled").await, format!("cli:{me}"));
    assert!(
        !sqlx::query_scalar::<_, bool>("select exists (select 1 from job_events where actor = 'cli:unknown')")
            .fetch_one(&db.pool)
            .await
            .unwrap()
    );
}

/// Each command's help lists the settings it uses, not every shared group.
#[test]
fn each_commands_help_lists_only_its_own_settings() {
    let help = |cmd: &[&str]| {
        let mut args = cmd.to_vec();
        args.push("--help");
        let o = onramp(&args, &[]);
        assert!(o.status.success(), "{cmd:?}");
        String::from_utf8(o.stdout).unwrap()
    };
    let mut counts = Vec::new();
    for (cmd, has, lacks, most) in [
        (
            &["plan"][..],
            &["ONRAMP_TENANTS", "ONRAMP_AUTHENTIK_URL", "--hard-cutoff", "onramp serve --help"][..],
            &[
                "ONRAMP_KUBECONFIG",
                "ONRAMP_WEKA_BIN",
                "ONRAMP_SMTP_URL",
                "ONRAMP_WEBHOOK_SECRETS",
                "ONRAMP_BRAKE_WINDOW",
                "ONRAMP_SLURM_SSH_HOST",
                "DATABASE_URL",
            ][..],
            80,
        ),
        (&["jobs"], &["DATABASE_URL", "list", "show", "approve"], &["ONRAMP_DB_POOL_SIZE", "ONRAMP_KUBECONFIG"], 40),
        (&["jobs", "list"], &["--json", "--state", "--limit"], &["ONRAMP_DB_POOL_SIZE"], 40),
        (&["jobs", "show"], &["--json"], &["ONRAMP_DB_POOL_SIZE"], 30),
        (
            &["reconcile"],
            &["ONRAMP_AUTHENTIK_URL", "--wait"],
            &["ONRAMP_WEBHOOK_SECRETS", "ONRAMP_BRAKE_MIN_USERS", "ONRAMP_DB_POOL_SIZE"],
            60,
        ),
        (
            &["doctor"],
            &["ONRAMP_SLURM_VIA", "ONRAMP_KUBECONFIG", "ONRAMP_SLURMCTLD_DEPLOYMENT"],
            &["ONRAMP_HOME_ROOT", "ONRAMP_SMOKE_GRES", "ONRAMP_MANAGE_KEYS", "DATABASE_URL"],
            120,
        ),
        (&["dev"], &["ONRAMP_DEV_DIR", "ONRAMP_LEASE"], &["ONRAMP_WORKER_LISTEN", "--database-url"], 80),
        (&["migrate"], &["DATABASE_URL"], &["ONRAMP_DB_POOL_SIZE"], 30),
        (&["token"], &["DATABASE_URL", "ONRAMP_TENANTS"], &["ONRAMP_DB_POOL_SIZE"], 40),
        (&["tenant"], &["DATABASE_URL", "ONRAMP_TENANTS"], &["ONRAMP_DB_POOL_SIZE"], 40),
    ] {
        let text = help(cmd);
        for s in has {
            assert!(text.contains(s), "{cmd:?} --help lacks {s}:\n{text}");
        }
        for s in lacks {
            assert!(!text.contains(s), "{cmd:?} --help lists {s}:\n{text}");
        }
        counts.push((cmd.join(" "), text.lines().count()));
        assert!(text.lines().count() <= most, "{cmd:?} --help is {} lines:\n{text}", text.lines().count());
    }
    // serve runs everything: it lists everything
    let serve = help(&["serve"]);
    for s in ["ONRAMP_KUBECONFIG", "ONRAMP_WEBHOOK_SECRETS", "ONRAMP_DB_POOL_SIZE", "ONRAMP_WORKER_LISTEN"] {
        assert!(serve.contains(s), "serve --help lacks {s}");
    }
    eprintln!("help lines: {counts:?}");
    // what is hidden is still accepted (one settings file serves every command)
    let o = onramp(
        &[
            "plan",
            "user.onboard",
            "--tenant",
            "foo",
            "--user",
            "alice",
            "--tenants",
            TENANTS,
            "--weka-bin",
            "/opt/weka",
        ],
        &[("ONRAMP_WEBHOOK_SECRETS", "whsec_b25yYW1wLWRldi1zaWduaW5nLWtleQ==")],
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(String::from_utf8_lossy(&o.stdout).contains("/opt/weka fs quota set"), "the hidden setting is used");
}

/// Logs to a file or a pipe carry no colour codes.
#[test]
fn logs_to_a_pipe_have_no_colours() {
    // the exporter's start is logged at info
    let o = onramp(
        &["plan", "tenant.onboard", "--tenant", "foo", "--tenants", TENANTS, "--log", "onramp=info"],
        &[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:1")],
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("exporting traces"), "{err}");
    assert!(!err.contains('\x1b'), "ANSI codes in a piped log: {err:?}");
}
