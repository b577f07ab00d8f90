//! An optional settings file (`--config`, `ONRAMP_CONFIG`) holds `NAME=value` lines using the
//! same environment names as the flags; the real environment wins over it.

use std::path::Path;

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

#[cfg(test)]
mod tests {
    use super::*;

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
}
