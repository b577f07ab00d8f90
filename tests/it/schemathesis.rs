//! The spec against the running service: schemathesis (PyPI; `scripts/test` installs it) drives
//! the real `onramp serve --role api` process, with a tenant registry, from openapi.yaml, and
//! every response must conform to it (status code, content type, body schema) and none may be a
//! server error. Left out: /v1/stream (an endless event stream). Token revocation runs last, on
//! its own: schemathesis reuses names it has seen in responses, so it revokes its own token, after
//! which every answer is a (documented) 401.

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use onramp::http::access::Role;
use tokio::process::Command;

use crate::common::*;
use crate::http_api::token;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

async fn schemathesis(base: &str, token: &str, only: &[&str], dir: &Path) -> (bool, String) {
    let seed = std::env::var("ONRAMP_SCHEMATHESIS_SEED").unwrap_or_else(|_| "1".into());
    let out = Command::new("python3")
        .args(["-m", "schemathesis.cli", "run", &format!("{ROOT}/openapi.yaml"), "--url", base])
        .args(["-H", &format!("Authorization: Bearer {token}")])
        .args([
            "--checks",
            "not_a_server_error,status_code_conformance,content_type_conformance,response_schema_conformance",
        ])
        // one worker: with two threads, hypothesis' lambda descriptions (ast.parse of schemathesis'
        // own source) sometimes hit CPython 3.11's "AST constructor recursion depth mismatch"
        .args(["--phases", "examples,coverage,fuzzing", "--max-examples", "25", "--seed", &seed, "--workers", "1"])
        .args(["--request-timeout", "10"])
        .args(only)
        .current_dir(dir)
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .output()
        .await
        .unwrap_or_else(|e| panic!("cannot run python3 ({e})"));
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(
        !text.contains("No module named schemathesis"),
        "schemathesis is not installed: `python3 -m pip install schemathesis==4.32.5` (scripts/test does)"
    );
    (out.status.success(), text)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_response_conforms_to_openapi_yaml() {
    let db = TestDb::new().await;
    let admin = token(&engine(&db, onramp::flows::registry()), "schemathesis", Role::Admin, None).await;
    // a finished full reconcile (its report as reconcile_tenants writes it), so that the tenants'
    // measurements and /v1/drift are not null
    let report = serde_json::json!({"reconcile": {"tenants": [
        {"tenant": "foo", "decision": "changes", "unchanged": 1, "held": [], "hold_job": null, "reason": null,
         "skipped": [], "jobs": [{"op": "onboard", "account": "ml-team-foo", "username": "bob",
                                  "reason": "active member of tenant-foo-users with no association", "job": 7, "new": true}],
         "members": {"members": 2, "groups": {"tenant-foo-users": 2, "tenant-foo-ml": 1}, "associations": 1,
                     "slurm_users": 1, "by_account": {"tenant-foo": 1, "ml-team-foo": 0}}},
        {"tenant": "bar", "decision": "skipped", "reason": "Authentik has no group tenant-bar-users"}]}});
    sqlx::query(
        "insert into jobs (kind, subject, input, outputs, step, queue_state, finished_at, created_by)
         values ('reconcile.full', 'reconcile/full', '{\"cause\": \"periodic\"}', $1, 'reconcile', 'succeeded', now(), 'test')",
    )
    .bind(report)
    .execute(&db.pool)
    .await
    .unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let base = format!("http://127.0.0.1:{port}");
    // Authentik answers (the fake, with nobody in it): a user offboarding asks it who is a member
    let (_fake, ak_url) = crate::intake_support::fake_authentik().await;
    let _server = Command::new(env!("CARGO_BIN_EXE_onramp"))
        .args(["serve", "--role", "api"])
        .env("DATABASE_URL", &db.url)
        .env("ONRAMP_LISTEN", format!("127.0.0.1:{port}"))
        .env("ONRAMP_TENANTS", format!("{ROOT}/tests/it/fixtures/tenants.yaml"))
        // the reconcile flows are registered (their jobs can be started) but never run: no worker
        .env("ONRAMP_AUTHENTIK_URL", &ak_url)
        .env("ONRAMP_AUTHENTIK_TOKEN", crate::intake_support::TOKEN)
        .env("ONRAMP_WEBHOOK_TOKENS", "a-secret-schemathesis-does-not-have")
        .env("ONRAMP_LOG", "error")
        .env_remove("ONRAMP_CONFIG")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn onramp");
    let http = reqwest::Client::new();
    eventually(Duration::from_secs(30), "onramp serve to answer", || async {
        http.get(format!("{base}/readyz")).send().await.ok().filter(|r| r.status().is_success())
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    let revoke = "/v1/tokens/{name}/revoke";
    let runs: [&[&str]; 2] = [&["--exclude-path", "/v1/stream", "--exclude-path", revoke], &["--include-path", revoke]];
    for only in runs {
        let (ok, report) = schemathesis(&base, &admin, only, dir.path()).await;
        assert!(ok, "schemathesis found responses that do not conform to openapi.yaml:\n{report}");
        assert!(report.contains("passed"), "{report}");
    }
}
