//! The registry's YAML reader: the file as written (strings not yet checked), and where each
//! field starts so a mistake can name its line.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use serde::Deserialize;

use super::k8s::RawK8sNames;
use super::validate::Validator;
use super::{Mistake, Quotas, RegistryError, TenantLimits, TenantRegistry};

/// The registry as written in the file (strings not yet checked).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawRegistry {
    #[serde(default = "default_offset")]
    pub(super) uid_offset: u32,
    #[serde(default = "default_offset")]
    pub(super) gid_offset: u32,
    /// Reserved names and the uid/gid range.
    #[serde(default)]
    pub(super) identities: super::identity::RawIdentities,
    /// Kubernetes names for every tenant (each tenant's own block wins).
    #[serde(default)]
    pub(super) kubernetes: RawK8sNames,
    /// QOS onramp creates or converges (see `super::qos`).
    #[serde(default)]
    pub(super) qos: Vec<super::qos::RawQos>,
    pub(super) tenants: Vec<RawTenant>,
}

fn default_offset() -> u32 {
    4000
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawTenant {
    pub(super) name: String,
    pub(super) group: String,
    pub(super) account: Option<String>,
    pub(super) description: Option<String>,
    #[serde(default)]
    pub(super) limits: TenantLimits,
    #[serde(default)]
    pub(super) user_defaults: RawUserDefaults,
    #[serde(default)]
    pub(super) quotas: Quotas,
    /// The older form of a few Kubernetes names: the login pod is a Ready pod of `deployment`.
    pub(super) login_pod: Option<RawLoginPod>,
    pub(super) kubernetes: Option<RawK8sNames>,
    pub(super) default_team: Option<String>,
    #[serde(default)]
    pub(super) teams: Vec<RawTeam>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawLoginPod {
    pub(super) namespace: String,
    pub(super) deployment: String,
    pub(super) container: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawTeam {
    pub(super) account: String,
    pub(super) group: String,
    pub(super) fairshare: Option<u32>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawUserDefaults {
    pub(super) default_qos: Option<String>,
    #[serde(default)]
    pub(super) qos: Vec<String>,
    pub(super) max_jobs: Option<u32>,
    pub(super) grp_tres_mins: Option<String>,
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
}

/// Where each field path starts in the text (block style; fields of a flow mapping `{a: 1}`
/// share its line). Only used to point at mistakes.
pub(super) struct LineIndex {
    paths: BTreeMap<String, usize>,
}

impl LineIndex {
    pub(super) fn new(text: &str) -> Self {
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
    pub(super) fn line_of(&self, field: &str) -> Option<usize> {
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
