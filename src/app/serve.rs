//! `onramp serve`: the roles of one process (api, worker, both), joined under one shutdown.

use anyhow::Context;
use tokio::net::TcpListener;

use crate::app::cli::ServeArgs;
use crate::app::db;
use crate::app::settings::Settings;
use crate::app::world::{Parts, World, real_backends, shutdown_on_signal};

pub async fn serve(args: ServeArgs) -> anyhow::Result<()> {
    // settings first: a mistake there is reported before anything connects
    let settings = Settings::from_args(args)?;
    let pool = db::connect(&settings.database_url, settings.pool_size).await?;
    if settings.migrate {
        db::migrate(&pool).await?;
    }
    if settings.intake.is_none() {
        tracing::info!("Authentik intake is off (set ONRAMP_TENANTS, ONRAMP_AUTHENTIK_URL and ONRAMP_AUTHENTIK_TOKEN)");
    }
    // A worker claims only what it can run: one that cannot build its backends stops here with
    // the reason, rather than claiming onboarding jobs it would only fail.
    let flows = match &settings.intake {
        Some(s) if settings.runs_worker() => Some(
            real_backends(&settings.backends, s, &pool)
                .await
                .context("this worker cannot run the user, tenant and reconcile flows")?,
        ),
        None if settings.runs_worker() => {
            tracing::warn!("without the Authentik intake this worker runs only the engine's own kinds (selftest)");
            None
        }
        _ => None,
    };
    if settings.runs_http() {
        crate::http::access::install_settings_token(&pool, settings.api_token.as_ref())
            .await
            .context("ONRAMP_API_TOKEN")?;
    }
    let listener = match settings.runs_http() {
        false => None,
        true => Some(
            TcpListener::bind(settings.listen)
                .await
                .with_context(|| format!("cannot listen on {} (ONRAMP_LISTEN)", settings.listen))?,
        ),
    };
    // a worker without the HTTP server still answers health checks and scrapes
    let ops = match settings.runs_http() {
        true => None,
        false => Some(
            TcpListener::bind(settings.worker_listen)
                .await
                .with_context(|| format!("cannot listen on {} (ONRAMP_WORKER_LISTEN)", settings.worker_listen))?,
        ),
    };
    let worker = settings.runs_worker().then(|| settings.worker.clone());
    let plans = Some(settings.backends.dry());
    let world = World::build(pool, Parts { flows, intake: settings.intake, plans })
        .with_http(settings.http)
        .with_ops_listener(ops)
        .with_retention(settings.retention)
        .with_callbacks(settings.callbacks);
    world.run(listener, worker, shutdown_on_signal()).await
}
