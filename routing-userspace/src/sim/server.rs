//! The sim's HTTP side: routing, request handling, streamed bodies and the accept loop.
//!
//! Each generation takes a slot from a fair semaphore (so waiting counts toward latency), reads
//! the prefix cache, sleeps on the tokio clock for the modelled prefill, then emits tokens on
//! schedule. Streams are fed through a channel, one SSE event per body frame, so a proxy that
//! buffers shows up in tests.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http::{header, HeaderMap, HeaderValue, Method, Request, Response, StatusCode};
use http_body::{Body, Frame, SizeHint};
use http_body_util::{BodyExt, LengthLimitError, Limited};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use serde_json::Value;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch, OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinSet;
use tokio::time::{sleep_until, Instant};
use tracing::{debug, info, warn};
use xxhash_rust::xxh3::xxh3_64;

use super::cache::PrefixCache;
use super::engine;
use super::metrics::{Admission, CacheStats, Endpoint, Stats};
use super::openai::{self, filler_token, Kind, Meta, Usage};
use super::{prompt, tokens, Settings, SimArgs};

/// Largest request body read; bigger ones get 413.
const MAX_BODY_BYTES: usize = 32 << 20;
/// Largest `max_tokens` accepted; more gets 400, as a context-length error would.
const MAX_OUTPUT_TOKENS: u64 = 1 << 16;
/// SSE events buffered between the generator and the connection.
const STREAM_BUFFER: usize = 16;

/// A response body: all at once, or one frame per channel message.
#[derive(Debug)]
pub(super) enum SimBody {
    Full(Option<Bytes>),
    Stream(mpsc::Receiver<Bytes>),
}

impl Body for SimBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        match self.get_mut() {
            SimBody::Full(bytes) => Poll::Ready(bytes.take().map(|b| Ok(Frame::data(b)))),
            SimBody::Stream(rx) => rx.poll_recv(cx).map(|b| b.map(|b| Ok(Frame::data(b)))),
        }
    }

    fn is_end_stream(&self) -> bool {
        matches!(self, SimBody::Full(None))
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            SimBody::Full(Some(b)) => SizeHint::with_exact(b.len() as u64),
            SimBody::Full(None) => SizeHint::with_exact(0),
            SimBody::Stream(_) => SizeHint::default(),
        }
    }
}

/// A client error, rendered as OpenAI's `{"error": {...}}`.
#[derive(Debug)]
struct ApiError {
    status: StatusCode,
    message: String,
    kind: &'static str,
    code: &'static str,
}

impl ApiError {
    fn invalid(message: impl ToString, code: &'static str) -> Self {
        Self {
            status: StatusCode::BAD_REQUEST,
            message: message.to_string(),
            kind: "invalid_request_error",
            code,
        }
    }

    fn into_response(self) -> Response<SimBody> {
        let body = openai::error(&self.message, self.kind, self.code);
        json_response(self.status, &body)
    }
}

