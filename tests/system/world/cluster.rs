//! The world's tenants and users, and what stands for the cluster around onramp: the tenant
//! registry file, the users in Authentik, their unix accounts on this host (the login pod's
//! exec runs here, and Slurm resolves users here), the fake Kubernetes objects, and the real
//! Slurm test cluster's associations (read with `sacctmgr`, independently of onramp).

use std::path::Path;
use std::process::Command;

use base64::Engine as _;
use onramp_fakes::authentik::FakeUser;
use onramp_fakes::client::K8sControl;
use onramp_fakes::k8s::Projection;
use serde_json::json;
use sha2::{Digest, Sha256};

/// Slurm accounts of the world start with this (and are deleted at start and at the end).
pub const PREFIX: &str = "onrsys";
/// uid = gid = pk + this (the registry's offsets).
pub const ID_OFFSET: u32 = 30000;

pub struct Tenant {
    pub name: &'static str,
    pub group: String,
    pub account: String,
    /// (account, Authentik group) of its team, if any.
    pub team: Option<(String, String)>,
    /// The registry's user defaults: MaxJobs of every user's association.
    pub max_jobs: u32,
}

/// Every tenant a world may have (a world takes the first `Options::tenants`).
pub fn tenants() -> Vec<Tenant> {
    vec![
        Tenant {
            name: "foo",
            group: "tenant-foo-users".into(),
            account: format!("{PREFIX}-foo"),
            team: Some((format!("{PREFIX}-foo-ml"), "tenant-foo-ml".into())),
            max_jobs: 20,
        },
        Tenant {
            name: "bar",
            group: "tenant-bar-users".into(),
            account: format!("{PREFIX}-bar"),
            team: None,
            max_jobs: 10,
        },
        Tenant {
            name: "baz",
            group: "tenant-baz-users".into(),
            account: format!("{PREFIX}-baz"),
            team: None,
            max_jobs: 5,
        },
    ]
}

/// The tenant registry file (`ONRAMP_TENANTS`), as an operator writes it.
pub fn registry(tenants: &[Tenant]) -> String {
    let mut y = format!("uid_offset: {ID_OFFSET}\ngid_offset: {ID_OFFSET}\ntenants:\n");
    for t in tenants {
        y += &format!(
            "  - name: {}\n    group: {}\n    account: {}\n    limits: {{ fairshare: 300, grp_jobs: 500 }}\n    \
             user_defaults: {{ default_qos: normal, qos: [normal], max_jobs: {} }}\n    \
             quotas: {{ home: {{ path: /home, soft: 9GB, hard: 10GB }} }}\n",
            t.name, t.group, t.account, t.max_jobs
        );
        if let Some((account, group)) = &t.team {
            y += &format!("    teams:\n      - {{ account: {account}, group: {group}, fairshare: 200 }}\n");
        }
    }
    y
}

/// A user of the world: who they are in Authentik and where they belong.
#[derive(Clone, Debug)]
pub struct User {
    pub pk: i64,
    pub username: String,
    pub tenant: &'static str,
    pub account: String,
    pub max_jobs: u32,
    pub key: String,
    pub groups: Vec<String>,
}

impl User {
    pub fn uid(&self) -> u32 {
        ID_OFFSET + self.pk as u32
    }

    pub fn fake(&self) -> FakeUser {
        let mut u = FakeUser::new(self.pk, &self.username, &self.groups.iter().map(String::as_str).collect::<Vec<_>>());
        u.attributes = json!({ "sshPublicKey": self.key });
        u
    }
}

/// An ed25519 public key line of its own for each name.
fn key(name: &str) -> String {
    let mut blob = Vec::new();
    for part in [b"ssh-ed25519".as_slice(), Sha256::digest(name.as_bytes()).as_slice()] {
        blob.extend_from_slice(&(part.len() as u32).to_be_bytes());
        blob.extend_from_slice(part);
    }
    format!("ssh-ed25519 {} {name}@laptop", base64::engine::general_purpose::STANDARD.encode(blob))
}

/// `per_tenant` users in each tenant (at most 10 000); in a tenant with a team, every other user
/// is in it. A user's pk (and so uid) depends only on the tenant and the index, so the unix
/// accounts of one run fit the next, whatever its size.
pub fn users(tenants: &[Tenant], per_tenant: usize) -> Vec<User> {
    let mut out = Vec::new();
    for (ti, t) in tenants.iter().enumerate() {
        for i in 0..per_tenant {
            let pk = ((ti + 1) * 10_000 + i) as i64;
            let username = format!("{PREFIX}-{}-{i:04}", t.name);
            let mut groups = vec![t.group.clone()];
            let account = match &t.team {
                Some((account, group)) if i % 2 == 0 => {
                    groups.push(group.clone());
                    account.clone()
                }
                _ => t.account.clone(),
            };
            let key = key(&username);
            out.push(User { pk, username, tenant: t.name, account, max_jobs: t.max_jobs, key, groups });
        }
    }
    out
}

