//! The Kubernetes items, over what [`super::k8s`] read from one login pod per tenant and one
//! slurmd pod: the pod specs (munge key, LDAP credentials and the users' keys from Secret
//! volumes) and files read by exec (nslcd.conf, /etc/pam.d, /proc/mounts).

use k8s_openapi::api::core::v1::{Pod, Volume};

use super::{Finding, Severity, Status};

/// Where munge's key is in the pods.
pub const MUNGE_KEY: &str = "/etc/munge/munge.key";
/// nslcd's configuration (LDAP URI, bind credentials, uid/gid mapping).
pub const NSLCD_CONF: &str = "/etc/nslcd.conf";

/// A file read in a pod by exec: its text, `None` when absent, or why it could not be read.
pub type PodFile = Result<Option<String>, String>;

/// One pod as read: who it is, its spec and the files read in it.
pub struct PodView {
    /// `login` (with the tenant) or `slurmd`.
    pub role: String,
    pub namespace: String,
    pub name: String,
    pub pod: Pod,
    pub container: Option<String>,
    pub nslcd: PodFile,
    pub mounts: PodFile,
    /// `grep -rH pam_slurm_adopt /etc/pam.d` (slurmd pods).
    pub pam: PodFile,
}

impl PodView {
    pub fn at(&self, what: &str) -> String {
        format!("pod {}/{}: {what}", self.namespace, self.name)
    }
}

/// What backs a path in a container.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Backing {
    /// Secret volume(s) (a projected volume of Secrets counts), by name.
    Secret(Vec<String>),
    /// Another kind of volume (`configMap cfg`, `hostPath`, `emptyDir`, …).
    Other(String),
    /// No volume mount covers it: it comes from the image.
    Image,
}

fn volume_kind(v: &Volume) -> Backing {
    if let Some(s) = &v.secret {
        return Backing::Secret(vec![s.secret_name.clone().unwrap_or_default()]);
    }
    if let Some(p) = &v.projected {
        let sources = p.sources.clone().unwrap_or_default();
        let secrets: Vec<String> = sources.iter().filter_map(|s| s.secret.as_ref().map(|x| x.name.clone())).collect();
        if !secrets.is_empty() && secrets.len() == sources.len() {
            return Backing::Secret(secrets);
        }
        return Backing::Other("projected (not only Secrets)".into());
    }
    if let Some(c) = &v.config_map {
        return Backing::Other(format!("configMap {}", c.name));
    }
    let kind = if v.host_path.is_some() {
        "hostPath"
    } else if v.empty_dir.is_some() {
        "emptyDir"
    } else if v.persistent_volume_claim.is_some() {
        "persistentVolumeClaim"
    } else {
        "volume"
    };
    Backing::Other(format!("{kind} {}", v.name))
}

/// The volume backing `path` in the container (named, or the first): the mount with the longest
/// mountPath that is `path` or a directory above it.
pub fn backing(pod: &Pod, container: Option<&str>, path: &str) -> Backing {
    let Some(spec) = &pod.spec else { return Backing::Image };
    let c = match container {
        Some(n) => spec.containers.iter().find(|c| c.name == n),
        None => spec.containers.first(),
    };
    let mounts = c.and_then(|c| c.volume_mounts.clone()).unwrap_or_default();
    let best = mounts
        .iter()
        .filter(|m| {
            let mp = m.mount_path.trim_end_matches('/');
            path == mp || path.starts_with(&format!("{mp}/"))
        })
        .max_by_key(|m| m.mount_path.len());
    let Some(m) = best else { return Backing::Image };
    let vols = spec.volumes.clone().unwrap_or_default();
    match vols.iter().find(|v| v.name == m.name) {
        Some(v) => volume_kind(v),
        None => Backing::Other(format!("volume {} (not in the pod)", m.name)),
    }
}

fn describe(b: &Backing) -> String {
    match b {
        Backing::Secret(n) => format!("Secret {}", n.join(", ")),
        Backing::Other(k) => k.clone(),
        Backing::Image => "the image (no volume mounted there)".into(),
    }
}

