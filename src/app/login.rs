//! Who runs the command line, for the audit trail (`cli:<login>`): the person behind `sudo`
//! (`$SUDO_USER`), else `$USER`, else the name of the process's user id (the passwd file, then
//! `id -un` for directory users), else `uid<N>`; never a placeholder.

use crate::engine::Actor;

/// The audit actor of a CLI command.
pub fn cli_actor() -> Actor {
    Actor::cli(&login_name())
}

/// The login name of whoever runs this process.
pub fn login_name() -> String {
    let uid = real_uid();
    name_from(|k| std::env::var(k).ok(), uid, std::fs::read_to_string("/etc/passwd").ok().as_deref())
        .or_else(id_un)
        .unwrap_or_else(|| uid.map_or("uid-unknown".into(), |u| format!("uid{u}")))
}

/// The environment's names, then the passwd file's entry for `uid`.
fn name_from(var: impl Fn(&str) -> Option<String>, uid: Option<u32>, passwd: Option<&str>) -> Option<String> {
    let usable = |v: Option<String>| v.map(|v| v.trim().to_string()).filter(|v| !v.is_empty() && is_name(v));
    usable(var("SUDO_USER")).or_else(|| usable(var("USER"))).or_else(|| {
        let uid = uid?.to_string();
        passwd?.lines().find_map(|l| {
            let mut f = l.split(':');
            let name = f.next()?;
            (f.nth(1)? == uid && is_name(name)).then(|| name.to_string())
        })
    })
}

/// A login name as it may appear in the audit trail: no spaces, colons or control characters.
fn is_name(s: &str) -> bool {
    s.len() <= 64 && s.chars().all(|c| c.is_ascii_alphanumeric() || "._-@$".contains(c))
}

/// The real user id, from /proc (no libc call needed).
fn real_uid() -> Option<u32> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    status.lines().find_map(|l| l.strip_prefix("Uid:"))?.split_whitespace().next()?.parse().ok()
}

/// `id -un`: the name from the system's user database (LDAP, SSSD, …).
fn id_un() -> Option<String> {
    let out = std::process::Command::new("id").arg("-un").output().ok()?;
    let name = String::from_utf8(out.stdout).ok()?.trim().to_string();
    (out.status.success() && is_name(&name)).then_some(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &'static [(&'static str, &'static str)]) -> impl Fn(&str) -> Option<String> {
        move |k| pairs.iter().find(|(n, _)| *n == k).map(|(_, v)| v.to_string())
    }

    const PASSWD: &str = "root:x:0:0:root:/root:/bin/bash\nalice:x:1000:1000:Alice:/home/alice:/bin/sh\n";

    #[test]
    fn sudo_user_then_user_then_the_uids_name() {
        assert_eq!(name_from(env(&[("SUDO_USER", "bob"), ("USER", "root")]), Some(0), Some(PASSWD)).unwrap(), "bob");
        assert_eq!(name_from(env(&[("USER", "carol")]), Some(0), Some(PASSWD)).unwrap(), "carol");
        assert_eq!(name_from(env(&[("USER", "")]), Some(1000), Some(PASSWD)).unwrap(), "alice");
        assert_eq!(name_from(env(&[]), Some(0), Some(PASSWD)).unwrap(), "root");
        assert_eq!(name_from(env(&[]), Some(4242), Some(PASSWD)), None);
        // a name that could forge an audit entry is not taken
        assert_eq!(name_from(env(&[("USER", "x worker:1")]), Some(1000), Some(PASSWD)).unwrap(), "alice");
    }

    #[test]
    fn this_process_has_a_name() {
        assert!(is_name(&login_name()));
    }
}
