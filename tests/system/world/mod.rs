//! The system test's world, reusable by any scenario: the release binary started as separate
//! processes exactly as deploy/ configures them (env and files only) — one `api`, N `worker`
//! replicas, after the migrate Job — against its own PostgreSQL database, the real Slurm test
//! cluster (over `local` or `kube-exec`), the fake Kubernetes API and the fake Authentik as
//! standalone servers (`onramp-fakes`), and a real SMTP server. `World::start` returns with the
//! tenants `foo` and `bar` onboarded and no users; a replica can be killed and restarted.
//!
//! Binaries: `ONRAMP_BIN` and `ONRAMP_FAKES_BIN`, else both built with `cargo build --release
//! --workspace --bins` (one build, so the two share their dependencies' builds). Worlds run one at a time (they share the Slurm cluster's names).
//! A world's files and logs are kept when its test fails, or always with `ONRAMP_KEEP_WORLD` set.

pub mod cluster;
pub mod db;
pub mod deploy;
pub mod mail;
pub mod options;
pub mod postgres;
pub mod process;
pub mod sender;
pub mod setup;
pub mod trace;
pub mod webhook;

use std::collections::BTreeMap;
use std::future::Future;
use std::path::PathBuf;
use std::time::Duration;

use onramp_fakes::client::{AuthentikControl, K8sControl};

use crate::cargo_bin;

use self::cluster::{Tenant, User};
use self::db::Db;
use self::mail::Smtpd;
pub use self::options::{Options, SlurmVia};
use self::process::Proc;
use self::setup::{env, kubeconfig, layout};

