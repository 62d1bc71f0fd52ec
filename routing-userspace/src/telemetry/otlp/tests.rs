use std::sync::Arc;

use opentelemetry::trace::{SpanId, TraceId};
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value as Any;
use opentelemetry_proto::tonic::trace::v1::{span, status, Span};

use crate::telemetry::export::SpanBatch;
use crate::telemetry::span::{Attribute, Attributes, EndedSpan, SpanKind, Value};

use super::*;

fn resource() -> opentelemetry_sdk::Resource {
    opentelemetry_sdk::Resource::builder()
        .with_service_name("svc-under-test")
        .build()
}

/// The model name of the tests' spans (one allocation for the whole run, as a model's is).
fn model() -> &'static Arc<str> {
    static MODEL: std::sync::OnceLock<Arc<str>> = std::sync::OnceLock::new();
    MODEL.get_or_init(|| Arc::from("m"))
}

/// The server span's attributes in the tests.
fn server_attributes() -> Attributes<'static> {
    Attributes::from(vec![
        Attribute::new("gen_ai.request.model", model()),
        Attribute::new("flexinfer.strategy", "prefix"),
        Attribute::new("url.path", Value::Text("/v1/chat/completions")),
        Attribute::new("flexinfer.retries", 0i64),
        Attribute::new("flexinfer.queue_wait_seconds", 0.25),
        Attribute::new("flexinfer.spill", false),
    ])
}

fn attempt_attributes() -> Attributes<'static> {
    Attributes::from(vec![
        Attribute::new("server.address", "10.0.0.1:8000"),
        Attribute::new("error.type", "upstream"),
    ])
}

fn server<'a, 'v>(n: u64, attributes: &'a Attributes<'v>) -> EndedSpan<'a, 'v> {
    EndedSpan {
        trace_id: TraceId::from(0x4bf9_2f35_77b3_4da6_a3ce_929d_0e0e_4736_u128),
        span_id: SpanId::from(n),
        parent: SpanId::from(0x00f0_67aa_0ba9_02b7),
        parent_is_remote: true,
        trace_state: Some("vendor=abc"),
        kind: SpanKind::Server,
        name: "POST",
        start_unix_nano: 1_000 + n,
        end_unix_nano: 2_000 + n,
        error: None,
        attributes,
    }
}

fn attempt<'a, 'v>(n: u64, parent: u64, attributes: &'a Attributes<'v>) -> EndedSpan<'a, 'v> {
    EndedSpan {
        span_id: SpanId::from(n),
        parent: SpanId::from(parent),
        parent_is_remote: false,
        trace_state: None,
        kind: SpanKind::Client,
        error: Some("10.0.0.1:8000 answered 503"),
        attributes,
        ..server(n, attributes)
    }
}

/// `spans` encoded by `e`, as the export queue holds them.
fn queued(e: &mut SpanEncoder, spans: &[EndedSpan<'_, '_>]) -> SpanBatch {
    let mut batch = SpanBatch::default();
    let mut one = Vec::new();
    for s in spans {
        one.clear();
        e.encode(s, &mut one);
        batch.push(&one);
    }
    batch
}

/// `spans` encoded by `e` and framed by `f`, as the request body.
fn body(e: &mut SpanEncoder, f: &Encoder, spans: &[EndedSpan<'_, '_>]) -> Bytes {
    f.encode(&queued(e, spans))
}

/// The body of `spans` from fresh encoders (the resource's attributes come in the order of
/// its map: one resource, one order).
fn fresh_body(r: &opentelemetry_sdk::Resource, spans: &[EndedSpan<'_, '_>]) -> Bytes {
    body(&mut SpanEncoder::default(), &Encoder::new(r), spans)
}

/// Decode a body as a collector would, and return its spans.
fn decode(body: &[u8]) -> (ExportTraceServiceRequest, Vec<Span>) {
    let req = ExportTraceServiceRequest::decode(body).expect("a valid OTLP request");
    assert_eq!(req.resource_spans.len(), 1);
    let scopes = &req.resource_spans[0].scope_spans;
    assert_eq!(scopes.len(), 1);
    let spans = scopes[0].spans.clone();
    (req, spans)
}

