//! Reads the pods for [`super::pods`] through the Kubernetes API: one login pod per tenant of the
//! registry (as the flows find it) and one Ready slurmd pod (by label selector), their specs, and
//! files read by exec (`cat`, `grep`: argv only).

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};

use super::pods::{self, PodFile, PodView};
use super::{Finding, Severity, Status};
use crate::backends::exec::{Command, Transport};
use crate::backends::kubernetes::exec::{PodExec, PodTarget};
use crate::backends::kubernetes::{Call, K8s};
use crate::domain::tenants::{Tenant, TenantRegistry};

/// Where the pods are and what to look for.
#[derive(Clone, Debug)]
pub struct PodSettings {
    /// The tenants (their namespaces and login pods); `None`: the login pods are not checked.
    pub tenants: Option<TenantRegistry>,
    /// Namespace of the slurmd pods.
    pub slurmd_namespace: String,
    /// Label selector of the slurmd pods.
    pub slurmd_selector: String,
    /// The login pods' authorized_keys directory.
    pub authorized_keys_dir: String,
    /// Longest wait for one exec.
    pub exec_timeout: Duration,
}

/// Every Kubernetes check; `k8s` is `Err(why)` when no API is configured: each check is then
/// reported not checked, with why.
pub async fn check(k8s: Result<&K8s, String>, s: &PodSettings) -> Vec<Finding> {
    let k8s = match k8s {
        Ok(k) => k,
        Err(why) => return not_checked(&why),
    };
    let mut out = vec![];
    let slurmd = match slurmd_pod(k8s, s).await {
        Ok(p) => Some(p),
        Err(e) => {
            out.push(
                Finding::new("pods.slurmd", Severity::Critical, "a Ready slurmd pod")
                    .status(Status::Unknown)
                    .expected(format!("a Ready pod in {} with labels {}", s.slurmd_namespace, s.slurmd_selector))
                    .at(format!("pods in namespace {}", s.slurmd_namespace))
                    .note(e)
                    .why("Without a slurmd pod to read, the compute side (munge, LDAP, PAM, uid/gid scheme) is not checked.")
                    .fix("Set ONRAMP_SLURMD_NAMESPACE and ONRAMP_SLURMD_SELECTOR to where the slurmd pods are."),
            );
            None
        }
    };
    if let Some(d) = &slurmd {
        out.push(pods::munge_key(d));
        out.push(pods::ldap_credentials(d));
        out.push(pods::pam_slurm_adopt(d));
        // A tenant's own slurmd pods (in its namespace) must not hold other tenants' mounts.
        let reg = s.tenants.as_ref().map(|r| r.tenants.as_slice()).unwrap_or_default();
        if let Some(t) = reg.iter().find(|t| t.kubernetes.namespace == d.namespace) {
            out.push(pods::stale_weka(d, &others(reg, t)));
        }
    }
    let Some(reg) = &s.tenants else {
        let why = "no tenant registry (ONRAMP_TENANTS): the login pods are not known";
        out.extend(not_checked(why).into_iter().filter(|f| !f.id.ends_with(".slurmd")));
        return out;
    };
    for t in &reg.tenants {
        let names = &t.kubernetes;
        let role = format!("login.{}", t.name.as_str());
        let login = match login_pod(k8s, t, &role, s).await {
            Ok(p) => p,
            Err(e) => {
                out.push(
                    Finding::new(&format!("pods.{role}"), Severity::Critical, "the tenant's login pod")
                        .status(Status::Unknown)
                        .at(format!("namespace {}", names.namespace))
                        .note(e)
                        .why("The login pod's checks (keys, credentials, uid/gid scheme, mounts) could not run.")
                        .fix("Check the tenant's kubernetes names in the registry (login pod or Deployment)."),
                );
                continue;
            }
        };
        out.push(pods::munge_key(&login));
        out.push(pods::ldap_credentials(&login));
        out.push(pods::authorized_keys(&login, &s.authorized_keys_dir, &names.keys_secret));
        match &slurmd {
            Some(d) => out.push(pods::same_ids(&login, d)),
            None => out.push(
                Finding::new(&format!("pods.nslcd_ids.{role}"), Severity::Critical, "same uid/gid scheme (nslcd.conf)")
                    .status(Status::Unknown)
                    .note("no slurmd pod to compare with"),
            ),
        }
        out.push(pods::stale_weka(&login, &others(&reg.tenants, t)));
    }
    out
}

/// The names and namespaces of every tenant but `t`.
fn others(tenants: &[Tenant], t: &Tenant) -> Vec<String> {
    tenants
        .iter()
        .filter(|o| o.name != t.name)
        .flat_map(|o| [o.name.as_str().to_string(), o.kubernetes.namespace.clone()])
        .collect()
}

