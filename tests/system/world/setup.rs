//! How the world lays out its directory and gives each process its environment, as deploy/base
//! would in a cluster.

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use super::{Options, deploy};

/// A process's environment as deploy/base gives it: the ConfigMap `onramp-settings` (its
/// literals, then the site's), the container's own env with its mounts' paths moved into the
/// world's directory (the registry; the Secret's items it mounts, copied into a directory of
/// the pod's own), then the scenario's overrides.
pub fn env(
    c: &deploy::Container,
    pod: &str,
    site: &BTreeMap<String, String>,
    opts: &Options,
    d: &Path,
) -> BTreeMap<String, String> {
    let mut e = BTreeMap::new();
    if c.settings_env {
        e.extend(deploy::settings_literals());
        e.extend(site.clone());
    }
    let local = |v: &deploy::Volume| match v {
        deploy::Volume::ConfigMap(name) if name == "onramp-tenants" => Some(d.join("config").display().to_string()),
        deploy::Volume::Secret(items) => {
            let dir = d.join("mounts").join(pod);
            std::fs::create_dir_all(&dir).unwrap();
            for (key, file) in items {
                std::fs::copy(d.join("secret").join(key), dir.join(file))
                    .unwrap_or_else(|e| panic!("the Secret onramp has no {key}: {e}"));
            }
            Some(dir.display().to_string())
        }
        _ => None,
    };
    e.extend(c.env_in(pod, local));
    e.extend(opts.settings.clone());
    e
}

/// The world's directory: logs, the mounted files, the login pods' $HOME root, skeleton and
/// `authorized_keys.d`, the fake storage CLI (`onramp-fakes` as `weka`), the archive directory,
/// the maildir.
pub fn layout(d: &Path, fakes_bin: &Path) {
    // (not mail/: aiosmtpd makes its maildir)
    for sub in ["logs", "config", "secret", "site", "mounts", "home", "skel", "keys", "storage", "archive"] {
        std::fs::create_dir_all(d.join(sub)).unwrap();
    }
    std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::write(d.join("skel/.bashrc"), "# skel\n").unwrap();
    std::os::unix::fs::symlink(fakes_bin, d.join("storage/weka")).unwrap();
    let _ = std::process::Command::new("chown").arg("slurm").arg(d.join("archive")).status();
}

pub fn kubeconfig(url: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n  - name: fake\n    cluster: {{ server: \"{url}\" }}\n\
         users:\n  - name: onramp\n    user: {{ token: fake-service-account-token }}\n\
         contexts:\n  - name: fake\n    context: {{ cluster: fake, user: onramp, namespace: onramp }}\n\
         current-context: fake\n"
    )
}
