//! An OTLP/HTTP trace receiver (`POST /v1/traces`, protobuf or JSON) keeping every span it is
//! sent. It runs on a thread and runtime of its own, so a test may block its own thread on a
//! flush while the receiver answers.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::body::Bytes;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{KeyValue, any_value};
use prost::Message;

/// One received span, ids in hex.
#[derive(Clone, Debug)]
pub struct Span {
    pub trace_id: String,
    pub span_id: String,
    /// Empty for a root span.
    pub parent_id: String,
    pub name: String,
    pub attrs: BTreeMap<String, String>,
    /// Its resource's attributes (service.name, onramp.role, …).
    pub resource: BTreeMap<String, String>,
    /// The protocol it came in: `protobuf` or `json`.
    pub via: &'static str,
}

impl Span {
    pub fn attr(&self, key: &str) -> Option<&str> {
        self.attrs.get(key).map(String::as_str)
    }
}

#[derive(Clone)]
pub struct Receiver {
    /// Where to export: the base URL (`OTEL_EXPORTER_OTLP_ENDPOINT`).
    pub base: String,
    spans: Arc<Mutex<Vec<Span>>>,
}

impl Receiver {
    pub fn start() -> Self {
        let spans: Arc<Mutex<Vec<Span>>> = Arc::default();
        let (tx, rx) = std::sync::mpsc::channel();
        let kept = spans.clone();
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            rt.block_on(async move {
                let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
                tx.send(l.local_addr().unwrap()).unwrap();
                let app = Router::new().route("/v1/traces", post(traces)).with_state(kept);
                axum::serve(l, app).await.unwrap();
            });
        });
        let addr = rx.recv().unwrap();
        Self { base: format!("http://{addr}"), spans }
    }

    pub fn spans(&self) -> Vec<Span> {
        self.spans.lock().unwrap().clone()
    }
}

async fn traces(
    axum::extract::State(kept): axum::extract::State<Arc<Mutex<Vec<Span>>>>,
    headers: HeaderMap,
    body: Bytes,
) -> (StatusCode, Vec<u8>) {
    let json = headers.get("content-type").is_some_and(|v| v.as_bytes().starts_with(b"application/json"));
    let req: ExportTraceServiceRequest = if json {
        match serde_json::from_slice(&body) {
            Ok(r) => r,
            Err(e) => return (StatusCode::BAD_REQUEST, e.to_string().into_bytes()),
        }
    } else {
        match ExportTraceServiceRequest::decode(body) {
            Ok(r) => r,
            Err(e) => return (StatusCode::BAD_REQUEST, e.to_string().into_bytes()),
        }
    };
    let mut out = kept.lock().unwrap();
    for rs in req.resource_spans {
        let resource = attrs(&rs.resource.map(|r| r.attributes).unwrap_or_default());
        for s in rs.scope_spans.into_iter().flat_map(|ss| ss.spans) {
            out.push(Span {
                trace_id: hex(&s.trace_id),
                span_id: hex(&s.span_id),
                parent_id: hex(&s.parent_span_id),
                name: s.name,
                attrs: attrs(&s.attributes),
                resource: resource.clone(),
                via: if json { "json" } else { "protobuf" },
            });
        }
    }
    // an empty ExportTraceServiceResponse, in either encoding
    (StatusCode::OK, if json { b"{}".to_vec() } else { vec![] })
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn attrs(kvs: &[KeyValue]) -> BTreeMap<String, String> {
    kvs.iter()
        .map(|kv| {
            let v = match kv.value.as_ref().and_then(|v| v.value.as_ref()) {
                Some(any_value::Value::StringValue(s)) => s.clone(),
                Some(any_value::Value::IntValue(i)) => i.to_string(),
                Some(any_value::Value::BoolValue(b)) => b.to_string(),
                Some(any_value::Value::DoubleValue(d)) => d.to_string(),
                other => format!("{other:?}"),
            };
            (kv.key.clone(), v)
        })
        .collect()
}
