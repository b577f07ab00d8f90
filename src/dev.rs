//! `onramp dev`: everything on one machine. A private PostgreSQL (unless DATABASE_URL is set),
//! migrations, both roles, and sample jobs to watch.

use serde_json::json;
use tokio::net::TcpListener;

use anyhow::Context;

use crate::cli::DevArgs;
use crate::config::Secret;
use crate::devpg::PrivatePg;
use crate::engine::{Actor, Engine, NewJob};
use crate::flows::{self, selftest};
use crate::{db, serve};

pub async fn dev(args: DevArgs) -> anyhow::Result<()> {
    let pg = match &args.database_url {
        Some(_) => None,
        None => Some(PrivatePg::start(&args.dev_dir).await?),
    };
    let url = args.database_url.clone().or_else(|| pg.as_ref().map(|p| p.url.clone())).expect("one of them");
    let result = run(&args, &url, pg.as_ref()).await;
    if let Some(pg) = pg {
        pg.stop().await?;
        eprintln!("onramp dev: stopped the private PostgreSQL");
    }
    result
}

async fn run(args: &DevArgs, url: &Secret, pg: Option<&PrivatePg>) -> anyhow::Result<()> {
    let pool = db::connect(url, 16).await?;
    db::migrate(&pool).await?;
    let engine = Engine::new(pool, flows::registry());
    let samples = enqueue_samples(&engine).await?;
    let listener = TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("cannot listen on {} (ONRAMP_LISTEN)", args.listen))?;
    let addr = listener.local_addr()?;
    sqlx::query("delete from api_tokens where name = 'dev'").execute(engine.pool()).await?;
    let token =
        crate::auth::create(engine.pool(), "dev", crate::auth::Role::Admin, None, None, &Actor::cli("dev")).await?;
    let db_line = match pg {
        Some(pg) => format!("a private PostgreSQL in {} (stopped with onramp)", pg.data_dir().display()),
        None => format!("{} (DATABASE_URL)", db::describe(url)),
    };
    println!(
        "\nonramp dev is running at http://{addr}\n  dashboard: http://{addr}/dashboard (sign in with the token)\n  database:  {db_line}\n  API token: {t}\n\n\
         Sample jobs {samples:?} are running now (one waits on a timer, one retries, one needs approval). Try:\n\
         \n  curl -s -H 'Authorization: Bearer {t}' http://{addr}/v1/jobs\
         \n  curl -s -H 'Authorization: Bearer {t}' http://{addr}/v1/jobs/{last}\
         \n  curl -s -X POST -H 'Authorization: Bearer {t}' http://{addr}/v1/jobs/{last}/approve\n\nCtrl-C stops everything.\n",
        t = token.expose(),
        last = samples.last().copied().unwrap_or(1),
    );
    let worker = serve::worker_config(&args.worker);
    serve::run(engine, Some(listener), Some(worker), None, serve::shutdown_on_signal()).await
}

/// A few jobs that show the engine's mechanics; each only once while it is unfinished.
async fn enqueue_samples(engine: &Engine) -> anyhow::Result<Vec<i64>> {
    let actor = Actor::cli("dev");
    let jobs: Vec<NewJob> = [
        ("tenant-demo/alice", json!({ "sleep_ms": 1500 })),
        ("tenant-demo/bob", json!({ "wait_ms": 20000 })),
        ("tenant-demo/carol", json!({ "fail_attempts": 2 })),
        ("tenant-demo/dave", json!({ "approval": true })),
    ]
    .into_iter()
    .map(|(subject, input)| {
        NewJob::new(selftest::KIND, subject, input, actor.clone()).dedupe(format!("dev-sample:{subject}"))
    })
    .collect();
    Ok(engine.enqueue(&jobs).await?.into_iter().map(|e| e.id).collect())
}
