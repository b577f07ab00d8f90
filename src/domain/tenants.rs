//! The tenant registry: a declarative YAML file mapping Authentik groups to tenants and teams
//! (Slurm accounts), with each tenant's limits, user defaults, quotas and login pod, and the
//! uid/gid numbering. Read and validated at start; every mistake is reported on its own line with
//! the line number and field (`tenants[1].teams[0].account`).
//!
//! ```yaml
//! uid_offset: 4000            # uidNumber = pk + uid_offset unless attributes.uidNumber is set
//! gid_offset: 4000
//! tenants:
//!   - name: foo
//!     group: tenant-foo-users # members of this Authentik group belong to the tenant
//!     account: tenant-foo     # default: tenant-<name>
//!     limits: { fairshare: 300, grp_tres: gres/gpu=128, grp_jobs: 200 }
//!     user_defaults: { default_qos: normal, qos: [normal, high], max_jobs: 20, grp_tres_mins: gres/gpu=10000 }
//!     quotas:
//!       home: { path: /home, soft: 90GB, hard: 100GB }
//!       scratch: { path: /tenant/tenant-foo/scratch, soft: 45TB, hard: 50TB }
//!     login_pod: { namespace: tenant-foo, deployment: login }
//!     default_team: ml-team-foo  # account of members in no team group; default: the tenant account
//!     teams:
//!       - { account: ml-team-foo, group: tenant-foo-ml, fairshare: 200 }
//! ```

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::domain::names::{QosName, SlurmAccount, TenantName};

/// The registry as written in the file (strings not yet checked).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRegistry {
    #[serde(default = "default_offset")]
    uid_offset: u32,
    #[serde(default = "default_offset")]
    gid_offset: u32,
    tenants: Vec<RawTenant>,
}

