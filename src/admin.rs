//! `onramp jobs …`: the engine's operations from a terminal.

use anyhow::Context;
use serde_json::json;

use crate::cli::{JobsAction, JobsArgs, ReconcileArgs};
use crate::intake::setup::IntakeSetup;
use crate::engine::{Actor, Engine, JobFilter, JobState};
use crate::{db, flows};

pub async fn jobs(args: JobsArgs) -> anyhow::Result<()> {
    let pool = db::connect(&args.db.database_url, 2).await?;
    let engine = Engine::new(pool, flows::registry());
    let actor = Actor::cli(&std::env::var("USER").unwrap_or_else(|_| "unknown".into()));
    let out = match args.action {
        JobsAction::List { state, limit } => {
            let state = state.as_deref().map(str::parse::<JobState>).transpose().map_err(anyhow::Error::msg)?;
            let jobs = engine.list(&JobFilter { state, limit, ..Default::default() }).await?;
            for j in &jobs {
                println!("{:>8}  {:<15} {:<20} {:<30} step {} (attempt {})", j.id, j.state, j.kind, j.subject, j.step, j.attempt);
            }
            return Ok(());
        }
        JobsAction::Show { id } => json!({
            "job": engine.job(id).await?,
            "steps": engine.step_runs(id).await?,
            "events": engine.events(id).await?,
        }),
        JobsAction::Cancel { id, reason } => json!(engine.cancel(id, &actor, reason.as_deref()).await?),
        JobsAction::Retry { id } => json!(engine.retry(id, &actor).await?),
        JobsAction::Approve { id } => json!(engine.approve(id, &actor).await?),
    };
    println!("{}", serde_json::to_string_pretty(&out).context("printing")?);
    Ok(())
}

/// `onramp reconcile`: enqueue a reconcile job for the workers; with --wait, print its decision.
pub async fn reconcile(args: ReconcileArgs) -> anyhow::Result<()> {
    let setup = IntakeSetup::from_args(&args.intake, false)?.ok_or_else(|| {
        anyhow::anyhow!("reconcile needs ONRAMP_TENANTS, ONRAMP_AUTHENTIK_URL and ONRAMP_AUTHENTIK_TOKEN(_FILE)")
    })?;
    let pool = db::connect(&args.db.database_url, 2).await?;
    let engine = Engine::new(pool, setup.registry(flows::registry()));
    let actor = Actor::cli(&std::env::var("USER").unwrap_or_else(|_| "unknown".into()));
    let cause = format!("onramp reconcile by {actor}");
    let job = match (&args.tenant, args.user) {
        (Some(t), _) => {
            anyhow::ensure!(setup.tenants.tenant(t).is_some(), "tenant {t:?} is not in the tenant registry");
            crate::reconcile::tenant_job(t, actor, &cause)
        }
        (None, Some(pk)) => crate::reconcile::user_job(pk, actor, &cause),
        (None, None) => crate::reconcile::full_job(actor, &cause),
    };
    let e = engine.enqueue(&[job]).await?[0];
    println!("{} job {}", if e.created { "enqueued" } else { "already pending:" }, e.id);
    if args.wait {
        loop {
            let j = engine.job(e.id).await?;
            if matches!(j.state.as_str(), "succeeded" | "failed" | "cancelled" | "needs_approval") {
                println!("{}", serde_json::to_string_pretty(&json!({ "state": j.state, "outputs": j.outputs, "error": j.last_error }))?);
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(500)).await;
        }
    }
    Ok(())
}
