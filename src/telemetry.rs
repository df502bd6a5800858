//! Logs and traces: the `[telemetry]` section of `onejob.toml`.
//!
//! Log lines go to stderr (stdout is for what a command prints: `onejob
//! demo`'s story, a new key), as text or as JSON lines. A job's work runs
//! inside a `job` span (`job_id`) and each attempt inside an `attempt` span
//! (`job_id`, `attempt_id`, `provider`, `kind`), so every line of a job's work
//! carries those fields. In JSON they are top-level fields of the line, as a
//! log pipeline expects (`{"timestamp", "level", "target", "message",
//! "job_id", "attempt_id", "provider", …, "spans": ["job", "attempt"]}`):
//! the fields of every span the event is in, the innermost winning, then the
//! event's own fields.
//!
//! With `otlp_endpoint` set, the same spans are exported as OpenTelemetry
//! traces over OTLP/HTTP (JSON encoding, batched on a thread of its own): one
//! `job` span with an `attempt` child per attempt. A W3C `traceparent` sent
//! by the client is continued (the request's span takes it as parent, the
//! job's span is that request's child), and the current context is passed on
//! to providers as `traceparent`. Off by default: then no request span is
//! made and no header is sent.

use opentelemetry::propagation::{Extractor, Injector, TextMapPropagator};
use opentelemetry::trace::{TraceContextExt, TracerProvider as _};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::SdkTracerProvider;
use serde::Deserialize;
use std::io::IsTerminal;
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::Layer;

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    #[default]
    Text,
    Json,
}

/// `[telemetry]`
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TelemetryConfig {
    /// `text` (for people) or `json` (one object per line, for collectors).
    pub log_format: LogFormat,
    /// OTLP/HTTP collector base URL (e.g. `http://127.0.0.1:4318`); traces
    /// go to `{otlp_endpoint}/v1/traces`. Absent: no trace export.
    pub otlp_endpoint: Option<String>,
    /// `service.name` of the exported traces.
    pub service_name: String,
}

impl Default for TelemetryConfig {
    fn default() -> Self {
        TelemetryConfig {
            log_format: LogFormat::Text,
            otlp_endpoint: None,
            service_name: "onejob".to_string(),
        }
    }
}

impl TelemetryConfig {
    pub fn tracing_enabled(&self) -> bool {
        self.otlp_endpoint.is_some()
    }
}

#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    #[error("telemetry.otlp_endpoint {endpoint:?}: {message}")]
    Exporter { endpoint: String, message: String },
    #[error("logging was already set up in this process")]
    AlreadyInitialised,
}

/// Keeps the trace exporter alive; dropping it flushes what is left.
#[derive(Default)]
pub struct TelemetryGuard {
    provider: Option<SdkTracerProvider>,
}

impl TelemetryGuard {
    /// Export every finished span now (tests and shutdown).
    pub fn flush(&self) {
        if let Some(provider) = &self.provider {
            if let Err(e) = provider.force_flush() {
                tracing::warn!(error = %e, "cannot flush traces");
            }
        }
    }
}

impl Drop for TelemetryGuard {
    fn drop(&mut self) {
        if let Some(provider) = self.provider.take() {
            let _ = provider.shutdown();
        }
    }
}

fn exporter(config: &TelemetryConfig, endpoint: &str) -> Result<SdkTracerProvider, TelemetryError> {
    use opentelemetry_otlp::{Protocol, WithExportConfig};
    let url = format!("{}/v1/traces", endpoint.trim_end_matches('/'));
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_protocol(Protocol::HttpJson)
        .with_endpoint(url)
        .build()
        .map_err(|e| TelemetryError::Exporter {
            endpoint: endpoint.to_string(),
            message: e.to_string(),
        })?;
    let resource = opentelemetry_sdk::Resource::builder()
        .with_service_name(config.service_name.clone())
        .build();
    Ok(SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(resource)
        .build())
}

/// Sets up logging (and trace export) for this process: once.
pub fn init(config: &TelemetryConfig) -> Result<TelemetryGuard, TelemetryError> {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| "info,sqlx=warn".into());
    let logs = match config.log_format {
        // Colours only for a person at a terminal: a log file or a
        // collector gets plain text (and a span's fields cost half as much
        // to format without them).
        LogFormat::Text => tracing_subscriber::fmt::layer()
            .with_ansi(std::io::stderr().is_terminal())
            .with_writer(std::io::stderr)
            .boxed(),
        LogFormat::Json => tracing_subscriber::fmt::layer()
            .fmt_fields(tracing_subscriber::fmt::format::JsonFields::new())
            .event_format(FlatJson)
            .with_writer(std::io::stderr)
            .boxed(),
    };
    let provider = config
        .otlp_endpoint
        .as_deref()
        .map(|endpoint| exporter(config, endpoint))
        .transpose()?;
    let traces = provider.as_ref().map(|p| {
        opentelemetry::global::set_text_map_propagator(TraceContextPropagator::new());
        tracing_opentelemetry::layer().with_tracer(p.tracer("onejob"))
    });
    tracing_subscriber::registry()
        .with(filter)
        .with(logs)
        .with(traces)
        .try_init()
        .map_err(|_| TelemetryError::AlreadyInitialised)?;
    Ok(TelemetryGuard { provider })
}

