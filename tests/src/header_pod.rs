//! A pod that remembers the trace headers of each request it gets and answers like a model
//! server (a chat completion with `usage`), for the tracing tests.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::task::JoinHandle;

/// What one request carried.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Seen {
    pub traceparent: Option<String>,
    pub tracestate: Option<String>,
}

/// The running pod; stopped on drop.
pub struct HeaderPod {
    pub addr: SocketAddr,
    seen: Arc<Mutex<Vec<Seen>>>,
    task: JoinHandle<()>,
}

impl Drop for HeaderPod {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl HeaderPod {
    pub fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }
}

/// The completion every request gets: 12 prompt tokens, 3 completion tokens.
pub const ANSWER: &str = r#"{"id":"c1","object":"chat.completion","model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}],"usage":{"prompt_tokens":12,"completion_tokens":3,"total_tokens":15}}"#;

pub async fn header_pod() -> HeaderPod {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let keep = seen.clone();
    let task = tokio::spawn(async move {
        while let Ok((s, _)) = l.accept().await {
            let keep = keep.clone();
            let svc = service_fn(move |req| answer(req, keep.clone()));
            tokio::spawn(async move {
                let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(s), svc)
                    .await;
            });
        }
    });
    HeaderPod { addr, seen, task }
}

async fn answer(
    req: Request<Incoming>,
    seen: Arc<Mutex<Vec<Seen>>>,
) -> Result<Response<Full<Bytes>>, std::convert::Infallible> {
    let text = |name: &str| {
        req.headers()
            .get(name)
            .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
    };
    let s = Seen {
        traceparent: text("traceparent"),
        tracestate: text("tracestate"),
    };
    let _ = req.into_body().collect().await;
    seen.lock().unwrap().push(s);
    let resp = Response::builder()
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from_static(ANSWER.as_bytes())))
        .unwrap();
    Ok(resp)
}
