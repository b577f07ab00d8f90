//! What reconcile reads from the cluster: the users' associations under a set of accounts, in one
//! bulk read. The Slurm backend implements this; `SacctmgrAssociations` is a direct reading of
//! `sacctmgr` through a transport until then.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use crate::backends::exec::{Command, Transport};
use crate::domain::names::{SlurmAccount, Username};

#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    /// Worth trying again (the controller is busy, the transport failed).
    #[error("cluster read failed: {0}")]
    Transient(String),
    /// The answer makes no sense; a person must look.
    #[error("cluster read failed: {0}")]
    Permanent(String),
}

pub type AssocFuture<'a> =
    Pin<Box<dyn Future<Output = Result<Vec<(SlurmAccount, Username)>, ClusterError>> + Send + 'a>>;

/// A bulk read of user associations.
pub trait AssociationSource: Send + Sync + 'static {
    /// Every (account, user) association under these accounts, in a constant number of reads.
    fn associations<'a>(&'a self, accounts: &'a [SlurmAccount]) -> AssocFuture<'a>;
}

/// `sacctmgr -nP show associations where accounts=a,b,… format=Account,User`.
pub struct SacctmgrAssociations {
    pub transport: Arc<dyn Transport>,
    pub timeout: Duration,
}

impl AssociationSource for SacctmgrAssociations {
    fn associations<'a>(&'a self, accounts: &'a [SlurmAccount]) -> AssocFuture<'a> {
        Box::pin(async move {
            if accounts.is_empty() {
                return Ok(vec![]);
            }
            let list: Vec<&str> = accounts.iter().map(SlurmAccount::as_str).collect();
            let cmd = Command::new("sacctmgr")
                .args(["-nP", "show", "associations", "where"])
                .arg(format!("accounts={}", list.join(",")))
                .arg("format=Account,User");
            let out =
                self.transport.run(&cmd, self.timeout).await.map_err(|e| ClusterError::Transient(e.to_string()))?;
            if !out.success() {
                return Err(ClusterError::Transient(format!("{cmd} exited {}: {}", out.code, out.stderr.trim())));
            }
            parse_associations(&out.stdout)
        })
    }
}

/// `account|user` lines; account-level rows (no user) are skipped.
pub fn parse_associations(stdout: &str) -> Result<Vec<(SlurmAccount, Username)>, ClusterError> {
    let mut out = vec![];
    for line in stdout.lines().map(str::trim).filter(|l| !l.is_empty()) {
        let (account, user) = line
            .split_once('|')
            .ok_or_else(|| ClusterError::Permanent(format!("unexpected sacctmgr line {line:?}")))?;
        let user = user.trim_end_matches('|');
        if user.is_empty() {
            continue;
        }
        let account = SlurmAccount::parse(account).map_err(|e| ClusterError::Permanent(e.to_string()))?;
        match Username::parse(user) {
            Ok(u) => out.push((account, u)),
            Err(e) => {
                tracing::warn!(error = %e, "skipping an association whose user name onramp cannot handle")
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backends::exec::Output;
    use crate::dryrun::Recorder;

    #[tokio::test]
    async fn reads_associations_in_one_command() {
        let rec = Recorder::replying(|_| Output {
            code: 0,
            stdout: "tenant-foo|\nml-team-foo|alice\nml-team-foo|bob\n".into(),
            stderr: String::new(),
        });
        let src = SacctmgrAssociations { transport: Arc::new(rec.clone()), timeout: Duration::from_secs(5) };
        let accounts = [SlurmAccount::parse("tenant-foo").unwrap(), SlurmAccount::parse("ml-team-foo").unwrap()];
        let got = src.associations(&accounts).await.unwrap();
        assert_eq!(got.len(), 2);
        assert_eq!(got[0].1.as_str(), "alice");
        assert_eq!(
            rec.commands()[0].to_string(),
            "sacctmgr -nP show associations where accounts=tenant-foo,ml-team-foo format=Account,User"
        );
    }
}
