//! Authenticating a webhook delivery: Standard Webhooks v1 signatures and/or bearer tokens.
//! A pure function over the raw bytes and headers, run before anything parses the body.
//!
//! A signature is `base64(HMAC-SHA256(key, "{webhook-id}.{webhook-timestamp}.{raw body}"))`,
//! sent as `webhook-signature: v1,<sig> [v1,<sig> …]` (one per key the sender signs with).

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;
use hmac::{Hmac, Mac};
use sha2::Sha256;

use crate::domain::secret::{Secret, constant_time_eq};

/// A `whsec_<base64>` signing key, decoded. Never printed.
#[derive(Clone, PartialEq, Eq)]
pub struct SigningSecret(Vec<u8>);

impl SigningSecret {
    pub fn from_bytes(key: Vec<u8>) -> Self {
        Self(key)
    }
    /// Signs `{id}.{timestamp}.{body}` (for tests and tools that play the sender).
    pub fn sign(&self, id: &str, timestamp: i64, body: &[u8]) -> String {
        format!("v1,{}", B64.encode(self.mac(id, timestamp, body)))
    }
    fn mac(&self, id: &str, timestamp: i64, body: &[u8]) -> Vec<u8> {
        let mut m = Hmac::<Sha256>::new_from_slice(&self.0).expect("HMAC takes any key length");
        m.update(id.as_bytes());
        m.update(b".");
        m.update(timestamp.to_string().as_bytes());
        m.update(b".");
        m.update(body);
        m.finalize().into_bytes().to_vec()
    }
}

impl fmt::Debug for SigningSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[redacted]")
    }
}

impl FromStr for SigningSecret {
    type Err = String;
    /// `whsec_<base64>`; the prefix is optional, the key must be at least 16 bytes.
    fn from_str(s: &str) -> Result<Self, String> {
        let b64 = s.trim().strip_prefix("whsec_").unwrap_or(s.trim());
        let key = B64.decode(b64).map_err(|_| "a signing secret is whsec_ followed by base64".to_string())?;
        if key.len() < 16 {
            return Err("a signing secret must decode to at least 16 bytes".into());
        }
        Ok(Self(key))
    }
}

/// What a delivery must prove, from configuration. With both lists non-empty, both are required.
#[derive(Clone, Debug, Default)]
pub struct WebhookAuth {
    /// Any of these may have signed the delivery (several during a rotation).
    pub signing_secrets: Vec<SigningSecret>,
    /// Any of these may be presented as `Authorization: Bearer …`.
    pub bearer_tokens: Vec<Secret>,
    /// Largest accepted distance between `webhook-timestamp` and now.
    pub tolerance: Duration,
}

/// The headers verification reads; absent ones are `None`.
#[derive(Clone, Copy, Debug, Default)]
pub struct AuthHeaders<'a> {
    pub webhook_id: Option<&'a str>,
    pub webhook_timestamp: Option<&'a str>,
    pub webhook_signature: Option<&'a str>,
    pub authorization: Option<&'a str>,
}

/// Why a delivery was refused: for the log and metrics only, never for the sender.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum AuthFailure {
    #[error("no authentication is configured")]
    NotConfigured,
    #[error("webhook-id, webhook-timestamp or webhook-signature is missing")]
    MissingSignatureHeaders,
    #[error("webhook-id is not a usable id")]
    BadId,
    #[error("webhook-timestamp is not unix seconds")]
    BadTimestamp,
    #[error("webhook-timestamp is too old")]
    Stale,
    #[error("webhook-timestamp is in the future")]
    Future,
    #[error("no signature matches")]
    NoMatchingSignature,
    #[error("no bearer token presented")]
    MissingBearer,
    #[error("the bearer token does not match")]
    WrongBearer,
}

impl AuthFailure {
    /// A stable label for metrics.
    pub fn kind(self) -> &'static str {
        match self {
            Self::NotConfigured => "not_configured",
            Self::MissingSignatureHeaders => "missing_headers",
            Self::BadId => "bad_id",
            Self::BadTimestamp => "bad_timestamp",
            Self::Stale => "stale",
            Self::Future => "future",
            Self::NoMatchingSignature => "signature",
            Self::MissingBearer => "missing_bearer",
            Self::WrongBearer => "bearer",
        }
    }
}

