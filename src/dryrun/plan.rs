//! `onramp plan` and `GET /v1/plans/…`: what a flow would do, in order, with its waits, by
//! running the flow's real steps against the simulation with every call recorded. Nothing
//! outside this process is changed; reads of the real Authentik happen only when it is given.

use std::sync::Arc;

use serde::Serialize;
use serde_json::Value;

use super::sim::{self, DryConfig, SimAuthentik, World};
use crate::backends::authentik::Authentik;
use crate::backends::slurm::{QosSpec, Slurm, SlurmCli};
use crate::domain::names::{SlurmAccount, TenantName, Username};
use crate::domain::tenants::{K8sNames, TenantRegistry};
use crate::effects::{Effect, EffectLog};
use crate::engine::{Flow, Registry, Transition, simulate::simulate};
use crate::flows::user_offboard::{self, USER_OFFBOARD};
use crate::flows::user_onboard::{self, USER_ONBOARD};
use crate::flows::{specs, tenant};

/// The flows a plan can be made of.
pub const FLOWS: [&str; 4] = [USER_ONBOARD, USER_OFFBOARD, tenant::TENANT_ONBOARD, tenant::TENANT_OFFBOARD];

/// What the API's plans are made with: the simulation's settings and, read only, Authentik.
pub struct Planner {
    pub cfg: DryConfig,
    pub authentik: Option<Arc<dyn Authentik>>,
}

/// What to plan.
#[derive(Clone, Debug)]
pub struct PlanRequest {
    pub flow: String,
    pub tenant: TenantName,
    pub user: Option<Username>,
    /// The user's team account; by default the account their Authentik groups place them in,
    /// else the tenant's own account.
    pub account: Option<SlurmAccount>,
    pub hard_cutoff: bool,
}

/// One run of one step: the calls it made and what it decided.
#[derive(Clone, Debug, Serialize)]
pub struct PlanStep {
    pub step: &'static str,
    pub effects: Vec<Effect>,
    /// `done`, `wait 60s`, `poll every 10s for up to 15m`, `needs approval: …`, `retry: …`, `fail: …`.
    pub then: String,
}

#[derive(Clone, Debug, Serialize)]
pub struct Plan {
    pub flow: String,
    pub input: Value,
    /// The tenant's names in Kubernetes the flow acts on (from the tenant registry).
    pub kubernetes: K8sNames,
    /// The address the tenant's users SSH to (`--login-address`, `{tenant}` filled in).
    pub login_address: String,
    /// What the simulation took to be true before the flow starts.
    pub assumptions: Vec<String>,
    pub steps: Vec<PlanStep>,
    /// Why the simulated run stopped before the last step (a step failed), if it did.
    pub stopped: Option<String>,
}

/// A request a plan cannot be made for (the caller's mistake).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct PlanError(pub String);

fn human(d: std::time::Duration) -> String {
    let s = d.as_secs();
    match s {
        0 => format!("{}ms", d.as_millis()),
        s if s % 86_400 == 0 => format!("{}d", s / 86_400),
        s if s % 3_600 == 0 => format!("{}h", s / 3_600),
        s if s % 60 == 0 => format!("{}m", s / 60),
        s => format!("{s}s"),
    }
}

fn then(t: &Transition) -> String {
    match t {
        Transition::Done(_) => "done".into(),
        Transition::Wait(d) => format!("wait {} (durable timer), then run the step again", human(*d)),
        Transition::Poll { every, for_at_most } => {
            format!("poll every {} for up to {}", human(*every), human(*for_at_most))
        }
        Transition::NeedsApproval(why) => format!("needs approval: {why}"),
        Transition::Retry(why) => format!("retry: {why}"),
        Transition::RetryNotBefore(why, after) => format!("retry, not before {}: {why}", human(*after)),
        Transition::Fail(why) => format!("fail: {why}"),
    }
}

fn to_value<T: Serialize>(input: &T) -> Value {
    serde_json::to_value(input).expect("a job input is plain data and serializes")
}

