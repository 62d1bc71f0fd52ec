//! The spec's Chat-with-Doc scenario: three phases against one model, with per-phase latency,
//! cache-hit share and the pods that served; and a hot-prompt phase beyond the spec (one long
//! system prompt shared by many users, several requests in flight), where affinity alone
//! makes one replica the hot spot.
//!
//! The documents are long (about a thousand tokens each) and there are more of them than one
//! replica's prefix cache holds, as in a multi-tenant RAG fleet: routing that keeps a document
//! on one replica turns its repeats into cache hits; spreading them evicts.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::Request;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde_json::json;
use tokio::sync::Semaphore;

/// The three phases of the spec's test profile, and the hot-prompt phase.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    ExplicitStable,
    CanonicalContext,
    MalformedKey,
    /// Beyond the spec: one shared system prompt, a different user per request.
    HotPrompt,
}

impl Phase {
    /// The spec's three phases.
    pub const ALL: [Phase; 3] = [
        Phase::ExplicitStable,
        Phase::CanonicalContext,
        Phase::MalformedKey,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Phase::ExplicitStable => "explicit-stable",
            Phase::CanonicalContext => "canonical-context",
            Phase::MalformedKey => "malformed-key",
            Phase::HotPrompt => "hot-prompt",
        }
    }
}

/// One tenant document: its explicit key and text.
pub struct Doc {
    pub key: String,
    pub text: String,
}

