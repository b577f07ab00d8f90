//! Roles that cannot eat work, and the one Slurm route: `onramp serve` as a process. A worker
//! whose Slurm route or backends cannot work exits at once with one line naming the setting;
//! `/readyz` says which kinds a process runs and which it only accepts.

use std::net::TcpListener as StdListener;
use std::process::Stdio;
use std::time::Duration;

use serde_json::Value;
use tokio::process::{Child, Command};

use crate::common::{TestDb, eventually};
use crate::intake_support::{TENANTS, TOKEN, WHSEC, fake_authentik};
use crate::k8s_support::cluster;

const SETTINGS_TOKEN: &str = "onramp-settings-token-0123456789abcdef";

struct Env {
    db: TestDb,
    dir: tempfile::TempDir,
    authentik: String,
    kubeconfig: String,
}

async fn env(k8s_url: &str) -> Env {
    let db = TestDb::new().await;
    let (_fake, authentik) = fake_authentik().await;
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("tenants.yaml"), TENANTS).unwrap();
    let kc = format!(
        "apiVersion: v1\nkind: Config\ncurrent-context: fake\nclusters:\n- name: fake\n  cluster:\n    server: {k8s_url}\n\
         contexts:\n- name: fake\n  context:\n    cluster: fake\n    user: u\nusers:\n- name: u\n  user:\n    token: t\n"
    );
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(&kubeconfig, kc).unwrap();
    Env { db, authentik, kubeconfig: kubeconfig.display().to_string(), dir }
}

fn free_port() -> u16 {
    StdListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// `onramp serve` configured by environment only, as deploy/ does.
/// `stderr` piped (to read a refusal) or shown (the test's own output).
fn serve(e: &Env, role: &str, port: u16, vars: &[(&str, &str)], piped: bool) -> Child {
    let mut c = Command::new(env!("CARGO_BIN_EXE_onramp"));
    c.arg("serve")
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("DATABASE_URL", &e.db.url)
        .env("ONRAMP_ROLE", role)
        .env("ONRAMP_LISTEN", format!("127.0.0.1:{port}"))
        .env("ONRAMP_WORKER_LISTEN", "127.0.0.1:0")
        .env("ONRAMP_LOG", "warn")
        .env("ONRAMP_TENANTS", e.dir.path().join("tenants.yaml"))
        .env("ONRAMP_AUTHENTIK_URL", &e.authentik)
        .env("ONRAMP_AUTHENTIK_TOKEN", TOKEN)
        .env("ONRAMP_WEBHOOK_SECRETS", WHSEC)
        .env("ONRAMP_KUBECONFIG", &e.kubeconfig)
        .env("ONRAMP_RECONCILE_INTERVAL", "0s")
        .envs(vars.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(if piped { Stdio::piped() } else { Stdio::inherit() })
        .kill_on_drop(true);
    c.spawn().expect("spawn onramp")
}

/// The process's exit status and its last line on stderr, within a deadline.
async fn refusal(child: Child) -> (bool, String) {
    let out = tokio::time::timeout(Duration::from_secs(60), child.wait_with_output())
        .await
        .expect("a worker that cannot work exits at once")
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let last = stderr.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or_default().to_string();
    (out.status.success(), last)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_that_cannot_reach_slurm_refuses_to_start_naming_the_setting() {
    let (fake, _) = cluster().await;
    let e = env(&fake.url).await;
    let cases: &[(&[(&str, &str)], &str)] = &[
        // the right route, the wrong cluster
        (&[("ONRAMP_SLURM_VIA", "local"), ("ONRAMP_SLURM_CLUSTER", "elsewhere")], "ONRAMP_SLURM_CLUSTER"),
        // kube-exec to a Deployment that is not there
        (&[("ONRAMP_SLURMCTLD_DEPLOYMENT", "no-such-ctld")], "ONRAMP_SLURMCTLD_DEPLOYMENT"),
        // ssh without its key, and a forgotten route
        (&[("ONRAMP_SLURM_VIA", "ssh"), ("ONRAMP_SLURM_SSH_HOST", "ctl1")], "needs ONRAMP_SLURM_SSH_KEY_FILE"),
        (&[("ONRAMP_SLURM_SSH_HOST", "ctl1")], "set ONRAMP_SLURM_VIA=ssh"),
        // Kubernetes not configured at all
        (&[("ONRAMP_KUBECONFIG", "/nonexistent/kubeconfig")], "ONRAMP_KUBECONFIG"),
    ];
    for (vars, named) in cases {
        let (ok, line) = refusal(serve(&e, "worker", free_port(), vars, true)).await;
        assert!(!ok, "{vars:?}: the worker must not start");
        assert!(line.contains(named), "{vars:?}: {line:?} should name {named}");
        assert!(line.starts_with("onramp: "), "{vars:?}: one line: {line:?}");
    }
    // nothing was claimed: no attempt was ever made
    let attempts: i64 = sqlx::query_scalar("select count(*) from step_runs").fetch_one(&e.db.pool).await.unwrap();
    assert_eq!(attempts, 0);
}

async fn ready(port: u16) -> Value {
    let url = format!("http://127.0.0.1:{port}/readyz");
    eventually(Duration::from_secs(30), "the process to be ready", || async {
        let r = reqwest::get(&url).await.ok()?;
        r.status().is_success().then_some(())?;
        r.json::<Value>().await.ok()
    })
    .await
}

fn names(v: &Value) -> Vec<&str> {
    v.as_array().unwrap().iter().map(|k| k.as_str().unwrap()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readiness_says_which_kinds_a_process_runs_and_which_it_accepts() {
    let (fake, _) = cluster().await;
    let e = env(&fake.url).await;
    let api_port = free_port();
    let _api = serve(&e, "api", api_port, &[("ONRAMP_SLURM_VIA", "ssh"), ("ONRAMP_API_TOKEN", SETTINGS_TOKEN)], false);
    let r = ready(api_port).await;
    assert_eq!((r["status"].as_str(), r["worker"].as_bool()), (Some("ready"), Some(false)), "{r}");
    // ONRAMP_API_TOKEN is an admin token while it is set
    let jobs = |port: u16| {
        reqwest::Client::new().get(format!("http://127.0.0.1:{port}/v1/jobs")).bearer_auth(SETTINGS_TOKEN).send()
    };
    assert_eq!(jobs(api_port).await.unwrap().status(), 200);
    // a guessable one stops the API
    let (ok, line) = refusal(serve(&e, "api", free_port(), &[("ONRAMP_API_TOKEN", "short")], true)).await;
    assert!(!ok && line.contains("ONRAMP_API_TOKEN") && line.contains("at least 24 characters"), "{line}");
    assert!(names(&r["runs"]).is_empty(), "the API runs nothing: {r}");
    for kind in ["user.onboard", "user.offboard", "reconcile.full", "tenant.offboard"] {
        assert!(names(&r["accepts"]).contains(&kind), "the API accepts {kind}: {r}");
    }

    let all_port = free_port();
    let _all = serve(&e, "both", all_port, &[("ONRAMP_SLURM_VIA", "local")], false);
    let r = ready(all_port).await;
    assert_eq!(r["worker"].as_bool(), Some(true), "{r}");
    // started without it, the settings' token is revoked
    assert_eq!(jobs(all_port).await.unwrap().status(), 401);
    assert_eq!(jobs(api_port).await.unwrap().status(), 401);
    for kind in ["selftest", "user.onboard", "user.offboard", "reconcile.user", "reconcile.full"] {
        assert!(names(&r["runs"]).contains(&kind), "a worker with its backends runs {kind}: {r}");
    }
}
