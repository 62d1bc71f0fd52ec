//! The scraper against real local HTTP servers: tokio listeners that answer a page, hang,
//! send too much or refuse.

use std::sync::atomic::AtomicU64;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use super::*;
use crate::signals::EngineReport;

const VLLM_PAGE: &str = "# TYPE vllm:num_requests_running gauge\n\
vllm:num_requests_running{model_name=\"m\"} 3.0\n\
vllm:num_requests_waiting{model_name=\"m\"} 2.0\n\
vllm:kv_cache_usage_perc{model_name=\"m\"} 0.5\n";

/// How a test server answers each request.
#[derive(Clone)]
enum Answer {
    /// A 200 with this body and a content length.
    Page(&'static str),
    /// A 200 with a body of this many bytes and no length (closed at the end).
    Endless(usize),
    /// This status, empty body.
    Status(u16),
    /// Read the request, never answer.
    Hang,
    /// llama.cpp: this metrics page at `/metrics`, this `/slots` page (JSON) or a 404; counts
    /// the `/slots` reads.
    Llama(&'static str, Option<String>, Arc<AtomicU64>),
}

const LLAMA_PAGE: &str = "# TYPE llamacpp:requests_processing gauge\n\
llamacpp:requests_processing 1\n\
llamacpp:requests_deferred 0\n";

/// Serve `answer` on a loopback port; counts the requests read.
async fn server(answer: Answer) -> (SocketAddr, Arc<AtomicU64>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let hits = Arc::new(AtomicU64::new(0));
    let counted = Arc::clone(&hits);
    tokio::spawn(async move {
        loop {
            let Ok((mut s, _)) = listener.accept().await else {
                return;
            };
            let (answer, hits) = (answer.clone(), Arc::clone(&counted));
            tokio::spawn(async move {
                let mut buf = vec![0u8; 4096];
                let mut got = Vec::new();
                // Keep-alive: answer each request head on the connection.
                loop {
                    let Ok(n) = s.read(&mut buf).await else {
                        return;
                    };
                    if n == 0 {
                        return;
                    }
                    got.extend_from_slice(&buf[..n]);
                    while let Some(end) = got.windows(4).position(|w| w == b"\r\n\r\n") {
                        let head: Vec<u8> = got.drain(..end + 4).collect();
                        let path = String::from_utf8_lossy(&head)
                            .split(' ')
                            .nth(1)
                            .unwrap_or("")
                            .to_owned();
                        hits.fetch_add(1, Ordering::Relaxed);
                        if !respond(&mut s, &answer, &path).await {
                            return;
                        }
                    }
                }
            });
        }
    });
    (addr, hits)
}

/// Write one answer; `false` when the connection is done.
async fn respond(s: &mut tokio::net::TcpStream, answer: &Answer, path: &str) -> bool {
    match answer {
        Answer::Llama(metrics, slots, slot_reads) => {
            let body = match path {
                "/slots" => {
                    slot_reads.fetch_add(1, Ordering::Relaxed);
                    slots.clone()
                }
                _ => Some(metrics.to_string()),
            };
            let head = match &body {
                Some(b) => format!("HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n", b.len()),
                None => "HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n".to_owned(),
            };
            s.write_all(head.as_bytes()).await.is_ok()
                && s.write_all(body.unwrap_or_default().as_bytes())
                    .await
                    .is_ok()
        }
        Answer::Page(body) => {
            let head = format!(
                "HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: {}\r\n\r\n",
                body.len()
            );
            s.write_all(head.as_bytes()).await.is_ok() && s.write_all(body.as_bytes()).await.is_ok()
        }
        Answer::Endless(n) => {
            let _ = s
                .write_all(b"HTTP/1.1 200 OK\r\nconnection: close\r\n\r\n")
                .await;
            let chunk = vec![b'#'; 64 << 10];
            let mut left = *n;
            while left > 0 {
                let k = left.min(chunk.len());
                if s.write_all(&chunk[..k]).await.is_err() {
                    break;
                }
                left -= k;
            }
            false
        }
        Answer::Status(code) => {
            let head = format!("HTTP/1.1 {code} Nope\r\ncontent-length: 0\r\n\r\n");
            s.write_all(head.as_bytes()).await.is_ok()
        }
        Answer::Hang => {
            std::future::pending::<()>().await;
            false
        }
    }
}

fn cfg() -> ScrapeConfig {
    ScrapeConfig {
        timeout: Duration::from_millis(300),
        connect_timeout: Duration::from_millis(300),
        ..ScrapeConfig::default()
    }
}

fn upstream() -> Upstream {
    Upstream::new(UpstreamOptions::default(), None)
}

#[test]
fn interval_grows_with_the_fleet() {
    let min = Duration::from_millis(250);
    let s = Duration::from_secs;
    for (fleet, budget, want) in [
        (0, 1.0, Some(s(1))),
        (1, 1.0, Some(s(1))),
        (10, 1.0, Some(s(10))),
        (100, 1.0, Some(s(100))),
        (100, 0.5, Some(s(200))),
        (3, 100.0, Some(min)),
        (1, 0.0, None),
        (1, -1.0, None),
        (1, f64::NAN, None),
        (usize::MAX, 1e-300, None),
    ] {
        assert_eq!(interval(fleet, budget, min), want, "{fleet} {budget}");
    }
}

/// docs/engine-signals.md's table: whatever the fleet, it reads a pod between 1/1.2 and 1
/// times a second at the default budget (0.91 at the mean stretch).
#[test]
fn the_whole_fleet_reads_a_pod_within_the_budget_at_any_size() {
    let cfg = ScrapeConfig::default();
    let now = Instant::now();
    for fleet in [1usize, 10, 100, 1000] {
        let every = interval(fleet, cfg.budget, cfg.min_interval).unwrap();
        let rate = |jitter: f64| {
            let gap = next_due(now, every, 0, jitter) - now;
            fleet as f64 / gap.as_secs_f64()
        };
        assert!((rate(0.0) - 1.0).abs() < 1e-9, "{fleet}: {}", rate(0.0));
        assert!(
            (rate(1.0) - 1.0 / 1.2).abs() < 1e-9,
            "{fleet}: {}",
            rate(1.0)
        );
        assert!(
            (rate(0.5) - 1.0 / 1.1).abs() < 1e-9,
            "{fleet}: {}",
            rate(0.5)
        );
    }
}

#[test]
fn reads_are_spread_backed_off_and_reports_last_until_the_next() {
    let now = Instant::now();
    let every = Duration::from_secs(10);
    assert_eq!(next_due(now, every, 0, 0.0), now + every);
    assert_eq!(next_due(now, every, 0, 1.0), now + Duration::from_secs(12));
    assert_eq!(next_due(now, every, 0, 7.0), now + Duration::from_secs(12));
    assert_eq!(next_due(now, every, 1, 0.0), now + Duration::from_secs(20));
    assert_eq!(next_due(now, every, 9, 0.0), now + Duration::from_secs(160));
    let (stale, max) = (Duration::from_secs(2), Duration::from_secs(5));
    assert_eq!(report_validity(Duration::from_secs(1), stale, max), stale);
    assert_eq!(
        report_validity(Duration::from_secs(3), stale, max),
        Duration::from_millis(3750)
    );
    assert_eq!(report_validity(Duration::from_secs(100), stale, max), max);
}

#[tokio::test]
async fn reads_a_page() {
    let (addr, hits) = server(Answer::Page(VLLM_PAGE)).await;
    let up = upstream();
    let got = scrape(&up, addr, EngineKind::Auto, &cfg()).await.unwrap();
    assert_eq!(got.kind, EngineKind::Vllm);
    assert_eq!(
        got.report,
        EngineReport {
            running: Some(3),
            waiting: Some(2),
            kv_usage: Some(0.5),
        }
    );
    // The connection is kept for the next read.
    scrape(&up, addr, EngineKind::Vllm, &cfg()).await.unwrap();
    assert_eq!(hits.load(Ordering::Relaxed), 2);
    assert_eq!(up.idle_connections(), 1);
}

#[tokio::test]
async fn failures_are_classified() {
    let (not_found, _) = server(Answer::Status(404)).await;
    let (hang, _) = server(Answer::Hang).await;
    let (huge, _) = server(Answer::Endless(2 << 20)).await;
    let (junk, _) = server(Answer::Page("hello\n")).await;
    // A port nothing listens on: bind one, then close it.
    let closed = TcpListener::bind("127.0.0.1:0")
        .await
        .unwrap()
        .local_addr()
        .unwrap();
    let up = upstream();
    for (addr, kind, want) in [
        (not_found, EngineKind::Auto, ScrapeResult::Status),
        (hang, EngineKind::Auto, ScrapeResult::Timeout),
        (huge, EngineKind::Auto, ScrapeResult::TooLarge),
        (junk, EngineKind::Auto, ScrapeResult::Invalid),
        (closed, EngineKind::Auto, ScrapeResult::Connect),
    ] {
        let e = scrape(&up, addr, kind, &cfg()).await.unwrap_err();
        assert_eq!(e.result(), want, "{addr}: {e}");
    }
}

#[tokio::test]
async fn a_declared_length_past_the_cap_is_refused_before_reading() {
    let (addr, _) = server(Answer::Page(VLLM_PAGE)).await;
    let small = ScrapeConfig {
        max_page: 16,
        ..cfg()
    };
    let e = fetch(&upstream(), addr, &small).await.unwrap_err();
    assert!(matches!(e, ScrapeError::TooLarge(16)), "{e}");
}

/// Poll `cond` every few milliseconds until it holds or `limit` passes.
async fn wait_for(limit: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let end = Instant::now() + limit;
    while Instant::now() < end {
        if cond() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    cond()
}

fn fast() -> ScrapeConfig {
    ScrapeConfig {
        budget: 100.0,
        min_interval: Duration::from_millis(10),
        tick: Duration::from_millis(5),
        ..cfg()
    }
}

fn target(slot: Slot, addr: SocketAddr, families: &EngineFamilies) -> ScrapeTarget {
    ScrapeTarget {
        slot,
        addr,
        kind: EngineKind::Auto,
        model: Arc::from("m"),
        metrics: ScrapeMetrics::resolve(families, "m", &addr.to_string()),
    }
}

#[tokio::test]
async fn the_task_reports_pods_and_skips_those_with_recent_complete_in_band_reports() {
    let (scraped, scraped_hits) = server(Answer::Page(VLLM_PAGE)).await;
    let (inband, inband_hits) = server(Answer::Page(VLLM_PAGE)).await;
    let (down, _) = server(Answer::Status(503)).await;
    let local = Arc::new(crate::load::userspace::UserspaceGauge::default());
    let store = Arc::new(SignalStore::new(Duration::from_secs(60), local));
    let families = EngineFamilies::new();
    // Pod 2 answers in-band with both counts, more often than the interval (50 ms): it needs
    // no scrape.
    let complete = EngineReport {
        running: Some(1),
        waiting: Some(0),
        kv_usage: None,
    };
    store.report(2, &complete, Source::InBand, Instant::now());
    let every_50ms = ScrapeConfig {
        budget: 20.0,
        ..fast()
    };
    let scraper = Scraper::new(
        every_50ms,
        Arc::clone(&store),
        Arc::new(AtomicUsize::new(1)),
        None,
    );
    scraper.targets().set(vec![
        target(1, scraped, &families),
        target(2, inband, &families),
        target(3, down, &families),
    ]);
    let task = tokio::spawn(scraper.run());
    let ok = || {
        families
            .scrapes_total
            .with_label_values(&["m", &scraped.to_string(), "ok"])
            .get()
    };
    let read = wait_for(Duration::from_secs(10), || {
        store.report(2, &complete, Source::InBand, Instant::now());
        ok() >= 3
            && families
                .scrapes_total
                .with_label_values(&["m", &down.to_string(), "status"])
                .get()
                >= 2
    })
    .await;
    task.abort();
    assert!(read, "the pods were not read");
    assert_eq!(store.load(1, 0, Instant::now()), 5, "running 3 + waiting 2");
    let v = store.snapshot(1, Instant::now()).unwrap();
    assert!(v.scrape.unwrap().fresh && v.inband.is_none());
    assert_eq!(inband_hits.load(Ordering::Relaxed), 0);
    assert!(store.snapshot(3, Instant::now()).unwrap().scrape.is_none());
    assert_eq!(
        store.load(3, 1, Instant::now()),
        1,
        "node-local load stands"
    );
    assert!(scraped_hits.load(Ordering::Relaxed) >= 3);
}

#[tokio::test]
async fn llama_pods_slot_prompts_are_read_and_a_pod_that_hides_them_is_left_alone() {
    let doc =
        "the ledger of the harbor keeps every copper coin that the winter market spent ".repeat(20);
    let shown = serde_json::json!([
        {"id": 0, "id_task": 4, "is_processing": false, "prompt": format!("<|im_start|>system\n{doc}<|im_end|>")},
        {"id": 1, "is_processing": false}
    ])
    .to_string();
    let hidden = serde_json::json!([{"id": 0, "id_task": 4, "n_prompt_tokens": 300}]).to_string();
    let (shown_reads, hidden_reads, vllm_reads) = (
        Arc::new(AtomicU64::new(0)),
        Arc::new(AtomicU64::new(0)),
        Arc::new(AtomicU64::new(0)),
    );
    let (a, _) = server(Answer::Llama(
        LLAMA_PAGE,
        Some(shown),
        Arc::clone(&shown_reads),
    ))
    .await;
    let (b, _) = server(Answer::Llama(
        LLAMA_PAGE,
        Some(hidden),
        Arc::clone(&hidden_reads),
    ))
    .await;
    let (c, _) = server(Answer::Llama(LLAMA_PAGE, None, Arc::new(AtomicU64::new(0)))).await;
    let (v, _) = server(Answer::Llama(
        VLLM_PAGE,
        Some("[]".into()),
        Arc::clone(&vllm_reads),
    ))
    .await;
    let local = Arc::new(crate::load::userspace::UserspaceGauge::default());
    let store = Arc::new(SignalStore::new(Duration::from_secs(60), local));
    let families = EngineFamilies::new();
    let scraper = Scraper::new(
        ScrapeConfig {
            slot_prompts_budget: 100.0,
            ..fast()
        },
        Arc::clone(&store),
        Arc::new(AtomicUsize::new(1)),
        None,
    );
    scraper.targets().set(vec![
        target(1, a, &families),
        target(2, b, &families),
        target(3, c, &families),
        target(4, v, &families),
    ]);
    let task = tokio::spawn(scraper.run());
    let reads = |addr: SocketAddr, result: &str| {
        families
            .slot_prompt_reads_total
            .with_label_values(&["m", &addr.to_string(), result])
            .get()
    };
    let read = wait_for(Duration::from_secs(10), || {
        reads(a, "ok") >= 5 && reads(b, "hidden") >= 1 && reads(c, "hidden") >= 1
    })
    .await;
    task.abort();
    assert!(read, "the pods' slots were not read");
    let now = Instant::now();
    let view = store
        .prompts()
        .get(1, now)
        .expect("pod 1 shows its prompts");
    let summary = view.summary(now);
    assert_eq!(summary.slots, 1);
    assert!(summary.prompt_chars > 1000, "{summary:?}");
    // Hidden prompts and no page: no view, and asked once (not again for PROMPTS_RETRY).
    assert!(store.prompts().any(2).is_none() && store.prompts().any(3).is_none());
    assert_eq!(hidden_reads.load(Ordering::Relaxed), 1);
    // A vLLM pod has no slots page to read.
    assert_eq!(vllm_reads.load(Ordering::Relaxed), 0);
    assert!(shown_reads.load(Ordering::Relaxed) >= 5);
    assert_eq!((reads(b, "hidden"), reads(c, "hidden")), (1, 1));
    assert!(store.prompts().any(4).is_none());
}
