//! Slurm's values, checked: count limits, fair shares, trackable resources (TRES), free text
//! and paths on the Slurm host.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

use crate::domain::names::NameError;

/// A count limit (`GrpJobs`, `MaxJobs`, …). Slurm shows an unset limit as an empty field and
/// clears one when given `-1`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Limit {
    Unlimited,
    At(u64),
}

impl Limit {
    /// The value as a `sacctmgr … set` argument.
    pub fn arg(self) -> String {
        match self {
            Limit::Unlimited => "-1".into(),
            Limit::At(n) => n.to_string(),
        }
    }
}

impl fmt::Display for Limit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Limit::Unlimited => f.write_str("unlimited"),
            Limit::At(n) => write!(f, "{n}"),
        }
    }
}

/// `Fairshare=parent` (inherit the parent's share) or a number of shares.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Fairshare {
    Parent,
    Shares(u32),
}

impl Fairshare {
    pub fn arg(self) -> String {
        match self {
            Fairshare::Parent => "parent".into(),
            Fairshare::Shares(n) => n.to_string(),
        }
    }
}

/// Trackable resources with counts, e.g. `cpu=8,gres/gpu=4` (GrpTRES) or `gres/gpu=10000`
/// (GrpTRESMins). Memory is kept in megabytes (Slurm shows `mem=2G`, accepts `mem=2048`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "BTreeMap<String, u64>", into = "BTreeMap<String, u64>")]
pub struct Tres(BTreeMap<String, u64>);

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("TRES {value:?}: {why}")]
pub struct TresError {
    pub value: String,
    pub why: &'static str,
}

fn check_tres_name(name: &str) -> Result<(), TresError> {
    let ok = !name.is_empty()
        && name.as_bytes()[0].is_ascii_lowercase()
        && name.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || "/_:-".contains(c));
    if ok { Ok(()) } else { Err(TresError { value: name.into(), why: "not a TRES name like cpu or gres/gpu" }) }
}

impl Tres {
    pub fn new() -> Self {
        Self::default()
    }
    /// Adds `name=count`; the name must look like a TRES name (`cpu`, `mem`, `gres/gpu`).
    pub fn with(mut self, name: &str, count: u64) -> Result<Self, TresError> {
        check_tres_name(name)?;
        self.0.insert(name.to_string(), count);
        Ok(self)
    }
    /// Just `gres/gpu=n`.
    pub fn gpus(n: u64) -> Self {
        Self(BTreeMap::from([("gres/gpu".to_string(), n)]))
    }
    pub fn get(&self, name: &str) -> Option<u64> {
        self.0.get(name).copied()
    }
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Parses Slurm's form (`cpu=8,gres/gpu=4,mem=2G`); empty means none.
    pub fn parse(s: &str) -> Result<Self, TresError> {
        let mut map = BTreeMap::new();
        for item in s.split(',').filter(|i| !i.is_empty()) {
            let bad = |why| TresError { value: item.to_string(), why };
            let (name, value) = item.split_once('=').ok_or_else(|| bad("expected name=count"))?;
            check_tres_name(name)?;
            let digits_end = value.find(|c: char| !c.is_ascii_digit()).unwrap_or(value.len());
            let n: u64 = value[..digits_end].parse().map_err(|_| bad("the count is not a number"))?;
            let scale: u64 = match &value[digits_end..] {
                "" | "M" => 1,
                "G" => 1 << 10,
                "T" => 1 << 20,
                "P" => 1 << 30,
                _ => return Err(bad("unknown unit")),
            };
            let n = n.checked_mul(scale).ok_or_else(|| bad("the count is too large"))?;
            map.insert(name.to_string(), n);
        }
        Ok(Self(map))
    }

    /// The `set GrpTRES=…` argument that turns `current` into `self`: changed and new counts,
    /// and `-1` for every count `self` no longer has. `None` when they are equal.
    pub fn update_from(&self, current: &Tres) -> Option<String> {
        let mut parts: Vec<String> =
            self.0.iter().filter(|(k, v)| current.0.get(*k) != Some(v)).map(|(k, v)| format!("{k}={v}")).collect();
        parts.extend(current.0.keys().filter(|k| !self.0.contains_key(*k)).map(|k| format!("{k}=-1")));
        (!parts.is_empty()).then(|| parts.join(","))
    }
}

impl fmt::Display for Tres {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let parts: Vec<String> = self.0.iter().map(|(k, v)| format!("{k}={v}")).collect();
        f.write_str(&parts.join(","))
    }
}

impl TryFrom<BTreeMap<String, u64>> for Tres {
    type Error = TresError;
    fn try_from(m: BTreeMap<String, u64>) -> Result<Self, TresError> {
        m.keys().try_for_each(|k| check_tres_name(k))?;
        Ok(Self(m))
    }
}

