//! A local OTLP/HTTP traces receiver: decodes each `POST /v1/traces` (protobuf) into the spans
//! it carries, or, hung, accepts requests and never answers (a collector that stopped). It can
//! speak TLS with a certificate from a throwaway CA (`TestCa`, made by the openssl CLI).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
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
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::{rustls, TlsAcceptor};

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
    /// The `authorization` header of the last export request.
    authorization: Arc<Mutex<Option<String>>>,
    /// The `content-encoding` header of the last export request.
    encoding: Arc<Mutex<Option<String>>>,
    tls: bool,
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
        let scheme = if self.tls { "https" } else { "http" };
        format!("{scheme}://{}", self.addr)
    }

    pub fn authorization(&self) -> Option<String> {
        self.authorization.lock().unwrap().clone()
    }

    /// The `content-encoding` of the last export request (`None`: the body as it is).
    pub fn encoding(&self) -> Option<String> {
        self.encoding.lock().unwrap().clone()
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
    start(false, None).await
}

/// A receiver that reads each export request and never answers.
pub async fn hung_receiver() -> Receiver {
    start(true, None).await
}

/// A receiver behind TLS, with `ca`'s certificate for 127.0.0.1.
pub async fn tls_receiver(ca: &TestCa) -> Receiver {
    start(false, Some(ca.acceptor())).await
}

/// What every connection's service shares.
#[derive(Clone)]
struct Shared {
    keep: Arc<Mutex<Vec<Received>>>,
    count: Arc<Mutex<u64>>,
    authorization: Arc<Mutex<Option<String>>>,
    encoding: Arc<Mutex<Option<String>>>,
    hang: bool,
}

async fn start(hang: bool, tls: Option<TlsAcceptor>) -> Receiver {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let shared = Shared {
        keep: Arc::new(Mutex::new(Vec::new())),
        count: Arc::new(Mutex::new(0)),
        authorization: Arc::new(Mutex::new(None)),
        encoding: Arc::new(Mutex::new(None)),
        hang,
    };
    let (spans, requests, authorization, encoding) = (
        shared.keep.clone(),
        shared.count.clone(),
        shared.authorization.clone(),
        shared.encoding.clone(),
    );
    let is_tls = tls.is_some();
    let task = tokio::spawn(async move {
        while let Ok((s, _)) = l.accept().await {
            let shared = shared.clone();
            let svc = service_fn(move |req| handle(req, shared.clone()));
            let tls = tls.clone();
            tokio::spawn(async move {
                let http = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
                let _ = match tls {
                    None => http.serve_connection(TokioIo::new(s), svc).await,
                    Some(acceptor) => match acceptor.accept(s).await {
                        Ok(s) => http.serve_connection(TokioIo::new(s), svc).await,
                        Err(_) => return,
                    },
                };
            });
        }
    });
    Receiver {
        addr,
        spans,
        requests,
        authorization,
        encoding,
        tls: is_tls,
        task,
    }
}

async fn handle(
    req: Request<Incoming>,
    shared: Shared,
) -> Result<Response<Full<Bytes>>, std::convert::Infallible> {
    let Shared {
        keep,
        count,
        authorization,
        encoding: last_encoding,
        hang,
    } = shared;
    let ok_path = req.uri().path() == "/v1/traces";
    *authorization.lock().unwrap() = req
        .headers()
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let ctype = req
        .headers()
        .get("content-type")
        .map(|v| v.as_bytes().to_vec());
    let encoding = req
        .headers()
        .get("content-encoding")
        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned());
    *last_encoding.lock().unwrap() = encoding.clone();
    let body = req
        .into_body()
        .collect()
        .await
        .map_err(|_| ())
        .and_then(|b| decoded_body(b.to_bytes(), encoding.as_deref()));
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

/// The body as sent, or gunzipped under `Content-Encoding: gzip` (as a collector reads it);
/// any other encoding is refused.
fn decoded_body(body: Bytes, encoding: Option<&str>) -> Result<Bytes, ()> {
    use std::io::Read;
    match encoding {
        None | Some("identity") => Ok(body),
        Some("gzip") => {
            let mut plain = Vec::new();
            flate2::read::GzDecoder::new(&body[..])
                .read_to_end(&mut plain)
                .map_err(|_| ())?;
            Ok(Bytes::from(plain))
        }
        Some(_) => Err(()),
    }
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

/// A throwaway CA and a server certificate it signed for 127.0.0.1 (files in `dir`).
pub struct TestCa {
    /// The CA certificate (PEM): what a client must trust.
    pub ca: PathBuf,
    cert: PathBuf,
    key: PathBuf,
}

impl TestCa {
    /// Make one with the openssl CLI (panics, naming the step, when openssl fails).
    pub fn new(dir: &Path) -> Self {
        let f = |n: &str| dir.join(n).display().to_string();
        let ec = "-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes";
        openssl(&format!(
            "req -x509 {ec} -keyout {} -out {} -days 2 -subj /CN=flexinfer-test-CA \
             -addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign,cRLSign",
            f("ca.key"),
            f("ca.pem")
        ));
        openssl(&format!(
            "req {ec} -keyout {} -out {} -subj /CN=127.0.0.1",
            f("server.key"),
            f("server.csr")
        ));
        let ext =
            "subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n";
        std::fs::write(dir.join("server.ext"), ext).unwrap();
        openssl(&format!(
            "x509 -req -in {} -CA {} -CAkey {} -extfile {} -out {} -days 2 -set_serial 2",
            f("server.csr"),
            f("ca.pem"),
            f("ca.key"),
            f("server.ext"),
            f("server.pem")
        ));
        Self {
            ca: dir.join("ca.pem"),
            cert: dir.join("server.pem"),
            key: dir.join("server.key"),
        }
    }

    fn acceptor(&self) -> TlsAcceptor {
        let certs = CertificateDer::pem_file_iter(&self.cert)
            .unwrap()
            .collect::<Result<Vec<_>, _>>()
            .unwrap();
        let key = PrivateKeyDer::from_pem_file(&self.key).unwrap();
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(certs, key)
            .unwrap();
        TlsAcceptor::from(Arc::new(config))
    }
}

/// Run openssl with `args` (split on whitespace: the paths here have no spaces).
fn openssl(args: &str) {
    let out = Command::new("openssl")
        .args(args.split_whitespace())
        .output()
        .expect("openssl runs (the test command installs it)");
    assert!(
        out.status.success(),
        "openssl {args}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}
