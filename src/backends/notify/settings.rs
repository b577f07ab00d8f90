//! Notification settings, plain values; `app::cli` parses them from flags and the environment.

use std::time::Duration;

use crate::domain::secret::Secret;

/// Notifications: SMTP and/or Slack, the sender and the login address users are told.
#[derive(Clone, Debug, PartialEq)]
pub struct NotifySettings {
    /// Slack-compatible incoming webhook URL; unset = no Slack messages.
    pub slack_webhook_url: Option<Secret>,
    /// SMTP server, e.g. smtps://user:pass@mail.example.org or smtp://127.0.0.1:2525; unset = no e-mail.
    pub smtp_url: Option<Secret>,
    /// Sender of e-mails.
    pub mail_from: String,
    /// Address users SSH to; `{tenant}` replaced.
    pub login_address: String,
    /// Longest wait for one notification.
    pub notify_timeout: Duration,
}

impl Default for NotifySettings {
    /// The defaults `--help` shows (a test in `app::cli` keeps them equal).
    fn default() -> Self {
        Self {
            slack_webhook_url: Default::default(),
            smtp_url: Default::default(),
            mail_from: "onramp <onramp@localhost>".into(),
            login_address: "login.{tenant}.cluster.example".into(),
            notify_timeout: Duration::from_secs(20),
        }
    }
}
