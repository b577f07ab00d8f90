//! Turning the intake settings into running parts: the Authentik client, the tenant registry, the
//! reconciler and its flows, the webhook's writer, and the periodic full reconcile.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use tokio_util::sync::CancellationToken;

use crate::app::cli::IntakeArgs;
use crate::backends::authentik::{Authentik, AuthentikClient, AuthentikConfig};
use crate::backends::slurm::Slurm;
use crate::domain::secret::Secret;
use crate::domain::tenants::TenantRegistry;
use crate::engine::{Actor, Engine, Registry};
use crate::flows::reconcile::{Brake, Reconciler, full_job};
use crate::intake::{DeliveryWriter, Intake, IntakeStats, Pump, PumpStats, SigningSecret, WebhookAuth};

pub struct IntakeSetup {
    pub authentik: Arc<dyn Authentik>,
    pub tenants: Arc<TenantRegistry>,
    pub brake: Brake,
    pub auth: WebhookAuth,
    pub settle: Duration,
    pub max_body: usize,
    /// See `Intake::max_diff_users`.
    pub max_diff_users: usize,
    pub writers: usize,
    pub batch: usize,
    pub reconcile_interval: Duration,
}

impl IntakeSetup {
    /// None when intake is not configured at all; an error naming the setting when it is half
    /// configured or a value is wrong. `webhook`: the webhook's authentication is required too.
    pub fn from_args(a: &IntakeArgs, webhook: bool) -> anyhow::Result<Option<Self>> {
        let token = match (&a.authentik_token, &a.authentik_token_file) {
            (Some(t), _) => Some(t.clone()),
            (None, Some(f)) => {
                let t = std::fs::read_to_string(f)
                    .with_context(|| format!("cannot read ONRAMP_AUTHENTIK_TOKEN_FILE {}", f.display()))?;
                Some(Secret::new(t.trim()))
            }
            (None, None) => None,
        };
        let (Some(tenants), Some(url), Some(token)) = (&a.tenants, &a.authentik_url, token) else {
            let set = [
                a.tenants.is_some(),
                a.authentik_url.is_some(),
                a.authentik_token.is_some() || a.authentik_token_file.is_some(),
            ];
            if set.iter().any(|s| *s) {
                let missing: Vec<&str> = [
                    ("ONRAMP_TENANTS", set[0]),
                    ("ONRAMP_AUTHENTIK_URL", set[1]),
                    ("ONRAMP_AUTHENTIK_TOKEN(_FILE)", set[2]),
                ]
                .iter()
                .filter(|(_, s)| !s)
                .map(|(n, _)| *n)
                .collect();
                bail!("Authentik intake is half configured: missing setting {}", missing.join(", "));
            }
            return Ok(None);
        };
        let registry = Arc::new(TenantRegistry::load(tenants)?);
        let client = AuthentikClient::new(AuthentikConfig {
            url: url.clone(),
            token,
            timeout: a.authentik_timeout,
            attempts: a.authentik_attempts,
            backoff: Duration::from_millis(500),
            page_size: 100,
            concurrency: usize::from(a.authentik_concurrency),
        })
        .map_err(anyhow::Error::msg)?;
        if a.brake_window.is_zero() {
            bail!("ONRAMP_BRAKE_WINDOW must be longer than 0s: the offboarding budget is counted over it");
        }
        let brake = Brake { min_users: a.brake_min_users, max_percent: a.brake_max_percent, window: a.brake_window };
        // parsed here rather than by clap, whose error would print the value
        let mut signing_secrets = vec![];
        for (i, s) in a.webhook_secrets.iter().enumerate() {
            let key = s.expose().parse::<SigningSecret>();
            signing_secrets.push(key.map_err(|e| anyhow::anyhow!("ONRAMP_WEBHOOK_SECRETS entry {}: {e}", i + 1))?);
        }
        let auth =
            WebhookAuth { signing_secrets, bearer_tokens: a.webhook_tokens.clone(), tolerance: a.webhook_tolerance };
        if webhook && !auth.is_configured() {
            bail!("the Authentik webhook needs ONRAMP_WEBHOOK_SECRETS or ONRAMP_WEBHOOK_TOKENS (or both)");
        }
        Ok(Some(Self {
            authentik: Arc::new(client),
            tenants: registry,
            brake,
            auth,
            settle: a.webhook_settle,
            max_body: a.webhook_max_body,
            max_diff_users: usize::from(a.webhook_max_diff_users),
            writers: usize::from(a.webhook_writers),
            batch: usize::from(a.webhook_batch),
            reconcile_interval: a.reconcile_interval,
        }))
    }

    /// The reconciler, reading the cluster through `slurm`: the same route as the flows'.
    pub fn reconciler(&self, slurm: Arc<dyn Slurm>) -> Arc<Reconciler> {
        Reconciler::new(self.authentik.clone(), self.tenants.clone(), slurm, self.brake)
    }

    /// `base` with the reconcile flows added, reading the cluster through `slurm`.
    pub fn registry(&self, base: Registry, slurm: Arc<dyn Slurm>) -> Registry {
        crate::flows::with_reconcile(base, self.reconciler(slurm))
    }

    /// Starts the webhook's writer tasks and the delivery pump (until `shutdown`). Every process
    /// with the intake configured runs a pump (api and worker alike): deliveries one process
    /// stored are processed by another if it dies, and several pumps never do the same work.
    pub fn start(&self, engine: &Engine, shutdown: CancellationToken) -> Arc<Intake> {
        let pump = self.pump(engine);
        let intake = Arc::new(Intake {
            auth: self.auth.clone(),
            writer: DeliveryWriter::start(engine.clone(), self.writers, self.batch, pump.handoff.clone()),
            tenants: self.tenants.clone(),
            max_body: self.max_body,
            max_diff_users: self.max_diff_users,
            stats: IntakeStats::default(),
            pump: pump.stats.clone(),
        });
        tokio::spawn(pump.run(shutdown));
        intake
    }

    /// A delivery pump (not started): see `intake::pump`.
    pub fn pump(&self, engine: &Engine) -> Pump {
        Pump {
            engine: engine.clone(),
            tenants: self.tenants.clone(),
            settle: self.settle,
            batch: PUMP_BATCH,
            poll: PUMP_POLL,
            handoff: Arc::default(),
            stats: Arc::new(PumpStats::default()),
        }
    }
}

/// Most deliveries the pump takes in one transaction.
pub const PUMP_BATCH: usize = 1000;
/// How often a pump looks for deliveries another process stored (its own writer wakes it).
pub const PUMP_POLL: Duration = Duration::from_millis(500);

/// Enqueues a full reconcile at start and then every `interval` (a pending one absorbs the next).
pub async fn periodic_reconcile(engine: Engine, interval: Duration, shutdown: CancellationToken) {
    let mut cause = "start";
    loop {
        if let Err(e) = engine.enqueue(&[full_job(Actor::reconciler(), cause)]).await {
            tracing::warn!(error = %e, "could not enqueue the periodic full reconcile");
        }
        if interval.is_zero() {
            return;
        }
        cause = "periodic";
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(interval) => {}
        }
    }
}
