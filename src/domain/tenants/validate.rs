//! The registry's validator: every mistake in the file, each with its field path and line.

use std::collections::HashMap;

use super::k8s::{K8sNames, RawK8sNames};
use super::parse::{LineIndex, RawLoginPod, RawRegistry, RawUserDefaults};
use super::{Mistake, Quota, Team, Tenant, TenantRegistry, UserDefaults};
use crate::domain::names::{NameError, QosName, SlurmAccount, TenantName};

pub(super) struct Validator<'a> {
    pub(super) lines: &'a LineIndex,
    pub(super) mistakes: Vec<Mistake>,
}

impl Validator<'_> {
    /// Records a mistake (once: a registry-wide value can be wrong for every tenant alike).
    pub(super) fn err(&mut self, field: String, message: impl Into<String>) {
        let line = self.lines.line_of(&field);
        let m = Mistake { line, field, message: message.into() };
        if !self.mistakes.contains(&m) {
            self.mistakes.push(m);
        }
    }

    fn name<T>(&mut self, field: String, s: &str, parse: fn(&str) -> Result<T, NameError>) -> Option<T> {
        match parse(s) {
            Ok(v) => Some(v),
            Err(e) => {
                self.err(field, e.to_string());
                None
            }
        }
    }

    pub(super) fn registry(&mut self, raw: RawRegistry) -> TenantRegistry {
        if raw.tenants.is_empty() {
            self.err("tenants".into(), "at least one tenant is needed");
        }
        let mut groups: HashMap<String, String> = HashMap::new();
        let mut accounts: HashMap<String, String> = HashMap::new();
        let mut names: HashMap<String, String> = HashMap::new();
        let mut tenants = vec![];
        let mut places = vec![];
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
            let k8s = match (&name, &account) {
                (Some(n), Some(a)) => {
                    self.tenant_k8s(&at, [n.as_str(), a.as_str()], (&t.kubernetes, &t.login_pod), &raw.kubernetes)
                }
                _ => None,
            };
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
            if let (Some(name), Some(account), Some(default_account), Some(kubernetes)) =
                (name, account, default_account, k8s)
            {
                places.push(at.clone());
                tenants.push(Tenant {
                    name,
                    group: t.group,
                    account,
                    description: t.description,
                    limits: t.limits,
                    user_defaults: defaults,
                    quotas: t.quotas,
                    kubernetes,
                    default_account,
                    teams,
                });
            }
        }
        self.k8s_collisions(&tenants, &places);
        let identities = match raw.identities.policy() {
            Ok(p) => p,
            Err(mistakes) => {
                mistakes.into_iter().for_each(|(field, message)| self.err(field, message));
                Default::default()
            }
        };
        let qos = self.qos_decls(raw.qos);
        TenantRegistry { uid_offset: raw.uid_offset, gid_offset: raw.gid_offset, identities, qos, tenants }
    }

    /// The tenant's Kubernetes names from its `kubernetes:` block (or the older `login_pod:`).
    fn tenant_k8s(
        &mut self,
        at: &str,
        [name, account]: [&str; 2],
        (kubernetes, login_pod): (&Option<RawK8sNames>, &Option<RawLoginPod>),
        all: &RawK8sNames,
    ) -> Option<K8sNames> {
        let legacy = match (kubernetes, login_pod) {
            (Some(_), Some(_)) => {
                self.err(
                    format!("{at}.login_pod"),
                    "set the login pod in one place: move namespace, deployment and container into \
                     kubernetes (namespace, login_deployment, login_container; login_pod: \"\" for a Ready pod \
                     of the Deployment)",
                );
                return None;
            }
            (None, Some(p)) => Some(RawK8sNames {
                namespace: Some(p.namespace.clone()),
                login_deployment: Some(p.deployment.clone()),
                login_container: p.container.clone(),
                login_pod: Some(String::new()),
                ..Default::default()
            }),
            _ => None,
        };
        let own = legacy.as_ref().or(kubernetes.as_ref()).cloned().unwrap_or_default();
        self.k8s_names(at, [("name", name), ("account", account)], &own, legacy.is_some(), all)
    }

    /// Two tenants may not share a namespace, a Reservation or a node label.
    /// `places[i]`: where `tenants[i]` is in the file.
    fn k8s_collisions(&mut self, tenants: &[Tenant], places: &[String]) {
        type Key = fn(&K8sNames) -> (&'static str, String);
        let keys: [Key; 3] = [
            |k| ("namespace", k.namespace.clone()),
            |k| match &k.reservation_namespace {
                Some(ns) => ("reservation", format!("{ns}/{}", k.reservation)),
                None => ("reservation", format!("{} (cluster-scoped)", k.reservation)),
            },
            |k| ("node_label", k.node_label.clone()),
        ];
        for key in keys {
            let mut seen: HashMap<String, &Tenant> = HashMap::new();
            for (t, at) in tenants.iter().zip(places) {
                let (field, value) = key(&t.kubernetes);
                match seen.get(&value) {
                    Some(first) => {
                        let message = format!(
                            "{field} {value} is already tenant {}'s; two tenants cannot share it: set {at}.kubernetes.{field}",
                            first.name
                        );
                        self.err(format!("{at}.kubernetes.{field}"), message);
                    }
                    None => {
                        seen.insert(value, t);
                    }
                }
            }
        }
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
    pub(super) fn tres(&mut self, field: String, s: &str) {
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
