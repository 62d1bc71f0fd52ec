//! What the soak's clients send: seedable randomness (splitmix64) and chat bodies for the two
//! models (the prefix model's bodies carry one of six tenants' system prompts, so prefix
//! routing pins each tenant to a pod).

use std::fmt::Write as _;

use serde_json::Value;

use super::{MODELS, PREFIX};

/// splitmix64: small, seedable, good enough to vary bodies and timings reproducibly.
#[derive(Clone)]
pub(super) struct Rng(u64);

impl Rng {
    pub(super) fn new(seed: u64) -> Self {
        Rng(seed)
    }
    pub(super) fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    pub(super) fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
    pub(super) fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.below(hi - lo + 1)
    }
}

/// Six tenants' system prompts: prefix routing pins each to a pod.
pub(super) fn system_prompt(tenant: u64) -> String {
    let mut s =
        format!("You are the assistant of tenant {tenant}. Answer from the tenant handbook only.");
    for i in 0..12 {
        let _ = write!(
            s,
            " Rule {i}: requests of tenant {tenant} about topic {i} go to desk {}.",
            (tenant * 7 + i) % 13
        );
    }
    s
}

pub(super) const WORDS: [&str; 12] = [
    "parcel", "invoice", "pallet", "customs", "route", "delay", "refund", "label", "depot",
    "truck", "order", "status",
];

pub(super) fn request_body(rng: &mut Rng, model: usize, stream: bool) -> Vec<u8> {
    let words: Vec<&str> = (0..rng.range(4, 12))
        .map(|_| WORDS[rng.below(WORDS.len() as u64) as usize])
        .collect();
    let mut messages = Vec::new();
    let mut body = serde_json::Map::new();
    if MODELS[model].0 == PREFIX {
        let tenant = rng.below(6);
        messages.push(serde_json::json!({"role": "system", "content": system_prompt(tenant)}));
        if rng.below(4) == 0 {
            body.insert("cache_key".into(), format!("tenant-{tenant}").into());
        }
    }
    messages.push(serde_json::json!({"role": "user", "content": words.join(" ")}));
    body.insert("model".into(), MODELS[model].0.into());
    body.insert("messages".into(), messages.into());
    body.insert("max_tokens".into(), rng.range(8, 24).into());
    body.insert("stream".into(), stream.into());
    Value::Object(body).to_string().into_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bodies_name_their_model_and_stream_flag() {
        let mut rng = Rng::new(3);
        for (m, (name, _)) in MODELS.iter().enumerate() {
            for stream in [false, true] {
                let v: Value = serde_json::from_slice(&request_body(&mut rng, m, stream)).unwrap();
                assert_eq!(v["model"], *name);
                assert_eq!(v["stream"], stream);
                let has_system = v["messages"][0]["role"] == "system";
                assert_eq!(has_system, *name == PREFIX);
            }
        }
    }
}
