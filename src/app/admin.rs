//! `onramp jobs …` (the engine's operations from a terminal) and `onramp doctor`.

use anyhow::Context;
use serde_json::json;

use crate::app::cli::{DoctorArgs, JobsAction, JobsArgs, ReconcileArgs, TokenAction, TokenArgs};
use crate::app::db;
use crate::app::intake::IntakeSetup;
use crate::app::login::cli_actor;
use crate::app::slurm_route::SlurmRoute;
use crate::app::world::{Parts, World};
use crate::app::{jobs_view, output};
use crate::backends::slurm::SlurmCli;
use crate::domain::names::{ClusterName, TenantName};
use crate::engine::{Engine, JobFilter, JobState};
use crate::flows;
use crate::http::access::{self, Role};

pub async fn jobs(args: JobsArgs) -> anyhow::Result<()> {
    let pool = db::connect(&args.db.database_url, 2).await?;
    let engine = World::build(pool, Parts::default()).engine;
    let actor = cli_actor();
    let now = time::OffsetDateTime::now_utc();
    let (job, json) = match args.action {
        JobsAction::List { state, limit, json } => {
            let state = state.as_deref().map(str::parse::<JobState>).transpose().map_err(anyhow::Error::msg)?;
            let jobs = engine.list(&JobFilter { state, limit, ..Default::default() }).await?;
            if !json {
                return output::print(&jobs_view::list(&jobs, now));
            }
            let rows: Vec<_> = jobs
                .iter()
                .map(|j| {
                    let mut v = serde_json::to_value(j)?;
                    v["reason"] = json!(jobs_view::reason(j));
                    Ok(v)
                })
                .collect::<serde_json::Result<_>>()?;
            return output::line(&serde_json::to_string_pretty(&json!({ "jobs": rows }))?);
        }
        JobsAction::Show { id, json } => {
            let (job, runs, events) = (engine.job(id).await?, engine.step_runs(id).await?, engine.events(id).await?);
            if !json {
                return output::print(&jobs_view::show(&job, &runs, &events, now));
            }
            let all = json!({ "job": job, "steps": runs, "events": events });
            return output::line(&serde_json::to_string_pretty(&all)?);
        }
        JobsAction::Cancel { id, reason, json } => (engine.cancel(id, &actor, reason.as_deref()).await?, json),
        JobsAction::Retry { id, json } => (engine.retry(id, &actor).await?, json),
        JobsAction::Approve { id, json } => (engine.approve(id, &actor).await?, json),
    };
    if json {
        return output::line(&serde_json::to_string_pretty(&job).context("printing")?);
    }
    let at = if job.state.is_closed() { String::new() } else { format!(" at step {}", job.step) };
    output::line(&format!("job {} ({} {}) is {}{at}, by {actor}", job.id, job.kind, job.subject, job.state))
}

pub async fn tokens(args: TokenArgs) -> anyhow::Result<()> {
    let pool = db::connect(&args.db.database_url, 2).await?;
    match args.action {
        TokenAction::Create { name, role, tenant, expires } => {
            let role: Role = role.parse().map_err(anyhow::Error::msg)?;
            let tenant = tenant.as_deref().map(TenantName::parse).transpose()?;
            if let Some(t) = &tenant {
                let path = args.tenants.as_ref().ok_or_else(|| {
                    anyhow::anyhow!("a token for tenant {t} needs the tenant registry to check it: set ONRAMP_TENANTS")
                })?;
                let registry = crate::domain::tenants::TenantRegistry::load(path)?;
                anyhow::ensure!(registry.tenant(t.as_str()).is_some(), "tenant {t} is not in the tenant registry");
            }
            let expires_at = expires.map(|d| time::OffsetDateTime::now_utc() + d);
            let token = access::create(&pool, &name, role, tenant.as_ref(), expires_at, &cli_actor()).await?;
            eprintln!("onramp: created {role} token {name:?}; it is shown once:");
            output::line(token.expose())?;
        }
        TokenAction::List => {
            for t in access::list(&pool).await? {
                let state = if t.revoked_at.is_some() { "revoked" } else { "active" };
                output::line(&format!(
                    "{:<24} {:<9} {:<20} {state}",
                    t.name,
                    t.role,
                    t.tenant.as_deref().unwrap_or("(all tenants)")
                ))?;
            }
        }
        TokenAction::Revoke { name } => {
            access::revoke(&pool, &name).await?;
            eprintln!("onramp: revoked token {name:?}");
        }
    }
    Ok(())
}

