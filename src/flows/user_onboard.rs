//! `user.onboard`: the runbook's "Onboarding flow: new user", one step per runbook step. Each
//! step is idempotent, reads its effect back, and returns what it found and did as its output
//! (the job's step history). Input: what the reconciler enqueues (`tenant`, `account`,
//! `username`, and when known `pk`, `uid_number`, `gid_number`).

use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::json;

use super::backends::{Backends, StepError};
use super::{StepResult, earlier, finish, specs};
use crate::backends::kubernetes::keys::KeyState;
use crate::backends::kubernetes::login::{HomeOutcome, SMOKE_JOB, SmokeRun};
use crate::domain::names::{SlurmAccount, TenantName, Username};
use crate::domain::sshkey::PublicKey;
use crate::engine::{Actor, Claim, Flow, NewJob, RetryPolicy, StepCtx, StepFuture, Transition};

/// The kind of job this flow runs.
pub const USER_ONBOARD: &str = "user.onboard";

crate::flows::steps! {
    /// The steps, in order (`Step::NAMES` are their names in the job history).
    pub enum Step {
        Preflight = "preflight",
        ResolveUser = "resolve_user",
        KeyInSecret = "key_in_secret",
        PropagationWait = "propagation_wait",
        SlurmAssociation = "slurm_association",
        HomeQuota = "home_quota",
        HomeDirectory = "home_directory",
        KeyProjected = "key_projected",
        LoginRestart = "login_restart",
        SmokeTest = "smoke_test",
        Notify = "notify",
    }
}

pub const STEPS: &[&str] = Step::NAMES;

/// The job's input, as the reconciler and the API write it.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
pub struct Input {
    pub tenant: String,
    pub account: String,
    pub username: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pk: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid_number: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gid_number: Option<u32>,
    /// Why the job was asked for (the reconciler's reason, the API's token).
    #[serde(default)]
    pub reason: String,
    /// What caused it (a webhook delivery, a periodic pass, an API caller).
    #[serde(default)]
    pub cause: String,
}

impl Input {
    /// The onboarding job of this input: one unfinished job per (account, user).
    pub fn job(&self, actor: Actor) -> NewJob {
        super::user_job(USER_ONBOARD, (&self.tenant, &self.account, &self.username), self, actor)
    }
}

/// What `resolve_user` found in Authentik, used by the later steps.
#[derive(Clone, Debug, Deserialize, Serialize)]
pub struct Resolved {
    pub pk: i64,
    pub uid: u32,
    pub gid: u32,
    pub email: String,
    pub key: String,
    pub fingerprint: String,
}

/// What `key_projected` found in the login pod.
#[derive(Clone, Debug, Deserialize, Serialize)]
pub struct Projected {
    pub projected: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub found: Option<String>,
}

pub struct UserOnboard(pub Arc<Backends>);

/// Checked names of the input.
pub(crate) struct Names {
    pub tenant: TenantName,
    pub account: SlurmAccount,
    pub user: Username,
}

pub(crate) fn names(tenant: &str, account: &str, user: &str) -> Result<Names, Transition> {
    let bad = |e: crate::domain::names::NameError| Transition::Fail(format!("job input: {e}"));
    Ok(Names {
        tenant: TenantName::parse(tenant).map_err(bad)?,
        account: SlurmAccount::parse(account).map_err(bad)?,
        user: Username::parse(user).map_err(bad)?,
    })
}

/// What `resolve_user` found (every step after it needs it).
pub(super) fn resolved(ctx: &StepCtx) -> Result<Resolved, Transition> {
    earlier(ctx, Step::ResolveUser.name())
}

impl Flow for UserOnboard {
    fn kind(&self) -> &'static str {
        USER_ONBOARD
    }
    fn steps(&self) -> &'static [&'static str] {
        STEPS
    }
    fn policy(&self, step: usize) -> RetryPolicy {
        match Step::ALL[step] {
            // A notification gives up after fewer tries; its failure never undoes the flow.
            Step::Notify => self.0.policy(4),
            _ => self.0.policy(self.0.timings.retry_attempts),
        }
    }
    fn run<'a>(&'a self, step: usize, ctx: &'a StepCtx) -> StepFuture<'a> {
        Box::pin(async move { finish(self.step(Step::ALL[step], ctx).await) })
    }
}

