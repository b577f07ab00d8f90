//! The user and tenant flows against the real test Slurm cluster (through the fake Kubernetes
//! API's slurmctld exec), the fake Kubernetes API (key Secret, login pod running argv here), the
//! fake storage CLI, a real SMTP server, the fake Authentik and the webhook, all in one harness.
//! Names are unique per test; each harness deletes the Slurm accounts it made, and the first of a
//! process deletes what a killed run's harnesses left (`flows_leftovers`).

use std::net::SocketAddr;
use std::os::unix::fs::PermissionsExt;
use std::sync::Arc;
use std::time::Duration;

use onramp::app::intake::IntakeSetup;
use onramp::app::world::{Parts, World};
use onramp::backends::exec::{Command, Local, Transport};
use onramp::backends::kubernetes::Kubernetes;
use onramp::backends::notify::{Email, Notifier, NotifySettings};
use onramp::backends::record::{RecordingAuthentik, RecordingK8s, RecordingNotifier, RecordingTransport};
use onramp::backends::slurm::{HostPath, Slurm, SlurmCli};
use onramp::backends::storage::{Backend, CommandStorage, StorageSettings};
use onramp::domain::names::ClusterName;
use onramp::domain::tenants::{K8sNames, TenantRegistry};
use onramp::dryrun::sim::DryConfig;
use onramp::effects::EffectLog;
use onramp::engine::Engine;
use onramp::flows::reconcile::Brake;
use onramp::flows::{Backends, Timings};
use onramp::intake::{SigningSecret, WebhookAuth};
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::common::{TestDb, TestWorker};
use crate::intake_support::{self, Fake, FakeUser, WHSEC};
use crate::notify::Smtpd;
use onramp_fakes::k8s::FakeK8s;

/// The flows tests share the unix user onramp-carol (blocking a user blocks all their
/// associations): one at a time.
pub static CAROL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

pub const UNIX_USER: &str = "onramp-carol";
pub const PK: i64 = 3; // uid/gid 5003 with offset 5000
pub const KEY: &str = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl carol@laptop";

pub struct Harness {
    /// Kept for its lifetime (dropped with the harness).
    pub _db: TestDb,
    pub engine: Engine,
    pub backends: Arc<Backends>,
    pub ak: Fake,
    pub ak_url: String,
    /// Every call the flows' backends made.
    pub log: EffectLog,
    /// The same settings, for plans.
    pub dry: DryConfig,
    pub k8s: FakeK8s,
    pub smtpd: Smtpd,
    pub root: tempfile::TempDir,
    pub storage_dir: tempfile::TempDir,
    pub tenant: String,
    /// The tenant's Kubernetes names (the runbook's: namespace `tenant-<tenant>`, …).
    pub names: K8sNames,
    pub account: String,
    pub team: String,
    /// The QOS the registry declares and the members' associations name (deleted with the harness).
    pub qos: String,
    pub group: String,
    pub webhook: String,
    pub http: reqwest::Client,
    pub stop: CancellationToken,
    pub worker: Option<TestWorker>,
}

pub fn short() -> Timings {
    Timings {
        key_poll: Duration::from_millis(100),
        key_deadline: Duration::from_secs(5),
        propagation: Duration::from_millis(300),
        restart_wait: Duration::from_millis(200),
        drain_poll: Duration::from_millis(200),
        drain_deadline: Duration::from_secs(3),
        cleanup_poll: Duration::from_millis(100),
        cleanup_deadline: Duration::from_secs(5),
        retention: Duration::from_secs(1),
        retry_initial: Duration::from_millis(100),
        retry_max: Duration::from_secs(5),
        retry_attempts: 8,
    }
}

/// `fl`, this process's id and a random part: what a killed run's harnesses left can be told from
/// what a running one uses (`flows_leftovers`).
fn uniq() -> String {
    format!("fl{:06x}{:06x}", std::process::id(), fastrand::u32(..0xff_ffff))
}

