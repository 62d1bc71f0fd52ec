//! The spec's Chat-with-Doc benchmark against a real Prometheus server: the proxy routes a
//! `prefix` model over four sims, Prometheus scrapes its admin port every second, and the spec's
//! own PromQL queries (read from the spec text) are evaluated at the end of each phase over a
//! window covering just that phase, then checked against the "Expected Signals" table.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::{Duration, Instant};

use flexinfer_tests::prom::*;
use flexinfer_tests::*;

const MODEL: &str = "chat-doc";
const SYSTEM: &str = "You answer using provided document context only.";
const DOCS: [(&str, &str); 3] = [
    ("tenant-a/doc-1", "FlexInfer routing guide section A"),
    ("tenant-a/doc-2", "FlexInfer routing guide section B"),
    ("tenant-a/doc-3", "FlexInfer routing guide section C"),
];
/// Requests per phase, one every `SPACING`: ten seconds of traffic, ten scrapes.
const REQUESTS: usize = 40;
const SPACING: Duration = Duration::from_millis(250);
/// Scrapes after a phase's last request before its window closes: the first one sees the last
/// requests, the second puts that sample inside the window whatever the scrape's offset.
const SETTLE_SCRAPES: usize = 2;

fn body(doc: &str) -> String {
    chat_body(
        MODEL,
        Some(SYSTEM),
        &format!("Summarize: {doc}"),
        &serde_json::json!({ "document_context": doc }).to_string(),
    )
}

struct Phase {
    name: &'static str,
    start: f64,
    end: f64,
    /// Responses per `x-sim-pod`.
    served: HashMap<String, usize>,
    failed: usize,
}

impl Phase {
    fn window(&self) -> Duration {
        Duration::from_secs_f64((self.end - self.start).ceil())
    }
}

async fn run_phase(
    proxy: &Proxy,
    prom: &Prometheus,
    name: &'static str,
    header: impl Fn(usize) -> Option<String>,
) -> Phase {
    let start = unix_now();
    let mut tick = tokio::time::interval(SPACING);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut served: HashMap<String, usize> = HashMap::new();
    let mut failed = 0;
    for i in 0..REQUESTS {
        tick.tick().await;
        let (_, doc) = DOCS[i % DOCS.len()];
        let key = header(i);
        let headers: Vec<(&str, &str)> = key
            .as_deref()
            .map(|k| vec![("x-flexinfer-cache-key", k)])
            .unwrap_or_default();
        match post(proxy.addr, "/v1/chat/completions", &headers, &body(doc)).await {
            Ok(r) if r.status == 200 => *served.entry(r.pod()).or_default() += 1,
            Ok(r) => {
                eprintln!("{name}: request {i} answered {}: {}", r.status, r.text());
                failed += 1;
            }
            Err(e) => {
                eprintln!("{name}: request {i} failed: {e}");
                failed += 1;
            }
        }
    }
    prom.wait_scrapes_since(unix_now(), SETTLE_SCRAPES).await;
    Phase {
        name,
        start,
        end: unix_now(),
        served,
        failed,
    }
}

/// The spec's signals for one phase, as Prometheus answers them.
#[derive(Debug)]
struct Signals {
    key_source_mix: BTreeMap<String, f64>,
    fallback_ratio: f64,
    target_hits: BTreeMap<String, f64>,
    cardinality: BTreeMap<String, f64>,
    overflow: BTreeMap<String, f64>,
    p95: f64,
    failed_requests: f64,
}

impl Signals {
    fn share(&self, source: &str) -> f64 {
        let total: f64 = self.key_source_mix.values().sum();
        self.key_source_mix.get(source).copied().unwrap_or(0.0) / total
    }
}

async fn signals(prom: &Prometheus, queries: &[SpecQuery], phase: &Phase) -> Signals {
    let w = phase.window();
    let at = phase.end;
    let q = |title: &str| spec_query(queries, title).for_model(MODEL, w);
    let s = Signals {
        key_source_mix: prom.query_by(&q("Key source mix"), at, "key_source").await,
        fallback_ratio: prom.query_one(&q("Service fallback ratio"), at).await,
        target_hits: prom
            .query_by(&q("Route-hit distribution by target"), at, "target")
            .await,
        cardinality: prom
            .query_by(&q("Approximate key cardinality by source"), at, "key_source")
            .await,
        overflow: prom
            .query_by(&q("Cardinality tracker cap hits"), at, "key_source")
            .await,
        p95: prom.query_one(&q("p95 request latency"), at).await,
        failed_requests: prom
            .query(
                &format!(
                    "sum(increase(flexinfer_proxy_requests_total{{model=\"{MODEL}\",status!~\"2..\"}}[{}s]))",
                    w.as_secs()
                ),
                at,
            )
            .await
            .expect("failed-request query")
            .first()
            .map_or(0.0, |s| s.value),
    };
    eprintln!(
        "{} ({:.1}s, window {}s): {s:#?}",
        phase.name,
        phase.end - phase.start,
        w.as_secs()
    );
    s
}