impl UserOnboard {
    async fn step(&self, step: Step, ctx: &StepCtx) -> StepResult {
        let input: Input = ctx.input()?;
        let n = names(&input.tenant, &input.account, &input.username)?;
        let b = &*self.0;
        match step {
            Step::Preflight => preflight(b, &n).await,
            Step::ResolveUser => resolve(b, &n, &input, ctx).await,
            Step::KeyInSecret => key_in_secret(b, &n, ctx).await,
            Step::PropagationWait => Ok(if ctx.waited {
                Transition::Done(json!({ "waited_secs": b.timings.propagation.as_secs_f64() }))
            } else {
                Transition::Wait(b.timings.propagation)
            }),
            Step::SlurmAssociation => association(b, &n).await,
            Step::HomeQuota => home_quota(b, &n, ctx).await,
            Step::HomeDirectory => {
                let (r, login) = (resolved(ctx)?, b.login(b.k8s_names(&n.tenant)?));
                let out = login.ensure_home(&n.user, r.uid, r.gid).await.step("create $HOME")?;
                let home = login.home(&n.user);
                Ok(Transition::Done(json!({ "home": home, "created": out == HomeOutcome::Created,
                                            "owner": format!("{}:{}", r.uid, r.gid) })))
            }
            Step::KeyProjected => key_projected(b, &n, ctx).await,
            Step::LoginRestart => login_restart(b, &n, ctx).await,
            Step::SmokeTest => smoke(b, &n, ctx).await,
            Step::Notify => super::welcome::notify(b, &n, ctx).await,
        }
    }
}

/// Runbook step 0: the tenant account and the user's team account exist, with the registry's limits.
async fn preflight(b: &Backends, n: &Names) -> StepResult {
    let tenant = b.tenant(n.tenant.as_str())?;
    if !tenant.accounts().contains(&n.account) {
        return Ok(Transition::Fail(format!("account {} is not one of tenant {}'s accounts", n.account, n.tenant)));
    }
    let spec = specs::tenant_spec(tenant).map_err(Transition::Fail)?;
    let accounts = [tenant.account.clone(), n.account.clone()];
    let assocs = b.slurm.associations(&accounts).await.step("read the tenant's accounts")?;
    let find = |a: &SlurmAccount| assocs.iter().find(|x| x.user.is_empty() && x.account == a.as_str());
    let mut problems = vec![];
    let Some(top) = find(&tenant.account) else {
        return Ok(Transition::Fail(format!(
            "tenant account {} does not exist in Slurm: onboard the tenant first (tenant.onboard)",
            tenant.account
        )));
    };
    if find(&n.account).is_none() {
        return Ok(Transition::Fail(format!(
            "team account {} does not exist in Slurm: onboard the tenant first (tenant.onboard)",
            n.account
        )));
    }
    let want = &spec.account.limits;
    if let Some(f) = want.fairshare
        && f != top.fairshare
    {
        problems.push(format!("Fairshare is {:?}, the registry says {:?}", top.fairshare, f));
    }
    if let Some(j) = want.grp_jobs
        && j != top.grp_jobs
    {
        problems.push(format!("GrpJobs is {}, the registry says {j}", top.grp_jobs));
    }
    if let Some(t) = &want.grp_tres
        && t != &top.grp_tres
    {
        problems.push(format!("GrpTRES is {}, the registry says {t}", top.grp_tres));
    }
    if !problems.is_empty() {
        return Ok(Transition::Fail(format!(
            "tenant account {} does not have the registry's limits ({}): run tenant.onboard to converge them",
            tenant.account,
            problems.join("; ")
        )));
    }
    Ok(Transition::Done(json!({ "tenant_account": tenant.account, "account": n.account,
                                "fairshare": top.fairshare, "grp_jobs": top.grp_jobs,
                                "grp_tres": top.grp_tres.to_string() })))
}

