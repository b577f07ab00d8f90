//! A full reconcile at scale (issue 16): `cargo bench --bench reconcile`.
//!
//! Seeds a tenant registry (BENCH_RECON_TENANTS, default 10), the fake Authentik (in this process,
//! paging as Authentik pages) with BENCH_RECON_USERS users (default 10,000) spread over the
//! tenants' groups, and the cluster with their associations and 1 % drift of each kind: users
//! with no association, associations with a changed limit (MaxJobs), and associations of users
//! gone from Authentik. The cluster is the real Slurm test cluster (`scripts/slurm-test-cluster.sh
//! start`; run this under `flock /tmp/onramp-slurm.lock`), its accounts and users all named
//! `rcbench-…` (users of that name the world does not have are deleted first, the others' adds
//! are idempotent; all of them are deleted at the end unless BENCH_KEEP_SLURM=1, which saves the
//! next run of the same size most of its seeding); with ONRAMP_BENCH_SLURM=sim a simulated slurmdbd answers the same
//! `sacctmgr show assoc` (the real backend and parser read it). Seeding is not timed.
//!
//! Then, BENCH_RUNS times (default 3), on a fresh database: one `reconcile.full` job through the
//! engine (a worker in this process), from the enqueue to the job's success. Each run checks its
//! result — exactly the expected onboardings (missing, changed) and offboardings (gone), nothing
//! held by the safety brake — and no figure is printed otherwise. It counts the Slurm commands
//! (reads; writes must be none) and the Authentik requests of the pass.
//!
//! ONRAMP_BENCH_SMOKE=1: 200 users (CI's seconds-long smoke). Prints one JSON line.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use onramp::backends::authentik::{AuthentikClient, AuthentikConfig};
use onramp::backends::exec::{Command, Local, Output, RunFuture, Transport};
use onramp::backends::record::RecordingTransport;
use onramp::backends::slurm::{Limit, Slurm, SlurmCli};
use onramp::domain::names::{ClusterName, SlurmAccount, Username};
use onramp::domain::secret::Secret;
use onramp::domain::tenants::TenantRegistry;
use onramp::effects::EffectLog;
use onramp::engine::{Actor, Engine, WorkerConfig, WorkerStats};
use onramp::flows::reconcile::{Brake, Reconciler, full_job};
use onramp::flows::{self, specs};
use onramp_fakes::authentik::{FakeUser, TOKEN};
use serde_json::{Value, json};
use sqlx::{Connection, PgConnection, PgPool};
use tokio_util::sync::CancellationToken;

const PREFIX: &str = "rcbench-";
const CLUSTER: &str = "production";

fn env<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn account(t: usize) -> String {
    format!("{PREFIX}t{t:02}")
}

fn group(t: usize) -> String {
    format!("{PREFIX}g{t:02}")
}

fn username(pk: usize) -> String {
    format!("{PREFIX}u{pk:05}")
}

/// (tenant index, user name) pairs.
type Pairs = Vec<(usize, String)>;

/// Who is where: users `1..=users` in Authentik, user `pk` in tenant `(pk - 1) % tenants`; 1 % of
/// them (pk % 100 == 1) have no association, 1 % (pk % 100 == 2) one with a changed MaxJobs, and
/// 1 % more (pks past `users`) have associations but are gone from Authentik.
struct World {
    tenants: usize,
    users: usize,
}