#[tokio::test(flavor = "multi_thread")]
async fn chat_with_doc_phases_show_the_expected_signals_in_prometheus() {
    let Some(bin) = prometheus_bin_or_skip() else {
        return;
    };
    let began = Instant::now();
    let spec = spec_text();
    let queries = spec_queries(&spec);
    assert_eq!(
        queries.len(),
        6,
        "the spec lists six PromQL signals: {queries:#?}"
    );

    let dir = TempDir::new("prometheus");
    let mut pods = Vec::new();
    for i in 0..4 {
        pods.push(start_sim(&format!("pod-{i}"), &[], dir.path()).await);
    }
    let by_addr: HashMap<String, String> = pods
        .iter()
        .map(|p| (p.addr.to_string(), p.name.clone()))
        .collect();
    // The first sim doubles as the model's Service, as in a cluster.
    let yaml = ModelsFile::new().model(
        ModelEntry::new(MODEL)
            .routing("prefix")
            .service_at(pods[0].addr)
            .endpoints(pods.iter().map(|p| p.addr)),
    );
    let proxy = start_proxy(&yaml, &[], &[], dir.path()).await;
    let before = unix_now();
    let prom = Prometheus::start(&bin, proxy.admin, dir.path()).await;
    // Scrapes of the idle proxy first, so every pre-touched series starts at zero.
    prom.wait_scrapes_since(before, 2).await;

    let p1 = run_phase(&proxy, &prom, "explicit-stable", |i| {
        Some(DOCS[i % DOCS.len()].0.to_string())
    })
    .await;
    let s1 = signals(&prom, &queries, &p1).await;
    let p2 = run_phase(&proxy, &prom, "canonical-context", |_| None).await;
    let s2 = signals(&prom, &queries, &p2).await;
    let p3 = run_phase(&proxy, &prom, "malformed-key", |i| {
        Some(format!("bad key with spaces {i}"))
    })
    .await;
    let s3 = signals(&prom, &queries, &p3).await;
    eprintln!(
        "prometheus test: {:.1}s in all",
        began.elapsed().as_secs_f64()
    );

    for (p, s) in [(&p1, &s1), (&p2, &s2), (&p3, &s3)] {
        assert_eq!(p.failed, 0, "{}: requests failed", p.name);
        assert_eq!(s.failed_requests, 0.0, "{}: non-2xx in Prometheus", p.name);
        // Pods serve everything: no service fallback, and the ratio is a number (not empty).
        assert!(
            s.fallback_ratio.abs() < 0.05,
            "{}: fallback ratio {s:?}",
            p.name
        );
        assert!(
            s.target_hits.get("service-dns").copied().unwrap_or(0.0) == 0.0,
            "{}: service hits {s:?}",
            p.name
        );
        // Route hits: the targets Prometheus saw busy are the sims that answered.
        let busy: BTreeSet<String> = s
            .target_hits
            .iter()
            .filter(|(_, &v)| v > 0.0)
            .map(|(t, _)| by_addr.get(t).cloned().unwrap_or_else(|| t.clone()))
            .collect();
        let answered: BTreeSet<String> = p.served.keys().cloned().collect();
        assert_eq!(busy, answered, "{}: {s:?}", p.name);
        // Three documents, three keys, at most three pods.
        assert!(answered.len() <= 3, "{}: {:?}", p.name, p.served);
        // The cardinality tracker never overflows in this traffic.
        assert!(!s.overflow.is_empty(), "{}: no overflow series", p.name);
        assert!(
            s.overflow.values().all(|&v| v == 0.0),
            "{}: overflow {s:?}",
            p.name
        );
        // No uncontrolled growth: every source tracks the three documents at most.
        assert!(
            s.cardinality.values().all(|&v| v <= 3.0),
            "{}: cardinality {s:?}",
            p.name
        );
        assert!(
            s.p95.is_finite() && s.p95 > 0.0 && s.p95 < 5.0,
            "{}: p95 {}",
            p.name,
            s.p95
        );
    }

    // explicit-stable: explicit-header dominates; the tracker holds the fixed key set.
    assert!(s1.share("explicit-header") > 0.9, "{s1:?}");
    assert_eq!(s1.cardinality.get("explicit-header"), Some(&3.0), "{s1:?}");
    // canonical-context: canonical dominates; three distinct doc/system contexts.
    assert!(s2.share("canonical") > 0.9, "{s2:?}");
    assert_eq!(s2.cardinality.get("canonical"), Some(&3.0), "{s2:?}");
    // malformed-key: the explicit source drops to nothing, canonical takes over, no growth.
    assert_eq!(
        s3.key_source_mix.get("explicit-header").copied(),
        Some(0.0),
        "{s3:?}"
    );
    assert!(s3.share("canonical") > 0.9, "{s3:?}");
    assert_eq!(s3.cardinality.get("explicit-header"), Some(&3.0), "{s3:?}");

    // And the proxy saw exactly what was sent.
    let m = proxy.metrics().await;
    assert_eq!(
        metric_value(
            &m,
            "flexinfer_proxy_routing_decisions_total",
            &[("model", MODEL), ("key_source", "explicit-header")]
        ),
        Some(REQUESTS as f64)
    );
}
