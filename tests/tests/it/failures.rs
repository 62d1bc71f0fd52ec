//! Failing pods over real sockets: a pod that never answers, one that answers 503 to
//! everything, one that drops SYNs, one killed mid-stream, and the proxy's own SIGTERM.
#![allow(unsafe_code)] // see the SAFETY lines

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::Request;
use http_body_util::{BodyExt, Full};

use flexinfer_tests::backends::{blackhole, fixed_status, hanging, stalling_stream};
use flexinfer_tests::*;

fn metric(m: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    metric_value(m, name, labels).unwrap_or(0.0)
}

async fn ask(proxy: &Proxy, model: &str, key: &str) -> Reply {
    post(
        proxy.addr,
        "/v1/chat/completions",
        &[("x-flexinfer-cache-key", key)],
        &chat_body(model, None, "hi", ""),
    )
    .await
    .unwrap()
}

/// The `/debug/routing` entry of one pod.
async fn pod_view(proxy: &Proxy, model: &str, addr: std::net::SocketAddr) -> serde_json::Value {
    let view = get(proxy.admin, "/debug/routing").await.unwrap().json();
    view["models"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["name"] == model)
        .and_then(|m| {
            m["pods"]
                .as_array()
                .unwrap()
                .iter()
                .find(|p| p["address"] == addr.to_string())
                .cloned()
        })
        .unwrap_or_else(|| panic!("{addr} of {model} in {view}"))
}

