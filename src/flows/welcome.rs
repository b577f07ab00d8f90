//! `user.onboard`'s last step, the runbook's step 7: tell the user (e-mail or Slack) the login
//! address with the tenant's name filled in, their `$HOME`, and the key fingerprint to verify.

use serde_json::json;

use super::StepResult;
use super::backends::Backends;
use super::user_onboard::{Names, Step, resolved};
use crate::backends::notify::{Message, Notifier, NotifyError, Onboarding, Recipient};
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
    Ok(match send_once(notifier.as_ref(), ctx, &to, msg).await? {
        Ok(msg) => Transition::Done(json!({ "sent": true, "to": r.email, "subject": msg.subject,
                                            "login_address": b.login_address_of(&n.tenant) })),
        Err(e) if e.is_retryable() && ctx.attempt < 4 => Transition::Retry(e.to_string()),
        Err(e) => Transition::Done(json!({ "sent": false, "error": e.to_string() })),
    })
}

/// Sends `msg` once for this job's step. The message gets an id derived from the job and step,
/// the same on every attempt, so any copy is recognisably the same message. The send is recorded
/// the moment the server has taken it, in a commit of its own, not only with the step's result: an
/// attempt run again because its worker died in between finds the record and sends nothing.
/// (Only a death between the server's answer and that commit, a round trip, can still send the
/// same message twice.) `Err` when the record cannot be read: the step retries.
pub(super) async fn send_once(
    notifier: &dyn Notifier,
    ctx: &StepCtx,
    to: &Recipient,
    mut msg: Message,
) -> Result<Result<Message, NotifyError>, Transition> {
    let mark = format!("{}:sent", ctx.step);
    // by the job's name, not its id alone: a mail system drops a message whose Message-ID it has seen
    msg.id = Some(format!("onramp.{}.{}.{}", ctx.job_name(), ctx.step, to.user));
    if let Some(jobs) = &ctx.jobs {
        let sent = jobs.marked(ctx.job_id, &mark).await;
        if sent.map_err(|e| Transition::Retry(format!("read whether the message was sent: {e}")))? {
            tracing::info!(job = ctx.job_id, step = ctx.step, "the message was sent by an earlier attempt");
            return Ok(Ok(msg));
        }
    }
    if let Err(e) = notifier.send(to, &msg).await {
        return Ok(Err(e));
    }
    if let Some(jobs) = &ctx.jobs
        && let Err(e) = jobs.mark(ctx.job_id, &mark).await
    {
        // The step's result, written next, records the send as well.
        tracing::warn!(job = ctx.job_id, step = ctx.step, error = %e, "could not record the message as sent");
    }
    Ok(Ok(msg))
}
