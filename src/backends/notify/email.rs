//! SMTP e-mail through lettre (tokio, rustls).

use std::sync::Arc;

use lettre::message::Mailbox;
use lettre::{AsyncSmtpTransport, AsyncTransport, Tokio1Executor};

use super::{Message, Notifier, NotifyError, NotifyFuture, NotifySettings, Recipient};

const CHANNEL: &str = "e-mail";

/// SMTP sessions at once per process (each send is a session of its own). Relays limit the
/// connections of one client (Postfix: 50); the worker may run hundreds of steps at once.
const SESSIONS: usize = 8;

#[derive(Clone)]
pub struct Email {
    transport: AsyncSmtpTransport<Tokio1Executor>,
    from: Mailbox,
    sessions: Arc<tokio::sync::Semaphore>,
}

impl Email {
    /// From `--smtp-url` and `--mail-from`; `None` when no SMTP server is configured.
    pub fn from_settings(s: &NotifySettings) -> Result<Option<Self>, NotifyError> {
        let Some(url) = &s.smtp_url else {
            return Ok(None);
        };
        let unusable = |reason: String| NotifyError::Unusable { channel: CHANNEL, reason };
        let transport = AsyncSmtpTransport::<Tokio1Executor>::from_url(url.expose())
            .map_err(|e| unusable(format!("--smtp-url is not usable: {e}")))?
            .timeout(Some(s.notify_timeout))
            .build();
        let from = s.mail_from.parse().map_err(|e| unusable(format!("--mail-from {:?}: {e}", s.mail_from)))?;
        Ok(Some(Self { transport, from, sessions: Arc::new(tokio::sync::Semaphore::new(SESSIONS)) }))
    }
}

impl Notifier for Email {
    fn send<'a>(&'a self, to: &'a Recipient, msg: &'a Message) -> NotifyFuture<'a> {
        Box::pin(async move {
            let unusable = |reason: String| NotifyError::Unusable { channel: CHANNEL, reason };
            let addr = to.email.as_deref().ok_or_else(|| unusable(format!("{} has no e-mail address", to.user)))?;
            let mailbox: Mailbox =
                addr.parse().map_err(|e| unusable(format!("{addr:?} is not an e-mail address: {e}")))?;
            let message_id = msg.id.as_ref().map(|id| format!("<{id}@{}>", self.from.email.domain()));
            let email = lettre::Message::builder()
                .message_id(message_id)
                .from(self.from.clone())
                .to(mailbox)
                .subject(&msg.subject)
                .body(msg.text.clone())
                .map_err(|e| unusable(e.to_string()))?;
            let _session = self.sessions.acquire().await.expect("the semaphore is never closed");
            self.transport.send(email).await.map_err(|e| {
                if e.is_permanent() {
                    // A 5xx answer (no such mailbox, relaying denied): retrying won't help.
                    unusable(format!("the SMTP server refused the message: {e}"))
                } else {
                    NotifyError::Send {
                        channel: CHANNEL,
                        reason: "the SMTP server did not take the message".into(),
                        source: Some(Box::new(e)),
                    }
                }
            })?;
            Ok(())
        })
    }
}
