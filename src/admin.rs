//! `onramp jobs …`: the engine's operations from a terminal.

use anyhow::Context;
use serde_json::json;

use crate::cli::{JobsAction, JobsArgs};
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