fn json_response(status: StatusCode, body: &Value) -> Response<SimBody> {
    let mut resp = Response::new(SimBody::Full(Some(Bytes::from(body.to_string()))));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    resp
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

fn route(method: &Method, path: &str) -> Endpoint {
    let (allowed, endpoint) = match path {
        "/v1/chat/completions" => (Method::POST, Endpoint::Chat),
        "/v1/completions" => (Method::POST, Endpoint::Completions),
        "/v1/embeddings" => (Method::POST, Endpoint::Embeddings),
        "/v1/models" => (Method::GET, Endpoint::Models),
        "/health" => (Method::GET, Endpoint::Health),
        "/metrics" => (Method::GET, Endpoint::Metrics),
        "/slots" => (Method::GET, Endpoint::Slots),
        _ => return Endpoint::NotFound,
    };
    if *method == allowed {
        endpoint
    } else {
        Endpoint::MethodNotAllowed
    }
}

/// Everything one replica shares across connections.
pub(crate) struct State {
    settings: Settings,
    pod_header: HeaderValue,
    cache: Mutex<PrefixCache>,
    slots: Arc<Semaphore>,
    stats: Arc<Stats>,
    next_id: AtomicU64,
    started: u64,
    /// The last prompts, newest last, with their task number and what their request is doing
    /// (`/slots`).
    recent_prompts: Mutex<std::collections::VecDeque<(u64, String, Arc<AtomicU8>)>>,
}

/// What a recent prompt's request is doing, as `/slots` shows it.
const IDLE: u8 = 0;
const PREFILLING: u8 = 1;
const ANSWERING: u8 = 2;

/// A request's hold on its `/slots` entry: prefilling, then answering, idle once dropped (as a
/// llama.cpp slot is busy until its answer ends).
struct SlotWork(Option<Arc<AtomicU8>>);

impl SlotWork {
    fn prefilled(&self) {
        if let Some(w) = &self.0 {
            w.store(ANSWERING, Ordering::Relaxed);
        }
    }
}

impl Drop for SlotWork {
    fn drop(&mut self) {
        if let Some(w) = &self.0 {
            w.store(IDLE, Ordering::Relaxed);
        }
    }
}

impl State {
    fn new(settings: Settings) -> anyhow::Result<Self> {
        Ok(Self {
            pod_header: HeaderValue::from_str(&settings.name)?,
            cache: Mutex::new(PrefixCache::new(settings.cache_blocks)),
            slots: Arc::new(Semaphore::new(settings.max_concurrency)),
            stats: Arc::default(),
            next_id: AtomicU64::new(1),
            started: unix_now(),
            recent_prompts: Mutex::default(),
            settings,
        })
    }

    fn cache(&self) -> MutexGuard<'_, PrefixCache> {
        crate::lock::lock(&self.cache)
    }

    fn meta(&self, kind: Kind, model: String) -> Meta {
        let prefix = match kind {
            Kind::Chat => "chatcmpl",
            Kind::Text => "cmpl",
        };
        let n = self.next_id.fetch_add(1, Ordering::Relaxed);
        Meta {
            kind,
            id: format!(
                "{prefix}-{:08x}{n:08x}",
                xxh3_64(self.settings.name.as_bytes()) as u32
            ),
            created: unix_now(),
            model,
            fingerprint: format!("sim:{}", self.settings.name),
        }
    }
}

async fn handle(state: Arc<State>, req: Request<Incoming>) -> Response<SimBody> {
    let endpoint = route(req.method(), req.uri().path());
    state.stats.count_request(endpoint);
    let load_report = matches!(endpoint, Endpoint::Chat | Endpoint::Completions)
        && engine::wants_load_report(req.headers());
    let body = Limited::new(req.into_body(), MAX_BODY_BYTES)
        .collect()
        .await;
    let (mut resp, sha) = match body {
        Ok(collected) => {
            let body = collected.to_bytes();
            let sha = xxh3_64(&body);
            (respond(&state, endpoint, &body).await, Some(sha))
        }
        Err(e) if e.is::<LengthLimitError>() => {
            let mut e = ApiError::invalid("request body too large", "body_too_large");
            e.status = StatusCode::PAYLOAD_TOO_LARGE;
            (e.into_response(), None)
        }
        Err(e) => (
            ApiError::invalid(e, "body_read_error").into_response(),
            None,
        ),
    };
    // As vLLM: the report goes on non-streamed answers, taken when the answer is ready.
    if load_report && resp.status() == StatusCode::OK && matches!(resp.body(), SimBody::Full(_)) {
        let load = state.stats.engine_load(state.settings.cache_blocks);
        resp.headers_mut()
            .insert(engine::LOAD_REPORT_HEADER, load.orca_header());
    }
    let headers = resp.headers_mut();
    headers.insert("x-sim-pod", state.pod_header.clone());
    if let Some(sha) = sha {
        insert_header(headers, "x-sim-request-body-sha", format!("{sha:016x}"));
    }
    resp
}

fn insert_header(headers: &mut HeaderMap, name: &'static str, value: impl ToString) {
    if let Ok(v) = HeaderValue::from_str(&value.to_string()) {
        headers.insert(name, v);
    }
}

