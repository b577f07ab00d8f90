//! The exec transport: runs a [`Command`] in a named pod, or in a Ready pod of a Deployment
//! (`kubectl exec deploy/slurmctld -- …`), over the WebSocket exec API. Stdout and stderr are
//! collected; the exit code comes from the `Status` on the error channel.

use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Status;
use kube::api::{Api, AttachParams, ListParams};
use tokio::io::AsyncReadExt;

use super::{Call, K8s, K8sError};
use crate::backends::exec::{Command, Output, RunFuture, Transport, TransportError};

/// The pod commands run in: one by name, or the first ready pod of a Deployment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PodTarget {
    Pod(String),
    Deployment(String),
}

/// Where commands run: a namespace, a pod or Deployment, and optionally a container.
#[derive(Clone)]
pub struct PodExec {
    k8s: K8s,
    namespace: String,
    target: PodTarget,
    container: Option<String>,
}

impl PodExec {
    pub fn new(k8s: K8s, namespace: impl Into<String>, target: PodTarget, container: Option<String>) -> Self {
        Self { k8s, namespace: namespace.into(), target, container }
    }

    /// `deploy/slurmctld` in the Slurm namespace, from settings.
    pub fn slurmctld(k8s: &K8s) -> Self {
        let s = k8s.settings();
        let target = PodTarget::Deployment(s.slurmctld_deployment.clone());
        Self::new(k8s.clone(), s.slurm_namespace.clone(), target, s.slurmctld_container.clone())
    }

    /// A tenant's login pod: the named pod, or a Ready pod of the login Deployment.
    pub fn login(k8s: &K8s, names: &crate::domain::tenants::K8sNames) -> Self {
        let target = match &names.login_pod {
            Some(pod) => PodTarget::Pod(pod.clone()),
            None => PodTarget::Deployment(names.login_deployment.clone()),
        };
        Self::new(k8s.clone(), names.namespace.clone(), target, names.login_container.clone())
    }

    /// The pod to exec into: the named one, or a Ready pod of the Deployment (first by name).
    pub async fn resolve(&self) -> Result<String, K8sError> {
        let name = match &self.target {
            PodTarget::Pod(p) => return Ok(p.clone()),
            PodTarget::Deployment(d) => d,
        };
        let ns = Some(self.namespace.as_str());
        let deployments: Api<Deployment> = Api::namespaced(self.k8s.client().clone(), &self.namespace);
        let call = Call::new("get", "deployments.apps", ns, Some(name));
        let d = self.k8s.call(call.clone(), deployments.get(name)).await?;
        let labels = d.spec.selector.match_labels.unwrap_or_default();
        if labels.is_empty() {
            return Err(K8sError::Invalid {
                call: Box::new(call),
                what: "the Deployment's selector has no matchLabels".into(),
            });
        }
        let selector: Vec<String> = labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
        let pods: Api<Pod> = Api::namespaced(self.k8s.client().clone(), &self.namespace);
        let lp = ListParams::default().labels(&selector.join(","));
        let list = self.k8s.call(Call::new("list", "pods", ns, None), pods.list(&lp)).await?;
        let mut ready: Vec<String> =
            list.items.iter().filter(|p| is_ready(p)).filter_map(|p| p.metadata.name.clone()).collect();
        ready.sort();
        ready
            .into_iter()
            .next()
            .ok_or_else(|| K8sError::NoReadyPod { namespace: self.namespace.clone(), deployment: name.clone() })
    }

