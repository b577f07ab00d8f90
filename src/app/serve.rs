//! `onramp serve`: the roles of one process (api, worker, both), joined under one shutdown.

use std::sync::Arc;

use anyhow::Context;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::app::cli::{Role, ServeArgs, WorkerArgs};
use crate::app::db;
use crate::app::intake::{IntakeSetup, periodic_reconcile};
use crate::dryrun::plan::Planner;
use crate::dryrun::sim::DryConfig;
use crate::engine::{Engine, WorkerConfig, WorkerStats};
use crate::{flows, http};

pub async fn serve(args: ServeArgs) -> anyhow::Result<()> {
    // settings first: a mistake there is reported before anything connects
    let cluster =
        crate::domain::names::ClusterName::parse(&args.slurm.slurm_cluster).context("ONRAMP_SLURM_CLUSTER")?;
    let setup = IntakeSetup::from_args(&args.intake, args.role != Role::Worker, &cluster)?;
    let pool = db::connect(&args.db.database_url, args.db.db_pool_size).await?;
    if args.migrate {
        db::migrate(&pool).await?;
    }
    if setup.is_none() {
        tracing::info!("Authentik intake is off (set ONRAMP_TENANTS, ONRAMP_AUTHENTIK_URL and ONRAMP_AUTHENTIK_TOKEN)");
    }
    let backends = match &setup {
        Some(s) if args.role != Role::Api => match backends(&args, s, &pool).await {
            Ok(b) => Some(b),
            Err(e) => {
                // The process still serves the API and the reconcile flows; onboarding and
                // offboarding jobs wait for a worker that has its backends.
                tracing::warn!(error = format!("{e:#}"), "user flows are not run by this process");
                None
            }
        },
        _ => None,
    };
    let mut registry = flows::registry();
    if let Some(b) = &backends {
        registry = flows::with_backends(registry, b.clone());
    } else if setup.is_some() {
        // The API only enqueues these kinds; workers run them. Declare them so enqueues are accepted.
        registry = flows::declare_all(registry);
    }
    let registry = match &setup {
        Some(s) => s.registry(registry),
        None => registry,
    };
    let engine = Engine::new(pool, registry);
    let listener = match args.role {
        Role::Worker => None,
        _ => Some(
            TcpListener::bind(args.http.listen)
                .await
                .with_context(|| format!("cannot listen on {} (ONRAMP_LISTEN)", args.http.listen))?,
        ),
    };
    let worker = (args.role != Role::Api).then(|| worker_config(&args.worker));
    // plans run the flows on the simulated cluster with this process's settings
    let plans = match DryConfig::from_args(&args.slurm, &args.k8s, &args.storage, &args.flows, &args.notify) {
        Ok(c) => Some(c),
        Err(e) => {
            tracing::warn!(error = format!("{e:#}"), "plans are not available");
            None
        }
    };
    run(engine, listener, worker, setup, plans, shutdown_on_signal()).await
}

