//! The trace of one onboarding, as the deployed processes export it (OTLP to a receiver in this
//! test): the webhook's request at the `api` → its delivery → the reconcile step at a `worker` →
//! every step attempt of the onboarding job it started, one trace across processes and the queue.

use crate::otlp::Span;

fn step_spans<'a>(spans: &'a [Span], job: &str) -> Vec<&'a Span> {
    spans.iter().filter(|s| s.attr("job") == Some(job) && s.attr("step").is_some()).collect()
}

/// Checks every onboarding job's step spans, and the whole chain for those a webhook started;
/// returns how many had the whole chain.
pub fn check_onboardings(spans: &[Span], jobs: &[(i64, String)], steps: &[&str]) -> usize {
    let mut chained = 0;
    for (id, tenant) in jobs {
        let ours = step_spans(spans, &id.to_string());
        assert!(!ours.is_empty(), "job {id} exported no step span");
        let trace = &ours[0].trace_id;
        for s in &ours {
            assert_eq!(&s.trace_id, trace, "one trace per job: {s:?}");
            assert_eq!((s.attr("kind"), s.attr("tenant")), (Some("user.onboard"), Some(tenant.as_str())), "{s:?}");
            assert!(s.attr("attempt").is_some_and(|a| a.parse::<u32>().is_ok_and(|a| a >= 1)), "{s:?}");
            assert_eq!(s.resource.get("onramp.role").map(String::as_str), Some("worker"), "{s:?}");
            assert_eq!(s.via, "protobuf", "OTLP's default protocol: {s:?}");
        }
        for step in steps {
            assert!(ours.iter().any(|s| s.attr("step") == Some(step)), "job {id}: no span of step {step}");
        }
        let parent = spans.iter().find(|p| p.span_id == ours[0].parent_id);
        let Some(reconcile) = parent else { continue };
        assert!(reconcile.attr("kind").is_some_and(|k| k.starts_with("reconcile.")), "{reconcile:?}");
        let Some(delivery) = spans.iter().find(|d| d.span_id == reconcile.parent_id && d.name == "delivery") else {
            continue;
        };
        let request = spans.iter().find(|r| r.span_id == delivery.parent_id).expect("the delivery's request");
        assert_eq!(request.name, "POST /webhooks/authentik");
        assert_eq!((request.parent_id.as_str(), request.attr("http.response.status_code")), ("", Some("202")));
        assert_eq!(request.resource.get("onramp.role").map(String::as_str), Some("api"), "{request:?}");
        assert!([reconcile, delivery, request].iter().all(|s| &s.trace_id == trace));
        chained += 1;
    }
    chained
}