#[tokio::test(flavor = "multi_thread")]
async fn a_hanging_pod_gets_504_at_the_first_byte_timeout() {
    let dir = TempDir::new("hang");
    let pod = hanging().await;
    let models =
        // Not a model server: the engine scraper must not add requests to the one counted here.
        ModelsFile::new().model(
            ModelEntry::new("hang")
                .routing("prefix")
                .engine("none")
                .endpoint(pod.addr),
        );
    let proxy = start_proxy(&models, &["--first-byte-timeout", "1s"], &[], dir.path()).await;
    let t0 = Instant::now();
    let r = ask(&proxy, "hang", "k").await;
    let took = t0.elapsed();
    assert_eq!(r.status, 504, "{}", r.text());
    assert_eq!(r.json()["error"]["code"], "upstream_timeout");
    assert!(
        took >= Duration::from_secs(1) && took < Duration::from_secs(3),
        "answered after {took:?} with a 1 s first-byte timeout"
    );
    assert_eq!(pod.requests(), 1, "the request reached the pod once");
    // The timeout ejected the pod at once, and it says why.
    let view = pod_view(&proxy, "hang", pod.addr).await;
    assert_eq!(view["ejected"]["reason"], "first-byte timeout", "{view}");
    assert_eq!(view["active"], 0, "no load left on the pod: {view}");
    let m = proxy.metrics().await;
    assert_eq!(
        metric(
            &m,
            "flexinfer_proxy_outlier_ejections_total",
            &[("model", "hang")]
        ),
        1.0
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn one_pod_of_two_answering_503_is_retried_then_ejected() {
    let dir = TempDir::new("503");
    let bad = fixed_status(503).await;
    let good = start_sim("good", &[], dir.path()).await;
    let models = ModelsFile::new().model(
        ModelEntry::new("chat")
            .routing("prefix")
            // The bad pod counts every request it reads: no engine scrapes among them.
            .engine("none")
            .endpoint(bad.addr)
            .endpoint(good.addr),
    );
    let proxy = start_proxy(&models, &["--eject-base-time", "2s"], &[], dir.path()).await;
    let mut failed = 0;
    for i in 0..40 {
        let r = ask(&proxy, "chat", &format!("k{i}")).await;
        if r.status.is_server_error() {
            failed += 1;
        } else {
            assert_eq!((r.status.as_u16(), r.pod()), (200, "good".into()));
        }
    }
    assert!(failed <= 4, "{failed} of 40 requests saw a 5xx");
    let m = proxy.metrics().await;
    let retries = metric(
        &m,
        "flexinfer_proxy_upstream_retries_total",
        &[("model", "chat"), ("reason", "status-503")],
    );
    let ejections = metric(
        &m,
        "flexinfer_proxy_outlier_ejections_total",
        &[("model", "chat")],
    );
    assert!(retries >= 1.0, "retries {retries}\n{m}");
    assert_eq!(ejections, 1.0, "ejected once, after its failures in a row");
    // Only the failures before the ejection reached the bad pod.
    assert_eq!(bad.requests() as f64, retries + failed as f64);
    let view = pod_view(&proxy, "chat", bad.addr).await;
    assert_eq!(view["ejected"]["reason"], "5xx answers", "{view}");

    // After the cool-down real traffic probes it: one more failure ejects it again, for
    // twice as long.
    let deadline = Instant::now() + Duration::from_secs(10);
    while !pod_view(&proxy, "chat", bad.addr).await["ejected"].is_null() {
        assert!(
            Instant::now() < deadline,
            "still ejected 10 s into a 2 s cool-down"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let before = bad.requests();
    let mut i = 100;
    while bad.requests() == before {
        let r = ask(&proxy, "chat", &format!("k{i}")).await;
        assert_eq!(
            r.status,
            200,
            "the probe's failure is retried: {}",
            r.text()
        );
        i += 1;
        assert!(i < 200, "no request probed the pod after its cool-down");
    }
    let view = pod_view(&proxy, "chat", bad.addr).await;
    assert_eq!(view["ejected"]["ejections_in_a_row"], 2, "{view}");
    let left = view["ejected"]["for_seconds"].as_f64().unwrap();
    assert!(left > 2.0 && left <= 4.0, "a doubled cool-down: {view}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_pod_that_drops_syns_costs_the_connect_timeout_once() {
    let dir = TempDir::new("blackhole");
    let hole = blackhole();
    let good = start_sim("good", &[], dir.path()).await;
    let models = ModelsFile::new().model(
        ModelEntry::new("chat")
            .routing("prefix")
            .endpoint(hole.addr)
            .endpoint(good.addr),
    );
    let proxy = start_proxy(&models, &["--connect-timeout", "500ms"], &[], dir.path()).await;
    let mut slow = Vec::new();
    for i in 0..20 {
        let t0 = Instant::now();
        let r = ask(&proxy, "chat", &format!("k{i}")).await;
        assert_eq!(
            (r.status.as_u16(), r.pod()),
            (200, "good".into()),
            "{}",
            r.text()
        );
        if t0.elapsed() >= Duration::from_millis(450) {
            slow.push((i, t0.elapsed()));
        }
    }
    assert_eq!(
        slow.len(),
        1,
        "requests that waited out the connect timeout: {slow:?}"
    );
    let m = proxy.metrics().await;
    assert_eq!(
        metric(
            &m,
            "flexinfer_proxy_upstream_connect_errors_total",
            &[("model", "chat")]
        ),
        1.0
    );
    let view = pod_view(&proxy, "chat", hole.addr).await;
    assert_eq!(view["ejected"]["reason"], "connect timeout", "{view}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_pod_killed_mid_stream_ends_the_stream_with_an_error_event() {
    let dir = TempDir::new("midstream");
    let mut sim = start_sim("a", &["--inter-token-ms", "100"], dir.path()).await;
    let addr = sim.addr;
    let models = ModelsFile::new().model(ModelEntry::new("chat").routing("prefix").endpoint(addr));
    let proxy = start_proxy(&models, &[], &[], dir.path()).await;
    let stream = open_stream(proxy.addr, "chat", 50).await;
    assert_eq!(pod_view(&proxy, "chat", addr).await["active"], 1);
    sim.proc.kill().unwrap();
    let text = stream.finish().await;
    let event = last_event(&text);
    assert_eq!(event["error"]["code"], "upstream_stream_broken", "{event}");
    assert!(
        !text.contains("[DONE]"),
        "a broken stream does not claim to be done"
    );
    assert_eq!(pod_view(&proxy, "chat", addr).await["active"], 0);
}

/// The SSE text of a streamed chat request of `max_tokens`, read to its end (which must be
/// clean: a cut stream panics).
async fn stream_text(addr: SocketAddr, model: &'static str, max_tokens: u32) -> String {
    let extra = format!(r#"{{"stream":true,"max_tokens":{max_tokens}}}"#);
    let body = chat_body(model, None, "s", &extra);
    let req = Request::post(format!("http://{addr}/v1/chat/completions"))
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body)))
        .unwrap();
    let resp = client().request(req).await.unwrap();
    assert_eq!(resp.status(), 200);
    let text = resp
        .into_body()
        .collect()
        .await
        .expect("a clean end")
        .to_bytes();
    String::from_utf8_lossy(&text).into_owned()
}

/// Waits for `proxy`, already told to stop or told here with SIGTERM, to exit with status 0.
async fn exits_cleanly(mut proxy: Proxy) {
    let (status, proxy) = tokio::task::spawn_blocking(move || {
        let status = proxy.proc.terminate(Duration::from_secs(10));
        (status, proxy)
    })
    .await
    .unwrap();
    assert!(
        status.is_some_and(|s| s.success()),
        "{status:?}\n{}",
        proxy.proc.log_text()
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn sigterm_turns_readyz_503_then_the_stream_completes_and_the_proxy_exits() {
    let dir = TempDir::new("sigterm");
    let sim = start_sim("a", &["--inter-token-ms", "100"], dir.path()).await;
    let models =
        ModelsFile::new().model(ModelEntry::new("chat").routing("prefix").endpoint(sim.addr));
    let proxy = start_proxy(&models, &["--shutdown-delay", "1s"], &[], dir.path()).await;
    let (addr, admin) = (proxy.addr, proxy.admin);
    assert_eq!(get(admin, "/readyz").await.unwrap().status, 200);
    // About two seconds of streamed generation, in flight at SIGTERM.
    let stream = tokio::spawn(stream_text(addr, "chat", 20));
    sim.wait_in_flight(1).await;
    let pid = proxy.proc.pid() as i32;
    assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
    // Not ready at once, while still serving: endpoints drop the pod before it stops.
    let t0 = Instant::now();
    let readyz = loop {
        let r = get(admin, "/readyz").await.unwrap();
        if r.status != 200 || t0.elapsed() > Duration::from_millis(500) {
            break r;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(readyz.status, 503, "{}", readyz.text());
    let r = post(
        addr,
        "/v1/chat/completions",
        &[],
        &chat_body("chat", None, "late", ""),
    )
    .await
    .expect("served during the shutdown delay");
    assert_eq!(r.status, 200);
    let text = stream.await.unwrap();
    assert!(text.trim_end().ends_with("data: [DONE]"), "{text}");
    exits_cleanly(proxy).await;
    assert!(
        post(addr, "/v1/models", &[], "").await.is_err(),
        "stopped accepting"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_stream_still_running_at_the_drain_timeout_ends_with_an_error_event() {
    let dir = TempDir::new("drain-cut");
    let sim = start_sim("a", &["--inter-token-ms", "100"], dir.path()).await;
    let models =
        ModelsFile::new().model(ModelEntry::new("chat").routing("prefix").endpoint(sim.addr));
    let flags = ["--shutdown-delay", "0", "--drain-timeout", "1s"];
    let proxy = start_proxy(&models, &flags, &[], dir.path()).await;
    // Ten seconds of generation: far past the drain timeout.
    let stream = tokio::spawn(stream_text(proxy.addr, "chat", 100));
    sim.wait_in_flight(1).await;
    assert_eq!(
        unsafe { libc::kill(proxy.proc.pid() as i32, libc::SIGTERM) },
        0
    );
    let text = tokio::time::timeout(Duration::from_secs(5), stream)
        .await
        .expect("the stream ends soon after the drain timeout")
        .expect("the stream ends cleanly, with its error event");
    assert!(
        text.contains("chat.completion.chunk"),
        "tokens came before the cut: {text}"
    );
    assert_eq!(
        last_event(&text)["error"]["code"],
        "proxy_shutdown",
        "{text}"
    );
    exits_cleanly(proxy).await;
}

fn last_event(text: &str) -> serde_json::Value {
    let last = text
        .split("\n\n")
        .filter(|e| !e.trim().is_empty())
        .last()
        .unwrap_or_else(|| panic!("no events in {text:?}"));
    serde_json::from_str(last.strip_prefix("data: ").unwrap()).unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_stalled_stream_and_an_overlong_request_end_with_their_error_events() {
    let dir = TempDir::new("stall");
    let stall = stalling_stream().await;
    let slow = start_sim("slow", &["--inter-token-ms", "200"], dir.path()).await;
    let models = ModelsFile::new()
        .model(
            ModelEntry::new("stall")
                .routing("prefix")
                .endpoint(stall.addr),
        )
        .model(
            ModelEntry::new("slow")
                .routing("prefix")
                .endpoint(slow.addr),
        );
    let proxy = start_proxy(&models, &["--stream-idle-timeout", "1s"], &[], dir.path()).await;
    let t0 = Instant::now();
    let text = stream_text(proxy.addr, "stall", 100).await;
    let took = t0.elapsed();
    assert!(
        text.starts_with("data: {\"choices\""),
        "the pod's event passed first: {text}"
    );
    assert_eq!(last_event(&text)["error"]["code"], "upstream_idle_timeout");
    assert!(
        took >= Duration::from_secs(1) && took < Duration::from_secs(3),
        "{took:?}"
    );

    // A total deadline: cut mid-stream with its own event; before the answer starts, a 504.
    let proxy = start_proxy(&models, &["--request-timeout", "1s"], &[], dir.path()).await;
    let text = stream_text(proxy.addr, "slow", 100).await;
    assert_eq!(
        last_event(&text)["error"]["code"],
        "request_timeout",
        "{text}"
    );
    assert!(
        text.matches("data: ").count() >= 3,
        "tokens streamed before the cut: {text}"
    );
    let hang = hanging().await;
    let models = ModelsFile::new().model(
        ModelEntry::new("hang")
            .routing("prefix")
            .endpoint(hang.addr),
    );
    let proxy = start_proxy(&models, &["--request-timeout", "1s"], &[], dir.path()).await;
    let r = ask(&proxy, "hang", "k").await;
    assert_eq!(r.status, 504);
    assert_eq!(r.json()["error"]["code"], "request_timeout");
}