async fn respond(state: &Arc<State>, endpoint: Endpoint, body: &[u8]) -> Response<SimBody> {
    let result = match endpoint {
        Endpoint::Chat => generation(state, Kind::Chat, body).await,
        Endpoint::Completions => generation(state, Kind::Text, body).await,
        Endpoint::Embeddings => embeddings(state, body),
        Endpoint::Models => Ok(json_response(
            StatusCode::OK,
            &openai::models(&state.settings.served_model, state.started),
        )),
        Endpoint::Health => Ok(json_response(
            StatusCode::OK,
            &serde_json::json!({"status": "ok"}),
        )),
        Endpoint::Metrics => Ok(metrics(state)),
        Endpoint::Slots if state.settings.slot_prompts > 0 => Ok(slots(state)),
        Endpoint::Slots | Endpoint::NotFound => Err(ApiError {
            status: StatusCode::NOT_FOUND,
            message: "no such route".into(),
            kind: "invalid_request_error",
            code: "not_found",
        }),
        Endpoint::MethodNotAllowed => Err(ApiError {
            status: StatusCode::METHOD_NOT_ALLOWED,
            message: "method not allowed on this route".into(),
            kind: "invalid_request_error",
            code: "method_not_allowed",
        }),
    };
    result.unwrap_or_else(ApiError::into_response)
}

/// `/slots` as llama.cpp's server shows it with its slots' prompts: one slot per recent prompt
/// (the oldest first), then empty slots up to `--slot-prompts`.
fn slots(state: &State) -> Response<SimBody> {
    let recent = crate::lock::lock(&state.recent_prompts);
    let shown = recent.iter().map(|(task, prompt, work)| {
        let work = work.load(Ordering::Relaxed);
        serde_json::json!({"n_ctx": 4096, "is_processing": work != IDLE, "id_task": task,
            "next_token": {"n_decoded": u8::from(work == ANSWERING)}, "prompt": prompt})
    });
    let empty = (recent.len()..state.settings.slot_prompts)
        .map(|_| serde_json::json!({"n_ctx": 4096, "is_processing": false}));
    let list: Vec<Value> = shown
        .chain(empty)
        .enumerate()
        .map(|(id, mut slot)| {
            slot["id"] = id.into();
            slot
        })
        .collect();
    json_response(StatusCode::OK, &Value::Array(list))
}

/// Keep `prompt` as the newest of the last `--slot-prompts` prompts, shown prefilling until
/// its request's hold says otherwise.
fn remember_prompt(state: &State, prompt: &str) -> SlotWork {
    let keep = state.settings.slot_prompts;
    if keep == 0 {
        return SlotWork(None);
    }
    let task = state.next_id.load(Ordering::Relaxed);
    let work = Arc::new(AtomicU8::new(PREFILLING));
    let mut recent = crate::lock::lock(&state.recent_prompts);
    recent.push_back((task, prompt.to_owned(), Arc::clone(&work)));
    while recent.len() > keep {
        recent.pop_front();
    }
    SlotWork(Some(work))
}

fn metrics(state: &State) -> Response<SimBody> {
    let cache = {
        let c = state.cache();
        CacheStats {
            used: c.len(),
            capacity: c.capacity(),
            evictions: c.evictions(),
        }
    };
    let text = state
        .stats
        .render(&state.settings.name, &state.settings.served_model, cache);
    let mut resp = Response::new(SimBody::Full(Some(Bytes::from(text))));
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
    );
    resp
}

fn parse_object(body: &[u8]) -> Result<Value, ApiError> {
    let value: Value = serde_json::from_slice(body)
        .map_err(|e| ApiError::invalid(format!("invalid JSON body: {e}"), "invalid_json"))?;
    if value.is_object() {
        Ok(value)
    } else {
        Err(ApiError::invalid(
            "request body must be a JSON object",
            "invalid_json",
        ))
    }
}

fn embeddings(state: &State, body: &[u8]) -> Result<Response<SimBody>, ApiError> {
    let body = parse_object(body)?;
    let inputs =
        prompt::embedding_inputs(&body).map_err(|e| ApiError::invalid(e, "invalid_input"))?;
    let model = body
        .get("model")
        .and_then(Value::as_str)
        .unwrap_or(&state.settings.served_model);
    let tokens = inputs.iter().map(|t| tokens::count_tokens(t) as u64).sum();
    let dim = state.settings.embedding_dim;
    let vectors = inputs
        .iter()
        .map(|t| openai::embedding_vector(t, dim))
        .collect();
    Ok(json_response(
        StatusCode::OK,
        &openai::embeddings(model, vectors, tokens),
    ))
}

/// A parsed chat or text completion request.
struct GenRequest {
    kind: Kind,
    model: String,
    prompt: String,
    max_tokens: u64,
    stream: bool,
}

