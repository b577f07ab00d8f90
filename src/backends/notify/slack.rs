//! Slack-compatible incoming webhooks (Slack, Mattermost, Rocket.Chat): `POST {"text": …}`.

use std::time::Duration;

use serde_json::json;

use super::{Message, Notifier, NotifyError, NotifyFuture, Recipient};
use crate::domain::secret::Secret;

const CHANNEL: &str = "slack";

#[derive(Clone)]
pub struct Slack {
    http: reqwest::Client,
    url: Secret,
}

impl Slack {
    pub fn new(url: Secret, timeout: Duration) -> Result<Self, NotifyError> {
        let http = reqwest::Client::builder()
            .timeout(timeout)
            .build()
            .map_err(|e| NotifyError::Unusable { channel: CHANNEL, reason: e.to_string() })?;
        Ok(Self { http, url })
    }
}

impl Notifier for Slack {
    fn send<'a>(&'a self, to: &'a Recipient, msg: &'a Message) -> NotifyFuture<'a> {
        Box::pin(async move {
            let body = json!({"text": format!("*{}* (for {})\n{}", msg.subject, to.user, msg.text)});
            // The URL is a credential: errors are reported without it.
            let fail = |reason: String, e: Option<reqwest::Error>| NotifyError::Send {
                channel: CHANNEL,
                reason,
                source: e.map(|e| Box::new(e.without_url()) as _),
            };
            let res = self
                .http
                .post(self.url.expose())
                .json(&body)
                .send()
                .await
                .map_err(|e| fail("request failed".into(), Some(e)))?;
            let status = res.status();
            if !status.is_success() {
                let text: String = res.text().await.unwrap_or_default().chars().take(200).collect();
                return Err(fail(format!("webhook answered {status}: {text}"), None));
            }
            Ok(())
        })
    }
}