impl Harness {
    pub async fn start(timings: Timings) -> Self {
        crate::slurm::cluster_up();
        crate::flows_leftovers::sweep_once().await;
        let db = TestDb::new().await;
        let (ak, ak_url) = intake_support::fake_authentik().await;
        let id = uniq();
        let (tenant, account, team) = (id.clone(), format!("{id}-acct"), format!("{id}-ml"));
        let group = format!("{id}-users");
        ak.lock().unwrap().groups.extend([group.clone(), format!("{id}-ml")]);
        // a QOS of this test's own, declared in the registry: tenant onboarding creates it
        let qos = format!("{id}-q");
        let tenants = format!(
            "uid_offset: 5000\ngid_offset: 5000\nqos:\n  - {{ name: {qos}, priority: 10, max_tres_per_user: gres/gpu=2 }}\n\
             tenants:\n  - name: {tenant}\n    group: {group}\n    account: {account}\n    \
             limits: {{ fairshare: 300, grp_jobs: 200 }}\n    \
             user_defaults: {{ default_qos: normal, qos: [normal, {qos}], max_jobs: 20 }}\n    \
             quotas: {{ home: {{ path: /home, soft: 90GB, hard: 100GB }}, scratch: {{ path: /tenant/{tenant}/scratch, soft: 45TB, hard: 50TB }} }}\n    \
             default_team: {team}\n    teams:\n      - {{ account: {team}, group: {id}-ml, fairshare: 200 }}\n"
        );
        let registry = Arc::new(TenantRegistry::parse(&tenants, "test").unwrap());
        let names = registry.tenant(&tenant).unwrap().kubernetes.clone();

        // Kubernetes: slurmctld (runs the real sacctmgr here), the tenant's login pod and Deployment.
        let k8s = FakeK8s::start().await;
        let app = json!({"app": "slurmctld"});
        k8s.deployment("slurm-control", "slurmctld", app.clone());
        k8s.pod("slurm-control", "slurmctld-1", app, true);
        k8s.pod(&names.namespace, "login-0", json!({"app": "login"}), true);
        k8s.deployment(&names.namespace, "login", json!({"app": "login"}));
        let root = tempfile::Builder::new().prefix("onramp-flows-").tempdir().unwrap();
        for d in ["home", "skel", "keys"] {
            std::fs::create_dir_all(root.path().join(d)).unwrap();
        }
        std::fs::write(root.path().join("skel/.bashrc"), "# skel\n").unwrap();
        std::fs::set_permissions(root.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let r = root.path().display().to_string();
        let client = crate::k8s_support::client(&k8s, |a| {
            a.k8s_timeout = Duration::from_secs(10);
            a.home_root = format!("{r}/home");
            a.skel_dir = format!("{r}/skel");
            a.authorized_keys_dir = format!("{r}/keys");
            a.login_run_as = "runuser -u {user} --".into();
        });
        // Every outermost call is recorded, as a plan records them (see `the_plan_is_…` tests).
        let log = EffectLog::default();
        let kube: Arc<dyn Kubernetes> = Arc::new(RecordingK8s {
            inner: Arc::new(client.clone()),
            settings: client.settings().clone(),
            log: log.clone(),
        });
        let slurm: Arc<dyn Slurm> =
            Arc::new(SlurmCli::new(kube.slurmctld(), ClusterName::parse("production").unwrap()));

        // Storage: the fake weka.
        let storage_dir = tempfile::Builder::new().prefix("onramp-flows-storage-").tempdir().unwrap();
        crate::common::install_storage_cli(storage_dir.path(), &["weka"]);
        // `weka-flaky`: fails once when the test has put a `fail-next` file beside it.
        let flaky = storage_dir.path().join("weka-flaky");
        std::fs::write(
            &flaky,
            "#!/bin/sh\nd=$(dirname \"$0\")\nif [ -e \"$d/fail-next\" ]; then rm -f \"$d/fail-next\"; \
             echo 'error: injected failure' >&2; exit 1; fi\nexec \"$d/weka\" \"$@\"\n",
        )
        .unwrap();
        std::fs::set_permissions(&flaky, std::fs::Permissions::from_mode(0o755)).unwrap();
        // The settings' path templates differ from the registry's paths, which win (a call with
        // `/from-settings` would be a path the registry was meant to decide).
        let sa = StorageSettings {
            storage_backend: Backend::Weka,
            weka_bin: flaky.display().to_string(),
            storage_home_path: "/from-settings/home/{user}".into(),
            storage_scratch_path: "/from-settings/{tenant}/scratch".into(),
            ..Default::default()
        };
        let storage = Arc::new(
            CommandStorage::new(RecordingTransport::wrap("storage", Arc::new(Local), &log), sa.clone()).unwrap(),
        );

        let smtpd = Smtpd::start().await;
        let na = NotifySettings {
            smtp_url: Some(onramp::domain::secret::Secret::new(format!("smtp://127.0.0.1:{}", smtpd.port))),
            mail_from: "onramp <onramp@cluster.example>".into(),
            ..Default::default()
        };
        let email: Arc<dyn Notifier> = Arc::new(RecordingNotifier {
            inner: Arc::new(Email::from_settings(&na).unwrap().unwrap()),
            log: log.clone(),
        });
        let dry = DryConfig {
            cluster: ClusterName::parse("production").unwrap(),
            k8s: client.settings().clone(),
            storage: sa,
            timings: timings.clone(),
            archive_dir: HostPath::parse(&format!("{r}/archive")).unwrap(),
            login_address: "login.{tenant}.example".into(),
            notify: true,
            batch_window: Duration::ZERO,
        };

        let backends = Backends::new(
            slurm,
            kube,
            client.settings().clone(),
            storage,
            Some(email),
            Arc::new(RecordingAuthentik { inner: Arc::new(intake_support::client(&ak_url)), log: log.clone() }),
            registry.clone(),
            timings,
            HostPath::parse(&format!("{r}/archive")).unwrap(),
            "login.{tenant}.example".into(),
        );
        // slurmdbd writes the archive as the slurm user.
        std::fs::create_dir_all(root.path().join("archive")).unwrap();
        let _ = std::process::Command::new("chown").arg("slurm").arg(root.path().join("archive")).status();

        // The webhook, the reconciler (reading the real associations) and the flows.
        let setup = IntakeSetup {
            authentik: Arc::new(intake_support::client(&ak_url)),
            tenants: registry,
            brake: Brake::default(),
            auth: WebhookAuth {
                signing_secrets: vec![WHSEC.parse::<SigningSecret>().unwrap()],
                bearer_tokens: vec![],
                tolerance: Duration::from_secs(300),
            },
            settle: Duration::ZERO,
            max_body: 1 << 20,
            max_diff_users: 200,
            writers: 1,
            batch: 16,
            reconcile_interval: Duration::ZERO,
        };
        // the world as `serve` builds it (the composition root), on the test's backends
        let parts = Parts { flows: Some(backends.clone()), intake: Some(setup), plans: None };
        let world = World::build(db.pool.clone(), parts);
        let engine = world.engine.clone();
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr: SocketAddr = l.local_addr().unwrap();
        let stop = CancellationToken::new();
        tokio::spawn(world.run(Some(l), None, stop.clone()));
        let mut cfg = crate::common::worker_config("flows", Duration::from_secs(30));
        cfg.poll_interval = Duration::from_millis(100);
        let worker = Some(TestWorker::start(&engine, cfg));
        Self {
            _db: db,
            engine,
            backends,
            ak,
            ak_url,
            log,
            dry,
            k8s,
            smtpd,
            root,
            storage_dir,
            tenant,
            names,
            account,
            team,
            qos,
            group,
            webhook: format!("http://{addr}/webhooks/authentik"),
            http: reqwest::Client::new(),
            stop,
            worker,
        }
    }

    /// An account standing for a second tenant carol also belongs to (deleted with the harness).
    pub fn other_tenant_account(&self) -> String {
        format!("{}-other", self.tenant)
    }

    /// carol also works for another tenant: its account, with her association under `limits`.
    pub async fn carol_in_another_tenant(&self, limits: &onramp::backends::slurm::UserLimits) -> String {
        use onramp::backends::slurm::{AccountLimits, AccountSpec, SlurmText};
        use onramp::domain::names::{SlurmAccount, Username};
        let other = self.other_tenant_account();
        let text = SlurmText::parse("another tenant").unwrap();
        let spec = AccountSpec {
            name: SlurmAccount::parse(&other).unwrap(),
            parent: None,
            description: text.clone(),
            organization: text,
            limits: AccountLimits::default(),
        };
        self.backends.slurm.ensure_account(&spec).await.unwrap();
        let carol = [Username::parse(UNIX_USER).unwrap()];
        self.backends.slurm.add_users(&spec.name, &carol, false, limits).await.unwrap();
        other
    }

    /// The tenant's QOS and accounts in Slurm as the registry says (what tenant onboarding makes).
    pub async fn ensure_tenant_accounts(&self) {
        let t = self.backends.tenants.tenant(&self.tenant).unwrap();
        let qos: Vec<onramp::backends::slurm::QosSpec> = self
            .backends
            .tenants
            .declared_qos(t)
            .into_iter()
            .map(|d| onramp::backends::slurm::QosSpec::from_decl(d).unwrap())
            .collect();
        self.backends.slurm.ensure_qos(&qos).await.unwrap();
        let spec = onramp::flows::specs::tenant_spec(t).unwrap();
        self.backends.slurm.ensure_tenant(&spec).await.unwrap();
    }

    /// Carol in Authentik: active, in the tenant group, with her key and numbers.
    pub fn add_carol(&self, active: bool) {
        let mut u = FakeUser::new(PK, UNIX_USER, &[&self.group]);
        u.is_active = active;
        u.attributes = json!({ "sshPublicKey": KEY });
        self.ak.lock().unwrap().users.insert(PK, u);
    }

    /// The key as the Authentik→Secret sync writes it, and as kubelet projects it into the pod.
    pub fn sync_key(&self) {
        use base64::Engine as _;
        let b64 = base64::engine::general_purpose::STANDARD.encode(format!("{KEY}\n"));
        let (ns, name) = (&self.names.namespace, &self.names.keys_secret);
        self.k8s.put(
            &format!("/api/v1/namespaces/{ns}/secrets/{name}"),
            json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name, "namespace": ns},
                   "data": { UNIX_USER: b64 }}),
        );
        std::fs::write(self.root.path().join("keys").join(UNIX_USER), format!("{KEY}\n")).unwrap();
    }

    pub async fn post_user_event(&self) -> reqwest::Response {
        self.post_event(intake_support::user_model(PK)).await
    }

    /// "The tenant's group was updated" (membership changes arrive so, without naming the user).
    pub async fn post_group_event(&self) -> reqwest::Response {
        self.post_event(intake_support::group_model(&self.group)).await
    }

    async fn post_event(&self, model: Value) -> reqwest::Response {
        let body = intake_support::structured(&uuid::Uuid::new_v4().simple().to_string(), "model_updated", model, None);
        let raw = serde_json::to_vec(&body).unwrap();
        let id = format!("msg_{}", uuid::Uuid::new_v4().simple());
        let ts = intake_support::now();
        let key: SigningSecret = WHSEC.parse().unwrap();
        self.http
            .post(&self.webhook)
            .header("content-type", "application/json")
            .header("webhook-id", &id)
            .header("webhook-timestamp", ts.to_string())
            .header("webhook-signature", key.sign(&id, ts, &raw))
            .body(raw)
            .send()
            .await
            .unwrap()
    }

    /// Jobs of a kind: (id, state, input).
    /// The jobs of `kind`, once the pump has processed every stored delivery.
    pub async fn jobs(&self, kind: &str) -> Vec<(i64, String, Value)> {
        intake_support::pumped(&self.engine).await;
        sqlx::query_as("select id, state, input from jobs where kind = $1 order by id")
            .bind(kind)
            .fetch_all(self.engine.pool())
            .await
            .unwrap()
    }

    /// The e-mails the SMTP server received.
    pub fn mails(&self) -> Vec<String> {
        self.smtpd.messages()
    }

    pub fn storage_calls(&self) -> Vec<Vec<String>> {
        let text = std::fs::read_to_string(self.storage_dir.path().join("calls.jsonl")).unwrap_or_default();
        text.lines().map(|l| serde_json::from_str(l).unwrap()).collect()
    }

    /// `sacctmgr show assoc` rows of the tenant's accounts: (account, user, maxjobs, grpjobs, maxsubmit).
    pub async fn assocs(&self) -> Vec<Vec<String>> {
        let cmd = Command::new("sacctmgr")
            .args(["-n", "-P", "show", "assoc"])
            .arg(format!("account={},{}", self.account, self.team))
            .arg("format=account,user,maxjobs,grpjobs,maxsubmitjobs,qos,fairshare");
        let o = Local.run(&cmd, Duration::from_secs(30)).await.unwrap();
        o.stdout.lines().map(|l| l.split('|').map(str::to_string).collect()).collect()
    }

    /// Carol's jobs submitted with sbatch as her: the job id, or sbatch's refusal.
    pub fn sbatch(&self, extra: &[&str]) -> Result<String, String> {
        self.sbatch_in(&self.team.clone(), extra)
    }

    /// The same, charged to `account`.
    pub fn sbatch_in(&self, account: &str, extra: &[&str]) -> Result<String, String> {
        let o = std::process::Command::new("runuser")
            .args(["-u", UNIX_USER, "--", "sbatch", "--parsable", "-o", "/dev/null", "--time=10"])
            .arg(format!("--account={account}"))
            .args(extra)
            .args(["--wrap", "sleep 300"])
            .output()
            .unwrap();
        if o.status.success() {
            Ok(String::from_utf8_lossy(&o.stdout).trim().to_string())
        } else {
            Err(String::from_utf8_lossy(&o.stderr).trim().to_string())
        }
    }

    /// `squeue` of carol's jobs: (id, state).
    pub fn squeue(&self) -> Vec<(String, String)> {
        let o = std::process::Command::new("squeue").args(["-h", "-u", UNIX_USER, "-o", "%i|%T"]).output().unwrap();
        String::from_utf8_lossy(&o.stdout)
            .lines()
            .filter_map(|l| l.split_once('|'))
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect()
    }

    /// Moves carol out of (or back into) the tenant group.
    pub fn set_member(&self, member: bool, active: bool) {
        let mut st = self.ak.lock().unwrap();
        let u = st.users.get_mut(&PK).unwrap();
        u.groups = if member { vec![self.group.clone()] } else { vec![] };
        u.is_active = active;
    }

    /// The next storage command fails (exit 1, not retryable).
    pub fn fail_storage_once(&self) {
        std::fs::write(self.storage_dir.path().join("fail-next"), "").unwrap();
    }

    /// Enqueues a job and waits until it succeeds; a failed job is retried as a person would
    /// (once). Returns the job id and how many times it was retried.
    pub async fn run_to_success(&self, job: onramp::engine::NewJob) -> (i64, u32) {
        let id = self.engine.enqueue(&[job]).await.unwrap()[0].id;
        let mut retried = 0;
        loop {
            let j = crate::common::eventually(Duration::from_secs(90), "the job to end", || async {
                let j = self.engine.job(id).await.unwrap();
                matches!(j.state.as_str(), "succeeded" | "failed" | "cancelled").then_some(j)
            })
            .await;
            match j.state.as_str() {
                "succeeded" => return (id, retried),
                "failed" if retried < 3 => {
                    retried += 1;
                    self.engine.retry(id, &onramp::engine::Actor::cli("test")).await.unwrap();
                }
                other => panic!("job {id} is {other}: {:?}", j.last_error),
            }
        }
    }
}

impl Drop for Harness {
    fn drop(&mut self) {
        self.stop.cancel();
        if let Some(w) = &self.worker {
            w.stop.cancel();
        }
        let run = |args: &[&str]| {
            let _ = std::process::Command::new(args[0]).args(&args[1..]).output();
        };
        let other = self.other_tenant_account();
        for a in [&self.team, &self.account, &other] {
            run(&["scancel", &format!("--account={a}")]);
        }
        run(&["scancel", "-u", UNIX_USER]);
        run(&[
            "sacctmgr",
            "-i",
            "delete",
            "user",
            "where",
            &format!("name={UNIX_USER}"),
            &format!("account={}", self.team),
        ]);
        run(&["sacctmgr", "-i", "delete", "account", "where", &format!("name={}", self.team)]);
        run(&["sacctmgr", "-i", "delete", "account", "where", &format!("name={}", self.account)]);
        run(&["sacctmgr", "-i", "delete", "user", "where", &format!("name={UNIX_USER}"), &format!("account={other}")]);
        run(&["sacctmgr", "-i", "delete", "account", "where", &format!("name={other}")]);
        run(&["sacctmgr", "-i", "delete", "qos", "where", &format!("name={}", self.qos)]);
    }
}
