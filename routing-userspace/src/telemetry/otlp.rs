//! OTLP/HTTP (protobuf) export: ended spans written into the OTLP message types of the
//! opentelemetry-proto crate, encoded by prost and POSTed to the collector.
//!
//! Why not the opentelemetry-otlp exporter: it takes the SDK's `SpanData`, and turning each
//! into the protobuf types (a new string for every attribute key and value, a map lookup per
//! span to group by scope) was most of what tracing cost a proxy that samples every request.
//! Here a span is encoded when it ends ([`SpanEncoder`], one per request thread), into reused
//! messages, its attributes copied from their last encoding where they repeat (`attributes`);
//! the export request frames the encoded spans (see [`Encoder`] for why), so an export
//! copies each span once, into a body the HTTP client gives back when it has sent it. The
//! message types, their encoding and the wire format (`application/x-protobuf` POST, a 2xx
//! answer, partial success in the answer's body) are the OTLP crates' and the specification's.

use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http::header::{
    HeaderMap, HeaderName, HeaderValue, CONTENT_ENCODING, CONTENT_TYPE, USER_AGENT,
};
use opentelemetry_http::HttpClient;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceResponse;
use opentelemetry_proto::tonic::common::v1::InstrumentationScope;
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::transform::common::tonic::ResourceAttributesWithSchema;
use prost::Message;

use super::export::{Exporter, SpanBatch};
use super::settings::Compression;
use super::span::EndedSpan;
use attributes::AttributeEncoder;
use fields::SpanFields;

mod attributes;
mod fields;
mod gzip;
mod kept;

pub use gzip::Gzip;

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

/// The export request around a batch of encoded spans: `ExportTraceServiceRequest` with one
/// `ResourceSpans` holding one `ScopeSpans`, whose `spans` are the batch's encodings.
///
/// prost writes a nested message's length before the message, so encoding the whole request
/// from the OTLP types measures every span once per level above it (request, resource, scope,
/// span, attribute): measuring was most of an export's cost. Each span is encoded on its own
/// when it ends instead, and the request is framed here: the resource and the scope are
/// encoded once, each span is written as a length-delimited `spans` field, and the lengths of
/// the two levels above come from the spans' lengths. The body is the batch's one copy, and it
/// is byte for byte the request prost encodes from the OTLP types (tested).
#[derive(Debug)]
pub struct Encoder {
    /// `ResourceSpans.resource` (field 1), encoded.
    resource: Vec<u8>,
    /// `ResourceSpans.schema_url` (field 3), encoded; empty when there is none.
    resource_schema: Vec<u8>,
    /// `ScopeSpans.scope` (field 1), encoded.
    scope: Vec<u8>,
}

/// The field numbers the framing writes: `ExportTraceServiceRequest.resource_spans`,
/// `ResourceSpans.resource`, `.scope_spans` and `.schema_url`, `ScopeSpans.scope` and `.spans`.
const RESOURCE_SPANS: u32 = 1;
const RESOURCE: u32 = 1;
const SCOPE_SPANS: u32 = 2;
const RESOURCE_SCHEMA_URL: u32 = 3;
const SCOPE: u32 = 1;
const SPANS: u32 = 2;

/// The encoded length of a length-delimited field of number 1 to 15 holding `len` bytes.
fn field_len(len: usize) -> usize {
    1 + prost::encoding::encoded_len_varint(len as u64) + len
}

/// Write the key and length of a length-delimited field.
fn put_field_head(out: &mut Vec<u8>, tag: u32, len: usize) {
    prost::encoding::encode_key(tag, prost::encoding::WireType::LengthDelimited, out);
    prost::encoding::encode_varint(len as u64, out);
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
        let message = Resource {
            attributes: resource.attributes.0,
            ..Default::default()
        };
        let mut encoded = Self {
            resource: Vec::new(),
            resource_schema: Vec::new(),
            scope: Vec::new(),
        };
        prost::encoding::message::encode(RESOURCE, &message, &mut encoded.resource);
        if let Some(url) = resource.schema_url.filter(|u| !u.is_empty()) {
            prost::encoding::string::encode(
                RESOURCE_SCHEMA_URL,
                &url,
                &mut encoded.resource_schema,
            );
        }
        prost::encoding::message::encode(SCOPE, &scope, &mut encoded.scope);
        encoded
    }

    /// `batch` (encoded spans) as the body of one export request.
    pub fn encode(&self, batch: &SpanBatch) -> Bytes {
        let mut body = Vec::new();
        self.encode_into(batch, &mut body);
        Bytes::from(body)
    }

    /// `batch` as the body of one export request, in `body` (emptied first; it grows to the
    /// body's size if it is smaller).
    pub fn encode_into(&self, batch: &SpanBatch, body: &mut Vec<u8>) {
        let spans: usize = batch.iter().map(|s| field_len(s.len())).sum();
        let scope_spans = self.scope.len() + spans;
        let resource_spans =
            self.resource.len() + field_len(scope_spans) + self.resource_schema.len();
        body.clear();
        body.reserve_exact(field_len(resource_spans));
        put_field_head(body, RESOURCE_SPANS, resource_spans);
        body.extend_from_slice(&self.resource);
        put_field_head(body, SCOPE_SPANS, scope_spans);
        body.extend_from_slice(&self.scope);
        for span in batch.iter() {
            put_field_head(body, SPANS, span.len());
            body.extend_from_slice(span);
        }
        body.extend_from_slice(&self.resource_schema);
        debug_assert_eq!(body.len(), field_len(resource_spans));
    }
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
    /// Bodies the HTTP client has sent and dropped, for the next exports to fill.
    bodies: Bodies,
    /// Set when bodies are sent gzipped.
    gzip: Option<gzip::Gzip>,
}