fn attrs(s: &Span) -> Vec<(String, Option<Any>)> {
    s.attributes
        .iter()
        .map(|kv| (kv.key.clone(), kv.value.clone().and_then(|v| v.value)))
        .collect()
}

#[test]
fn a_batch_is_an_otlp_request_with_the_resource_scope_and_every_field() {
    let (sa, aa) = (server_attributes(), attempt_attributes());
    let (req, spans) = decode(&fresh_body(
        &resource(),
        &[attempt(2, 1, &aa), server(1, &sa)],
    ));
    let rs = &req.resource_spans[0];
    let service = rs
        .resource
        .as_ref()
        .unwrap()
        .attributes
        .iter()
        .find(|kv| kv.key == "service.name");
    assert_eq!(
        service.and_then(|kv| kv.value.clone()?.value),
        Some(Any::StringValue("svc-under-test".into()))
    );
    let scope = rs.scope_spans[0].scope.as_ref().unwrap();
    assert_eq!(scope.name, "flexinfer-proxy");
    assert_eq!(scope.version, env!("CARGO_PKG_VERSION"));

    let (a, s) = (&spans[0], &spans[1]);
    assert_eq!(s.trace_id, hex("4bf92f3577b34da6a3ce929d0e0e4736"));
    assert_eq!(s.span_id, 1u64.to_be_bytes());
    assert_eq!(s.parent_span_id, hex("00f067aa0ba902b7"));
    assert_eq!(s.trace_state, "vendor=abc");
    // sampled, and "the parent is remote" is known and true
    assert_eq!(s.flags, 0x301);
    assert_eq!(s.kind, span::SpanKind::Server as i32);
    assert_eq!(s.name, "POST");
    assert_eq!(
        (s.start_time_unix_nano, s.end_time_unix_nano),
        (1_001, 2_001)
    );
    assert_eq!(
        s.status.as_ref().unwrap().code,
        status::StatusCode::Unset as i32
    );
    // the attributes kept together (the shared and static strings, numbers, booleans) first,
    // then the owned string and the float, each group in its order
    assert_eq!(
        attrs(s),
        vec![
            (
                "gen_ai.request.model".into(),
                Some(Any::StringValue("m".into()))
            ),
            (
                "flexinfer.strategy".into(),
                Some(Any::StringValue("prefix".into()))
            ),
            ("flexinfer.retries".into(), Some(Any::IntValue(0))),
            ("flexinfer.spill".into(), Some(Any::BoolValue(false))),
            (
                "url.path".into(),
                Some(Any::StringValue("/v1/chat/completions".into()))
            ),
            (
                "flexinfer.queue_wait_seconds".into(),
                Some(Any::DoubleValue(0.25))
            ),
        ]
    );

    assert_eq!(a.parent_span_id, 1u64.to_be_bytes());
    assert_eq!(a.trace_state, "");
    assert_eq!(a.flags, 0x101, "a local parent");
    assert_eq!(a.kind, span::SpanKind::Client as i32);
    let st = a.status.as_ref().unwrap();
    assert_eq!(st.code, status::StatusCode::Error as i32);
    assert_eq!(st.message, "10.0.0.1:8000 answered 503");
}

#[test]
fn a_root_span_has_no_parent_bytes() {
    let sa = server_attributes();
    let root = EndedSpan {
        parent: SpanId::INVALID,
        parent_is_remote: false,
        trace_state: None,
        ..server(5, &sa)
    };
    let (_, spans) = decode(&fresh_body(&resource(), &[root]));
    assert!(spans[0].parent_span_id.is_empty());
    assert_eq!(spans[0].flags, 0x101);
}

/// Spans encoded one by one and framed by `Encoder` are byte for byte the body prost encodes
/// from the OTLP types themselves (what a collector decodes, encoded again): with and without
/// a resource schema URL, and for batches whose lengths take one to three varint bytes.
#[test]
fn the_body_is_what_prost_encodes_from_the_otlp_request() {
    let (sa, aa) = (server_attributes(), attempt_attributes());
    let with_schema = opentelemetry_sdk::Resource::builder()
        .with_service_name("svc-under-test")
        .with_schema_url([], "https://opentelemetry.io/schemas/1.26.0")
        .build();
    assert!(with_schema.schema_url().is_some());
    for r in [resource(), with_schema] {
        let (mut e, f) = (SpanEncoder::default(), Encoder::new(&r));
        let many: Vec<_> = (0..300).map(|n| attempt(10 + n, 1, &aa)).collect();
        for batch in [
            vec![
                server(1, &sa),
                attempt(2, 1, &aa),
                server(3, &sa),
                attempt(4, 3, &aa),
            ],
            vec![server(5, &sa)],
            vec![],
            many,
        ] {
            let body = body(&mut e, &f, &batch);
            let (request, spans) = decode(&body);
            assert_eq!(spans.len(), batch.len());
            assert_eq!(body.as_ref(), request.encode_to_vec().as_slice());
            assert_eq!(
                request.resource_spans[0].schema_url.is_empty(),
                r.schema_url().is_none()
            );
        }
    }
}

