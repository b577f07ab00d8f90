//! The texts users receive. Plain text, the same for Slack and e-mail.

use std::fmt::Write as _;

use crate::domain::names::{SlurmAccount, TenantName, Username};
use crate::domain::sshkey::PublicKey;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    pub subject: String,
    pub text: String,
    /// The same on every attempt to send this message (the sender's job and step), so a copy
    /// sent again is recognisably the same message: e-mail carries it as the `Message-ID`
    /// (`<id@mail-from's domain>`). `None`: a fresh id per send.
    pub id: Option<String>,
}

/// Everything the onboarding message says.
#[derive(Debug, Clone)]
pub struct Onboarding {
    pub user: Username,
    pub tenant: TenantName,
    pub account: SlurmAccount,
    /// Where to SSH (from `--login-address`).
    pub login_address: String,
    /// The user's `$HOME` in the login pod.
    pub home: String,
    pub key: PublicKey,
}

#[derive(Debug, Clone)]
pub struct Offboarding {
    pub user: Username,
    pub tenant: TenantName,
    /// Until when `$HOME` is kept before deletion (YYYY-MM-DD), if known.
    pub retained_until: Option<String>,
}

impl Onboarding {
    pub fn message(&self) -> Message {
        let (u, t, a) = (&self.user, &self.tenant, &self.account);
        let mut text = format!("Hello {u},\n\nyour account on the GPU cluster is ready.\n\n");
        let _ = writeln!(text, "  Login:    ssh {u}@{}", self.login_address);
        let _ = writeln!(text, "  Key:      {} ({})", self.key.fingerprint(), self.key.kind());
        let _ = writeln!(text, "  Tenant:   {t}");
        let _ = writeln!(text, "  Account:  {a}");
        text.push_str("\nCheck that the key fingerprint above is yours before you log in.\n\nFirst steps:\n");
        let _ = writeln!(text, "  1. ssh {u}@{} and look around: your $HOME is {}.", self.login_address, self.home);
        let _ = writeln!(text, "  2. sacctmgr show association user={u}   (your Slurm account and limits)");
        let _ = writeln!(text, "  3. sbatch --account={a} --gres=gpu:1 --time=10:00 --wrap \"nvidia-smi\"");
        text.push_str("  4. squeue --me   to watch your jobs; large data goes to scratch, not $HOME.\n");
        Message { subject: format!("Your GPU cluster account for {t} is ready"), text, id: None }
    }
}

impl Offboarding {
    pub fn message(&self) -> Message {
        let (u, t) = (&self.user, &self.tenant);
        let mut text = format!(
            "Hello {u},\n\nyour access to the GPU cluster for {t} has ended. You can no longer log in or submit jobs.\n"
        );
        if let Some(d) = &self.retained_until {
            let _ = write!(
                text,
                "\nYour home directory is kept until {d}; ask your tenant administrator if you need files from it.\n"
            );
        }
        text.push_str("\nYour past jobs stay in the accounting records (sacct).\n");
        Message { subject: format!("Your GPU cluster access for {t} has ended"), text, id: None }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn onboarding_says_what_matters() {
        let key =
            PublicKey::parse("ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl a")
                .unwrap();
        let m = Onboarding {
            user: Username::parse("alice").unwrap(),
            tenant: TenantName::parse("tenant-foo").unwrap(),
            account: SlurmAccount::parse("ml-team").unwrap(),
            login_address: "login.tenant-foo.example".into(),
            home: "/homes/alice".into(),
            key: key.clone(),
        }
        .message();
        for part in [
            "ssh alice@login.tenant-foo.example",
            &key.fingerprint(),
            "tenant-foo",
            "--account=ml-team",
            "$HOME is /homes/alice",
        ] {
            assert!(m.text.contains(part), "missing {part}");
        }
        let off = Offboarding {
            user: Username::parse("alice").unwrap(),
            tenant: TenantName::parse("tenant-foo").unwrap(),
            retained_until: Some("2026-12-30".into()),
        }
        .message();
        assert!(off.text.contains("kept until 2026-12-30"));
    }
}
