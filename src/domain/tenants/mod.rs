//! The tenant registry: a declarative YAML file mapping Authentik groups to tenants and teams
//! (Slurm accounts), with each tenant's limits, user defaults, quotas and Kubernetes names, and
//! the uid/gid numbering. Read and validated at start; every mistake is reported on its own line
//! with the line number and field (`tenants[1].teams[0].account`).
//!
//! Kubernetes names (see [`K8sNames`]) come from the tenant's `kubernetes:` block, else the
//! registry-wide one, else the runbook: namespace `tenant-<name>`, keys Secret
//! `<namespace>-authorized-keys`, NetworkPolicy `<namespace>-isolation`, login pod `login-0` of
//! Deployment `login`, SlurmCluster `cluster-<account>`, Reservation `<account>-reservation` in
//! the namespace, node label `reserved.tenant=<account>`. Values may use `{name}`, `{account}`
//! and `{namespace}`; two tenants sharing a namespace, Reservation or node label is a mistake.
//!
//! ```yaml
//! uid_offset: 4000            # uidNumber = pk + uid_offset unless attributes.uidNumber is set
//! gid_offset: 4000
//! identities: { uid_min: 1000, reserved_names: [svc-*] } # see IdentityPolicy; root, slurm, … always
//! qos:                        # created/converged by onboarding a tenant that names one (qos.rs)
//!   - { name: high, priority: 100, max_tres_per_user: gres/gpu=8, max_jobs_per_user: 10 }
//! kubernetes:                 # names for every tenant (each tenant's own block wins)
//!   login_container: sshd     # default: the pod's only or default container
//!   reservation_namespace: "-" # "-": Reservations are cluster-scoped; default: {namespace}
//! tenants:
//!   - name: foo
//!     group: tenant-foo-users # members of this Authentik group belong to the tenant
//!     account: tenant-foo     # default: tenant-<name>
//!     limits: { fairshare: 300, grp_tres: gres/gpu=128, grp_jobs: 200 }
//!     user_defaults: { default_qos: normal, qos: [normal, high], max_jobs: 20, grp_tres_mins: gres/gpu=10000 }
//!     quotas:
//!       home: { path: /home, soft: 90GB, hard: 100GB }
//!       scratch: { path: /tenant/tenant-foo/scratch, soft: 45TB, hard: 50TB }
//!     kubernetes:             # each default shown; set only what differs
//!       namespace: tenant-foo           # tenant-{name}
//!       keys_secret: tenant-foo-authorized-keys # {namespace}-authorized-keys
//!       network_policy: tenant-foo-isolation    # {namespace}-isolation
//!       login_deployment: login         # restarted when a key is not projected
//!       login_pod: login-0              # "": a Ready pod of login_deployment
//!       slurm_cluster: cluster-tenant-foo       # cluster-{account}
//!       reservation: tenant-foo-reservation     # {account}-reservation
//!       node_label: tenant-foo          # reserved.tenant=<this>; default {account}
//!     default_team: ml-team-foo  # account of members in no team group; default: the tenant account
//!     teams:
//!       - { account: ml-team-foo, group: tenant-foo-ml, fairshare: 200 }
//! ```

mod identity;
mod k8s;
#[cfg(test)]
mod k8s_tests;
mod parse;
mod qos;
mod validate;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::domain::names::{QosName, SlurmAccount, TenantName};

pub use identity::{BUILT_IN_RESERVED, IdentityPolicy};
pub use k8s::K8sNames;
pub use qos::QosDecl;
pub use validate::size;

/// The tenant account's limits (sacctmgr Fairshare, GrpTRES, GrpJobs).
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct TenantLimits {
    pub fairshare: Option<u32>,
    pub grp_tres: Option<String>,
    pub grp_jobs: Option<u32>,
}

/// What each new user of a tenant gets on their association.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct UserDefaults {
    pub default_qos: Option<QosName>,
    pub qos: Vec<QosName>,
    pub max_jobs: Option<u32>,
    pub grp_tres_mins: Option<String>,
}

#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Quotas {
    pub home: Option<Quota>,
    pub scratch: Option<Quota>,
}

