//! The composition root: the one place the world is built, in order — backends (real, recorded,
//! or simulated) → the registry of flows this process can run → the engine → the HTTP routers
//! and the worker. `serve`, `dev`, the CLI's job commands and the tests all build through here.

use std::sync::Arc;

use anyhow::Context;
use sqlx::PgPool;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::app::intake::{IntakeSetup, periodic_reconcile};
use crate::app::retention::{Retention, periodic_retention};
use crate::app::settings::BackendSettings;
use crate::app::slurm_route::{SlurmRoute, probe};
use crate::backends::record::{RecordingAuthentik, RecordingK8s, RecordingNotifier, RecordingTransport};
use crate::backends::{kubernetes, notify, slurm, storage};
use crate::dryrun::plan::Planner;
use crate::dryrun::sim::DryConfig;
use crate::effects::EffectLog;
use crate::engine::{CallbackConfig, Engine, Registry, WorkerConfig, WorkerStats};
use crate::{flows, http};

/// What a world is made of, chosen by the settings.
#[derive(Default)]
pub struct Parts {
    /// The user and tenant flows' backends; `None`: this process does not run those flows.
    pub flows: Option<Arc<flows::Backends>>,
    /// The Authentik intake (webhook, reconcile); `None`: not configured.
    pub intake: Option<IntakeSetup>,
    /// Plans of flows on the simulated cluster with this process's settings.
    pub plans: Option<DryConfig>,
}

/// A built world: the engine with its flows, and what the HTTP side and the worker need.
pub struct World {
    pub engine: Engine,
    intake: Option<IntakeSetup>,
    plans: Option<DryConfig>,
    http: Arc<http::HttpSettings>,
    /// A worker process's own listener for health and metrics.
    ops: Option<TcpListener>,
    /// What a worker prunes, and how often (`None`: nothing).
    retention: Option<Retention>,
    /// How a worker delivers callbacks (every worker does).
    callbacks: CallbackConfig,
}

impl World {
    /// The registry from what this process can run, then the engine over `pool`.
    pub fn build(pool: PgPool, parts: Parts) -> Self {
        let engine = Engine::new(pool, registry(&parts));
        Self {
            engine,
            intake: parts.intake,
            plans: parts.plans,
            http: Arc::default(),
            ops: None,
            retention: None,
            callbacks: CallbackConfig::default(),
        }
    }

    /// A world of the engine alone (its own flows), for the CLI's job commands and tests.
    pub fn bare(engine: Engine) -> Self {
        Self {
            engine,
            intake: None,
            plans: None,
            http: Arc::default(),
            ops: None,
            retention: None,
            callbacks: CallbackConfig::default(),
        }
    }

    /// The HTTP server's timeout, body limit and CORS (defaults without).
    pub fn with_http(mut self, http: http::HttpSettings) -> Self {
        self.http = Arc::new(http);
        self
    }

    /// Also serves `/metrics`, `/healthz` and `/readyz` on `listener` (a worker process that has
    /// no HTTP server of its own).
    pub fn with_ops_listener(mut self, listener: Option<TcpListener>) -> Self {
        self.ops = listener;
        self
    }

    /// A worker also prunes finished jobs and old deliveries by `retention`.
    pub fn with_retention(mut self, retention: Retention) -> Self {
        self.retention = Some(retention);
        self
    }

    /// A worker delivers callbacks by `callbacks`.
    pub fn with_callbacks(mut self, callbacks: CallbackConfig) -> Self {
        self.callbacks = callbacks;
        self
    }