/// Reused spans and attributes never leak into the next batch: every batch decodes exactly as
/// a fresh encoder would write it, whatever came before.
#[test]
fn reused_buffers_leave_nothing_of_earlier_batches() {
    let (sa, aa) = (server_attributes(), attempt_attributes());
    let oa = Attributes::from(vec![
        Attribute::new("flexinfer.strategy", 7i64),
        Attribute::new("gen_ai.request.model", true),
    ]);
    let r = resource();
    let (mut e, f) = (SpanEncoder::default(), Encoder::new(&r));
    let other = EndedSpan {
        attributes: &oa,
        error: Some("x"),
        ..server(9, &sa)
    };
    let batches: Vec<Vec<EndedSpan>> = vec![
        vec![server(1, &sa), attempt(2, 1, &aa), server(3, &sa)],
        vec![attempt(4, 3, &aa)],
        vec![other, server(6, &sa)],
        vec![],
        vec![server(7, &sa), other, attempt(8, 7, &aa), server(10, &sa)],
        vec![server(11, &sa)],
    ];
    let mut reused_body = Vec::new();
    for batch in &batches {
        let fresh = fresh_body(&r, batch);
        let body = body(&mut e, &f, batch);
        assert_eq!(decode(&body).0, decode(&fresh).0);
        assert_eq!(body, fresh, "the same bytes");
        assert_eq!(decode(&body).1.len(), batch.len());
        f.encode_into(&queued(&mut e, batch), &mut reused_body);
        assert_eq!(reused_body, fresh, "a body filled again");
    }
}

/// A collector that keeps where each body it was sent lay in memory, and its bytes.
#[derive(Debug, Default, Clone)]
struct Recording {
    bodies: Arc<std::sync::Mutex<Vec<(usize, Bytes)>>>,
    /// Each request's `Content-Encoding`.
    encodings: Arc<std::sync::Mutex<Vec<Option<HeaderValue>>>>,
}

/// (The trait is an `async_trait`: its method returns a boxed future.)
impl opentelemetry_http::HttpClient for Recording {
    fn send_bytes<'s, 'f>(
        &'s self,
        request: http::Request<Bytes>,
    ) -> std::pin::Pin<
        Box<
            dyn std::future::Future<
                    Output = Result<http::Response<Bytes>, opentelemetry_http::HttpError>,
                > + Send
                + 'f,
        >,
    >
    where
        's: 'f,
        Self: 'f,
    {
        let encoding = request.headers().get(CONTENT_ENCODING).cloned();
        self.encodings.lock().unwrap().push(encoding);
        let body = request.into_body();
        let copy = Bytes::copy_from_slice(&body);
        self.bodies
            .lock()
            .unwrap()
            .push((body.as_ptr() as usize, copy));
        Box::pin(std::future::ready(Ok(http::Response::new(Bytes::new()))))
    }
}

/// An exporter of `resource` to a recording client, and the client. (A resource built twice
/// may order its attributes differently: compare bodies made with the same one.)
fn recorded(
    resource: &opentelemetry_sdk::Resource,
    compression: Compression,
) -> (Recording, OtlpHttpExporter<Recording>) {
    let client = Recording::default();
    let exporter = OtlpHttpExporter::new(
        client.clone(),
        "http://127.0.0.1:4318/v1/traces".parse().unwrap(),
        http::HeaderMap::new(),
        resource,
        compression,
    );
    (client, exporter)
}

