//! The words every layer shares: strategies, label-group modes, key sources, decision outcomes,
//! engine kinds, and the API's paths. Their string forms are the spellings of the annotations, the models file
//! and the metric labels, so they live here once, at the bottom: this module imports nothing of
//! the crate, and everything else may import it.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// The routing strategy of one model (`flexinfer.ai/routing`, or `routing:` in the file).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Strategy {
    /// Kubernetes Service load balancing: always the Service URL.
    #[default]
    Default,
    SessionAffinity,
    Prefix,
    LeastLoaded,
    /// Beyond the spec: the pod whose approximate prompt-prefix index matches the longest
    /// chain of the request's prompt, among the pods under the hash-balance bound.
    CacheAware,
}

impl Strategy {
    pub const ALL: [Strategy; 5] = [
        Strategy::Default,
        Strategy::SessionAffinity,
        Strategy::Prefix,
        Strategy::LeastLoaded,
        Strategy::CacheAware,
    ];

    /// The spelling used in annotations, the file and metric labels.
    pub fn as_str(self) -> &'static str {
        match self {
            Strategy::Default => "default",
            Strategy::SessionAffinity => "session-affinity",
            Strategy::Prefix => "prefix",
            Strategy::LeastLoaded => "least-loaded",
            Strategy::CacheAware => "cache-aware",
        }
    }
}

impl fmt::Display for Strategy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A strategy name that is not one of ours.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "unknown routing strategy {0:?} (expected default, session-affinity, prefix, least-loaded or cache-aware)"
)]
pub struct UnknownStrategy(pub String);

impl FromStr for Strategy {
    type Err = UnknownStrategy;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim() {
            "" | "default" => Ok(Strategy::Default),
            "session-affinity" | "session" => Ok(Strategy::SessionAffinity),
            "prefix" => Ok(Strategy::Prefix),
            "least-loaded" => Ok(Strategy::LeastLoaded),
            "cache-aware" => Ok(Strategy::CacheAware),
            other => Err(UnknownStrategy(other.to_owned())),
        }
    }
}

/// How a label group picks a member (`FLEXINFER_PROXY_LABEL_GROUP_ROUTING`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum LabelGroupMode {
    #[default]
    RoundRobin,
    LeastLoaded,
    Prefix,
    Session,
}

impl LabelGroupMode {
    pub fn as_str(self) -> &'static str {
        match self {
            LabelGroupMode::RoundRobin => "round-robin",
            LabelGroupMode::LeastLoaded => "least-loaded",
            LabelGroupMode::Prefix => "prefix",
            LabelGroupMode::Session => "session",
        }
    }
}

impl fmt::Display for LabelGroupMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A label-group mode name that is not one of ours.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown label group mode {0:?} (expected round-robin, least-loaded, prefix or session)")]
pub struct UnknownMode(pub String);

impl FromStr for LabelGroupMode {
    type Err = UnknownMode;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().replace('_', "-").as_str() {
            "" | "round-robin" | "roundrobin" => Ok(Self::RoundRobin),
            "least-loaded" | "leastloaded" => Ok(Self::LeastLoaded),
            "prefix" => Ok(Self::Prefix),
            "session" | "session-affinity" => Ok(Self::Session),
            other => Err(UnknownMode(other.to_owned())),
        }
    }
}

/// Where a routing key came from; the string form is the `key_source` metric label.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum KeySource {
    /// `X-Flexinfer-Cache-Key` header.
    ExplicitHeader,
    /// Body `cache_key` / `cacheKey`.
    ExplicitBody,
    /// Body `prefix` (legacy explicit field).
    PrefixField,
    /// Hash of model identity + system messages + document context.
    Canonical,
    /// `X-Session-ID` header.
    SessionHeader,
    /// `X-Conversation-ID` header.
    ConversationHeader,
    /// Body `session_id`.
    SessionBody,
    /// Hash of the conversation's opening messages.
    ImplicitSession,
    /// The prompt's chain of prefix hashes (cache-aware; the key is its first link).
    PromptChain,
    /// No key.
    None,
}

impl KeySource {
    pub const ALL: [KeySource; 10] = [
        KeySource::ExplicitHeader,
        KeySource::ExplicitBody,
        KeySource::PrefixField,
        KeySource::Canonical,
        KeySource::SessionHeader,
        KeySource::ConversationHeader,
        KeySource::SessionBody,
        KeySource::ImplicitSession,
        KeySource::PromptChain,
        KeySource::None,
    ];

