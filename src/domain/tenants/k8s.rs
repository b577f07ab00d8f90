//! Each tenant's names in Kubernetes, resolved once when the registry is read: the tenant's own
//! `kubernetes:` block, else the registry-wide `kubernetes:` block, else the runbook's names
//! (namespace `tenant-<name>`, Secret `<namespace>-authorized-keys`, SlurmCluster
//! `cluster-<account>`, Reservation `<account>-reservation`, node label
//! `reserved.tenant=<account>`). A value may use `{name}`, `{account}` and (except the namespace
//! itself) `{namespace}`.

use serde::{Deserialize, Serialize};

use super::validate::Validator;

/// The Kubernetes names onramp uses for one tenant.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct K8sNames {
    /// The tenant's namespace (login pods, key Secret, NetworkPolicy, SlurmCluster).
    pub namespace: String,
    /// The Secret holding one `authorized_keys` entry per user.
    pub keys_secret: String,
    /// The isolation NetworkPolicy.
    pub network_policy: String,
    /// The login Deployment (rollout restart; and the exec target when `login_pod` is `None`).
    pub login_deployment: String,
    /// The pod commands run in; `None`: a Ready pod of the login Deployment.
    pub login_pod: Option<String>,
    /// The container in the login pod; `None`: the pod's only or default container.
    pub login_container: Option<String>,
    /// The SlurmCluster custom resource in the namespace.
    pub slurm_cluster: String,
    /// The Reservation custom resource.
    pub reservation: String,
    /// Where the Reservation is; `None`: it is cluster-scoped.
    pub reservation_namespace: Option<String>,
    /// The value of the `reserved.tenant` label on the tenant's nodes.
    pub node_label: String,
}

/// A `kubernetes:` block as written: registry-wide (defaults for every tenant) or a tenant's own.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawK8sNames {
    pub(super) namespace: Option<String>,
    pub(super) keys_secret: Option<String>,
    pub(super) network_policy: Option<String>,
    pub(super) login_deployment: Option<String>,
    /// `""`: a Ready pod of the login Deployment.
    pub(super) login_pod: Option<String>,
    pub(super) login_container: Option<String>,
    pub(super) slurm_cluster: Option<String>,
    pub(super) reservation: Option<String>,
    /// `-`: cluster-scoped.
    pub(super) reservation_namespace: Option<String>,
    pub(super) node_label: Option<String>,
}

/// What a name must look like in Kubernetes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Kind {
    /// A DNS-1123 label: a namespace, a container.
    Label,
    /// A DNS-1123 subdomain: most object names.
    Subdomain,
    /// A label value (`_` and upper case allowed).
    LabelValue,
}

impl Kind {
    pub(super) fn accepts(self, s: &str) -> bool {
        let ends_ok = |s: &str| {
            s.chars().next().is_some_and(|c| c.is_ascii_alphanumeric())
                && s.chars().last().is_some_and(|c| c.is_ascii_alphanumeric())
        };
        let lower = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit();
        match self {
            Self::Label => s.len() <= 63 && ends_ok(s) && s.chars().all(|c| lower(c) || c == '-'),
            Self::Subdomain => {
                s.len() <= 253 && s.split('.').all(|p| ends_ok(p) && p.chars().all(|c| lower(c) || c == '-'))
            }
            Self::LabelValue => {
                s.len() <= 63 && ends_ok(s) && s.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
            }
        }
    }

    pub(super) fn rule(self) -> &'static str {
        match self {
            Self::Label => "lower-case letters, digits and -, at most 63",
            Self::Subdomain => "lower-case letters, digits, - and .",
            Self::LabelValue => "letters, digits, -, _ and ., at most 63",
        }
    }
}

/// One field of the block: its key, the runbook's default, what it must look like, and whether
/// it can be left empty (`""` or `-`, see [`RawK8sNames`]).
pub(super) struct Field {
    pub(super) key: &'static str,
    pub(super) runbook: Option<&'static str>,
    pub(super) kind: Kind,
    pub(super) empty: Option<&'static str>,
}

