//! A small in-process Kubernetes API server for tests (there is no real one on these machines).
//!
//! It speaks the list and watch protocol kube-rs uses, with real Kubernetes JSON: lists carry
//! `metadata.resourceVersion`, watches stream newline-delimited `{"type", "object"}` events from a
//! given resourceVersion, and [`TestApiServer::expire`] answers open watches with a 410 Gone ERROR
//! event and compacts history, which forces clients to relist.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use futures::StreamExt;
use http::{Request, Response, StatusCode};
use http_body_util::{combinators::BoxBody, BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper_util::rt::TokioIo;
use serde_json::{json, Value};
use tokio::net::TcpListener;
use tokio::sync::broadcast;

/// The three resources the proxy watches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Kind {
    Model,
    Service,
    EndpointSlice,
}

impl Kind {
    fn api_version(self) -> &'static str {
        match self {
            Kind::Model => "inference.flexinfer.ai/v1alpha2",
            Kind::Service => "v1",
            Kind::EndpointSlice => "discovery.k8s.io/v1",
        }
    }
    fn name(self) -> &'static str {
        match self {
            Kind::Model => "Model",
            Kind::Service => "Service",
            Kind::EndpointSlice => "EndpointSlice",
        }
    }
    fn from_kind(kind: &str) -> Option<Kind> {
        [Kind::Model, Kind::Service, Kind::EndpointSlice]
            .into_iter()
            .find(|k| k.name() == kind)
    }
    /// `(path prefix, plural)` of the collection.
    fn route(self) -> (&'static str, &'static str) {
        match self {
            Kind::Model => ("/apis/inference.flexinfer.ai/v1alpha2", "models"),
            Kind::Service => ("/api/v1", "services"),
            Kind::EndpointSlice => ("/apis/discovery.k8s.io/v1", "endpointslices"),
        }
    }
    /// Parses `<prefix>/<plural>` or `<prefix>/namespaces/<ns>/<plural>`.
    fn parse_path(path: &str) -> Option<(Kind, Option<String>)> {
        for kind in [Kind::Model, Kind::Service, Kind::EndpointSlice] {
            let (prefix, plural) = kind.route();
            let Some(rest) = path.strip_prefix(prefix).and_then(|r| r.strip_prefix('/')) else {
                continue;
            };
            if rest == plural {
                return Some((kind, None));
            }
            if let Some(ns) = rest
                .strip_prefix("namespaces/")
                .and_then(|r| r.strip_suffix(&format!("/{plural}")))
            {
                if !ns.contains('/') {
                    return Some((kind, Some(ns.to_owned())));
                }
            }
        }
        None
    }
}

#[derive(Clone, Debug)]
enum Broadcast {
    Event {
        rv: u64,
        kind: Kind,
        namespace: String,
        line: Bytes,
    },
    Expire(Kind),
}

#[derive(Default)]
struct Inner {
    rv: u64,
    /// Watches from a resourceVersion below this get 410 Gone.
    compacted: u64,
    objects: BTreeMap<(Kind, String, String), Value>,
    history: Vec<(u64, Kind, String, Bytes)>,
    requests: Vec<String>,
    /// Kinds whose requests fail with this HTTP status (403 = RBAC, 404 = no CRD).
    failing: BTreeMap<Kind, u16>,
}

