//! Webhook intake: authenticate the raw bytes, understand the body as hints, store the delivery
//! (its row and its pending id, in a shared transaction) and answer fast; the pump (`pump`) turns stored deliveries
//! into reconcile jobs in bulk off the request path. The HTTP side is `http::webhook`; reconcile
//! itself is `reconcile`.

pub mod event;
mod handoff;
pub mod pump;
pub mod retention;
pub mod signature;
mod store;
pub mod view;
pub mod writer;

use crate::domain::tenants::TenantRegistry;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

pub use pump::{Handoff, Pump, PumpStats};
pub use signature::{AuthFailure, AuthHeaders, SigningSecret, WebhookAuth};
pub use writer::{Delivery, DeliveryWriter, Stored, WriteError};

/// Everything the webhook endpoint needs.
pub struct Intake {
    pub auth: WebhookAuth,
    pub writer: DeliveryWriter,
    pub tenants: Arc<TenantRegistry>,
    pub max_body: usize,
    /// A group's diff listing more users than this reconciles the group's tenants instead.
    pub max_diff_users: usize,
    pub stats: IntakeStats,
    /// The pump's counters (the pump of this process).
    pub pump: Arc<PumpStats>,
}

/// Counters for /metrics.
#[derive(Debug, Default)]
pub struct IntakeStats {
    pub accepted: AtomicU64,
    pub duplicates: AtomicU64,
    pub auth_failures: AtomicU64,
    pub rejected: AtomicU64,
    pub store_failures: AtomicU64,
}

impl IntakeStats {
    pub fn render(&self, out: &mut String) {
        use std::fmt::Write;
        let _ = writeln!(
            out,
            "# HELP onramp_webhook_deliveries_total Webhook deliveries by result.\n# TYPE onramp_webhook_deliveries_total counter"
        );
        for (result, v) in [
            ("accepted", &self.accepted),
            ("duplicate", &self.duplicates),
            ("unauthorized", &self.auth_failures),
            ("rejected", &self.rejected),
            ("store_failed", &self.store_failures),
        ] {
            let _ = writeln!(out, "onramp_webhook_deliveries_total{{result=\"{result}\"}} {}", v.load(Relaxed));
        }
    }
}
