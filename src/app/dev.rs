//! `onramp dev`: everything on one machine. Its own private PostgreSQL (never `DATABASE_URL`:
//! dev's worker runs on simulated backends and would mark a real onramp's jobs done), migrations,
//! both roles, and sample jobs to watch.

use serde_json::json;
use tokio::net::TcpListener;

use anyhow::Context;

use crate::app::cli::DevArgs;
use crate::app::devpg::PrivatePg;
use crate::app::{devworld, output};
use std::path::Path;
use std::sync::Arc;

use crate::app::db;
use crate::app::intake::IntakeSetup;
use crate::app::retention::Retention;
use crate::app::settings::worker_config;
use crate::app::world::{Parts, World, shutdown_on_signal};
use crate::backends::authentik::Authentik;
use crate::backends::record::RecordingAuthentik;
use crate::backends::slurm::{HostPath, Slurm, SlurmCli};
use crate::domain::names::ClusterName;
use crate::domain::tenants::TenantRegistry;
use crate::dryrun::sim::{self, DryConfig, SimAuthentik};
use crate::effects::EffectLog;
use crate::engine::{Actor, Engine, NewJob};
use crate::flows::reconcile::Brake;
use crate::flows::{self, selftest};
use crate::intake::{SigningSecret, WebhookAuth};

pub async fn dev(args: DevArgs) -> anyhow::Result<()> {
    let pg = PrivatePg::start(&args.dev_dir).await?;
    // the `export` line dev prints sets DATABASE_URL to dev's own database: no need to warn then
    if std::env::var("DATABASE_URL").is_ok_and(|u| u != pg.url.expose()) {
        eprintln!(
            "onramp dev: ignoring DATABASE_URL: dev runs only on its own private PostgreSQL (its worker's backends \
             are simulated and would mark a real onramp's jobs done); use onramp serve for a real database"
        );
    }
    let dir = args.dev_dir.canonicalize()?;
    let result = run(&args, &pg, &dir).await;
    let _ = std::fs::remove_file(dir.join(devworld::ENV_FILE));
    pg.stop().await?;
    eprintln!("onramp dev: stopped the private PostgreSQL");
    result
}

/// The demo tenant of `onramp dev`.
const DEV_TENANTS: &str = "uid_offset: 4000\ngid_offset: 4000\ntenants:\n  - name: demo\n    description: Demo tenant\n    \
group: tenant-demo-users\n    account: tenant-demo\n    limits: { fairshare: 100, grp_tres: gres/gpu=16, grp_jobs: 50 }\n    \
user_defaults: { default_qos: normal, qos: [normal], max_jobs: 10 }\n    \
quotas:\n      home: { path: /home, soft: 45GB, hard: 50GB }\n      scratch: { path: /tenant/demo/scratch, soft: 9TB, hard: 10TB }\n    \
default_team: ml-team-demo\n    teams:\n      - { account: ml-team-demo, group: tenant-demo-ml }\n";

/// The signing secret of the dev webhook (the intake is real; only this key is made up).
const DEV_WHSEC: &str = "whsec_b25yYW1wLWRldi1zaWduaW5nLWtleQ==";

/// The runbook's waits, short enough to watch.
fn dev_timings() -> flows::Timings {
    let s = std::time::Duration::from_secs;
    flows::Timings {
        key_poll: s(2),
        key_deadline: s(60),
        propagation: s(10),
        restart_wait: s(10),
        drain_poll: s(5),
        drain_deadline: s(60),
        cleanup_poll: s(2),
        cleanup_deadline: s(60),
        retention: s(120),
        retry_initial: s(1),
        retry_max: s(30),
        retry_attempts: 8,
    }
}

