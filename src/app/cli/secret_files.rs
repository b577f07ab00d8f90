//! Secrets as files: each secret setting `NAME` can instead be given as `NAME_FILE`, the path of a
//! file holding the value (a mounted Kubernetes Secret, a systemd credential under
//! `$CREDENTIALS_DIRECTORY`). The file is read before clap looks at the environment, and its
//! content becomes `NAME`, so the rest of the program sees one setting either way.
//!
//! Rules: `NAME` and `NAME_FILE` both set is an error naming both; an unreadable or empty file is
//! an error naming the variable and the path, never the content; trailing newlines (`\n`, `\r\n`)
//! are trimmed. For the comma-separated lists (webhook secrets and tokens) newlines inside the
//! file separate values too, so a file may hold one secret per line.
//!
//! `ONRAMP_AUTHENTIK_TOKEN_FILE` is not here: it is a flag of its own (`--authentik-token-file`).

use std::ffi::OsString;
use std::path::Path;

/// The secret settings that may come from a file, and whether the value is a comma-separated list.
pub const SECRET_SETTINGS: &[(&str, bool)] = &[
    ("DATABASE_URL", false),
    ("ONRAMP_API_TOKEN", false),
    ("ONRAMP_WEBHOOK_SECRETS", true),
    ("ONRAMP_WEBHOOK_TOKENS", true),
    ("ONRAMP_SMTP_URL", false),
    ("ONRAMP_SLACK_WEBHOOK_URL", false),
];

/// Reads every `NAME_FILE` that is set (looked up with `var`) and returns the `(NAME, value)`
/// pairs to put into the environment. Errors are one line and never contain a secret.
pub fn resolve(var: impl Fn(&str) -> Option<OsString>) -> Result<Vec<(&'static str, String)>, String> {
    let mut out = Vec::new();
    for &(name, list) in SECRET_SETTINGS {
        let file_var = format!("{name}_FILE");
        let Some(path) = var(&file_var) else { continue };
        if var(name).is_some() {
            return Err(format!("both {name} and {file_var} are set; set one of them"));
        }
        let path = Path::new(&path);
        let text =
            std::fs::read_to_string(path).map_err(|e| format!("cannot read {file_var} {}: {e}", path.display()))?;
        let value = text.trim_end_matches(['\n', '\r']);
        let value = if list {
            value.lines().map(str::trim).filter(|l| !l.is_empty()).collect::<Vec<_>>().join(",")
        } else {
            value.to_string()
        };
        if value.is_empty() {
            return Err(format!("{file_var} {} is empty", path.display()));
        }
        out.push((name, value));
    }
    Ok(out)
}

