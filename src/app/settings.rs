//! The settings of `onramp serve`, plain and validated once: the command line's groups converted
//! into each part's own settings type, names parsed, the intake checked as a whole. A mistake is
//! reported here, naming its setting, before anything connects.

use std::time::Duration;

use anyhow::Context;

use crate::app::cli::{BackendArgs, HttpArgs, ServeArgs, ServeRole, WorkerArgs};
use crate::app::intake::IntakeSetup;
use crate::app::retention::Retention;
use crate::app::slurm_route::SlurmRoute;
use crate::backends::kubernetes::K8sSettings;
use crate::backends::notify::NotifySettings;
use crate::backends::slurm::HostPath;
use crate::backends::storage::StorageSettings;
use crate::domain::names::ClusterName;
use crate::domain::secret::Secret;
use crate::dryrun::sim::DryConfig;
use crate::engine::{CallbackConfig, WorkerConfig};
use crate::flows::settings::FlowSettings;
use crate::http::HttpSettings;

/// Where Slurm is and how long its commands may take.
#[derive(Clone, Debug)]
pub struct SlurmSettings {
    pub cluster: ClusterName,
    /// How every Slurm command of this process reaches Slurm; `None` in a process that makes
    /// no Slurm calls (the API role: its route settings are neither needed nor checked).
    pub route: Option<SlurmRoute>,
    pub timeout: Duration,
    /// See `ONRAMP_SLURM_BATCH_WINDOW`.
    pub batch_window: Duration,
}

/// The backends' settings, shared by `serve` and plans.
#[derive(Clone, Debug)]
pub struct BackendSettings {
    pub slurm: SlurmSettings,
    pub k8s: K8sSettings,
    pub storage: StorageSettings,
    pub notify: NotifySettings,
    pub flows: FlowSettings,
    /// Where `sacctmgr archive dump` writes, checked.
    pub archive_dir: HostPath,
}

pub struct Settings {
    pub role: ServeRole,
    pub database_url: Secret,
    pub pool_size: u32,
    pub migrate: bool,
    pub listen: std::net::SocketAddr,
    /// An admin token from the settings (`ONRAMP_API_TOKEN`), installed by the API at start.
    pub api_token: Option<Secret>,
    /// Timeout, body limit and CORS of the HTTP server.
    pub http: HttpSettings,
    pub worker: WorkerConfig,
    /// What a worker prunes, and how often.
    pub retention: Retention,
    /// How a worker delivers callbacks.
    pub callbacks: CallbackConfig,
    /// A worker-only process's health and metrics listener.
    pub worker_listen: std::net::SocketAddr,
    /// `None`: the Authentik intake is not configured (no webhook, no reconcile, no user flows).
    pub intake: Option<IntakeSetup>,
    pub backends: BackendSettings,
}

impl Settings {
    pub fn from_args(a: ServeArgs) -> anyhow::Result<Self> {
        refuse_moved(|name| std::env::var_os(name).is_some())?;
        let backends = BackendSettings::from_args(a.backends, a.role != ServeRole::Api)?;
        let intake = IntakeSetup::from_args(&a.intake, a.role != ServeRole::Worker)?;
        let worker = worker_config(&a.worker);
        let settings = Self {
            callbacks: callback_config(&a.worker, &worker.id)?,
            role: a.role,
            database_url: a.db.database_url,
            pool_size: a.db.db_pool_size,
            migrate: a.migrate,
            listen: a.http.listen,
            api_token: a.http.api_token.clone(),
            http: http_settings(&a.http)?,
            worker,
            retention: Retention::from_args(&a.worker)?,
            worker_listen: a.worker.worker_listen,
            intake,
            backends,
        };
        settings.check_pool_size()?;
        Ok(settings)
    }