fn not_checked(why: &str) -> Vec<Finding> {
    [
        ("pods.munge_key.slurmd", "munge key from a Secret"),
        ("pods.ldap_credentials.slurmd", "LDAP credentials from a Secret"),
        ("pods.pam_slurm_adopt.slurmd", "pam_slurm_adopt on compute nodes"),
        ("pods.munge_key.login", "munge key from a Secret"),
        ("pods.ldap_credentials.login", "LDAP credentials from a Secret"),
        ("pods.authorized_keys.login", "authorized_keys Secret mounted"),
        ("pods.nslcd_ids.login", "same uid/gid scheme (nslcd.conf)"),
        ("pods.weka_mounts.login", "no Weka mounts of other tenants"),
    ]
    .into_iter()
    .map(|(id, setting)| {
        let at = if id.ends_with(".slurmd") { "a slurmd pod" } else { "each tenant's login pod" };
        Finding::new(id, Severity::Critical, setting).status(Status::NotChecked).at(at).note(why)
    })
    .collect()
}

async fn get_pod(k8s: &K8s, ns: &str, name: &str) -> Result<Pod, String> {
    let api: Api<Pod> = Api::namespaced(k8s.client().clone(), ns);
    k8s.call(Call::new("get", "pods", Some(ns), Some(name)), api.get(name)).await.map_err(|e| e.to_string())
}

fn ready(p: &Pod) -> bool {
    let conds = p.status.as_ref().and_then(|s| s.conditions.clone()).unwrap_or_default();
    conds.iter().any(|c| c.type_ == "Ready" && c.status == "True")
}

async fn slurmd_pod(k8s: &K8s, s: &PodSettings) -> Result<PodView, String> {
    let ns = s.slurmd_namespace.as_str();
    let api: Api<Pod> = Api::namespaced(k8s.client().clone(), ns);
    let lp = ListParams::default().labels(&s.slurmd_selector);
    let list = k8s.call(Call::new("list", "pods", Some(ns), None), api.list(&lp)).await.map_err(|e| e.to_string())?;
    let mut ready: Vec<Pod> = list.items.into_iter().filter(ready).collect();
    ready.sort_by_key(|p| p.metadata.name.clone());
    let pod = ready.into_iter().next().ok_or_else(|| format!("no Ready pod matches {}", s.slurmd_selector))?;
    let name = pod.metadata.name.clone().unwrap_or_default();
    // The container named slurmd when there is one (operators add sidecars), else the first.
    let names = pod.spec.as_ref().map(|s| s.containers.iter().map(|c| c.name.clone()).collect::<Vec<_>>());
    let container = names.unwrap_or_default().into_iter().find(|c| c == "slurmd");
    let exec = PodExec::new(k8s.clone(), ns, PodTarget::Pod(name.clone()), container.clone());
    let t = s.exec_timeout;
    Ok(PodView {
        role: "slurmd".into(),
        namespace: ns.into(),
        name,
        pod,
        container,
        nslcd: cat(&exec, pods::NSLCD_CONF, t).await,
        mounts: cat(&exec, "/proc/mounts", t).await,
        pam: grep(&exec, "pam_slurm_adopt", "/etc/pam.d", t).await,
    })
}

async fn login_pod(k8s: &K8s, t: &Tenant, role: &str, s: &PodSettings) -> Result<PodView, String> {
    let names = &t.kubernetes;
    let name = PodExec::login(k8s, names).resolve().await.map_err(|e| e.to_string())?;
    let pod = get_pod(k8s, &names.namespace, &name).await?;
    let exec =
        PodExec::new(k8s.clone(), names.namespace.clone(), PodTarget::Pod(name.clone()), names.login_container.clone());
    let tm = s.exec_timeout;
    Ok(PodView {
        role: role.into(),
        namespace: names.namespace.clone(),
        name,
        pod,
        container: names.login_container.clone(),
        nslcd: cat(&exec, pods::NSLCD_CONF, tm).await,
        mounts: cat(&exec, "/proc/mounts", tm).await,
        pam: Ok(None),
    })
}

/// A file's text; `None` when the pod has no such file.
async fn cat(exec: &PodExec, path: &str, timeout: Duration) -> PodFile {
    let out = exec.run(&Command::new("cat").arg("--").arg(path), timeout).await.map_err(|e| e.to_string())?;
    match out.code {
        0 => Ok(Some(out.stdout)),
        _ if out.stderr.contains("No such file") => Ok(None),
        c => Err(format!("cat {path} exited {c}: {}", out.stderr.trim())),
    }
}

/// `grep -rH pattern dir`: the matching lines (empty when none).
async fn grep(exec: &PodExec, pattern: &str, dir: &str, timeout: Duration) -> PodFile {
    let cmd = Command::new("grep").args(["-rH", "--", pattern, dir]);
    let out = exec.run(&cmd, timeout).await.map_err(|e| e.to_string())?;
    match out.code {
        0 => Ok(Some(out.stdout)),
        1 => Ok(Some(String::new())),
        c => Err(format!("grep -rH {pattern} {dir} exited {c}: {}", out.stderr.trim())),
    }
}