/// `onramp reconcile`: enqueue a reconcile job for the workers; with --wait, print its decision.
pub async fn reconcile(args: ReconcileArgs) -> anyhow::Result<()> {
    let setup = IntakeSetup::from_args(&args.intake, false)?.ok_or_else(|| {
        anyhow::anyhow!("reconcile needs ONRAMP_TENANTS, ONRAMP_AUTHENTIK_URL and ONRAMP_AUTHENTIK_TOKEN(_FILE)")
    })?;
    let pool = db::connect(&args.db.database_url, 2).await?;
    let engine = Engine::new(pool, flows::declare_all(flows::registry()));
    let actor = cli_actor();
    let cause = format!("onramp reconcile by {actor}");
    let job = match (&args.tenant, args.user) {
        (Some(t), _) => {
            anyhow::ensure!(setup.tenants.tenant(t).is_some(), "tenant {t:?} is not in the tenant registry");
            crate::flows::reconcile::tenant_job(t, actor, &cause)
        }
        (None, Some(pk)) => crate::flows::reconcile::user_job(pk, actor, &cause),
        (None, None) => crate::flows::reconcile::full_job(actor, &cause),
    };
    let e = engine.enqueue(&[job]).await?[0];
    output::line(&format!("{} job {}", if e.created { "enqueued" } else { "already pending:" }, e.id))?;
    if args.wait {
        loop {
            let j = engine.job(e.id).await?;
            if matches!(j.state.as_str(), "succeeded" | "failed" | "cancelled" | "needs_approval") {
                let decision = json!({ "state": j.state, "outputs": j.outputs, "error": j.last_error });
                output::line(&serde_json::to_string_pretty(&decision)?)?;
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(500)).await;
        }
    }
    Ok(())
}

/// `onramp tenant onboard|offboard T`: checks the tenant against the registry and enqueues its job.
pub async fn tenant(args: crate::app::cli::TenantArgs) -> anyhow::Result<()> {
    use crate::app::cli::TenantAction;
    use crate::flows::tenant::{Input, TENANT_OFFBOARD, TENANT_ONBOARD};
    let registry = crate::domain::tenants::TenantRegistry::load(&args.tenants)?;
    let (kind, tenant, hard_cutoff) = match &args.action {
        TenantAction::Onboard { tenant } => (TENANT_ONBOARD, tenant, false),
        TenantAction::Offboard { tenant, hard_cutoff } => (TENANT_OFFBOARD, tenant, *hard_cutoff),
    };
    anyhow::ensure!(registry.tenant(tenant).is_some(), "tenant {tenant:?} is not in the tenant registry");
    let pool = db::connect(&args.db.database_url, 2).await?;
    let engine = Engine::new(pool, flows::declare_all(flows::registry()));
    let j = Input { tenant: tenant.clone(), hard_cutoff }.job(kind, cli_actor());
    let e = engine.enqueue(&[j]).await?[0];
    output::line(&format!("{} {kind} job {}", if e.created { "enqueued" } else { "already pending:" }, e.id))?;
    Ok(())
}

