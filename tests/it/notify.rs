//! Notifications: a Slack receiver (axum) records the JSON; a real SMTP server
//! (`python3 -m aiosmtpd`, from PyPI) receives the e-mail into a maildir the test reads.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::post;
use onramp::backends::notify::{Email, Message, Notifier, NotifySettings, Onboarding, Recipient, Slack};
use onramp::domain::names::{SlurmAccount, TenantName, Username};
use onramp::domain::secret::Secret;
use onramp::domain::sshkey::PublicKey;
use serde_json::Value;

use crate::common::eventually;

const KEY: &str = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl alice@laptop";

fn onboarding() -> Message {
    Onboarding {
        user: Username::parse("alice").unwrap(),
        tenant: TenantName::parse("tenant-foo").unwrap(),
        account: SlurmAccount::parse("ml-team").unwrap(),
        login_address: "login.tenant-foo.example".into(),
        home: "/home/alice".into(),
        key: PublicKey::parse(KEY).unwrap(),
    }
    .message()
}

fn alice(email: Option<&str>) -> Recipient {
    Recipient { user: Username::parse("alice").unwrap(), email: email.map(Into::into) }
}

type Seen = Arc<Mutex<Vec<Value>>>;

/// A Slack-compatible receiver answering `status`; returns its URL and what it received.
async fn receiver(status: StatusCode) -> (String, Seen) {
    let seen: Seen = Arc::default();
    let app = Router::new()
        .route(
            "/hooks/T000/B000/secret-token",
            post(|State((seen, status)): State<(Seen, StatusCode)>, axum::Json(v): axum::Json<Value>| async move {
                seen.lock().unwrap().push(v);
                (status, "ok")
            }),
        )
        .with_state((seen.clone(), status));
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(l, app).await.unwrap() });
    (format!("http://{addr}/hooks/T000/B000/secret-token"), seen)
}

#[tokio::test]
async fn slack_webhook_gets_the_message() {
    let (url, seen) = receiver(StatusCode::OK).await;
    let slack = Slack::new(Secret::new(url), Duration::from_secs(5)).unwrap();
    let msg = onboarding();
    slack.send(&alice(None), &msg).await.unwrap();
    let got = seen.lock().unwrap().clone();
    let text = got[0]["text"].as_str().unwrap();
    assert!(text.contains(&msg.subject) && text.contains(&PublicKey::parse(KEY).unwrap().fingerprint()), "{text}");

    let (url, _) = receiver(StatusCode::SERVICE_UNAVAILABLE).await;
    let slack = Slack::new(Secret::new(url), Duration::from_secs(5)).unwrap();
    let e = slack.send(&alice(None), &msg).await.unwrap_err();
    assert!(e.is_retryable());
    assert!(e.to_string().contains("503") && !format!("{e:?}").contains("secret-token"), "{e:?}");
    let dead = Slack::new(Secret::new("http://127.0.0.1:9/hooks/secret-token"), Duration::from_secs(5)).unwrap();
    let e = dead.send(&alice(None), &msg).await.unwrap_err();
    assert!(e.is_retryable() && !format!("{e:?}").contains("secret-token"), "{e:?}");
}

pub struct Smtpd {
    pub child: tokio::process::Child,
    pub port: u16,
    maildir: tempfile::TempDir,
}

impl Smtpd {
    pub async fn start() -> Self {
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let maildir = tempfile::tempdir().unwrap();
        let child = tokio::process::Command::new("python3")
            .args(["-m", "aiosmtpd", "-n", "-l", &format!("127.0.0.1:{port}"), "-c", "aiosmtpd.handlers.Mailbox"])
            .arg(maildir.path().join("mail"))
            .kill_on_drop(true)
            .spawn()
            .expect("python3 with aiosmtpd (pip install aiosmtpd)");
        eventually(
            Duration::from_secs(15),
            "aiosmtpd to listen (is it installed? pip install aiosmtpd)",
            || async move { tokio::net::TcpStream::connect(("127.0.0.1", port)).await.ok().map(|_| ()) },
        )
        .await;
        Self { child, port, maildir }
    }

    pub fn messages(&self) -> Vec<String> {
        let dir = self.maildir.path().join("mail/new");
        std::fs::read_dir(dir)
            .map(|d| d.map(|e| std::fs::read_to_string(e.unwrap().path()).unwrap()).collect())
            .unwrap_or_default()
    }
}

#[tokio::test]
async fn email_reaches_a_real_smtp_server() {
    let mut smtpd = Smtpd::start().await;
    let s = NotifySettings {
        smtp_url: Some(Secret::new(format!("smtp://127.0.0.1:{}", smtpd.port))),
        mail_from: "onramp <onramp@cluster.example>".into(),
        ..Default::default()
    };
    let email = Email::from_settings(&s).unwrap().unwrap();
    let msg = onboarding();
    email.send(&alice(Some("alice@example.org")), &msg).await.unwrap();
    let got = eventually(Duration::from_secs(10), "the e-mail in the maildir", || {
        let m = smtpd.messages();
        async move { m.into_iter().next() }
    })
    .await;
    assert!(got.contains("To: alice@example.org") && got.contains("From: onramp <onramp@cluster.example>"), "{got}");
    assert!(got.contains(&format!("Subject: {}", msg.subject)), "{got}");
    assert!(got.contains(&PublicKey::parse(KEY).unwrap().fingerprint()), "{got}");
    assert!(got.lines().any(|l| l.starts_with("Message-ID: <")), "{got}");

    // A message with an id carries it as its Message-ID, in mail-from's domain, on every send.
    let with_id = Message { id: Some("onramp.job7.notify.alice".into()), ..msg.clone() };
    email.send(&alice(Some("alice@example.org")), &with_id).await.unwrap();
    email.send(&alice(Some("alice@example.org")), &with_id).await.unwrap();
    let ids = eventually(Duration::from_secs(10), "both copies in the maildir", || {
        let m = smtpd.messages();
        async move { (m.len() == 3).then_some(m) }
    })
    .await
    .iter()
    .filter(|m| m.lines().any(|l| l == "Message-ID: <onramp.job7.notify.alice@cluster.example>"))
    .count();
    assert_eq!(ids, 2);

    // No address: permanent. Server gone: retryable.
    assert!(!email.send(&alice(None), &msg).await.unwrap_err().is_retryable());
    smtpd.child.kill().await.unwrap();
    let e = email.send(&alice(Some("alice@example.org")), &msg).await.unwrap_err();
    assert!(e.is_retryable(), "{e}");
}