/// Runbook step 1: the user in Authentik is active, in the tenant's group, with uid/gid and a key.
async fn resolve(b: &Backends, n: &Names, input: &Input, ctx: &StepCtx) -> StepResult {
    let tenant = b.tenant(n.tenant.as_str())?;
    b.tenants.identities.check_name(n.user.as_str()).map_err(Transition::Fail)?;
    let user = match input.pk {
        Some(pk) => b.authentik.user(pk).await.step("read the user from Authentik")?,
        None => b.authentik.user_by_username(n.user.as_str()).await.step("read the user from Authentik")?,
    };
    if user.username != n.user.as_str() {
        return Ok(Transition::Fail(format!(
            "Authentik user {} is now named {:?}, not {}",
            user.pk, user.username, n.user
        )));
    }
    if !user.is_active {
        return Ok(Transition::Fail(format!("{} is deactivated in Authentik", n.user)));
    }
    let groups = user.group_names();
    if !tenant.placement(&groups).contains(&n.account) {
        return Ok(Transition::Fail(format!(
            "{} is no longer a member of {} placing them in {} (groups: {groups:?})",
            n.user, tenant.group, n.account
        )));
    }
    let (uid, gid) = b.tenants.check_identity(n.user.as_str(), user.pk, &user.attributes).map_err(Transition::Fail)?;
    // one uid, one user, for good (files of a former user must never become someone else's)
    if let Some(jobs) = ctx.jobs()
        && let Claim::Taken { owner } =
            jobs.claim("uid", &uid.to_string(), n.user.as_str(), ctx.job_id).await.step("claim the uid")?
    {
        return Ok(Transition::Fail(format!(
            "{}'s uid {uid} is already {owner}'s: each user needs a uid of their own",
            n.user
        )));
    }
    let keys = user.ssh_keys();
    let Some(key) = keys.iter().find_map(|k| PublicKey::parse(k).ok()) else {
        return Ok(Transition::Fail(format!(
            "{} has no usable SSH public key in Authentik (attributes.sshPublicKey); ask them to add one",
            n.user
        )));
    };
    let r = Resolved {
        pk: user.pk,
        uid,
        gid,
        email: user.email.clone(),
        key: key.to_line(),
        fingerprint: key.fingerprint(),
    };
    Ok(Transition::done(&r))
}

/// Runbook step 2: the key is in the tenant's Secret (written when onramp manages keys).
async fn key_in_secret(b: &Backends, n: &Names, ctx: &StepCtx) -> StepResult {
    let r = resolved(ctx)?;
    let key = PublicKey::parse(&r.key).map_err(|e| Transition::Fail(format!("key: {e}")))?;
    let (mut wrote, k) = (false, b.k8s_names(&n.tenant)?);
    if b.k8s_settings.manage_keys {
        let applied = b.k8s.put_key(k, &n.user, &key).await.step("write the key into the Secret")?;
        wrote = applied == crate::backends::kubernetes::keys::Applied::Changed;
    }
    let state = b.k8s.key_state(k, &n.user, &key).await.step("read the tenant's key Secret")?;
    Ok(match state {
        KeyState::Matches => Transition::Done(json!({ "secret": k.keys_secret, "namespace": k.namespace,
                                                      "fingerprint": r.fingerprint, "written": wrote })),
        other if ctx.poll_expired() => Transition::Fail(format!(
            "the key {} of {} did not appear in Secret {}/{} in time ({other:?}): is the Authentik→Secret sync running?",
            r.fingerprint, n.user, k.namespace, k.keys_secret
        )),
        _ => Transition::Poll { every: b.timings.key_poll, for_at_most: b.timings.key_deadline },
    })
}

/// Runbook step 3: the association with the tenant's user defaults (through the batch call).
/// An association left blocked by an earlier offboarding is unblocked.
async fn association(b: &Backends, n: &Names) -> StepResult {
    let tenant = b.tenant(n.tenant.as_str())?;
    let limits = specs::user_limits(tenant).map_err(Transition::Fail)?;
    let users = [n.user.clone()];
    let ensured = b.slurm.add_users(&n.account, &users, true, &limits).await.step("add the Slurm user")?;
    // as the read after the (batched) add found it: that read verified it, no need to ask again
    let Some(state) = ensured.users.get(n.user.as_str()) else {
        return Ok(Transition::Retry(format!("Slurm does not show user {} after adding it", n.user)));
    };
    let Some(assoc) = state.assocs.iter().find(|a| a.account == n.account.as_str()) else {
        return Ok(Transition::Retry(format!("Slurm does not show {}'s association with {}", n.user, n.account)));
    };
    let mut unblocked = false;
    // An offboarding's block (MaxSubmitJobs=0 stays after the limits above converge).
    if assoc.is_blocked() || assoc.max_submit_jobs == crate::backends::slurm::Limit::At(0) {
        let account = std::slice::from_ref(&n.account);
        b.slurm.unblock_user(&n.user, account, &limits).await.step("lift the offboarding block")?;
        unblocked = true;
    }
    Ok(Transition::Done(json!({ "account": n.account, "created": ensured.created, "changed": ensured.changed,
                                "unblocked": unblocked, "max_jobs": assoc.max_jobs, "qos": assoc.qos,
                                "default_account": state.default_account })))
}