    /// Runs the HTTP server (when given a listener) and a worker (when given a config) until
    /// `shutdown` is cancelled; then both drain.
    pub async fn run(
        self,
        listener: Option<TcpListener>,
        worker: Option<WorkerConfig>,
        shutdown: CancellationToken,
    ) -> anyhow::Result<()> {
        let Self { engine, intake, plans, http: settings, ops, retention, callbacks } = self;
        let stats = Arc::new(WorkerStats::default());
        let started = intake.as_ref().map(|s| s.start(&engine, shutdown.clone()));
        if let Some(s) = intake.as_ref().filter(|_| worker.is_some()) {
            tokio::spawn(periodic_reconcile(engine.clone(), s.reconcile_interval, shutdown.clone()));
        }
        if let Some(r) = retention.filter(|_| worker.is_some()) {
            tokio::spawn(periodic_retention(engine.clone(), r, shutdown.clone()));
        }
        let callbacks = worker.as_ref().map(|w| {
            let (engine, shutdown) = (engine.clone(), shutdown.clone());
            let cfg = CallbackConfig { worker: w.id.clone(), ..callbacks };
            tokio::spawn(async move { engine.run_callbacks(cfg, shutdown).await })
        });
        let http = listener.map(|l| {
            let mut state = http::AppState::new(engine.clone(), stats.clone());
            state.http = settings.clone();
            state.worker = worker.is_some();
            state.intake = started.clone();
            state.tenants = intake.as_ref().map(|s| s.tenants.clone());
            state.authentik = intake.as_ref().map(|s| s.authentik.clone());
            state.plans = match (plans, &intake) {
                (Some(cfg), Some(s)) => Some(Arc::new(Planner { cfg, authentik: Some(s.authentik.clone()) })),
                _ => None,
            };
            if let Ok(addr) = l.local_addr() {
                tracing::info!(%addr, "HTTP listening");
            }
            tokio::spawn(http::serve(l, state, shutdown.clone()))
        });
        let ops = ops.map(|l| {
            let mut state = http::AppState::new(engine.clone(), stats.clone());
            state.worker = worker.is_some();
            // for /metrics (the pump's counters); the ops listener serves no webhook
            state.intake = started.clone();
            if let Ok(addr) = l.local_addr() {
                tracing::info!(%addr, "health and metrics listening");
            }
            tokio::spawn(http::serve_ops(l, state, shutdown.clone()))
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
        if let Some(h) = ops {
            h.await?.context("health and metrics listener")?;
        }
        if let Some(c) = callbacks {
            c.await.context("callbacks")?;
        }
        Ok(())
    }
}

/// The flows this process runs, and (for kinds it only enqueues) declares. A process claims
/// only the kinds it can run: without backends, the user, tenant and reconcile flows are
/// declared (the API accepts them) and left to the workers that have them.
fn registry(parts: &Parts) -> Registry {
    let registry = flows::registry();
    match (&parts.flows, &parts.intake) {
        // the reconciler reads the cluster through the flows' own Slurm route
        (Some(b), Some(s)) => s.registry(flows::with_backends(registry, b.clone()), b.slurm.clone()),
        (Some(b), None) => flows::with_backends(registry, b.clone()),
        (None, Some(_)) => flows::declare_all(registry),
        (None, None) => registry,
    }
}

/// The real backends the flows act on: Kubernetes (the login pods, keys, tenant objects), Slurm
/// over its one route (checked here: it answers, for the right cluster), storage,
/// notifications, Authentik. Every command and request a step
/// makes is kept with its attempt (the dashboard shows them).
pub async fn real_backends(
    s: &BackendSettings,
    intake: &IntakeSetup,
    pool: &PgPool,
) -> anyhow::Result<Arc<flows::Backends>> {
    let log = EffectLog::attempts_only();
    let k8s = kubernetes::K8s::connect(s.k8s.clone()).await.context("Kubernetes (ONRAMP_KUBECONFIG)")?;
    let kube: Arc<dyn kubernetes::Kubernetes> =
        Arc::new(RecordingK8s { inner: Arc::new(k8s.clone()), settings: s.k8s.clone(), log: log.clone() });
    // every Slurm call of this process, the flows' and the reconciler's, takes this one route
    let route = s.slurm.route.as_ref().context("this process has no Slurm route")?;
    let transport = match route {
        SlurmRoute::KubeExec => kube.slurmctld(),
        other => RecordingTransport::wrap("slurm", other.transport(None)?, &log),
    };
    // replicas write to slurmdbd one at a time (22.05 loses concurrent writes)
    let slurm = slurm::SlurmCli::new(transport, s.slurm.cluster.clone())
        .with_timeout(s.slurm.timeout)
        .with_write_gate(Arc::new(slurm::PgWriteGate::new(pool)));
    probe(&slurm, &s.slurm.cluster, &route.describe(&s.k8s)).await?;
    let transport = s.storage.storage_run_in.transport(Some(&k8s)).map_err(anyhow::Error::msg)?;
    let transport = RecordingTransport::wrap("storage", transport, &log);
    let storage = storage::CommandStorage::new(transport, s.storage.clone()).context("storage settings")?;
    let notifier: Option<Arc<dyn notify::Notifier>> =
        match notify::Email::from_settings(&s.notify).context("ONRAMP_SMTP_URL")? {
            Some(e) => Some(Arc::new(e)),
            None => match &s.notify.slack_webhook_url {
                Some(url) => {
                    Some(Arc::new(notify::Slack::new(url.clone(), s.notify.notify_timeout).context("Slack webhook")?))
                }
                None => None,
            },
        };
    let notifier = notifier.map(|n| Arc::new(RecordingNotifier { inner: n, log: log.clone() }) as _);
    let slurm = slurm::Batching::new(Arc::new(slurm), s.slurm.batch_window);
    let authentik = Arc::new(RecordingAuthentik { inner: intake.authentik.clone(), log });
    Ok(flows::Backends::new(
        Arc::new(slurm),
        kube,
        s.k8s.clone(),
        Arc::new(storage),
        notifier,
        authentik,
        intake.tenants.clone(),
        s.flows.timings(),
        s.archive_dir.clone(),
        s.notify.login_address.clone(),
    ))
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