/// The fields, in the order they are resolved (the namespace first: others may use it).
pub(super) const FIELDS: [Field; 10] = [
    Field { key: "namespace", runbook: Some("tenant-{name}"), kind: Kind::Label, empty: None },
    Field { key: "keys_secret", runbook: Some("{namespace}-authorized-keys"), kind: Kind::Subdomain, empty: None },
    Field { key: "network_policy", runbook: Some("{namespace}-isolation"), kind: Kind::Subdomain, empty: None },
    Field { key: "login_deployment", runbook: Some("login"), kind: Kind::Subdomain, empty: None },
    Field { key: "login_pod", runbook: Some("login-0"), kind: Kind::Subdomain, empty: Some("") },
    Field { key: "login_container", runbook: None, kind: Kind::Label, empty: None },
    Field { key: "slurm_cluster", runbook: Some("cluster-{account}"), kind: Kind::Subdomain, empty: None },
    Field { key: "reservation", runbook: Some("{account}-reservation"), kind: Kind::Subdomain, empty: None },
    Field { key: "reservation_namespace", runbook: Some("{namespace}"), kind: Kind::Label, empty: Some("-") },
    Field { key: "node_label", runbook: Some("{account}"), kind: Kind::LabelValue, empty: None },
];

impl RawK8sNames {
    /// The value written for a field.
    pub(super) fn get(&self, key: &str) -> Option<&str> {
        match key {
            "namespace" => self.namespace.as_deref(),
            "keys_secret" => self.keys_secret.as_deref(),
            "network_policy" => self.network_policy.as_deref(),
            "login_deployment" => self.login_deployment.as_deref(),
            "login_pod" => self.login_pod.as_deref(),
            "login_container" => self.login_container.as_deref(),
            "slurm_cluster" => self.slurm_cluster.as_deref(),
            "reservation" => self.reservation.as_deref(),
            "reservation_namespace" => self.reservation_namespace.as_deref(),
            "node_label" => self.node_label.as_deref(),
            _ => None,
        }
    }
}

