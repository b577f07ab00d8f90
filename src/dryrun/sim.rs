//! The simulated world a dry run acts on: a slurmctld host ([`super::sacctmgr`]), login pods
//! with home directories, the tenants' key Secrets, storage that accepts every command, an
//! Authentik directory (or the real one, read only), and notifications that go nowhere.
//! Assumptions are those of a healthy cluster: the Authentik→Secret key sync is running, the
//! kubelet projects keys at once, no Slurm job is pending or running.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use serde_json::json;

use super::sacctmgr::SlurmSim;
use crate::backends::authentik::{Authentik, AuthentikError, AuthentikFuture, User};
use crate::backends::exec::{Command, Output, RunFuture, Transport};
use crate::backends::kubernetes::api::K8sFuture;
use crate::backends::kubernetes::cleanup::Leftover;
use crate::backends::kubernetes::keys::{Applied, KeyState};
use crate::backends::kubernetes::tenant::Deleted;
use crate::backends::kubernetes::{K8sSettings, Kubernetes};
use crate::backends::notify::{Message, Notifier, NotifyFuture, Recipient};
use crate::backends::record::{RecordingAuthentik, RecordingK8s, RecordingNotifier, RecordingTransport};
use crate::backends::slurm::{HostPath, SlurmCli};
use crate::backends::storage::{CommandStorage, StorageSettings};
use crate::domain::names::{ClusterName, Username};
use crate::domain::sshkey::PublicKey;
use crate::domain::tenants::{K8sNames, TenantRegistry};
use crate::effects::EffectLog;
use crate::flows::{Backends, Timings};

#[derive(Default)]
struct State {
    slurm: SlurmSim,
    /// Paths in login pods (`namespace:path`) with their owner `uid:gid`.
    paths: BTreeMap<String, String>,
    /// Key Secrets: (`namespace/secret`, user) → key line.
    keys: BTreeMap<(String, String), String>,
}

/// Everything the simulation holds; shared by its backends.
pub struct World {
    state: Mutex<State>,
    settings: K8sSettings,
}

impl World {
    pub fn new(cluster: &ClusterName, settings: K8sSettings) -> Arc<Self> {
        let state = State { slurm: SlurmSim::new(cluster.as_str()), ..Default::default() };
        Arc::new(Self { state: Mutex::new(state), settings })
    }

    fn with<T>(&self, f: impl FnOnce(&mut State) -> T) -> T {
        f(&mut self.state.lock().expect("dry-run world"))
    }

    /// Commands on the slurmctld host.
    pub fn slurm_host(self: &Arc<Self>) -> Arc<dyn Transport> {
        Arc::new(Host { world: self.clone(), login: None })
    }
}

fn answer(o: Output) -> RunFuture<'static> {
    Box::pin(async move { Ok(o) })
}

fn status(code: i32) -> Output {
    Output { code, ..Default::default() }
}

/// The slurmctld host (`login: None`) or a tenant's login pod.
struct Host {
    world: Arc<World>,
    login: Option<K8sNames>,
}

/// Where a tenant's keys are: its Secret.
fn secret(n: &K8sNames) -> String {
    format!("{}/{}", n.namespace, n.keys_secret)
}

