//! `user.onboard`'s last step, the runbook's step 7: tell the user (e-mail or Slack) the login
//! address with the tenant's name filled in, their `$HOME`, and the key fingerprint to verify.

use serde_json::json;

use super::StepResult;
use super::backends::Backends;
use super::user_onboard::{Names, Step, resolved};
use crate::backends::notify::{Onboarding, Recipient};
use crate::domain::sshkey::PublicKey;
use crate::engine::{StepCtx, Transition};

/// Runbook step 7. A failure here is recorded, never undoes or blocks the onboarding.
pub(super) async fn notify(b: &Backends, n: &Names, ctx: &StepCtx) -> StepResult {
    let Some(notifier) = &b.notifier else {
        return Ok(Transition::Done(json!({ "sent": false, "why": "no notification channel is configured" })));
    };
    let r = resolved(ctx)?;
    let key = PublicKey::parse(&r.key).map_err(|e| Transition::Fail(format!("key: {e}")))?;
    let msg = Onboarding {
        user: n.user.clone(),
        tenant: n.tenant.clone(),
        account: n.account.clone(),
        login_address: b.login_address_of(&n.tenant),
        // where `home_directory` made it (the login pod's home root), as the user will find it
        home: ctx
            .output(Step::HomeDirectory.name())
            .and_then(|o| o.get("home")?.as_str().map(str::to_string))
            .unwrap_or_else(|| format!("/home/{}", n.user)),
        key,
    }
    .message();
    let to = Recipient { user: n.user.clone(), email: (!r.email.is_empty()).then(|| r.email.clone()) };
    Ok(match notifier.send(&to, &msg).await {
        Ok(()) => Transition::Done(json!({ "sent": true, "to": r.email, "subject": msg.subject,
                                           "login_address": b.login_address_of(&n.tenant) })),
        Err(e) if e.is_retryable() && ctx.attempt < 4 => Transition::Retry(e.to_string()),
        Err(e) => Transition::Done(json!({ "sent": false, "error": e.to_string() })),
    })
}