/// The real intake, reconciler and flows on the simulated cluster (see `crate::dryrun`): a
/// demo tenant whose accounts exist, Authentik with alice and bob in its group, and dave, who
/// left it but still has an association. Every simulated call is printed.
async fn dry_cluster(log: &EffectLog) -> anyhow::Result<Parts> {
    let tenants = Arc::new(TenantRegistry::parse(DEV_TENANTS, "onramp dev")?);
    let demo = tenants.tenant("demo").expect("the demo tenant");
    let cluster = ClusterName::parse("dev").expect("a cluster name");
    let cfg = DryConfig {
        cluster: cluster.clone(),
        k8s: Default::default(),
        storage: Default::default(),
        timings: dev_timings(),
        archive_dir: HostPath::parse("/var/spool/slurm/archive").expect("a path"),
        login_address: "login.demo.example".into(),
        notify: true,
        batch_window: std::time::Duration::from_millis(500),
    };
    let world = sim::World::new(&cluster, cfg.k8s.clone());
    let seed = SlurmCli::new(world.slurm_host(), cluster.clone());
    seed.ensure_tenant(&flows::specs::tenant_spec(demo).map_err(anyhow::Error::msg)?).await?;
    let dave = [crate::domain::names::Username::parse("dave").expect("a name")];
    let limits = flows::specs::user_limits(demo).map_err(anyhow::Error::msg)?;
    seed.add_users(&demo.account, &dave, true, &limits).await?;
    let users = vec![
        sim::directory_user(1, "alice", &["tenant-demo-users", "tenant-demo-ml"]),
        sim::directory_user(2, "bob", &["tenant-demo-users"]),
        sim::directory_user(4, "dave", &[]),
    ];
    let authentik: Arc<dyn Authentik> = Arc::new(SimAuthentik::new(None, users));
    let backends = sim::backends(&cfg, &world, authentik.clone(), tenants.clone(), log).map_err(anyhow::Error::msg)?;
    let setup = IntakeSetup {
        authentik: Arc::new(RecordingAuthentik { inner: authentik, log: log.clone() }),
        tenants,
        brake: Brake::default(),
        auth: WebhookAuth {
            signing_secrets: vec![DEV_WHSEC.parse().map_err(anyhow::Error::msg)?],
            bearer_tokens: vec![],
            tolerance: std::time::Duration::from_secs(300),
        },
        settle: std::time::Duration::from_secs(1),
        max_body: 1 << 20,
        max_diff_users: 200,
        writers: 1,
        batch: 64,
        reconcile_interval: std::time::Duration::from_secs(3600),
    };
    Ok(Parts { flows: Some(backends), intake: Some(setup), plans: Some(cfg) })
}

/// Prints each simulated call as it happens.
async fn print_effects(log: EffectLog) {
    let mut seen = 0;
    loop {
        for e in log.since(seen) {
            seen += 1;
            let line = format!("[dry-run] {} {:<14} {}", if e.write { "+" } else { " " }, e.system, e.call);
            if output::line(&line).is_err() {
                return; // nobody reads them any more
            }
        }
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
}

/// "alice was updated in Authentik", signed, to our own webhook: the real intake stores it and
/// re-reads alice from (the simulated) Authentik.
async fn sample_webhook(addr: std::net::SocketAddr) -> anyhow::Result<u16> {
    let model = json!({"app": "authentik_core", "model_name": "user", "pk": 1, "name": "alice"});
    let body = json!({ "event_uuid": uuid::Uuid::new_v4().simple().to_string(), "action": "model_updated",
        "app": "authentik.events.models", "model": model, "actor": { "pk": 1, "username": "akadmin" },
        "context": { "model": model }, "created": time::OffsetDateTime::now_utc().format(&time::format_description::well_known::Rfc3339)? });
    let raw = serde_json::to_vec(&body)?;
    let id = format!("msg_{}", uuid::Uuid::new_v4().simple());
    let ts = time::OffsetDateTime::now_utc().unix_timestamp();
    let key: SigningSecret = DEV_WHSEC.parse().map_err(anyhow::Error::msg)?;
    let res = reqwest::Client::new()
        .post(format!("http://{addr}/webhooks/authentik"))
        .header("content-type", "application/json")
        .header("webhook-id", &id)
        .header("webhook-timestamp", ts.to_string())
        .header("webhook-signature", key.sign(&id, ts, &raw))
        .body(raw)
        .send()
        .await?;
    Ok(res.status().as_u16())
}

async fn run(args: &DevArgs, pg: &PrivatePg, dir: &Path) -> anyhow::Result<()> {
    let pool = db::connect(&pg.url, 16).await?;
    db::migrate(&pool).await?;
    let tenants = dir.join(devworld::TENANTS_FILE);
    std::fs::write(&tenants, DEV_TENANTS).with_context(|| format!("writing {}", tenants.display()))?;
    let log = EffectLog::default();
    let world = World::build(pool, dry_cluster(&log).await?).with_retention(Retention::from_args(&args.worker)?);
    let engine = world.engine.clone();
    let samples = enqueue_samples(&engine).await?;
    let listener = TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("cannot listen on {} (ONRAMP_LISTEN)", args.listen))?;
    let addr = listener.local_addr()?;
    sqlx::query("delete from api_tokens where name = 'dev'").execute(engine.pool()).await?;
    let token = crate::http::access::create(
        engine.pool(),
        "dev",
        crate::http::access::Role::Admin,
        None,
        None,
        &Actor::cli("dev"),
    )
    .await?;
    let env_file = dir.join(devworld::ENV_FILE);
    std::fs::write(&env_file, devworld::env_file(pg.url.expose(), &tenants))
        .with_context(|| format!("writing {}", env_file.display()))?;
    let banner = Banner { addr, token: token.expose(), url: pg.url.expose(), data: pg.data_dir(), tenants: &tenants };
    output::print(&banner.text(samples.last().copied().unwrap_or(1), &samples))?;
    tokio::spawn(print_effects(log));
    tokio::spawn(async move {
        match sample_webhook(addr).await {
            Ok(status) => drop(output::line(&format!("[dev] sample webhook (alice updated) answered {status}"))),
            Err(e) => eprintln!("[dev] sample webhook failed: {e:#}"),
        }
    });
    let worker = worker_config(&args.worker);
    world.run(Some(listener), Some(worker), shutdown_on_signal()).await
}