impl Host {
    /// The user a `--login-run-as` prefix runs as, and the command after the prefix.
    fn run_as<'a>(&self, argv: &'a [String]) -> Option<(String, &'a [String])> {
        let template: Vec<&str> = self.world.settings.login_run_as.split_whitespace().collect();
        if argv.len() <= template.len() || argv[0] != template[0] {
            return None;
        }
        let i = template.iter().position(|t| t.contains("{user}"))?;
        let (pre, post) = template[i].split_once("{user}")?;
        let user = argv[i].strip_prefix(pre)?.strip_suffix(post)?.to_string();
        Some((user, &argv[template.len()..]))
    }

    fn login(&self, tenant: &K8sNames, cmd: &Command) -> Output {
        let argv = cmd.argv();
        let key = |p: &str| format!("{}:{p}", tenant.namespace);
        let last = argv.last().cloned().unwrap_or_default();
        let home_root = self.world.settings.home_root.trim_end_matches('/').to_string();
        let keys_dir = self.world.settings.authorized_keys_dir.trim_end_matches('/').to_string();
        if let Some((user, rest)) = self.run_as(argv) {
            return match rest[0].as_str() {
                "id" => {
                    let owner = self.world.with(|s| s.paths.get(&key(&format!("{home_root}/{user}"))).cloned());
                    let (uid, gid) = owner.as_deref().and_then(|o| o.split_once(':')).unwrap_or(("0", "0"));
                    Output {
                        stdout: format!("uid={uid}({user}) gid={gid}({user}) groups={gid}({user})\n"),
                        ..status(0)
                    }
                }
                // a job step on a simulated compute node resolves the user as the login pod does
                "srun" => {
                    let owner = self.world.with(|s| s.paths.get(&key(&format!("{home_root}/{user}"))).cloned());
                    let (uid, gid) = owner.as_deref().and_then(|o| o.split_once(':')).unwrap_or(("0", "0"));
                    Output { stdout: format!("{uid}\n{gid}\ndry-run\n"), ..status(0) }
                }
                // a simulation has run no jobs: no earlier smoke job
                "squeue" | "sacct" => status(0),
                "sbatch" => Output {
                    stderr: "sbatch: Job 1 to start at now using 1 processors on nodes dry-run in partition main\n"
                        .into(),
                    ..status(0)
                },
                "sacctmgr" => {
                    self.world.with(|s| s.slurm.run(&Command::new("sacctmgr").args(rest[1..].iter().cloned())))
                }
                other => Output { stderr: format!("{other}: not simulated\n"), ..status(1) },
            };
        }
        self.world.with(|s| match argv[0].as_str() {
            "stat" => match s.paths.get(&key(&last)) {
                Some(o) => Output { stdout: format!("{o}\n"), ..status(0) },
                None => {
                    Output { stderr: format!("stat: cannot statx '{last}': No such file or directory\n"), ..status(1) }
                }
            },
            "test" => status(if s.paths.contains_key(&key(&last)) || keyfile(s, tenant, &keys_dir, &last).is_some() {
                0
            } else {
                1
            }),
            "cat" => match keyfile(s, tenant, &keys_dir, &last) {
                Some(k) => Output { stdout: format!("{k}\n"), ..status(0) },
                None => Output { stderr: format!("cat: {last}: No such file or directory\n"), ..status(1) },
            },
            "rm" => {
                s.paths.remove(&key(&last));
                status(0)
            }
            "mkdir" => {
                s.paths.insert(key(&last), "0:0".into());
                status(0)
            }
            "chown" => {
                let owner = argv[argv.len() - 2].clone();
                s.paths.insert(key(&last), owner);
                status(0)
            }
            "cp" | "chmod" => status(0),
            "mv" => {
                let from = argv[argv.len() - 2].clone();
                match s.paths.remove(&key(&from)) {
                    Some(o) if !s.paths.contains_key(&key(&last)) => {
                        s.paths.insert(key(&last), o);
                        status(0)
                    }
                    _ => Output { stderr: format!("mv: cannot move '{from}' to '{last}'\n"), ..status(1) },
                }
            }
            other => Output { stderr: format!("{other}: not simulated\n"), ..status(1) },
        })
    }
}

fn keyfile(s: &State, tenant: &K8sNames, dir: &str, path: &str) -> Option<String> {
    let user = path.strip_prefix(dir)?.strip_prefix('/')?;
    s.keys.get(&(secret(tenant), user.to_string())).cloned()
}

impl Transport for Host {
    fn run<'a>(&'a self, cmd: &'a Command, _: Duration) -> RunFuture<'a> {
        answer(match &self.login {
            None => self.world.with(|s| s.slurm.run(cmd)),
            Some(t) => self.login(t, cmd),
        })
    }
}

/// The Kubernetes API: key Secrets in memory (kept in step with Authentik by the sync, as the
/// runbook expects), and every other request succeeds.
pub struct SimK8s(pub Arc<World>);

fn done<'a, T: Send + 'a>(v: T) -> K8sFuture<'a, T> {
    Box::pin(async move { Ok(v) })
}

