//! OTLP/HTTP (protobuf) export: ended spans written into the OTLP message types of the
//! opentelemetry-proto crate, encoded by prost and POSTed to the collector.
//!
//! Why not the opentelemetry-otlp exporter: it takes the SDK's `SpanData`, and turning each
//! into the protobuf types (a new string for every attribute key and value, a map lookup per
//! span to group by scope) was most of what tracing cost a proxy that samples every request.
//! Here a span is encoded when it ends ([`SpanEncoder`], one per request thread), into reused
//! messages, its attributes copied from their last encoding where they repeat (`attributes`);
//! the export request frames the encoded spans (see `RequestOfEncodedSpans` for why), so an
//! export allocates only the body it sends. The message
//! types, their encoding and the wire format (`application/x-protobuf` POST, a 2xx answer,
//! partial success in the answer's body) are the OTLP crates' and the specification's.

use bytes::Bytes;
use http::header::{HeaderMap, HeaderName, HeaderValue, CONTENT_TYPE, USER_AGENT};
use opentelemetry_http::HttpClient;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceResponse;
use opentelemetry_proto::tonic::common::v1::InstrumentationScope;
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::transform::common::tonic::ResourceAttributesWithSchema;
use prost::Message;

use super::export::{Exporter, SpanBatch};
use super::span::EndedSpan;
use attributes::AttributeEncoder;
use fields::SpanFields;

mod attributes;
mod fields;
mod kept;

/// The instrumentation scope of every span.
const SCOPE_NAME: &str = "flexinfer-proxy";

/// Writes ended spans as encoded OTLP `Span`s, reusing its messages and the attributes it has
/// encoded before. The request path keeps one per thread ([`super::export::SpanSink`]).
#[derive(Debug, Default)]
pub struct SpanEncoder {
    /// The fields of a span before and after its attributes.
    fields: SpanFields,
    /// Attributes encoded, kept for the next span that repeats them.
    attributes: AttributeEncoder,
}

impl SpanEncoder {
    /// Append `span` to `out` as an encoded OTLP `Span`: its head, its attributes and its tail
    /// (see `fields` for why in three parts).
    pub fn encode(&mut self, span: &EndedSpan<'_, '_>, out: &mut Vec<u8>) {
        self.fields.write_head(span, out);
        self.attributes.write(span.attributes, out);
        self.fields.write_tail(span, out);
    }
}

/// One export request, reused batch after batch.
#[derive(Debug)]
pub struct Encoder {
    request: RequestOfEncodedSpans,
    /// Span buffers of an earlier, larger batch, kept for the next one.
    spare: Vec<Vec<u8>>,
    /// How large the last body was (the next one starts at that capacity).
    last_len: usize,
}

impl Encoder {
    /// An encoder whose spans carry `resource` (service name, SDK and `OTEL_RESOURCE_ATTRIBUTES`).
    pub fn new(resource: &opentelemetry_sdk::Resource) -> Self {
        let resource = ResourceAttributesWithSchema::from(resource);
        let scope = InstrumentationScope {
            name: SCOPE_NAME.to_owned(),
            version: env!("CARGO_PKG_VERSION").to_owned(),
            ..Default::default()
        };
        let request = RequestOfEncodedSpans {
            resource_spans: vec![ResourceOfEncodedSpans {
                resource: Some(Resource {
                    attributes: resource.attributes.0,
                    ..Default::default()
                }),
                scope_spans: vec![ScopeOfEncodedSpans {
                    scope: Some(scope),
                    spans: Vec::new(),
                    schema_url: String::new(),
                }],
                schema_url: resource.schema_url.unwrap_or_default(),
            }],
        };
        Self {
            request,
            spare: Vec::new(),
            last_len: 0,
        }
    }

    /// `batch` (encoded spans) as the body of one export request.
    pub fn encode(&mut self, batch: &SpanBatch) -> Bytes {
        let encoded = &mut self.request.resource_spans[0].scope_spans[0].spans;
        while encoded.len() > batch.len() {
            self.spare.extend(encoded.pop());
        }
        while encoded.len() < batch.len() {
            encoded.push(self.spare.pop().unwrap_or_default());
        }
        for (out, span) in encoded.iter_mut().zip(batch.iter()) {
            out.clear();
            out.extend_from_slice(span);
        }
        let mut body = Vec::with_capacity(self.last_len);
        self.request
            .encode(&mut body)
            .expect("a Vec grows to fit the message");
        self.last_len = body.len();
        Bytes::from(body)
    }
}

/// `ExportTraceServiceRequest` whose spans prost has already encoded, one by one.
///
/// prost writes a nested message's length before the message, so encoding the whole request
/// measures every span once per level above it (request, resource, scope, span, attribute):
/// measuring was most of an export's cost. Each span is encoded on its own instead, and this
/// message and the two below carry the results: a `repeated bytes` field and a `repeated`
/// message field of the same number are the same on the wire (length-delimited values), so the
/// body is byte for byte the request prost encodes from the OTLP types (tested).
#[derive(Clone, PartialEq, prost::Message)]
struct RequestOfEncodedSpans {
    /// `ExportTraceServiceRequest.resource_spans`.
    #[prost(message, repeated, tag = "1")]
    resource_spans: Vec<ResourceOfEncodedSpans>,
}

