//! In-process tests over real loopback sockets.

use std::net::SocketAddr;

use bytes::Bytes;
use http::{HeaderMap, Method, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::client::conn::{http1, http2};
use hyper_util::rt::{TokioExecutor, TokioIo};
use serde_json::{json, Value};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use super::*;

struct Sim {
    addr: SocketAddr,
    stop: oneshot::Sender<()>,
    task: JoinHandle<anyhow::Result<()>>,
}

impl Sim {
    async fn start(args: SimArgs) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(serve(listener, args, async {
            let _ = stopped.await;
        }));
        Self { addr, stop, task }
    }

    async fn shutdown(self) {
        self.stop.send(()).unwrap();
        self.task.await.unwrap().unwrap();
    }
}

type Client = http1::SendRequest<Full<Bytes>>;

async fn connect(addr: SocketAddr) -> Client {
    let io = TokioIo::new(TcpStream::connect(addr).await.unwrap());
    let (sender, conn) = http1::handshake(io).await.unwrap();
    tokio::spawn(conn);
    sender
}

fn request(method: Method, path: &str, body: &str) -> Request<Full<Bytes>> {
    Request::builder()
        .method(method)
        .uri(path)
        .header("host", "sim")
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body.to_owned())))
        .unwrap()
}

async fn call(
    client: &mut Client,
    method: Method,
    path: &str,
    body: &str,
) -> (StatusCode, HeaderMap, Bytes) {
    client.ready().await.unwrap();
    let resp = client
        .send_request(request(method, path, body))
        .await
        .unwrap();
    let (parts, body) = resp.into_parts();
    let bytes = body.collect().await.unwrap().to_bytes();
    (parts.status, parts.headers, bytes)
}

fn header_u64(headers: &HeaderMap, name: &str) -> u64 {
    headers[name].to_str().unwrap().parse().unwrap()
}

fn fast_args(name: &str) -> SimArgs {
    SimArgs {
        name: Some(name.to_owned()),
        ttft_base_ms: 1,
        inter_token_ms: 1,
        ..SimArgs::default()
    }
}

fn chat_body(system: &str, question: &str) -> String {
    json!({
        "model": "/models",
        "messages": [
            {"role": "system", "content": system},
            {"role": "user", "content": question}
        ],
        "document_context": "FlexInfer routing guide section A",
        "max_tokens": 4
    })
    .to_string()
}