    async fn exec(&self, cmd: &Command) -> Result<Result<Output, TransportError>, K8sError> {
        let pod = self.resolve().await?;
        let pods: Api<Pod> = Api::namespaced(self.k8s.client().clone(), &self.namespace);
        let mut ap = AttachParams::default().stdin(false).stdout(true).stderr(true);
        if let Some(c) = &self.container {
            ap = ap.container(c.clone());
        }
        let call = Call::new("create", "pods/exec", Some(&self.namespace), Some(&pod));
        let mut proc =
            pods.exec(&pod, cmd.argv().to_vec(), &ap).await.map_err(|e| K8sError::from_kube(call.clone(), e))?;
        let (Some(mut so), Some(mut se), Some(status)) = (proc.stdout(), proc.stderr(), proc.take_status()) else {
            return Err(K8sError::Invalid { call: Box::new(call), what: "exec streams missing".into() });
        };
        let read = async move {
            let (mut out, mut err) = (Vec::new(), Vec::new());
            let (a, b) = tokio::join!(so.read_to_end(&mut out), se.read_to_end(&mut err));
            a.and(b).map(|_| (out, err))
        };
        let lost = |why: String| Ok(Err(TransportError::Transient(format!("{call}: {why}"))));
        // When the connection breaks, the client's task ends without a status and without
        // closing the output streams: stop reading then, rather than wait for an end that never
        // comes. (`join` is only called at the end: it closes stdin, which on v4 closes the
        // whole WebSocket.)
        tokio::pin!(read, status);
        let (read, status) = tokio::select! {
            r = &mut read => (r, status.await),
            st = &mut status => match st {
                None => (Ok((Vec::new(), Vec::new())), None),
                Some(st) => (read.await, Some(st)),
            },
        };
        let Some(status) = status else {
            let why = match proc.join().await {
                Err(e) => format!("connection lost before the exit status: {e}"),
                Ok(()) => "connection closed before the exit status".into(),
            };
            return lost(why);
        };
        let (out, err) = match read {
            Ok(v) => v,
            Err(e) => return lost(format!("reading output: {e}")),
        };
        let _ = proc.join().await;
        let program = cmd.argv()[0].clone();
        Ok(exit_code(&status)
            .map(|code| Output {
                code,
                stdout: String::from_utf8_lossy(&out).into_owned(),
                stderr: String::from_utf8_lossy(&err).into_owned(),
            })
            .map_err(|reason| TransportError::Spawn { program, reason }))
    }
}

fn is_ready(p: &Pod) -> bool {
    p.metadata.deletion_timestamp.is_none()
        && p.status.as_ref().is_some_and(|s| {
            s.phase.as_deref() == Some("Running")
                && s.conditions.iter().flatten().any(|c| c.type_ == "Ready" && c.status == "True")
        })
}

/// The exit code in an exec `Status`: 0 on Success, the `ExitCode` cause on NonZeroExitCode;
/// any other failure (e.g. the executable does not exist) is the message.
pub fn exit_code(s: &Status) -> Result<i32, String> {
    if s.status.as_deref() == Some("Success") {
        return Ok(0);
    }
    if s.reason.as_deref() == Some("NonZeroExitCode") {
        let causes = s.details.as_ref().and_then(|d| d.causes.as_ref());
        if let Some(code) = causes
            .into_iter()
            .flatten()
            .find(|c| c.reason.as_deref() == Some("ExitCode"))
            .and_then(|c| c.message.as_deref()?.parse().ok())
        {
            return Ok(code);
        }
    }
    Err(s.message.clone().unwrap_or_else(|| format!("exec failed: {:?}", s.reason)))
}

impl Transport for PodExec {
    fn run<'a>(&'a self, cmd: &'a Command, timeout: Duration) -> RunFuture<'a> {
        Box::pin(async move {
            match tokio::time::timeout(timeout, self.exec(cmd)).await {
                Err(_) => Err(TransportError::Timeout { program: cmd.argv()[0].clone(), after: timeout }),
                Ok(Ok(r)) => r,
                Ok(Err(e)) if e.is_retryable() => Err(match e.retry_after() {
                    // the API server's Retry-After travels with the error, for the engine to honour
                    Some(retry_after) => TransportError::Busy { why: e.to_string(), retry_after },
                    None => TransportError::Transient(e.to_string()),
                }),
                Ok(Err(e)) => Err(TransportError::Permanent(e.to_string())),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_codes_from_status() {
        let ok: Status = serde_json::from_str(r#"{"metadata":{},"status":"Success"}"#).unwrap();
        assert_eq!(exit_code(&ok), Ok(0));
        let bad: Status = serde_json::from_str(
            r#"{"metadata":{},"status":"Failure","reason":"NonZeroExitCode","message":"command terminated with non-zero exit code: 3",
               "details":{"causes":[{"reason":"ExitCode","message":"3"}]}}"#,
        )
        .unwrap();
        assert_eq!(exit_code(&bad), Ok(3));
        let gone: Status = serde_json::from_str(
            r#"{"status":"Failure","reason":"InternalError","message":"executable file not found"}"#,
        )
        .unwrap();
        assert_eq!(exit_code(&gone), Err("executable file not found".into()));
    }
}
