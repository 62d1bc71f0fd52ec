//! OpenAI-shaped response bodies, built as JSON values.
//!
//! Clients and the proxy's tests parse these with OpenAI SDK shapes, so field names follow the
//! public API; the values are filler. `system_fingerprint` carries the replica's identity.

use serde_json::{json, Value};

/// Filler words for generated text; every output token is one of them.
const WORDS: [&str; 16] = [
    " the",
    " replica",
    " routes",
    " tokens",
    " from",
    " a",
    " cached",
    " prefix",
    " while",
    " the",
    " proxy",
    " balances",
    " load",
    " across",
    " every",
    " pod.",
];

/// Output token `index` of a generation seeded by `seed` (deterministic for a given prompt).
pub(super) fn filler_token(seed: u64, index: u64) -> &'static str {
    WORDS[(seed.wrapping_add(index) % WORDS.len() as u64) as usize]
}

/// Chat or text completion: picks the object names and choice shapes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    Chat,
    Text,
}

/// Fields every completion response and chunk shares.
#[derive(Debug, Clone)]
pub(super) struct Meta {
    pub kind: Kind,
    pub id: String,
    pub created: u64,
    pub model: String,
    pub fingerprint: String,
}

/// Token counts reported in `usage`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Usage {
    pub prompt: u64,
    pub completion: u64,
    pub cached: u64,
}

impl Usage {
    pub(super) fn to_json(self) -> Value {
        json!({
            "prompt_tokens": self.prompt,
            "completion_tokens": self.completion,
            "total_tokens": self.prompt + self.completion,
            "prompt_tokens_details": {"cached_tokens": self.cached},
        })
    }
}

impl Meta {
    fn envelope(&self, object: &str, choices: Value) -> Value {
        json!({
            "id": self.id,
            "object": object,
            "created": self.created,
            "model": self.model,
            "system_fingerprint": self.fingerprint,
            "choices": choices,
        })
    }

    /// The whole (non-streamed) response.
    pub(super) fn completion(&self, text: &str, finish_reason: &str, usage: Usage) -> Value {
        let (object, choice) = match self.kind {
            Kind::Chat => (
                "chat.completion",
                json!({
                    "index": 0,
                    "message": {"role": "assistant", "content": text},
                    "logprobs": null,
                    "finish_reason": finish_reason,
                }),
            ),
            Kind::Text => (
                "text_completion",
                json!({"index": 0, "text": text, "logprobs": null, "finish_reason": finish_reason}),
            ),
        };
        let mut v = self.envelope(object, json!([choice]));
        v["usage"] = usage.to_json();
        v
    }

    fn chunk_object(&self) -> &'static str {
        match self.kind {
            Kind::Chat => "chat.completion.chunk",
            Kind::Text => "text_completion",
        }
    }

    /// A streamed chunk carrying output token `index`, or (with `text` None) the finish reason.
    pub(super) fn chunk(
        &self,
        index: u64,
        text: Option<&str>,
        finish_reason: Option<&str>,
    ) -> Value {
        let choice = match self.kind {
            Kind::Chat => {
                let delta = match (index, text) {
                    (_, None) => json!({}),
                    (0, Some(t)) => json!({"role": "assistant", "content": t}),
                    (_, Some(t)) => json!({"content": t}),
                };
                json!({"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish_reason})
            }
            Kind::Text => json!({
                "index": 0,
                "text": text.unwrap_or(""),
                "logprobs": null,
                "finish_reason": finish_reason,
            }),
        };
        self.envelope(self.chunk_object(), json!([choice]))
    }

    /// The streamed usage chunk: no choices, just `usage` (as OpenAI's `include_usage` sends it).
    pub(super) fn usage_chunk(&self, usage: Usage) -> Value {
        let mut v = self.envelope(self.chunk_object(), json!([]));
        v["usage"] = usage.to_json();
        v
    }
}

/// `{"error": {...}}` as OpenAI returns it.
pub(super) fn error(message: &str, kind: &str, code: &str) -> Value {
    json!({"error": {"message": message, "type": kind, "param": null, "code": code}})
}

/// The `/v1/models` list with the one served model.
pub(super) fn models(model: &str, created: u64) -> Value {
    json!({
        "object": "list",
        "data": [{"id": model, "object": "model", "created": created, "owned_by": "flexinfer-sim"}],
    })
}

/// A deterministic unit vector of `dim` values for `text`.
pub(super) fn embedding_vector(text: &str, dim: usize) -> Vec<f64> {
    let raw: Vec<f64> = (0..dim as u64)
        .map(|i| {
            let h = xxhash_rust::xxh3::xxh3_64_with_seed(text.as_bytes(), i);
            (h >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0
        })
        .collect();
    let norm = raw
        .iter()
        .map(|x| x * x)
        .sum::<f64>()
        .sqrt()
        .max(f64::MIN_POSITIVE);
    raw.into_iter().map(|x| x / norm).collect()
}

/// The `/v1/embeddings` response.
pub(super) fn embeddings(model: &str, vectors: Vec<Vec<f64>>, prompt_tokens: u64) -> Value {
    let data: Vec<Value> = vectors
        .into_iter()
        .enumerate()
        .map(|(i, v)| json!({"object": "embedding", "index": i, "embedding": v}))
        .collect();
    json!({
        "object": "list",
        "data": data,
        "model": model,
        "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens},
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(kind: Kind) -> Meta {
        Meta {
            kind,
            id: "id-1".into(),
            created: 7,
            model: "m".into(),
            fingerprint: "sim:a".into(),
        }
    }

    #[test]
    fn chat_completion_shape() {
        let usage = Usage {
            prompt: 10,
            completion: 2,
            cached: 8,
        };
        let v = meta(Kind::Chat).completion(" a b", "length", usage);
        assert_eq!(v["object"], "chat.completion");
        assert_eq!(v["system_fingerprint"], "sim:a");
        assert_eq!(v["choices"][0]["message"]["content"], " a b");
        assert_eq!(v["usage"]["total_tokens"], 12);
        assert_eq!(v["usage"]["prompt_tokens_details"]["cached_tokens"], 8);
    }

    #[test]
    fn chunk_shapes() {
        let m = meta(Kind::Chat);
        assert_eq!(
            m.chunk(0, Some("x"), None)["choices"][0]["delta"]["role"],
            "assistant"
        );
        assert!(m.chunk(1, Some("x"), None)["choices"][0]["delta"]
            .get("role")
            .is_none());
        assert_eq!(
            m.chunk(2, None, Some("length"))["choices"][0]["finish_reason"],
            "length"
        );
        let t = meta(Kind::Text).chunk(0, Some("x"), None);
        assert_eq!(t["object"], "text_completion");
        assert_eq!(t["choices"][0]["text"], "x");
    }

    #[test]
    fn embeddings_are_deterministic_unit_vectors() {
        let a = embedding_vector("hello", 8);
        assert_eq!(a, embedding_vector("hello", 8));
        assert_ne!(a, embedding_vector("hellp", 8));
        let norm: f64 = a.iter().map(|x| x * x).sum();
        assert!((norm - 1.0).abs() < 1e-9);
    }
}
