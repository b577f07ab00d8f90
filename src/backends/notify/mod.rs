//! Notifications to users: a Slack-compatible incoming webhook and SMTP e-mail, behind one
//! trait, [`Notifier`], with the onboarding and offboarding texts in [`templates`].
//!
//! How flows treat a notification: it is the last step of a flow, after every effect has been
//! made and verified. A failure is retryable (the step retries with its own policy; only a
//! missing or refused address is not, [`NotifyError::is_retryable`]) and never blocks or
//! undoes anything else: when its retries run out, or the error is permanent, the job records
//! the notification as failed and the onboarding or offboarding itself stays done. A retried step may send a
//! message twice only if the first attempt's answer was lost; flows record a sent message in
//! the step's result so that a re-run of the job does not send it again.

pub mod email;
pub mod settings;
pub mod slack;
pub mod templates;

use std::future::Future;
use std::pin::Pin;

pub use email::Email;
pub use settings::NotifySettings;
pub use slack::Slack;
pub use templates::{Message, Offboarding, Onboarding};

use crate::domain::names::Username;

/// Who a message is for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recipient {
    pub user: Username,
    /// From Authentik; e-mail needs it, Slack does not.
    pub email: Option<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum NotifyError {
    #[error("notification via {channel}: {reason}")]
    Send {
        channel: &'static str,
        reason: String,
        #[source]
        source: Option<Box<dyn std::error::Error + Send + Sync>>,
    },
    /// Cannot work as configured or addressed (no address, a bad address); retrying won't help.
    #[error("notification via {channel}: {reason}")]
    Unusable { channel: &'static str, reason: String },
}

impl NotifyError {
    pub fn is_retryable(&self) -> bool {
        matches!(self, Self::Send { .. })
    }
}

pub type NotifyFuture<'a> = Pin<Box<dyn Future<Output = Result<(), NotifyError>> + Send + 'a>>;

/// Sends one message to one person.
pub trait Notifier: Send + Sync {
    fn send<'a>(&'a self, to: &'a Recipient, msg: &'a Message) -> NotifyFuture<'a>;
}