#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Quota {
    pub path: String,
    pub soft: String,
    pub hard: String,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Team {
    pub account: SlurmAccount,
    pub group: String,
    pub fairshare: Option<u32>,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Tenant {
    pub name: TenantName,
    pub group: String,
    pub account: SlurmAccount,
    pub description: Option<String>,
    pub limits: TenantLimits,
    pub user_defaults: UserDefaults,
    pub quotas: Quotas,
    /// Its names in Kubernetes.
    pub kubernetes: K8sNames,
    /// Where members who are in no team group get their association.
    pub default_account: SlurmAccount,
    pub teams: Vec<Team>,
}

impl Tenant {
    /// The accounts of this tenant a user with these groups belongs to: none without the tenant
    /// group; else their teams' accounts, or the default account when in no team.
    pub fn placement(&self, groups: &[String]) -> Vec<SlurmAccount> {
        if !groups.contains(&self.group) {
            return vec![];
        }
        let teams: Vec<SlurmAccount> =
            self.teams.iter().filter(|m| groups.contains(&m.group)).map(|m| m.account.clone()).collect();
        if teams.is_empty() { vec![self.default_account.clone()] } else { teams }
    }

    /// The Authentik groups that matter for this tenant.
    pub fn groups(&self) -> Vec<&str> {
        let mut g = vec![self.group.as_str()];
        g.extend(self.teams.iter().map(|m| m.group.as_str()));
        g
    }

    /// Every account a user of this tenant can have an association under.
    pub fn accounts(&self) -> Vec<SlurmAccount> {
        let mut a: Vec<SlurmAccount> = vec![self.account.clone()];
        a.extend(self.teams.iter().map(|t| t.account.clone()));
        a
    }
}

/// The validated registry.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct TenantRegistry {
    pub uid_offset: u32,
    pub gid_offset: u32,
    /// Reserved names and the uid/gid range (the `identities:` block; see [`IdentityPolicy`]).
    pub identities: IdentityPolicy,
    /// QOS onramp creates or converges (the `qos:` list; see `qos.rs`).
    pub qos: Vec<QosDecl>,
    pub tenants: Vec<Tenant>,
}

/// One mistake in the file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mistake {
    pub line: Option<usize>,
    pub field: String,
    pub message: String,
}

impl std::fmt::Display for Mistake {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.line {
            Some(l) => write!(f, "line {l}: {}: {}", self.field, self.message),
            None => write!(f, "{}: {}", self.field, self.message),
        }
    }
}

/// Every mistake found, one per line of the message.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("tenant registry {source_name}: {}", self.list())]
pub struct RegistryError {
    pub source_name: String,
    pub mistakes: Vec<Mistake>,
}

impl RegistryError {
    fn list(&self) -> String {
        if self.mistakes.len() == 1 {
            return self.mistakes[0].to_string();
        }
        let lines: Vec<String> = self.mistakes.iter().map(|m| format!("\n  {m}")).collect();
        format!("{} mistakes:{}", self.mistakes.len(), lines.concat())
    }
}

impl TenantRegistry {
    pub fn tenant(&self, name: &str) -> Option<&Tenant> {
        self.tenants.iter().find(|t| t.name.as_str() == name)
    }

    /// The tenants whose tenant group or team groups include `group`.
    pub fn tenants_of_group(&self, group: &str) -> Vec<&Tenant> {
        self.tenants.iter().filter(|t| t.group == group || t.teams.iter().any(|m| m.group == group)).collect()
    }

    /// A user's uid and gid: `attributes.uidNumber` / `gidNumber` when set, else pk + offset.
    pub fn posix_ids(&self, pk: i64, attributes: &Value) -> (u32, u32) {
        let attr = |k: &str| {
            attributes.get(k).and_then(|v| v.as_u64().or_else(|| v.as_str().and_then(|s| s.trim().parse().ok())))
        };
        let uid = attr("uidNumber").and_then(|n| u32::try_from(n).ok()).unwrap_or_else(|| offset(pk, self.uid_offset));
        let gid = attr("gidNumber").and_then(|n| u32::try_from(n).ok()).unwrap_or_else(|| offset(pk, self.gid_offset));
        (uid, gid)
    }

    /// A user's checked identity: Err says why onramp must not make them a cluster user.
    pub fn check_identity(&self, username: &str, pk: i64, attributes: &Value) -> Result<(u32, u32), String> {
        let (uid, gid) = self.posix_ids(pk, attributes);
        self.identities.check(username, uid, gid).map(|()| (uid, gid))
    }

    /// All accounts under every tenant.
    pub fn all_accounts(&self) -> Vec<SlurmAccount> {
        self.tenants.iter().flat_map(Tenant::accounts).collect()
    }

    /// Which (tenant, account) pairs a user belongs to, given the names of their groups.
    pub fn placements(&self, groups: &[String]) -> Vec<(TenantName, SlurmAccount)> {
        self.tenants.iter().flat_map(|t| t.placement(groups).into_iter().map(|a| (t.name.clone(), a))).collect()
    }

    /// The tenant an account belongs to.
    pub fn tenant_of_account(&self, account: &SlurmAccount) -> Option<&Tenant> {
        self.tenants.iter().find(|t| t.accounts().contains(account))
    }
}

