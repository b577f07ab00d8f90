//! Reading a quota back: the limits the filesystem reports, parsed from the CLIs' own output.
//!
//! - Weka: `weka fs quota list <fs> --path <path> --all -J`, a JSON array of quota objects as the
//!   REST API returns them (`path`, `hardLimitBytes`, `softLimitBytes`, `usedBytes`, `status`,
//!   …; 0 or 2^64-4096 means unlimited). Field names are also accepted in snake case.
//! - Lustre: `lfs quota {-u|-g} <name> <mount>`, the table under `Disk quotas for usr alice
//!   (uid 1000):` with `kbytes quota limit grace files quota limit grace` (KiB; a long filesystem
//!   name wraps to its own line; `*` marks an exceeded limit, `[…]` an inaccurate one; 0 is no
//!   limit).

use serde_json::Value;

use super::Quota;

/// What Weka reports for "no limit" besides 0.
const WEKA_UNLIMITED: u64 = 18_446_744_073_709_547_520;

/// Limits as read back, in bytes (`None`: no limit), and the granularity the backend keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct Limits {
    pub hard_bytes: Option<u64>,
    pub soft_bytes: Option<u64>,
    /// 1 for Weka (bytes), 1024 for Lustre (KiB).
    pub unit: u64,
}

impl Limits {
    /// How the limits differ from `want` (empty: they are the same at the backend's granularity).
    pub fn diff(&self, want: Quota) -> Vec<String> {
        let mut out = vec![];
        for (what, got, size) in [("hard", self.hard_bytes, want.hard()), ("soft", self.soft_bytes, want.soft())] {
            let want_units = size.bytes().div_ceil(self.unit);
            let got_units = got.map(|b| b.div_ceil(self.unit));
            if got_units != Some(want_units) {
                let shown = match got {
                    Some(b) => format!("{b} bytes"),
                    None => "no limit".to_string(),
                };
                out.push(format!("{what}: set {size} ({} bytes), read back {shown}", size.bytes()));
            }
        }
        out
    }
}

fn number(v: &Value) -> Option<u64> {
    v.as_u64().or_else(|| v.as_str().and_then(|s| s.trim().parse().ok()))
}

fn limit(bytes: u64) -> Option<u64> {
    (bytes != 0 && bytes < WEKA_UNLIMITED).then_some(bytes)
}

/// The quota of `path` in `weka fs quota list … -J` output: `Ok(None)` when it lists none.
pub fn parse_weka(json: &str, path: &str) -> Result<Option<Limits>, String> {
    let v: Value = serde_json::from_str(json.trim()).map_err(|e| format!("weka quota list: not JSON ({e})"))?;
    let items = match &v {
        Value::Array(a) => a.clone(),
        Value::Object(o) => o.get("data").and_then(Value::as_array).cloned().unwrap_or_else(|| vec![v.clone()]),
        _ => return Err("weka quota list: neither a list nor an object".into()),
    };
    let field = |q: &Value, camel: &str, snake: &str| q.get(camel).or_else(|| q.get(snake)).cloned();
    let trim = |p: &str| p.trim_end_matches('/').to_string();
    // With `--path`, the list holds that one quota; a path field, when present, must match.
    let found = items.iter().find(|q| match field(q, "path", "path").as_ref().and_then(Value::as_str) {
        Some(p) => trim(p) == trim(path) || trim(p).ends_with(&format!(":{}", trim(path))),
        None => items.len() == 1,
    });
    let Some(q) = found else { return Ok(None) };
    let hard = field(q, "hardLimitBytes", "hard_limit_bytes").as_ref().and_then(number);
    let soft = field(q, "softLimitBytes", "soft_limit_bytes").as_ref().and_then(number);
    if hard.is_none() && soft.is_none() {
        return Err(format!("weka quota list: no hardLimitBytes/softLimitBytes in {q}"));
    }
    Ok(Some(Limits { hard_bytes: hard.and_then(limit), soft_bytes: soft.and_then(limit), unit: 1 }))
}