/// The munge key comes from a Secret.
pub fn munge_key(p: &PodView) -> Finding {
    let b = backing(&p.pod, p.container.as_deref(), MUNGE_KEY);
    Finding::new(&format!("pods.munge_key.{}", p.role), Severity::Critical, "munge key from a Secret")
        .ok_if(matches!(b, Backing::Secret(_)))
        .found(describe(&b))
        .expected(format!("{MUNGE_KEY} on a Secret volume"))
        .at(p.at(&format!("spec volumeMounts ({MUNGE_KEY})")))
        .why("Never bake credentials into the slurmd image: munge authenticates every Slurm message, and a key in an image (or a ConfigMap) is readable by whoever can pull it and cannot rotate.")
        .fix("Mount the munge key from a Secret (e.g. a secret volume at /etc/munge with defaultMode 0400) and rebuild the image without it.")
}

/// A bind password in nslcd.conf (`bindpw`, `rootpwmodpw`).
fn has_bind_password(nslcd: &str) -> bool {
    nslcd.lines().any(|l| matches!(l.split_whitespace().next(), Some("bindpw" | "rootpwmodpw")))
}

/// LDAP credentials (nslcd.conf's bind password) come from a Secret.
pub fn ldap_credentials(p: &PodView) -> Finding {
    let b = backing(&p.pod, p.container.as_deref(), NSLCD_CONF);
    let f = Finding::new(&format!("pods.ldap_credentials.{}", p.role), Severity::Critical, "LDAP credentials from a Secret")
        .expected(format!("{NSLCD_CONF} (its bindpw) on a Secret volume"))
        .at(p.at(&format!("spec volumeMounts, {NSLCD_CONF}")))
        .why("Never bake credentials into the slurmd image: the LDAP bind password in an image (or a ConfigMap) is readable by whoever can pull it and cannot rotate.")
        .fix("Mount nslcd.conf (or the file holding bindpw) from a Secret and rebuild the image without it.");
    if let Backing::Secret(_) = b {
        return f.ok_if(true).found(describe(&b));
    }
    match &p.nslcd {
        Ok(Some(t)) if has_bind_password(t) => {
            f.ok_if(false).found(format!("bindpw in {NSLCD_CONF} from {}", describe(&b)))
        }
        Ok(Some(_)) => f.ok_if(true).found(describe(&b)).note("nslcd.conf has no bind password (anonymous bind)"),
        Ok(None) => f.status(Status::Unknown).found(describe(&b)).note(format!("{NSLCD_CONF} is not in the pod")),
        Err(e) => f.status(Status::Unknown).found(describe(&b)).note(e.clone()),
    }
}

/// The tenant's keys Secret is mounted at the authorized_keys directory of its login pod.
pub fn authorized_keys(p: &PodView, dir: &str, secret: &str) -> Finding {
    let b = backing(&p.pod, p.container.as_deref(), &format!("{}/x", dir.trim_end_matches('/')));
    let ok = matches!(&b, Backing::Secret(n) if n.iter().any(|n| n == secret));
    Finding::new(&format!("pods.authorized_keys.{}", p.role), Severity::Critical, "authorized_keys Secret mounted")
        .ok_if(ok)
        .found(describe(&b))
        .expected(format!("Secret {secret} at {dir}"))
        .at(p.at(&format!("spec volumeMounts ({dir})")))
        .why("Onboarding claims success but the user can't log in: sshd reads each user's keys from the Secret projected at this directory.")
        .fix(format!("Mount Secret {secret} at {dir} in the login Deployment; after a change, kubectl rollout restart the login Deployment."))
}

/// The uid/gid scheme of nslcd.conf: its `map`, `base`, `filter` and `scope` lines, normalised.
pub fn id_scheme(nslcd: &str) -> Vec<String> {
    let mut v: Vec<String> = nslcd
        .lines()
        .map(|l| l.split('#').next().unwrap_or("").split_whitespace().collect::<Vec<_>>().join(" "))
        .filter(|l| matches!(l.split(' ').next(), Some("map" | "base" | "filter" | "scope")))
        .collect();
    v.sort();
    v.dedup();
    v
}