impl World {
    fn tenant_of(&self, pk: usize) -> usize {
        (pk - 1) % self.tenants
    }
    fn missing(&self, pk: usize) -> bool {
        pk % 100 == 1
    }
    fn changed(&self, pk: usize) -> bool {
        pk % 100 == 2
    }
    fn gone(&self) -> std::ops::RangeInclusive<usize> {
        self.users + 1..=self.users + (self.users / 100).max(1)
    }
    fn registry_yaml(&self) -> String {
        let mut y = String::from("uid_offset: 10000\ngid_offset: 10000\ntenants:\n");
        for t in 0..self.tenants {
            y += &format!(
                "  - name: rcb{t:02}\n    group: {}\n    account: {}\n    user_defaults: {{ default_qos: normal, qos: [normal], max_jobs: 20 }}\n",
                group(t),
                account(t)
            );
        }
        y
    }
    /// (account, user) of each association the cluster has, and of those with a changed limit.
    fn associations(&self) -> (Pairs, Pairs) {
        let mut all = vec![];
        let mut changed = vec![];
        for pk in (1..=self.users).chain(self.gone()) {
            let t = self.tenant_of(pk);
            if pk <= self.users && self.missing(pk) {
                continue;
            }
            all.push((t, username(pk)));
            if pk <= self.users && self.changed(pk) {
                changed.push((t, username(pk)));
            }
        }
        (all, changed)
    }
    /// The dedupe keys of the jobs a correct pass enqueues: (onboardings, offboardings).
    fn expected(&self) -> (BTreeSet<String>, BTreeSet<String>) {
        let key = |kind: &str, pk: usize| format!("{kind}:{}/{}", account(self.tenant_of(pk)), username(pk));
        let on = (1..=self.users).filter(|&pk| self.missing(pk) || self.changed(pk)).map(|pk| key("user.onboard", pk));
        let off = self.gone().map(|pk| key("user.offboard", pk));
        (on.collect(), off.collect())
    }
}

/// A slurmdbd answering the backend's `sacctmgr -n -P show assoc where account=… cluster=…
/// format=…` as sacctmgr does, from a list: (account, user, the limit columns from the share on).
#[derive(Clone, Default)]
struct SimSlurmdbd(Arc<Mutex<Vec<(String, String, String)>>>);

impl Transport for SimSlurmdbd {
    fn run<'a>(&'a self, cmd: &'a Command, _timeout: Duration) -> RunFuture<'a> {
        let argv = cmd.argv();
        let arg = |key: &str| argv.iter().find_map(|a| a.strip_prefix(key)).map(str::to_string);
        let reply = match (argv.get(4).map(String::as_str), arg("account="), arg("cluster=")) {
            (Some("assoc"), Some(accounts), Some(cluster)) => {
                let accounts: BTreeSet<&str> = accounts.split(',').collect();
                let rows = self.0.lock().unwrap();
                let stdout: String = rows
                    .iter()
                    .filter(|(a, _, _)| accounts.contains(a.as_str()))
                    .map(|(a, u, limits)| format!("{cluster}|{a}|{u}|||{limits}\n"))
                    .collect();
                Output { code: 0, stdout, stderr: String::new() }
            }
            _ => {
                Output { code: 1, stdout: String::new(), stderr: format!("simulated slurmdbd: not simulated: {cmd}\n") }
            }
        };
        Box::pin(async move { Ok(reply) })
    }
}

async fn try_sh(argv: &[&str]) -> Result<Output, String> {
    let cmd = Command::new(argv[0]).args(argv[1..].iter().map(|s| s.to_string()));
    Local.run(&cmd, Duration::from_secs(600)).await.map_err(|e| format!("{cmd}: {e}"))
}

/// The cluster's users or accounts named `rcbench-…` (only this benchmark makes such names).
async fn try_slurm_names(what: &str) -> Result<Vec<String>, String> {
    let o = try_sh(&["sacctmgr", "-n", "-P", "show", what, &format!("format={what}")]).await?;
    Ok(o.stdout.lines().map(str::trim).filter(|l| l.starts_with(PREFIX)).map(String::from).collect())
}

/// Deletes every user and account named `rcbench-…`, in calls of `CLEANUP_CHUNK` users: slurmdbd
/// renumbers its nested sets for each deleted association, so one call for 1,000 users of a
/// 10,000-user cluster ran past `sh`'s 10 minutes (2026-12-04). It runs after the figure is
/// printed; when it fails, the next run's seeding deletes every `rcbench-…` user its world does
/// not have.
async fn slurm_cleanup() -> Result<(), String> {
    delete_users(&try_slurm_names("user").await?).await?;
    let accounts = try_slurm_names("account").await?;
    if !accounts.is_empty() {
        try_sh(&["sacctmgr", "-i", "delete", "account", "where", &format!("name={}", accounts.join(","))]).await?;
    }
    let left = (try_slurm_names("user").await?.len(), try_slurm_names("account").await?.len());
    match left {
        (0, 0) => Ok(()),
        (u, a) => Err(format!("{u} users and {a} accounts named {PREFIX}… are left on the cluster")),
    }
}

