//! The Slurm backend's errors, each either worth retrying (the engine's `Retry`) or needing a
//! person (the engine's `Fail`).

use crate::backends::exec::TransportError;

#[derive(Debug, thiserror::Error)]
pub enum SlurmError {
    /// The command could not be run or did not finish (see the transport error).
    #[error("{cmd}: {source}")]
    Transport {
        cmd: String,
        #[source]
        source: TransportError,
    },
    /// slurmdbd or slurmctld did not answer.
    #[error("{cmd}: Slurm did not answer: {detail}")]
    Unreachable { cmd: String, detail: String },
    #[error("Slurm account {0} does not exist")]
    MissingAccount(String),
    #[error("parent account {0} does not exist")]
    MissingParent(String),
    #[error("{cmd}: Slurm does not track that TRES (AccountingStorageTRES): {detail}")]
    UnknownTres { cmd: String, detail: String },
    #[error("{cmd}: unknown QOS: {detail}")]
    UnknownQos { cmd: String, detail: String },
    /// Jobs of the subject are pending or running; cancel or drain them first. Retryable: the
    /// refusal holds only until the jobs end (flows drain before deleting).
    #[error("refused: {what} has active jobs ({})", jobs.join(", "))]
    JobsActive { what: String, jobs: Vec<String> },
    /// The name is taken by something onramp must not change (e.g. an account under another parent).
    #[error("conflict: {0}")]
    Conflict(String),
    /// squeue/scancel could not resolve the user name on the host they run on.
    #[error("{cmd}: the host does not know the user: {detail}")]
    UnknownUnixUser { cmd: String, detail: String },
    /// What onramp asked for is not valid (before anything ran).
    #[error("invalid request: {0}")]
    Invalid(String),
    /// The command ran, but reading back shows a different state.
    #[error("{what} did not take effect: want {want}, Slurm shows {got}")]
    NotConverged { what: String, want: String, got: String },
    #[error("{cmd}: unexpected output line {line:?}: {why}")]
    Parse { cmd: String, line: String, why: String },
    /// The batched call this request joined failed (the error of the batch, for each member).
    #[error("the batched call failed: {detail}")]
    Batch { retryable: bool, retry_after: Option<std::time::Duration>, detail: String },
    /// A failure this backend does not recognise.
    #[error("{cmd} failed (exit {code}): {detail}")]
    Failed { cmd: String, code: i32, detail: String },
}

impl SlurmError {
    /// Worth trying again later (the cluster or the way to it had a problem), as opposed to a
    /// request that will fail the same way until a person acts.
    pub fn is_retryable(&self) -> bool {
        match self {
            SlurmError::Transport { source, .. } => source.is_transient(),
            // Jobs end (or slurmdbd learns that they ended) without anyone acting on onramp's side.
            SlurmError::Unreachable { .. } | SlurmError::NotConverged { .. } | SlurmError::JobsActive { .. } => true,
            SlurmError::Batch { retryable, .. } => *retryable,
            _ => false,
        }
    }

    /// How long the far side asked to wait before the next try (a 429 on the way to Slurm).
    pub fn retry_after(&self) -> Option<std::time::Duration> {
        match self {
            SlurmError::Transport { source, .. } => source.retry_after(),
            SlurmError::Batch { retry_after, .. } => *retry_after,
            _ => None,
        }
    }

    /// This error as each member of a batched or shared call gets it.
    pub fn shared(&self) -> Shared {
        Shared { retryable: self.is_retryable(), retry_after: self.retry_after(), detail: self.to_string() }
    }

    /// A short label for metrics and logs.
    pub fn kind(&self) -> &'static str {
        match self {
            SlurmError::Transport { .. } => "transport",
            SlurmError::Unreachable { .. } => "unreachable",
            SlurmError::MissingAccount(_) => "missing_account",
            SlurmError::MissingParent(_) => "missing_parent",
            SlurmError::UnknownTres { .. } => "unknown_tres",
            SlurmError::UnknownQos { .. } => "unknown_qos",
            SlurmError::JobsActive { .. } => "jobs_active",
            SlurmError::Conflict(_) => "conflict",
            SlurmError::UnknownUnixUser { .. } => "unknown_unix_user",
            SlurmError::Invalid(_) => "invalid",
            SlurmError::NotConverged { .. } => "not_converged",
            SlurmError::Parse { .. } => "parse",
            SlurmError::Batch { .. } => "batch",
            SlurmError::Failed { .. } => "failed",
        }
    }
}

/// A batched or shared call's error, handed to each of its members (see [`SlurmError::shared`]).
#[derive(Clone, Debug)]
pub struct Shared {
    pub retryable: bool,
    pub retry_after: Option<std::time::Duration>,
    pub detail: String,
}

impl Shared {
    /// The call was given up before it answered.
    pub fn abandoned(what: &str) -> Self {
        Self { retryable: true, retry_after: None, detail: format!("the {what} was abandoned") }
    }
}

impl From<Shared> for SlurmError {
    fn from(s: Shared) -> Self {
        SlurmError::Batch { retryable: s.retryable, retry_after: s.retry_after, detail: s.detail }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn every_member_of_a_batch_gets_a_429s_retry_after() {
        let why = "too many requests".to_string();
        let busy = TransportError::Busy { why, retry_after: Duration::from_secs(3) };
        let e = SlurmError::Transport { cmd: "sacctmgr -i add user a,b".into(), source: busy };
        let member = SlurmError::from(e.shared());
        assert_eq!((member.is_retryable(), member.retry_after()), (true, Some(Duration::from_secs(3))));
        assert!(member.to_string().contains("too many requests"), "{member}");
        let gone = SlurmError::from(Shared::abandoned("batch"));
        assert_eq!((gone.is_retryable(), gone.retry_after()), (true, None));
        let conflict = SlurmError::from(SlurmError::Conflict("x".into()).shared());
        assert!(!conflict.is_retryable());
    }
}
