//! Recorders: decorators around a backend that log each outermost call to an [`EffectLog`] and
//! then make it. Around the real backends they are the audit of a real run; around the
//! simulation (`dryrun::sim`) they produce a plan. Secrets are never part of a call's text: keys
//! appear by fingerprint, tokens not at all.

use std::sync::Arc;
use std::time::Duration;

use crate::backends::authentik::{Authentik, AuthentikFuture, User};
use crate::backends::exec::{Command, RunFuture, Transport};
use crate::backends::kubernetes::api::K8sFuture;
use crate::backends::kubernetes::cleanup::Leftover;
use crate::backends::kubernetes::keys::{Applied, KeyState};
use crate::backends::kubernetes::tenant::{Deleted, TENANT_LABEL};
use crate::backends::kubernetes::{K8sSettings, Kubernetes};
use crate::backends::notify::{Message, Notifier, NotifyFuture, Recipient};
use crate::domain::names::Username;
use crate::domain::sshkey::PublicKey;
use crate::domain::tenants::K8sNames;
use crate::effects::EffectLog;

/// Whether a command changes something. Reads: `sacctmgr -n -P show`, squeue, scontrol, sacct,
/// ls, cat, stat, test, sha256sum, `wc` (reading an export back), what the smoke test runs as
/// the user (`id`, `sbatch --test-only`, `sacctmgr show`), and the storage CLI's quota
/// read-backs (`weka fs quota list`, `lfs quota`, whatever the binary is called). Everything else
/// (sacctmgr -i, scancel, the export's `sh -c` writing its file, the home directory's commands,
/// the storage CLI's sets and snapshots) is a change.
pub fn is_write(cmd: &Command) -> bool {
    let argv = cmd.argv();
    if argv.windows(3).any(|w| w == ["fs", "quota", "list"]) || argv.get(1).is_some_and(|a| a == "quota") {
        return false;
    }
    match argv[0].rsplit('/').next().unwrap_or_default() {
        "sacctmgr" => argv.get(1).is_some_and(|a| a == "-i"),
        "squeue" | "scontrol" | "sacct" | "ls" | "cat" | "stat" | "test" | "sha256sum" | "wc" | "id" | "getent" => {
            false
        }
        "sudo" | "runuser" | "su" | "setpriv" => !argv.iter().any(|a| a == "id" || a == "--test-only" || a == "show"),
        _ => true,
    }
}

/// Records every command, then runs it on `inner`.
pub struct RecordingTransport {
    pub system: String,
    pub inner: Arc<dyn Transport>,
    pub log: EffectLog,
}

impl RecordingTransport {
    pub fn wrap(system: &str, inner: Arc<dyn Transport>, log: &EffectLog) -> Arc<dyn Transport> {
        Arc::new(Self { system: system.to_string(), inner, log: log.clone() })
    }
}

impl Transport for RecordingTransport {
    fn run<'a>(&'a self, cmd: &'a Command, timeout: Duration) -> RunFuture<'a> {
        self.log.push(&self.system, cmd.to_string(), is_write(cmd));
        self.inner.run(cmd, timeout)
    }
}

/// Records each Kubernetes request (as method and path), then makes it on `inner`. Commands in
/// pods go through recording transports (`slurm`, `login/<namespace>`).
pub struct RecordingK8s {
    pub inner: Arc<dyn Kubernetes>,
    pub settings: K8sSettings,
    pub log: EffectLog,
}

impl RecordingK8s {
    fn api(&self, method: &str, path: String, write: bool) {
        self.log.push("kubernetes", format!("{method} {path}"), write);
    }
    fn secret(n: &K8sNames) -> String {
        format!("/api/v1/namespaces/{}/secrets/{}", n.namespace, n.keys_secret)
    }
    fn custom(&self, resource: &str, namespace: Option<&str>, name: &str) -> String {
        let mut parts = resource.splitn(3, '/');
        let (group, version, plural) =
            (parts.next().unwrap_or_default(), parts.next().unwrap_or_default(), parts.next().unwrap_or_default());
        match namespace {
            Some(ns) => format!("/apis/{group}/{version}/namespaces/{ns}/{plural}/{name}"),
            None => format!("/apis/{group}/{version}/{plural}/{name}"),
        }
    }
}

