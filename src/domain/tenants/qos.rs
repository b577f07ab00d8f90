//! The registry's `qos:` list: the QOS onramp creates or converges in Slurm (cluster-wide) when a
//! tenant that names one is onboarded, before any association references it.
//!
//! ```yaml
//! qos:
//!   - name: high                  # a QOS name, as tenants' user_defaults.qos name it
//!     priority: 100               # Priority
//!     max_tres_per_user: gres/gpu=8,cpu=64   # MaxTRESPerUser
//!     max_jobs_per_user: 10       # MaxJobsPerUser
//! ```
//!
//! A tenant's user defaults may also name a QOS the registry does not declare (`normal`, which
//! every Slurm has): the onboarding's `qos` step then requires that Slurm has it.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

use super::validate::Validator;
use super::{Tenant, TenantRegistry};
use crate::domain::names::QosName;

/// One declared QOS.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct QosDecl {
    pub name: QosName,
    pub priority: Option<u32>,
    /// `gres/gpu=8,cpu=64` (checked like every TRES list of the registry).
    pub max_tres_per_user: Option<String>,
    pub max_jobs_per_user: Option<u32>,
}

/// A `qos:` entry as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawQos {
    pub(super) name: String,
    pub(super) priority: Option<u32>,
    pub(super) max_tres_per_user: Option<String>,
    pub(super) max_jobs_per_user: Option<u32>,
}

impl Validator<'_> {
    /// Each entry's name and TRES; a name declared twice is a mistake.
    pub(super) fn qos_decls(&mut self, raw: Vec<RawQos>) -> Vec<QosDecl> {
        let mut seen: HashMap<String, String> = HashMap::new();
        let mut out = vec![];
        for (i, q) in raw.into_iter().enumerate() {
            let at = format!("qos[{i}]");
            if let Some(prev) = seen.insert(q.name.clone(), format!("{at}.name")) {
                self.err(format!("{at}.name"), format!("qos {:?} is already declared at {prev}", q.name));
                continue;
            }
            if let Some(t) = &q.max_tres_per_user {
                self.tres(format!("{at}.max_tres_per_user"), t);
            }
            let name = match QosName::parse(&q.name) {
                Ok(n) => n,
                Err(e) => {
                    self.err(format!("{at}.name"), e.to_string());
                    continue;
                }
            };
            out.push(QosDecl {
                name,
                priority: q.priority,
                max_tres_per_user: q.max_tres_per_user,
                max_jobs_per_user: q.max_jobs_per_user,
            });
        }
        out
    }
}

impl TenantRegistry {
    /// The declared QOS that the tenant's user defaults name.
    pub fn declared_qos(&self, t: &Tenant) -> Vec<&QosDecl> {
        let names = t.qos_names();
        self.qos.iter().filter(|q| names.contains(&q.name)).collect()
    }
}

impl Tenant {
    /// Every QOS the tenant's user defaults name (`default_qos` and the `qos` list), once each.
    pub fn qos_names(&self) -> Vec<QosName> {
        let d = &self.user_defaults;
        let mut names: Vec<QosName> = d.qos.iter().chain(d.default_qos.as_ref()).cloned().collect();
        names.sort_by(|a, b| a.as_str().cmp(b.as_str()));
        names.dedup();
        names
    }
}

#[cfg(test)]
mod tests {
    use crate::domain::tenants::TenantRegistry;

    const REG: &str = "\
qos:
  - name: high
    priority: 100
    max_tres_per_user: gres/gpu=8
    max_jobs_per_user: 10
  - { name: low }
tenants:
  - name: foo
    group: foo-users
    user_defaults: { default_qos: normal, qos: [normal, high] }
";

    #[test]
    fn declared_qos_load_and_a_tenant_names_its_own() {
        let r = TenantRegistry::parse(REG, "t.yaml").unwrap();
        assert_eq!(r.qos.len(), 2);
        assert_eq!(
            (r.qos[0].name.as_str(), r.qos[0].priority, r.qos[0].max_jobs_per_user),
            ("high", Some(100), Some(10))
        );
        assert_eq!(r.qos[0].max_tres_per_user.as_deref(), Some("gres/gpu=8"));
        let names: Vec<String> = r.tenants[0].qos_names().iter().map(|q| q.to_string()).collect();
        assert_eq!(names, ["high", "normal"]);
        assert_eq!(r.declared_qos(&r.tenants[0]).len(), 1);
    }

    #[test]
    fn qos_mistakes_name_the_field() {
        let bad = REG
            .replace("gres/gpu=8", "gres/gpu 8")
            .replace("{ name: low }", "{ name: High }\n  - { name: high }\n  - { name: x, maxjobs: 1 }");
        let e = TenantRegistry::parse(&bad.replace("  - { name: x, maxjobs: 1 }\n", ""), "t.yaml").unwrap_err();
        let got: Vec<String> = e.mistakes.iter().map(|m| m.to_string()).collect();
        assert_eq!(
            got,
            [
                "line 4: qos[0].max_tres_per_user: \"gres/gpu 8\" is not a TRES list like gres/gpu=128,cpu=64",
                "line 6: qos[1].name: QOS name \"High\" is not allowed: it must start with a lower-case letter or _",
                "line 7: qos[2].name: qos \"high\" is already declared at qos[0].name",
            ]
        );
        let e = TenantRegistry::parse(&bad, "t.yaml").unwrap_err();
        assert!(e.mistakes[0].field.starts_with("qos[3]") && e.mistakes[0].message.contains("maxjobs"), "{e}");
    }
}