/// `n` deterministic documents of about `words` words each, distinct from the first word on.
pub fn documents(n: usize, words: usize) -> Vec<Doc> {
    const VOCAB: [&str; 16] = [
        "routing", "replica", "cache", "prefix", "tenant", "token", "latency", "gateway", "model",
        "context", "session", "endpoint", "service", "stream", "request", "cluster",
    ];
    (0..n)
        .map(|d| {
            let mut text = format!("Document {} of the FlexInfer manual.", d + 1);
            let mut x = (d as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
            for _ in 0..words {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                text.push(' ');
                text.push_str(VOCAB[(x % 16) as usize]);
            }
            Doc {
                key: format!("tenant-a/doc-{}", d + 1),
                text,
            }
        })
        .collect()
}

/// What one request looked like from the client.
#[derive(Debug, Clone)]
pub struct Sample {
    pub ok: bool,
    pub latency: Duration,
    pub pod: String,
    pub prompt_tokens: u64,
    pub cached_tokens: u64,
}

/// A phase's results.
#[derive(Debug, Clone)]
pub struct PhaseReport {
    pub phase: Phase,
    pub samples: Vec<Sample>,
}

impl PhaseReport {
    pub fn ok(&self) -> usize {
        self.samples.iter().filter(|s| s.ok).count()
    }

    /// The q-quantile latency (nearest rank), as the spec's load generator computes it.
    pub fn quantile(&self, q: f64) -> Duration {
        let mut l: Vec<Duration> = self.samples.iter().map(|s| s.latency).collect();
        l.sort();
        l.get(((l.len() as f64) * q) as usize)
            .or(l.last())
            .copied()
            .unwrap_or_default()
    }

    /// Cached prompt tokens over all prompt tokens.
    pub fn cache_hit_share(&self) -> f64 {
        let prompt: u64 = self.samples.iter().map(|s| s.prompt_tokens).sum();
        let cached: u64 = self.samples.iter().map(|s| s.cached_tokens).sum();
        if prompt == 0 {
            0.0
        } else {
            cached as f64 / prompt as f64
        }
    }

    pub fn pods(&self) -> BTreeMap<String, usize> {
        let mut m = BTreeMap::new();
        for s in &self.samples {
            *m.entry(s.pod.clone()).or_default() += 1;
        }
        m
    }
}

/// The hot-prompt phase's shared system prompt: about `words` words.
pub fn hot_system_prompt(words: usize) -> String {
    let mut s = String::from("You are the support assistant of the FlexInfer fleet. Rules:");
    for i in 0..words {
        s.push_str(if i % 9 == 8 { " rule." } else { " answer" });
    }
    s
}

fn hot_body(model: &str, system: &str, user: usize) -> String {
    json!({
        "model": model,
        "messages": [
            {"role": "system", "content": system},
            {"role": "user", "content": format!("User {user} asks: how do I route request {user}?")}
        ],
        "max_tokens": 16
    })
    .to_string()
}

fn body(model: &str, doc: &Doc) -> String {
    json!({
        "model": model,
        "messages": [
            {"role": "system", "content": "You answer using provided document context only."},
            {"role": "user", "content": "Summarize the document."}
        ],
        "document_context": doc.text,
        "max_tokens": 16
    })
    .to_string()
}

/// Run one phase: `requests` requests for `model` through `proxy`, `concurrency` at a time.
/// The hot-prompt phase sends `hot_system` as every request's system prompt.
pub async fn run_phase(
    proxy: SocketAddr,
    model: &str,
    phase: Phase,
    docs: &[Doc],
    hot_system: &str,
    requests: usize,
    concurrency: usize,
) -> PhaseReport {
    let client: Client<_, Full<Bytes>> = Client::builder(TokioExecutor::new()).build_http();
    let gate = Arc::new(Semaphore::new(concurrency.max(1)));
    let mut tasks = Vec::with_capacity(requests);
    for i in 0..requests {
        let doc = &docs[i % docs.len()];
        let mut req = Request::post(format!("http://{proxy}/v1/chat/completions"))
            .header("content-type", "application/json");
        match phase {
            Phase::ExplicitStable => req = req.header("x-flexinfer-cache-key", doc.key.as_str()),
            Phase::CanonicalContext | Phase::HotPrompt => {}
            Phase::MalformedKey => {
                req = req.header("x-flexinfer-cache-key", format!("bad key with spaces {i}"))
            }
        }
        let text = match phase {
            Phase::HotPrompt => hot_body(model, hot_system, i),
            _ => body(model, doc),
        };
        let req = req
            .body(Full::new(Bytes::from(text)))
            .expect("valid request");
        let client = client.clone();
        let permit = gate.clone().acquire_owned().await.expect("semaphore open");
        tasks.push(tokio::spawn(async move {
            let _permit = permit;
            let start = Instant::now();
            let result = async {
                let resp = client.request(req).await.ok()?;
                let ok = resp.status().is_success();
                let pod = resp
                    .headers()
                    .get("x-sim-pod")
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or("?")
                    .to_string();
                let bytes = resp.into_body().collect().await.ok()?.to_bytes();
                let v: serde_json::Value = serde_json::from_slice(&bytes).unwrap_or_default();
                let usage = &v["usage"];
                Some(Sample {
                    ok,
                    latency: start.elapsed(),
                    pod,
                    prompt_tokens: usage["prompt_tokens"].as_u64().unwrap_or(0),
                    cached_tokens: usage["prompt_tokens_details"]["cached_tokens"]
                        .as_u64()
                        .unwrap_or(0),
                })
            }
            .await;
            result.unwrap_or(Sample {
                ok: false,
                latency: start.elapsed(),
                pod: "-".into(),
                prompt_tokens: 0,
                cached_tokens: 0,
            })
        }));
    }
    let mut samples = Vec::with_capacity(requests);
    for t in tasks {
        if let Ok(s) = t.await {
            samples.push(s);
        }
    }
    PhaseReport { phase, samples }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn documents_are_distinct_and_deterministic() {
        let a = documents(3, 50);
        let b = documents(3, 50);
        assert_eq!(a[1].text, b[1].text);
        assert_ne!(a[0].text[..60], a[1].text[..60]);
        assert_eq!(a[2].key, "tenant-a/doc-3");
    }

    #[test]
    fn report_math() {
        let s = |ms, p, c| Sample {
            ok: true,
            latency: Duration::from_millis(ms),
            pod: "a".into(),
            prompt_tokens: p,
            cached_tokens: c,
        };
        let r = PhaseReport {
            phase: Phase::ExplicitStable,
            samples: vec![
                s(10, 100, 0),
                s(20, 100, 50),
                s(30, 100, 100),
                s(40, 100, 50),
            ],
        };
        assert_eq!(r.quantile(0.5), Duration::from_millis(30));
        assert_eq!(r.quantile(0.95), Duration::from_millis(40));
        assert!((r.cache_hit_share() - 0.5).abs() < 1e-9);
        assert_eq!(r.pods()["a"], 4);
    }
}
