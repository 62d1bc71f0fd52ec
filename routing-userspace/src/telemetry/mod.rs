//! OpenTelemetry traces: one server span per request and a client span per upstream attempt,
//! exported over OTLP/HTTP (protobuf) to the standard `OTEL_EXPORTER_OTLP_*` endpoint.
//!
//! W3C `traceparent`/`tracestate` always reach the pod: a sampled request's pod sees our
//! attempt span as its parent; an unsampled one gets the client's headers untouched. Tracing
//! is off without an endpoint, and a request that is not sampled allocates nothing. Export
//! ([`export`]) is batched and bounded, so a slow or dead collector loses spans (counted),
//! never time on requests; [`otlp`] writes the batches in the OTLP protobuf types.

pub mod export;
pub mod metrics;
pub mod otlp;
pub mod propagation;
pub mod sampler;
pub mod settings;
pub mod span;
pub mod trace;
pub mod transport;

use std::sync::Arc;

use opentelemetry_sdk::Resource;

pub use export::{ExportHandle, SpanSink};
pub use metrics::TraceFamilies;
pub use sampler::Sampler;
pub use settings::TraceSettings;
pub use span::{Attribute, Attributes};
pub use trace::{AttemptEnd, Trace, Tracer};

/// Why tracing could not start.
#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    #[error("OTLP endpoint {endpoint:?}: {why}")]
    Endpoint { endpoint: String, why: String },
    #[error("OTLP exporter: {0}")]
    Exporter(String),
    #[error("OTLP export headers (OTEL_EXPORTER_OTLP_HEADERS): {0}")]
    Headers(String),
    #[error("OTLP CA certificate file {path}: {why}")]
    Certificate { path: String, why: String },
}

/// Start tracing as `settings` say (`None`: off, no endpoint). Needs a Tokio runtime.
pub fn start(
    settings: &TraceSettings,
    metrics: &TraceFamilies,
) -> Result<Option<(Arc<Tracer>, ExportHandle)>, TraceError> {
    let Some(endpoint) = &settings.endpoint else {
        return Ok(None);
    };
    let uri = check_endpoint(endpoint)?;
    let headers = otlp::headers_from_env().map_err(TraceError::Headers)?;
    let client = transport::client(settings.ca_certificate.as_deref(), settings.export_timeout)?;
    // The SDK's resource: service.name, the SDK's own attributes and OTEL_RESOURCE_ATTRIBUTES.
    let resource = Resource::builder()
        .with_service_name(settings.service_name.clone())
        .build();
    let exporter =
        otlp::OtlpHttpExporter::new(client, uri, headers, &resource, settings.compression);
    let (sink, handle) = export::start(exporter, settings, metrics);
    Ok(Some((
        Arc::new(Tracer::new(settings.sampler, sink)),
        handle,
    )))
}

/// The endpoint must be an `http://` or `https://` URL with a host (HTTP/1.1; TLS for https,
/// see [`transport`]).
pub fn check_endpoint(endpoint: &str) -> Result<http::Uri, TraceError> {
    let bad = |why: &str| TraceError::Endpoint {
        endpoint: endpoint.to_owned(),
        why: why.to_owned(),
    };
    let uri: http::Uri = endpoint.parse().map_err(|e| bad(&format!("{e}")))?;
    match uri.scheme_str() {
        Some("http" | "https") => {}
        _ => return Err(bad("expected an http:// or https:// URL")),
    }
    if uri.host().is_none_or(str::is_empty) {
        return Err(bad("no host"));
    }
    Ok(uri)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_are_checked() {
        assert!(check_endpoint("http://127.0.0.1:4318/v1/traces").is_ok());
        assert!(check_endpoint("http://collector/v1/traces").is_ok());
        assert!(check_endpoint("https://c:4318/v1/traces").is_ok());
        for bad in ["c:4318", "https:///v1/traces", "not a url", "ftp://c/x"] {
            assert!(check_endpoint(bad).is_err(), "{bad}");
        }
    }
}
