//! The two workloads of `bench real-llm` and the streaming client that measures them: prompts
//! built from fixed sentences and salted per run, a closed loop of clients, and per request the
//! time to the first SSE event and the cached share of the prompt.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use flexinfer_test_support::harness::http::{Conn, Request, Timeouts};

use super::{RealLlmBench, Workload, PATH};

/// One streamed request as the client saw it.
#[derive(Debug, Clone)]
pub(super) struct Sample {
    /// The request's number in the workload.
    pub index: usize,
    pub ttft: Duration,
    pub prompt_tokens: u64,
    pub cached_tokens: u64,
    /// The proxy's `x-flexinfer-route` (depth and spill), when it sent one.
    pub route: Option<String>,
}

pub(super) struct Run {
    pub samples: Vec<Sample>,
    pub failed: usize,
    pub wall: Duration,
}

pub(super) fn request_body(model: &str, system: &str, user: &str, max_tokens: u32) -> String {
    serde_json::json!({
        "model": model,
        "stream": true,
        "stream_options": {"include_usage": true},
        "max_tokens": max_tokens,
        "temperature": 0,
        "messages": [
            {"role": "system", "content": system},
            {"role": "user", "content": user}
        ]
    })
    .to_string()
}

/// Sentences that make up the long prompts (each about 12 tokens).
const SENTENCES: [&str; 8] = [
    "Routing keeps a conversation on the replica that holds its cache.",
    "A shared system prompt is computed once per replica that serves it.",
    "Bounded loads stop one replica from queueing while others idle.",
    "Every answer must cite the section of the document it comes from.",
    "Replies stay short, factual and in plain English for operators.",
    "When a question is out of scope, say so and suggest a next step.",
    "Numbers are given with their units and the date they were measured.",
    "Secrets, keys and tokens are never repeated back to the user.",
];

fn long_text(seed: usize, sentences: usize) -> String {
    (0..sentences)
        .map(|i| SENTENCES[(seed * 7 + i * 3 + i / 8) % SENTENCES.len()])
        .collect::<Vec<_>>()
        .join(" ")
}

/// The system and user message of request `i` of a workload.
fn prompt(workload: Workload, salt: &str, i: usize, args: &RealLlmBench) -> (String, String) {
    match workload {
        Workload::HotPrompt => (
            format!(
                "[{salt}] You are the FlexInfer support assistant. {}",
                long_text(0, 64)
            ),
            format!("User {i} asks: which setting controls routing for team {i}?"),
        ),
        Workload::ChatWithDoc => {
            let d = document(i, args);
            (
                format!(
                    "[{salt}] You answer using the provided document only. Document {d}: {}",
                    long_text(d + 1, 40)
                ),
                format!("Question {i}: what does the document say about replicas?"),
            )
        }
    }
}

/// The document request `i` of chat-with-doc asks about: a fixed shuffle, so no routing gets
/// the documents in an order that suits it (in order, round-robin over 3 servers would give
/// each server 2 of 6 documents).
pub(super) fn document(i: usize, args: &RealLlmBench) -> usize {
    (i.wrapping_mul(2_654_435_761) >> 7) % args.documents.max(1)
}

/// One streamed exchange: time to the first SSE event, then the usage of the last one.
pub(super) fn stream_one(addr: SocketAddr, index: usize, body: &str) -> Result<Sample> {
    let start = Instant::now();
    let t = Timeouts {
        connect: Duration::from_secs(5),
        read: Duration::from_secs(300),
        write: Duration::from_secs(10),
    };
    let mut conn = Conn::connect(addr, t)?;
    conn.send(&Request::post(PATH, body.as_bytes()))?;
    let head = conn.head()?;
    if head.status != 200 {
        let r = conn.reply(head);
        bail!("status {}: {}", r.status, r.text());
    }
    let route = head.header("x-flexinfer-route").map(str::to_owned);
    let mut events = conn.events(&head);
    let mut ttft = None;
    let (mut prompt_tokens, mut cached_tokens) = (0, 0);
    while let Some(ev) = events.next_event()? {
        if !ev.data.starts_with('{') {
            continue;
        }
        ttft.get_or_insert(ev.at - start);
        let Ok(v) = serde_json::from_str::<serde_json::Value>(&ev.data) else {
            continue;
        };
        let t = &v["timings"];
        if let (Some(c), Some(p)) = (t["cache_n"].as_u64(), t["prompt_n"].as_u64()) {
            (prompt_tokens, cached_tokens) = (c + p, c);
        } else if let Some(p) = v["usage"]["prompt_tokens"].as_u64() {
            prompt_tokens = p;
            cached_tokens = v["usage"]["prompt_tokens_details"]["cached_tokens"]
                .as_u64()
                .unwrap_or(0);
        }
    }
    if !events.complete() {
        bail!("the stream was cut before its end");
    }
    Ok(Sample {
        index,
        ttft: ttft.context("no SSE event in the answer")?,
        prompt_tokens,
        cached_tokens,
        route,
    })
}

/// A workload for `model`: a closed loop of `concurrency` clients, request i through
/// `addrs[i mod len]`.
pub(super) fn run_workload(
    addrs: &[SocketAddr],
    model: &str,
    workload: Workload,
    salt: &str,
    args: &RealLlmBench,
) -> Result<Run> {
    let (requests, concurrency) = match workload {
        Workload::HotPrompt => (args.hot_requests, args.hot_concurrency),
        Workload::ChatWithDoc => (args.doc_requests, args.doc_concurrency),
    };
    let bodies: Vec<String> = (0..requests)
        .map(|i| {
            let (system, user) = prompt(workload, salt, i, args);
            request_body(model, &system, &user, args.max_tokens)
        })
        .collect();
    let bodies = Arc::new(bodies);
    let next = Arc::new(AtomicU64::new(0));
    let addrs: Arc<[SocketAddr]> = addrs.into();
    let start = Instant::now();
    let workers: Vec<_> = (0..concurrency)
        .map(|_| {
            let (bodies, next, addrs) =
                (Arc::clone(&bodies), Arc::clone(&next), Arc::clone(&addrs));
            std::thread::spawn(move || {
                let mut got = Vec::new();
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed) as usize;
                    let Some(body) = bodies.get(i) else { break };
                    got.push(stream_one(addrs[i % addrs.len()], i, body));
                }
                got
            })
        })
        .collect();
    let mut samples = Vec::new();
    let mut failed = 0;
    for w in workers {
        for r in w
            .join()
            .map_err(|_| anyhow::anyhow!("a client thread panicked"))?
        {
            match r {
                Ok(s) => samples.push(s),
                Err(e) => {
                    eprintln!("bench real-llm: {model} {}: {e:#}", workload.name());
                    failed += 1;
                }
            }
        }
    }
    Ok(Run {
        samples,
        failed,
        wall: start.elapsed(),
    })
}
