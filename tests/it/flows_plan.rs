//! Plans equal the effects the flows really produce: the plan of a flow (its steps run against
//! the simulation) and a real run of the same flow (against the real Slurm, the fake Kubernetes
//! API, the fake storage CLI, SMTP and the fake Authentik) make the same changes, in the same
//! order, as recorded by the same recorders.

use std::sync::Arc;
use std::time::Duration;

use onramp::domain::names::{SlurmAccount, TenantName, Username};
use onramp::dryrun::plan::{Plan, PlanRequest, plan};
use onramp::effects::Effect;
use onramp::engine::{Actor, NewJob};
use onramp::flows::user_offboard::USER_OFFBOARD;
use onramp::flows::user_onboard::USER_ONBOARD;
use serde_json::json;

use crate::flows_support::{CAROL, Harness, PK, UNIX_USER, short};
use crate::intake_support;

async fn plan_of(h: &Harness, flow: &str, user: bool) -> Plan {
    let req = PlanRequest {
        flow: flow.into(),
        tenant: TenantName::parse(&h.tenant).unwrap(),
        user: user.then(|| Username::parse(UNIX_USER).unwrap()),
        account: user.then(|| SlurmAccount::parse(&h.team).unwrap()),
        hard_cutoff: false,
    };
    let ak = Arc::new(intake_support::client(&h.ak_url));
    let p = plan(&req, &h.dry, h.backends.tenants.clone(), Some(ak)).await.unwrap();
    assert_eq!(p.stopped, None, "{}", p.text());
    p
}

/// Runs the job to success; returns the changes it made.
async fn real_run(h: &Harness, job: NewJob) -> Vec<Effect> {
    let mark = h.log.len();
    let id = h.engine.enqueue(&[job]).await.unwrap()[0].id;
    // a tenant offboarding waits for a second person (not its starter), as a plan takes as given
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    loop {
        let j = h.engine.job(id).await.unwrap();
        if j.state.as_str() == "needs_approval" {
            h.engine.approve(id, &Actor::cli("reviewer")).await.unwrap();
        }
        if j.state.as_str() == "succeeded" {
            break;
        }
        let (state, step, error) = (j.state.as_str(), &j.step, j.last_error.as_deref().unwrap_or(""));
        assert!(state != "failed", "job {id} failed at {step}: {error}");
        assert!(std::time::Instant::now() < deadline, "job {id} is still {state} at {step} after 120 s: {error}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    h.log.since(mark).into_iter().filter(|e| e.write).collect()
}

fn job(h: &Harness, kind: &str) -> NewJob {
    let input = json!({ "tenant": h.tenant, "account": h.team, "username": UNIX_USER, "pk": PK });
    NewJob::new(kind, &format!("{}/{UNIX_USER}", h.tenant), input, Actor::cli("test"))
}

/// The calls, with the smoke test's job name (`onramp-smoke-job<id>-<created>`: a plan has no job) alike.
fn calls(effects: &[Effect]) -> Vec<String> {
    let same_job = |call: &str| match call.split_once("--job-name=onramp-smoke-job") {
        Some((pre, post)) => {
            let rest = post.trim_start_matches(|c: char| c.is_ascii_digit() || c == '-');
            format!("{pre}--job-name=onramp-smoke-job<id>{rest}")
        }
        None => call.to_string(),
    };
    effects.iter().map(|e| format!("{} {}", e.system, same_job(&e.call))).collect()
}

#[tokio::test]
async fn the_plan_of_a_user_onboarding_is_what_the_real_run_does() {
    let _one = CAROL.lock().await;
    let h = Harness::start(short()).await;
    h.ensure_tenant_accounts().await;
    h.add_carol(true);
    h.sync_key();

    let p = plan_of(&h, USER_ONBOARD, true).await;
    let real = real_run(&h, job(&h, USER_ONBOARD)).await;
    assert_eq!(calls(&p.writes()), calls(&real), "plan:\n{}", p.text());
    // not trivially equal: the association, the quota, $HOME and the e-mail are all there
    let text = calls(&real).join("\n");
    for want in ["sacctmgr -i add user onramp-carol", "quota set", "mv -T", "notify send"] {
        assert!(text.contains(want), "{want} missing from\n{text}");
    }
}

#[tokio::test]
async fn the_plan_of_a_user_offboarding_is_what_the_real_run_does() {
    let _one = CAROL.lock().await;
    let h = Harness::start(short()).await;
    h.ensure_tenant_accounts().await;
    h.add_carol(true);
    h.sync_key();
    h.run_to_success(job(&h, USER_ONBOARD)).await;
    h.set_member(false, true);

    let p = plan_of(&h, USER_OFFBOARD, true).await;
    let real = real_run(&h, job(&h, USER_OFFBOARD)).await;
    assert_eq!(calls(&p.writes()), calls(&real), "plan:\n{}", p.text());
    let text = calls(&real).join("\n");
    for want in ["MaxJobs=0", "PATCH /api/v3/core/users/3/", "snapshot create", "archive dump", "delete user"] {
        assert!(text.contains(want), "{want} missing from\n{text}");
    }
}

#[tokio::test]
async fn the_plans_of_a_tenant_onboarding_and_offboarding_are_what_the_real_runs_do() {
    use onramp::flows::tenant::{TENANT_OFFBOARD, TENANT_ONBOARD};
    let _one = CAROL.lock().await;
    let h = Harness::start(short()).await;

    let p = plan_of(&h, TENANT_ONBOARD, false).await;
    let real = real_run(&h, onramp::flows::tenant::job(TENANT_ONBOARD, &h.tenant, Actor::cli("test"))).await;
    assert_eq!(calls(&p.writes()), calls(&real), "plan:\n{}", p.text());
    let text = calls(&real).join("\n");
    for want in ["add account", "networkpolicies", "quota set /tenant/"] {
        assert!(text.contains(want), "{want} missing from\n{text}");
    }

    // carol is a member now (her onboarding done), so the offboarding snapshots her home too
    h.add_carol(true);
    h.sync_key();
    h.run_to_success(job(&h, USER_ONBOARD)).await;
    let p = plan_of(&h, TENANT_OFFBOARD, false).await;
    // the plan names what it acts on: the runbook's names of this tenant
    assert_eq!(p.kubernetes, h.names);
    let (ns, a) = (format!("tenant-{}", h.tenant), &h.account);
    let names = format!("names: namespace {ns} · secret {ns}-authorized-keys · networkpolicy {ns}-isolation");
    assert!(p.text().contains(&names), "{}", p.text());
    let real = real_run(&h, onramp::flows::tenant::job(TENANT_OFFBOARD, &h.tenant, Actor::cli("test"))).await;
    assert_eq!(calls(&p.writes()), calls(&real), "plan:\n{}", p.text());
    let text = calls(&real).join("\n");
    let carol = format!("offboard-{UNIX_USER}-");
    let cluster = format!("DELETE /apis/slurm.nebius.ai/v1/namespaces/{ns}/slurmclusters/cluster-{a}");
    let reservation = format!("DELETE /apis/slurm.nebius.ai/v1/namespaces/{ns}/reservations/{a}-reservation");
    let label = format!("labelSelector=reserved.tenant={a} ");
    for want in
        ["GrpJobs=0", &cluster, &reservation, &label, "snapshot create", &carol, "archive dump", "delete account"]
    {
        assert!(text.contains(want), "{want} missing from\n{text}");
    }
}
