//! Admission end to end: the real proxy in front of upstreams that hold each request until the
//! test lets it go and count what they hold ([`HoldingUpstream`]), so that "no pod ever held
//! more than `maxConcurrency`", "this request started next" and "that one never reached a
//! pod" are read from the pods themselves. Every wait is a poll on a condition (the pods'
//! counts, the queue in `/debug/routing`, a metric); no assertion is on speed.
#![allow(unsafe_code)] // see the SAFETY lines

use std::future::Future;
use std::io::Write;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use flexinfer_test_support::holding::{Hold, HoldingUpstream, ID_HEADER};
use flexinfer_test_support::QueueEntry;
use flexinfer_tests::backends::fixed_status;
use flexinfer_tests::*;
use serde_json::Value;
use tokio::task::JoinHandle;

/// `n` upstreams that hold every request until released.
fn held(n: usize) -> Vec<HoldingUpstream> {
    (0..n)
        .map(|i| HoldingUpstream::start(&format!("pod-{i}"), Hold::UntilReleased).unwrap())
        .collect()
}

/// A model on `pods`, full at `max` requests per pod. The pods are no model servers, so the
/// proxy reads no engine metrics from them.
fn model(name: &str, pods: &[HoldingUpstream], max: u32) -> ModelEntry {
    ModelEntry::new(name)
        .engine("none")
        .max_concurrency(max)
        .endpoints(pods.iter().map(|p| p.addr()))
}

fn queue(max_size: Option<u32>, timeout: &str, sheddable: &str) -> QueueEntry {
    QueueEntry {
        max_size,
        timeout: Some(timeout.into()),
        sheddable_timeout: Some(sheddable.into()),
        ..QueueEntry::default()
    }
}

