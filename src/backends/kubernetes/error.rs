//! Kubernetes errors, each naming the call that failed, classified into retryable (the API was
//! busy, slow or unreachable) and permanent (forbidden, not found, invalid): a person must act.

use std::fmt;
use std::time::Duration;

/// Which API call failed, in RBAC terms, so that a 403 can name the permission that is missing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Call {
    pub verb: &'static str,
    /// `secrets`, `pods/exec`, `deployments.apps`, `slurmclusters.slurm.nebius.ai`, …
    pub resource: String,
    pub namespace: Option<String>,
    pub name: Option<String>,
}

impl Call {
    pub fn new(verb: &'static str, resource: impl Into<String>, namespace: Option<&str>, name: Option<&str>) -> Self {
        Self { verb, resource: resource.into(), namespace: namespace.map(Into::into), name: name.map(Into::into) }
    }
    /// The permission this call needs, as a person would grant it.
    pub fn permission(&self) -> String {
        let scope = match &self.namespace {
            Some(ns) => format!("in namespace {ns}"),
            None => "cluster-wide".into(),
        };
        format!("{:?} on {:?} {scope}", self.verb, self.resource)
    }
}

impl fmt::Display for Call {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.verb, self.resource)?;
        if let Some(n) = &self.name {
            write!(f, "/{n}")?;
        }
        if let Some(ns) = &self.namespace {
            write!(f, " in {ns}")?;
        }
        Ok(())
    }
}

#[derive(Debug, thiserror::Error)]
pub enum K8sError {
    #[error("{call}: forbidden: onramp's service account lacks {} (see deploy/rbac.yaml); the API server said: {message}", call.permission())]
    Forbidden { call: Box<Call>, message: String },
    #[error("{call}: not found: {message}")]
    NotFound { call: Box<Call>, message: String },
    #[error("{call}: the API server is rate limiting (429){}", retry_after.map(|d| format!(", retry after {d:?}")).unwrap_or_default())]
    TooManyRequests { call: Box<Call>, retry_after: Option<Duration> },
    #[error("{call}: API error {code} {reason}: {message}")]
    Api { call: Box<Call>, code: u16, reason: String, message: String },
    #[error("{call}: cannot talk to the API server")]
    Connection {
        call: Box<Call>,
        #[source]
        source: kube::Error,
    },
    #[error("{call}: no answer within {after:?}")]
    Timeout { call: Box<Call>, after: Duration },
    #[error("{call}: unexpected answer: {what}")]
    Invalid { call: Box<Call>, what: String },
    #[error("deployment {namespace}/{deployment} has no Ready pod")]
    NoReadyPod { namespace: String, deployment: String },
    #[error("Kubernetes configuration: {0}")]
    Config(String),
}

impl K8sError {
    /// Worth trying again later without a person acting.
    pub fn is_retryable(&self) -> bool {
        match self {
            Self::TooManyRequests { .. } | Self::Connection { .. } | Self::Timeout { .. } | Self::NoReadyPod { .. } => {
                true
            }
            // 409: someone else changed the object between our read and our write.
            Self::Api { code, .. } => *code >= 500 || *code == 409,
            Self::Forbidden { .. } | Self::NotFound { .. } | Self::Invalid { .. } | Self::Config(_) => false,
        }
    }

    /// The same error for another caller (a grouped write answers each of its edits); a
    /// connection error keeps its message, not its source.
    pub fn duplicate(&self) -> Self {
        match self {
            Self::Forbidden { call, message } => Self::Forbidden { call: call.clone(), message: message.clone() },
            Self::NotFound { call, message } => Self::NotFound { call: call.clone(), message: message.clone() },
            Self::TooManyRequests { call, retry_after } => {
                Self::TooManyRequests { call: call.clone(), retry_after: *retry_after }
            }
            Self::Api { call, code, reason, message } => {
                Self::Api { call: call.clone(), code: *code, reason: reason.clone(), message: message.clone() }
            }
            Self::Connection { call, source } => {
                Self::Connection { call: call.clone(), source: kube::Error::Service(source.to_string().into()) }
            }
            Self::Timeout { call, after } => Self::Timeout { call: call.clone(), after: *after },
            Self::Invalid { call, what } => Self::Invalid { call: call.clone(), what: what.clone() },
            Self::NoReadyPod { namespace, deployment } => {
                Self::NoReadyPod { namespace: namespace.clone(), deployment: deployment.clone() }
            }
            Self::Config(m) => Self::Config(m.clone()),
        }
    }

    /// How long the server asked us to wait, when it did.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            Self::TooManyRequests { retry_after, .. } => *retry_after,
            _ => None,
        }
    }

    /// A short label for metrics.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Forbidden { .. } => "forbidden",
            Self::NotFound { .. } => "not_found",
            Self::TooManyRequests { .. } => "rate_limited",
            Self::Api { .. } => "api",
            Self::Connection { .. } => "connection",
            Self::Timeout { .. } => "timeout",
            Self::Invalid { .. } => "invalid",
            Self::NoReadyPod { .. } => "no_ready_pod",
            Self::Config(_) => "config",
        }
    }

    pub fn is_not_found(&self) -> bool {
        matches!(self, Self::NotFound { .. })
    }

    /// Classifies an error from the `kube` client for `call`.
    pub fn from_kube(call: Call, e: kube::Error) -> Self {
        let call = Box::new(call);
        match e {
            kube::Error::Api(s) => match s.code {
                403 => Self::Forbidden { call, message: s.message },
                404 => Self::NotFound { call, message: s.message },
                429 => Self::TooManyRequests {
                    call,
                    retry_after: s
                        .details
                        .as_ref()
                        .map(|d| d.retry_after_seconds)
                        .filter(|s| *s > 0)
                        .map(|s| Duration::from_secs(s.into())),
                },
                code => Self::Api { call, code, reason: s.reason, message: s.message },
            },
            kube::Error::SerdeError(e) => Self::Invalid { call, what: e.to_string() },
            kube::Error::BuildRequest(e) => Self::Invalid { call, what: e.to_string() },
            other => Self::Connection { call, source: other },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forbidden_names_the_permission() {
        let call = Call::new("get", "secrets", Some("tenant-foo"), Some("tenant-foo-authorized-keys"));
        let e = K8sError::Forbidden { call: Box::new(call), message: "no".into() };
        assert!(!e.is_retryable());
        assert!(e.to_string().contains("lacks \"get\" on \"secrets\" in namespace tenant-foo"), "{e}");
    }

    #[test]
    fn classification() {
        let call = || Call::new("list", "nodes", None, None);
        assert!(
            K8sError::Api { call: Box::new(call()), code: 503, reason: String::new(), message: String::new() }
                .is_retryable()
        );
        assert!(
            !K8sError::Api { call: Box::new(call()), code: 422, reason: String::new(), message: String::new() }
                .is_retryable()
        );
        let e = K8sError::TooManyRequests { call: Box::new(call()), retry_after: Some(Duration::from_secs(3)) };
        assert!(e.is_retryable());
        assert_eq!(e.retry_after(), Some(Duration::from_secs(3)));
        assert!(call().permission().ends_with("cluster-wide"));
    }
}
