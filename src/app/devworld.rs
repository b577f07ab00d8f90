//! How the command line finds a running `onramp dev`: while it runs, dev keeps a settings file
//! (`.onramp-dev/onramp.env`: its `DATABASE_URL` and `ONRAMP_TENANTS`, no secret) in its folder,
//! and removes it when it stops. `onramp jobs`, `plan`, `token` and `tenant` started in that
//! folder or below it read that file when nothing else says where onramp is (no `--config`,
//! `ONRAMP_CONFIG`, `DATABASE_URL` or `ONRAMP_TENANTS`), so they need no flags against dev.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

/// The settings file's name inside the dev folder.
pub const ENV_FILE: &str = "onramp.env";
/// The demo registry's name inside the dev folder.
pub const TENANTS_FILE: &str = "tenants.yaml";
/// The dev folder's default name (`--dev-dir`, `ONRAMP_DEV_DIR`).
pub const DEFAULT_DIR: &str = ".onramp-dev";

/// The commands that use a running dev world found this way; never `serve` (its real backends
/// would run dev's jobs) nor `dev` itself.
const COMMANDS: &[&str] = &["jobs", "plan", "token", "tenant"];

/// The settings file's text: what the CLI needs to reach the dev world.
pub fn env_file(database_url: &str, tenants: &Path) -> String {
    format!(
        "# Written by `onramp dev` while it runs, removed when it stops. `onramp jobs`, `plan`, `token` and\n\
         # `tenant` started in this folder (or below it) read it when no other settings say where onramp is.\n\
         DATABASE_URL={database_url}\nONRAMP_TENANTS={}\n",
        tenants.display()
    )
}

/// The settings file of a running dev world that the command of `args` should read, if any.
pub fn settings_for(args: &[OsString], var: impl Fn(&str) -> Option<OsString>, cwd: &Path) -> Option<PathBuf> {
    let command = subcommand(args)?;
    if !COMMANDS.contains(&command.as_str()) {
        return None;
    }
    let elsewhere = ["ONRAMP_CONFIG", "DATABASE_URL", "ONRAMP_TENANTS", "DATABASE_URL_FILE"];
    if elsewhere.iter().any(|v| var(v).is_some()) {
        return None;
    }
    let flags = ["--config", "--database-url", "--tenants"];
    if args.iter().filter_map(|a| a.to_str()).any(|a| flags.iter().any(|f| a == *f || a.starts_with(&format!("{f}="))))
    {
        return None;
    }
    let dir = var("ONRAMP_DEV_DIR").map_or_else(|| PathBuf::from(DEFAULT_DIR), PathBuf::from);
    if dir.is_absolute() {
        let f = dir.join(ENV_FILE);
        return f.is_file().then_some(f);
    }
    cwd.ancestors().map(|d| d.join(&dir).join(ENV_FILE)).find(|f| f.is_file())
}

/// The subcommand's name: the first argument that is neither a global flag nor its value.
fn subcommand(args: &[OsString]) -> Option<String> {
    let mut it = args.iter().skip(1).filter_map(|a| a.to_str());
    while let Some(a) = it.next() {
        if ["--config", "--log", "--log-format"].contains(&a) {
            it.next();
        } else if !a.starts_with('-') {
            return Some(a.to_string());
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(a: &[&str]) -> Vec<OsString> {
        a.iter().map(OsString::from).collect()
    }

    #[test]
    fn the_cli_finds_a_running_dev_world_above_it_and_only_when_nothing_else_is_set() {
        let root = tempfile::tempdir().unwrap();
        let dev = root.path().join(DEFAULT_DIR);
        std::fs::create_dir_all(&dev).unwrap();
        let below = root.path().join("src/deep");
        std::fs::create_dir_all(&below).unwrap();
        let none = |_: &str| None;
        let at = |a: &[&str], cwd: &Path| settings_for(&args(a), none, cwd);
        // dev not running: no file
        assert_eq!(at(&["onramp", "jobs", "list"], &below), None);
        std::fs::write(dev.join(ENV_FILE), env_file("postgres://onramp@127.0.0.1:1/postgres", Path::new("/t")))
            .unwrap();
        let want = Some(dev.join(ENV_FILE));
        assert_eq!(at(&["onramp", "jobs", "list"], &below), want);
        assert_eq!(at(&["onramp", "--log", "warn", "plan", "user.onboard"], root.path()), want);
        // serve and dev never; nor when the command names its database or registry
        assert_eq!(at(&["onramp", "serve"], root.path()), None);
        assert_eq!(at(&["onramp", "dev"], root.path()), None);
        assert_eq!(at(&["onramp", "jobs", "list", "--database-url=postgres://x"], root.path()), None);
        assert_eq!(at(&["onramp", "plan", "x", "--tenants", "/etc/t.yaml"], root.path()), None);
        let db = |k: &str| (k == "DATABASE_URL").then(|| OsString::from("postgres://real"));
        assert_eq!(settings_for(&args(&["onramp", "jobs", "list"]), db, root.path()), None);
        // ONRAMP_DEV_DIR names the folder
        let named = |k: &str| (k == "ONRAMP_DEV_DIR").then(|| dev.clone().into_os_string());
        assert_eq!(settings_for(&args(&["onramp", "token", "list"]), named, Path::new("/")), want);
        // the file is a settings file the CLI reads
        let pairs = crate::app::settings_file::read_settings_file(&dev.join(ENV_FILE)).unwrap();
        let names: Vec<&str> = pairs.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(names, ["DATABASE_URL", "ONRAMP_TENANTS"]);
    }
}