/// Polls `check` until it returns Some, or panics with `what` after `deadline`.
pub async fn eventually<T, F, Fut>(deadline: Duration, what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let end = tokio::time::Instant::now() + deadline;
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(tokio::time::Instant::now() < end, "timed out after {deadline:?} waiting for {what}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// One world at a time in this process (they share the Slurm cluster's account names).
static ONE: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

pub struct World {
    pub opts: Options,
    pub dir: tempfile::TempDir,
    pub bin: PathBuf,
    pub db: Db,
    pub k8s: K8sControl,
    pub authentik: AuthentikControl,
    pub smtpd: Smtpd,
    pub api: Proc,
    /// `http://127.0.0.1:<port>`.
    pub api_url: String,
    /// The other `api` replicas (`Options::apis`), with their URLs.
    pub more_apis: Vec<(Proc, String)>,
    pub workers: Vec<Proc>,
    pub tenants: Vec<Tenant>,
    /// The site's settings: what an overlay adds to the ConfigMap `onramp-settings` (the fakes'
    /// addresses, this host's paths, short timers).
    pub site: BTreeMap<String, String>,
    /// The API token (the Secret's `api-token`).
    pub api_token: String,
    pub http: reqwest::Client,
    /// When the world started, as Slurm's `-S` takes it (for `sacct` of this world's jobs only).
    pub started: String,
    _fakes: Vec<tokio::process::Child>,
    _one: tokio::sync::MutexGuard<'static, ()>,
}

impl World {
    pub async fn start(opts: Options) -> Self {
        let one = ONE.lock().await;
        let started = String::from_utf8_lossy(&cluster::run(&["date", "+%FT%T"]).stdout).trim().to_string();
        slurm_cluster_up();
        // every tenant's Slurm state goes, also of a tenant this world does not have
        cluster::delete_slurm_state(&cluster::tenants());
        let tenants: Vec<_> = cluster::tenants().into_iter().take(opts.tenants).collect();
        let bin = cargo_bin::binary("ONRAMP_BIN", "onramp", cargo_bin::RELEASE);
        let fakes_bin = cargo_bin::binary("ONRAMP_FAKES_BIN", "onramp-fakes", cargo_bin::RELEASE);
        let dir = tempfile::Builder::new().prefix("onramp-system-").tempdir().unwrap();
        let d = dir.path().to_path_buf();
        layout(&d, &fakes_bin);

        let (k8s_child, k8s_url) = process::spawn_fake(&fakes_bin, "k8s", &[], d.join("logs/fake-k8s.log")).await;
        let token = format!("ak-system-{}", uuid::Uuid::new_v4().simple());
        let ak_log = d.join("logs/fake-authentik.log");
        let (ak_child, ak_url) = process::spawn_fake(&fakes_bin, "authentik", &["--token", &token], ak_log).await;
        let k8s = K8sControl::new(&k8s_url);
        let authentik = AuthentikControl::new(&ak_url);
        cluster::seed_kubernetes(&k8s, &tenants, &d.join("keys")).await;
        let groups: Vec<&str> = tenants
            .iter()
            .flat_map(|t| std::iter::once(t.group.as_str()).chain(t.team.as_ref().map(|(_, g)| g.as_str())))
            .collect();
        authentik.add_groups(&groups).await.unwrap();
        let smtpd = Smtpd::start(d.join("mail"), d.join("logs/smtpd.log")).await;
        let server = match opts.own_postgres {
            true => Some(postgres::Server::create(&d.join("postgres")).await),
            false => None,
        };
        let db = Db::create(server).await;

        // the files deploy/ mounts: the registry's ConfigMap and the Secret `onramp`, whose
        // items each process gets in its own directory (only those its manifest mounts)
        std::fs::write(d.join("config/tenants.yaml"), cluster::registry(&tenants)).unwrap();
        let api_token = format!("onramp-system-{}", uuid::Uuid::new_v4().simple());
        for (key, value) in [
            ("database-url", db.url.as_str()),
            ("api-token", &api_token),
            ("webhook-secrets", webhook::WHSEC),
            ("authentik-token", &token),
        ] {
            std::fs::write(d.join("secret").join(key), format!("{value}\n")).unwrap();
        }
        std::fs::write(d.join("site/kubeconfig"), kubeconfig(&k8s_url)).unwrap();
        let path = |p: &str| d.join(p).display().to_string();
        let site: BTreeMap<String, String> = [
            ("ONRAMP_AUTHENTIK_URL", ak_url.clone()),
            ("ONRAMP_KUBECONFIG", path("site/kubeconfig")),
            ("ONRAMP_SLURM_VIA", opts.slurm_via.setting().into()),
            ("ONRAMP_SLURM_CLUSTER", "production".into()),
            ("ONRAMP_MANAGE_KEYS", "true".into()),
            ("ONRAMP_HOME_ROOT", path("home")),
            ("ONRAMP_SKEL_DIR", path("skel")),
            ("ONRAMP_AUTHORIZED_KEYS_DIR", path("keys")),
            ("ONRAMP_LOGIN_RUN_AS", "runuser -u {user} --".into()),
            ("ONRAMP_WEKA_BIN", path("storage/weka")),
            ("ONRAMP_ARCHIVE_DIR", path("archive")),
            ("ONRAMP_SMTP_URL", smtpd.url()),
            ("ONRAMP_MAIL_FROM", "onramp <onramp@cluster.example>".into()),
            ("ONRAMP_LOGIN_ADDRESS", "login.{tenant}.cluster.example".into()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();

        let migrate = deploy::migrate();
        let mut m = Proc::spawn(
            "migrate",
            &bin,
            &migrate.args,
            env(&migrate, "onramp-migrate", &site, &opts, &d),
            d.join("logs/migrate.log"),
        );
        let status = eventually(Duration::from_secs(60), "the migrate Job to finish", || {
            let s = m.exited();
            async move { s }
        })
        .await;
        assert!(status.success(), "onramp migrate: {status}\n{}", m.tail(30));

        let mut apis: Vec<(Proc, String)> =
            (0..opts.apis.max(1)).map(|i| spawn_api(i, &bin, &site, &opts, &d)).collect();
        let (api, api_url) = apis.remove(0);
        let mut w = Self {
            opts,
            dir,
            bin,
            db,
            k8s,
            authentik,
            smtpd,
            api,
            api_url,
            more_apis: apis,
            workers: vec![],
            tenants,
            site,
            api_token,
            http: reqwest::Client::new(),
            _fakes: vec![k8s_child, ak_child],
            started,
            _one: one,
        };
        for i in 0..w.opts.workers {
            let wk = deploy::worker();
            let name = format!("onramp-worker-{i}");
            let log = w.dir.path().join(format!("logs/{name}.log"));
            let mut e = env(&wk, &name, &w.site, &w.opts, w.dir.path());
            // each pod has its own address; on one host, each replica its own port
            let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
            e.insert("ONRAMP_WORKER_LISTEN".into(), format!("127.0.0.1:{port}"));
            w.workers.push(Proc::spawn(&name, &w.bin, &wk.args, e, log));
        }
        w.wait_ready().await;
        w.onboard_tenants().await;
        w
    }

    /// The API answers /readyz and every worker has its LISTEN connection up.
    pub async fn wait_ready(&mut self) {
        let (http, urls) = (self.http.clone(), self.api_urls());
        let ready = eventually(Duration::from_secs(60), "the api replicas to be ready", || {
            let (http, urls) = (http.clone(), urls.clone());
            async move {
                for url in urls {
                    let r = http.get(format!("{url}/readyz")).send().await.ok();
                    r.filter(|r| r.status().is_success())?;
                }
                Some(())
            }
        });
        tokio::select! {
            _ = ready => {}
            _ = self.died() => panic!("a process died while starting:\n{}", self.logs()),
        }
        // the Secret's api-token reached the API as a file (ONRAMP_API_TOKEN_FILE)
        let r = self.http.get(format!("{}/v1/jobs?limit=1", self.api_url)).bearer_auth(&self.api_token).send();
        let status = r.await.map(|r| r.status().as_u16()).unwrap_or(0);
        assert_eq!(status, 200, "GET /v1/jobs with the Secret's api-token");
        let n = self.workers.iter().filter(|w| w.pid().is_some()).count() as i64;
        eventually(Duration::from_secs(60), "the workers to LISTEN", || async {
            (self.db.listeners().await >= n).then_some(())
        })
        .await;
    }

    /// Every onramp process (the api replicas, then the workers).
    fn processes(&mut self) -> impl Iterator<Item = &mut Proc> {
        let apis = std::iter::once(&mut self.api).chain(self.more_apis.iter_mut().map(|(p, _)| p));
        apis.chain(self.workers.iter_mut())
    }

    /// The URLs of the api replicas.
    pub fn api_urls(&self) -> Vec<String> {
        std::iter::once(self.api_url.clone()).chain(self.more_apis.iter().map(|(_, u)| u.clone())).collect()
    }

    /// Resolves when one of the onramp processes has exited.
    async fn died(&mut self) {
        loop {
            if self.processes().any(|p| p.exited().is_some()) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// `onramp tenant onboard <name>` for each tenant (as an operator runs it), then waits.
    async fn onboard_tenants(&mut self) {
        for t in &self.tenants {
            let o = tokio::process::Command::new(&self.bin)
                .args(["tenant", "onboard", t.name])
                .env_clear()
                .env("PATH", std::env::var("PATH").unwrap_or_default())
                .env("DATABASE_URL", &self.db.url)
                .env("ONRAMP_TENANTS", self.dir.path().join("config/tenants.yaml"))
                .output()
                .await
                .unwrap();
            assert!(o.status.success(), "onramp tenant onboard {}: {}", t.name, String::from_utf8_lossy(&o.stderr));
        }
        self.wait_jobs("tenant.onboard", self.tenants.len(), Duration::from_secs(120)).await;
    }

    /// Waits until `n` jobs of `kind` have succeeded; fails at once on a failed one.
    pub async fn wait_jobs(&self, kind: &str, n: usize, deadline: Duration) {
        let end = tokio::time::Instant::now() + deadline;
        loop {
            let s = self.db.states(kind).await;
            if s.get("succeeded").copied().unwrap_or(0) as usize >= n {
                return;
            }
            let stuck = ["failed", "cancelled", "needs_approval"].iter().any(|k| s.contains_key(*k));
            if stuck || tokio::time::Instant::now() > end {
                panic!("{kind} jobs: {s:?} (want {n} succeeded)\n{}", self.diagnosis().await);
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    /// The users: their unix accounts (as LDAP gives them to the login pods and to Slurm), then
    /// their Authentik accounts (through the fake's control API).
    pub async fn add_users(&self, users: &[User]) {
        cluster::ensure_unix_users(users, self.dir.path());
        let fakes: Vec<_> = users.iter().map(User::fake).collect();
        for chunk in fakes.chunks(500) {
            self.authentik.add_users(chunk).await.unwrap();
        }
    }

    pub fn webhook_url(&self) -> String {
        format!("{}/webhooks/authentik", self.api_url)
    }

    /// `kill -9` of worker `i`.
    pub async fn kill_worker(&mut self, i: usize) {
        self.workers[i].kill9().await;
    }

    /// Starts worker `i` again, as deploy/ starts a replica, and waits until it listens.
    pub async fn restart_worker(&mut self, i: usize) {
        self.workers[i].restart();
        self.wait_ready().await;
    }

    /// `kill -9` of api replica `i`.
    pub async fn kill_api(&mut self, i: usize) {
        self.api_replica(i).kill9().await;
    }

    /// Starts api replica `i` again and waits until every replica is ready.
    pub async fn restart_api(&mut self, i: usize) {
        self.api_replica(i).restart();
        self.wait_ready().await;
    }

    fn api_replica(&mut self, i: usize) -> &mut Proc {
        if i == 0 { &mut self.api } else { &mut self.more_apis[i - 1].0 }
    }

    /// SIGTERM to every onramp process; each must exit by itself, successfully, within its grace.
    pub async fn stop(&mut self) {
        let mut bad = vec![];
        for p in self.processes() {
            match p.terminate(Duration::from_secs(20)).await {
                Some(s) if s.success() => {}
                other => bad.push(format!("{}: {other:?}\n{}", p.name, p.tail(10))),
            }
        }
        assert!(bad.is_empty(), "processes that did not stop cleanly at SIGTERM:\n{}", bad.join("\n"));
    }

    /// What to look at when something did not happen: troubled jobs and the processes' logs.
    pub async fn diagnosis(&self) -> String {
        format!("jobs in trouble: {:#?}\n{}", self.db.troubles().await, self.logs())
    }

    fn logs(&self) -> String {
        let mut s = String::new();
        let apis = std::iter::once(&self.api).chain(self.more_apis.iter().map(|(p, _)| p));
        for p in apis.chain(&self.workers) {
            s += &format!("---- {} ({})\n{}\n", p.name, p.log.display(), p.tail(15));
        }
        s
    }

    pub fn path(&self, p: &str) -> PathBuf {
        self.dir.path().join(p)
    }
}

impl Drop for World {
    fn drop(&mut self) {
        for p in self.processes() {
            p.kill_now();
        }
        // the fields' drops remove the directory before the server in it would stop
        self.db.shut_down();
        cluster::delete_slurm_state(&self.tenants);
        if std::thread::panicking() || std::env::var_os("ONRAMP_KEEP_WORLD").is_some() {
            // keep the files and logs of a failed run (or when asked) to look at
            let Ok(empty) = tempfile::tempdir() else { return };
            let kept = std::mem::replace(&mut self.dir, empty).keep();
            eprintln!("system: the world's files and logs are kept in {}", kept.display());
        }
    }
}

/// The Slurm test cluster answers (`scripts/slurm-test-cluster.sh start` starts it).
fn slurm_cluster_up() {
    let o = std::process::Command::new("sacctmgr").args(["-n", "-P", "show", "cluster", "format=cluster"]).output();
    let up = o.as_ref().is_ok_and(|o| String::from_utf8_lossy(&o.stdout).lines().any(|l| l == "production"));
    assert!(up, "the Slurm test cluster is not running ({o:?}): run `scripts/slurm-test-cluster.sh start`");
}

/// Api replica `i` as deploy/ starts it, on a port of its own: the process and its URL.
fn spawn_api(
    i: usize,
    bin: &std::path::Path,
    site: &BTreeMap<String, String>,
    opts: &Options,
    d: &std::path::Path,
) -> (Proc, String) {
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let a = deploy::api();
    let pod = format!("onramp-api-{i}");
    let mut e = env(&a, &pod, site, opts, d);
    e.insert("ONRAMP_LISTEN".into(), format!("127.0.0.1:{port}"));
    let name = if i == 0 { "api".to_string() } else { format!("api-{i}") };
    let p = Proc::spawn(&name, bin, &a.args, e, d.join(format!("logs/{name}.log")));
    (p, format!("http://127.0.0.1:{port}"))
}