fn default_offset() -> u32 {
    4000
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTenant {
    name: String,
    group: String,
    account: Option<String>,
    description: Option<String>,
    #[serde(default)]
    limits: TenantLimits,
    #[serde(default)]
    user_defaults: RawUserDefaults,
    #[serde(default)]
    quotas: Quotas,
    login_pod: Option<LoginPod>,
    default_team: Option<String>,
    #[serde(default)]
    teams: Vec<RawTeam>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTeam {
    account: String,
    group: String,
    fairshare: Option<u32>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawUserDefaults {
    default_qos: Option<String>,
    #[serde(default)]
    qos: Vec<String>,
    max_jobs: Option<u32>,
    grp_tres_mins: Option<String>,
}

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

#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct LoginPod {
    pub namespace: String,
    pub deployment: String,
    pub container: Option<String>,
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
    pub login_pod: Option<LoginPod>,
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
    pub fn load(path: &Path) -> Result<Self, RegistryError> {
        let text = std::fs::read_to_string(path).map_err(|e| RegistryError {
            source_name: path.display().to_string(),
            mistakes: vec![Mistake { line: None, field: "(file)".into(), message: e.to_string() }],
        })?;
        Self::parse(&text, &path.display().to_string())
    }

    /// Parses and validates; `source_name` names the file in messages.
    pub fn parse(text: &str, source_name: &str) -> Result<Self, RegistryError> {
        let fail = |mistakes| RegistryError { source_name: source_name.to_string(), mistakes };
        let raw: RawRegistry = serde_yaml_ng::from_str(text).map_err(|e| {
            let line = e.location().map(|l| l.line());
            let msg = e.to_string();
            // serde_yaml_ng says "field.path: message at line L column C"
            let msg = msg.split(" at line ").next().unwrap_or(&msg).to_string();
            let (field, message) = match msg.split_once(": ") {
                Some((f, m)) if !f.contains(' ') => (f.to_string(), m.to_string()),
                _ => ("(document)".to_string(), msg),
            };
            fail(vec![Mistake { line, field, message }])
        })?;
        let lines = LineIndex::new(text);
        let mut v = Validator { lines: &lines, mistakes: vec![] };
        let reg = v.registry(raw);
        if v.mistakes.is_empty() { Ok(reg) } else { Err(fail(v.mistakes)) }
    }

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

struct Validator<'a> {
    lines: &'a LineIndex,
    mistakes: Vec<Mistake>,
}

impl Validator<'_> {
    fn err(&mut self, field: String, message: impl Into<String>) {
        let line = self.lines.line_of(&field);
        self.mistakes.push(Mistake { line, field, message: message.into() });
    }

    fn name<T>(
        &mut self,
        field: String,
        s: &str,
        parse: fn(&str) -> Result<T, crate::domain::names::NameError>,
    ) -> Option<T> {
        match parse(s) {
            Ok(v) => Some(v),
            Err(e) => {
                self.err(field, e.to_string());
                None
            }
        }
    }

    fn registry(&mut self, raw: RawRegistry) -> TenantRegistry {
        if raw.tenants.is_empty() {
            self.err("tenants".into(), "at least one tenant is needed");
        }
        let mut groups: HashMap<String, String> = HashMap::new();
        let mut accounts: HashMap<String, String> = HashMap::new();
        let mut names: HashMap<String, String> = HashMap::new();
        let mut tenants = vec![];
        for (i, t) in raw.tenants.into_iter().enumerate() {
            let at = format!("tenants[{i}]");
            let name = self.name(format!("{at}.name"), &t.name, TenantName::parse);
            if let Some(prev) = names.insert(t.name.clone(), format!("{at}.name")) {
                self.err(format!("{at}.name"), format!("tenant {:?} is already defined at {prev}", t.name));
            }
            let account_str = t.account.clone().unwrap_or_else(|| format!("tenant-{}", t.name));
            // a derived account of a bad tenant name is the same mistake: said once
            let account = if t.account.is_none() && name.is_none() {
                None
            } else {
                self.name(format!("{at}.account"), &account_str, SlurmAccount::parse)
            };
            self.unique(&mut groups, &t.group, format!("{at}.group"), "group");
            self.unique(&mut accounts, &account_str, format!("{at}.account"), "account");
            if t.group.trim().is_empty() {
                self.err(format!("{at}.group"), "the Authentik group name is empty");
            }
            if let Some(tres) = &t.limits.grp_tres {
                self.tres(format!("{at}.limits.grp_tres"), tres);
            }
            let defaults = self.user_defaults(&at, t.user_defaults);
            for (k, q) in [("home", &t.quotas.home), ("scratch", &t.quotas.scratch)] {
                if let Some(q) = q {
                    self.quota(format!("{at}.quotas.{k}"), q);
                }
            }
            if let Some(p) = &t.login_pod {
                for (k, v) in [
                    ("namespace", Some(&p.namespace)),
                    ("deployment", Some(&p.deployment)),
                    ("container", p.container.as_ref()),
                ] {
                    if let Some(v) = v.filter(|v| !dns_label(v)) {
                        self.err(
                            format!("{at}.login_pod.{k}"),
                            format!("{v:?} is not a Kubernetes name (lower-case letters, digits and -)"),
                        );
                    }
                }
            }
            let mut teams = vec![];
            for (j, m) in t.teams.into_iter().enumerate() {
                let tat = format!("{at}.teams[{j}]");
                self.unique(&mut groups, &m.group, format!("{tat}.group"), "group");
                self.unique(&mut accounts, &m.account, format!("{tat}.account"), "account");
                if let Some(account) = self.name(format!("{tat}.account"), &m.account, SlurmAccount::parse) {
                    teams.push(Team { account, group: m.group, fairshare: m.fairshare });
                }
            }
            let default_account = match &t.default_team {
                Some(d) if !teams.iter().any(|m| m.account.as_str() == d) => {
                    self.err(format!("{at}.default_team"), format!("{d:?} is not one of this tenant's teams"));
                    None
                }
                Some(d) => SlurmAccount::parse(d).ok(),
                None => account.clone(),
            };
            if let (Some(name), Some(account), Some(default_account)) = (name, account, default_account) {
                tenants.push(Tenant {
                    name,
                    group: t.group,
                    account,
                    description: t.description,
                    limits: t.limits,
                    user_defaults: defaults,
                    quotas: t.quotas,
                    login_pod: t.login_pod,
                    default_account,
                    teams,
                });
            }
        }
        TenantRegistry { uid_offset: raw.uid_offset, gid_offset: raw.gid_offset, tenants }
    }

    fn unique(&mut self, seen: &mut HashMap<String, String>, value: &str, field: String, what: &str) {
        if let Some(prev) = seen.get(value) {
            let prev = prev.clone();
            self.err(field, format!("{what} {value:?} is already used at {prev}"));
        } else {
            seen.insert(value.to_string(), field);
        }
    }

    fn user_defaults(&mut self, at: &str, d: RawUserDefaults) -> UserDefaults {
        let at = format!("{at}.user_defaults");
        let qos: Vec<QosName> = d
            .qos
            .iter()
            .enumerate()
            .filter_map(|(k, q)| self.name(format!("{at}.qos[{k}]"), q, QosName::parse))
            .collect();
        let default_qos =
            d.default_qos.as_deref().and_then(|q| self.name(format!("{at}.default_qos"), q, QosName::parse));
        if let Some(dq) = &default_qos
            && !qos.is_empty()
            && !qos.contains(dq)
        {
            self.err(format!("{at}.default_qos"), format!("{dq} is not in the qos list"));
        }
        if let Some(t) = &d.grp_tres_mins {
            self.tres(format!("{at}.grp_tres_mins"), t);
        }
        UserDefaults { default_qos, qos, max_jobs: d.max_jobs, grp_tres_mins: d.grp_tres_mins }
    }

    /// `cpu=64,mem=512G,gres/gpu=128`
    fn tres(&mut self, field: String, s: &str) {
        let ok = !s.is_empty()
            && s.split(',').all(|part| match part.split_once('=') {
                Some((k, v)) => {
                    !k.is_empty()
                        && k.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || "/:_-".contains(c))
                        && !v.is_empty()
                        && v.chars().all(|c| c.is_ascii_alphanumeric())
                }
                None => false,
            });
        if !ok {
            self.err(field, format!("{s:?} is not a TRES list like gres/gpu=128,cpu=64"));
        }
    }

    fn quota(&mut self, at: String, q: &Quota) {
        if !q.path.starts_with('/') || q.path.contains("..") || q.path.chars().any(|c| c.is_whitespace()) {
            self.err(format!("{at}.path"), format!("{:?} is not an absolute path", q.path));
        }
        let soft = size(&q.soft);
        let hard = size(&q.hard);
        if soft.is_none() {
            self.err(format!("{at}.soft"), format!("{:?} is not a size like 90GB or 45TB", q.soft));
        }
        if hard.is_none() {
            self.err(format!("{at}.hard"), format!("{:?} is not a size like 100GB or 50TB", q.hard));
        }
        if let (Some(s), Some(h)) = (soft, hard)
            && s > h
        {
            self.err(format!("{at}.soft"), format!("soft {} is above hard {}", q.soft, q.hard));
        }
    }
}

