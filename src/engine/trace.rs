//! Traces across the queue. A job keeps the W3C trace context (`traceparent`) of the span it was
//! enqueued in; each attempt of its steps is a span in that trace, and jobs a step enqueues carry
//! the step's context, so everything one webhook caused is one trace. Without an OpenTelemetry
//! layer (no export configured) spans have no context and nothing is stored.

use std::collections::HashMap;

use opentelemetry::propagation::TextMapPropagator;
use opentelemetry::trace::TraceContextExt;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use tracing::Span;
use tracing::field::Empty;
use tracing_opentelemetry::OpenTelemetrySpanExt;

use super::StepOutcome;
use super::store::Claimed;

const TRACEPARENT: &str = "traceparent";

/// The `traceparent` of the current span, when it belongs to an exported trace.
pub fn current() -> Option<String> {
    let cx = Span::current().context();
    if !cx.span().span_context().is_valid() {
        return None;
    }
    let mut carrier = HashMap::new();
    TraceContextPropagator::new().inject_context(&cx, &mut carrier);
    carrier.remove(TRACEPARENT)
}

/// Makes `span` a child of the span this `traceparent` names; a malformed one is ignored.
/// Call it before the span is first entered.
pub fn set_parent(span: &Span, traceparent: &str) {
    let carrier = HashMap::from([(TRACEPARENT.to_string(), traceparent.to_string())]);
    let cx = TraceContextPropagator::new().extract(&carrier);
    if cx.span().span_context().is_valid() {
        let _ = span.set_parent(cx);
    }
}

/// The span of one attempt of a claimed step: a child of the span that enqueued the job.
/// `tenant` is the engine's (the subject's first segment), not a flow's notion.
pub(super) fn step_span(c: &Claimed, step: &'static str) -> Span {
    let span = tracing::info_span!(
        "step",
        otel.name = %format_args!("{} {step}", c.kind),
        otel.kind = "consumer",
        otel.status_code = Empty,
        job = c.id,
        kind = %c.kind,
        step,
        attempt = c.attempt,
        tenant = %c.tenant,
        subject = %c.subject,
        outcome = Empty,
    );
    if let Some(tp) = &c.traceparent {
        set_parent(&span, tp);
    }
    span
}

/// Records what the attempt decided on its span; failures and retries mark it as an error.
pub(super) fn record_outcome(span: &Span, outcome: StepOutcome) {
    span.record("outcome", outcome.as_str());
    if matches!(outcome, StepOutcome::Retry | StepOutcome::Fail) {
        span.record("otel.status_code", "ERROR");
    }
}