    /// The busy loops keep a connection each for good (`engine::kept`): every webhook writer of a
    /// process that takes webhooks, and a worker's claimer and result writer. The rest of the
    /// process (API, pump, heartbeat, callbacks) needs the others.
    fn check_pool_size(&self) -> anyhow::Result<()> {
        let writers = match (&self.intake, self.runs_http()) {
            (Some(i), true) => i.writers as u32,
            _ => 0,
        };
        let kept = writers + if self.runs_worker() { 2 } else { 0 };
        let needed = kept + 2;
        anyhow::ensure!(
            self.pool_size.max(crate::app::db::MIN_POOL_SIZE) >= needed,
            "ONRAMP_DB_POOL_SIZE is {}: this process keeps {kept} connections for good ({writers} webhook \
             writers (ONRAMP_WEBHOOK_WRITERS){}) and needs 2 more for the rest; set it to {needed} or more",
            self.pool_size,
            if self.runs_worker() { ", the worker's claimer and result writer" } else { "" },
        );
        Ok(())
    }

    pub fn runs_http(&self) -> bool {
        self.role != ServeRole::Worker
    }

    pub fn runs_worker(&self) -> bool {
        self.role != ServeRole::Api
    }
}

impl BackendSettings {
    /// `slurm_calls`: this process reaches Slurm (its route is checked).
    pub fn from_args(a: BackendArgs, slurm_calls: bool) -> anyhow::Result<Self> {
        let (slurm, flows) = (&a.slurm, FlowSettings::from(a.flows));
        anyhow::ensure!(
            flows.retry_max >= flows.retry_initial,
            "ONRAMP_RETRY_MAX must be at least ONRAMP_RETRY_INITIAL"
        );
        Ok(Self {
            slurm: SlurmSettings {
                cluster: ClusterName::parse(&slurm.slurm_cluster).context("ONRAMP_SLURM_CLUSTER")?,
                route: slurm_calls.then(|| SlurmRoute::from_args(slurm)).transpose()?,
                timeout: slurm.slurm_timeout,
                batch_window: slurm.slurm_batch_window,
            },
            archive_dir: HostPath::parse(&flows.archive_dir).context("ONRAMP_ARCHIVE_DIR")?,
            k8s: a.k8s.into(),
            storage: a.storage.into(),
            notify: a.notify.into(),
            flows,
        })
    }

    /// What the simulated backends of a plan are built from: these same settings.
    pub fn dry(&self) -> DryConfig {
        DryConfig {
            cluster: self.slurm.cluster.clone(),
            k8s: self.k8s.clone(),
            storage: self.storage.clone(),
            timings: self.flows.timings(),
            archive_dir: self.archive_dir.clone(),
            login_address: self.notify.login_address.clone(),
            notify: self.notify.smtp_url.is_some() || self.notify.slack_webhook_url.is_some(),
            batch_window: self.slurm.batch_window,
        }
    }
}

pub fn http_settings(h: &HttpArgs) -> anyhow::Result<HttpSettings> {
    let cors_origins = h
        .cors_origins
        .iter()
        .map(|o| o.trim())
        .filter(|o| !o.is_empty())
        .map(|o| crate::http::parse_origin(o).map_err(anyhow::Error::msg).context("ONRAMP_CORS_ORIGINS"))
        .collect::<anyhow::Result<_>>()?;
    let trusted_proxies = h
        .http_trusted_proxies
        .iter()
        .map(|p| p.trim())
        .filter(|p| !p.is_empty())
        .map(|p| crate::http::IpNet::parse(p).map_err(anyhow::Error::msg).context("ONRAMP_HTTP_TRUSTED_PROXIES"))
        .collect::<anyhow::Result<_>>()?;
    for (name, d) in [
        ("ONRAMP_HTTP_TIMEOUT", h.http_timeout),
        ("ONRAMP_HTTP_HEADER_TIMEOUT", h.http_header_timeout),
        ("ONRAMP_HTTP_BODY_TIMEOUT", h.http_body_timeout),
        ("ONRAMP_HTTP_IDLE_TIMEOUT", h.http_idle_timeout),
        ("ONRAMP_HTTP_STREAM_LIFETIME", h.http_stream_lifetime),
    ] {
        anyhow::ensure!(!d.is_zero(), "{name} must be longer than 0s");
    }
    Ok(HttpSettings {
        timeout: h.http_timeout,
        max_body: h.http_max_body,
        cors_origins,
        header_timeout: h.http_header_timeout,
        body_timeout: h.http_body_timeout,
        idle_timeout: h.http_idle_timeout,
        max_connections: h.http_max_connections as usize,
        streams_per_token: h.http_streams_per_token as usize,
        stream_lifetime: h.http_stream_lifetime,
        trusted_proxies,
    })
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

pub fn callback_config(w: &WorkerArgs, worker: &str) -> anyhow::Result<CallbackConfig> {
    for (name, d) in [
        ("ONRAMP_CALLBACK_TIMEOUT", w.callback_timeout),
        ("ONRAMP_CALLBACK_BACKOFF", w.callback_backoff),
        ("ONRAMP_CALLBACK_POLL", w.callback_poll),
    ] {
        anyhow::ensure!(!d.is_zero(), "{name} must be longer than 0s");
    }
    anyhow::ensure!(
        w.callback_max_backoff >= w.callback_backoff,
        "ONRAMP_CALLBACK_MAX_BACKOFF must be at least ONRAMP_CALLBACK_BACKOFF"
    );
    Ok(CallbackConfig {
        worker: worker.to_string(),
        timeout: w.callback_timeout,
        max_attempts: w.callback_max_attempts,
        backoff: w.callback_backoff,
        max_backoff: w.callback_max_backoff,
        poll: w.callback_poll,
        settle: w.callback_settle,
    })
}

fn default_worker_id() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "onramp".into());
    format!("{host}-{}", std::process::id())
}

