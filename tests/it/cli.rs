//! The binary's command line: help lists every setting, mistakes are one line naming the setting.

use std::process::{Command, Output};

/// Runs the binary with only PATH and `env` in its environment.
pub fn onramp(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_onramp"));
    c.args(args).env_clear().env("PATH", std::env::var("PATH").unwrap_or_default());
    for (k, v) in env {
        c.env(k, v);
    }
    c.output().unwrap()
}

fn stderr_line(o: &Output) -> String {
    let e = String::from_utf8_lossy(&o.stderr).to_string();
    assert_eq!(e.trim_end().lines().count(), 1, "expected one line, got: {e}");
    e.trim_end().to_string()
}

#[test]
fn help_lists_every_setting_with_its_environment_variable_and_default() {
    let o = onramp(&["serve", "--help"], &[]);
    assert!(o.status.success());
    let help = String::from_utf8_lossy(&o.stdout);
    for (env, default) in [
        ("DATABASE_URL", None),
        ("ONRAMP_DB_POOL_SIZE", Some("16")),
        ("ONRAMP_ROLE", Some("both")),
        ("ONRAMP_LISTEN", Some("0.0.0.0:8080")),
        ("ONRAMP_WORKER_CONCURRENCY", Some("32")),
        ("ONRAMP_LEASE", Some("10s")),
        ("ONRAMP_POLL_INTERVAL", Some("5s")),
        ("ONRAMP_SHUTDOWN_GRACE", Some("30s")),
        ("ONRAMP_LOG", Some("info")),
        ("ONRAMP_CONFIG", None),
    ] {
        let at = help.find(&format!("[env: {env}")).unwrap_or_else(|| panic!("{env} missing from help:\n{help}"));
        if let Some(d) = default {
            let rest = &help[at..];
            assert!(
                rest[..rest.find("\n\n").unwrap_or(rest.len())].contains(&format!("[default: {d}]")),
                "{env} default"
            );
        }
    }
}

#[test]
fn a_missing_setting_is_one_line_that_names_it() {
    let o = onramp(&["migrate"], &[]);
    assert_eq!(o.status.code(), Some(2));
    assert_eq!(stderr_line(&o), "onramp: missing setting: --database-url <URL> (environment: DATABASE_URL)");
}

#[test]
fn a_malformed_setting_from_the_environment_is_one_line_that_names_it() {
    let o = onramp(&["serve"], &[("DATABASE_URL", "postgres://x@127.0.0.1/x"), ("ONRAMP_LEASE", "soon")]);
    assert_eq!(o.status.code(), Some(2));
    let line = stderr_line(&o);
    assert!(line.contains("--lease") && line.contains("ONRAMP_LEASE") && line.contains("soon"), "{line}");
}

#[test]
fn the_settings_file_is_read_and_its_mistakes_name_file_and_line() {
    let dir = std::env::temp_dir().join(format!("onramp-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("onramp.env");
    std::fs::write(&file, "DATABASE_URL=postgres://x@127.0.0.1/x\nONRAMP_ROLE=sideways\n").unwrap();
    let o = onramp(&["serve", "--config", file.to_str().unwrap()], &[]);
    let line = stderr_line(&o);
    assert!(line.contains("sideways") && line.contains("ONRAMP_ROLE"), "{line}");
    std::fs::write(&file, "# ok\nthis is not a setting\n").unwrap();
    let o = onramp(&["migrate"], &[("ONRAMP_CONFIG", file.to_str().unwrap())]);
    assert!(stderr_line(&o).ends_with("onramp.env:2: expected NAME=value"));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_database_that_does_not_answer_is_one_line_without_the_password() {
    let o = onramp(&["migrate"], &[("DATABASE_URL", "postgres://onramp:hunter2@127.0.0.1:1/onramp")]);
    assert_eq!(o.status.code(), Some(1));
    let line = stderr_line(&o);
    assert!(line.starts_with("onramp: cannot connect to PostgreSQL at onramp@127.0.0.1:1/onramp"), "{line}");
    assert!(!line.contains("hunter2"));
}
