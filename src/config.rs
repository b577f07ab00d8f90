//! Settings: every one is a command-line flag with an environment variable of its own, listed
//! with its default in `--help`. An optional file (`--config`, `ONRAMP_CONFIG`) holds
//! `NAME=value` lines using the same environment names; the real environment wins over it.

use std::fmt;
use std::path::Path;
use std::time::Duration;

/// Parses `500ms`, `10s`, `5m`, `2h`, `30d`.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let n: u64 = num.parse().map_err(|_| format!("{s:?} is not a duration like 500ms, 10s, 5m, 2h or 30d"))?;
    let ms = match unit {
        "ms" => 1,
        "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        _ => {
            return Err(format!("{s:?} has no unit: write it like 500ms, 10s, 5m, 2h or 30d"));
        }
    };
    n.checked_mul(ms).map(Duration::from_millis).ok_or_else(|| format!("{s:?} is too long"))
}

/// Formats a duration the way `parse_duration` reads it.
pub fn format_duration(d: Duration) -> String {
    let ms = d.as_millis();
    for (unit, size) in [("d", 86_400_000), ("h", 3_600_000), ("m", 60_000), ("s", 1_000)] {
        if ms >= size && ms.is_multiple_of(size) {
            return format!("{}{unit}", ms / size);
        }
    }
    format!("{ms}ms")
}

/// A value that must never reach a log line, an error message or a page.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    pub fn new(s: impl Into<String>) -> Self {
        Self(s.into())
    }
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[redacted]")
    }
}

impl std::str::FromStr for Secret {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        if s.is_empty() { Err("must not be empty".into()) } else { Ok(Self(s.into())) }
    }
}

/// Reads a settings file of `NAME=value` lines (blank lines and `#` comments allowed) and returns
/// the pairs. Errors name the file and line.
pub fn read_settings_file(path: &Path) -> Result<Vec<(String, String)>, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("settings file {}: {e}", path.display()))?;
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let Some((k, v)) = line.split_once('=') else {
            return Err(format!("settings file {}:{}: expected NAME=value", path.display(), n + 1));
        };
        let k = k.trim();
        if k.is_empty() || !k.chars().all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_') {
            return Err(format!("settings file {}:{}: {k:?} is not a setting name", path.display(), n + 1));
        }
        let v = v.trim();
        let v = v.strip_prefix('"').and_then(|v| v.strip_suffix('"')).unwrap_or(v);
        out.push((k.to_string(), v.to_string()));
    }
    Ok(out)
}

/// Compares secrets in time independent of where they differ.
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_round_trip() {
        for (s, ms) in [("500ms", 500), ("10s", 10_000), ("5m", 300_000), ("2h", 7_200_000), ("30d", 2_592_000_000)] {
            assert_eq!(parse_duration(s), Ok(Duration::from_millis(ms)));
            assert_eq!(format_duration(Duration::from_millis(ms)), s);
        }
        assert!(parse_duration("10").unwrap_err().contains("no unit"));
        assert!(parse_duration("ten s").is_err());
        assert!(parse_duration("99999999999999999d").unwrap_err().contains("too long"));
    }

    #[test]
    fn settings_file_lines() {
        let dir = std::env::temp_dir().join(format!("onramp-cfg-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("onramp.env");
        std::fs::write(&p, "# comment\n\nONRAMP_LEASE = 5s\nONRAMP_ROLE=\"worker\"\n").unwrap();
        assert_eq!(
            read_settings_file(&p).unwrap(),
            vec![("ONRAMP_LEASE".into(), "5s".into()), ("ONRAMP_ROLE".into(), "worker".into())]
        );
        std::fs::write(&p, "ONRAMP_LEASE=5s\nnonsense\n").unwrap();
        assert!(read_settings_file(&p).unwrap_err().ends_with("onramp.env:2: expected NAME=value"));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn secrets_do_not_print() {
        assert_eq!(format!("{:?}", Secret::new("hunter2")), "[redacted]");
    }

    #[test]
    fn constant_time_eq_compares() {
        assert!(constant_time_eq(b"abc", b"abc"));
        assert!(!constant_time_eq(b"abc", b"abd"));
        assert!(!constant_time_eq(b"abc", b"abcd"));
    }
}