/// Settings that moved into the tenant registry's `kubernetes:` block (per tenant, or for all at
/// its top): still set, they would be silently ignored, so `serve` refuses to start.
const MOVED_TO_REGISTRY: &[(&str, &str)] = &[
    ("ONRAMP_LOGIN_POD", "login_pod"),
    ("ONRAMP_LOGIN_CONTAINER", "login_container"),
    ("ONRAMP_LOGIN_DEPLOYMENT", "login_deployment"),
    ("ONRAMP_SLURM_CLUSTER_NAME", "slurm_cluster"),
    ("ONRAMP_RESERVATION_NAME", "reservation"),
    ("ONRAMP_RESERVATION_NAMESPACE", "reservation_namespace"),
];

fn refuse_moved(is_set: impl Fn(&str) -> bool) -> anyhow::Result<()> {
    match MOVED_TO_REGISTRY.iter().find(|(name, _)| is_set(name)) {
        Some((name, field)) => anyhow::bail!(
            "{name} is no longer a setting: set `kubernetes: {{ {field}: … }}` in the tenant registry \
             (ONRAMP_TENANTS), at its top for every tenant or per tenant, and unset {name}"
        ),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn settings_moved_to_the_registry_are_refused_by_name() {
        assert!(super::refuse_moved(|_| false).is_ok());
        let e = super::refuse_moved(|n| n == "ONRAMP_RESERVATION_NAME").unwrap_err().to_string();
        assert!(e.starts_with("ONRAMP_RESERVATION_NAME is no longer a setting") && e.contains("reservation: "), "{e}");
    }

    #[test]
    fn a_retry_cap_below_the_first_retry_delay_is_refused_by_name() {
        use clap::Parser;
        #[derive(Parser)]
        struct Cmd {
            #[command(flatten)]
            b: super::BackendArgs,
        }
        let parse =
            |args: &[&str]| Cmd::try_parse_from(std::iter::once("onramp").chain(args.iter().copied())).unwrap().b;
        let low = parse(&["--retry-initial", "10s", "--retry-max", "5s"]);
        let Err(e) = super::BackendSettings::from_args(low, false) else {
            panic!("a cap below the first delay was taken")
        };
        assert_eq!(e.to_string(), "ONRAMP_RETRY_MAX must be at least ONRAMP_RETRY_INITIAL");
        let s = super::BackendSettings::from_args(parse(&["--retry-max", "4s"]), false).unwrap();
        assert_eq!(
            (s.flows.retry_initial, s.flows.retry_max),
            (super::Duration::from_secs(2), super::Duration::from_secs(4))
        );
        assert_eq!(s.flows.timings().retry_max, super::Duration::from_secs(4));
    }
}