const CLEANUP_CHUNK: usize = 100;

/// Deletes these Slurm users, `CLEANUP_CHUNK` a call.
async fn delete_users(users: &[String]) -> Result<(), String> {
    for chunk in users.chunks(CLEANUP_CHUNK) {
        try_sh(&["sacctmgr", "-i", "delete", "user", "where", &format!("name={}", chunk.join(","))]).await?;
    }
    Ok(())
}

/// The cluster side: the real test cluster through the Slurm backend (batched adds), or the
/// simulated slurmdbd's rows.
async fn seed_cluster(w: &World, reg: &TenantRegistry, sim: Option<&SimSlurmdbd>) {
    let (all, changed) = w.associations();
    let limits = specs::user_limits(&reg.tenants[0]).unwrap();
    let changed_limits = onramp::backends::slurm::UserLimits { max_jobs: Some(Limit::At(7)), ..limits.clone() };
    if let Some(sim) = sim {
        let changed: BTreeSet<&(usize, String)> = changed.iter().collect();
        *sim.0.lock().unwrap() = all
            .iter()
            .map(|p| {
                let max_jobs = if changed.contains(p) { 7 } else { 20 };
                (account(p.0), p.1.clone(), format!("parent|||||{max_jobs}||normal|normal"))
            })
            .collect();
        return;
    }
    // users named rcbench-… whom this world does not have on the cluster (left by a run of
    // another size, or missing on purpose) go first; then the seeding below is idempotent
    let want: BTreeSet<&str> = all.iter().map(|(_, u)| u.as_str()).collect();
    let extra: Vec<String> = try_slurm_names("user")
        .await
        .unwrap_or_else(|e| panic!("{e}"))
        .into_iter()
        .filter(|u| !want.contains(u.as_str()))
        .collect();
    delete_users(&extra).await.unwrap_or_else(|e| panic!("{e}"));
    let slurm = SlurmCli::new(Arc::new(Local), ClusterName::parse(CLUSTER).unwrap());
    for t in &reg.tenants {
        slurm.ensure_tenant(&specs::tenant_spec(t).unwrap()).await.expect("tenant account");
    }
    // every association with the tenant's limits, then the changed ones' MaxJobs
    for (pairs, l) in [(&all, &limits), (&changed, &changed_limits)] {
        for i in 0..w.tenants {
            let users: Vec<Username> =
                pairs.iter().filter(|(x, _)| *x == i).map(|(_, u)| Username::parse(u).unwrap()).collect();
            let a = SlurmAccount::parse(&account(i)).unwrap();
            for chunk in users.chunks(1000) {
                slurm.add_users(&a, chunk, true, l).await.expect("seeding associations");
            }
        }
    }
}

async fn fresh_db(admin: &str, name: &str) -> PgPool {
    let mut c = PgConnection::connect(admin).await.expect("BENCH_PG reachable");
    sqlx::query(&format!("drop database if exists {name} with (force)")).execute(&mut c).await.unwrap();
    sqlx::query(&format!("create database {name}")).execute(&mut c).await.unwrap();
    let url = format!("{}/{name}", admin.rsplit_once('/').unwrap().0);
    let pool = sqlx::postgres::PgPoolOptions::new().max_connections(16).connect(&url).await.unwrap();
    onramp::app::db::migrate(&pool).await.unwrap();
    pool
}

/// What one pass did.
struct Pass {
    seconds: f64,
    slurm_reads: usize,
    authentik_requests: usize,
    onboard: usize,
    offboard: usize,
}

