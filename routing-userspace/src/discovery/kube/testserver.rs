//! A small in-process Kubernetes API server for tests (there is no real one on these machines).
//!
//! It speaks the list and watch protocol kube-rs uses, with real Kubernetes JSON: lists carry
//! `metadata.resourceVersion`, watches stream newline-delimited `{"type", "object"}` events from a
//! given resourceVersion, and [`TestApiServer::expire`] answers open watches with a 410 Gone ERROR
//! event and compacts history, which forces clients to relist. Label and field selectors filter
//! lists and watches as the API server does: an object that stops matching a watch's selector
//! reaches it as DELETED, one that starts matching as ADDED.

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

/// The resources the proxy watches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(super) enum Kind {
    Model,
    Service,
    EndpointSlice,
    InferencePool,
    Pod,
}

impl Kind {
    const ALL: [Kind; 5] = [
        Kind::Model,
        Kind::Service,
        Kind::EndpointSlice,
        Kind::InferencePool,
        Kind::Pod,
    ];

    fn api_version(self) -> &'static str {
        match self {
            Kind::Model => "inference.flexinfer.ai/v1alpha2",
            Kind::Service | Kind::Pod => "v1",
            Kind::EndpointSlice => "discovery.k8s.io/v1",
            Kind::InferencePool => "inference.networking.k8s.io/v1",
        }
    }
    fn name(self) -> &'static str {
        match self {
            Kind::Model => "Model",
            Kind::Service => "Service",
            Kind::EndpointSlice => "EndpointSlice",
            Kind::InferencePool => "InferencePool",
            Kind::Pod => "Pod",
        }
    }
    fn from_kind(kind: &str) -> Option<Kind> {
        Kind::ALL.into_iter().find(|k| k.name() == kind)
    }
    /// `(path prefix, plural)` of the collection.
    fn route(self) -> (&'static str, &'static str) {
        match self {
            Kind::Model => ("/apis/inference.flexinfer.ai/v1alpha2", "models"),
            Kind::Service => ("/api/v1", "services"),
            Kind::EndpointSlice => ("/apis/discovery.k8s.io/v1", "endpointslices"),
            Kind::InferencePool => ("/apis/inference.networking.k8s.io/v1", "inferencepools"),
            Kind::Pod => ("/api/v1", "pods"),
        }
    }
    /// Parses `<prefix>/<plural>` or `<prefix>/namespaces/<ns>/<plural>`.
    fn parse_path(path: &str) -> Option<(Kind, Option<String>)> {
        for kind in Kind::ALL {
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

/// One stored change: the object after it and, for MODIFIED, before it (selectors need both).
#[derive(Debug)]
struct Change {
    rv: u64,
    kind: Kind,
    namespace: String,
    /// ADDED, MODIFIED or DELETED.
    ty: &'static str,
    old: Option<Value>,
    obj: Value,
}

#[derive(Clone, Debug)]
enum Broadcast {
    Change(Arc<Change>),
    /// A BOOKMARK line for every watch of the kind (bookmarks carry no namespace).
    Bookmark {
        kind: Kind,
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
    history: Vec<Arc<Change>>,
    requests: Vec<String>,
    /// Kinds whose requests fail with this HTTP status (403 = RBAC, 404 = no CRD).
    failing: BTreeMap<Kind, u16>,
}

/// The server; it stops when dropped.
pub(super) struct TestApiServer {
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
    pub(super) async fn start() -> Self {
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
    pub(super) fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// A kube client talking plain HTTP to this server.
    pub(super) fn client(&self) -> kube::Client {
        let config = kube::Config::new(self.url().parse().expect("uri"));
        kube::Client::try_from(config).expect("client")
    }

    /// Creates or replaces an object (its `kind`, `metadata.namespace` and `metadata.name` say
    /// which), giving it the next resourceVersion and telling the watchers.
    pub(super) fn apply(&self, mut obj: Value) {
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
        let old = inner.objects.insert(key, obj.clone());
        let ty = if old.is_some() { "MODIFIED" } else { "ADDED" };
        self.record(
            &mut inner,
            Change {
                rv,
                kind,
                namespace: ns,
                ty,
                old,
                obj,
            },
        );
    }

    pub(super) fn delete(&self, kind: Kind, ns: &str, name: &str) {
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
        let change = Change {
            rv,
            kind,
            namespace: ns.to_owned(),
            ty: "DELETED",
            old: None,
            obj,
        };
        self.record(&mut inner, change);
    }

    fn record(&self, inner: &mut Inner, change: Change) {
        let change = Arc::new(change);
        inner.history.push(change.clone());
        let _ = self.tx.send(Broadcast::Change(change));
    }

    /// Ends every open watch of `kind` with a 410 Gone ERROR event and forgets the history, so the
    /// client must relist.
    pub(super) fn expire(&self, kind: Kind) {
        let mut inner = self.inner.lock().unwrap();
        inner.compacted = inner.rv + 1;
        inner.history.clear();
        let _ = self.tx.send(Broadcast::Expire(kind));
    }

    /// Sends a BOOKMARK with the current resourceVersion to every open watch.
    pub(super) fn bookmark(&self) {
        let inner = self.inner.lock().unwrap();
        for kind in Kind::ALL {
            let line = line(&json!({"type": "BOOKMARK", "object": {
                "kind": kind.name(), "apiVersion": kind.api_version(),
                "metadata": {"resourceVersion": inner.rv.to_string()}
            }}));
            let _ = self.tx.send(Broadcast::Bookmark { kind, line });
        }
    }

    /// Makes every request for `kind` fail with `code` (None heals it).
    pub(super) fn fail(&self, kind: Kind, code: Option<u16>) {
        let mut inner = self.inner.lock().unwrap();
        match code {
            Some(c) => inner.failing.insert(kind, c),
            None => inner.failing.remove(&kind),
        };
    }

    /// The requests served so far (`path?query`).
    pub(super) fn requests(&self) -> Vec<String> {
        self.inner.lock().unwrap().requests.clone()
    }
}

fn ns_matches(want: &Option<String>, ns: &str) -> bool {
    want.as_deref().is_none_or(|w| w == ns)
}

fn query_param(query: &str, key: &str) -> Option<String> {
    query
        .split('&')
        .filter_map(|kv| kv.split_once('='))
        .find(|(k, _)| *k == key)
        .map(|(_, v)| percent_decode(v))
}

/// `%XX` escapes and `+` (a space in a query), as kube's client encodes selectors.
fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' if i + 2 < bytes.len() => {
                let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).unwrap_or("");
                match u8::from_str_radix(hex, 16) {
                    Ok(b) => {
                        out.push(b);
                        i += 3;
                        continue;
                    }
                    Err(_) => out.push(b'%'),
                }
            }
            b'+' => out.push(b' '),
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// One requirement of a label or field selector.
#[derive(Debug, Clone)]
enum Req {
    Eq(String, String),
    Ne(String, String),
    Exists(String),
    Absent(String),
}

/// A parsed `labelSelector` and `fieldSelector` (the `k`, `!k`, `k=v`, `k==v` and `k!=v` forms).
#[derive(Debug, Clone, Default)]
struct Selector {
    labels: Vec<Req>,
    fields: Vec<Req>,
}

fn parse_reqs(s: &str) -> Vec<Req> {
    s.split(',')
        .map(str::trim)
        .filter(|r| !r.is_empty())
        .map(|r| {
            if let Some((k, v)) = r.split_once("!=") {
                Req::Ne(k.trim().into(), v.trim().into())
            } else if let Some((k, v)) = r.split_once('=') {
                Req::Eq(k.trim().into(), v.trim_start_matches('=').trim().into())
            } else if let Some(k) = r.strip_prefix('!') {
                Req::Absent(k.trim().into())
            } else {
                Req::Exists(r.into())
            }
        })
        .collect()
}

impl Selector {
    fn from_query(query: &str) -> Self {
        let get = |k| {
            query_param(query, k)
                .map(|v| parse_reqs(&v))
                .unwrap_or_default()
        };
        Self {
            labels: get("labelSelector"),
            fields: get("fieldSelector"),
        }
    }

    fn matches(&self, obj: &Value) -> bool {
        let label = |k: &str| obj["metadata"]["labels"][k].as_str().map(str::to_owned);
        // Field paths are dotted (`status.phase`); a missing field reads as "".
        let field = |k: &str| {
            let v = k.split('.').fold(obj, |v, part| &v[part]);
            Some(v.as_str().unwrap_or_default().to_owned())
        };
        let holds = |req: &Req, get: &dyn Fn(&str) -> Option<String>| match req {
            Req::Eq(k, v) => get(k).as_deref() == Some(v.as_str()),
            Req::Ne(k, v) => get(k).as_deref() != Some(v.as_str()),
            Req::Exists(k) => get(k).is_some(),
            Req::Absent(k) => get(k).is_none(),
        };
        self.labels.iter().all(|r| holds(r, &label)) && self.fields.iter().all(|r| holds(r, &field))
    }

    /// The line a watch with this selector sees for `change`, if any.
    fn view(&self, change: &Change) -> Option<Bytes> {
        let now = self.matches(&change.obj);
        let before = change.old.as_ref().is_some_and(|o| self.matches(o));
        let ty = match (change.ty, before, now) {
            ("ADDED", _, true) | ("MODIFIED", false, true) => "ADDED",
            ("MODIFIED", true, true) => "MODIFIED",
            ("MODIFIED", true, false) | ("DELETED", _, true) => "DELETED",
            _ => return None,
        };
        Some(line(&json!({"type": ty, "object": change.obj})))
    }
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
    let selector = Selector::from_query(&query);
    let watching = matches!(query_param(&query, "watch").as_deref(), Some("true" | "1"));
    if !watching {
        let items: Vec<Value> = guard
            .objects
            .iter()
            .filter(|((k, n, _), v)| *k == kind && ns_matches(&ns, n) && selector.matches(v))
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
                .filter(|c| c.rv > since && c.kind == kind && ns_matches(&ns, &c.namespace))
                .filter_map(|c| selector.view(c)),
        );
    }
    drop(guard);
    let watch = Watch {
        kind,
        ns,
        since,
        selector,
    };
    let body = StreamBody::new(
        futures::stream::iter(backlog)
            .chain(watch.live(rx, expired))
            .map(|l| Ok::<_, Infallible>(Frame::data(l))),
    );
    Response::builder()
        .status(StatusCode::OK)
        .header("content-type", "application/json")
        .body(BodyExt::boxed(body))
        .expect("response")
}

/// One open watch: what it sees of the live broadcast.
struct Watch {
    kind: Kind,
    ns: Option<String>,
    since: u64,
    selector: Selector,
}

impl Watch {
    fn see(&self, b: Broadcast) -> Option<(Bytes, bool)> {
        match b {
            Broadcast::Change(c)
                if c.kind == self.kind
                    && c.rv >= self.since
                    && ns_matches(&self.ns, &c.namespace) =>
            {
                self.selector.view(&c).map(|l| (l, false))
            }
            Broadcast::Bookmark { kind, line } if kind == self.kind => Some((line, false)),
            Broadcast::Expire(k) if k == self.kind => Some((gone(self.kind), true)),
            _ => None,
        }
    }

    fn live(
        self,
        rx: broadcast::Receiver<Broadcast>,
        expired: bool,
    ) -> impl futures::Stream<Item = Bytes> {
        futures::stream::unfold((rx, expired, self), |(mut rx, done, w)| async move {
            if done {
                return None;
            }
            loop {
                match rx.recv().await {
                    Ok(b) => {
                        if let Some((line, end)) = w.see(b) {
                            return Some((line, (rx, end, w)));
                        }
                    }
                    Err(broadcast::error::RecvError::Lagged(_)) => {
                        return Some((gone(w.kind), (rx, true, w)))
                    }
                    Err(broadcast::error::RecvError::Closed) => return None,
                }
            }
        })
    }
}