fn parse_generation(kind: Kind, body: &[u8], settings: &Settings) -> Result<GenRequest, ApiError> {
    let body = parse_object(body)?;
    let prompt = match kind {
        Kind::Chat => prompt::render_chat(&body),
        Kind::Text => prompt::render_completion(&body),
    }
    .map_err(|e| ApiError::invalid(e, "invalid_prompt"))?;
    let max_tokens = ["max_completion_tokens", "max_tokens"]
        .iter()
        .find_map(|k| body.get(k).and_then(Value::as_u64))
        .unwrap_or(settings.default_max_tokens);
    if max_tokens > MAX_OUTPUT_TOKENS {
        return Err(ApiError::invalid(
            format!("max_tokens {max_tokens} exceeds {MAX_OUTPUT_TOKENS}"),
            "max_tokens_too_large",
        ));
    }
    Ok(GenRequest {
        kind,
        model: body
            .get("model")
            .and_then(Value::as_str)
            .unwrap_or(&settings.served_model)
            .to_owned(),
        stream: body.get("stream").and_then(Value::as_bool).unwrap_or(false),
        max_tokens,
        prompt,
    })
}

/// One admitted generation: holds its slot and gauge until dropped.
struct Job {
    state: Arc<State>,
    _admission: Admission,
    _permit: OwnedSemaphorePermit,
    start: Instant,
    ttft: Duration,
    blocks: Vec<u64>,
    seed: u64,
    max_tokens: u64,
    meta: Meta,
    usage: Usage,
    slot_work: SlotWork,
}

impl Job {
    fn due(&self, index: u64) -> Instant {
        self.start + self.state.settings.timing.token_due(self.ttft, index)
    }

    /// Prefill is done: the prompt's blocks are now shareable, as vLLM's are once computed.
    fn prefilled(&self) {
        self.state.cache().insert(&self.blocks);
        self.slot_work.prefilled();
    }

    async fn run_to_end(self) -> Response<SimBody> {
        sleep_until(self.start + self.ttft).await;
        self.prefilled();
        if self.max_tokens > 0 {
            sleep_until(self.due(self.max_tokens - 1)).await;
        }
        let text: String = (0..self.max_tokens)
            .map(|i| filler_token(self.seed, i))
            .collect();
        self.state.stats.count_completion_tokens(self.max_tokens);
        let body = self.meta.completion(&text, "length", self.usage);
        json_response(StatusCode::OK, &body)
    }

    /// Emit SSE events on schedule; stops early if the client goes away.
    async fn stream(self, tx: mpsc::Sender<Bytes>) {
        let event = |v: Value| Bytes::from(format!("data: {v}\n\n"));
        tokio::select! {
            () = sleep_until(self.start + self.ttft) => self.prefilled(),
            () = tx.closed() => return,
        }
        for i in 0..self.max_tokens {
            tokio::select! {
                () = sleep_until(self.due(i)) => {}
                () = tx.closed() => return,
            }
            let chunk = self.meta.chunk(i, Some(filler_token(self.seed, i)), None);
            if tx.send(event(chunk)).await.is_err() {
                return;
            }
            self.state.stats.count_completion_tokens(1);
        }
        let tail = [
            event(self.meta.chunk(self.max_tokens, None, Some("length"))),
            event(self.meta.usage_chunk(self.usage)),
            Bytes::from_static(b"data: [DONE]\n\n"),
        ];
        for e in tail {
            if tx.send(e).await.is_err() {
                return;
            }
        }
    }
}