/// One `reconcile.full` from enqueue to success; panics (no figure) when its result is wrong.
async fn pass(w: &World, engine: &Engine, log: &EffectLog, fake: &onramp_fakes::authentik::Fake) -> Pass {
    let pool = engine.pool();
    let (log0, req0) = (log.len(), fake.lock().unwrap().requests.len());
    let stop = CancellationToken::new();
    let cfg = WorkerConfig {
        id: "bench".into(),
        concurrency: 4,
        lease: Duration::from_secs(60),
        poll_interval: Duration::from_secs(5),
        shutdown_grace: Duration::from_secs(10),
    };
    let worker = {
        let (e, s) = (engine.clone(), stop.clone());
        tokio::spawn(async move { e.run_worker(cfg, Arc::new(WorkerStats::default()), s).await.unwrap() })
    };
    // the worker is idle and listening before the clock starts
    let listening = Instant::now() + Duration::from_secs(30);
    while sqlx::query_scalar::<_, i64>(
        "select count(*) from pg_stat_activity where datname = current_database() and query ilike 'listen%'",
    )
    .fetch_one(pool)
    .await
    .unwrap()
        == 0
    {
        assert!(Instant::now() < listening, "the worker did not start listening within 30 s");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let t0 = Instant::now();
    let id = engine.enqueue(&[full_job(Actor::cli("bench"), "bench")]).await.unwrap()[0].id;
    let deadline = t0 + Duration::from_secs(300);
    let state = loop {
        let state: String =
            sqlx::query_scalar("select state from jobs where id = $1").bind(id).fetch_one(pool).await.unwrap();
        if !["pending", "running", "waiting"].contains(&state.as_str()) || Instant::now() > deadline {
            break state;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    };
    let seconds = t0.elapsed().as_secs_f64();
    stop.cancel();
    worker.await.unwrap();
    let output: Value =
        sqlx::query_scalar("select outputs from jobs where id = $1").bind(id).fetch_one(pool).await.unwrap();
    assert_eq!(state, "succeeded", "the reconcile did not succeed: {output}");
    let report = &output["reconcile"];
    assert!(report.get("decision").is_none(), "the reconcile gave up: {report}");
    let keys = |kind: &'static str| async move {
        let k: Vec<String> =
            sqlx::query_scalar("select dedupe_key from jobs where kind = $1").bind(kind).fetch_all(pool).await.unwrap();
        k.into_iter().collect::<BTreeSet<String>>()
    };
    let (on, off) = (keys("user.onboard").await, keys("user.offboard").await);
    let (want_on, want_off) = w.expected();
    assert_eq!(on.symmetric_difference(&want_on).take(10).collect::<Vec<_>>(), Vec::<&String>::new(), "onboardings");
    assert_eq!(off.symmetric_difference(&want_off).take(10).collect::<Vec<_>>(), Vec::<&String>::new(), "offboardings");
    let kinds: Vec<(String, i64)> =
        sqlx::query_as("select kind, count(*) from jobs group by kind order by kind").fetch_all(pool).await.unwrap();
    let total: i64 = kinds.iter().map(|(_, n)| n).sum();
    assert_eq!(total as usize, 1 + on.len() + off.len(), "jobs beyond the expected ones: {kinds:?}");
    for t in report["tenants"].as_array().expect("a tenant report") {
        assert!(t["held"].as_array().is_some_and(Vec::is_empty), "the brake held offboardings: {t}");
        assert_ne!(t["decision"], "skipped", "{t}");
    }
    let calls = log.since(log0);
    assert!(calls.iter().all(|e| !e.write), "the reconcile changed the cluster: {:?}", calls.iter().find(|e| e.write));
    let authentik_requests = fake.lock().unwrap().requests.len() - req0;
    Pass { seconds, slurm_reads: calls.len(), authentik_requests, onboard: on.len(), offboard: off.len() }
}

#[tokio::main]
async fn main() {
    let smoke = std::env::var("ONRAMP_BENCH_SMOKE").is_ok_and(|v| v == "1");
    let w = World {
        tenants: env("BENCH_RECON_TENANTS", 10),
        users: if smoke { 200 } else { env("BENCH_RECON_USERS", 10_000) },
    };
    let runs: usize = env("BENCH_RUNS", 3).max(1);
    let sim = std::env::var("ONRAMP_BENCH_SLURM").is_ok_and(|v| v == "sim");
    let admin: String = env("BENCH_PG", "postgres://postgres@127.0.0.1:5432/postgres".to_string());
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let load: Vec<&str> = load.split_whitespace().take(3).collect();
    let reg = Arc::new(TenantRegistry::parse(&w.registry_yaml(), "bench").unwrap());

    // Authentik: every user in their tenant's group (seeded in the fake's state directly)
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let (fake, url) = onramp_fakes::authentik::serve(listener, TOKEN);
    {
        let mut st = fake.lock().unwrap();
        st.groups = (0..w.tenants).map(group).collect();
        for pk in 1..=w.users {
            let g = group(w.tenant_of(pk));
            st.users.insert(pk as i64, FakeUser::new(pk as i64, &username(pk), &[g.as_str()]));
        }
    }
    let authentik = Arc::new(
        AuthentikClient::new(AuthentikConfig {
            url,
            token: Secret::new(TOKEN),
            timeout: Duration::from_secs(30),
            attempts: 3,
            backoff: Duration::from_millis(200),
            page_size: 100,
            concurrency: 32,
        })
        .unwrap(),
    );

    // the cluster, outside the clock
    let t_seed = Instant::now();
    let simulated = SimSlurmdbd::default();
    seed_cluster(&w, &reg, sim.then_some(&simulated)).await;
    let seed_s = t_seed.elapsed().as_secs_f64();
    let log = EffectLog::default();
    let inner: Arc<dyn Transport> = if sim { Arc::new(simulated) } else { Arc::new(Local) };
    let slurm: Arc<dyn Slurm> =
        Arc::new(SlurmCli::new(RecordingTransport::wrap("slurm", inner, &log), ClusterName::parse(CLUSTER).unwrap()));
    let (all, _) = w.associations();

    let mut passes = vec![];
    for i in 0..runs {
        let pool = fresh_db(&admin, "onramp_bench_reconcile").await;
        let reconciler = Reconciler::new(authentik.clone(), reg.clone(), slurm.clone(), Brake::default());
        let registry = flows::with_reconcile(flows::declare_all(flows::registry()), reconciler);
        let engine = Engine::new(pool.clone(), registry);
        let p = pass(&w, &engine, &log, &fake).await;
        eprintln!(
            "reconcile run {}: {:.3} s, {} Slurm reads, {} Authentik requests, {} onboardings, {} offboardings",
            i + 1,
            p.seconds,
            p.slurm_reads,
            p.authentik_requests,
            p.onboard,
            p.offboard
        );
        passes.push(p);
        pool.close().await;
    }
    let mut secs: Vec<f64> = passes.iter().map(|p| p.seconds).collect();
    secs.sort_by(f64::total_cmp);
    let reads: BTreeSet<usize> = passes.iter().map(|p| p.slurm_reads).collect();
    let requests: BTreeSet<usize> = passes.iter().map(|p| p.authentik_requests).collect();
    println!(
        "{}",
        json!({
            "system": "onramp", "measure": "full_reconcile", "slurm": if sim { "simulated" } else { "real" },
            "tenants": w.tenants, "users": w.users, "associations": all.len(), "runs": runs,
            "median_s": secs[secs.len() / 2], "min_s": secs[0], "max_s": secs[secs.len() - 1], "seconds": secs,
            "slurm_reads": reads.iter().max(), "authentik_requests": requests.iter().max(),
            "onboard_jobs": passes[0].onboard, "offboard_jobs": passes[0].offboard,
            "seed_s": seed_s, "load_average_at_start": load,
        })
    );
    let mut c = PgConnection::connect(&admin).await.unwrap();
    sqlx::query("drop database if exists onramp_bench_reconcile with (force)").execute(&mut c).await.unwrap();
    if !sim
        && std::env::var("BENCH_KEEP_SLURM").map_or(true, |v| v != "1")
        && let Err(e) = slurm_cleanup().await
    {
        eprintln!("reconcile bench: the Slurm cleanup failed ({e}); the next run's seeding deletes what is left");
    }
}