/// Bodies kept for reuse at most: one being sent, one being filled (gzipped: the encoded body
/// and the compressed one).
const BODIES_KEPT: usize = 2;

/// The bodies an exporter keeps for reuse (its `Debug` says how many, not what they hold).
#[derive(Clone, Default)]
struct Bodies(Arc<Mutex<Vec<Vec<u8>>>>);

impl Bodies {
    /// A kept body (emptied by whoever fills it), or a new one.
    fn take(&self) -> Vec<u8> {
        crate::lock::lock(&self.0).pop().unwrap_or_default()
    }

    /// Keep `body` for a later export, if fewer than [`BODIES_KEPT`] are kept.
    fn keep(&self, body: Vec<u8>) {
        let mut kept = crate::lock::lock(&self.0);
        if kept.len() < BODIES_KEPT {
            kept.push(body);
        }
    }

    /// The kept bodies' capacities (tests).
    #[cfg(test)]
    fn capacities(&self) -> Vec<usize> {
        crate::lock::lock(&self.0)
            .iter()
            .map(Vec::capacity)
            .collect()
    }
}

impl std::fmt::Debug for Bodies {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Bodies({} kept)", crate::lock::lock(&self.0).len())
    }
}

/// An export request's body that goes back to its exporter's `bodies` when the HTTP client
/// drops it. Why: a body is a batch's size (a few hundred KB at 512 spans), and a fresh one
/// per export came on pages the kernel had to zero each time (a page fault every five
/// requests at sampling 1.0); a body reused is memory already mapped.
struct ReturningBody {
    bytes: Vec<u8>,
    home: Bodies,
}

impl AsRef<[u8]> for ReturningBody {
    fn as_ref(&self) -> &[u8] {
        &self.bytes
    }
}

impl Drop for ReturningBody {
    fn drop(&mut self) {
        self.home.keep(std::mem::take(&mut self.bytes));
    }
}

impl<C: HttpClient + 'static> OtlpHttpExporter<C> {
    /// An exporter to `endpoint` with `headers` on every request (`OTEL_EXPORTER_OTLP_HEADERS`),
    /// `resource` on every span, and bodies compressed as `compression` says.
    pub fn new(
        client: C,
        endpoint: http::Uri,
        headers: HeaderMap,
        resource: &opentelemetry_sdk::Resource,
        compression: Compression,
    ) -> Self {
        let mut all = HeaderMap::with_capacity(3 + headers.len());
        all.insert(
            CONTENT_TYPE,
            HeaderValue::from_static("application/x-protobuf"),
        );
        all.insert(
            USER_AGENT,
            HeaderValue::from_static(concat!("flexinfer-proxy/", env!("CARGO_PKG_VERSION"))),
        );
        let gzip = match compression {
            Compression::Gzip => {
                all.insert(CONTENT_ENCODING, HeaderValue::from_static("gzip"));
                Some(gzip::Gzip::default())
            }
            Compression::None => None,
        };
        all.extend(headers);
        Self {
            client,
            endpoint,
            headers: all,
            encoder: Encoder::new(resource),
            bodies: Bodies::default(),
            gzip,
        }
    }
}

impl<C> Exporter for OtlpHttpExporter<C>
where
    C: HttpClient + Send + Sync + 'static,
{
    async fn export(&mut self, batch: &SpanBatch) -> Result<(), String> {
        let mut bytes = self.bodies.take();
        self.encoder.encode_into(batch, &mut bytes);
        if let Some(gzip) = &mut self.gzip {
            let mut compressed = self.bodies.take();
            gzip.compress(&bytes, &mut compressed);
            self.bodies.keep(std::mem::replace(&mut bytes, compressed));
        }
        let body = Bytes::from_owner(ReturningBody {
            bytes,
            home: self.bodies.clone(),
        });
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