async fn generation(
    state: &Arc<State>,
    kind: Kind,
    body: &[u8],
) -> Result<Response<SimBody>, ApiError> {
    let req = parse_generation(kind, body, &state.settings)?;
    let slot_work = remember_prompt(state, &req.prompt);
    let settings = &state.settings;
    let blocks = tokens::blocks(&req.prompt, settings.block_tokens);
    let mut admission = state.stats.admit();
    let queued = Instant::now();
    let permit = Arc::clone(&state.slots)
        .acquire_owned()
        .await
        .map_err(|_| ApiError {
            status: StatusCode::SERVICE_UNAVAILABLE,
            message: "shutting down".into(),
            kind: "server_error",
            code: "unavailable",
        })?;
    // KV blocks the request holds while it runs: its prompt and its output.
    let output_blocks = req.max_tokens.div_ceil(settings.block_tokens as u64);
    admission.start(blocks.ids.len() as u64 + output_blocks);
    let queue_wait = queued.elapsed();
    let prompt_tokens = blocks.tokens as u64;
    let cached_blocks = state.cache().cached_prefix_blocks(&blocks.ids);
    let cached_tokens = (cached_blocks * settings.block_tokens) as u64;
    let ttft = settings
        .timing
        .ttft(prompt_tokens - cached_tokens, cached_tokens);
    state.stats.count_prompt(prompt_tokens, cached_tokens);
    debug!(
        pod = %settings.name, prompt_tokens, cached_tokens,
        ttft_us = ttft.as_micros() as u64, queue_us = queue_wait.as_micros() as u64,
        stream = req.stream, "sim generation admitted"
    );
    let job = Job {
        state: Arc::clone(state),
        _admission: admission,
        _permit: permit,
        start: Instant::now(),
        ttft,
        seed: xxh3_64(req.prompt.as_bytes()),
        blocks: blocks.ids,
        max_tokens: req.max_tokens,
        meta: state.meta(req.kind, req.model),
        usage: Usage {
            prompt: prompt_tokens,
            completion: req.max_tokens,
            cached: cached_tokens,
        },
        slot_work,
    };
    let mut resp = if req.stream {
        let (tx, rx) = mpsc::channel(STREAM_BUFFER);
        tokio::spawn(job.stream(tx));
        let mut resp = Response::new(SimBody::Stream(rx));
        let h = resp.headers_mut();
        h.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/event-stream"),
        );
        h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
        resp
    } else {
        job.run_to_end().await
    };
    let h = resp.headers_mut();
    insert_header(h, "x-sim-prompt-tokens", prompt_tokens);
    insert_header(h, "x-sim-cached-tokens", cached_tokens);
    insert_header(h, "x-sim-ttft-us", ttft.as_micros());
    insert_header(h, "x-sim-queue-us", queue_wait.as_micros());
    Ok(resp)
}

async fn serve_connection(
    builder: auto::Builder<TokioExecutor>,
    stream: TcpStream,
    state: Arc<State>,
    mut stop: watch::Receiver<bool>,
) {
    let _ = stream.set_nodelay(true);
    let service = service_fn(move |req| {
        let state = Arc::clone(&state);
        async move { Ok::<_, Infallible>(handle(state, req).await) }
    });
    let conn = builder.serve_connection(TokioIo::new(stream), service);
    tokio::pin!(conn);
    tokio::select! {
        res = conn.as_mut() => {
            if let Err(e) = res {
                debug!(error = %e, "sim connection ended with an error");
            }
            return;
        }
        _ = stop.wait_for(|stopping| *stopping) => {}
    }
    conn.as_mut().graceful_shutdown();
    let _ = conn.await;
}

/// Serve on `listener` until `shutdown` resolves, then drain open connections (bounded by the
/// drain timeout).
pub async fn serve(
    listener: TcpListener,
    args: SimArgs,
    shutdown: impl Future<Output = ()>,
) -> anyhow::Result<()> {
    let local = listener.local_addr()?;
    let settings = Settings::from_args(&args, local)?;
    let drain_timeout = settings.drain_timeout;
    let state = Arc::new(State::new(settings)?);
    info!(
        pod = %state.settings.name, listen = %local, model = %state.settings.served_model,
        cache_blocks = state.settings.cache_blocks, block_tokens = state.settings.block_tokens,
        max_concurrency = state.settings.max_concurrency, "sim serving"
    );
    let builder = auto::Builder::new(TokioExecutor::new());
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut conns = JoinSet::new();
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            () = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, _peer)) => {
                    let conn = serve_connection(
                        builder.clone(), stream, Arc::clone(&state), stop_rx.clone(),
                    );
                    conns.spawn(conn);
                }
                Err(e) => {
                    // Usually fd exhaustion: back off instead of spinning.
                    warn!(error = %e, "sim accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
        }
    }
    drop(listener);
    let _ = stop_tx.send(true);
    let drained = tokio::time::timeout(drain_timeout, async {
        while conns.join_next().await.is_some() {}
    })
    .await;
    if drained.is_err() {
        warn!(
            open = conns.len(),
            "sim drain timed out; closing connections"
        );
        conns.abort_all();
    }
    info!(pod = %state.settings.name, "sim stopped");
    Ok(())
}
