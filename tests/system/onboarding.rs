//! A burst of signed webhooks for the users of two tenants: every user ends up onboarded, checked
//! outside onramp — the association with an independent `sacctmgr show assoc`, the key in the
//! tenant's Secret at the fake Kubernetes API, the `$HOME` made through the tenant's login pod,
//! the quota at the fake storage CLI, the e-mail at the SMTP server — also when a worker is
//! `kill -9`ed mid-run.
//!
//! Users per tenant: `ONRAMP_SYSTEM_USERS` (default 100, so 200 users).

use std::collections::{BTreeMap, BTreeSet};
use std::os::unix::fs::MetadataExt;
use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use tokio::sync::Semaphore;

use crate::world::cluster::{self, User};
use crate::world::webhook::{self, Delivery};
use crate::world::{Options, SlurmVia, World};

fn per_tenant() -> usize {
    std::env::var("ONRAMP_SYSTEM_USERS").ok().and_then(|n| n.parse().ok()).unwrap_or(100)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_burst_of_webhooks_onboards_every_user_even_when_a_worker_is_killed() {
    let mut w = World::start(Options::new(SlurmVia::KubeExec)).await;
    let users = cluster::users(&w.tenants, per_tenant());
    burst(&w, &users).await;

    // kill -9 a worker once a quarter of the users are through; restart it after more progress
    let quarter = users.len() / 4;
    wait_progress(&w, quarter).await;
    w.kill_worker(1).await;
    let at_kill = succeeded(&w).await;
    wait_progress(&w, (at_kill + 10).min(users.len())).await;
    w.restart_worker(1).await;

    w.wait_jobs("user.onboard", users.len(), Duration::from_secs(600)).await;
    check(&w, &users).await;
    w.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn onboarding_with_sacctmgr_on_the_host() {
    // every process exports its spans to this test (OTLP/HTTP, protobuf: the default)
    let receiver = crate::otlp::Receiver::start();
    let mut opts = Options::new(SlurmVia::Local);
    opts.settings.insert("OTEL_EXPORTER_OTLP_ENDPOINT".into(), receiver.base.clone());
    let mut w = World::start(opts).await;
    let users = cluster::users(&w.tenants, per_tenant().min(20));
    burst(&w, &users).await;
    w.wait_jobs("user.onboard", users.len(), Duration::from_secs(300)).await;
    check(&w, &users).await;
    w.stop().await;
    // after SIGTERM every process has flushed its spans
    let jobs: Vec<(i64, String)> =
        sqlx::query_as("select id, split_part(subject, '/', 1) from jobs where kind = 'user.onboard'")
            .fetch_all(&w.db.pool)
            .await
            .unwrap();
    let steps =
        ["preflight", "resolve_user", "key_in_secret", "propagation_wait", "slurm_association", "smoke_test", "notify"];
    let chained = crate::traces::check_onboardings(&receiver.spans(), &jobs, &steps);
    assert!(chained >= 1, "no onboarding traced from its webhook's request: {chained} of {}", jobs.len());
}

/// A delivery per user ("user created"), one per tenant group ("members added"), and a second
/// copy of every tenth (a retried delivery).
pub fn deliveries(w: &World, users: &[User]) -> Vec<Delivery> {
    let mut d: Vec<Delivery> = users.iter().map(|u| Delivery::new(&webhook::user_created(u.pk, &u.username))).collect();
    for t in &w.tenants {
        let pks: Vec<i64> = users.iter().filter(|u| u.tenant == t.name).map(|u| u.pk).collect();
        let group_pk = onramp_fakes::authentik::group_uuid(&t.group);
        d.push(Delivery::new(&webhook::group_members_added(&group_pk, &t.group, &pks)));
    }
    let again: Vec<Delivery> =
        d.iter().step_by(10).map(|x| Delivery { id: x.id.clone(), ts: x.ts, body: x.body.clone() }).collect();
    d.extend(again);
    d
}

/// The users appear in Authentik and the webhook gets [`deliveries`].
pub async fn burst(w: &World, users: &[User]) {
    w.add_users(users).await;
    let deliveries = deliveries(w, users);

    let gate = Arc::new(Semaphore::new(16));
    let mut sent = tokio::task::JoinSet::new();
    for d in deliveries {
        let (http, url, gate) = (w.http.clone(), w.webhook_url(), gate.clone());
        sent.spawn(async move {
            let _permit = gate.acquire_owned().await.unwrap();
            d.send(&http, &url).await
        });
    }
    while let Some(status) = sent.join_next().await {
        let status = status.unwrap();
        assert!(status.is_success(), "a delivery was answered {status}");
    }
}

async fn succeeded(w: &World) -> usize {
    w.db.states("user.onboard").await.get("succeeded").copied().unwrap_or(0) as usize
}

async fn wait_progress(w: &World, n: usize) {
    w.wait_jobs("user.onboard", n, Duration::from_secs(300)).await;
}

/// Every effect of every user's onboarding, read outside onramp.
pub async fn check(w: &World, users: &[User]) {
    // one onboarding job per user, each for the right tenant and account
    let jobs: BTreeSet<(String, String, String)> =
        w.db.inputs("user.onboard", "succeeded")
            .await
            .iter()
            .map(|i| {
                (
                    i["tenant"].as_str().unwrap().into(),
                    i["account"].as_str().unwrap().into(),
                    i["username"].as_str().unwrap().into(),
                )
            })
            .collect();
    let want: BTreeSet<(String, String, String)> =
        users.iter().map(|u| (u.tenant.to_string(), u.account.clone(), u.username.clone())).collect();
    assert_eq!(jobs, want, "the succeeded onboarding jobs");
    let states = w.db.states("user.onboard").await;
    assert_eq!(states.values().sum::<i64>() as usize, users.len(), "onboarding jobs: {states:?}");

    check_associations(w, users);
    check_keys(w, users).await;
    check_homes(w, users).await;
    check_quotas(w, users);
    check_mail(w, users).await;
    check_slurm_route(w).await;
}

/// `sacctmgr show assoc`: each user has exactly one association, under their account, with the
/// tenant's user defaults; nobody else is under the world's accounts.
pub fn check_associations(w: &World, users: &[User]) {
    let mut accounts: Vec<&str> = w.tenants.iter().map(|t| t.account.as_str()).collect();
    accounts.extend(w.tenants.iter().filter_map(|t| t.team.as_ref().map(|(a, _)| a.as_str())));
    let rows = cluster::assocs(&accounts);
    let by_user: BTreeMap<&str, Vec<&cluster::Assoc>> =
        rows.iter().filter(|r| !r.user.is_empty()).fold(BTreeMap::new(), |mut m, r| {
            m.entry(r.user.as_str()).or_default().push(r);
            m
        });
    let want: BTreeSet<&str> = users.iter().map(|u| u.username.as_str()).collect();
    let extra: Vec<&&str> = by_user.keys().filter(|u| !want.contains(**u)).collect();
    let missing: Vec<&&str> = want.iter().filter(|u| !by_user.contains_key(**u)).collect();
    assert!(extra.is_empty() && missing.is_empty(), "under {accounts:?}: missing {missing:?}, not wanted {extra:?}");
    for u in users {
        let got = by_user.get(u.username.as_str()).unwrap_or_else(|| panic!("no association of {}", u.username));
        assert_eq!(got.len(), 1, "{}: {got:?}", u.username);
        let a = got[0];
        assert_eq!(
            (a.account.as_str(), a.max_jobs.as_str(), a.qos.as_str(), a.default_qos.as_str()),
            (u.account.as_str(), u.max_jobs.to_string().as_str(), "normal", "normal"),
            "{}'s association",
            u.username
        );
    }
}

/// The tenant's key Secret at the fake API holds exactly its users' keys.
pub async fn check_keys(w: &World, users: &[User]) {
    let b64 = base64::engine::general_purpose::STANDARD;
    for t in &w.tenants {
        let n = cluster::tenant_k8s(t.name);
        let url = format!("/api/v1/namespaces/{}/secrets/{}", n.namespace, n.key_secret);
        let secret = w.k8s.get(&url).await.unwrap().unwrap_or_else(|| panic!("no Secret {url}"));
        let data = secret["data"].as_object().cloned().unwrap_or_default();
        let mine: Vec<&User> = users.iter().filter(|u| u.tenant == t.name).collect();
        let names: BTreeSet<&str> = data.keys().map(String::as_str).collect();
        assert_eq!(names, mine.iter().map(|u| u.username.as_str()).collect(), "the entries of {url}");
        for u in mine {
            let text = String::from_utf8(b64.decode(data[&u.username].as_str().unwrap()).unwrap()).unwrap();
            let blob = u.key.split_whitespace().nth(1).unwrap();
            assert!(text.contains(blob), "{url}[{}] = {text:?}", u.username);
        }
    }
}

/// `$HOME` exists, owned by the user's numbers, mode 700, from the skeleton; it was made through
/// the user's tenant's login pod (the rename into place ran there) and never made twice.
pub async fn check_homes(w: &World, users: &[User]) {
    let execs = w.k8s.execs().await.unwrap();
    let root = w.path("home");
    for u in users {
        let home = root.join(&u.username);
        let m = std::fs::metadata(&home).unwrap_or_else(|e| panic!("{}: {e}", home.display()));
        assert_eq!((m.uid(), m.gid(), m.mode() & 0o777), (u.uid(), u.uid(), 0o700), "{}", home.display());
        assert!(home.join(".bashrc").exists(), "{} has the skeleton", home.display());
        let target = home.display().to_string();
        let renames: Vec<_> = execs.iter().filter(|e| e.argv[0] == "mv" && e.argv.last() == Some(&target)).collect();
        let pod = cluster::tenant_k8s(u.tenant);
        assert!(!renames.is_empty(), "no rename into {target} through a login pod");
        assert!(renames.iter().all(|e| e.namespace == pod.namespace && e.pod == pod.login_pod), "{renames:?}");
        assert!(renames.iter().filter(|e| e.code == Some(0)).count() <= 1, "{target} made twice: {renames:?}");
    }
}

/// The fake storage CLI was asked for each user's `$HOME` quota from the registry.
pub fn check_quotas(w: &World, users: &[User]) {
    let calls = std::fs::read_to_string(w.path("storage/calls.jsonl")).unwrap_or_default();
    let calls: BTreeSet<Vec<String>> = calls.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    for u in users {
        let want: Vec<String> =
            ["weka", "fs", "quota", "set", &format!("/home/{}", u.username), "--hard", "10GB", "--soft", "9GB"]
                .map(String::from)
                .to_vec();
        assert!(calls.contains(&want), "no home quota for {}", u.username);
    }
}

/// Each user's welcome e-mails at the SMTP server: how many copies of each message (by its
/// Message-ID, the same on every attempt of one job's notify step).
pub fn mail_by_user(w: &World, users: &[User]) -> BTreeMap<String, BTreeMap<String, usize>> {
    let mails = w.smtpd.messages();
    let mut by_user = BTreeMap::new();
    for u in users {
        let to = format!("To: {}@example.org", u.username);
        let mut ids: BTreeMap<String, usize> = BTreeMap::new();
        for m in mails.iter().filter(|m| m.lines().any(|l| l == to)) {
            let id = m.lines().find_map(|l| l.strip_prefix("Message-ID: ")).unwrap_or("(none)");
            *ids.entry(id.to_string()).or_default() += 1;
        }
        by_user.insert(u.username.clone(), ids);
    }
    by_user
}

/// One welcome e-mail per user at the SMTP server. A second copy of that same message only
/// where the worker died in the notify step between the server taking it and recording the send.
pub async fn check_mail(w: &World, users: &[User]) {
    let interrupted: BTreeSet<String> = w.db.interrupted("notify").await.into_iter().collect();
    for (user, ids) in mail_by_user(w, users) {
        assert_eq!(ids.len(), 1, "{user} got different e-mails: {ids:?}");
        let copies = ids.values().sum::<usize>();
        let allowed = if interrupted.contains(&user) { 1..=2 } else { 1..=1 };
        assert!(allowed.contains(&copies), "{user} got {copies} copies of {ids:?}");
    }
}

/// sacctmgr ran where the setting says: in the slurmctld pod (exec through the fake) or here.
async fn check_slurm_route(w: &World) {
    let execs = w.k8s.execs().await.unwrap();
    let in_pod = execs.iter().filter(|e| e.namespace == "slurm-control" && e.argv[0] == "sacctmgr").count();
    match w.opts.slurm_via {
        SlurmVia::KubeExec => assert!(in_pod > 0, "no sacctmgr exec in the slurmctld pod"),
        SlurmVia::Local => assert_eq!(in_pod, 0, "sacctmgr ran in the slurmctld pod"),
    }
}