/// One JSON object per event with its spans' fields at the top level
/// (tracing-subscriber's JSON format nests them under `span`/`spans`).
struct FlatJson;

impl<S, N> tracing_subscriber::fmt::FormatEvent<S, N> for FlatJson
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
    N: for<'a> tracing_subscriber::fmt::FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &tracing_subscriber::fmt::FmtContext<'_, S, N>,
        mut writer: tracing_subscriber::fmt::format::Writer<'_>,
        event: &tracing::Event<'_>,
    ) -> std::fmt::Result {
        use serde_json::{Map, Value};
        let meta = event.metadata();
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as i64);
        let mut line = Map::new();
        line.insert("timestamp".into(), crate::clock::rfc3339(now).into());
        line.insert("level".into(), meta.level().as_str().into());
        line.insert("target".into(), meta.target().into());
        let mut spans = Vec::new();
        if let Some(scope) = ctx.event_scope() {
            for span in scope.from_root() {
                spans.push(Value::from(span.name()));
                let extensions = span.extensions();
                // JsonFields wrote the span's fields as a JSON object.
                let fields = extensions
                    .get::<tracing_subscriber::fmt::FormattedFields<N>>()
                    .and_then(|f| serde_json::from_str::<Map<String, Value>>(&f.fields).ok());
                line.extend(fields.unwrap_or_default());
            }
        }
        event.record(&mut FieldsInto(&mut line));
        if !spans.is_empty() {
            line.insert("spans".into(), Value::Array(spans));
        }
        writeln!(writer, "{}", Value::Object(line))
    }
}

/// Records an event's fields into a JSON object.
struct FieldsInto<'a>(&'a mut serde_json::Map<String, serde_json::Value>);

impl tracing::field::Visit for FieldsInto<'_> {
    fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
        self.0.insert(field.name().into(), value.into());
    }
    fn record_i64(&mut self, field: &tracing::field::Field, value: i64) {
        self.0.insert(field.name().into(), value.into());
    }
    fn record_u64(&mut self, field: &tracing::field::Field, value: u64) {
        self.0.insert(field.name().into(), value.into());
    }
    fn record_bool(&mut self, field: &tracing::field::Field, value: bool) {
        self.0.insert(field.name().into(), value.into());
    }
    fn record_f64(&mut self, field: &tracing::field::Field, value: f64) {
        self.0.insert(field.name().into(), value.into());
    }
    fn record_error(
        &mut self,
        field: &tracing::field::Field,
        value: &(dyn std::error::Error + 'static),
    ) {
        self.0.insert(field.name().into(), value.to_string().into());
    }
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        self.0
            .insert(field.name().into(), format!("{value:?}").into());
    }
}

struct HeaderExtractor<'a>(&'a axum::http::HeaderMap);

impl Extractor for HeaderExtractor<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }
    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(|k| k.as_str()).collect()
    }
}

struct PairInjector(Vec<(String, String)>);

impl Injector for PairInjector {
    fn set(&mut self, key: &str, value: String) {
        self.0.push((key.to_string(), value));
    }
}

/// Middleware (installed only when traces are exported): each request runs
/// in a `request` span that continues the client's `traceparent`.
pub async fn trace_request(
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    use tracing::Instrument;
    let span = tracing::info_span!(
        "request",
        http.request.method = %request.method(),
        url.path = %request.uri().path(),
    );
    let parent = TraceContextPropagator::new().extract(&HeaderExtractor(request.headers()));
    if parent.span().span_context().is_valid() {
        let _ = span.set_parent(parent);
    }
    next.run(request).instrument(span).await
}

/// Makes `span` (a root in this process) continue the trace of the current
/// span, when traces are exported and there is one.
pub fn continue_trace(span: &tracing::Span) {
    let current = tracing::Span::current().context();
    if current.span().span_context().is_valid() {
        let _ = span.set_parent(current);
    }
}

/// `request` with a `traceparent` header naming the current span, when
/// traces are exported (so a provider that traces joins the same trace).
pub fn with_trace_context(request: reqwest::RequestBuilder) -> reqwest::RequestBuilder {
    let context = tracing::Span::current().context();
    if !context.span().span_context().is_valid() {
        return request;
    }
    let mut headers = PairInjector(Vec::new());
    TraceContextPropagator::new().inject_context(&context, &mut headers);
    headers
        .0
        .into_iter()
        .fold(request, |r, (k, v)| r.header(k, v))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn telemetry_is_text_and_off_by_default() {
        let config: TelemetryConfig = toml::from_str("").unwrap();
        assert_eq!(config, TelemetryConfig::default());
        assert!(!config.tracing_enabled());
        let config: TelemetryConfig =
            toml::from_str("log_format = \"json\"\notlp_endpoint = \"http://127.0.0.1:4318\"")
                .unwrap();
        assert_eq!(config.log_format, LogFormat::Json);
        assert!(config.tracing_enabled());
        assert!(toml::from_str::<TelemetryConfig>("log_format = \"xml\"").is_err());
    }
}