/// Makes the plan.
pub async fn plan(
    req: &PlanRequest,
    cfg: &DryConfig,
    tenants: Arc<TenantRegistry>,
    authentik: Option<Arc<dyn Authentik>>,
) -> Result<Plan, PlanError> {
    if !FLOWS.contains(&req.flow.as_str()) {
        return Err(PlanError(format!("no plan for flow {:?}: one of {}", req.flow, FLOWS.join(", "))));
    }
    let t = tenants
        .tenant(req.tenant.as_str())
        .ok_or_else(|| PlanError(format!("tenant {} is not in the tenant registry", req.tenant)))?
        .clone();
    let user_flow = req.flow.starts_with("user.");
    if user_flow != req.user.is_some() {
        return Err(PlanError(if user_flow {
            format!("{} needs a user", req.flow)
        } else {
            format!("{} takes no user", req.flow)
        }));
    }
    let mut assumptions = vec![];
    let real = authentik.is_some();
    let directory = match &req.user {
        Some(u) if !real => {
            let mut groups = vec![];
            if req.flow == USER_ONBOARD {
                groups.push(t.group.as_str());
                if let Some(team) = t.teams.iter().find(|m| Some(&m.account) == req.account.as_ref()) {
                    groups.push(team.group.as_str());
                }
                assumptions.push(format!(
                    "Authentik is not consulted: {u} is taken to be active, in {}, with an SSH key",
                    t.group
                ));
            } else {
                assumptions.push(format!(
                    "Authentik is not consulted: {u} is taken to be active and no longer in {}",
                    t.group
                ));
            }
            vec![sim::directory_user(10_000, u.as_str(), &groups)]
        }
        _ => vec![],
    };
    if real {
        assumptions.push("users and groups are read from Authentik (GET only; nothing is changed there)".into());
    }
    let ak: Arc<dyn Authentik> = Arc::new(SimAuthentik::new(authentik, directory));
    let account = match (&req.account, &req.user) {
        (Some(a), _) => {
            if !t.accounts().contains(a) {
                return Err(PlanError(format!("account {a} is not one of tenant {}'s accounts", t.name)));
            }
            a.clone()
        }
        (None, Some(u)) => {
            // where their groups place them; else where a plain member of the tenant goes
            let groups = ak.user_by_username(u.as_str()).await.map(|f| f.group_names()).unwrap_or_default();
            let by_groups = t.placement(&groups).pop();
            by_groups.or_else(|| t.placement(std::slice::from_ref(&t.group)).pop()).unwrap_or_else(|| t.account.clone())
        }
        (None, None) => t.account.clone(),
    };

    // The world before the flow: what the flow's own preconditions say must exist.
    let world = World::new(&cfg.cluster, cfg.k8s.clone());
    let seed = SlurmCli::new(world.slurm_host(), cfg.cluster.clone());
    let spec = specs::tenant_spec(&t).map_err(PlanError)?;
    if req.flow != tenant::TENANT_ONBOARD {
        let qos: Vec<QosSpec> = tenants
            .declared_qos(&t)
            .into_iter()
            .map(QosSpec::from_decl)
            .collect::<Result<_, _>>()
            .map_err(PlanError)?;
        seed.ensure_qos(&qos).await.map_err(|e| PlanError(format!("simulation: {e}")))?;
        seed.ensure_tenant(&spec).await.map_err(|e| PlanError(format!("simulation: {e}")))?;
        assumptions.push(format!("tenant {} is onboarded: its accounts exist with the registry's limits", t.name));
    } else {
        assumptions.push(format!("none of tenant {}'s accounts exist yet", t.name));
    }
    if let (Some(u), true) = (&req.user, req.flow == USER_OFFBOARD) {
        let limits = specs::user_limits(&t).map_err(PlanError)?;
        seed.add_users(&account, std::slice::from_ref(u), true, &limits)
            .await
            .map_err(|e| PlanError(format!("simulation: {e}")))?;
        assumptions.push(format!("{u} has an association with {account}"));
    }
    if req.flow == tenant::TENANT_OFFBOARD {
        // the group's current members have their associations (their homes are snapshotted too)
        let limits = specs::user_limits(&t).map_err(PlanError)?;
        let mut members = std::collections::BTreeMap::new();
        for g in t.groups() {
            members.insert(g.to_string(), ak.active_members(g).await.unwrap_or_default());
        }
        let mut seeded = vec![];
        for (u, groups) in crate::flows::reconcile::plan::groups_by_user(&members).values() {
            let Ok(name) = Username::parse(&u.username) else { continue };
            for a in t.placement(groups) {
                seed.add_users(&a, std::slice::from_ref(&name), true, &limits)
                    .await
                    .map_err(|e| PlanError(format!("simulation: {e}")))?;
                seeded.push(format!("{name} ({a})"));
            }
        }
        assumptions.push(match seeded.is_empty() {
            true => "the tenant has no users in Slurm (no group members were found)".into(),
            false => format!("the group's members have their associations: {}", seeded.join(", ")),
        });
    }
    if req.flow.ends_with("offboard") {
        assumptions.push("no job is pending or running (a real drain may wait for them)".into());
    }
    if req.flow == USER_ONBOARD {
        assumptions.push("the Authentik→Secret key sync and the login pod's key projection work at once".into());
    }

    let log = EffectLog::default();
    let backends = sim::backends(cfg, &world, ak, tenants.clone(), &log).map_err(PlanError)?;
    let registry = crate::flows::with_backends(Registry::new(), backends);
    let flow = registry.get(&req.flow).expect("every planned flow is registered").clone();
    let (tenant, account) = (t.name.to_string(), account.to_string());
    let input = match &req.user {
        Some(u) if req.flow == USER_ONBOARD => {
            to_value(&user_onboard::Input { tenant, account, username: u.to_string(), ..Default::default() })
        }
        Some(u) => to_value(&user_offboard::Input {
            tenant,
            account,
            username: u.to_string(),
            hard_cutoff: req.hard_cutoff,
            ..Default::default()
        }),
        None => to_value(&tenant::Input { tenant, hard_cutoff: req.hard_cutoff }),
    };
    let subject = match &req.user {
        Some(u) => format!("{}/{u}", t.name),
        None => format!("{}/tenant", t.name),
    };
    let mut steps = vec![];
    let mut mark = 0;
    let result = simulate(&*flow as &dyn Flow, &subject, input.clone(), |_, step, t| {
        let effects = log.since(mark);
        mark += effects.len();
        steps.push(PlanStep { step, effects, then: then(t) });
    })
    .await;
    let kubernetes = t.kubernetes.clone();
    let login_address = cfg.login_address.replace("{tenant}", t.name.as_str());
    Ok(Plan { flow: req.flow.clone(), input, kubernetes, login_address, assumptions, steps, stopped: result.err() })
}