fn dns_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

/// `100GB`, `90G`, `1.5TiB`, `512MB` → bytes.
pub fn size(s: &str) -> Option<u128> {
    let s = s.trim();
    let split = s.find(|c: char| !(c.is_ascii_digit() || c == '.'))?;
    let (num, unit) = s.split_at(split);
    let n: f64 = num.parse().ok()?;
    let (base, rest): (u128, &str) =
        if let Some(r) = unit.strip_suffix("iB") { (1024, r) } else { (1000, unit.strip_suffix('B').unwrap_or(unit)) };
    let exp = ["K", "M", "G", "T", "P"].iter().position(|u| *u == rest)? as u32 + 1;
    Some((n * base.pow(exp) as f64) as u128)
}

/// Where each field path starts in the text (block style; fields of a flow mapping `{a: 1}`
/// share its line). Only used to point at mistakes.
struct LineIndex {
    paths: BTreeMap<String, usize>,
}

impl LineIndex {
    fn new(text: &str) -> Self {
        let mut paths = BTreeMap::new();
        // open entries: (column, path, is a sequence item)
        let mut stack: Vec<(usize, String, bool)> = vec![];
        let mut seq_counts: HashMap<String, usize> = HashMap::new();
        for (n, raw) in text.lines().enumerate() {
            let line_no = n + 1;
            let content = raw.split(" #").next().unwrap_or(raw);
            if content.trim().is_empty() || content.trim_start().starts_with('#') || content.starts_with("---") {
                continue;
            }
            let mut col = content.len() - content.trim_start().len();
            let mut rest = content.trim_start();
            while let Some(after) = rest.strip_prefix("- ").or_else(|| (rest == "-").then_some("")) {
                while stack.last().is_some_and(|(c, _, item)| *c > col || (*c == col && *item)) {
                    stack.pop();
                }
                let parent = stack.last().map(|(_, p, _)| p.clone()).unwrap_or_default();
                let k = seq_counts.entry(parent.clone()).or_insert(0);
                let item = format!("{parent}[{k}]");
                *k += 1;
                paths.insert(item.clone(), line_no);
                stack.push((col, item, true));
                col += 2;
                rest = after.trim_start();
            }
            let Some((key, value)) = rest.split_once(':') else {
                continue;
            };
            let key = key.trim().trim_matches('"');
            if key.is_empty() || key.contains(' ') || key.starts_with('{') {
                continue;
            }
            while stack.last().is_some_and(|(c, _, item)| *c > col || (*c == col && !*item)) {
                stack.pop();
            }
            let parent = stack.last().map(|(_, p, _)| p.clone()).unwrap_or_default();
            let path = if parent.is_empty() { key.to_string() } else { format!("{parent}.{key}") };
            paths.insert(path.clone(), line_no);
            let value = value.trim();
            if let Some(inner) = value.strip_prefix('{') {
                for part in inner.trim_end_matches('}').split(',') {
                    if let Some((k, _)) = part.split_once(':') {
                        paths.insert(format!("{path}.{}", k.trim()), line_no);
                    }
                }
            } else if let Some(inner) = value.strip_prefix('[') {
                for (k, _) in inner.trim_end_matches(']').split(',').enumerate() {
                    paths.insert(format!("{path}[{k}]"), line_no);
                }
            }
            stack.push((col, path, false));
        }
        Self { paths }
    }

    /// The line of `field`, or of its nearest ancestor that has one.
    fn line_of(&self, field: &str) -> Option<usize> {
        let mut f = field.to_string();
        loop {
            if let Some(l) = self.paths.get(&f) {
                return Some(*l);
            }
            let cut = f.rfind(['.', '['])?;
            f.truncate(cut);
        }
    }
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
    }
}