/// What dev prints at start, for the terminal (the dev-only token included): where everything is,
/// how to point the CLI at it, and what to try.
struct Banner<'a> {
    addr: std::net::SocketAddr,
    token: &'a str,
    url: &'a str,
    data: &'a Path,
    tenants: &'a Path,
}

impl Banner<'_> {
    fn text(&self, last: i64, samples: &[i64]) -> String {
        let Self { addr, token: t, url, data, tenants } = self;
        let (data, tenants) = (data.display(), tenants.display());
        format!(
            "\nonramp dev is running at http://{addr}\n  dashboard: http://{addr}/dashboard (sign in with the token)\n  \
             API token: {t}\n  database:  {url}\n  data:      {data} (a private PostgreSQL, stopped with onramp)\n  \
             registry:  {tenants} (tenant demo)\n\n\
             The cluster is simulated (a dry run: every command and request is printed with [dry-run], nothing runs).\n\
             Tenant demo exists; in Authentik alice and bob are in its group, dave left it. The full reconcile at start\n\
             onboards alice and bob and offboards dave (his hard cutoff is not needed; his retention is 2 minutes); a\n\
             signed webhook about alice goes through the real intake. Engine samples {samples:?} show a timer, retries\n\
             and an approval.\n\n\
             The CLI finds this dev world by itself in this folder and below it; elsewhere, first:\n\n  \
             export DATABASE_URL={url} ONRAMP_TENANTS={tenants}\n\nTry:\n\
             \n  onramp jobs list\
             \n  onramp jobs show {last}\
             \n  onramp jobs approve {last}\
             \n  onramp plan user.onboard --tenant demo --user alice\
             \n  curl -s -H 'Authorization: Bearer {t}' http://{addr}/v1/jobs\n\nCtrl-C stops everything.\n"
        )
    }
}

/// A few jobs that show the engine's mechanics; each only once while it is unfinished.
async fn enqueue_samples(engine: &Engine) -> anyhow::Result<Vec<i64>> {
    let actor = Actor::cli("dev");
    let jobs: Vec<NewJob> = [
        ("selftest/sleep", json!({ "sleep_ms": 1500 })),
        ("selftest/timer", json!({ "wait_ms": 20000 })),
        ("selftest/retries", json!({ "fail_attempts": 2 })),
        ("selftest/approval", json!({ "approval": true })),
    ]
    .into_iter()
    .map(|(subject, input)| {
        NewJob::new(selftest::KIND, subject, input, actor.clone()).dedupe(format!("dev-sample:{subject}"))
    })
    .collect();
    Ok(engine.enqueue(&jobs).await?.into_iter().map(|e| e.id).collect())
}