/// The login pod and the slurmd pod map LDAP users to the same uid/gid numbers.
pub fn same_ids(login: &PodView, slurmd: &PodView) -> Finding {
    let f = Finding::new(&format!("pods.nslcd_ids.{}", login.role), Severity::Critical, "same uid/gid scheme (nslcd.conf)")
        .expected("the same map/base/filter lines in nslcd.conf on the login pod and the slurmd pods")
        .at(format!("{} and {}", login.at(NSLCD_CONF), slurmd.at(NSLCD_CONF)))
        .why("Files written by the user appear as nobody:nogroup: file ownership stamps with the UID/GID number, and if the numbers differ between the login pod and slurmd, id alice differs too.")
        .fix("Use the same nslcd.conf (map passwd uidNumber, map group gidNumber, base, filters) on login and slurmd pods, from one Secret; then nscd -i passwd (stale cache) and check getent passwd alice and id alice on both.");
    match (&login.nslcd, &slurmd.nslcd) {
        (Ok(Some(a)), Ok(Some(b))) => {
            let (a, b) = (id_scheme(a), id_scheme(b));
            let only_login: Vec<&String> = a.iter().filter(|l| !b.contains(l)).collect();
            let only_slurmd: Vec<&String> = b.iter().filter(|l| !a.contains(l)).collect();
            let diff = format!("login only: {only_login:?}; slurmd only: {only_slurmd:?}");
            if only_login.is_empty() && only_slurmd.is_empty() {
                f.ok_if(true).found(format!("{} lines alike", a.len()))
            } else {
                f.ok_if(false).found(diff)
            }
        }
        (Ok(None), _) | (_, Ok(None)) => {
            f.status(Status::Unknown).note(format!("{NSLCD_CONF} is missing in one of the pods"))
        }
        (Err(e), _) | (_, Err(e)) => f.status(Status::Unknown).note(e.clone()),
    }
}

/// `pam_slurm_adopt.so` in an `account` line of /etc/pam.d on the slurmd pod.
pub fn pam_slurm_adopt(slurmd: &PodView) -> Finding {
    let f = Finding::new("pods.pam_slurm_adopt.slurmd", Severity::Warning, "pam_slurm_adopt on compute nodes")
        .expected("account required pam_slurm_adopt.so in /etc/pam.d (sshd)")
        .at(slurmd.at("/etc/pam.d/*"))
        .why("A user spawns a srun --pty shell (or an ssh session) that survives the parent job: without pam_slurm_adopt, processes outside a job are not adopted into its cgroup nor killed with it.")
        .fix("Add `account required pam_slurm_adopt.so` to the compute nodes' /etc/pam.d/sshd, and restrict kubectl exec at the namespace RBAC level.");
    match &slurmd.pam {
        Ok(text) => {
            let lines: Vec<&str> = text
                .as_deref()
                .unwrap_or("")
                .lines()
                .map(|l| l.split_once(':').map_or(l, |(_, rest)| rest).trim())
                .filter(|l| !l.starts_with('#') && l.contains("pam_slurm_adopt.so"))
                .filter(|l| matches!(l.split_whitespace().next(), Some("account" | "-account")))
                .collect();
            f.ok_if(!lines.is_empty()).found(lines.join("; "))
        }
        Err(e) => f.status(Status::Unknown).note(e.clone()),
    }
}

/// wekafs mounts in a pod whose source or path names another tenant (a name or namespace in
/// `others`): the runbook's stale mount of a previous tenant.
pub fn stale_weka(p: &PodView, others: &[String]) -> Finding {
    let f = Finding::new(&format!("pods.weka_mounts.{}", p.role), Severity::Critical, "no Weka mounts of other tenants")
        .expected("wekafs mounts of this tenant only")
        .at(p.at("/proc/mounts"))
        .why("A mount from a previous tenant left behind blocks the new one and exposes another tenant's files; jobs writing there fail with ENOSPC or EROFS-like errors.")
        .fix("Unmount it (umount -l <path> on the node) and restart the pod; audit the Weka client mounts per the Weka troubleshooting page.");
    match &p.mounts {
        Ok(Some(text)) => {
            let stale: Vec<String> = text
                .lines()
                .filter_map(|l| {
                    let w: Vec<&str> = l.split_whitespace().collect();
                    (w.len() >= 3 && (w[2] == "wekafs" || w[2] == "fuse.wekafs")).then(|| (w[0], w[1]))
                })
                .filter(|(src, path)| {
                    src.split(['/', ':']).chain(path.split('/')).any(|c| others.iter().any(|o| o == c))
                })
                .map(|(src, path)| format!("{src} on {path}"))
                .collect();
            f.ok_if(stale.is_empty()).found(stale.join("; "))
        }
        Ok(None) => f.status(Status::Unknown).note("/proc/mounts is not in the pod"),
        Err(e) => f.status(Status::Unknown).note(e.clone()),
    }
}

#[cfg(test)]
#[path = "pods_tests.rs"]
mod tests;