/// `{name}`, `{account}`, `{namespace}` replaced; an unknown or unavailable placeholder is the
/// error (its text).
pub(super) fn expand(template: &str, vars: &[(&str, &str)]) -> Result<String, String> {
    let mut out = String::new();
    let mut rest = template;
    while let Some(open) = rest.find('{') {
        out.push_str(&rest[..open]);
        let Some(close) = rest[open..].find('}') else {
            return Err(format!("an unclosed {{ in {template:?}"));
        };
        let key = &rest[open + 1..open + close];
        match vars.iter().find(|(k, _)| *k == key) {
            Some((_, v)) => out.push_str(v),
            None => {
                let known: Vec<String> = vars.iter().map(|(k, _)| format!("{{{k}}}")).collect();
                return Err(format!("{{{key}}} is not one of {}", known.join(", ")));
            }
        }
        rest = &rest[open + close + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

impl K8sNames {
    /// Where login-pod commands run, for messages: `namespace/pod` or `namespace/deploy/name`.
    pub fn login_target(&self) -> String {
        match &self.login_pod {
            Some(p) => format!("{}/{p}", self.namespace),
            None => format!("{}/deploy/{}", self.namespace, self.login_deployment),
        }
    }

    /// From the resolved values of [`FIELDS`], in order (`None`: the field is left empty).
    pub(super) fn from_values(v: [Option<String>; 10]) -> Self {
        let [
            namespace,
            keys_secret,
            network_policy,
            login_deployment,
            login_pod,
            login_container,
            slurm_cluster,
            reservation,
            reservation_namespace,
            node_label,
        ] = v;
        Self {
            namespace: namespace.unwrap_or_default(),
            keys_secret: keys_secret.unwrap_or_default(),
            network_policy: network_policy.unwrap_or_default(),
            login_deployment: login_deployment.unwrap_or_default(),
            login_pod,
            login_container,
            slurm_cluster: slurm_cluster.unwrap_or_default(),
            reservation: reservation.unwrap_or_default(),
            reservation_namespace,
            node_label: node_label.unwrap_or_default(),
        }
    }
}

/// Where a field's value came from, for messages.
enum Source<'a> {
    Tenant(String),
    Registry(&'a str),
    Runbook(&'a str),
}

impl Validator<'_> {
    /// The tenant's names (`None` after a mistake, which is reported). `at` is `tenants[i]`;
    /// `own` the tenant's block (the legacy `login_pod` block already folded in, its fields
    /// named by `legacy`); `all` the registry-wide block.
    pub(super) fn k8s_names(
        &mut self,
        at: &str,
        vars: [(&str, &str); 2],
        own: &RawK8sNames,
        legacy: bool,
        all: &RawK8sNames,
    ) -> Option<K8sNames> {
        let mut vars: Vec<(&str, String)> = vars.iter().map(|(k, v)| (*k, v.to_string())).collect();
        let mut values: [Option<String>; 10] = Default::default();
        let mut ok = true;
        for (i, f) in FIELDS.iter().enumerate() {
            if i > 0 && values[0].is_none() {
                return None; // the namespace's mistake is enough: the rest may depend on it
            }
            let own_field = match (legacy, f.key) {
                (true, "namespace") => format!("{at}.login_pod.namespace"),
                (true, "login_deployment") => format!("{at}.login_pod.deployment"),
                (true, "login_container") => format!("{at}.login_pod.container"),
                (true, "login_pod") => format!("{at}.login_pod"),
                _ => format!("{at}.kubernetes.{}", f.key),
            };
            let (template, source) = match (own.get(f.key), all.get(f.key), f.runbook) {
                (Some(v), _, _) => (v, Source::Tenant(own_field.clone())),
                (None, Some(v), _) => (v, Source::Registry(v)),
                (None, None, Some(v)) => (v, Source::Runbook(v)),
                (None, None, None) => continue,
            };
            if f.empty == Some(template) {
                continue;
            }
            let known: Vec<(&str, &str)> = vars.iter().map(|(k, v)| (*k, v.as_str())).collect();
            let value = match expand(template, &known) {
                Ok(v) => v,
                Err(e) => {
                    let field = match &source {
                        Source::Tenant(field) => field.clone(),
                        _ => format!("kubernetes.{}", f.key),
                    };
                    self.err(field, e);
                    ok = false;
                    continue;
                }
            };
            if !f.kind.accepts(&value) {
                let fix = format!("set {at}.kubernetes.{}", f.key);
                let message = match &source {
                    Source::Tenant(_) => format!("{value:?} is not a Kubernetes name ({})", f.kind.rule()),
                    Source::Registry(t) => format!(
                        "{value:?} (from kubernetes.{}: {t}) is not a Kubernetes name ({}); {fix}",
                        f.key,
                        f.kind.rule()
                    ),
                    Source::Runbook(t) => {
                        format!("{value:?} (the default, {t}) is not a Kubernetes name ({}); {fix}", f.kind.rule())
                    }
                };
                self.err(own_field, message);
                ok = false;
                continue;
            }
            if f.key == "namespace" {
                vars.push(("namespace", value.clone()));
            }
            values[i] = Some(value);
        }
        ok.then(|| K8sNames::from_values(values))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_and_placeholders() {
        assert!(Kind::Label.accepts("tenant-foo") && !Kind::Label.accepts("tenant.foo") && !Kind::Label.accepts("-a"));
        assert!(Kind::Subdomain.accepts("cluster.tenant-foo") && !Kind::Subdomain.accepts("a..b"));
        assert!(Kind::LabelValue.accepts("ml_Team.1") && !Kind::LabelValue.accepts("_x") && !Kind::Label.accepts(""));
        assert!(!Kind::Label.accepts(&"a".repeat(64)));
        let vars = [("name", "foo"), ("account", "tenant-foo")];
        assert_eq!(expand("cluster-{account}", &vars).unwrap(), "cluster-tenant-foo");
        assert_eq!(expand("{name}-{name}", &vars).unwrap(), "foo-foo");
        assert_eq!(expand("{namespace}-x", &vars).unwrap_err(), "{namespace} is not one of {name}, {account}");
        assert!(expand("x-{name", &vars).unwrap_err().contains("unclosed"));
    }
}