#[tokio::test]
async fn shared_system_prompt_hits_the_cache_and_lowers_ttft() {
    let sim = Sim::start(fast_args("pod-a")).await;
    let mut client = connect(sim.addr).await;
    let system = "You answer using provided document context only. ".repeat(40);

    let first = chat_body(&system, "Summarize the first part.");
    let (status, h1, body1) = call(&mut client, Method::POST, "/v1/chat/completions", &first).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(h1["x-sim-pod"], "pod-a");
    assert_eq!(header_u64(&h1, "x-sim-cached-tokens"), 0);
    let v1: Value = serde_json::from_slice(&body1).unwrap();
    assert_eq!(v1["object"], "chat.completion");
    assert_eq!(v1["model"], "/models");
    assert_eq!(v1["system_fingerprint"], "sim:pod-a");
    assert_eq!(v1["usage"]["completion_tokens"], 4);
    assert_eq!(v1["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
    assert_eq!(
        v1["usage"]["prompt_tokens"].as_u64().unwrap(),
        header_u64(&h1, "x-sim-prompt-tokens")
    );

    // Same connection (keep-alive), same system prompt and document, another question.
    let second = chat_body(&system, "Now the second part, briefly.");
    let (status, h2, body2) =
        call(&mut client, Method::POST, "/v1/chat/completions", &second).await;
    assert_eq!(status, StatusCode::OK);
    let cached = header_u64(&h2, "x-sim-cached-tokens");
    assert!(cached > 300, "cached {cached}");
    assert!(cached < header_u64(&h2, "x-sim-prompt-tokens"));
    let v2: Value = serde_json::from_slice(&body2).unwrap();
    assert_eq!(
        v2["usage"]["prompt_tokens_details"]["cached_tokens"],
        cached
    );
    let (ttft1, ttft2) = (
        header_u64(&h1, "x-sim-ttft-us"),
        header_u64(&h2, "x-sim-ttft-us"),
    );
    assert!(ttft2 < ttft1 / 2, "ttft {ttft1}us then {ttft2}us");

    let (_, _, metrics) = call(&mut client, Method::GET, "/metrics", "").await;
    let metrics = String::from_utf8(metrics.to_vec()).unwrap();
    assert!(metrics.contains(&format!(
        "sim_cached_tokens_total{{pod=\"pod-a\"}} {cached}\n"
    )));
    assert!(metrics.contains("sim_requests_total{pod=\"pod-a\",endpoint=\"chat_completions\"} 2\n"));
    sim.shutdown().await;
}

/// Split an SSE body into its `data:` payloads.
fn events(text: &str) -> Vec<&str> {
    text.split("\n\n")
        .filter(|e| !e.is_empty())
        .map(|e| e.strip_prefix("data: ").unwrap())
        .collect()
}

#[tokio::test]
async fn sse_sends_each_event_as_it_is_produced() {
    let sim = Sim::start(SimArgs {
        inter_token_ms: 40,
        ..fast_args("pod-s")
    })
    .await;
    let mut client = connect(sim.addr).await;
    let body = json!({
        "model": "m",
        "messages": [{"role": "user", "content": "stream please"}],
        "stream": true,
        "stream_options": {"include_usage": true},
        "max_tokens": 5
    })
    .to_string();
    let resp = client
        .send_request(request(Method::POST, "/v1/chat/completions", &body))
        .await
        .unwrap();
    assert_eq!(resp.headers()["content-type"], "text/event-stream");
    assert_eq!(resp.headers()["x-sim-pod"], "pod-s");
    let mut body = resp.into_body();

    let first = body.frame().await.unwrap().unwrap().into_data().unwrap();
    // The stream is still running while we hold its first event: nothing was buffered.
    let mut probe = connect(sim.addr).await;
    let (_, _, metrics) = call(&mut probe, Method::GET, "/metrics", "").await;
    let metrics = String::from_utf8(metrics.to_vec()).unwrap();
    assert!(
        metrics.contains("sim_requests_in_flight{pod=\"pod-s\"} 1\n"),
        "{metrics}"
    );

    let mut frames = vec![first];
    while let Some(frame) = body.frame().await {
        frames.push(frame.unwrap().into_data().unwrap());
    }
    let text: String = frames
        .iter()
        .map(|f| std::str::from_utf8(f).unwrap())
        .collect();
    let events = events(&text);
    assert_eq!(frames.len(), events.len(), "one event per frame");
    assert_eq!(events.len(), 5 + 3);
    assert_eq!(events.last(), Some(&"[DONE]"));
    let chunks: Vec<Value> = events[..events.len() - 1]
        .iter()
        .map(|e| serde_json::from_str(e).unwrap())
        .collect();
    assert!(chunks
        .iter()
        .all(|c| c["system_fingerprint"] == "sim:pod-s"));
    assert_eq!(chunks[0]["object"], "chat.completion.chunk");
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    assert_eq!(chunks[5]["choices"][0]["finish_reason"], "length");
    assert_eq!(chunks[6]["usage"]["completion_tokens"], 5);
    sim.shutdown().await;
}

#[tokio::test]
async fn models_health_metrics_and_errors() {
    let sim = Sim::start(SimArgs {
        served_model: "tiny".into(),
        ..fast_args("pod-e")
    })
    .await;
    let mut c = connect(sim.addr).await;

    let (status, h, body) = call(&mut c, Method::GET, "/v1/models", "").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(h["x-sim-pod"], "pod-e");
    let v: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(v["data"][0]["id"], "tiny");

    let (status, _, body) = call(&mut c, Method::GET, "/health", "").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        serde_json::from_slice::<Value>(&body).unwrap(),
        json!({"status": "ok"})
    );

    let bad = "{\"messages\": [";
    let (status, h, body) = call(&mut c, Method::POST, "/v1/chat/completions", bad).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(
        h["x-sim-request-body-sha"],
        format!("{:016x}", xxhash_rust::xxh3::xxh3_64(bad.as_bytes())).as_str()
    );
    let v: Value = serde_json::from_slice(&body).unwrap();
    assert!(v["error"]["message"]
        .as_str()
        .unwrap()
        .contains("invalid JSON"));
    assert_eq!(v["error"]["type"], "invalid_request_error");
    assert_eq!(v["error"]["code"], "invalid_json");

    let (status, _, body) = call(&mut c, Method::POST, "/v1/chat/completions", "{}").await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(
        serde_json::from_slice::<Value>(&body).unwrap()["error"]["code"],
        "invalid_prompt"
    );

    let (status, h, body) = call(&mut c, Method::GET, "/v2/nothing", "").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(h["x-sim-pod"], "pod-e");
    assert_eq!(
        serde_json::from_slice::<Value>(&body).unwrap()["error"]["code"],
        "not_found"
    );

    let (status, _, _) = call(&mut c, Method::GET, "/v1/chat/completions", "").await;
    assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED);

    let (status, h, body) = call(&mut c, Method::GET, "/metrics", "").await;
    assert_eq!(status, StatusCode::OK);
    assert!(h["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/plain"));
    let text = String::from_utf8(body.to_vec()).unwrap();
    assert!(text.contains("sim_requests_total{pod=\"pod-e\",endpoint=\"not_found\"} 1\n"));
    assert!(text.contains("sim_cache_blocks_capacity{pod=\"pod-e\"} 4096\n"));
    sim.shutdown().await;
}