impl Kubernetes for RecordingK8s {
    fn key_state<'a>(&'a self, n: &'a K8sNames, user: &'a Username, key: &'a PublicKey) -> K8sFuture<'a, KeyState> {
        self.api("GET", Self::secret(n), false);
        self.inner.key_state(n, user, key)
    }
    fn put_key<'a>(&'a self, n: &'a K8sNames, user: &'a Username, key: &'a PublicKey) -> K8sFuture<'a, Applied> {
        self.api("PATCH", format!("{} (apply: key {} of {user})", Self::secret(n), key.fingerprint()), true);
        self.inner.put_key(n, user, key)
    }
    fn remove_key<'a>(&'a self, n: &'a K8sNames, user: &'a Username) -> K8sFuture<'a, Applied> {
        self.api("PATCH", format!("{} (apply: remove the key of {user})", Self::secret(n)), true);
        self.inner.remove_key(n, user)
    }
    fn apply_network_policy<'a>(&'a self, n: &'a K8sNames) -> K8sFuture<'a, ()> {
        let path =
            format!("/apis/networking.k8s.io/v1/namespaces/{}/networkpolicies/{}", n.namespace, n.network_policy);
        self.api("PATCH", format!("{path} (apply)"), true);
        self.inner.apply_network_policy(n)
    }
    fn read_network_policy<'a>(&'a self, n: &'a K8sNames) -> K8sFuture<'a, Option<serde_json::Value>> {
        let path =
            format!("/apis/networking.k8s.io/v1/namespaces/{}/networkpolicies/{}", n.namespace, n.network_policy);
        self.api("GET", path, false);
        self.inner.read_network_policy(n)
    }
    fn remove_node_labels<'a>(&'a self, n: &'a K8sNames) -> K8sFuture<'a, Vec<String>> {
        let label = &n.node_label;
        self.api("PATCH", format!("/api/v1/nodes?labelSelector={TENANT_LABEL}={label} (remove the label)"), true);
        self.inner.remove_node_labels(n)
    }
    fn restart_login<'a>(&'a self, n: &'a K8sNames) -> K8sFuture<'a, ()> {
        let (ns, d) = (&n.namespace, &n.login_deployment);
        self.api("PATCH", format!("/apis/apps/v1/namespaces/{ns}/deployments/{d} (rollout restart)"), true);
        self.inner.restart_login(n)
    }
    fn delete_slurm_cluster<'a>(&'a self, n: &'a K8sNames) -> K8sFuture<'a, Deleted> {
        let path = self.custom(&self.settings.slurm_cluster_resource, Some(&n.namespace), &n.slurm_cluster);
        self.api("DELETE", path, true);
        self.inner.delete_slurm_cluster(n)
    }
    fn delete_reservation<'a>(&'a self, n: &'a K8sNames) -> K8sFuture<'a, Deleted> {
        let ns = n.reservation_namespace.as_deref();
        self.api("DELETE", self.custom(&self.settings.reservation_resource, ns, &n.reservation), true);
        self.inner.delete_reservation(n)
    }
    fn cluster_leftovers<'a>(&'a self, n: &'a K8sNames) -> K8sFuture<'a, Vec<Leftover>> {
        let (ns, c) = (&n.namespace, &n.slurm_cluster);
        let what = "nodesets, statefulsets, pods, secrets";
        self.api("GET", format!("/api/v1/namespaces/{ns} ({what} owned by SlurmCluster {c})"), false);
        self.inner.cluster_leftovers(n)
    }
    fn slurmctld(&self) -> Arc<dyn Transport> {
        RecordingTransport::wrap("slurm", self.inner.slurmctld(), &self.log)
    }
    fn login(&self, n: &K8sNames) -> Arc<dyn Transport> {
        RecordingTransport::wrap(&format!("login/{}", n.namespace), self.inner.login(n), &self.log)
    }
}

/// Records each Authentik request, then makes it on `inner`.
pub struct RecordingAuthentik {
    pub inner: Arc<dyn Authentik>,
    pub log: EffectLog,
}

impl RecordingAuthentik {
    fn api(&self, method: &str, path: String, write: bool) {
        self.log.push("authentik", format!("{method} /api/v3{path}"), write);
    }
}

impl Authentik for RecordingAuthentik {
    fn user(&self, pk: i64) -> AuthentikFuture<'_, User> {
        self.api("GET", format!("/core/users/{pk}/"), false);
        self.inner.user(pk)
    }
    fn user_by_username<'a>(&'a self, username: &'a str) -> AuthentikFuture<'a, User> {
        self.api("GET", format!("/core/users/?username={username}"), false);
        self.inner.user_by_username(username)
    }
    fn active_members<'a>(&'a self, group: &'a str) -> AuthentikFuture<'a, Vec<User>> {
        self.api("GET", format!("/core/users/?groups_by_name={group}&is_active=true"), false);
        self.inner.active_members(group)
    }
    fn deactivate(&self, pk: i64) -> AuthentikFuture<'_, User> {
        self.api("PATCH", format!("/core/users/{pk}/ {{\"is_active\": false}}"), true);
        self.inner.deactivate(pk)
    }
}

/// Records each notification (recipient and subject, never the body), then sends it.
pub struct RecordingNotifier {
    pub inner: Arc<dyn Notifier>,
    pub log: EffectLog,
}

impl Notifier for RecordingNotifier {
    fn send<'a>(&'a self, to: &'a Recipient, msg: &'a Message) -> NotifyFuture<'a> {
        let who = match &to.email {
            Some(e) => format!("{} <{e}>", to.user),
            None => to.user.to_string(),
        };
        self.log.push("notify", format!("send {:?} to {who}", msg.subject), true);
        self.inner.send(to, msg)
    }
}