    /// Position in [`KeySource::ALL`] (for tables indexed by source).
    pub fn index(self) -> usize {
        self as usize
    }

    pub fn as_str(self) -> &'static str {
        match self {
            KeySource::ExplicitHeader => "explicit-header",
            KeySource::ExplicitBody => "explicit-body",
            KeySource::PrefixField => "prefix-field",
            KeySource::Canonical => "canonical",
            KeySource::SessionHeader => "session-header",
            KeySource::ConversationHeader => "conversation-header",
            KeySource::SessionBody => "session-body",
            KeySource::ImplicitSession => "implicit-session",
            KeySource::PromptChain => "prompt-chain",
            KeySource::None => "none",
        }
    }
}

impl fmt::Display for KeySource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Per-model decision outcome (`outcome` label of `routing_decisions_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Outcome {
    Pod,
    ServiceFallback,
    /// A pod, but not the one the key prefers: that pod was at the hash-balance bound, so the
    /// walk went on to the next pod under it.
    Spill,
}

impl Outcome {
    pub const ALL: [Outcome; 3] = [Outcome::Pod, Outcome::ServiceFallback, Outcome::Spill];

    /// Position in [`Outcome::ALL`].
    pub fn index(self) -> usize {
        self as usize
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Pod => "pod",
            Outcome::ServiceFallback => "service-fallback",
            Outcome::Spill => "spill",
        }
    }
}

/// Label-group decision outcome (`outcome` label of `label_group_route_decisions_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GroupOutcome {
    /// The mode chose among the ready top tier (named after the mode).
    Mode(LabelGroupMode),
    /// A higher-priority tier took the pick from other ready members.
    PriorityPick,
    /// No member was ready: the alphabetically first member of the top tier.
    ColdStart,
}

impl GroupOutcome {
    /// The outcomes a group in `mode` can report.
    pub fn possible(mode: LabelGroupMode) -> [GroupOutcome; 3] {
        [
            GroupOutcome::Mode(mode),
            GroupOutcome::PriorityPick,
            GroupOutcome::ColdStart,
        ]
    }

    pub fn as_str(self) -> &'static str {
        match self {
            GroupOutcome::Mode(LabelGroupMode::RoundRobin) => "round_robin",
            GroupOutcome::Mode(LabelGroupMode::LeastLoaded) => "least_loaded",
            GroupOutcome::Mode(LabelGroupMode::Prefix) => "prefix",
            GroupOutcome::Mode(LabelGroupMode::Session) => "session",
            GroupOutcome::PriorityPick => "priority_pick",
            GroupOutcome::ColdStart => "cold_start",
        }
    }
}

/// Why a request was sent on to the next target (`reason` label of
/// `upstream_retries_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RetryReason {
    /// The connection broke before a response.
    Reset = 0,
    Status500 = 1,
    Status502 = 2,
    Status503 = 3,
    Status504 = 4,
    /// Another status of `--retry-on-status` (429, or a 5xx other than 500 and 502 to 504).
    StatusOther = 5,
}

impl RetryReason {
    pub const ALL: [RetryReason; 6] = [
        RetryReason::Reset,
        RetryReason::Status500,
        RetryReason::Status502,
        RetryReason::Status503,
        RetryReason::Status504,
        RetryReason::StatusOther,
    ];

    /// The reason of a retry after a pod answered `status`.
    pub fn of_status(status: u16) -> Self {
        match status {
            500 => RetryReason::Status500,
            502 => RetryReason::Status502,
            503 => RetryReason::Status503,
            504 => RetryReason::Status504,
            _ => RetryReason::StatusOther,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            RetryReason::Reset => "reset",
            RetryReason::Status500 => "status-500",
            RetryReason::Status502 => "status-502",
            RetryReason::Status503 => "status-503",
            RetryReason::Status504 => "status-504",
            RetryReason::StatusOther => "status-other",
        }
    }
}

/// Which model server runs a model's pods, for reading their load (`engine:` in the file,
/// `spec.engine` or `flexinfer.ai/engine` on a Model). It picks the metric names the scraper
/// reads from a pod's `/metrics` page; `None` turns engine signals off for the model (no load
/// report is asked for and no page is scraped).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum EngineKind {
    /// Detected from the page: the first of vLLM, SGLang and llama.cpp whose load gauges it
    /// serves.
    #[default]
    Auto,
    Vllm,
    Sglang,
    /// llama.cpp's server (`llama-server --metrics`).
    LlamaCpp,
    None,
}