/// Polls `cond` until it holds; panics with `what` after 20 s (a bound on a hang, not a speed).
async fn until<F, Fut>(what: &str, mut cond: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = Instant::now() + Duration::from_secs(20);
    while !cond().await {
        assert!(Instant::now() < deadline, "not within 20 s: {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The `/debug/routing` admission entry of `model`.
async fn gate(proxy: &Proxy, model: &str) -> Value {
    let view = get(proxy.admin, "/debug/routing").await.unwrap().json();
    view["admission"]
        .as_array()
        .and_then(|gates| gates.iter().find(|g| g["model"] == model).cloned())
        .unwrap_or_else(|| panic!("no gate for {model} in {view}"))
}

async fn queued(proxy: &Proxy, model: &str) -> u64 {
    gate(proxy, model).await["queued"].as_u64().unwrap()
}

/// A chat request for `model` with the test id `id` and `headers`, sent in its own task.
fn ask(proxy: &Proxy, model: &str, id: &str, headers: &[(&str, &str)]) -> JoinHandle<Reply> {
    let addr = proxy.addr;
    let body = chat_body(model, None, &format!("request {id}"), "");
    let mut headers: Vec<(String, String)> = headers
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    headers.push((ID_HEADER.into(), id.into()));
    tokio::spawn(async move {
        let h: Vec<(&str, &str)> = headers.iter().map(|(k, v)| (&**k, &**v)).collect();
        post(addr, "/v1/chat/completions", &h, &body).await.unwrap()
    })
}

/// One request to model `chat` that `pod` (its only pod, at `maxConcurrency: 1`) holds, so the
/// model is full from then on; the handle answers once the test releases it.
async fn fill_the_pod(proxy: &Proxy, pod: &HoldingUpstream) -> JoinHandle<Reply> {
    let fill = ask(proxy, "chat", "fill", &[]);
    until("the pod full", || async { pod.in_flight() == 1 }).await;
    fill
}

/// [`ask`], then wait until the model's queue holds `depth` requests (so that requests sent
/// one after another are queued in that order).
async fn ask_queued(
    proxy: &Proxy,
    model: &str,
    id: &str,
    headers: &[(&str, &str)],
    depth: u64,
) -> JoinHandle<Reply> {
    let t = ask(proxy, model, id, headers);
    until(&format!("{id} queued ({depth} waiting)"), || async {
        queued(proxy, model).await == depth
    })
    .await;
    t
}

async fn answered(t: JoinHandle<Reply>) -> Reply {
    t.await.expect("request task")
}

/// Asserts a 429 with `code`, a `Retry-After` of whole seconds (returned) and the OpenAI
/// error shape.
fn assert_refused(r: &Reply, code: &str) -> u64 {
    assert_eq!(r.status, 429, "{}", r.text());
    let e = &r.json()["error"];
    assert_eq!(e["code"], code, "{}", r.text());
    assert_eq!(e["type"], "rate_limit_error", "{}", r.text());
    assert!(e["message"].as_str().is_some_and(|m| !m.is_empty()), "{e}");
    let after = r.header("retry-after").expect("a Retry-After header");
    after.parse::<u64>().expect("Retry-After in seconds")
}

fn metric(m: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    metric_value(m, name, labels).unwrap_or(0.0)
}

fn rejections(m: &str, model: &str, reason: &str) -> f64 {
    metric(
        m,
        "flexinfer_proxy_admission_rejections_total",
        &[("model", model), ("reason", reason)],
    )
}

/// 20 requests at once on two pods of `maxConcurrency: 2` routed by `routing` (`None`: the
/// default), the proxy started with `flags`: no pod ever holds more than 2, both fill, and
/// every request is answered once room appears.
async fn burst_holds_max_concurrency(routing: Option<&str>, flags: &[&str]) {
    let dir = TempDir::new("adm-burst");
    let pods = held(2);
    let mut entry = model("chat", &pods, 2);
    if let Some(r) = routing {
        entry = entry.routing(r);
    }
    let proxy = start_proxy(&ModelsFile::new().model(entry), flags, &[], dir.path()).await;
    // One cache key for all: the ring prefers one pod, so the other fills only because the
    // decision passes over a full pod.
    let key = [("x-flexinfer-cache-key", "one-key")];
    let tasks: Vec<_> = (0..20)
        .map(|i| ask(&proxy, "chat", &format!("r{i}"), &key))
        .collect();
    until("every request held or queued", || async {
        let held: usize = pods.iter().map(|p| p.in_flight()).sum();
        held as u64 + queued(&proxy, "chat").await == 20
    })
    .await;
    let holding: Vec<usize> = pods.iter().map(|p| p.in_flight()).collect();
    assert_eq!(
        holding,
        [2, 2],
        "each pod holds its maxConcurrency, no more"
    );
    // Nothing held from now on: each answer frees its slot at once, the fastest turnover.
    pods.iter().for_each(HoldingUpstream::release_all);
    for t in tasks {
        assert_eq!(answered(t).await.status, 200);
    }
    for p in &pods {
        assert_eq!(p.max_in_flight(), 2, "at most maxConcurrency, ever");
    }
    assert_eq!(pods.iter().map(|p| p.requests()).sum::<u64>(), 20);
    let m = proxy.metrics().await;
    assert_eq!(
        metric(
            &m,
            "flexinfer_proxy_queue_wait_seconds_count",
            &[("model", "chat")]
        ),
        20.0,
        "every admitted request has its wait observed"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn max_concurrency_holds_on_every_pod_under_a_burst() {
    burst_holds_max_concurrency(Some("prefix"), &[]).await;
}

/// The default routing makes no bounded pick, and one worker thread takes the whole burst in
/// one go: only what the room rule counts between admission and the upstream request keeps
/// the pods at their limit.
#[tokio::test(flavor = "multi_thread")]
async fn max_concurrency_holds_under_a_burst_with_the_default_routing_on_one_thread() {
    burst_holds_max_concurrency(None, &["--worker-threads", "1"]).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_priority_10_request_behind_20_queued_starts_next() {
    let dir = TempDir::new("adm-prio");
    let pods = held(2);
    let models = ModelsFile::new().model(model("chat", &pods, 1));
    let proxy = start_proxy(&models, &[], &[], dir.path()).await;
    let mut tasks = vec![
        ask(&proxy, "chat", "f0", &[]),
        ask(&proxy, "chat", "f1", &[]),
    ];
    until("both pods full", || async {
        pods.iter().all(|p| p.in_flight() == 1)
    })
    .await;
    for i in 0..20 {
        tasks.push(ask(&proxy, "chat", &format!("q{i}"), &[]));
    }
    until("20 queued", || async { queued(&proxy, "chat").await == 20 }).await;
    let vip = ask_queued(&proxy, "chat", "vip", &[("x-flexinfer-priority", "10")], 21).await;
    let m = proxy.metrics().await;
    let depth = |p| {
        metric(
            &m,
            "flexinfer_proxy_queue_depth",
            &[("model", "chat"), ("priority", p)],
        )
    };
    assert_eq!((depth("0"), depth("10+")), (20.0, 1.0), "{m}");
    // One slot frees on pod-0: the next request started anywhere is the priority-10 one.
    pods[0].release(1);
    until("a third request started", || async {
        pods.iter().map(|p| p.requests()).sum::<u64>() == 3
    })
    .await;
    assert_eq!(pods[0].started()[1], "vip", "{:?}", pods[0].started());
    assert_eq!(pods[1].started().len(), 1);
    pods.iter().for_each(HoldingUpstream::release_all);
    assert_eq!(answered(vip).await.status, 200);
    for t in tasks {
        assert_eq!(answered(t).await.status, 200);
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_second_tenant_is_served_before_the_first_ones_backlog() {
    let dir = TempDir::new("adm-fair");
    let pods = held(1);
    let models = ModelsFile::new().model(model("chat", &pods, 1));
    let proxy = start_proxy(&models, &[], &[], dir.path()).await;
    let fill = fill_the_pod(&proxy, &pods[0]).await;
    let mut a = Vec::new();
    for i in 0..10 {
        let id = format!("a{i}");
        let tenant = [("x-flexinfer-tenant", "team-a")];
        a.push(ask_queued(&proxy, "chat", &id, &tenant, i + 1).await);
    }
    // Tenant B by its bearer token (no tenant header): hashed, never shown.
    let bearer = [("authorization", "Bearer secret-token-of-b")];
    let b = ask_queued(&proxy, "chat", "b0", &bearer, 11).await;
    let view = gate(&proxy, "chat").await;
    let band = &view["bands"][0];
    assert_eq!(
        (band["priority"].as_i64(), band["tenants"].as_u64()),
        (Some(0), Some(2)),
        "{view}"
    );
    assert_eq!(band["top_tenants"][0]["tenant"], "team-a", "{view}");
    let b_label = band["top_tenants"][1]["tenant"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(b_label.starts_with("bearer:"), "{view}");
    let debug = get(proxy.admin, "/debug/routing").await.unwrap().text();
    assert!(
        !debug.contains("secret-token-of-b"),
        "the token is never shown"
    );

    pods[0].release_all();
    for t in a.into_iter().chain([fill, b]) {
        assert_eq!(answered(t).await.status, 200);
    }
    // Team A's first request had the turn; B, new to the band, takes the next one; then A's
    // backlog in its own arrival order.
    let mut want = vec!["fill".to_string(), "a0".into(), "b0".into()];
    want.extend((1..10).map(|i| format!("a{i}")));
    assert_eq!(pods[0].started(), want);
    assert!(!proxy.metrics().await.contains("secret-token-of-b"));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_tenant_of_weight_two_takes_two_turns_to_the_others_one() {
    let dir = TempDir::new("adm-weights");
    let pods = held(1);
    let weighted = QueueEntry::default().tenant_weight("team-b", 2);
    let models = ModelsFile::new().model(model("chat", &pods, 1).queue(weighted));
    let proxy = start_proxy(&models, &[], &[], dir.path()).await;
    let file = dir.path().join("check.yaml");
    models.write_to(&file).unwrap();
    let checked = std::process::Command::new(proxy_bin())
        .args(["config", "check"])
        .arg(&file)
        .output()
        .unwrap();
    let report = String::from_utf8_lossy(&checked.stdout);
    assert!(
        report.contains("team-b 2 turns per round (this model); other tenants 1"),
        "{report}"
    );
    let fill = fill_the_pod(&proxy, &pods[0]).await;
    let mut tasks = Vec::new();
    let mut depth = 0;
    for (team, n) in [("team-a", 4), ("team-b", 5), ("team-c", 2)] {
        for i in 0..n {
            depth += 1;
            let id = format!("{}{i}", &team[5..]);
            let tenant = [("x-flexinfer-tenant", team)];
            tasks.push(ask_queued(&proxy, "chat", &id, &tenant, depth).await);
        }
    }
    pods[0].release_all();
    for t in tasks.into_iter().chain([fill]) {
        assert_eq!(answered(t).await.status, 200);
    }
    // Rounds in the tenants' arrival order: a one, b two (each FCFS), c one; then the rest.
    let want = [
        "fill", "a0", "b0", "b1", "c0", "a1", "b2", "b3", "c1", "a2", "b4", "a3",
    ];
    assert_eq!(pods[0].started(), want);
}

#[tokio::test(flavor = "multi_thread")]
async fn queued_requests_time_out_with_429_and_sheddable_ones_sooner() {
    let dir = TempDir::new("adm-ttl");
    let pods = held(1);
    let models = ModelsFile::new().model(model("chat", &pods, 1).queue(queue(None, "2s", "300ms")));
    let proxy = start_proxy(&models, &[], &[], dir.path()).await;
    let fill = fill_the_pod(&proxy, &pods[0]).await;
    let sent = Instant::now();
    let timed = |id: &str, headers: &[(&str, &str)]| {
        let t = ask(&proxy, "chat", id, headers);
        async move {
            let r = answered(t).await;
            (r, Instant::now())
        }
    };
    let normal = tokio::spawn(timed("normal", &[]));
    let shed = tokio::spawn(timed("shed", &[("x-flexinfer-priority", "-1")]));
    let (normal, normal_at) = normal.await.unwrap();
    let (shed, shed_at) = shed.await.unwrap();
    assert!(assert_refused(&normal, "queue_timeout") >= 1);
    assert!(assert_refused(&shed, "queue_timeout") >= 1);
    assert!(
        shed_at < normal_at,
        "the sheddable request leaves at its own, shorter timeout"
    );
    assert!(
        normal_at - sent >= Duration::from_secs(2),
        "waited its whole queue timeout"
    );
    assert_eq!(pods[0].requests(), 1, "neither reached the pod");
    let m = proxy.metrics().await;
    assert_eq!(rejections(&m, "chat", "queue_timeout"), 2.0);
    pods[0].release_all();
    assert_eq!(answered(fill).await.status, 200);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_full_queue_sheds_the_sheddable_first_then_answers_queue_full() {
    let dir = TempDir::new("adm-full");
    let pods = held(1);
    let models =
        ModelsFile::new().model(model("chat", &pods, 1).queue(queue(Some(2), "30s", "30s")));
    let proxy = start_proxy(&models, &[], &[], dir.path()).await;
    let fill = fill_the_pod(&proxy, &pods[0]).await;
    let sheddable = [("x-flexinfer-priority", "-1")];
    let s = ask_queued(&proxy, "chat", "s", &sheddable, 1).await;
    let a = ask_queued(&proxy, "chat", "a", &[], 2).await;
    // Full: a priority-0 request pushes out the sheddable one and takes its place.
    let b = ask(&proxy, "chat", "b", &[]);
    assert_refused(&answered(s).await, "queue_full");
    until("b queued in s's place", || async {
        let g = gate(&proxy, "chat").await;
        g["queued"] == 2 && g["bands"][0]["priority"] == 0 && g["bands"][0]["depth"] == 2
    })
    .await;
    // Full of priority 0: nothing to push out, for a priority-0 or a sheddable newcomer.
    assert_refused(&answered(ask(&proxy, "chat", "c", &[])).await, "queue_full");
    let low = [("x-flexinfer-priority", "-5")];
    assert_refused(
        &answered(ask(&proxy, "chat", "d", &low)).await,
        "queue_full",
    );
    let m = proxy.metrics().await;
    assert_eq!(rejections(&m, "chat", "shed"), 1.0, "{m}");
    assert_eq!(rejections(&m, "chat", "queue_full"), 2.0, "{m}");
    pods[0].release_all();
    for t in [fill, a, b] {
        assert_eq!(answered(t).await.status, 200);
    }
    assert_eq!(pods[0].started(), ["fill", "a", "b"]);
}

/// A chat request written by hand on its own connection (so the test can close it).
fn raw_request(addr: SocketAddr, model: &str, id: &str) -> std::net::TcpStream {
    let body = chat_body(model, None, "leaving", "");
    let req = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: {addr}\r\ncontent-type: application/json\r\n{ID_HEADER}: {id}\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.write_all(req.as_bytes()).unwrap();
    s
}

#[tokio::test(flavor = "multi_thread")]
async fn a_client_that_leaves_while_queued_never_reaches_a_pod() {
    let dir = TempDir::new("adm-gone");
    let pods = held(1);
    let models = ModelsFile::new().model(model("chat", &pods, 1));
    let proxy = start_proxy(&models, &[], &[], dir.path()).await;
    let fill = fill_the_pod(&proxy, &pods[0]).await;
    let conn = raw_request(proxy.addr, "chat", "gone");
    until("the request queued", || async {
        queued(&proxy, "chat").await == 1
    })
    .await;
    drop(conn);
    until("it left the queue", || async {
        queued(&proxy, "chat").await == 0
    })
    .await;
    let m = proxy.metrics().await;
    assert_eq!(
        metric(
            &m,
            "flexinfer_proxy_queue_cancelled_total",
            &[("model", "chat")]
        ),
        1.0
    );
    let next = ask_queued(&proxy, "chat", "next", &[], 1).await;
    pods[0].release_all();
    assert_eq!(answered(fill).await.status, 200);
    assert_eq!(answered(next).await.status, 200);
    assert_eq!(
        pods[0].started(),
        ["fill", "next"],
        "the departed request never ran"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_token_budget_charges_refunds_from_usage_and_refuses_with_429() {
    let dir = TempDir::new("adm-budget");
    let pod = HoldingUpstream::start("pod", Hold::For(Duration::ZERO)).unwrap();
    // 6 tokens a minute: refills add about nothing while the test runs.
    let models = ModelsFile::new().model(
        ModelEntry::new("chat")
            .engine("none")
            .endpoint(pod.addr())
            .token_budget(6, Some(100)),
    );
    let proxy = start_proxy(&models, &[], &[], dir.path()).await;
    let body = chat_body("chat", None, "hi", r#"{"max_tokens":50}"#);
    let estimate = body.len() as u64 / 4 + 50;
    assert!(
        estimate > 50 && estimate <= 95,
        "one estimate fits the burst, two do not, one after a refund does: {estimate}"
    );
    let ask_as = |tenant: &'static str| {
        let body = body.clone();
        let addr = proxy.addr;
        async move {
            let h = [("x-flexinfer-tenant", tenant)];
            post(addr, "/v1/chat/completions", &h, &body).await.unwrap()
        }
    };
    let p = &proxy;
    let charged = move |tenant: &'static str| async move {
        let m = p.metrics().await;
        metric(
            &m,
            "flexinfer_proxy_tokens_charged_total",
            &[("model", "chat"), ("tenant", tenant)],
        )
    };
    pod.set_usage(3, 2);
    assert_eq!(ask_as("t1").await.status, 200);
    // The answer's usage corrects the charge: 5 tokens, the rest of the estimate refunded.
    until("the charge corrected to 5", || async {
        charged("t1").await == 5.0
    })
    .await;
    // Only the refund makes room for a second estimate in a burst of 100.
    pod.set_usage(600, 400);
    assert_eq!(ask_as("t1").await.status, 200);
    until("the charge corrected to 1,005", || async {
        charged("t1").await == 1005.0
    })
    .await;
    // Now in debt: refused at once, told to come back when the refills repaid it.
    let r = ask_as("t1").await;
    let after = assert_refused(&r, "rate_limited");
    assert!(
        after >= 60,
        "Retry-After {after} s for a debt of about 900 tokens at 0.1/s"
    );
    // Another tenant has its own bucket.
    assert_eq!(ask_as("t2").await.status, 200);
    assert_eq!(
        pod.requests(),
        3,
        "the refused request never reached the pod"
    );
    let m = proxy.metrics().await;
    assert_eq!(rejections(&m, "chat", "rate_limited"), 1.0);
}

#[tokio::test(flavor = "multi_thread")]
async fn bad_priority_and_tenant_values_fall_back_and_never_fail() {
    let dir = TempDir::new("adm-badhdr");
    let pods = held(1);
    let models = ModelsFile::new().model(model("chat", &pods, 1));
    let proxy = start_proxy(&models, &[], &[], dir.path()).await;
    let fill = fill_the_pod(&proxy, &pods[0]).await;
    let bad = [
        ("x-flexinfer-priority", "abc"),
        ("x-flexinfer-tenant", "bad tenant!"),
    ];
    let odd = ask_queued(&proxy, "chat", "odd", &bad, 1).await;
    let huge = [("x-flexinfer-priority", "99999999999")];
    let big = ask_queued(&proxy, "chat", "huge", &huge, 2).await;
    let one = ask_queued(&proxy, "chat", "one", &[("x-flexinfer-priority", "1")], 3).await;
    let view = gate(&proxy, "chat").await;
    // Both bad priorities are 0 (not sheddable), and the bad tenant is the shared one.
    assert_eq!(view["bands"][0]["priority"], 1, "{view}");
    assert_eq!(view["bands"][1]["priority"], 0, "{view}");
    assert_eq!(view["bands"][1]["depth"], 2, "{view}");
    assert_eq!(
        view["bands"][1]["top_tenants"][0]["tenant"], "shared",
        "{view}"
    );
    pods[0].release_all();
    for t in [fill, odd, big, one] {
        assert_eq!(answered(t).await.status, 200);
    }
    assert_eq!(pods[0].started(), ["fill", "one", "odd", "huge"]);
    until("the debug lines written", || async {
        let log = proxy.proc.log_text();
        log.contains("ignoring x-flexinfer-priority; using 0")
            && log.contains("ignoring malformed x-flexinfer-tenant")
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn sigterm_with_a_full_queue_answers_every_queued_request_200_or_503() {
    let dir = TempDir::new("adm-drain");
    let pods = held(1);
    let models = ModelsFile::new().model(model("chat", &pods, 1));
    let flags = ["--shutdown-delay", "0", "--drain-timeout", "6s"];
    let mut proxy = start_proxy(&models, &flags, &[], dir.path()).await;
    let fill = fill_the_pod(&proxy, &pods[0]).await;
    let mut queued_tasks = Vec::new();
    for i in 0..5 {
        queued_tasks.push(ask_queued(&proxy, "chat", &format!("q{i}"), &[], i + 1).await);
    }
    assert_eq!(
        unsafe { libc::kill(proxy.proc.pid() as i32, libc::SIGTERM) },
        0
    );
    until("the gate closing", || async {
        gate(&proxy, "chat").await["closing"] == true
    })
    .await;
    // Room for two while the queue still admits (the first half of the drain timeout): the
    // filler ends, q0 runs and ends, q1 starts and is held past the queue's close.
    pods[0].release(2);
    until("q1 started", || async { pods[0].requests() == 3 }).await;
    let mut rest = queued_tasks.split_off(2);
    let mut answers = Vec::new();
    for t in rest.drain(..) {
        answers.push(answered(t).await);
    }
    for r in &answers {
        assert_eq!(r.status, 503, "{}", r.text());
        assert_eq!(r.json()["error"]["code"], "proxy_shutdown");
        assert_eq!(r.header("retry-after"), Some("1"));
    }
    // The admitted one still finishes inside the drain timeout's second half.
    pods[0].release_all();
    for t in std::iter::once(fill).chain(queued_tasks) {
        assert_eq!(answered(t).await.status, 200);
    }
    assert_eq!(pods[0].started(), ["fill", "q0", "q1"]);
    let status = tokio::task::spawn_blocking(move || {
        let s = proxy.proc.terminate(Duration::from_secs(15));
        (s, proxy)
    })
    .await
    .unwrap();
    assert!(
        status.0.is_some_and(|s| s.success()),
        "{:?}\n{}",
        status.0,
        status.1.proc.log_text()
    );
}

/// 40 requests with distinct cache keys, one after another: how many the client saw fail.
async fn server_errors_seen(proxy: &Proxy) -> usize {
    let mut failed = 0;
    for i in 0..40 {
        let key = format!("k{i}");
        let r = post(
            proxy.addr,
            "/v1/chat/completions",
            &[("x-flexinfer-cache-key", &key)],
            &chat_body("chat", None, "hi", ""),
        )
        .await
        .unwrap();
        match r.status.as_u16() {
            200 => {}
            500 => failed += 1,
            s => panic!("status {s}: {}", r.text()),
        }
    }
    failed
}

#[tokio::test(flavor = "multi_thread")]
async fn a_pod_answering_500_is_retried_by_default_and_shown_with_retry_on_status_none() {
    let dir = TempDir::new("adm-500");
    let bad = fixed_status(500).await;
    let good = start_sim("good", &[], dir.path()).await;
    let models = ModelsFile::new().model(
        ModelEntry::new("chat")
            .routing("prefix")
            // No model servers' metrics pages: every request the bad pod counts is one the
            // proxy forwarded.
            .engine("none")
            .endpoint(bad.addr)
            .endpoint(good.addr),
    );
    let proxy = start_proxy(&models, &[], &[], dir.path()).await;
    assert_eq!(server_errors_seen(&proxy).await, 0, "every 500 was retried");
    let retried = metric(
        &proxy.metrics().await,
        "flexinfer_proxy_upstream_retries_total",
        &[("model", "chat"), ("reason", "status-500")],
    );
    assert!(retried >= 1.0, "the bad pod was tried and retried");
    assert_eq!(bad.requests() as f64, retried, "each failure retried once");

    let bad = fixed_status(500).await;
    let models = ModelsFile::new().model(
        ModelEntry::new("chat")
            .routing("prefix")
            .engine("none")
            .endpoint(bad.addr)
            .endpoint(good.addr),
    );
    let flags = ["--retry-on-status", "none"];
    let proxy = start_proxy(&models, &flags, &[], dir.path()).await;
    let seen = server_errors_seen(&proxy).await;
    assert!(seen >= 1, "without retries the 500s reach the client");
    assert_eq!(
        seen as u64,
        bad.requests(),
        "every 500 the pod gave, the client saw"
    );
}