fn offset(pk: i64, off: u32) -> u32 {
    u32::try_from(pk.saturating_add(i64::from(off))).unwrap_or(u32::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = "\
uid_offset: 4000
gid_offset: 4000
tenants:
  - name: foo
    group: tenant-foo-users
    limits: { fairshare: 300, grp_tres: gres/gpu=128, grp_jobs: 200 }
    user_defaults:
      default_qos: normal
      qos: [normal, high]
      max_jobs: 20
      grp_tres_mins: gres/gpu=10000
    quotas:
      home: { path: /home, soft: 90GB, hard: 100GB }
      scratch: { path: /tenant/tenant-foo/scratch, soft: 45TB, hard: 50TB }
    login_pod: { namespace: tenant-foo, deployment: login }
    default_team: ml-team-foo
    teams:
      - account: ml-team-foo
        group: tenant-foo-ml
        fairshare: 200
      - { account: data-team-foo, group: tenant-foo-data }
  - name: bar
    group: tenant-bar-users
";

    #[test]
    fn a_good_registry_loads() {
        let r = TenantRegistry::parse(GOOD, "t.yaml").unwrap();
        assert_eq!(r.tenants.len(), 2);
        let foo = &r.tenants[0];
        assert_eq!(foo.account.as_str(), "tenant-foo");
        assert_eq!(foo.default_account.as_str(), "ml-team-foo");
        assert_eq!(r.tenants[1].default_account.as_str(), "tenant-bar");
        assert_eq!(foo.user_defaults.qos.len(), 2);
        assert_eq!(r.tenants_of_group("tenant-foo-data")[0].name.as_str(), "foo");
        let groups = vec!["tenant-foo-users".to_string(), "tenant-foo-data".to_string(), "tenant-bar-users".into()];
        let p: Vec<String> = r.placements(&groups).iter().map(|(t, a)| format!("{t}/{a}")).collect();
        assert_eq!(p, ["foo/data-team-foo", "bar/tenant-bar"]);
        // team group without the tenant group: not a member
        assert!(r.placements(&["tenant-foo-ml".to_string()]).is_empty());
    }

    #[test]
    fn uid_and_gid_default_to_pk_plus_offset_and_attributes_win() {
        let r = TenantRegistry::parse(GOOD, "t.yaml").unwrap();
        assert_eq!(r.posix_ids(42, &serde_json::json!({})), (4042, 4042));
        assert_eq!(r.posix_ids(42, &serde_json::json!({"uidNumber": 20001, "gidNumber": "30001"})), (20001, 30001));
        assert_eq!(r.posix_ids(42, &serde_json::json!({"uidNumber": "junk"})), (4042, 4042));
    }

    #[test]
    fn every_mistake_is_reported_with_line_and_field() {
        let bad = GOOD
            .replace("name: bar", "name: Bar")
            .replace("group: tenant-foo-data", "group: tenant-foo-ml")
            .replace("default_qos: normal", "default_qos: premium")
            .replace("soft: 45TB", "soft: 55TB")
            .replace("gres/gpu=128", "gres/gpu 128");
        let e = TenantRegistry::parse(&bad, "t.yaml").unwrap_err();
        let got: Vec<String> = e.mistakes.iter().map(|m| m.to_string()).collect();
        assert_eq!(
            got,
            [
                "line 6: tenants[0].limits.grp_tres: \"gres/gpu 128\" is not a TRES list like gres/gpu=128,cpu=64",
                "line 8: tenants[0].user_defaults.default_qos: premium is not in the qos list",
                "line 14: tenants[0].quotas.scratch.soft: soft 55TB is above hard 50TB",
                "line 21: tenants[0].teams[1].group: group \"tenant-foo-ml\" is already used at tenants[0].teams[0].group",
                "line 22: tenants[1].name: tenant name \"Bar\" is not allowed: it must start with a lower-case letter or _",
            ]
        );
        assert!(e.to_string().starts_with("tenant registry t.yaml: 5 mistakes:\n  line 6:"), "{e}");
    }

    #[test]
    fn structural_mistakes_name_line_and_field() {
        let bad = GOOD.replace("max_jobs: 20", "max_jobs: twenty");
        let e = TenantRegistry::parse(&bad, "t.yaml").unwrap_err();
        assert_eq!(e.mistakes.len(), 1);
        let m = &e.mistakes[0];
        assert_eq!((m.line, m.field.as_str()), (Some(10), "tenants[0].user_defaults.max_jobs"), "{m}");
        let bad = GOOD.replace("fairshare: 200", "fairshares: 200");
        let m = &TenantRegistry::parse(&bad, "t.yaml").unwrap_err().mistakes[0];
        assert_eq!(m.line, Some(20), "{m}");
        assert!(m.message.contains("unknown field `fairshares`"), "{m}");
    }

    #[test]
    fn sizes_parse() {
        assert_eq!(size("100GB"), Some(100_000_000_000));
        assert_eq!(size("1GiB"), Some(1 << 30));
        assert_eq!(size("90G"), Some(90_000_000_000));
        assert_eq!(size("lots"), None);
    }
}

#[cfg(test)]
mod example {
    #[test]
    fn the_shipped_example_is_valid() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/deploy/authentik/tenants.example.yaml");
        let r = super::TenantRegistry::load(std::path::Path::new(path)).unwrap();
        assert_eq!(r.tenants.len(), 2);
        assert_eq!(r.tenants[0].default_account.as_str(), "ml-team-foo");
        // it shows the runbook's names, which are also what a tenant without the block gets
        assert_eq!(r.tenants[0].kubernetes.namespace, "tenant-foo");
        let bar = &r.tenants[1].kubernetes;
        assert_eq!((bar.namespace.as_str(), bar.slurm_cluster.as_str()), ("tenant-bar", "cluster-tenant-bar"));
    }
}