/// The server; it stops when dropped.
pub struct TestApiServer {
    addr: SocketAddr,
    inner: Arc<Mutex<Inner>>,
    tx: broadcast::Sender<Broadcast>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for TestApiServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

type Body = BoxBody<Bytes, Infallible>;

fn line(v: &Value) -> Bytes {
    let mut s = serde_json::to_vec(v).expect("json");
    s.push(b'\n');
    Bytes::from(s)
}

fn gone(kind: Kind) -> Bytes {
    line(&json!({"type": "ERROR", "object": {
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": format!("too old resource version (watch of {})", kind.name()),
        "reason": "Expired", "code": 410
    }}))
}

impl TestApiServer {
    pub async fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let inner = Arc::new(Mutex::new(Inner {
            rv: 1,
            ..Inner::default()
        }));
        let (tx, _) = broadcast::channel(1024);
        let (inner2, tx2) = (inner.clone(), tx.clone());
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let (inner, tx) = (inner2.clone(), tx2.clone());
                tokio::spawn(async move {
                    let svc = hyper::service::service_fn(move |req| {
                        let (inner, tx) = (inner.clone(), tx.clone());
                        async move { Ok::<_, Infallible>(handle(req, &inner, &tx)) }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), svc)
                        .await;
                });
            }
        });
        Self {
            addr,
            inner,
            tx,
            task,
        }
    }

    /// `http://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// A kube client talking plain HTTP to this server.
    pub fn client(&self) -> kube::Client {
        let config = kube::Config::new(self.url().parse().expect("uri"));
        kube::Client::try_from(config).expect("client")
    }

    /// Creates or replaces an object (its `kind`, `metadata.namespace` and `metadata.name` say
    /// which), giving it the next resourceVersion and telling the watchers.
    pub fn apply(&self, mut obj: Value) {
        let kind = Kind::from_kind(obj["kind"].as_str().expect("kind")).expect("known kind");
        obj["apiVersion"] = json!(kind.api_version());
        let ns = obj["metadata"]["namespace"]
            .as_str()
            .unwrap_or("default")
            .to_owned();
        let name = obj["metadata"]["name"].as_str().expect("name").to_owned();
        obj["metadata"]["namespace"] = json!(ns);
        let mut inner = self.inner.lock().unwrap();
        inner.rv += 1;
        let rv = inner.rv;
        obj["metadata"]["resourceVersion"] = json!(rv.to_string());
        let key = (kind, ns.clone(), name);
        let ty = if inner.objects.contains_key(&key) {
            "MODIFIED"
        } else {
            "ADDED"
        };
        let event = line(&json!({"type": ty, "object": obj}));
        inner.objects.insert(key, obj);
        self.record(&mut inner, rv, kind, ns, event);
    }

    pub fn delete(&self, kind: Kind, ns: &str, name: &str) {
        let mut inner = self.inner.lock().unwrap();
        let Some(mut obj) = inner
            .objects
            .remove(&(kind, ns.to_owned(), name.to_owned()))
        else {
            return;
        };
        inner.rv += 1;
        let rv = inner.rv;
        obj["metadata"]["resourceVersion"] = json!(rv.to_string());
        let event = line(&json!({"type": "DELETED", "object": obj}));
        self.record(&mut inner, rv, kind, ns.to_owned(), event);
    }

    fn record(&self, inner: &mut Inner, rv: u64, kind: Kind, namespace: String, line: Bytes) {
        inner
            .history
            .push((rv, kind, namespace.clone(), line.clone()));
        let _ = self.tx.send(Broadcast::Event {
            rv,
            kind,
            namespace,
            line,
        });
    }

    /// Ends every open watch of `kind` with a 410 Gone ERROR event and forgets the history, so the
    /// client must relist.
    pub fn expire(&self, kind: Kind) {
        let mut inner = self.inner.lock().unwrap();
        inner.compacted = inner.rv + 1;
        inner.history.clear();
        let _ = self.tx.send(Broadcast::Expire(kind));
    }

    /// Sends a BOOKMARK with the current resourceVersion to every open watch.
    pub fn bookmark(&self) {
        let inner = self.inner.lock().unwrap();
        for kind in [Kind::Model, Kind::Service, Kind::EndpointSlice] {
            let event = line(&json!({"type": "BOOKMARK", "object": {
                "kind": kind.name(), "apiVersion": kind.api_version(),
                "metadata": {"resourceVersion": inner.rv.to_string()}
            }}));
            let _ = self.tx.send(Broadcast::Event {
                rv: inner.rv,
                kind,
                namespace: String::new(),
                line: event,
            });
        }
    }

    /// Makes every request for `kind` fail with `code` (None heals it).
    pub fn fail(&self, kind: Kind, code: Option<u16>) {
        let mut inner = self.inner.lock().unwrap();
        match code {
            Some(c) => inner.failing.insert(kind, c),
            None => inner.failing.remove(&kind),
        };
    }

    /// The requests served so far (`path?query`).
    pub fn requests(&self) -> Vec<String> {
        self.inner.lock().unwrap().requests.clone()
    }
}