#[tokio::test]
async fn completions_and_embeddings() {
    let sim = Sim::start(fast_args("pod-c")).await;
    let mut c = connect(sim.addr).await;
    let body = json!({"prompt": "Once upon a time", "max_tokens": 3}).to_string();
    let (status, h, resp) = call(&mut c, Method::POST, "/v1/completions", &body).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(header_u64(&h, "x-sim-prompt-tokens"), 4);
    let v: Value = serde_json::from_slice(&resp).unwrap();
    assert_eq!(v["object"], "text_completion");
    assert_eq!(v["model"], "sim-model");
    assert!(!v["choices"][0]["text"].as_str().unwrap().is_empty());

    let stream = json!({"prompt": "Once", "max_tokens": 2, "stream": true}).to_string();
    let (_, _, resp) = call(&mut c, Method::POST, "/v1/completions", &stream).await;
    let text = String::from_utf8(resp.to_vec()).unwrap();
    let events = events(&text);
    assert_eq!(events.len(), 2 + 3);
    let first: Value = serde_json::from_str(events[0]).unwrap();
    assert_eq!(first["object"], "text_completion");

    let emb = json!({"model": "e", "input": ["a", "b"]}).to_string();
    let (status, _, resp) = call(&mut c, Method::POST, "/v1/embeddings", &emb).await;
    assert_eq!(status, StatusCode::OK);
    let v: Value = serde_json::from_slice(&resp).unwrap();
    assert_eq!(v["data"].as_array().unwrap().len(), 2);
    assert_eq!(
        v["data"][1]["embedding"].as_array().unwrap().len(),
        DEFAULT_EMBEDDING_DIM
    );
    sim.shutdown().await;
}

#[tokio::test]
async fn requests_over_the_limit_queue() {
    let sim = Sim::start(SimArgs {
        max_concurrency: 1,
        ttft_base_ms: 100,
        ..fast_args("pod-q")
    })
    .await;
    let body = json!({"prompt": "x", "max_tokens": 1}).to_string();
    let send = |body: String| async move {
        let mut c = connect(sim.addr).await;
        let (_, h, _) = call(&mut c, Method::POST, "/v1/completions", &body).await;
        header_u64(&h, "x-sim-queue-us")
    };
    let (a, b) = tokio::join!(send(body.clone()), send(body));
    // One ran at once; the other waited for (most of) its 100 ms.
    assert!(a.max(b) >= 50_000, "queue waits {a}us and {b}us");
    sim.shutdown().await;
}

/// A request for `path` with a load-report ask (`format`) when given.
fn asking(path: &str, body: &str, format: Option<&'static str>) -> Request<Full<Bytes>> {
    let mut r = request(Method::POST, path, body);
    if let Some(f) = format {
        r.headers_mut().insert(
            "endpoint-load-metrics-format",
            http::HeaderValue::from_static(f),
        );
    }
    r
}

/// Send and read the whole answer, feeding the body frames to a usage observer.
async fn send_observed(
    client: &mut Client,
    req: Request<Full<Bytes>>,
) -> (HeaderMap, Option<crate::signals::Usage>) {
    client.ready().await.unwrap();
    let resp = client.send_request(req).await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    let mut observer = crate::signals::UsageObserver::for_response(resp.headers()).unwrap();
    let (parts, mut body) = resp.into_parts();
    while let Some(frame) = body.frame().await {
        if let Ok(data) = frame.unwrap().into_data() {
            observer.feed(&data);
        }
    }
    (parts.headers, observer.usage())
}

#[tokio::test]
async fn load_reports_answer_whole_responses_that_ask_as_vllm_does() {
    use crate::signals::{orca, EngineReport};
    let sim = Sim::start(fast_args("pod-o")).await;
    let mut c = connect(sim.addr).await;
    let chat = chat_body("You are brief.", "Hello?");
    let stream = json!({"model": "m", "prompt": "hi", "max_tokens": 2, "stream": true}).to_string();
    for (path, body, format, reported) in [
        ("/v1/chat/completions", chat.as_str(), Some("TEXT"), true),
        ("/v1/chat/completions", chat.as_str(), Some("text"), true),
        ("/v1/chat/completions", chat.as_str(), None, false),
        ("/v1/chat/completions", chat.as_str(), Some("JSON"), false),
        ("/v1/completions", stream.as_str(), Some("TEXT"), false),
    ] {
        let (h, _) = send_observed(&mut c, asking(path, body, format)).await;
        let header = h.get("endpoint-load-metrics");
        assert_eq!(header.is_some(), reported, "{path} {format:?} {body}");
        if let Some(v) = header {
            // Read after the answer: this request no longer runs, nothing waits.
            assert_eq!(
                orca::parse(v.as_bytes()),
                Some(EngineReport {
                    running: None,
                    waiting: Some(0),
                    kv_usage: Some(0.0),
                })
            );
        }
    }
    sim.shutdown().await;
}