/// A verified delivery: its `webhook-id` when it was signed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Verified {
    pub webhook_id: Option<String>,
}

impl WebhookAuth {
    pub fn is_configured(&self) -> bool {
        !self.signing_secrets.is_empty() || !self.bearer_tokens.is_empty()
    }

    /// Checks the raw `body` against the headers at `now` (unix seconds).
    pub fn verify(&self, h: &AuthHeaders<'_>, body: &[u8], now: i64) -> Result<Verified, AuthFailure> {
        if !self.is_configured() {
            return Err(AuthFailure::NotConfigured);
        }
        let mut webhook_id = None;
        if !self.signing_secrets.is_empty() {
            webhook_id = Some(self.verify_signature(h, body, now)?);
        }
        if !self.bearer_tokens.is_empty() {
            self.verify_bearer(h)?;
        }
        Ok(Verified { webhook_id })
    }

    fn verify_signature(&self, h: &AuthHeaders<'_>, body: &[u8], now: i64) -> Result<String, AuthFailure> {
        let (Some(id), Some(ts), Some(sigs)) = (h.webhook_id, h.webhook_timestamp, h.webhook_signature) else {
            return Err(AuthFailure::MissingSignatureHeaders);
        };
        if id.is_empty() || id.len() > 256 || !id.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(AuthFailure::BadId);
        }
        let ts_num: i64 = ts.trim().parse().map_err(|_| AuthFailure::BadTimestamp)?;
        let tol = self.tolerance.as_secs() as i64;
        if ts_num < now.saturating_sub(tol) {
            return Err(AuthFailure::Stale);
        }
        if ts_num > now.saturating_add(tol) {
            return Err(AuthFailure::Future);
        }
        // Decode every offered v1 signature; anything else (other versions, junk, empty) is skipped.
        let offered: Vec<Vec<u8>> = sigs
            .split(' ')
            .filter_map(|s| s.strip_prefix("v1,"))
            .filter(|b64| !b64.is_empty())
            .filter_map(|b64| B64.decode(b64).ok())
            .filter(|raw| raw.len() == 32)
            .collect();
        let mut ok = false;
        for key in &self.signing_secrets {
            let expected = key.mac(id, ts_num, body);
            for sig in &offered {
                // no early exit: the time taken does not depend on which one matched
                ok |= constant_time_eq(&expected, sig);
            }
        }
        if ok { Ok(id.to_string()) } else { Err(AuthFailure::NoMatchingSignature) }
    }

    fn verify_bearer(&self, h: &AuthHeaders<'_>) -> Result<(), AuthFailure> {
        let given = h
            .authorization
            .and_then(|v| v.strip_prefix("Bearer ").or_else(|| v.strip_prefix("bearer ")))
            .map(str::trim)
            .filter(|t| !t.is_empty())
            .ok_or(AuthFailure::MissingBearer)?;
        let mut ok = false;
        for t in &self.bearer_tokens {
            ok |= constant_time_eq(given.as_bytes(), t.expose().as_bytes());
        }
        if ok { Ok(()) } else { Err(AuthFailure::WrongBearer) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: i64 = 1_764_460_800;
    const BODY: &[u8] = br#"{"event_uuid": "0b8e", "action": "model_updated"}"#;

    fn key(n: u8) -> SigningSecret {
        SigningSecret::from_bytes(vec![n; 32])
    }

    fn signed(auth_key: &SigningSecret, ts: i64, body: &[u8]) -> (String, String) {
        (ts.to_string(), auth_key.sign("msg_1", ts, body))
    }

    fn headers<'a>(ts: &'a str, sig: &'a str) -> AuthHeaders<'a> {
        AuthHeaders {
            webhook_id: Some("msg_1"),
            webhook_timestamp: Some(ts),
            webhook_signature: Some(sig),
            authorization: None,
        }
    }

    fn sig_auth(keys: Vec<SigningSecret>) -> WebhookAuth {
        WebhookAuth { signing_secrets: keys, bearer_tokens: vec![], tolerance: Duration::from_secs(300) }
    }

    #[test]
    fn the_standard_webhooks_reference_vector_verifies() {
        // From the Standard Webhooks spec's reference libraries.
        let secret: SigningSecret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw".parse().unwrap();
        let body = br#"{"test": 2432232314}"#;
        let sig = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=";
        assert_eq!(secret.sign("msg_p5jXN8AQM9LWM0D4loKWxJek", 1614265330, body), sig);
        let auth = sig_auth(vec![secret]);
        let h = AuthHeaders {
            webhook_id: Some("msg_p5jXN8AQM9LWM0D4loKWxJek"),
            webhook_timestamp: Some("1614265330"),
            webhook_signature: Some(sig),
            authorization: None,
        };
        assert_eq!(
            auth.verify(&h, body, 1614265330 + 10).unwrap().webhook_id.as_deref(),
            Some("msg_p5jXN8AQM9LWM0D4loKWxJek")
        );
    }

    #[test]
    fn valid_signature_passes_and_tampering_fails() {
        let auth = sig_auth(vec![key(1)]);
        let (ts, sig) = signed(&key(1), NOW, BODY);
        assert!(auth.verify(&headers(&ts, &sig), BODY, NOW).is_ok());
        let mut tampered = BODY.to_vec();
        tampered[3] ^= 1;
        assert_eq!(auth.verify(&headers(&ts, &sig), &tampered, NOW), Err(AuthFailure::NoMatchingSignature));
        // the id and timestamp are signed too
        let mut h = headers(&ts, &sig);
        h.webhook_id = Some("msg_2");
        assert_eq!(auth.verify(&h, BODY, NOW), Err(AuthFailure::NoMatchingSignature));
        let ts2 = (NOW + 1).to_string();
        assert_eq!(auth.verify(&headers(&ts2, &sig), BODY, NOW), Err(AuthFailure::NoMatchingSignature));
    }

    #[test]
    fn wrong_secret_fails() {
        let (ts, sig) = signed(&key(2), NOW, BODY);
        assert_eq!(
            sig_auth(vec![key(1)]).verify(&headers(&ts, &sig), BODY, NOW),
            Err(AuthFailure::NoMatchingSignature)
        );
    }

    #[test]
    fn rotation_accepts_any_configured_key_and_any_offered_signature() {
        let auth = sig_auth(vec![key(1), key(2)]);
        for k in [key(1), key(2)] {
            let (ts, sig) = signed(&k, NOW, BODY);
            assert!(auth.verify(&headers(&ts, &sig), BODY, NOW).is_ok());
        }
        // the sender signs with old and new key; the receiver knows only the new one
        let (ts, old) = signed(&key(9), NOW, BODY);
        let (_, new) = signed(&key(2), NOW, BODY);
        let both = format!("{old} {new}");
        assert!(sig_auth(vec![key(2)]).verify(&headers(&ts, &both), BODY, NOW).is_ok());
        assert!(sig_auth(vec![key(3)]).verify(&headers(&ts, &both), BODY, NOW).is_err());
    }

    #[test]
    fn timestamps_outside_the_window_fail() {
        let auth = sig_auth(vec![key(1)]);
        for (offset, want) in [(-301, Err(AuthFailure::Stale)), (301, Err(AuthFailure::Future))] {
            let (ts, sig) = signed(&key(1), NOW + offset, BODY);
            assert_eq!(auth.verify(&headers(&ts, &sig), BODY, NOW), want);
        }
        for offset in [-300, 300] {
            let (ts, sig) = signed(&key(1), NOW + offset, BODY);
            assert!(auth.verify(&headers(&ts, &sig), BODY, NOW).is_ok(), "{offset}");
        }
        let (_, sig) = signed(&key(1), NOW, BODY);
        assert_eq!(auth.verify(&headers("soon", &sig), BODY, NOW), Err(AuthFailure::BadTimestamp));
        assert_eq!(auth.verify(&headers("", &sig), BODY, NOW), Err(AuthFailure::BadTimestamp));
    }

    #[test]
    fn empty_and_malformed_signatures_fail() {
        let auth = sig_auth(vec![key(1)]);
        let ts = NOW.to_string();
        let good = key(1).sign("msg_1", NOW, BODY);
        let unprefixed = good.trim_start_matches("v1,").to_string();
        let v2 = good.replacen("v1,", "v2,", 1);
        let truncated = good[..good.len() - 4].to_string();
        for bad in ["", "v1,", "v1, ", " ", "v1,!!!!", "v1,AAAA", unprefixed.as_str(), v2.as_str(), truncated.as_str()]
        {
            assert_eq!(auth.verify(&headers(&ts, bad), BODY, NOW), Err(AuthFailure::NoMatchingSignature), "{bad:?}");
        }
        // an empty signature next to junk still fails; next to a good one the good one counts
        assert!(auth.verify(&headers(&ts, &format!("v1, {good}")), BODY, NOW).is_ok());
    }

    #[test]
    fn missing_headers_fail() {
        let auth = sig_auth(vec![key(1)]);
        let (ts, sig) = signed(&key(1), NOW, BODY);
        let full = headers(&ts, &sig);
        for h in [
            AuthHeaders { webhook_id: None, ..full },
            AuthHeaders { webhook_timestamp: None, ..full },
            AuthHeaders { webhook_signature: None, ..full },
            AuthHeaders::default(),
        ] {
            assert_eq!(auth.verify(&h, BODY, NOW), Err(AuthFailure::MissingSignatureHeaders));
        }
        let h = AuthHeaders { webhook_id: Some("has space"), ..full };
        assert_eq!(auth.verify(&h, BODY, NOW), Err(AuthFailure::BadId));
    }

    #[test]
    fn bearer_tokens_with_rotation() {
        let auth = WebhookAuth {
            signing_secrets: vec![],
            bearer_tokens: vec![Secret::new("old-token"), Secret::new("new-token")],
            tolerance: Duration::from_secs(300),
        };
        let with = |v: Option<&'static str>| AuthHeaders { authorization: v, ..Default::default() };
        assert_eq!(auth.verify(&with(Some("Bearer new-token")), BODY, NOW), Ok(Verified { webhook_id: None }));
        assert!(auth.verify(&with(Some("Bearer old-token")), BODY, NOW).is_ok());
        assert_eq!(auth.verify(&with(Some("Bearer new-tokeN")), BODY, NOW), Err(AuthFailure::WrongBearer));
        assert_eq!(auth.verify(&with(Some("Bearer new-token-x")), BODY, NOW), Err(AuthFailure::WrongBearer));
        assert_eq!(auth.verify(&with(Some("Bearer ")), BODY, NOW), Err(AuthFailure::MissingBearer));
        assert_eq!(auth.verify(&with(Some("Basic bmV3LXRva2Vu")), BODY, NOW), Err(AuthFailure::MissingBearer));
        assert_eq!(auth.verify(&with(None), BODY, NOW), Err(AuthFailure::MissingBearer));
    }

    #[test]
    fn both_required_when_both_configured() {
        let auth = WebhookAuth {
            signing_secrets: vec![key(1)],
            bearer_tokens: vec![Secret::new("tok")],
            tolerance: Duration::from_secs(300),
        };
        let (ts, sig) = signed(&key(1), NOW, BODY);
        let mut h = headers(&ts, &sig);
        assert_eq!(auth.verify(&h, BODY, NOW), Err(AuthFailure::MissingBearer));
        h.authorization = Some("Bearer tok");
        assert!(auth.verify(&h, BODY, NOW).is_ok());
        h.webhook_signature = Some("v1,");
        assert_eq!(auth.verify(&h, BODY, NOW), Err(AuthFailure::NoMatchingSignature));
    }

    #[test]
    fn nothing_configured_refuses_everything() {
        assert_eq!(WebhookAuth::default().verify(&AuthHeaders::default(), BODY, NOW), Err(AuthFailure::NotConfigured));
    }

    #[test]
    fn secrets_parse_and_never_print() {
        let s: SigningSecret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw".parse().unwrap();
        assert_eq!(format!("{s:?}"), "[redacted]");
        assert!("whsec_!!".parse::<SigningSecret>().is_err());
        assert!("whsec_c2hvcnQ=".parse::<SigningSecret>().is_err());
    }
}
