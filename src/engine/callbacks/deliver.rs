//! One delivery: the Standard Webhooks payload and headers, the POST, and what its answer means.

use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;
use hmac::{Hmac, Mac};
use serde_json::json;
use sha2::Sha256;
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

use super::Secret;
use super::log::EventSummary;

/// `v1,<base64 HMAC-SHA256 of "{id}.{timestamp}.{body}">`, keyed with the base64-decoded part of
/// `whsec_…` after the prefix.
pub fn sign(secret: &Secret, id: &str, timestamp: i64, body: &[u8]) -> String {
    let b64 = secret.expose().strip_prefix("whsec_").unwrap_or(secret.expose());
    let key = B64.decode(b64).unwrap_or_else(|_| b64.as_bytes().to_vec());
    let mut m = Hmac::<Sha256>::new_from_slice(&key).expect("HMAC takes any key length");
    m.update(id.as_bytes());
    m.update(b".");
    m.update(timestamp.to_string().as_bytes());
    m.update(b".");
    m.update(body);
    format!("v1,{}", B64.encode(m.finalize().into_bytes()))
}

/// The body of one event: `{"type", "timestamp", "data"}`.
pub fn payload(e: &EventSummary) -> Vec<u8> {
    let body = json!({
        "type": format!("job.{}", e.state),
        "timestamp": e.at.format(&Rfc3339).unwrap_or_default(),
        "data": e,
    });
    serde_json::to_vec(&body).expect("JSON of plain values")
}

/// How an attempt ended.
#[derive(Debug, PartialEq, Eq)]
pub enum Outcome {
    Delivered,
    /// Try again; `retry_after` when the receiver said when (429 or 503 with `Retry-After`).
    Failed {
        status: Option<u16>,
        error: String,
        retry_after: Option<Duration>,
    },
}

/// POSTs one event. The error never names the URL (it may carry a token) nor the secret.
pub async fn post(http: &reqwest::Client, url: &str, secret: &Secret, e: &EventSummary) -> Outcome {
    let body = payload(e);
    let id = format!("evt_{}", e.event_id);
    let ts = OffsetDateTime::now_utc().unix_timestamp();
    let signature = sign(secret, &id, ts, &body);
    let res = http
        .post(url)
        .header("content-type", "application/json")
        .header("webhook-id", &id)
        .header("webhook-timestamp", ts.to_string())
        .header("webhook-signature", signature)
        .body(body)
        .send()
        .await;
    match res {
        Ok(r) if r.status().is_success() => Outcome::Delivered,
        Ok(r) => {
            let status = r.status().as_u16();
            let retry_after = matches!(status, 429 | 503)
                .then(|| r.headers().get("retry-after").and_then(|v| v.to_str().ok()).and_then(retry_after))
                .flatten();
            Outcome::Failed { status: Some(status), error: format!("the receiver answered HTTP {status}"), retry_after }
        }
        Err(e) => {
            let what = if e.is_timeout() {
                "timed out"
            } else if e.is_connect() {
                "could not connect"
            } else {
                "the request failed"
            };
            Outcome::Failed { status: None, error: format!("{what}: {}", e.without_url()), retry_after: None }
        }
    }
}

/// `Retry-After` as seconds or an HTTP date.
fn retry_after(v: &str) -> Option<Duration> {
    let v = v.trim();
    if let Ok(s) = v.parse::<u64>() {
        return Some(Duration::from_secs(s));
    }
    let fmt = time::macros::format_description!(
        "[weekday repr:short], [day] [month repr:short] [year] [hour]:[minute]:[second] GMT"
    );
    let at = time::PrimitiveDateTime::parse(v, &fmt).ok()?.assume_utc();
    Some((at - OffsetDateTime::now_utc()).try_into().unwrap_or(Duration::ZERO))
}

/// The delay before attempt `attempts + 1`: `base` doubled per failed attempt, jittered into
/// [half, full], at most `max`; the receiver's `Retry-After` instead when it gave one (capped too).
pub fn backoff(attempts: u32, base: Duration, max: Duration, retry_after: Option<Duration>, jitter: f64) -> Duration {
    if let Some(d) = retry_after {
        return d.min(max);
    }
    let exp = base.saturating_mul(1u32 << attempts.saturating_sub(1).min(20)).min(max);
    exp.mul_f64(0.5 + 0.5 * jitter.clamp(0.0, 1.0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signs_like_the_standard_webhooks_example() {
        // the example of the Standard Webhooks specification
        let secret = Secret::new("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw");
        let body = br#"{"test": 2432232314}"#;
        let sig = sign(&secret, "msg_p5jXN8AQM9LWM0D4loKWxJek", 1614265330, body);
        assert_eq!(sig, "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=");
    }

    #[test]
    fn backoff_doubles_is_capped_and_honours_retry_after() {
        let (b, max) = (Duration::from_secs(1), Duration::from_secs(60));
        assert_eq!(backoff(1, b, max, None, 1.0), Duration::from_secs(1));
        assert_eq!(backoff(3, b, max, None, 1.0), Duration::from_secs(4));
        assert_eq!(backoff(3, b, max, None, 0.0), Duration::from_secs(2));
        assert_eq!(backoff(30, b, max, None, 1.0), max);
        assert_eq!(backoff(3, b, max, Some(Duration::from_secs(7)), 0.0), Duration::from_secs(7));
        assert_eq!(backoff(3, b, max, Some(Duration::from_secs(7200)), 0.0), max);
    }

    #[test]
    fn retry_after_is_seconds_or_a_date() {
        assert_eq!(retry_after(" 3 "), Some(Duration::from_secs(3)));
        assert_eq!(retry_after("Wed, 21 Oct 2015 07:28:00 GMT"), Some(Duration::ZERO));
        assert_eq!(retry_after("soon"), None);
    }
}