/// `onramp doctor`: every check, as text or JSON; the exit code by severity (see `--help`).
pub async fn doctor(args: DoctorArgs) -> anyhow::Result<std::process::ExitCode> {
    use crate::backends::kubernetes::{K8s, K8sSettings, Kubernetes};
    let cluster = ClusterName::parse(&args.slurm.slurm_cluster).context("ONRAMP_SLURM_CLUSTER")?;
    let route = SlurmRoute::from_args(&args.slurm)?;
    let k8s_settings: K8sSettings = args.k8s.clone().into();
    let in_pod = std::env::var_os("KUBERNETES_SERVICE_HOST").is_some();
    let want_k8s = matches!(route, SlurmRoute::KubeExec) || args.k8s.kubeconfig.is_some() || in_pod;
    let kube = if want_k8s {
        let k = K8s::connect(k8s_settings.clone()).await;
        if matches!(route, SlurmRoute::KubeExec) {
            Some(Ok(k.context("Kubernetes (ONRAMP_KUBECONFIG), for ONRAMP_SLURM_VIA=kube-exec")?))
        } else {
            Some(k.map_err(|e| format!("Kubernetes (ONRAMP_KUBECONFIG): {e}")))
        }
    } else {
        None
    };
    let exec_k8s = kube.as_ref().and_then(|k| k.as_ref().ok()).filter(|_| matches!(route, SlurmRoute::KubeExec));
    let transport = route.transport(exec_k8s.map(|k| k as &dyn Kubernetes))?;
    let slurm = SlurmCli::new(transport, cluster).with_timeout(args.slurm.slurm_timeout);
    let tenants = args.tenants.as_deref().map(crate::domain::tenants::TenantRegistry::load).transpose()?;
    let pods = crate::doctor::k8s::PodSettings {
        tenants,
        slurmd_namespace: args.slurmd_namespace.clone().unwrap_or_else(|| k8s_settings.slurm_namespace.clone()),
        slurmd_selector: args.slurmd_selector.clone(),
        authorized_keys_dir: k8s_settings.authorized_keys_dir.clone(),
        exec_timeout: args.slurm.slurm_timeout,
    };
    let k8s = match &kube {
        Some(Ok(k)) => Ok(k),
        Some(Err(e)) => Err(e.clone()),
        None => Err("no Kubernetes API given (ONRAMP_KUBECONFIG, or run in a pod)".to_string()),
    };
    let report =
        match crate::doctor::run(&slurm, args.cgroup_conf.as_deref(), &args.slurm.slurm_cluster, k8s, &pods).await {
            Ok(r) => r,
            Err(e) => {
                eprintln!("onramp: could not read the Slurm configuration over {}: {e}", route.describe(&k8s_settings));
                return Ok(std::process::ExitCode::from(crate::doctor::EXIT_UNKNOWN));
            }
        };
    if args.json {
        output::line(&serde_json::to_string_pretty(&report).context("printing")?)?;
    } else {
        output::print(&crate::doctor::render::text(&report))?;
    }
    Ok(std::process::ExitCode::from(report.summary.exit_code))
}

/// `onramp plan <flow> --tenant T [--user U]`: the plan, for people or as JSON.
pub async fn plan(args: crate::app::cli::PlanArgs) -> anyhow::Result<()> {
    use crate::domain::names::{SlurmAccount, TenantName, Username};
    use crate::dryrun::plan;
    let a = &args.intake;
    let backends = crate::app::settings::BackendSettings::from_args(args.backends.clone(), false)?;
    let (tenants, authentik) = if a.authentik_url.is_some() {
        let setup = crate::app::intake::IntakeSetup::from_args(a, false)?
            .ok_or_else(|| anyhow::anyhow!("the plan needs the tenant registry (ONRAMP_TENANTS)"))?;
        (setup.tenants.clone(), Some(setup.authentik.clone()))
    } else {
        let path = a.tenants.as_ref().ok_or_else(|| anyhow::anyhow!("the plan needs --tenants (ONRAMP_TENANTS)"))?;
        (std::sync::Arc::new(crate::domain::tenants::TenantRegistry::load(path)?), None)
    };
    let req = plan::PlanRequest {
        flow: args.flow.clone(),
        tenant: TenantName::parse(&args.tenant).map_err(|e| anyhow::anyhow!("--tenant: {e}"))?,
        user: args.user.as_deref().map(Username::parse).transpose().map_err(|e| anyhow::anyhow!("--user: {e}"))?,
        account: args
            .account
            .as_deref()
            .map(SlurmAccount::parse)
            .transpose()
            .map_err(|e| anyhow::anyhow!("--account: {e}"))?,
        hard_cutoff: args.hard_cutoff,
    };
    let p = plan::plan(&req, &backends.dry(), tenants, authentik).await?;
    if args.json {
        output::line(&serde_json::to_string_pretty(&p)?)?;
    } else {
        output::print(&p.text())?;
    }
    anyhow::ensure!(p.stopped.is_none(), "the plan stops before the flow's end: {}", p.stopped.unwrap_or_default());
    Ok(())
}
