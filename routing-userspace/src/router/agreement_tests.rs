//! Routers that share nothing agree: two routers with empty indexes that see the same requests,
//! in any order that keeps each conversation's turns in order, send every request to the same
//! pod (as the proxies of a DaemonSet must, each seeing its own interleaving of the fleet's
//! traffic). Loads stay at zero here, so only the request decides. (A router alone may also
//! read what it sent each pod lately: see `alone_*` in `balance::cache_aware`; where every pod
//! shows its slots' prompts, a prompt none holds goes by the router's rank in the fleet
//! instead, and the pods' pages say where it went: see `slot_prompt_tests`.)

use std::collections::BTreeMap;
use std::net::SocketAddr;

use super::test_world::{model, World};
use super::RoutingKnobs;
use crate::vocab::Strategy;

const CONVERSATIONS: usize = 12;
const TURNS: usize = 3;

/// Turn `turn` (0-based) of conversation `c`: a shared short system prompt, a long first
/// question of its own, then the turns so far.
fn body(system: &str, c: usize, turn: usize) -> String {
    // Several links long, so an earlier turn decides over a pod that holds only the prompt.
    let question = format!("conversation {c} asks about topic {} ", c * 7919).repeat(200);
    let mut messages = vec![
        serde_json::json!({"role": "system", "content": system}),
        serde_json::json!({"role": "user", "content": question}),
    ];
    for t in 1..=turn {
        messages.push(
            serde_json::json!({"role": "assistant", "content": format!("answer {t} ").repeat(40)}),
        );
        messages.push(serde_json::json!({"role": "user", "content": format!("follow-up {t} of {c} ").repeat(20)}));
    }
    serde_json::json!({"model": "ca", "messages": messages}).to_string()
}

/// The pods a fresh router picks for the requests in `order`.
fn picks(system: &str, order: &[(usize, usize)]) -> BTreeMap<(usize, usize), SocketAddr> {
    let w = World::new(
        vec![model("ca", Strategy::CacheAware, [1, 2, 3, 4])],
        RoutingKnobs::default(),
    )
    .in_fleet(2);
    order
        .iter()
        .map(|&(c, t)| {
            let d = w.simple("ca", &body(system, c, t));
            let pod = d.picked_pod().expect("a pod").addr;
            ((c, t), pod)
        })
        .collect()
}

/// A random interleaving of the conversations that keeps each one's turns in order.
fn interleaving(seed: u64) -> Vec<(usize, usize)> {
    let mut next = [0usize; CONVERSATIONS];
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut out = Vec::new();
    while out.len() < CONVERSATIONS * TURNS {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        let open: Vec<usize> = (0..CONVERSATIONS).filter(|&c| next[c] < TURNS).collect();
        let c = open[(state % open.len() as u64) as usize];
        out.push((c, next[c]));
        next[c] += 1;
    }
    out
}

fn agree(system: &str) -> BTreeMap<(usize, usize), SocketAddr> {
    let by_turn: Vec<_> = (0..TURNS)
        .flat_map(|t| (0..CONVERSATIONS).map(move |c| (c, t)))
        .collect();
    let reference = picks(system, &by_turn);
    let by_conversation: Vec<_> = (0..CONVERSATIONS)
        .rev()
        .flat_map(|c| (0..TURNS).map(move |t| (c, t)))
        .collect();
    assert_eq!(
        picks(system, &by_conversation),
        reference,
        "conversation by conversation"
    );
    for seed in 1..=16 {
        assert_eq!(
            picks(system, &interleaving(seed)),
            reference,
            "interleaving {seed}"
        );
    }
    reference
}

#[test]
fn behind_a_short_shared_system_prompt_routers_agree_and_conversations_spread() {
    let reference = agree("You are a helpful assistant.");
    for c in 0..CONVERSATIONS {
        let first = reference[&(c, 0)];
        assert!(
            (1..TURNS).all(|t| reference[&(c, t)] == first),
            "conversation {c} stays on its pod: {reference:?}"
        );
    }
    let pods: std::collections::BTreeSet<_> = reference.values().collect();
    assert!(pods.len() >= 3, "new conversations spread: {pods:?}");
}

#[test]
fn behind_a_long_shared_system_prompt_routers_agree() {
    // A prompt many links long: whichever conversation comes first, its pod holds the prompt,
    // so every router keeps the prompt's conversations together there (until loads spread them).
    agree(&"You are the assistant of a long and detailed policy. ".repeat(200));
}
