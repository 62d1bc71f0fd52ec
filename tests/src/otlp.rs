//! A local OTLP/HTTP traces receiver: decodes each `POST /v1/traces` (protobuf) into the spans
//! it carries, or, hung, accepts requests and never answers (a collector that stopped).

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{any_value::Value, KeyValue};
use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message;
use tokio::task::JoinHandle;

/// A received span with its resource's `service.name`.
#[derive(Debug, Clone)]
pub struct Received {
    pub service: String,
    pub span: Span,
}

impl Received {
    pub fn trace_id(&self) -> String {
        hex(&self.span.trace_id)
    }
    pub fn span_id(&self) -> String {
        hex(&self.span.span_id)
    }
    pub fn parent_id(&self) -> String {
        hex(&self.span.parent_span_id)
    }
    /// An attribute's value as text (strings as they are, numbers and bools formatted).
    pub fn attr(&self, key: &str) -> Option<String> {
        attr(&self.span.attributes, key)
    }
}

pub fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn attr(attrs: &[KeyValue], key: &str) -> Option<String> {
    let v = attrs
        .iter()
        .find(|kv| kv.key == key)?
        .value
        .as_ref()?
        .value
        .as_ref()?;
    Some(match v {
        Value::StringValue(s) => s.clone(),
        Value::IntValue(i) => i.to_string(),
        Value::DoubleValue(d) => d.to_string(),
        Value::BoolValue(b) => b.to_string(),
        other => format!("{other:?}"),
    })
}

/// The running receiver; stopped on drop.
pub struct Receiver {
    pub addr: SocketAddr,
    spans: Arc<Mutex<Vec<Received>>>,
    /// Export requests that arrived (answered or not).
    requests: Arc<Mutex<u64>>,
    task: JoinHandle<()>,
}

impl Drop for Receiver {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Receiver {
    /// Its base URL (`OTEL_EXPORTER_OTLP_ENDPOINT`).
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn spans(&self) -> Vec<Received> {
        self.spans.lock().unwrap().clone()
    }

    pub fn requests(&self) -> u64 {
        *self.requests.lock().unwrap()
    }

    /// Wait until at least `n` spans arrived (panics after 10 s).
    pub async fn wait_spans(&self, n: usize) -> Vec<Received> {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let spans = self.spans();
            if spans.len() >= n {
                return spans;
            }
            assert!(
                Instant::now() < deadline,
                "{} spans after 10 s, want {n}: {spans:#?}",
                spans.len()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// A receiver that decodes and keeps every span.
pub async fn receiver() -> Receiver {
    start(false).await
}

/// A receiver that reads each export request and never answers.
pub async fn hung_receiver() -> Receiver {
    start(true).await
}

async fn start(hang: bool) -> Receiver {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let spans = Arc::new(Mutex::new(Vec::new()));
    let requests = Arc::new(Mutex::new(0));
    let (keep, count) = (spans.clone(), requests.clone());
    let task = tokio::spawn(async move {
        while let Ok((s, _)) = l.accept().await {
            let (keep, count) = (keep.clone(), count.clone());
            let svc = service_fn(move |req| {
                let (keep, count) = (keep.clone(), count.clone());
                async move { handle(req, keep, count, hang).await }
            });
            tokio::spawn(async move {
                let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(s), svc)
                    .await;
            });
        }
    });
    Receiver {
        addr,
        spans,
        requests,
        task,
    }
}

async fn handle(
    req: Request<Incoming>,
    keep: Arc<Mutex<Vec<Received>>>,
    count: Arc<Mutex<u64>>,
    hang: bool,
) -> Result<Response<Full<Bytes>>, std::convert::Infallible> {
    let ok_path = req.uri().path() == "/v1/traces";
    let ctype = req
        .headers()
        .get("content-type")
        .map(|v| v.as_bytes().to_vec());
    let body = req.into_body().collect().await.map(|b| b.to_bytes());
    *count.lock().unwrap() += 1;
    if hang {
        std::future::pending::<()>().await;
    }
    let status = match (ok_path, ctype.as_deref(), body) {
        (true, Some(b"application/x-protobuf"), Ok(body)) => {
            match ExportTraceServiceRequest::decode(body) {
                Ok(export) => {
                    keep.lock().unwrap().extend(flatten(export));
                    200
                }
                Err(_) => 400,
            }
        }
        (false, ..) => 404,
        _ => 415,
    };
    let resp = Response::builder()
        .status(status)
        .header("content-type", "application/x-protobuf")
        .body(Full::new(Bytes::new()))
        .unwrap();
    Ok(resp)
}

fn flatten(export: ExportTraceServiceRequest) -> Vec<Received> {
    let mut out = Vec::new();
    for rs in export.resource_spans {
        let service = rs
            .resource
            .as_ref()
            .and_then(|r| attr(&r.attributes, "service.name"))
            .unwrap_or_default();
        for ss in rs.scope_spans {
            for span in ss.spans {
                out.push(Received {
                    service: service.clone(),
                    span,
                });
            }
        }
    }
    out
}
