//! What `bench overhead` compares: the configurations (proxies) and the cases (request kinds
//! and the routing each proxy applies to them), and the request bodies and fixed completion.

use std::fmt::Write as _;

pub(super) const MODEL: &str = "bench-model";
pub(super) const PATH: &str = "/v1/chat/completions";

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) enum Target {
    Direct,
    Nginx,
    Haproxy,
    Smg,
    FxUserspace,
    FxDefault,
    /// fx-userspace exporting traces to a local OTLP sink, sampling nothing.
    FxTrace0,
    /// fx-userspace exporting traces to a local OTLP sink, sampling one request in ten (a
    /// production setting).
    FxTraceTenth,
    /// fx-userspace exporting traces to a local OTLP sink, sampling every request.
    FxTrace1,
}

pub(super) const TARGETS: [Target; 9] = [
    Target::Direct,
    Target::Nginx,
    Target::Haproxy,
    Target::Smg,
    Target::FxUserspace,
    Target::FxDefault,
    Target::FxTrace0,
    Target::FxTraceTenth,
    Target::FxTrace1,
];

impl Target {
    pub(super) fn name(self) -> &'static str {
        match self {
            Target::Direct => "direct",
            Target::Nginx => "nginx",
            Target::Haproxy => "haproxy",
            Target::Smg => "smg",
            Target::FxUserspace => "fx-userspace",
            Target::FxDefault => "fx-default",
            Target::FxTrace0 => "fx-trace-0",
            Target::FxTraceTenth => "fx-trace-0.1",
            Target::FxTrace1 => "fx-trace-1",
        }
    }

    /// The sampler ratio of a tracing row (`None`: tracing off).
    pub(super) fn trace_ratio(self) -> Option<&'static str> {
        match self {
            Target::FxTrace0 => Some("0"),
            Target::FxTraceTenth => Some("0.1"),
            Target::FxTrace1 => Some("1.0"),
            _ => None,
        }
    }

    pub(super) fn what(self, case: Case) -> String {
        match (self, case) {
            (Target::Direct, _) => "wrk -> one upstream, no proxy".into(),
            (Target::Nginx, Case::LeastLoaded) => "nginx 1 worker, least_conn, keepalive".into(),
            (Target::Nginx, _) => {
                "nginx 1 worker, hash $http_x_session_id consistent, keepalive".into()
            }
            (Target::Haproxy, Case::LeastLoaded) => "haproxy nbthread 1, balance leastconn".into(),
            (Target::Haproxy, _) => {
                "haproxy nbthread 1, balance hdr(X-Session-ID), hash-type consistent".into()
            }
            (Target::Smg, c) => format!("smg, 1 tokio worker, --policy {}", c.smg_policy()),
            (Target::FxUserspace, c) => {
                format!("flexinfer --gauge userspace, routing {}", c.routing())
            }
            (Target::FxTrace0 | Target::FxTraceTenth | Target::FxTrace1, c) => format!(
                "fx-userspace, routing {}, OTLP/HTTP export to a local sink, parentbased_traceidratio {}",
                c.routing(),
                self.trace_ratio().unwrap_or_default()
            ),
            (Target::FxDefault, c) => format!(
                "flexinfer default flags as root (eBPF gauge, pooled connections), routing {}",
                c.routing()
            ),
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) enum Case {
    Session,
    Prefix,
    LeastLoaded,
    /// The session case from a client that sends what the OpenAI Python SDK sends.
    Sdk,
}

pub(super) const CASES: [Case; 4] = [Case::Session, Case::Prefix, Case::LeastLoaded, Case::Sdk];

/// The header fields the OpenAI Python SDK (1.54) sends besides `Host`, `Content-Type`,
/// `Content-Length` and the session header: the `sdk` case's client sends them all.
pub(super) const SDK_FIELDS: [(&str, &str); 11] = [
    ("Accept", "application/json"),
    ("User-Agent", "OpenAI/Python 1.54.4"),
    ("X-Stainless-Lang", "python"),
    ("X-Stainless-Package-Version", "1.54.4"),
    ("X-Stainless-OS", "Linux"),
    ("X-Stainless-Arch", "x64"),
    ("X-Stainless-Runtime", "CPython"),
    ("X-Stainless-Runtime-Version", "3.11.7"),
    ("x-stainless-retry-count", "0"),
    ("x-stainless-read-timeout", "600"),
    ("Authorization", "Bearer sk-none"),
];

impl Case {
    pub(super) fn name(self) -> &'static str {
        match self {
            Case::Session => "session",
            Case::Prefix => "prefix",
            Case::LeastLoaded => "least-loaded",
            Case::Sdk => "sdk",
        }
    }

    /// flexinfer's `routing:` for the case.
    pub(super) fn routing(self) -> &'static str {
        match self {
            Case::Session | Case::Sdk => "session-affinity",
            Case::Prefix => "prefix",
            Case::LeastLoaded => "least-loaded",
        }
    }

    pub(super) fn smg_policy(self) -> &'static str {
        match self {
            Case::Session | Case::Sdk => "consistent_hashing",
            Case::Prefix => "prefix_hash",
            Case::LeastLoaded => "least_load",
        }
    }

    /// Whether clients send a fresh `X-Session-ID` per request (the header proxies hash it).
    pub(super) fn sends_session(self) -> bool {
        self != Case::LeastLoaded
    }

    pub(super) fn body(self) -> String {
        match self {
            Case::Prefix => prefix_body(),
            Case::Session | Case::LeastLoaded | Case::Sdk => small_body(),
        }
    }
}

/// The fixed completion every upstream answers (about 300 bytes).
pub(super) const COMPLETION: &str = r#"{"id":"chatcmpl-bench","object":"chat.completion","created":1764547200,"model":"bench-model","choices":[{"index":0,"message":{"role":"assistant","content":"Your parcel ships today."},"finish_reason":"stop"}],"usage":{"prompt_tokens":12,"completion_tokens":5,"total_tokens":17}}"#;

/// A one-turn chat request of about 150 bytes.
pub(super) fn small_body() -> String {
    format!(
        r#"{{"model":"{MODEL}","messages":[{{"role":"user","content":"Where is my parcel? Order NW-48213."}}],"max_tokens":16}}"#
    )
}

/// A chat request of about 4 KB: a long system prompt (the shared prefix) and one user turn.
pub(super) fn prefix_body() -> String {
    const RULES: [&str; 6] = [
        "Standard parcels ship within two business days; express parcels ship the same day when ordered before 14:00 local time.",
        "Freight bookings need a confirmed pallet count and a loading-dock time window before a truck is assigned.",
        "Commercial invoices list the HS code, the country of origin and the value of each line item.",
        "Invoices are issued monthly, payment terms are thirty days and disputes must be raised within sixty days.",
        "Never invent tracking numbers, prices or dates; when unsure, say so and name the form or team that can help.",
        "Answer in the customer's language, in short paragraphs, and use a numbered list only for step-by-step instructions.",
    ];
    let mut system =
        String::from("You are the support assistant of Northwind Logistics. Company policy:");
    let mut i = 0;
    while system.len() < 3800 {
        let _ = write!(system, " ({}) {}", i + 1, RULES[i % RULES.len()]);
        i += 1;
    }
    format!(
        r#"{{"model":"{MODEL}","messages":[{{"role":"system","content":"{system}"}},{{"role":"user","content":"My express parcel NW-48213 still says label created. When will it ship?"}}],"max_tokens":16}}"#
    )
}