impl From<Tres> for BTreeMap<String, u64> {
    fn from(t: Tres) -> Self {
        t.0
    }
}

/// Free text Slurm stores for an account (Description, Organization): letters, digits, spaces
/// and `-_.()&`, up to 100 characters, not starting with `-` or a space. Slurm lower-cases it.
#[derive(Clone, PartialEq, Eq, Serialize)]
#[serde(transparent)]
pub struct SlurmText(String);

impl SlurmText {
    pub fn parse(s: &str) -> Result<Self, NameError> {
        let err = |why| Err(NameError { kind: "Slurm text", value: s.chars().take(80).collect(), why });
        if s.is_empty() || s.len() > 100 {
            return err("it must have 1 to 100 characters");
        }
        if s.starts_with(['-', ' ']) || s.ends_with(' ') {
            return err("it must not start with - or a space, nor end with a space");
        }
        if !s.chars().all(|c| c.is_ascii_alphanumeric() || " -_.()&".contains(c)) {
            return err("only letters, digits, spaces and -_.()& are allowed");
        }
        Ok(Self(s.to_string()))
    }
    pub fn as_str(&self) -> &str {
        &self.0
    }
    /// Slurm stores text lower-cased; compare that way.
    pub fn matches(&self, stored: &str) -> bool {
        self.0.eq_ignore_ascii_case(stored)
    }
}

impl fmt::Debug for SlurmText {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SlurmText({:?})", self.0)
    }
}

impl<'de> Deserialize<'de> for SlurmText {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Self::parse(&String::deserialize(d)?).map_err(serde::de::Error::custom)
    }
}

/// An absolute path on the Slurm host (where the commands run): `/` and `[A-Za-z0-9._-]` components,
/// no `.` or `..` components.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(transparent)]
pub struct HostPath(String);

impl HostPath {
    pub fn parse(s: &str) -> Result<Self, NameError> {
        let err = |why| Err(NameError { kind: "host path", value: s.chars().take(80).collect(), why });
        if !s.starts_with('/') || s.len() > 200 {
            return err("it must be an absolute path of at most 200 characters");
        }
        let parts: Vec<&str> = s.split('/').skip(1).filter(|p| !p.is_empty()).collect();
        if parts.iter().any(|p| *p == "." || *p == ".." || p.starts_with('-')) {
            return err("no ., .. or components starting with -");
        }
        if !parts.iter().all(|p| p.chars().all(|c| c.is_ascii_alphanumeric() || "._-".contains(c))) {
            return err("only letters, digits and ._- in components");
        }
        Ok(Self(s.to_string()))
    }
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tres_parses_slurm_form_with_units() {
        let t = Tres::parse("cpu=8,gres/gpu=4,mem=2G").unwrap();
        assert_eq!((t.get("cpu"), t.get("gres/gpu"), t.get("mem")), (Some(8), Some(4), Some(2048)));
        assert!(Tres::parse("").unwrap().is_empty());
        assert!(Tres::parse("cpu").is_err());
        assert!(Tres::parse("cpu=x").is_err());
        assert!(Tres::parse("CPU=1").is_err());
        // found by tests/it/fuzz.rs: a count past u64 after its unit was a panic
        assert!(Tres::parse("mem=18446744073709551615G").is_err());
        assert_eq!(t.to_string(), "cpu=8,gres/gpu=4,mem=2048");
    }

    #[test]
    fn tres_update_sets_changes_and_clears_what_is_gone() {
        let cur = Tres::parse("cpu=8,gres/gpu=4").unwrap();
        assert_eq!(Tres::gpus(8).update_from(&cur).as_deref(), Some("gres/gpu=8,cpu=-1"));
        assert_eq!(cur.update_from(&cur), None);
        assert_eq!(Tres::new().update_from(&Tres::gpus(1)).as_deref(), Some("gres/gpu=-1"));
        assert!(Tres::new().with("gres/gpu", 1).is_ok());
        assert!(Tres::new().with("gpu=1,cpu", 1).is_err());
    }

    #[test]
    fn text_and_dirs_are_checked() {
        assert!(SlurmText::parse("Tenant Foo (ML) & co.").is_ok());
        for bad in ["", "-x", " x", "a=b", "a,b", "a'b", "a\"b", "x$y", "é"] {
            assert!(SlurmText::parse(bad).is_err(), "{bad:?}");
        }
        assert!(SlurmText::parse("Tenant Foo").unwrap().matches("tenant foo"));
        assert!(HostPath::parse("/var/spool/slurm/archive").is_ok());
        for bad in ["rel", "/a/../b", "/a/-x", "/a b", "/a;b"] {
            assert!(HostPath::parse(bad).is_err(), "{bad:?}");
        }
    }
}
