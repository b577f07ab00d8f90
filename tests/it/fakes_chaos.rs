//! The fakes' rate-based chaos, RBAC refusals and missing namespaces, driven through their
//! control API's client as a test in another process drives them (the reliability suite does).

use std::time::{Duration, Instant};

use onramp_fakes::authentik::fake_authentik;
use onramp_fakes::chaos::{ChaosKind, ChaosSpec};
use onramp_fakes::client::{AuthentikControl, K8sControl};
use onramp_fakes::k8s::{Access, FakeK8s};
use serde_json::{Value, json};

fn spec(rate: f64, kinds: Vec<ChaosKind>) -> ChaosSpec {
    ChaosSpec { rate, seed: 17, kinds, paths: vec![], retry_after: 3, delay_ms: 300 }
}

#[tokio::test]
async fn fakes_authentik_chaos_answers_429_with_retry_after_and_late_answers_but_never_on_control() {
    let (_fake, url) = fake_authentik().await;
    let ak = AuthentikControl::new(&url);
    let http = reqwest::Client::new();
    let users = format!("{url}/api/v3/core/users/");
    let get = || http.get(&users).bearer_auth(onramp_fakes::authentik::TOKEN).send();

    ak.chaos(Some(&spec(1.0, vec![ChaosKind::TooManyRequests]))).await.unwrap();
    let r = get().await.unwrap();
    assert_eq!(r.status().as_u16(), 429);
    assert_eq!(r.headers()["retry-after"], "3");
    // the control API is exempt
    assert!(ak.groups().await.unwrap().contains(&"tenant-foo-users".to_string()));
    let report = ak.chaos_report().await.unwrap();
    assert_eq!((report.matched, report.injected.get("429").copied()), (1, Some(1)));
    assert_eq!(report.events[0].status, Some(429));
    assert!(report.events[0].path.starts_with("/api/v3/core/users/"), "{:?}", report.events);

    // a timeout: the real answer, late
    ak.chaos(Some(&spec(1.0, vec![ChaosKind::Timeout]))).await.unwrap();
    let t = Instant::now();
    assert_eq!(get().await.unwrap().status().as_u16(), 200);
    assert!(t.elapsed() >= Duration::from_millis(300), "{:?}", t.elapsed());

    // a bad spec is refused; no chaos: no faults and counts cleared
    assert!(ak.chaos(Some(&spec(1.5, vec![ChaosKind::ServerError]))).await.is_err());
    ak.chaos(None).await.unwrap();
    assert_eq!(get().await.unwrap().status().as_u16(), 200);
    assert!(ak.chaos_report().await.unwrap().spec.is_none());
}

#[tokio::test]
async fn fakes_k8s_chaos_fails_its_share_of_the_matching_requests() {
    let fake = FakeK8s::start().await;
    let k8s = K8sControl::new(&fake.url);
    let http = reqwest::Client::new();
    let mut s = spec(0.2, vec![ChaosKind::ServerError, ChaosKind::TooManyRequests, ChaosKind::DropExec]);
    s.paths = vec!["/configmaps".into()];
    k8s.chaos(Some(&s)).await.unwrap();
    let (mut failed, mut by_status) = (0, std::collections::BTreeMap::<u16, u32>::new());
    for i in 0..500 {
        let r = http.get(format!("{}/api/v1/namespaces/t/configmaps/c{i}", fake.url)).send().await.unwrap();
        let code = r.status().as_u16();
        if code != 404 {
            failed += 1;
            *by_status.entry(code).or_default() += 1;
            let body: Value = r.json().await.unwrap();
            assert_eq!(body["kind"], "Status", "{body}");
        }
    }
    // paths not named are left alone
    for _ in 0..50 {
        let r = http.get(format!("{}/api/v1/namespaces/t/pods", fake.url)).send().await.unwrap();
        assert_eq!(r.status().as_u16(), 200);
    }
    assert!((60..140).contains(&failed), "{failed} of 500 failed");
    let report = k8s.chaos_report().await.unwrap();
    assert_eq!(report.matched, 500);
    assert_eq!(report.injected.values().sum::<u64>(), failed);
    // exec's kind never hits a REST request
    assert_eq!(report.injected.get("drop_exec"), None);
    assert_eq!(by_status.get(&429).copied().unwrap_or(0) as u64, report.injected["429"]);
}

#[tokio::test]
async fn fakes_k8s_rbac_refusal_names_the_permission_and_a_deleted_namespace_takes_nothing() {
    let fake = FakeK8s::start().await;
    let k8s = K8sControl::new(&fake.url);
    let http = reqwest::Client::new();
    let secret = |ns: &str| json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s", "namespace": ns}});
    k8s.put("/api/v1/namespaces/gone/secrets/old", &secret("gone")).await.unwrap();
    let access = Access { verb: "get".into(), resource: "secrets".into(), namespace: Some("t".into()) };
    k8s.forbid(&access).await.unwrap();
    let r = http.get(format!("{}/api/v1/namespaces/t/secrets/keys", fake.url)).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 403);
    let body: Value = r.json().await.unwrap();
    let want = "secrets \"keys\" is forbidden: User \"system:serviceaccount:onramp:onramp\" cannot get resource \
                \"secrets\" in API group \"\" in the namespace \"t\"";
    assert_eq!((body["reason"].as_str(), body["message"].as_str()), (Some("Forbidden"), Some(want)));
    // another verb is allowed
    let r = http.post(format!("{}/api/v1/namespaces/t/secrets", fake.url)).json(&secret("t")).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 201);

    k8s.delete_namespace("gone").await.unwrap();
    assert_eq!(k8s.get("/api/v1/namespaces/gone/secrets/old").await.unwrap(), None);
    let r =
        http.post(format!("{}/api/v1/namespaces/gone/secrets", fake.url)).json(&secret("gone")).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 404);
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["message"], "namespaces \"gone\" not found");
}