/// The users' unix accounts on this host (uid = gid = pk + offset), as LDAP gives them to the
/// login pods and to Slurm. Those already there are kept (the names are the world's own).
pub fn ensure_unix_users(users: &[User], dir: &Path) {
    let uid = |u: &User| Command::new("id").args(["-u", &u.username]).output().ok().filter(|o| o.status.success());
    let missing: Vec<&User> = users
        .iter()
        .filter(|u| match uid(u) {
            Some(o) if String::from_utf8_lossy(&o.stdout).trim() == u.uid().to_string() => false,
            Some(_) => {
                // an account of an older numbering: made again below
                let _ = Command::new("userdel").arg(&u.username).output();
                true
            }
            None => true,
        })
        .collect();
    if missing.is_empty() {
        return;
    }
    let lines: String = missing
        .iter()
        .map(|u| format!("{}:x:{}:{}::/nonexistent:/usr/sbin/nologin\n", u.username, u.uid(), u.uid()))
        .collect();
    let file = dir.join("newusers");
    std::fs::write(&file, lines).unwrap();
    let out = Command::new("newusers").arg(&file).output().expect("newusers (run the system test as root)");
    assert!(out.status.success(), "newusers: {}", String::from_utf8_lossy(&out.stderr));
}

/// The Kubernetes names of a tenant, as onramp derives them from the tenant's name.
pub struct TenantK8s {
    pub namespace: String,
    pub key_secret: String,
    pub login_pod: String,
    pub login_deployment: String,
}

pub fn tenant_k8s(tenant: &str) -> TenantK8s {
    TenantK8s {
        // the runbook's names, onramp's defaults: tenant-<name>, <namespace>-authorized-keys
        namespace: format!("tenant-{tenant}"),
        key_secret: format!("tenant-{tenant}-authorized-keys"),
        login_pod: "login-0".into(),
        login_deployment: "login".into(),
    }
}

/// The Kubernetes objects the cluster has before onramp: slurmctld (its exec runs sacctmgr
/// here), and per tenant the login pod and Deployment, with the key Secret projected into
/// `keys_dir` (the login pods' `authorized_keys.d`, all on this host). The one place that knows
/// the per-tenant names.
pub async fn seed_kubernetes(k8s: &K8sControl, tenants: &[Tenant], keys_dir: &Path) {
    let app = json!({"app": "slurmctld"});
    k8s.deployment("slurm-control", "slurmctld", app.clone()).await.unwrap();
    k8s.pod("slurm-control", "slurmctld-0", app, true).await.unwrap();
    for t in tenants {
        let n = tenant_k8s(t.name);
        let login = json!({"app": "login"});
        k8s.deployment(&n.namespace, &n.login_deployment, login.clone()).await.unwrap();
        k8s.pod(&n.namespace, &n.login_pod, login, true).await.unwrap();
        // the tenant's key Secret exists before onramp, as deploy/examples/tenant-foo makes it
        let secret = json!({"apiVersion": "v1", "kind": "Secret", "type": "Opaque", "data": {},
            "metadata": {"name": n.key_secret, "namespace": n.namespace}});
        k8s.put(&format!("/api/v1/namespaces/{}/secrets/{}", n.namespace, n.key_secret), &secret).await.unwrap();
        let p = Projection { namespace: n.namespace.clone(), secret: n.key_secret.clone(), dir: keys_dir.into() };
        k8s.project(&p).await.unwrap();
    }
}

pub fn run(args: &[&str]) -> std::process::Output {
    Command::new(args[0]).args(&args[1..]).output().unwrap_or_else(|e| panic!("{}: {e}", args[0]))
}

/// One association row as `sacctmgr show assoc` prints it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Assoc {
    pub account: String,
    pub user: String,
    pub max_jobs: String,
    pub qos: String,
    pub default_qos: String,
}

/// The associations under `accounts`, read with sacctmgr here (not through onramp).
pub fn assocs(accounts: &[&str]) -> Vec<Assoc> {
    let o = run(&[
        "sacctmgr",
        "-n",
        "-P",
        "show",
        "assoc",
        &format!("account={}", accounts.join(",")),
        "cluster=production",
        "format=account,user,maxjobs,qos,defaultqos",
    ]);
    assert!(o.status.success(), "sacctmgr show assoc: {}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .map(|l| l.split('|').map(str::to_string).collect::<Vec<_>>())
        .filter(|f| f.len() >= 5)
        .map(|f| Assoc {
            account: f[0].clone(),
            user: f[1].clone(),
            max_jobs: f[2].clone(),
            qos: f[3].clone(),
            default_qos: f[4].clone(),
        })
        .collect()
}

/// Removes the world's Slurm users and accounts (left by an earlier run, or by this one).
pub fn delete_slurm_state(tenants: &[Tenant]) {
    let mut accounts: Vec<String> = tenants.iter().map(|t| t.account.clone()).collect();
    accounts.extend(tenants.iter().filter_map(|t| t.team.as_ref().map(|(a, _)| a.clone())));
    let list = accounts.join(",");
    run(&["scancel", &format!("--account={list}")]);
    run(&["sacctmgr", "-i", "delete", "user", "where", &format!("account={list}")]);
    // team accounts first (children), then the tenants'
    for a in accounts.iter().rev() {
        run(&["sacctmgr", "-i", "delete", "account", "where", &format!("name={a}")]);
    }
}
