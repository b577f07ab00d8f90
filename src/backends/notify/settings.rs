//! Notification settings: each a flag with an environment variable and a default.

use std::time::Duration;

use clap::Args;

use crate::domain::{duration::parse_duration, secret::Secret};

#[derive(Clone, Debug, Args)]
pub struct NotifyArgs {
    /// Slack-compatible incoming webhook URL; unset = no Slack messages.
    #[arg(long, env = "ONRAMP_SLACK_WEBHOOK_URL", hide_env_values = true, value_name = "URL")]
    pub slack_webhook_url: Option<Secret>,
    /// SMTP server, e.g. smtps://user:pass@mail.example.org or smtp://127.0.0.1:2525; unset = no e-mail.
    #[arg(long, env = "ONRAMP_SMTP_URL", hide_env_values = true, value_name = "URL")]
    pub smtp_url: Option<Secret>,
    /// Sender of e-mails.
    #[arg(long, env = "ONRAMP_MAIL_FROM", default_value = "onramp <onramp@localhost>")]
    pub mail_from: String,
    /// Address users SSH to; `{tenant}` replaced.
    #[arg(long, env = "ONRAMP_LOGIN_ADDRESS", default_value = "login.{tenant}.cluster.example")]
    pub login_address: String,
    /// Longest wait for one notification.
    #[arg(long, env = "ONRAMP_NOTIFY_TIMEOUT", default_value = "20s", value_parser = parse_duration)]
    pub notify_timeout: Duration,
}

impl NotifyArgs {
    pub fn defaults() -> Self {
        #[derive(clap::Parser)]
        struct P {
            #[command(flatten)]
            a: NotifyArgs,
        }
        <P as clap::Parser>::parse_from(["onramp"]).a
    }
}