impl Kubernetes for SimK8s {
    fn key_state<'a>(&'a self, t: &'a K8sNames, u: &'a Username, key: &'a PublicKey) -> K8sFuture<'a, KeyState> {
        let k = (secret(t), u.to_string());
        let found = self.0.with(|s| s.keys.entry(k).or_insert_with(|| key.to_line()).clone());
        done(match PublicKey::parse(&found) {
            Ok(f) if &f == key => KeyState::Matches,
            Ok(f) => KeyState::Differs { found: vec![f.fingerprint()] },
            Err(_) => KeyState::Missing,
        })
    }
    fn put_key<'a>(&'a self, t: &'a K8sNames, u: &'a Username, key: &'a PublicKey) -> K8sFuture<'a, Applied> {
        let old = self.0.with(|s| s.keys.insert((secret(t), u.to_string()), key.to_line()));
        done(if old.as_deref() == Some(key.to_line().as_str()) { Applied::Unchanged } else { Applied::Changed })
    }
    fn remove_key<'a>(&'a self, t: &'a K8sNames, u: &'a Username) -> K8sFuture<'a, Applied> {
        let old = self.0.with(|s| s.keys.remove(&(secret(t), u.to_string())));
        done(if old.is_some() { Applied::Changed } else { Applied::Unchanged })
    }
    fn apply_network_policy<'a>(&'a self, _: &'a K8sNames) -> K8sFuture<'a, ()> {
        done(())
    }
    /// The API server keeps what was applied.
    fn read_network_policy<'a>(&'a self, t: &'a K8sNames) -> K8sFuture<'a, Option<serde_json::Value>> {
        let p = crate::backends::kubernetes::tenant::network_policy(t, &self.0.settings.slurm_namespace);
        done(Some(p["spec"].clone()))
    }
    fn remove_node_labels<'a>(&'a self, _: &'a K8sNames) -> K8sFuture<'a, Vec<String>> {
        done(vec![])
    }
    fn restart_login<'a>(&'a self, _: &'a K8sNames) -> K8sFuture<'a, ()> {
        done(())
    }
    fn delete_slurm_cluster<'a>(&'a self, _: &'a K8sNames) -> K8sFuture<'a, Deleted> {
        done(Deleted::Deleted)
    }
    fn delete_reservation<'a>(&'a self, _: &'a K8sNames) -> K8sFuture<'a, Deleted> {
        done(Deleted::Deleted)
    }
    /// The operator cleans up at once.
    fn cluster_leftovers<'a>(&'a self, _: &'a K8sNames) -> K8sFuture<'a, Vec<Leftover>> {
        done(vec![])
    }
    fn slurmctld(&self) -> Arc<dyn Transport> {
        self.0.slurm_host()
    }
    fn login(&self, tenant: &K8sNames) -> Arc<dyn Transport> {
        Arc::new(Host { world: self.0.clone(), login: Some(tenant.clone()) })
    }
}

/// Authentik: the real one read only (when given), else a directory of users; deactivation is
/// recorded here and never sent.
pub struct SimAuthentik {
    pub real: Option<Arc<dyn Authentik>>,
    users: Mutex<Vec<User>>,
    deactivated: Mutex<BTreeSet<i64>>,
}

impl SimAuthentik {
    pub fn new(real: Option<Arc<dyn Authentik>>, users: Vec<User>) -> Self {
        Self { real, users: Mutex::new(users), deactivated: Mutex::default() }
    }

    fn overlay(&self, mut u: User) -> User {
        if self.deactivated.lock().expect("sim authentik").contains(&u.pk) {
            u.is_active = false;
        }
        u
    }

    fn find(&self, f: impl Fn(&User) -> bool, what: String) -> Result<User, AuthentikError> {
        let users = self.users.lock().expect("sim authentik");
        users.iter().find(|u| f(u)).cloned().map(|u| self.overlay(u)).ok_or(AuthentikError::NotFound(what))
    }
}

