//! Pass-through behaviour: model resolution, streaming, bodies and headers, errors.

use std::time::{Duration, Instant};

use bytes::Bytes;
use http::Request;
use http_body_util::{BodyExt, Full};

use flexinfer_tests::*;

async fn one_model(dir: &TempDir, sim_flags: &[&str]) -> (Sim, Proxy) {
    let sim = start_sim("solo", sim_flags, dir.path()).await;
    let cfg = ModelsFile::new().model(ModelEntry::new("solo").routing("prefix").endpoint(sim.addr));
    let proxy = start_proxy(&cfg, &["--max-body-bytes", "4096"], &[], dir.path()).await;
    (sim, proxy)
}

#[tokio::test(flavor = "multi_thread")]
async fn the_first_sse_chunk_arrives_while_the_backend_is_still_generating() {
    let dir = TempDir::new("sse");
    let (sim, proxy) = one_model(&dir, &["--inter-token-ms", "150"]).await;
    let body = r#"{"model":"solo","stream":true,"max_tokens":8,"messages":[{"role":"user","content":"stream please"}]}"#;
    let req = Request::post(format!("http://{}/v1/chat/completions", proxy.addr))
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body)))
        .unwrap();
    let t0 = Instant::now();
    let resp = client().request(req).await.unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["content-type"], "text/event-stream");
    let mut body = resp.into_body();
    let first = loop {
        let frame = body.frame().await.expect("a frame").unwrap();
        if let Ok(data) = frame.into_data() {
            break data;
        }
    };
    let first_at = t0.elapsed();
    assert!(first.starts_with(b"data: "), "{first:?}");
    // The backend is mid-generation right now: it still counts the request in flight.
    let m = get(sim.addr, "/metrics").await.unwrap().text();
    assert_eq!(
        metric_value(&m, "sim_requests_in_flight", &[]),
        Some(1.0),
        "the proxy buffered the stream"
    );
    let mut rest = Vec::new();
    while let Some(frame) = body.frame().await {
        if let Ok(d) = frame.unwrap().into_data() {
            rest.extend_from_slice(&d);
        }
    }
    let all_at = t0.elapsed();
    assert!(String::from_utf8_lossy(&rest)
        .trim_end()
        .ends_with("data: [DONE]"));
    assert!(
        all_at >= first_at + Duration::from_millis(600),
        "first {first_at:?}, last {all_at:?}"
    );
    let pm = proxy.metrics().await;
    assert_eq!(
        metric_value(
            &pm,
            "flexinfer_proxy_time_to_first_byte_seconds_count",
            &[("model", "solo")]
        ),
        Some(1.0)
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn model_resolution_order_and_path_prefix_stripping() {
    let dir = TempDir::new("resolve");
    let a = start_sim("a", &[], dir.path()).await;
    let b = start_sim("b", &[], dir.path()).await;
    let cfg = ModelsFile::new()
        .model(ModelEntry::new("alpha").endpoint(a.addr))
        .model(
            ModelEntry::new("beta")
                .served_model_name("beta-backend:7b")
                .endpoint(b.addr),
        );
    let proxy = start_proxy(&cfg, &[], &[], dir.path()).await;
    let body = chat_body("alpha", None, "hi", "");
    // Header beats path beats body.
    let r = post(
        proxy.addr,
        "/model/alpha/v1/chat/completions",
        &[("x-model-id", "beta")],
        &body,
    )
    .await
    .unwrap();
    assert_eq!(r.pod(), "b");
    let r = post(proxy.addr, "/model/beta/v1/chat/completions", &[], &body)
        .await
        .unwrap();
    assert_eq!(r.pod(), "b");
    // The prefix was stripped: the sim served /v1/chat/completions (it 404s anything else).
    assert_eq!(r.status, 200, "{}", r.text());
    let r = post(proxy.addr, "/v1/chat/completions", &[], &body)
        .await
        .unwrap();
    assert_eq!(r.pod(), "a");
    // servedModelName rewrote the body's model for the backend, and only that.
    let r = post(
        proxy.addr,
        "/v1/chat/completions",
        &[],
        &chat_body("beta", None, "hi", ""),
    )
    .await
    .unwrap();
    assert_eq!(r.json()["model"], "beta-backend:7b");
    // Alpha has no servedModelName: the backend saw the exact bytes the client sent.
    let r = post(proxy.addr, "/v1/chat/completions", &[], &body)
        .await
        .unwrap();
    let sha = format!("{:016x}", xxhash(&body));
    assert_eq!(r.header("x-sim-request-body-sha"), Some(sha.as_str()));
    // Two models and no name: GET /v1/models lists them; a POST is a clear 400.
    let r = get(proxy.addr, "/v1/models").await.unwrap();
    let ids: Vec<String> = r.json()["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(ids, ["alpha", "beta"]);
    let r = post(
        proxy.addr,
        "/v1/chat/completions",
        &[],
        r#"{"messages":[]}"#,
    )
    .await
    .unwrap();
    assert_eq!(r.status, 400);
    assert_eq!(r.json()["error"]["code"], "model_required");
    // A body that could have named it but is not a JSON object says so.
    for bad in [
        r#"{"model":"alpha","messages":[]} trailing"#,
        r#"[{"model":"alpha"}]"#,
        "{\"model\":\"alpha\", messages",
    ] {
        let r = post(proxy.addr, "/v1/chat/completions", &[], bad)
            .await
            .unwrap();
        assert_eq!(r.status, 400, "{bad}");
        assert_eq!(r.json()["error"]["code"], "invalid_body", "{bad}");
    }
    // One model by id, as OpenAI's retrieve-model answers; HEAD answers as GET does.
    let r = get(proxy.addr, "/v1/models/beta").await.unwrap();
    assert_eq!(
        (r.status.as_u16(), r.json()["id"].as_str()),
        (200, Some("beta"))
    );
    assert_eq!(r.json()["object"], "model");
    let r = get(proxy.addr, "/v1/models/gamma").await.unwrap();
    assert_eq!(r.status, 404);
    assert_eq!(r.json()["error"]["code"], "model_not_found");
    let head = Request::head(format!("http://{}/v1/models", proxy.addr))
        .body(Full::new(Bytes::new()))
        .unwrap();
    assert_eq!(send(head).await.unwrap().status, 200);
    // Unknown model: 404, OpenAI-shaped.
    let r = post(
        proxy.addr,
        "/v1/chat/completions",
        &[],
        &chat_body("gamma", None, "hi", ""),
    )
    .await
    .unwrap();
    assert_eq!(r.status, 404);
    assert_eq!(r.json()["error"]["type"], "invalid_request_error");
    assert_eq!(r.json()["error"]["code"], "model_not_found");
    // Other /v1 routes pass through with the model from the header.
    let r = get_with(proxy.addr, "/v1/models", &[("x-model-id", "beta")]).await;
    assert_eq!((r.status.as_u16(), r.pod()), (200, "b".into()));
}

#[tokio::test(flavor = "multi_thread")]
async fn the_only_model_serves_requests_that_name_none_and_limits_hold() {
    let dir = TempDir::new("solo");
    let (_sim, proxy) = one_model(&dir, &[]).await;
    let r = post(
        proxy.addr,
        "/v1/completions",
        &[],
        r#"{"prompt":"Once upon a time","max_tokens":2}"#,
    )
    .await
    .unwrap();
    assert_eq!((r.status.as_u16(), r.pod()), (200, "solo".into()));
    // Embeddings pass through too.
    let r = post(proxy.addr, "/v1/embeddings", &[], r#"{"input":"hello"}"#)
        .await
        .unwrap();
    assert_eq!(r.status, 200);
    // Bodies over --max-body-bytes (4096 here): 413, OpenAI-shaped, with and without a length.
    let big = chat_body("solo", None, &"x".repeat(5000), "");
    let r = post(proxy.addr, "/v1/chat/completions", &[], &big)
        .await
        .unwrap();
    assert_eq!(r.status, 413);
    assert_eq!(r.json()["error"]["code"], "request_too_large");
    // A body that is not JSON still reaches the backend (routing falls through, never fails).
    let r = post(proxy.addr, "/v1/chat/completions", &[], "not json")
        .await
        .unwrap();
    assert_eq!(
        (r.status.as_u16(), r.pod()),
        (400, "solo".into()),
        "the sim's own 400, passed through"
    );
    let m = proxy.metrics().await;
    assert_eq!(
        metric_value(
            &m,
            "flexinfer_proxy_requests_total",
            &[("model", "unknown"), ("status", "413")]
        ),
        Some(1.0)
    );
}

/// A one-shot HTTP/1.1 backend that records the request head it receives and answers with
/// its own hop-by-hop headers, so the test sees both directions of a hop.
async fn recording_backend() -> (std::net::SocketAddr, tokio::task::JoinHandle<String>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let task = tokio::spawn(async move {
        let (mut s, _) = l.accept().await.unwrap();
        let mut buf = Vec::new();
        let mut chunk = [0u8; 4096];
        while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
            let n = s.read(&mut chunk).await.unwrap();
            assert!(n > 0, "connection closed before the head");
            buf.extend_from_slice(&chunk[..n]);
        }
        let body = b"{\"ok\":true}";
        let head = format!(
            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: keep-alive, x-backend-hop\r\nx-backend-hop: secret\r\nkeep-alive: timeout=5\r\nx-backend-header: kept\r\n\r\n",
            body.len()
        );
        s.write_all(head.as_bytes()).await.unwrap();
        s.write_all(body).await.unwrap();
        String::from_utf8_lossy(&buf).to_lowercase()
    });
    (addr, task)
}

/// An HTTP/2 client gets the pod's end-to-end fields as an HTTP/1 client does (they travel
/// beside the response's header map and enter it only for hyper's HTTP/2 server), and none of
/// its hop-by-hop ones.
#[tokio::test(flavor = "multi_thread")]
async fn a_pods_fields_reach_an_http2_client_without_its_hop_by_hop_ones() {
    use hyper_util::rt::{TokioExecutor, TokioIo};
    let dir = TempDir::new("headers-h2");
    let (backend, seen) = recording_backend().await;
    let cfg = ModelsFile::new().model(ModelEntry::new("solo").routing("prefix").endpoint(backend));
    let proxy = start_proxy(&cfg, &[], &[], dir.path()).await;
    let io = TokioIo::new(tokio::net::TcpStream::connect(proxy.addr).await.unwrap());
    let (mut h2, conn) = hyper::client::conn::http2::handshake(TokioExecutor::new(), io)
        .await
        .unwrap();
    tokio::spawn(conn);
    let req = Request::post(format!(
        "http://{}/model/solo/v1/chat/completions",
        proxy.addr
    ))
    .header("content-type", "application/json")
    .body(Full::new(Bytes::from(chat_body("solo", None, "hi", ""))))
    .unwrap();
    let r = h2.send_request(req).await.unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.version(), http::Version::HTTP_2);
    let h = r.headers();
    assert_eq!(h.get("x-backend-header").unwrap(), "kept");
    assert_eq!(h.get("content-type").unwrap(), "application/json");
    assert!(h.get("x-backend-hop").is_none() && h.get("keep-alive").is_none());
    assert!(
        h.get("connection").is_none(),
        "no connection field in HTTP/2"
    );
    let body = r.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(body, "{\"ok\":true}");
    seen.await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn hop_by_hop_headers_stay_on_their_hop_and_others_pass() {
    let dir = TempDir::new("headers");
    let (backend, seen) = recording_backend().await;
    let cfg = ModelsFile::new().model(ModelEntry::new("solo").routing("prefix").endpoint(backend));
    let proxy = start_proxy(&cfg, &[], &[], dir.path()).await;
    let body = chat_body("solo", None, "hi", "");
    let req = Request::post(format!(
        "http://{}/model/solo/v1/chat/completions?x=1",
        proxy.addr
    ))
    .header("host", "proxy.example:8080")
    .header("content-type", "application/json")
    .header("authorization", "Bearer secret")
    .header("x-session-id", "s-1")
    .header("connection", "x-hop")
    .header("x-hop", "must not reach the backend")
    .header("te", "trailers")
    .header("x-forwarded-for", "10.9.8.7")
    .body(Full::new(Bytes::from(body.clone())))
    .unwrap();
    let r = send(req).await.unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    // Response: the backend's own hop-by-hop headers stayed on its hop; the rest passed.
    assert_eq!(r.header("x-backend-header"), Some("kept"));
    assert_eq!(r.header("x-backend-hop"), None);
    assert_eq!(r.header("keep-alive"), None);
    // Request: what the backend saw.
    let head = seen.await.unwrap();
    let lines: Vec<&str> = head.lines().collect();
    assert_eq!(
        lines[0], "post /v1/chat/completions?x=1 http/1.1",
        "the /model/<name> prefix is stripped, the query kept"
    );
    let has = |h: &str| lines.contains(&h);
    let named = |name: &str| lines.iter().any(|l| l.starts_with(&format!("{name}:")));
    assert!(
        has("authorization: bearer secret")
            && has("x-session-id: s-1")
            && has("content-type: application/json")
    );
    assert!(
        !named("x-hop") && !named("te"),
        "hop-by-hop headers leaked:\n{head}"
    );
    assert!(
        has(&format!("host: {backend}")),
        "host is the upstream's:\n{head}"
    );
    assert!(has("x-forwarded-host: proxy.example:8080"));
    assert!(has("x-forwarded-for: 10.9.8.7, 127.0.0.1"));
    assert!(has("x-forwarded-proto: http"));
    assert!(has("via: 1.1 flexinfer-proxy"));
    assert!(has(&format!("content-length: {}", body.len())));
    let count = |name: &str| {
        let prefix = format!("{name}:");
        lines.iter().filter(|l| l.starts_with(&prefix)).count()
    };
    assert_eq!(
        (count("host"), count("x-forwarded-for"), count("via")),
        (1, 1, 1),
        "{head}"
    );
}

/// A client that sent no forwarding header: the proxy's own are added (written after the
/// client's lines), each once, beside the upstream's `Host`.
#[tokio::test(flavor = "multi_thread")]
async fn forwarding_headers_are_added_when_the_client_sent_none() {
    let dir = TempDir::new("forwarding");
    let (backend, seen) = recording_backend().await;
    let cfg = ModelsFile::new().model(ModelEntry::new("solo").routing("prefix").endpoint(backend));
    let proxy = start_proxy(&cfg, &[], &[], dir.path()).await;
    let body = chat_body("solo", None, "hi", "");
    let req = Request::post(format!("http://{}/v1/chat/completions", proxy.addr))
        .header("host", "proxy.example:8080")
        .header("content-type", "application/json")
        .header("via", "1.0 edge")
        .body(Full::new(Bytes::from(body.clone())))
        .unwrap();
    let r = send(req).await.unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    let head = seen.await.unwrap();
    let lines: Vec<&str> = head.lines().collect();
    let count = |name: &str| {
        let prefix = format!("{name}:");
        lines.iter().filter(|l| l.starts_with(&prefix)).count()
    };
    for line in [
        format!("host: {backend}"),
        "x-forwarded-host: proxy.example:8080".to_string(),
        "x-forwarded-for: 127.0.0.1".to_string(),
        "x-forwarded-proto: http".to_string(),
        "via: 1.0 edge".to_string(),
        "via: 1.1 flexinfer-proxy".to_string(),
        "content-type: application/json".to_string(),
        format!("content-length: {}", body.len()),
    ] {
        assert!(lines.contains(&line.as_str()), "{line} missing:\n{head}");
    }
    for (name, n) in [
        ("host", 1),
        ("x-forwarded-for", 1),
        ("x-forwarded-host", 1),
        ("x-forwarded-proto", 1),
        ("via", 2),
        ("content-length", 1),
    ] {
        assert_eq!(count(name), n, "{name}:\n{head}");
    }
}

/// An OpenAI SDK's head: the fields the proxy does not read are relayed as their lines, the
/// ones it reads still act (the session key routes), and each reaches the pod once.
#[tokio::test(flavor = "multi_thread")]
async fn an_sdks_fields_reach_the_pod_once_each() {
    let dir = TempDir::new("sdk-fields");
    let (backend, seen) = recording_backend().await;
    let cfg = ModelsFile::new().model(
        ModelEntry::new("solo")
            .routing("session-affinity")
            .endpoint(backend),
    );
    let proxy = start_proxy(&cfg, &["--route-header"], &[], dir.path()).await;
    let body = chat_body("solo", None, "hi", "");
    let sent = [
        ("accept", "application/json"),
        ("user-agent", "OpenAI/Python 1.54.4"),
        ("x-stainless-lang", "python"),
        ("x-stainless-os", "Linux"),
        ("authorization", "Bearer sk-none"),
        ("x-stainless-retry-count", "0"),
        ("x-session-id", "s-7"),
        ("x-custom", "a"),
        ("x-custom", "b"),
        ("content-type", "application/json"),
    ];
    let mut req = Request::post(format!("http://{}/v1/chat/completions", proxy.addr));
    for (k, v) in sent {
        req = req.header(k, v);
    }
    let r = send(req.body(Full::new(Bytes::from(body.clone()))).unwrap())
        .await
        .unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    let route = r.header("x-flexinfer-route").unwrap_or_default();
    assert!(route.contains("key-source=session-header"), "{route}");
    let head = seen.await.unwrap();
    let lines: Vec<&str> = head.lines().collect();
    for (k, v) in sent {
        let line = format!("{k}: {}", v.to_ascii_lowercase());
        let n = lines.iter().filter(|l| **l == line).count();
        assert_eq!(n, 1, "{line}:\n{head}");
    }
    let customs: Vec<&&str> = lines
        .iter()
        .filter(|l| l.starts_with("x-custom:"))
        .collect();
    assert_eq!(customs, [&"x-custom: a", &"x-custom: b"], "in their order");
    assert!(lines.contains(&format!("content-length: {}", body.len()).as_str()));
}

/// The sim reports the xxh3-64 of the raw body it received.
fn xxhash(s: &str) -> u64 {
    xxh3(s.as_bytes())
}

async fn get_with(addr: std::net::SocketAddr, path: &str, headers: &[(&str, &str)]) -> Reply {
    let mut b = Request::get(format!("http://{addr}{path}"));
    for (k, v) in headers {
        b = b.header(*k, *v);
    }
    send(b.body(Full::new(Bytes::new())).unwrap())
        .await
        .unwrap()
}

use xxhash_rust::xxh3::xxh3_64 as xxh3;

#[tokio::test(flavor = "multi_thread")]
async fn sigterm_drains_requests_in_flight_then_exits() {
    let dir = TempDir::new("drain");
    let (sim, mut proxy) = one_model(&dir, &["--inter-token-ms", "100"]).await;
    let addr = proxy.addr;
    // About a second of generation.
    let body = chat_body("solo", None, "long answer", r#"{"max_tokens":10}"#);
    let in_flight =
        tokio::spawn(async move { post(addr, "/v1/chat/completions", &[], &body).await });
    sim.wait_in_flight(1).await;
    let status = tokio::task::spawn_blocking(move || {
        let s = proxy.proc.terminate(Duration::from_secs(10));
        (s, proxy)
    })
    .await
    .unwrap();
    let reply = in_flight
        .await
        .unwrap()
        .expect("the request in flight completes");
    assert_eq!(reply.status, 200);
    assert_eq!(reply.json()["usage"]["completion_tokens"], 10);
    let (exit, proxy) = status;
    assert!(
        exit.is_some_and(|s| s.success()),
        "exit {exit:?}\n{}",
        proxy.proc.log_text()
    );
    // Once draining, the listener is closed: new connections are refused.
    assert!(post(addr, "/v1/models", &[], "").await.is_err());
}
