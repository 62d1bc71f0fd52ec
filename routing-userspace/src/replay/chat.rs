//! A trace request as the chat a client would send, so the replay routes real bodies through
//! the real key extraction: system = the text of block 0, first user message = block 1, second
//! user message = the remaining blocks. Each block id has its own deterministic text of about
//! `chars_per_token` characters per token, so requests that share a leading run of block ids
//! share exactly that leading text, and nothing else.

use super::trace::TraceRequest;

/// Words the block texts are made of (ASCII, so the JSON needs no escaping).
const WORDS: [&str; 32] = [
    "cache", "prefix", "replica", "routing", "token", "block", "tenant", "model", "stream", "ring",
    "load", "bound", "pod", "query", "answer", "context", "document", "session", "kernel", "queue",
    "latency", "gateway", "cluster", "node", "vector", "prompt", "system", "user", "reply",
    "batch", "decode", "prefill",
];

/// Renders chat bodies for trace requests.
#[derive(Debug, Clone)]
pub struct ChatRenderer {
    /// Characters of one block's text.
    block_chars: usize,
    block_tokens: usize,
    model: String,
}

impl ChatRenderer {
    pub fn new(model: &str, block_tokens: usize, chars_per_token: usize) -> Self {
        Self {
            block_chars: (block_tokens * chars_per_token).max(8),
            block_tokens,
            model: model.to_owned(),
        }
    }

    /// Tokens of one block (what an engine would count for its text).
    pub fn block_tokens(&self) -> usize {
        self.block_tokens
    }

    /// Append block `id`'s text: `block_chars` characters, starting with the id itself so no
    /// two blocks read alike, no leading or trailing space.
    pub fn block_text(&self, id: u64, out: &mut String) {
        let start = out.len();
        out.push('b');
        out.push_str(&id.to_string());
        let mut x = id.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        while out.len() - start < self.block_chars {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            out.push(' ');
            out.push_str(WORDS[(x % WORDS.len() as u64) as usize]);
        }
        out.truncate(start + self.block_chars);
        while out.ends_with(' ') {
            out.pop();
            out.push('z');
        }
    }

    fn blocks_text(&self, ids: &[u64], out: &mut String) {
        for (i, &id) in ids.iter().enumerate() {
            if i > 0 {
                out.push(' ');
            }
            self.block_text(id, out);
        }
    }

    /// The request's chat body (JSON).
    pub fn body(&self, r: &TraceRequest) -> String {
        let ids = &r.hash_ids;
        let mut out = String::with_capacity(ids.len() * (self.block_chars + 1) + 160);
        out.push_str("{\"model\":\"");
        out.push_str(&self.model);
        out.push_str("\",\"max_tokens\":");
        out.push_str(&r.output_length.to_string());
        out.push_str(",\"messages\":[");
        let parts: [(&str, &[u64]); 3] = [
            ("system", ids.get(..1).unwrap_or_default()),
            ("user", ids.get(1..2).unwrap_or_default()),
            ("user", ids.get(2..).unwrap_or_default()),
        ];
        let mut first = true;
        for (role, blocks) in parts {
            if blocks.is_empty() {
                continue;
            }
            if !first {
                out.push(',');
            }
            first = false;
            out.push_str("{\"role\":\"");
            out.push_str(role);
            out.push_str("\",\"content\":\"");
            self.blocks_text(blocks, &mut out);
            out.push_str("\"}");
        }
        out.push_str("]}");
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(ids: &[u64]) -> TraceRequest {
        TraceRequest {
            timestamp: 0,
            input_length: 512 * ids.len() as u64,
            output_length: 7,
            hash_ids: ids.to_vec(),
        }
    }

    #[test]
    fn blocks_become_system_first_user_and_the_rest() {
        let c = ChatRenderer::new("replay", 512, 4);
        let v: serde_json::Value = serde_json::from_str(&c.body(&req(&[0, 5, 6, 7]))).unwrap();
        let m = v["messages"].as_array().unwrap();
        assert_eq!(m.len(), 3);
        assert_eq!(m[0]["role"], "system");
        let sys = m[0]["content"].as_str().unwrap();
        assert_eq!(sys.len(), 2048);
        assert!(sys.starts_with("b0 "));
        assert_eq!(m[2]["content"].as_str().unwrap().len(), 2 * 2048 + 1);
        assert_eq!(v["max_tokens"], 7);
        // One block: a system message only; shared leading ids, shared leading text.
        let one: serde_json::Value = serde_json::from_str(&c.body(&req(&[0]))).unwrap();
        assert_eq!(one["messages"].as_array().unwrap().len(), 1);
        let mut a = String::new();
        let mut b = String::new();
        c.block_text(41, &mut a);
        c.block_text(41, &mut b);
        assert_eq!(a, b);
        b.clear();
        c.block_text(42, &mut b);
        assert_ne!(a, b);
    }
}