/// The backends the user and tenant flows act on, built from the settings: Kubernetes (and
/// through it the slurmctld and login pods), Slurm, storage, notifications, Authentik.
async fn backends(args: &ServeArgs, setup: &IntakeSetup, pool: &sqlx::PgPool) -> anyhow::Result<Arc<flows::Backends>> {
    use crate::backends::record::{RecordingAuthentik, RecordingK8s, RecordingNotifier, RecordingTransport};
    use crate::domain::names::ClusterName;
    // every command and request a step makes is kept with its attempt (the dashboard shows them)
    let log = crate::effects::EffectLog::attempts_only();
    let k8s =
        crate::backends::kubernetes::K8s::connect(args.k8s.clone()).await.context("Kubernetes (ONRAMP_KUBECONFIG)")?;
    let kube: Arc<dyn crate::backends::kubernetes::Kubernetes> =
        Arc::new(RecordingK8s { inner: Arc::new(k8s.clone()), settings: args.k8s.clone(), log: log.clone() });
    let cluster = ClusterName::parse(&args.slurm.slurm_cluster).context("ONRAMP_SLURM_CLUSTER")?;
    // replicas write to slurmdbd one at a time (22.05 loses concurrent writes)
    let slurm = crate::backends::slurm::SlurmCli::new(kube.slurmctld(), cluster)
        .with_timeout(args.slurm.slurm_timeout)
        .with_write_gate(Arc::new(crate::backends::slurm::PgWriteGate::new(pool)));
    let transport = args.storage.storage_run_in.transport(Some(&k8s)).map_err(anyhow::Error::msg)?;
    let transport = RecordingTransport::wrap("storage", transport, &log);
    let storage =
        crate::backends::storage::CommandStorage::new(transport, args.storage.clone()).context("storage settings")?;
    let notifier: Option<Arc<dyn crate::backends::notify::Notifier>> =
        match crate::backends::notify::Email::from_settings(&args.notify).context("ONRAMP_SMTP_URL")? {
            Some(e) => Some(Arc::new(e)),
            None => match &args.notify.slack_webhook_url {
                Some(url) => Some(Arc::new(
                    crate::backends::notify::Slack::new(url.clone(), args.notify.notify_timeout)
                        .context("Slack webhook")?,
                )),
                None => None,
            },
        };
    let notifier = notifier.map(|n| Arc::new(RecordingNotifier { inner: n, log: log.clone() }) as _);
    let archive = crate::backends::slurm::HostPath::parse(&args.flows.archive_dir).context("ONRAMP_ARCHIVE_DIR")?;
    let slurm = crate::backends::slurm::Batching::new(Arc::new(slurm), args.slurm.slurm_batch_window);
    let authentik = Arc::new(RecordingAuthentik { inner: setup.reconciler.authentik.clone(), log });
    Ok(flows::Backends::new(
        Arc::new(slurm),
        kube,
        args.k8s.clone(),
        Arc::new(storage),
        notifier,
        authentik,
        setup.tenants.clone(),
        args.flows.timings(),
        archive,
        args.notify.login_address.clone(),
    ))
}

pub fn worker_config(w: &WorkerArgs) -> WorkerConfig {
    WorkerConfig {
        id: w.worker_id.clone().unwrap_or_else(default_worker_id),
        concurrency: usize::from(w.worker_concurrency),
        lease: w.lease,
        poll_interval: w.poll_interval,
        shutdown_grace: w.shutdown_grace,
    }
}

fn default_worker_id() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "onramp".into());
    format!("{host}-{}", std::process::id())
}

/// Runs the HTTP server (when given a listener) and a worker (when given a config) until
/// `shutdown` is cancelled; then both drain.
pub async fn run(
    engine: Engine,
    listener: Option<TcpListener>,
    worker: Option<WorkerConfig>,
    intake: Option<IntakeSetup>,
    plans: Option<DryConfig>,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let stats = Arc::new(WorkerStats::default());
    let started = intake.as_ref().map(|s| s.start(&engine));
    if let Some(s) = intake.as_ref().filter(|_| worker.is_some()) {
        tokio::spawn(periodic_reconcile(engine.clone(), s.reconcile_interval, shutdown.clone()));
    }
    let http = listener.map(|l| {
        let mut state = http::AppState::new(engine.clone(), stats.clone());
        state.intake = started;
        state.tenants = intake.as_ref().map(|s| s.tenants.clone());
        state.plans = match (plans, &intake) {
            (Some(cfg), Some(s)) => Some(Arc::new(Planner { cfg, authentik: Some(s.reconciler.authentik.clone()) })),
            _ => None,
        };
        if let Ok(addr) = l.local_addr() {
            tracing::info!(%addr, "HTTP listening");
        }
        tokio::spawn(http::serve(l, state, shutdown.clone()))
    });
    let worker = worker.map(|cfg| {
        let (engine, stats, shutdown) = (engine.clone(), stats.clone(), shutdown.clone());
        tokio::spawn(async move { engine.run_worker(cfg, stats, shutdown).await })
    });
    if let Some(h) = http {
        h.await?.context("HTTP server")?;
    }
    if let Some(w) = worker {
        w.await?.context("worker")?;
    }
    Ok(())
}

/// A token cancelled at SIGTERM or Ctrl-C.
pub fn shutdown_on_signal() -> CancellationToken {
    let token = CancellationToken::new();
    let t = token.clone();
    tokio::spawn(async move {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = async { match term.as_mut() { Some(s) => { s.recv().await; } None => std::future::pending().await } } => {}
        }
        tracing::info!("shutting down: no new work is claimed; running steps may finish");
        t.cancel();
    });
    token
}