/// `ResourceSpans`, with [`ScopeOfEncodedSpans`].
#[derive(Clone, PartialEq, prost::Message)]
struct ResourceOfEncodedSpans {
    #[prost(message, optional, tag = "1")]
    resource: Option<Resource>,
    #[prost(message, repeated, tag = "2")]
    scope_spans: Vec<ScopeOfEncodedSpans>,
    #[prost(string, tag = "3")]
    schema_url: String,
}

/// `ScopeSpans`, with each `Span` as prost encoded it.
#[derive(Clone, PartialEq, prost::Message)]
struct ScopeOfEncodedSpans {
    #[prost(message, optional, tag = "1")]
    scope: Option<InstrumentationScope>,
    #[prost(bytes = "vec", repeated, tag = "2")]
    spans: Vec<Vec<u8>>,
    #[prost(string, tag = "3")]
    schema_url: String,
}

fn set_str(out: &mut String, s: &str) {
    out.clear();
    out.push_str(s);
}

fn set_bytes(out: &mut Vec<u8>, b: &[u8]) {
    out.clear();
    out.extend_from_slice(b);
}

/// Sends encoded batches to the collector's traces URL over `client`.
#[derive(Debug)]
pub struct OtlpHttpExporter<C> {
    client: C,
    endpoint: http::Uri,
    /// Every export request's headers: the content type, the user agent, then the
    /// operator's (which win over the first two).
    headers: HeaderMap,
    encoder: Encoder,
}

impl<C: HttpClient + 'static> OtlpHttpExporter<C> {
    /// An exporter to `endpoint` with `headers` on every request (`OTEL_EXPORTER_OTLP_HEADERS`)
    /// and `resource` on every span.
    pub fn new(
        client: C,
        endpoint: http::Uri,
        headers: HeaderMap,
        resource: &opentelemetry_sdk::Resource,
    ) -> Self {
        let mut all = HeaderMap::with_capacity(2 + headers.len());
        all.insert(
            CONTENT_TYPE,
            HeaderValue::from_static("application/x-protobuf"),
        );
        all.insert(
            USER_AGENT,
            HeaderValue::from_static(concat!("flexinfer-proxy/", env!("CARGO_PKG_VERSION"))),
        );
        all.extend(headers);
        Self {
            client,
            endpoint,
            headers: all,
            encoder: Encoder::new(resource),
        }
    }
}

impl<C> Exporter for OtlpHttpExporter<C>
where
    C: HttpClient + Send + Sync + 'static,
{
    async fn export(&mut self, batch: &SpanBatch) -> Result<(), String> {
        let body = self.encoder.encode(batch);
        let mut request = http::Request::post(self.endpoint.clone())
            .body(body)
            .map_err(|e| format!("building the export request: {e}"))?;
        *request.headers_mut() = self.headers.clone();
        let response = self
            .client
            .send_bytes(request)
            .await
            .map_err(|e| e.to_string())?;
        let status = response.status();
        if !status.is_success() {
            return Err(format!("the collector answered {status}"));
        }
        log_partial_success(response.body());
        Ok(())
    }
}

/// A collector that took the request but rejected some spans says so in the body.
fn log_partial_success(body: &[u8]) {
    let Ok(response) = ExportTraceServiceResponse::decode(body) else {
        return;
    };
    if let Some(p) = response.partial_success {
        if p.rejected_spans > 0 || !p.error_message.is_empty() {
            tracing::warn!(
                rejected_spans = p.rejected_spans,
                message = %p.error_message,
                "the OTLP collector rejected spans"
            );
        }
    }
}

/// The headers of `OTEL_EXPORTER_OTLP_TRACES_HEADERS`, else of `OTEL_EXPORTER_OTLP_HEADERS`:
/// `key=value` pairs separated by commas, values percent-encoded (W3C Baggage style, as the
/// OTLP exporter specification says). A pair that is not `key=value`, or whose name or value
/// is not a valid header, is an error that names it.
pub fn headers_from_env() -> Result<HeaderMap, String> {
    let raw = std::env::var("OTEL_EXPORTER_OTLP_TRACES_HEADERS")
        .or_else(|_| std::env::var("OTEL_EXPORTER_OTLP_HEADERS"))
        .unwrap_or_default();
    parse_headers(&raw)
}

/// Parse `key=value,key2=value2` (see [`headers_from_env`]).
pub fn parse_headers(raw: &str) -> Result<HeaderMap, String> {
    let mut headers = HeaderMap::new();
    for pair in raw.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let Some((key, value)) = pair.split_once('=') else {
            return Err(format!("header {pair:?} is not key=value"));
        };
        let key = key.trim();
        let name = HeaderName::from_bytes(key.as_bytes())
            .map_err(|_| format!("{key:?} is not a header name"))?;
        let decoded = crate::percent::decode(value.trim())
            .ok_or_else(|| format!("the value of {key:?} is not percent-encoded UTF-8"))?;
        let value = HeaderValue::from_str(&decoded)
            .map_err(|_| format!("the value of {key:?} is not a valid header value"))?;
        headers.insert(name, value);
    }
    Ok(headers)
}

#[cfg(test)]
mod tests;