/// The tenant's Kubernetes names on one line, as `kubectl` would name them.
pub fn names_line(k: &K8sNames) -> String {
    let login = match &k.login_pod {
        Some(p) => format!("pod/{p}"),
        None => format!("a Ready pod of deploy/{}", k.login_deployment),
    };
    let container = k.login_container.as_deref().map(|c| format!(" -c {c}")).unwrap_or_default();
    let reservation = match &k.reservation_namespace {
        Some(ns) => format!("{ns}/{}", k.reservation),
        None => format!("{} (cluster-scoped)", k.reservation),
    };
    format!(
        "namespace {ns} · secret {} · networkpolicy {} · login {login}{container} (deploy/{}) · slurmcluster {} · \
         reservation {reservation} · nodes {}={}",
        k.keys_secret,
        k.network_policy,
        k.login_deployment,
        k.slurm_cluster,
        crate::backends::kubernetes::tenant::TENANT_LABEL,
        k.node_label,
        ns = k.namespace,
    )
}

impl Plan {
    /// Every change, in order.
    pub fn writes(&self) -> Vec<Effect> {
        self.steps.iter().flat_map(|s| s.effects.iter().filter(|e| e.write).cloned()).collect()
    }

    /// For people: numbered steps with their calls (reads marked) and what follows.
    pub fn text(&self) -> String {
        let mut out = format!("plan of {} {}\n", self.flow, self.input);
        out.push_str(&format!("  names: {}\n", names_line(&self.kubernetes)));
        out.push_str(&format!("  login: {}\n", self.login_address));
        for a in &self.assumptions {
            out.push_str(&format!("  assumes: {a}\n"));
        }
        for (i, s) in self.steps.iter().enumerate() {
            out.push_str(&format!("\n{:>2}. {}\n", i + 1, s.step));
            for e in &s.effects {
                out.push_str(&format!("      {} {:<14} {}\n", if e.write { "+" } else { " " }, e.system, e.call));
            }
            out.push_str(&format!("      → {}\n", s.then));
        }
        if let Some(why) = &self.stopped {
            out.push_str(&format!("\nthe plan stops: {why}\n"));
        }
        out.push_str("\n(+ = a change; the other lines are reads)\n");
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backends::slurm::HostPath;
    use crate::domain::names::ClusterName;

    fn cfg() -> DryConfig {
        DryConfig {
            cluster: ClusterName::parse("production").unwrap(),
            k8s: Default::default(),
            storage: Default::default(),
            timings: Default::default(),
            archive_dir: HostPath::parse("/var/spool/slurm/archive").unwrap(),
            login_address: "login.example".into(),
            notify: false,
            batch_window: std::time::Duration::ZERO,
        }
    }

    async fn onboard(qos: &str) -> Plan {
        let yaml = format!(
            "qos:\n  - {{ name: high, priority: 100, max_tres_per_user: gres/gpu=8 }}\ntenants:\n  - name: foo\n    \
             group: foo-users\n    user_defaults: {{ default_qos: normal, qos: [{qos}] }}\n"
        );
        let reg = Arc::new(TenantRegistry::parse(&yaml, "t").unwrap());
        let req = PlanRequest {
            flow: tenant::TENANT_ONBOARD.into(),
            tenant: TenantName::parse("foo").unwrap(),
            user: None,
            account: None,
            hard_cutoff: false,
        };
        plan(&req, &cfg(), reg, None).await.unwrap()
    }

    #[tokio::test]
    async fn tenant_onboarding_creates_the_declared_qos_first() {
        let p = onboard("normal, high").await;
        assert_eq!(p.steps[0].step, "qos");
        let calls: Vec<String> = p.writes().iter().map(|e| e.call.clone()).collect();
        assert_eq!(calls[0], "sacctmgr -i add qos high Priority=100 MaxTRESPerUser=gres/gpu=8", "{}", p.text());
        assert!(calls[1].starts_with("sacctmgr -i add account"), "{}", p.text());
        assert_eq!(p.stopped, None, "{}", p.text());
    }

    #[tokio::test]
    async fn a_qos_neither_declared_nor_in_slurm_stops_the_onboarding_before_any_account() {
        let p = onboard("normal, premium").await;
        assert!(p.writes().is_empty(), "{}", p.text());
        let why = p.steps[0].then.clone();
        assert!(why.starts_with("fail: ") && why.contains("QOS premium") && why.contains("qos:"), "{why}");
    }
}