fn ns_matches(want: &Option<String>, ns: &str) -> bool {
    want.as_deref().is_none_or(|w| w == ns)
}

fn query_param<'a>(query: &'a str, key: &str) -> Option<&'a str> {
    query
        .split('&')
        .filter_map(|kv| kv.split_once('='))
        .find(|(k, _)| *k == key)
        .map(|(_, v)| v)
}

fn respond(status: StatusCode, body: Value) -> Response<Body> {
    Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .body(Full::new(line(&body)).boxed())
        .expect("response")
}

fn handle(
    req: Request<Incoming>,
    inner: &Mutex<Inner>,
    tx: &broadcast::Sender<Broadcast>,
) -> Response<Body> {
    let path = req.uri().path().to_owned();
    let query = req.uri().query().unwrap_or("").to_owned();
    let mut guard = inner.lock().unwrap();
    guard.requests.push(format!("{path}?{query}"));
    let Some((kind, ns)) = Kind::parse_path(&path) else {
        return respond(
            StatusCode::NOT_FOUND,
            json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound", "code": 404}),
        );
    };
    if let Some(&code) = guard.failing.get(&kind) {
        let status = StatusCode::from_u16(code).expect("status");
        let reason = status
            .canonical_reason()
            .unwrap_or("Error")
            .replace(' ', "");
        return respond(
            status,
            json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                   "message": format!("{} failed", kind.name()), "reason": reason, "code": code}),
        );
    }
    let watching = matches!(query_param(&query, "watch"), Some("true" | "1"));
    if !watching {
        let items: Vec<Value> = guard
            .objects
            .iter()
            .filter(|((k, n, _), _)| *k == kind && ns_matches(&ns, n))
            .map(|(_, v)| v.clone())
            .collect();
        return respond(
            StatusCode::OK,
            json!({
                "kind": format!("{}List", kind.name()), "apiVersion": kind.api_version(),
                "metadata": {"resourceVersion": guard.rv.to_string()}, "items": items
            }),
        );
    }
    let since: u64 = query_param(&query, "resourceVersion")
        .and_then(|v| v.parse().ok())
        .unwrap_or(guard.rv);
    // Subscribe under the lock: no event falls between the backlog and the live stream.
    let rx = tx.subscribe();
    let mut backlog: Vec<Bytes> = Vec::new();
    let expired = since < guard.compacted;
    if expired {
        backlog.push(gone(kind));
    } else {
        backlog.extend(
            guard
                .history
                .iter()
                .filter(|(rv, k, n, _)| *rv > since && *k == kind && ns_matches(&ns, n))
                .map(|(.., l)| l.clone()),
        );
    }
    drop(guard);
    let live = futures::stream::unfold((rx, expired), move |(mut rx, done)| {
        let ns = ns.clone();
        async move {
            if done {
                return None;
            }
            loop {
                match rx.recv().await {
                    Ok(Broadcast::Event {
                        rv,
                        kind: k,
                        namespace,
                        line,
                    }) => {
                        // Bookmarks carry no namespace.
                        if k == kind
                            && rv >= since
                            && (namespace.is_empty() || ns_matches(&ns, &namespace))
                        {
                            return Some((line, (rx, false)));
                        }
                    }
                    Ok(Broadcast::Expire(k)) if k == kind => return Some((gone(kind), (rx, true))),
                    Ok(Broadcast::Expire(_)) => {}
                    Err(broadcast::error::RecvError::Lagged(_)) => {
                        return Some((gone(kind), (rx, true)))
                    }
                    Err(broadcast::error::RecvError::Closed) => return None,
                }
            }
        }
    });
    let body = StreamBody::new(
        futures::stream::iter(backlog)
            .chain(live)
            .map(|l| Ok::<_, Infallible>(Frame::data(l))),
    );
    Response::builder()
        .status(StatusCode::OK)
        .header("content-type", "application/json")
        .body(BodyExt::boxed(body))
        .expect("response")
}