impl EngineKind {
    pub const ALL: [EngineKind; 5] = [
        EngineKind::Auto,
        EngineKind::Vllm,
        EngineKind::Sglang,
        EngineKind::LlamaCpp,
        EngineKind::None,
    ];

    /// The spelling used in the file, the CRD and the annotation.
    pub fn as_str(self) -> &'static str {
        match self {
            EngineKind::Auto => "auto",
            EngineKind::Vllm => "vllm",
            EngineKind::Sglang => "sglang",
            EngineKind::LlamaCpp => "llamacpp",
            EngineKind::None => "none",
        }
    }

    /// Whether the proxy reads this engine's signals at all.
    pub fn reads_signals(self) -> bool {
        self != EngineKind::None
    }

    /// `Auto` narrowed by a Model's `spec.backend` (`vllm`, `sglang`, `llama.cpp`, `ollama`,
    /// ...): a known engine is taken as meant, `ollama` (no Prometheus page) turns signals off,
    /// anything else stays `Auto`. A kind set explicitly is kept.
    pub fn or_backend(self, backend: &str) -> EngineKind {
        if self != EngineKind::Auto {
            return self;
        }
        match backend.trim().to_ascii_lowercase().as_str() {
            "ollama" => EngineKind::None,
            other => other.parse().unwrap_or(EngineKind::Auto),
        }
    }
}

impl fmt::Display for EngineKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An engine name that is not one of ours.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown engine {0:?} (expected auto, vllm, sglang, llamacpp or none)")]
pub struct UnknownEngine(pub String);

impl FromStr for EngineKind {
    type Err = UnknownEngine;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim() {
            "" | "auto" => Ok(EngineKind::Auto),
            "vllm" => Ok(EngineKind::Vllm),
            "sglang" => Ok(EngineKind::Sglang),
            "llamacpp" | "llama.cpp" | "llama-cpp" => Ok(EngineKind::LlamaCpp),
            "none" => Ok(EngineKind::None),
            other => Err(UnknownEngine(other.to_owned())),
        }
    }
}

/// The paths of the OpenAI API the proxy serves most: the request head reader keeps each one
/// parsed once, and a trace names them without a copy.
pub const API_PATHS: [&str; 8] = [
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/embeddings",
    "/v1/responses",
    "/v1/models",
    "/v1/rerank",
    "/v1/audio/transcriptions",
    "/v1/moderations",
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strategy_spellings() {
        for s in Strategy::ALL {
            assert_eq!(s.as_str().parse::<Strategy>().unwrap(), s);
        }
        assert!("round-robin".parse::<Strategy>().is_err());
    }

    #[test]
    fn mode_spellings() {
        for m in [
            LabelGroupMode::RoundRobin,
            LabelGroupMode::LeastLoaded,
            LabelGroupMode::Prefix,
            LabelGroupMode::Session,
        ] {
            assert_eq!(m.as_str().parse::<LabelGroupMode>().unwrap(), m);
        }
        assert_eq!(
            "least_loaded".parse::<LabelGroupMode>().unwrap(),
            LabelGroupMode::LeastLoaded
        );
        assert!("random".parse::<LabelGroupMode>().is_err());
    }

    #[test]
    fn engine_spellings_and_backend_hints() {
        for k in EngineKind::ALL {
            assert_eq!(k.as_str().parse::<EngineKind>().unwrap(), k);
        }
        assert_eq!(
            "llama.cpp".parse::<EngineKind>().unwrap(),
            EngineKind::LlamaCpp
        );
        assert!("VLLM".parse::<EngineKind>().is_err());
        assert!("tgi".parse::<EngineKind>().is_err());
        for (kind, backend, want) in [
            (EngineKind::Auto, "vllm", EngineKind::Vllm),
            (EngineKind::Auto, "SGLang", EngineKind::Sglang),
            (EngineKind::Auto, "llama.cpp", EngineKind::LlamaCpp),
            (EngineKind::Auto, "ollama", EngineKind::None),
            (EngineKind::Auto, "tgi", EngineKind::Auto),
            (EngineKind::Auto, "", EngineKind::Auto),
            (EngineKind::Sglang, "vllm", EngineKind::Sglang),
            (EngineKind::None, "vllm", EngineKind::None),
        ] {
            assert_eq!(kind.or_backend(backend), want, "{kind} {backend}");
        }
    }

    #[test]
    fn indices_follow_all() {
        for (i, s) in KeySource::ALL.iter().enumerate() {
            assert_eq!(s.index(), i);
        }
        for (i, o) in Outcome::ALL.iter().enumerate() {
            assert_eq!(o.index(), i);
        }
    }
}