/// The body of an export the HTTP client has dropped is filled by the next export: no batch
/// after the first needs fresh memory, and each body is still the batch's own request.
#[tokio::test]
async fn an_export_reuses_the_body_the_client_dropped() {
    let (sa, aa) = (server_attributes(), attempt_attributes());
    let r = resource();
    let (client, mut exporter) = recorded(&r, Compression::None);
    let mut e = SpanEncoder::default();
    let batches = [
        vec![server(1, &sa), attempt(2, 1, &aa), server(3, &sa)],
        vec![server(4, &sa), attempt(5, 4, &aa)],
        vec![attempt(6, 4, &aa)],
    ];
    for batch in &batches {
        exporter.export(&queued(&mut e, batch)).await.expect("sent");
        let kept = exporter.bodies.capacities();
        assert_eq!(kept.len(), 1, "the body came back");
        assert!(kept[0] >= fresh_body(&r, batch).len());
    }
    let sent = client.bodies.lock().unwrap();
    assert_eq!(sent.len(), 3);
    assert!(
        sent.iter().all(|(at, _)| *at == sent[0].0),
        "one body, filled three times"
    );
    for ((_, bytes), batch) in sent.iter().zip(&batches) {
        assert_eq!(bytes, &fresh_body(&r, batch));
    }
}

/// With gzip, each export is its batch's request compressed, under `Content-Encoding: gzip`,
/// and the encoded body and the compressed one both come back for the next export.
#[tokio::test]
async fn a_gzip_export_is_the_request_compressed() {
    use std::io::Read;
    let (sa, aa) = (server_attributes(), attempt_attributes());
    let r = resource();
    let (client, mut exporter) = recorded(&r, Compression::Gzip);
    let mut e = SpanEncoder::default();
    let many: Vec<EndedSpan<'_, '_>> = (0..400).map(|n| server(n + 1, &sa)).collect();
    let batches = [
        vec![server(1, &sa), attempt(2, 1, &aa)],
        many,
        vec![attempt(6, 4, &aa)],
    ];
    for batch in &batches {
        exporter.export(&queued(&mut e, batch)).await.expect("sent");
        assert_eq!(
            exporter.bodies.capacities().len(),
            2,
            "both bodies came back"
        );
    }
    let sent = client.bodies.lock().unwrap();
    let encodings = client.encodings.lock().unwrap();
    assert_eq!(sent.len(), 3);
    for (((_, bytes), batch), encoding) in sent.iter().zip(&batches).zip(encodings.iter()) {
        assert_eq!(encoding.as_ref().map(|v| v.as_bytes()), Some(&b"gzip"[..]));
        let mut plain = Vec::new();
        flate2::read::GzDecoder::new(&bytes[..])
            .read_to_end(&mut plain)
            .expect("a gzip body");
        let fresh = fresh_body(&r, batch);
        assert_eq!(plain, fresh);
        if batch.len() > 100 {
            assert!(
                bytes.len() * 4 < fresh.len(),
                "{} of {}",
                bytes.len(),
                fresh.len()
            );
        }
    }
}

/// Without compression no `Content-Encoding` is sent.
#[tokio::test]
async fn an_uncompressed_export_names_no_encoding() {
    let sa = server_attributes();
    let (client, mut exporter) = recorded(&resource(), Compression::None);
    let mut e = SpanEncoder::default();
    let batch = queued(&mut e, &[server(1, &sa)]);
    exporter.export(&batch).await.expect("sent");
    assert_eq!(*client.encodings.lock().unwrap(), vec![None]);
}

#[test]
fn headers_are_key_value_pairs_with_percent_encoded_values() {
    let h = parse_headers("authorization=Bearer%20t0ken, x-tenant = a%2Cb ,,").unwrap();
    assert_eq!(h.len(), 2);
    assert_eq!(h["authorization"], "Bearer t0ken");
    assert_eq!(h["x-tenant"], "a,b");
    assert!(parse_headers("").unwrap().is_empty());
    for (bad, names) in [
        ("novalue", "novalue"),
        ("bad name=1", "bad name"),
        ("k=%zz", "\"k\""),
        ("k=%2", "\"k\""),
        ("k=%+1", "\"k\""),
        ("k=%0A", "\"k\""),
    ] {
        let e = parse_headers(bad).unwrap_err();
        assert!(e.contains(names), "{bad}: {e}");
    }
}

fn hex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}