impl Authentik for SimAuthentik {
    fn user(&self, pk: i64) -> AuthentikFuture<'_, User> {
        Box::pin(async move {
            match &self.real {
                Some(r) => r.user(pk).await.map(|u| self.overlay(u)),
                None => self.find(|u| u.pk == pk, format!("user {pk}")),
            }
        })
    }
    fn user_by_username<'a>(&'a self, name: &'a str) -> AuthentikFuture<'a, User> {
        Box::pin(async move {
            match &self.real {
                Some(r) => r.user_by_username(name).await.map(|u| self.overlay(u)),
                None => self.find(|u| u.username == name, format!("user {name:?}")),
            }
        })
    }
    fn active_members<'a>(&'a self, group: &'a str) -> AuthentikFuture<'a, Vec<User>> {
        Box::pin(async move {
            let all = match &self.real {
                Some(r) => r.active_members(group).await?,
                None => {
                    let users = self.users.lock().expect("sim authentik");
                    users.iter().filter(|u| u.group_names().iter().any(|g| g == group)).cloned().collect()
                }
            };
            Ok(all.into_iter().map(|u| self.overlay(u)).filter(|u| u.is_active).collect())
        })
    }
    fn deactivate(&self, pk: i64) -> AuthentikFuture<'_, User> {
        Box::pin(async move {
            let u = self.user(pk).await?;
            self.deactivated.lock().expect("sim authentik").insert(pk);
            Ok(self.overlay(u))
        })
    }
}

/// A directory user: active, in `groups`, with a made-up (valid) ed25519 key.
pub fn directory_user(pk: i64, username: &str, groups: &[&str]) -> User {
    let mut blob = vec![0, 0, 0, 11];
    blob.extend_from_slice(b"ssh-ed25519");
    blob.extend_from_slice(&[0, 0, 0, 32]);
    blob.extend((0..32u8).map(|i| i.wrapping_mul(7).wrapping_add(pk as u8)));
    let key = format!("ssh-ed25519 {} {username}@dry-run", STANDARD.encode(&blob));
    let groups_obj: Vec<_> = groups.iter().map(|g| json!({"pk": format!("dry-run-{g}"), "name": g})).collect();
    serde_json::from_value(json!({
        "pk": pk, "username": username, "name": username, "email": format!("{username}@example.org"),
        "is_active": true, "groups": groups_obj.iter().map(|g| g["pk"].clone()).collect::<Vec<_>>(),
        "groups_obj": groups_obj, "attributes": {"sshPublicKey": key},
    }))
    .expect("a directory user")
}

/// Notifications: accepted, sent nowhere.
pub struct Silent;

impl Notifier for Silent {
    fn send<'a>(&'a self, _: &'a Recipient, _: &'a Message) -> NotifyFuture<'a> {
        Box::pin(async { Ok(()) })
    }
}

/// What the simulated backends are built from (the same settings `serve` uses).
#[derive(Clone)]
pub struct DryConfig {
    pub cluster: ClusterName,
    pub k8s: K8sSettings,
    pub storage: StorageSettings,
    pub timings: Timings,
    pub archive_dir: HostPath,
    pub login_address: String,
    /// Whether a notification channel is configured (the plan then shows the message).
    pub notify: bool,
    /// See `ONRAMP_SLURM_BATCH_WINDOW`.
    pub batch_window: Duration,
}

/// The flows' backends on the simulation, every call recorded in `log`.
pub fn backends(
    cfg: &DryConfig,
    world: &Arc<World>,
    authentik: Arc<dyn Authentik>,
    tenants: Arc<TenantRegistry>,
    log: &EffectLog,
) -> Result<Arc<Backends>, String> {
    let slurm = SlurmCli::new(RecordingTransport::wrap("slurm", world.slurm_host(), log), cfg.cluster.clone());
    let slurm = crate::backends::slurm::Batching::new(Arc::new(slurm), cfg.batch_window);
    let k8s = RecordingK8s { inner: Arc::new(SimK8s(world.clone())), settings: cfg.k8s.clone(), log: log.clone() };
    let storage = CommandStorage::new(
        RecordingTransport::wrap("storage", Arc::new(super::storage::SimStorageCli::default()), log),
        cfg.storage.clone(),
    )
    .map_err(|e| e.to_string())?;
    let notifier: Option<Arc<dyn Notifier>> =
        cfg.notify.then(|| Arc::new(RecordingNotifier { inner: Arc::new(Silent), log: log.clone() }) as _);
    Ok(Backends::new(
        Arc::new(slurm),
        Arc::new(k8s),
        cfg.k8s.clone(),
        Arc::new(storage),
        notifier,
        Arc::new(RecordingAuthentik { inner: authentik, log: log.clone() }),
        tenants,
        cfg.timings.clone(),
        cfg.archive_dir.clone(),
        cfg.login_address.clone(),
    ))
}