/// Puts the secrets of the `*_FILE` settings into the environment.
///
/// Called only from [`super::parse`], which `main` calls first: no runtime and no other thread
/// exists yet, so `set_var` cannot race a reader of the environment.
pub(super) fn load() -> Result<(), String> {
    for (name, value) in resolve(|k| std::env::var_os(k))? {
        // SAFETY: single-threaded: see above (the same argument as for the settings file).
        unsafe { std::env::set_var(name, value) };
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::path::PathBuf;

    use super::*;

    struct Dir(PathBuf);
    impl Dir {
        fn new(tag: &str) -> Dir {
            let d = std::env::temp_dir().join(format!("onramp-secret-files-{tag}-{}", std::process::id()));
            std::fs::create_dir_all(&d).unwrap();
            Dir(d)
        }
        fn file(&self, name: &str, content: &str) -> String {
            let p = self.0.join(name);
            std::fs::write(&p, content).unwrap();
            p.display().to_string()
        }
    }
    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn run(env: &[(&str, &str)]) -> Result<Vec<(&'static str, String)>, String> {
        let env: HashMap<String, OsString> = env.iter().map(|(k, v)| (k.to_string(), OsString::from(v))).collect();
        resolve(|k| env.get(k).cloned())
    }

    #[test]
    fn file_becomes_the_setting_with_trailing_newline_trimmed() {
        let d = Dir::new("ok");
        let db = d.file("db", "postgres://u:p@db/onramp\n");
        let tok = d.file("tok", "s3cret\r\n");
        let got = run(&[("DATABASE_URL_FILE", &db), ("ONRAMP_API_TOKEN_FILE", &tok), ("ONRAMP_LEASE", "5s")]).unwrap();
        assert_eq!(
            got,
            vec![("DATABASE_URL", "postgres://u:p@db/onramp".into()), ("ONRAMP_API_TOKEN", "s3cret".into())]
        );
        assert_eq!(run(&[("DATABASE_URL", "postgres://x")]).unwrap(), vec![]);
    }

    #[test]
    fn list_files_take_one_value_per_line_or_commas() {
        let d = Dir::new("list");
        let lines = d.file("lines", "whsec_a\nwhsec_b\n\n");
        let commas = d.file("commas", "t1,t2\n");
        let got = run(&[("ONRAMP_WEBHOOK_SECRETS_FILE", &lines), ("ONRAMP_WEBHOOK_TOKENS_FILE", &commas)]).unwrap();
        assert_eq!(
            got,
            vec![("ONRAMP_WEBHOOK_SECRETS", "whsec_a,whsec_b".into()), ("ONRAMP_WEBHOOK_TOKENS", "t1,t2".into())]
        );
    }

    #[test]
    fn every_secret_setting_is_a_hidden_setting_of_the_cli() {
        fn envs(cmd: &clap::Command, out: &mut Vec<(String, bool)>) {
            for a in cmd.get_arguments() {
                if let Some(e) = a.get_env() {
                    out.push((e.to_string_lossy().into_owned(), a.is_hide_env_values_set()));
                }
            }
            cmd.get_subcommands().for_each(|s| envs(s, out));
        }
        let mut all = Vec::new();
        envs(&<super::super::Cli as clap::CommandFactory>::command(), &mut all);
        for (name, _) in SECRET_SETTINGS {
            assert!(all.iter().any(|(e, hidden)| e == name && *hidden), "{name} is no hidden setting");
            assert!(!all.iter().any(|(e, _)| *e == format!("{name}_FILE")), "{name}_FILE is a flag too");
        }
    }

    #[test]
    fn both_set_is_an_error_naming_both() {
        let d = Dir::new("both");
        let f = d.file("smtp", "smtp://mail:25\n");
        let e = run(&[("ONRAMP_SMTP_URL", "smtp://other"), ("ONRAMP_SMTP_URL_FILE", &f)]).unwrap_err();
        assert!(e.contains("ONRAMP_SMTP_URL ") && e.contains("ONRAMP_SMTP_URL_FILE"), "{e}");
        assert!(!e.contains("smtp://"), "{e}");
    }

    #[test]
    fn unreadable_or_empty_file_names_variable_and_path_never_content() {
        let d = Dir::new("bad");
        let missing = d.0.join("missing").display().to_string();
        let e = run(&[("ONRAMP_SLACK_WEBHOOK_URL_FILE", &missing)]).unwrap_err();
        assert!(e.starts_with("cannot read ONRAMP_SLACK_WEBHOOK_URL_FILE") && e.contains(&missing), "{e}");
        let empty = d.file("empty", "\n");
        let e = run(&[("DATABASE_URL_FILE", &empty)]).unwrap_err();
        assert_eq!(e, format!("DATABASE_URL_FILE {empty} is empty"));
        // not UTF-8: the error says so without echoing the bytes
        let p = d.0.join("binary");
        std::fs::write(&p, [0xff, 0xfe, b'z', b'q', b'x']).unwrap();
        let e = run(&[("ONRAMP_API_TOKEN_FILE", &p.display().to_string())]).unwrap_err();
        assert!(e.starts_with("cannot read ONRAMP_API_TOKEN_FILE") && !e.contains("zqx"), "{e}");
    }
}