/// The block limits in `lfs quota {-u|-g} <name> <mount>` output: `Ok(None)` when no limit is set.
pub fn parse_lfs(text: &str) -> Result<Option<Limits>, String> {
    let mut lines = text.lines().skip_while(|l| !l.trim_start().starts_with("Filesystem"));
    if lines.next().is_none() {
        return Err(format!("lfs quota: no table in {:?}", text.chars().take(200).collect::<String>()));
    }
    let mut fields: Vec<&str> = vec![];
    for l in lines {
        fields.extend(l.split_whitespace());
        if fields.len() >= 4 {
            break;
        }
    }
    if fields.len() < 4 {
        return Err("lfs quota: the table has no row".into());
    }
    let kib = |s: &str| -> Result<u64, String> {
        s.trim_matches(|c| c == '[' || c == ']' || c == '*').parse().map_err(|_| format!("lfs quota: {s:?} is not KiB"))
    };
    let (soft, hard) = (kib(fields[2])?, kib(fields[3])?);
    if soft == 0 && hard == 0 {
        return Ok(None);
    }
    let bytes = |k: u64| (k != 0).then_some(k * 1024);
    Ok(Some(Limits { hard_bytes: bytes(hard), soft_bytes: bytes(soft), unit: 1024 }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn weka_json() {
        let out = r#"[{"inodeId": 7340033, "path": "/home/alice", "totalBytes": 4096, "usedBytes": 4096,
            "hardLimitBytes": 100000000000, "softLimitBytes": 90000000000, "graceSeconds": 0,
            "owner": "", "status": "ACTIVE"}]"#;
        let l = parse_weka(out, "/home/alice").unwrap().unwrap();
        assert_eq!((l.hard_bytes, l.soft_bytes), (Some(100_000_000_000), Some(90_000_000_000)));
        assert!(l.diff(Quota::parse("100GB", "90GB").unwrap()).is_empty());
        let d = l.diff(Quota::parse("200GB", "90GB").unwrap());
        assert_eq!(d, ["hard: set 200GB (200000000000 bytes), read back 100000000000 bytes"]);
        assert_eq!(parse_weka("[]", "/home/alice").unwrap(), None);
        assert_eq!(parse_weka(out, "/home/bob").unwrap(), None);
        // filesystem:/path form, snake case, unlimited soft
        let fs =
            r#"[{"path": "home:/home/alice", "hard_limit_bytes": "1000", "soft_limit_bytes": 18446744073709547520}]"#;
        let l = parse_weka(fs, "/home/alice").unwrap().unwrap();
        assert_eq!((l.hard_bytes, l.soft_bytes), (Some(1000), None));
        assert!(parse_weka("error: no such path", "/x").is_err());
    }

    #[test]
    fn lfs_table() {
        let out = "Disk quotas for usr alice (uid 1000):\n     Filesystem  kbytes   quota   limit   grace   files   quota   limit   grace\n          /home       4  87890625 97656250       -       1       0       0       -\n";
        let l = parse_lfs(out).unwrap().unwrap();
        assert_eq!((l.hard_bytes, l.soft_bytes), (Some(97_656_250 * 1024), Some(87_890_625 * 1024)));
        assert!(
            l.diff(Quota::parse("100GB", "90GB").unwrap()).is_empty(),
            "{:?}",
            l.diff(Quota::parse("100GB", "90GB").unwrap())
        );
        // a long mount point wraps; inaccurate values are bracketed, exceeded ones starred
        let wrapped = "Disk quotas for grp tenant-foo (gid 2000):\n     Filesystem  kbytes   quota   limit   grace   files   quota   limit   grace\n/lustre/tenants/tenant-foo/scratch\n                [1041408]*  5242880 6291456       -     [0]       0       0       -\ngid 2000 is using default file quota setting\n";
        let l = parse_lfs(wrapped).unwrap().unwrap();
        assert_eq!((l.hard_bytes, l.soft_bytes), (Some(6_291_456 * 1024), Some(5_242_880 * 1024)));
        let none = "Disk quotas for usr bob (uid 1001):\n     Filesystem  kbytes   quota   limit   grace   files   quota   limit   grace\n          /home       0       0       0       -       0       0       0       -\n";
        assert_eq!(parse_lfs(none).unwrap(), None);
        assert!(parse_lfs("lfs quota: '/x' not on a mounted Lustre filesystem").is_err());
    }
}
