//! Fingerprints equal what `ssh-keygen -lf` prints for the same key (Debian's openssh-client).

use onramp::backends::exec::{Command, Local, Transport};
use onramp::domain::sshkey::PublicKey;
use std::time::Duration;

#[tokio::test]
async fn fingerprints_match_ssh_keygen() {
    let dir = tempfile::tempdir().unwrap();
    for (kind, bits) in [("ed25519", None), ("rsa", Some("3072")), ("ecdsa", Some("256"))] {
        let path = dir.path().join(kind).display().to_string();
        let mut keygen =
            Command::new("ssh-keygen").args(["-q", "-t", kind, "-N", "", "-C", "test@example", "-f", &path]);
        if let Some(b) = bits {
            keygen = keygen.args(["-b", b]);
        }
        let t = Duration::from_secs(30);
        let o = Local.run(&keygen, t).await.expect("ssh-keygen (apt-get install openssh-client)");
        assert!(o.success(), "{o:?}");
        let line = std::fs::read_to_string(format!("{path}.pub")).unwrap();
        let key = PublicKey::parse(&line).unwrap();
        let o = Local
            .run(&Command::new("ssh-keygen").args(["-l", "-E", "sha256", "-f", &format!("{path}.pub")]), t)
            .await
            .unwrap();
        let theirs = o.stdout.split_whitespace().nth(1).unwrap().to_string();
        assert_eq!(key.fingerprint(), theirs, "{kind}");
    }
}