/// Runbook step 4: the `$HOME` quota from the tenant's registry entry.
async fn home_quota(b: &Backends, n: &Names, ctx: &StepCtx) -> StepResult {
    let tenant = b.tenant(n.tenant.as_str())?;
    let Some(q) = &tenant.quotas.home else {
        return Ok(Transition::Done(json!({ "skipped": "the tenant has no home quota" })));
    };
    super::verify::quota(b, &super::verify::home_place(tenant, &n.user), q, "$HOME", ctx).await
}

/// After the propagation wait: is the key in the login pod? Not yet: wait once more, then the
/// next step restarts the login Deployment.
async fn key_projected(b: &Backends, n: &Names, ctx: &StepCtx) -> StepResult {
    let r = resolved(ctx)?;
    let key = PublicKey::parse(&r.key).map_err(|e| Transition::Fail(format!("key: {e}")))?;
    let login = b.login(b.k8s_names(&n.tenant)?);
    let state = login.key_projected(&n.user, &key).await.step("read the key in the login pod")?;
    Ok(match state {
        KeyState::Matches => Transition::done(&Projected { projected: true, found: None }),
        _ if !ctx.waited => Transition::Wait(b.timings.propagation),
        other => Transition::done(&Projected { projected: false, found: Some(format!("{other:?}")) }),
    })
}

/// The runbook's remedy for "claims success but user can't log in": rollout restart the login
/// Deployment, wait, check again; then fail with the diagnosis.
async fn login_restart(b: &Backends, n: &Names, ctx: &StepCtx) -> StepResult {
    if ctx.output_of::<Projected>(Step::KeyProjected.name()).is_some_and(|p| p.projected) {
        return Ok(Transition::Done(json!({ "restarted": false })));
    }
    let (r, k) = (resolved(ctx)?, b.k8s_names(&n.tenant)?);
    if !ctx.waited {
        b.k8s.restart_login(k).await.step("rollout restart the login Deployment")?;
        return Ok(Transition::Wait(b.timings.restart_wait));
    }
    let key = PublicKey::parse(&r.key).map_err(|e| Transition::Fail(format!("key: {e}")))?;
    Ok(match b.login(k).key_projected(&n.user, &key).await.step("read the key in the login pod")? {
        KeyState::Matches => Transition::Done(json!({ "restarted": true, "deployment": k.login_deployment })),
        other => Transition::Fail(format!(
            "the key {} of {} is in Secret {}/{} but not projected in the login pod even after a rollout restart of \
             {} ({other:?}): check the Secret's mount at {} on the login pod (race between the Secret and kubelet \
             projecting it)",
            r.fingerprint, n.user, k.namespace, k.keys_secret, k.login_deployment, b.k8s_settings.authorized_keys_dir
        )),
    })
}

/// The smoke job's name: this job's id and when it was made, so that a database made anew (whose
/// ids start at 1 again) never takes a smoke job an earlier one ran, still in `sacct`, for its own.
fn smoke_job_name(ctx: &StepCtx) -> String {
    format!("{SMOKE_JOB}-{}", ctx.job_name())
}

/// Runbook step 6: as the user, uid/gid match on the login pod and on a compute node (srun),
/// `sbatch --test-only` succeeds, association visible.
async fn smoke(b: &Backends, n: &Names, ctx: &StepCtx) -> StepResult {
    let (r, k) = (resolved(ctx)?, b.k8s_names(&n.tenant)?);
    // named after this job: a later attempt finds a job an attempt cut by a kill ran, in sacct
    let run = SmokeRun { name: smoke_job_name(ctx), again: ctx.attempt > 1 };
    let rep = b.login(k).smoke_test_once(&n.user, &n.account, (r.uid, r.gid), &run).await.step("smoke test")?;
    if let Some(why) = rep.retry_reason() {
        return Ok(Transition::Retry(why));
    }
    let problems = rep.problems();
    if !problems.is_empty() {
        let (u, pod, p) = (&n.user, k.login_target(), problems.join("; "));
        return Ok(Transition::Fail(format!("smoke test as {u} (login pod {pod}) failed: {p}")));
    }
    Ok(Transition::Done(json!({ "uid": rep.uid, "gid": rep.gid, "sbatch": rep.sbatch.stderr.trim(),
        "accounts": rep.accounts, "compute": { "uid": rep.compute.uid, "gid": rep.compute.gid, "node": rep.compute.node } })))
}

#[cfg(test)]
#[path = "user_onboard_tests.rs"]
mod tests;
