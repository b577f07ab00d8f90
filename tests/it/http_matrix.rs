//! Access control, walked as a matrix: every /v1 route × role × own/other tenant (and no token).
//! Also: the served routes and openapi.yaml list the same routes.

use std::collections::BTreeSet;
use std::sync::Arc;

use onramp::domain::tenants::TenantRegistry;
use onramp::engine::{Actor, NewJob, WorkerStats};
use onramp::flows::reconcile::RECONCILE_FULL;
use onramp::http::AppState;
use onramp::http::access::Role;
use reqwest::{Method, StatusCode};
use serde_json::json;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::common::*;
use crate::http_api::token;
use crate::intake_support::Recorded;

const TENANTS: &str = "\
tenants:
  - { name: tenant-a, group: tenant-a-users }
  - { name: tenant-b, group: tenant-b-users }
";

#[derive(Clone, Copy, Debug, PartialEq)]
enum Expect {
    /// Allowed: any of these statuses (the action may find the job in another state).
    Allowed(&'static [u16]),
    Forbidden,
    NotFound,
}
use Expect::*;

struct Case<'a> {
    role: Role,
    scoped: bool,
    /// The job (or token) acted on belongs to the caller's tenant.
    own: bool,
    method: &'a Method,
    path: &'a str,
}

/// What each route should answer. Panics on a /v1 route it does not know, so a new route must
/// be added here (and so to the matrix).
fn expect(c: &Case) -> Expect {
    let hidden = c.scoped && !c.own;
    match (c.method.as_str(), c.path) {
        ("GET", "/v1/whoami" | "/v1/jobs" | "/v1/stream") => Allowed(&[200]),
        ("GET", "/v1/tenants" | "/v1/drift") => Allowed(&[200]),
        // a plan is about a tenant: the caller's own only
        ("GET", "/v1/plans/{flow}") => {
            if hidden {
                Forbidden
            } else {
                Allowed(&[200])
            }
        }
        ("GET", "/v1/jobs/{id}" | "/v1/tenants/{tenant}" | "/v1/tenants/{tenant}/users")
        | ("GET", "/v1/tenants/{tenant}/users/{username}") => {
            if hidden {
                NotFound
            } else {
                Allowed(&[200])
            }
        }
        // a delivery leads to reconcile jobs, which scoped tokens never see
        ("GET", "/v1/deliveries/{id}") => {
            if c.scoped {
                NotFound
            } else {
                Allowed(&[200])
            }
        }
        ("POST", "/v1/jobs/{id}/cancel" | "/v1/jobs/{id}/retry" | "/v1/jobs/{id}/approve") => {
            if c.role < Role::Operator {
                Forbidden
            } else if hidden {
                NotFound
            } else {
                Allowed(&[200, 409])
            }
        }
        // starting work: for the caller's own tenant only
        ("POST", "/v1/jobs") => {
            if c.role < Role::Operator || hidden {
                Forbidden
            } else {
                Allowed(&[202])
            }
        }
        ("GET", "/v1/tokens") => {
            if c.role < Role::Admin {
                Forbidden
            } else {
                Allowed(&[200])
            }
        }
        ("POST", "/v1/tokens") => {
            if c.role < Role::Admin || hidden {
                Forbidden
            } else {
                Allowed(&[201])
            }
        }
        ("POST", "/v1/tokens/{name}/revoke") => {
            if c.role < Role::Admin {
                Forbidden
            } else if hidden {
                NotFound
            } else {
                Allowed(&[204])
            }
        }
        ("GET", "/v1/callbacks") => {
            if c.role < Role::Admin {
                Forbidden
            } else {
                Allowed(&[200])
            }
        }
        ("POST", "/v1/callbacks") => {
            if c.role < Role::Admin || hidden {
                Forbidden
            } else {
                Allowed(&[201])
            }
        }
        ("POST", "/v1/callbacks/{id}/delete") => {
            if c.role < Role::Admin {
                Forbidden
            } else if hidden {
                NotFound
            } else {
                Allowed(&[204])
            }
        }
        (m, p) => panic!("the access matrix does not cover {m} {p}: add it"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_v1_route_by_role_and_tenant() {
    let db = TestDb::new().await;
    let kinds = onramp::flows::declare_all(onramp::flows::registry()).with(Recorded(RECONCILE_FULL));
    let engine = engine(&db, kinds);
    let tenants = TenantRegistry::parse(TENANTS, "matrix").unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let stop = CancellationToken::new();
    let mut state = AppState::new(engine.clone(), Arc::new(WorkerStats::default())).with_tenants(Arc::new(tenants));
    state.plans =
        Some(Arc::new(onramp::dryrun::plan::Planner { cfg: crate::intake_support::dry_config(), authentik: None }));
    tokio::spawn(onramp::http::serve(listener, state, stop.clone()));
    let http = reqwest::Client::new();
    // a finished full reconcile, so that /v1/drift has a report to show
    sqlx::query(
        "insert into jobs (kind, subject, input, outputs, step, queue_state, finished_at, created_by)
         values ('reconcile.full', 'reconcile/full', '{}', $1, 'reconcile', 'succeeded', now(), 'test')",
    )
    .bind(json!({"reconcile": {"tenants": [{"tenant": "tenant-a"}, {"tenant": "tenant-b"}]}}))
    .execute(&db.pool)
    .await
    .unwrap();

    // alice is known in both tenants (an onboarding names her), for /v1/tenants/{tenant}/users/{username}
    for t in ["tenant-a", "tenant-b"] {
        let input = json!({"tenant": t, "account": t, "username": "alice"});
        let later = time::OffsetDateTime::now_utc() + time::Duration::hours(1);
        engine
            .enqueue(&[NewJob::new("user.onboard", &format!("{t}/alice"), input, Actor::cli("t")).at(later)])
            .await
            .unwrap();
    }

    let routes: Vec<(Method, &str)> = onramp::http::routes()
        .iter()
        .filter(|r| r.path.starts_with("/v1/"))
        .map(|r| (Method::from_bytes(r.method.as_str().as_bytes()).unwrap(), r.path))
        .collect();
    assert!(routes.len() >= 14, "{routes:?}");

    let mut checked = 0;
    let mut n = 0;
    for role in [Role::Viewer, Role::Operator, Role::Admin] {
        for scoped in [false, true] {
            let caller = token(&engine, &format!("caller-{role}-{scoped}"), role, scoped.then_some("tenant-a")).await;
            for own in [true, false] {
                let tenant = if own { "tenant-a" } else { "tenant-b" };
                for (method, path) in &routes {
                    n += 1;
                    // a fresh job (and token) for every call, so actions find them in a known state
                    let job = engine
                        .enqueue(&[NewJob::new("selftest", &format!("{tenant}/u{n}"), json!({}), Actor::cli("t"))
                            .at(time::OffsetDateTime::now_utc() + time::Duration::hours(1))])
                        .await
                        .unwrap()[0]
                        .id;
                    let victim = format!("victim-{n}");
                    token(&engine, &victim, Role::Viewer, Some(tenant)).await;
                    // a subscription of the tenant, for the callback routes that act on one
                    let id = match path.starts_with("/v1/callbacks/") {
                        true => callback(&engine, tenant).await,
                        false => job,
                    };
                    // a stored delivery, for the route that shows one
                    let id = match path.starts_with("/v1/deliveries/") {
                        true => delivery(&db.pool, n).await,
                        false => id.to_string(),
                    };
                    let mut url = format!(
                        "{base}{}",
                        path.replace("{id}", &id)
                            .replace("{name}", &victim)
                            .replace("{tenant}", tenant)
                            .replace("{username}", "alice")
                    );
                    if path.contains("{flow}") {
                        url = url.replace("{flow}", "tenant.onboard") + "?tenant=" + tenant;
                    }
                    let mut req = http.request(method.clone(), &url);
                    if path == &"/v1/tokens" && method == Method::POST {
                        req = req.json(&json!({"name": format!("new-{n}"), "role": "viewer", "tenant": tenant}));
                    }
                    if path == &"/v1/callbacks" && method == Method::POST {
                        req = req.json(&json!({"url": "http://127.0.0.1:9/hook", "tenant": tenant}));
                    }
                    if path == &"/v1/jobs" && method == Method::POST {
                        req = req.json(&json!({"kind": "user.onboard", "tenant": tenant, "username": format!("u{n}")}));
                    }
                    // no token: always 401
                    let anon = http.request(method.clone(), &url).send().await.unwrap().status();
                    assert_eq!(anon, StatusCode::UNAUTHORIZED, "{method} {path} without a token");
                    let res = req.bearer_auth(&caller).send().await.unwrap();
                    let status = res.status().as_u16();
                    let case = Case { role, scoped, own, method, path };
                    let want = expect(&case);
                    let ok = match want {
                        Allowed(codes) => codes.contains(&status),
                        Forbidden => status == 403,
                        NotFound => status == 404,
                    };
                    assert!(ok, "{method} {path} as {role} (scoped {scoped}, own {own}): got {status}, want {want:?}");
                    checked += 1;
                }
            }
        }
    }
    assert_eq!(checked, routes.len() * 12);

    // listing never leaks another tenant's jobs
    let scoped = token(&engine, "scoped-viewer", Role::Viewer, Some("tenant-a")).await;
    let body: serde_json::Value =
        http.get(format!("{base}/v1/jobs?limit=500")).bearer_auth(&scoped).send().await.unwrap().json().await.unwrap();
    let tenants: BTreeSet<&str> =
        body["jobs"].as_array().unwrap().iter().map(|j| j["tenant"].as_str().unwrap()).collect();
    assert_eq!(tenants, BTreeSet::from(["tenant-a"]));
    let body: serde_json::Value = http
        .get(format!("{base}/v1/jobs?tenant=tenant-b"))
        .bearer_auth(&scoped)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(body["jobs"].as_array().unwrap().len(), 0);
    // nor do the tenants overview and the drift report
    let get = |path: &'static str| {
        let (http, base, scoped) = (http.clone(), base.clone(), scoped.clone());
        async move {
            let r = http.get(format!("{base}{path}")).bearer_auth(&scoped).send().await.unwrap();
            r.json::<serde_json::Value>().await.unwrap()
        }
    };
    let names = |list: &serde_json::Value, field: &str| -> Vec<String> {
        list.as_array().unwrap().iter().map(|t| t[field].as_str().unwrap().to_string()).collect()
    };
    assert_eq!(names(&get("/v1/tenants").await["tenants"], "name"), ["tenant-a"]);
    assert_eq!(names(&get("/v1/drift").await["report"]["tenants"], "tenant"), ["tenant-a"]);
    stop.cancel();
}

async fn callback(engine: &onramp::engine::Engine, tenant: &str) -> i64 {
    let new = onramp::engine::NewSubscription {
        url: "http://127.0.0.1:9/hook".into(),
        tenant: Some(tenant.into()),
        events: onramp::engine::EventType::DEFAULT.to_vec(),
        created_by: "test".into(),
    };
    engine.create_subscription(&new).await.unwrap().0.id
}

/// `path -> methods` from openapi.yaml, read line by line (the file keeps one style:
/// two-space-indented paths under `paths:`, methods four spaces in).
fn spec_routes() -> BTreeSet<(String, String)> {
    let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/openapi.yaml")).unwrap();
    let mut out = BTreeSet::new();
    let mut in_paths = false;
    let mut path = String::new();
    for line in text.lines() {
        if !line.starts_with(' ') && !line.is_empty() {
            in_paths = line == "paths:";
            continue;
        }
        if !in_paths {
            continue;
        }
        if let Some(p) = line.strip_prefix("  /") {
            path = format!("/{}", p.trim_end_matches(':'));
        } else if let Some(m) = line.strip_prefix("    ") {
            let m = m.trim_end_matches(':');
            if ["get", "post", "put", "patch", "delete"].contains(&m) {
                out.insert((m.to_uppercase(), path.clone()));
            }
        }
    }
    out
}

#[test]
fn openapi_lists_exactly_the_served_routes() {
    let served: BTreeSet<(String, String)> =
        onramp::http::routes().iter().map(|r| (r.method.to_string(), r.path.to_string())).collect();
    let spec = spec_routes();
    let missing: Vec<_> = served.difference(&spec).collect();
    let extra: Vec<_> = spec.difference(&served).collect();
    assert!(missing.is_empty(), "served but not in openapi.yaml: {missing:?}");
    assert!(extra.is_empty(), "in openapi.yaml but not served: {extra:?}");
}

async fn delivery(pool: &sqlx::PgPool, n: usize) -> String {
    let id = uuid::Uuid::now_v7();
    sqlx::query("insert into webhook_deliveries (id, delivery_key, shape, body) values ($1, $2, 'unknown', '{}')")
        .bind(id)
        .bind(format!("test:{n}"))
        .execute(pool)
        .await
        .unwrap();
    id.to_string()
}
