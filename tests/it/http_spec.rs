//! The server says what the spec says: every error is problem+json (405 and unknown routes too),
//! every parameter outside its range or set is refused with a message naming it, and a user
//! onboarding Authentik cannot carry out is refused at once, not left to fail later.

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::common::*;
use crate::http_api::token;
use crate::intake_support::{AppOptions, FakeUser, app};
use onramp::http::access::Role;

async fn call(http: &reqwest::Client, method: &str, url: &str, token: &str) -> (StatusCode, String, String, Value) {
    let m = reqwest::Method::from_bytes(method.as_bytes()).unwrap();
    let r = http.request(m, url).bearer_auth(token).send().await.unwrap();
    let status = r.status();
    let header = |n: &str| r.headers().get(n).map(|v| v.to_str().unwrap().to_string()).unwrap_or_default();
    let (ct, allow) = (header("content-type"), header("allow"));
    (status, ct, allow, r.json().await.unwrap_or(Value::Null))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_status_is_problem_json_and_every_parameter_is_checked_in_words() {
    let db = TestDb::new().await;
    let a = app(&db, AppOptions::default()).await;
    let t = token(&a.engine, "spec", Role::Admin, None).await;
    let url = |p: &str| format!("{}{p}", a.base);

    // a route that exists, with a method it does not take: 405, problem+json, Allow
    let (status, ct, allow, p) = call(&a.http, "DELETE", &url("/v1/jobs/4"), &t).await;
    assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED);
    assert_eq!(ct, "application/problem+json");
    assert!(allow.contains("GET"), "Allow: {allow:?}");
    assert_eq!(p["status"], 405);
    assert!(p["detail"].as_str().unwrap().contains("DELETE"), "{p}");
    // no such route: 404, problem+json
    let (status, ct, _, p) = call(&a.http, "GET", &url("/v1/nothing-here"), &t).await;
    assert_eq!(
        (status, ct.as_str(), p["status"].as_i64()),
        (StatusCode::NOT_FOUND, "application/problem+json", Some(404))
    );

    // each parameter outside the spec: 400, naming the parameter and what it takes
    let cases = [
        ("/v1/jobs?limit=0", "limit must be a whole number from 1 to 500, not \"0\""),
        ("/v1/jobs?limit=1000", "limit must be a whole number from 1 to 500, not \"1000\""),
        ("/v1/jobs?limit=abc", "limit must be a whole number from 1 to 500, not \"abc\""),
        ("/v1/jobs?before=abc", "before must be a whole number of at least 1, not \"abc\""),
        ("/v1/jobs?state=bogus", "state must be one of pending, running, waiting, needs_approval"),
        ("/v1/jobs?kind=bogus", "kind must be one of "),
        ("/v1/jobs?created_since=yesterday", "created_since must be a time in RFC 3339 form"),
        ("/v1/jobs?bogus=1", "unknown query parameter \"bogus\""),
        ("/v1/jobs/abc", "a job id is a whole number, not \"abc\""),
        ("/v1/deliveries/abc", "a delivery id is a UUID"),
        (
            "/v1/plans/user.onboard?tenant=foo&hard_cutoff=maybe",
            "the query parameter hard_cutoff must be true or false",
        ),
        ("/v1/plans/user.onboard", "the query parameter tenant is required"),
    ];
    for (path, said) in cases {
        let (status, ct, _, p) = call(&a.http, "GET", &url(path), &t).await;
        assert_eq!((status, ct.as_str()), (StatusCode::BAD_REQUEST, "application/problem+json"), "{path}: {p}");
        let detail = p["detail"].as_str().unwrap_or_default();
        assert!(detail.contains(said), "{path}: {detail:?} should say {said:?}");
        for library in ["Cannot parse", "Failed to deserialize", "component could not be parsed", "invalid digit"] {
            assert!(!detail.contains(library), "{path}: library wording in {detail:?}");
        }
    }
    // the kinds it names are the ones it takes
    let (_, _, _, p) = call(&a.http, "GET", &url("/v1/jobs?kind=bogus"), &t).await;
    assert!(p["detail"].as_str().unwrap().contains("user.onboard"), "{p}");
    for ok in [
        "/v1/jobs?kind=user.onboard&limit=500",
        "/v1/jobs?limit=1&state=failed",
        "/v1/jobs?created_since=2026-11-30T00:00:00Z",
    ] {
        let (status, _, _, p) = call(&a.http, "GET", &url(ok), &t).await;
        assert_eq!(status, StatusCode::OK, "{ok}: {p}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_onboarding_authentik_cannot_carry_out_is_refused_at_once() {
    let db = TestDb::new().await;
    let a = app(&db, AppOptions::default()).await;
    let ops = token(&a.engine, "portal", Role::Operator, None).await;
    let mut gone = FakeUser::new(11, "gone", &["tenant-foo-users"]);
    gone.is_active = false;
    a.add_user(gone);
    a.add_user(FakeUser::new(12, "elsewhere", &["tenant-bar-users"]));
    a.add_user(FakeUser::new(13, "dana", &["tenant-foo-users"]));
    let cases = [
        ("nosuchuser", None, "Authentik has no user nosuchuser"),
        ("root", None, "root"),
        ("gone", None, "gone is deactivated in Authentik"),
        ("elsewhere", None, "is not in Authentik group tenant-foo-users"),
        ("dana", Some("ml-team-foo"), "placing them in account ml-team-foo"),
    ];
    for (user, account, said) in cases {
        let mut body = json!({"kind": "user.onboard", "tenant": "foo", "username": user});
        if let Some(acc) = account {
            body["account"] = json!(acc);
        }
        let r = a.http.post(format!("{}/v1/jobs", a.base)).bearer_auth(&ops).json(&body).send().await.unwrap();
        let status = r.status();
        let p: Value = r.json().await.unwrap();
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{user}: {p}");
        assert!(p["detail"].as_str().unwrap().contains(said), "{user}: {p}");
    }
    let jobs: i64 = sqlx::query_scalar("select count(*) from jobs").fetch_one(&db.pool).await.unwrap();
    assert_eq!(jobs, 0, "no job for a refused onboarding");
    // dana in the tenant's default account: accepted
    let body = json!({"kind": "user.onboard", "tenant": "foo", "username": "dana"});
    let r = a.http.post(format!("{}/v1/jobs", a.base)).bearer_auth(&ops).json(&body).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::ACCEPTED);
}
