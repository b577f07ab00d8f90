//! Logs and traces. Logs: text for people, JSON for collectors; the filter comes from `--log`.
//! Traces: onramp's spans (requests, deliveries, step attempts; see `engine::trace`) exported over
//! OTLP/HTTP when `OTEL_EXPORTER_OTLP_ENDPOINT` (or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`) is set,
//! as `http/protobuf` or `http/json` (`OTEL_EXPORTER_OTLP_PROTOCOL`); headers and timeout from the
//! standard variables too. The service is `OTEL_SERVICE_NAME` (default `onramp`), with the
//! process's role as `onramp.role`. Spans carry ids, kinds, steps and route templates, never
//! request bodies, queries or credentials.

use opentelemetry::KeyValue;
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::{Protocol, WithExportConfig};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing::Level;
use tracing_subscriber::filter::Targets;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer, Registry};

use crate::app::cli::LogFormat;

/// Where and how traces are exported.
#[derive(Clone, Debug, PartialEq)]
pub struct OtelSettings {
    /// The traces URL (`…/v1/traces`).
    pub endpoint: String,
    /// `http/protobuf` or `http/json`.
    pub protocol: Protocol,
    pub service_name: String,
    /// api, worker, both, dev or cli.
    pub role: String,
}

impl OtelSettings {
    /// From the standard environment variables; `None` when no endpoint is set.
    pub fn from_env(role: &str) -> Result<Option<Self>, String> {
        Self::from_vars(role, |name| std::env::var(name).ok().filter(|v| !v.trim().is_empty()))
    }

    /// The same from any source of variables.
    pub fn from_vars(role: &str, var: impl Fn(&str) -> Option<String>) -> Result<Option<Self>, String> {
        let endpoint = match (var("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"), var("OTEL_EXPORTER_OTLP_ENDPOINT")) {
            (Some(traces), _) => traces,
            (None, Some(base)) => format!("{}/v1/traces", base.trim_end_matches('/')),
            (None, None) => return Ok(None),
        };
        let protocol = var("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL").or_else(|| var("OTEL_EXPORTER_OTLP_PROTOCOL"));
        let protocol = match protocol.as_deref().map(str::trim) {
            None | Some("http/protobuf") => Protocol::HttpBinary,
            Some("http/json") => Protocol::HttpJson,
            Some(other) => {
                return Err(format!(
                    "OTEL_EXPORTER_OTLP_PROTOCOL={other:?} is not supported: use http/protobuf or http/json"
                ));
            }
        };
        let service_name = var("OTEL_SERVICE_NAME").unwrap_or_else(|| "onramp".into());
        Ok(Some(Self { endpoint, protocol, service_name, role: role.into() }))
    }

    /// The tracer provider: spans batched and exported in the background.
    pub fn provider(&self) -> Result<SdkTracerProvider, String> {
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_protocol(self.protocol)
            .with_endpoint(&self.endpoint)
            .build()
            .map_err(|e| format!("OTLP exporter for {}: {e}", self.endpoint))?;
        let resource = Resource::builder()
            .with_service_name(self.service_name.clone())
            .with_attributes([
                KeyValue::new("service.version", env!("CARGO_PKG_VERSION")),
                KeyValue::new("onramp.role", self.role.clone()),
            ])
            .build();
        Ok(SdkTracerProvider::builder().with_batch_exporter(exporter).with_resource(resource).build())
    }
}

/// The layer turning onramp's spans into OpenTelemetry spans of `provider`.
pub fn otel_layer<S>(provider: &SdkTracerProvider) -> impl Layer<S> + use<S>
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
{
    tracing_opentelemetry::layer()
        .with_tracer(provider.tracer("onramp"))
        .with_filter(Targets::new().with_target("onramp", Level::INFO))
}

/// Keeps the exporter; [`Telemetry::shutdown`] (or dropping it) sends what is left.
#[must_use]
pub struct Telemetry {
    provider: Option<SdkTracerProvider>,
}

impl Telemetry {
    /// Exports the spans still queued and stops the exporter.
    pub fn shutdown(mut self) {
        self.flush();
    }

    fn flush(&mut self) {
        if let Some(p) = self.provider.take()
            && let Err(e) = p.shutdown()
        {
            eprintln!("onramp: exporting the last traces failed: {e}");
        }
    }
}

impl Drop for Telemetry {
    fn drop(&mut self) {
        self.flush();
    }
}

/// Colours in text logs only on a terminal, and not when `NO_COLOR` is set (https://no-color.org):
/// a log file or a collector gets plain text.
fn colours(stderr_is_terminal: bool, no_color: Option<std::ffi::OsString>) -> bool {
    stderr_is_terminal && no_color.is_none_or(|v| v.is_empty())
}

/// Installs logging, and trace export when `otel` is given.
pub fn init(filter: &str, format: LogFormat, otel: Option<&OtelSettings>) -> Result<Telemetry, String> {
    let filter =
        EnvFilter::try_new(filter).map_err(|e| format!("invalid --log filter {filter:?} (ONRAMP_LOG): {e}"))?;
    let ansi = colours(std::io::IsTerminal::is_terminal(&std::io::stderr()), std::env::var_os("NO_COLOR"));
    let fmt = tracing_subscriber::fmt::layer().with_writer(std::io::stderr).with_ansi(ansi);
    let logs: Box<dyn Layer<Registry> + Send + Sync> = match format {
        LogFormat::Text => fmt.with_filter(filter).boxed(),
        LogFormat::Json => fmt.json().flatten_event(true).with_filter(filter).boxed(),
    };
    let provider = otel.map(OtelSettings::provider).transpose()?;
    let traces = provider.as_ref().map(otel_layer);
    tracing_subscriber::registry()
        .with(logs)
        .with(traces)
        .try_init()
        .map_err(|e| format!("cannot set up logging: {e}"))?;
    if let Some(o) = otel {
        tracing::info!(endpoint = %o.endpoint, protocol = ?o.protocol, "exporting traces");
    }
    Ok(Telemetry { provider })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let pairs: Vec<(String, String)> = pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        move |name| pairs.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone())
    }

    #[test]
    fn colours_only_on_a_terminal_without_no_color() {
        assert!(colours(true, None));
        assert!(colours(true, Some("".into())));
        assert!(!colours(true, Some("1".into())));
        assert!(!colours(false, None));
    }

    #[test]
    fn traces_are_exported_only_with_an_endpoint() {
        assert_eq!(OtelSettings::from_vars("api", vars(&[])), Ok(None));
        let s = OtelSettings::from_vars("worker", vars(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318/")]))
            .unwrap()
            .unwrap();
        assert_eq!(
            (s.endpoint.as_str(), s.protocol, s.service_name.as_str(), s.role.as_str()),
            ("http://collector:4318/v1/traces", Protocol::HttpBinary, "onramp", "worker")
        );
    }

    #[test]
    fn the_standard_variables_choose_url_protocol_and_name() {
        let s = OtelSettings::from_vars(
            "api",
            vars(&[
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://ignored:4318"),
                ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "https://otel.example/custom/traces"),
                ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json"),
                ("OTEL_SERVICE_NAME", "onramp-staging"),
            ]),
        )
        .unwrap()
        .unwrap();
        assert_eq!(
            (s.endpoint.as_str(), s.protocol, s.service_name.as_str()),
            ("https://otel.example/custom/traces", Protocol::HttpJson, "onramp-staging")
        );
        let grpc = vars(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4317"), ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")]);
        assert!(OtelSettings::from_vars("api", grpc).unwrap_err().contains("http/protobuf"));
    }
}