#[tokio::test]
async fn usage_with_cached_tokens_is_found_streamed_and_not() {
    let sim = Sim::start(fast_args("pod-u")).await;
    let mut c = connect(sim.addr).await;
    let system = "Answer from the manual only. ".repeat(30);
    for stream in [false, true, true, false] {
        let mut body: Value =
            serde_json::from_str(&chat_body(&system, "What is routing?")).unwrap();
        body["stream"] = json!(stream);
        let (h, usage) = send_observed(
            &mut c,
            asking("/v1/chat/completions", &body.to_string(), None),
        )
        .await;
        let usage = usage.unwrap_or_else(|| panic!("no usage (stream {stream})"));
        assert_eq!(usage.prompt_tokens, header_u64(&h, "x-sim-prompt-tokens"));
        assert_eq!(
            usage.cached_tokens,
            Some(header_u64(&h, "x-sim-cached-tokens"))
        );
        assert_eq!(usage.completion_tokens, 4);
    }
    sim.shutdown().await;
}

#[tokio::test]
async fn the_proxys_scraper_reads_the_sims_vllm_gauges() {
    use crate::signals::scrape::{scrape, ScrapeConfig};
    use crate::upstream::{Upstream, UpstreamOptions};
    use crate::vocab::EngineKind;
    let sim = Sim::start(SimArgs {
        max_concurrency: 1,
        cache_blocks: 100,
        block_tokens: 4,
        ttft_base_ms: 5_000,
        ..fast_args("pod-m")
    })
    .await;
    // One request runs (held in its long prefill), a second one waits for the slot.
    let body = json!({"prompt": "one two three four five six seven", "max_tokens": 8}).to_string();
    let held: Vec<_> = (0..2)
        .map(|_| {
            let body = body.clone();
            let addr = sim.addr;
            tokio::spawn(async move {
                let mut c = connect(addr).await;
                call(&mut c, Method::POST, "/v1/completions", &body).await
            })
        })
        .collect();
    let up = Upstream::new(UpstreamOptions::default(), None);
    let cfg = ScrapeConfig::default();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(4);
    let report = loop {
        let got = scrape(&up, sim.addr, EngineKind::Auto, &cfg).await.unwrap();
        assert_eq!(got.kind, EngineKind::Vllm);
        if got.report.waiting == Some(1) || std::time::Instant::now() > deadline {
            break got.report;
        }
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    };
    assert_eq!((report.running, report.waiting), (Some(1), Some(1)));
    // Its prompt (2 blocks of 4 tokens) and its output (2 blocks) of 100.
    let kv = report.kv_usage.unwrap();
    assert!(kv > 0.0 && kv <= 0.1, "{kv}");
    for h in held {
        h.abort();
    }
    sim.shutdown().await;
}

#[tokio::test]
async fn speaks_h2c() {
    let sim = Sim::start(fast_args("pod-h2")).await;
    let io = TokioIo::new(TcpStream::connect(sim.addr).await.unwrap());
    let (mut sender, conn) = http2::handshake(TokioExecutor::new(), io).await.unwrap();
    tokio::spawn(conn);
    let req = Request::builder()
        .uri(format!("http://{}/health", sim.addr))
        .body(Full::new(Bytes::new()))
        .unwrap();
    let resp = sender.send_request(req).await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(resp.headers()["x-sim-pod"], "pod-h2");
    drop(sender);
    sim.shutdown().await;
}

#[test]
fn settings_validate_and_default_the_name() {
    let local: SocketAddr = "127.0.0.1:9100".parse().unwrap();
    let s = Settings::from_args(&SimArgs::default(), local).unwrap();
    assert_eq!(s.name, "sim-127.0.0.1:9100");
    assert_eq!(s.timing.ttft_base_us, 5_000);
    let zero = SimArgs {
        block_tokens: 0,
        ..SimArgs::default()
    };
    assert_eq!(
        Settings::from_args(&zero, local),
        Err(ConfigError::Zero("block-tokens"))
    );
}

#[test]
fn flags_parse_with_defaults() {
    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        sim: SimArgs,
    }
    let cli = <Cli as clap::Parser>::try_parse_from(["sim", "--name", "x", "--cache-blocks", "7"])
        .unwrap();
    assert_eq!(
        cli.sim,
        SimArgs {
            name: Some("x".into()),
            cache_blocks: 7,
            ..SimArgs::default()
        }
    );
}
