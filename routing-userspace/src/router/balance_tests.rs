//! Decisions under the hash-balance bound and the cache-aware strategy, through the real
//! router, table and gauge (the pure walks are property-tested in `balance::bounded` and
//! `balance::cache_aware`).

use std::sync::Arc;
use std::time::Duration;

use http::HeaderMap;
use proptest::prelude::*;

use super::test_world::{addr, model, World};
use super::*;
use crate::balance::bounded::{BalanceOverride, HashBalance};
const DEFAULT_HASH_BALANCE: HashBalance = RoutingKnobs::DEFAULT.hash_balance;
use crate::discovery::{ModelSet, ModelSpec, Update};
use crate::load::userspace::InFlight;
use crate::metrics::Metrics;
use crate::signals::Usage;
use crate::table::RoutingTable;
use crate::vocab::{KeySource, LabelGroupMode, Outcome, Strategy};

fn world_with(models: Vec<ModelSpec>, balance: HashBalance, mode: LabelGroupMode) -> World {
    let knobs = RoutingKnobs {
        reservation_ttl: Duration::ZERO,
        label_group_mode: mode,
        hash_balance: balance,
        // Session rings too are at the balance given.
        session_factor_milli: balance.factor_milli,
        // Every pod an order holds, so the tests see whole walks.
        max_pod_attempts: 16,
        ..RoutingKnobs::default()
    };
    World::new(models, knobs)
}

fn world(models: Vec<ModelSpec>, balance: HashBalance) -> World {
    world_with(models, balance, LabelGroupMode::RoundRobin)
}

fn chat(system: &str, users: &[&str]) -> String {
    let mut messages = vec![serde_json::json!({"role": "system", "content": system})];
    for u in users {
        messages.push(serde_json::json!({"role": "user", "content": u}));
    }
    serde_json::json!({ "messages": messages }).to_string()
}

impl World {
    fn busy(&self, port: u16, n: usize) -> Vec<InFlight> {
        let slot = self.slots.get(&addr(port)).unwrap();
        (0..n).map(|_| self.gauge.enter(slot)).collect()
    }

    fn model(&self, name: &str) -> Arc<crate::table::ModelRoute> {
        match self.table.lookup(name) {
            Some(Route::Model(m)) => m,
            _ => panic!("no model {name}"),
        }
    }
}

fn pod_port(d: &Decision) -> u16 {
    d.picked_pod().expect("a pod").addr.port()
}

/// Every pod a decision would try, in order (ports).
fn order(d: &mut Decision) -> Vec<u16> {
    let mut out = Vec::new();
    while let Some(a) = d.next_attempt() {
        if let Target::Pod(p) = d.target(a) {
            out.push(p.addr.port());
        }
    }
    out
}

const SYS: &str = "You are the shared system prompt of a busy service.";

/// A message of several chain links (4,000 characters), so matches differ by more than the
/// tie margin.
fn long(text: &str) -> String {
    let mut s = String::new();
    while s.len() < 4000 {
        s.push_str(text);
        s.push(' ');
    }
    s
}

#[test]
fn the_default_bound_keeps_light_traffic_on_the_plain_ring() {
    // Light traffic routes as the plain ring does: the floor of 4 keeps a key's pod while it
    // holds fewer than four requests (sequential requests, or the demo's four in flight).
    let plain = world(vec![model("m", Strategy::Prefix, 1..5)], HashBalance::OFF);
    let bounded = world(
        vec![model("m", Strategy::Prefix, 1..5)],
        DEFAULT_HASH_BALANCE,
    );
    for i in 0..40 {
        let body = chat(&format!("{SYS} tenant {i}"), &["q"]);
        let p = plain.simple("m", &body);
        let port = pod_port(&p);
        let _lingering = bounded.busy(port, 3);
        let b = bounded.simple("m", &body);
        assert_eq!((pod_port(&b), b.outcome()), (port, Outcome::Pod), "{i}");
    }
}

#[test]
fn a_hot_key_spills_along_its_walk_and_says_so() {
    let w = world(
        vec![model("m", Strategy::Prefix, 1..5)],
        DEFAULT_HASH_BALANCE,
    );
    let body = chat(SYS, &["q"]);
    let plain: Vec<u16> = order(&mut w.simple("m", &body));
    // The key's pod holds 4 requests, the others none: 5 in flight with this one over 4 pods,
    // bound max(ceil(1.2 * 5 / 4), 4) = 4.
    let _held = w.busy(plain[0], 4);
    let mut d = w.simple("m", &body);
    assert_eq!(d.outcome(), Outcome::Spill);
    let spill = d.spill().expect("spill recorded");
    assert_eq!(
        (
            d.model().pods[spill.preferred].addr.port(),
            spill.load,
            spill.bound
        ),
        (plain[0], 4, 4)
    );
    assert_eq!(d.key_source(), KeySource::Canonical);
    assert!(d
        .model()
        .metrics
        .decision(KeySource::Canonical, Outcome::Spill)
        .is_some());
    assert!(d.model().metrics.spills.is_some());
    // Alternates continue the same walk: the full pod comes last.
    assert_eq!(order(&mut d), [plain[1], plain[2], plain[3], plain[0]]);
    let h = d.route_header();
    assert_eq!(
        h.to_str().unwrap(),
        "strategy=prefix; key-source=canonical; outcome=spill; spill=true"
    );
}

#[test]
fn a_models_own_factor_overrides_the_proxys() {
    let mut off = model("off", Strategy::SessionAffinity, 1..4);
    off.hash_balance = BalanceOverride {
        factor_milli: Some(0),
        floor: None,
    };
    let on = model("on", Strategy::SessionAffinity, 1..4);
    let w = world(vec![off, on], DEFAULT_HASH_BALANCE);
    let mut h = HeaderMap::new();
    h.insert("x-session-id", "user-1".parse().unwrap());
    let port = pod_port(&w.decide("off", &h, "{}", 0));
    assert_eq!(port, pod_port(&w.decide("on", &h, "{}", 0)));
    let _held = w.busy(port, 10);
    assert_eq!(pod_port(&w.decide("off", &h, "{}", 0)), port, "bound off");
    assert_ne!(pod_port(&w.decide("on", &h, "{}", 0)), port, "bound on");
    assert_eq!(
        w.router.balance_for(&w.model("off")),
        HashBalance {
            factor_milli: 0,
            floor: 4
        }
    );
}

#[test]
fn cache_aware_models_start_from_their_own_factor() {
    let ca = model("ca", Strategy::CacheAware, 1..4);
    let mut own = model("own", Strategy::CacheAware, 1..4);
    own.hash_balance = BalanceOverride {
        factor_milli: Some(1100),
        floor: Some(2),
    };
    let ring = model("ring", Strategy::Prefix, 1..4);
    let w = world(vec![ca, own, ring], DEFAULT_HASH_BALANCE);
    let got = |name: &str| {
        let b = w.router.balance_for(&w.model(name));
        (b.factor_milli, b.floor)
    };
    assert_eq!(
        got("ca"),
        (1600, 4),
        "--cache-aware-balance-factor, the proxy's floor"
    );
    assert_eq!(got("own"), (1100, 2), "a model's annotation wins");
    assert_eq!(got("ring"), (1150, 4), "rings keep --hash-balance-factor");
    let w = World::new(
        vec![model("s", Strategy::SessionAffinity, 1..4)],
        RoutingKnobs::default(),
    );
    let b = w.router.balance_for(&w.model("s"));
    assert_eq!(
        (b.factor_milli, b.floor),
        (1500, 4),
        "--session-balance-factor, the proxy's floor"
    );
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(32))]

    /// With c = 0 the router's order is the plain ring walk, whatever the pods carry.
    #[test]
    fn factor_zero_reproduces_the_plain_ring(
        pods in 2u16..9,
        loads in proptest::collection::vec(0usize..6, 9),
        key in "[a-z0-9]{1,12}",
    ) {
        let w = world(vec![model("m", Strategy::SessionAffinity, 1..pods + 1)], HashBalance::OFF);
        let _held: Vec<Vec<InFlight>> = (1..pods + 1).map(|p| w.busy(p, loads[p as usize])).collect();
        let mut h = HeaderMap::new();
        h.insert("x-session-id", key.parse().unwrap());
        let mut d = w.decide("m", &h, "{}", 0);
        prop_assert_eq!(d.outcome(), Outcome::Pod);
        let m = w.model("m");
        let ring: Vec<u16> = m
            .ring
            .walk(crate::keys::hash_key(&key))
            .map(|i| m.pods[i].addr.port())
            .collect();
        prop_assert_eq!(order(&mut d), ring);
    }
}

#[test]
fn label_group_hashing_modes_spill_members_at_the_bound() {
    let members: Vec<ModelSpec> = (0..3)
        .map(|i| {
            let mut m = model(&format!("m{i}"), Strategy::LeastLoaded, 10 + i..11 + i);
            m.service_label = Some("g".into());
            m
        })
        .collect();
    let w = world_with(members, DEFAULT_HASH_BALANCE, LabelGroupMode::Prefix);
    let body = chat(SYS, &["q"]);
    let first = w.simple("g", &body);
    let home = first.model().name.clone();
    assert!(first.group().unwrap().spill.is_none());
    let port = pod_port(&first);
    let _held = w.busy(port, 5);
    let d = w.simple("g", &body);
    assert_ne!(
        d.model().name,
        home,
        "the member at the bound passes the key on"
    );
    let g = d.group().unwrap();
    let spill = g.spill.expect("group spill");
    assert_eq!(g.group.members[spill.preferred].name, home);
    assert!(d.any_spill());
    assert!(g.group.metrics.spills.is_some());
}

#[test]
fn cache_aware_sends_a_conversation_back_to_the_pod_that_has_its_prefix() {
    let w = world(
        vec![model("m", Strategy::CacheAware, 1..6)],
        DEFAULT_HASH_BALANCE,
    );
    let q1 = long("first question of conversation A");
    let turn1 = chat(SYS, &[&q1]);
    let d1 = w.simple("m", &turn1);
    assert_eq!(d1.key_source(), KeySource::PromptChain);
    assert_eq!(d1.match_depth(), Some(0), "nothing learned yet");
    let pod_a = pod_port(&d1);
    // Turn 2 repeats turn 1 and adds to it: back to the same pod, turn 1's five links matched
    // (the system message, then four cuts of the 4,000-character question).
    let turn2 = chat(SYS, &[&q1, "and a follow-up"]);
    let d2 = w.simple("m", &turn2);
    assert_eq!((pod_port(&d2), d2.match_depth()), (pod_a, Some(5)));
    assert_eq!(d2.outcome(), Outcome::Pod);
    assert_eq!(
        d2.route_header().to_str().unwrap(),
        "strategy=cache-aware; key-source=prompt-chain; outcome=pod; depth=5; spill=false"
    );
    // Other tenants' traffic in between changes nothing for A: its longest match is its pod.
    for c in ["B", "C", "D", "E", "F"] {
        w.simple("m", &chat(&format!("tenant {c}"), &["opening"]));
    }
    let turn3 = chat(SYS, &[&q1, "and a follow-up", &long("third")]);
    let d3 = w.simple("m", &turn3);
    assert_eq!((pod_port(&d3), d3.match_depth()), (pod_a, Some(6)));
    // At the bound, A's pod passes the conversation on: the others hold at most the system
    // message, so the walk picks among them.
    let _held = w.busy(pod_a, 6);
    let d4 = w.simple("m", &turn3);
    assert_ne!(pod_port(&d4), pod_a);
    assert_eq!(d4.outcome(), Outcome::Spill);
    assert_eq!(
        d4.model().pods[d4.spill().unwrap().preferred].addr.port(),
        pod_a
    );
    assert!(d4.match_depth().unwrap() <= 1, "{:?}", d4.match_depth());
}

#[test]
fn cache_aware_without_a_match_picks_alike_in_any_router() {
    let a = world(
        vec![model("m", Strategy::CacheAware, 1..9)],
        DEFAULT_HASH_BALANCE,
    )
    .in_fleet(2);
    let b = world(
        vec![model("m", Strategy::CacheAware, 1..9)],
        DEFAULT_HASH_BALANCE,
    )
    .in_fleet(2);
    // Router `a` has seen other traffic; `b` has seen nothing. New prefixes land alike.
    for i in 0..30 {
        a.simple("m", &chat(&format!("warm-up system {i}"), &["hello"]));
    }
    for i in 0..20 {
        let body = chat(&format!("brand new system prompt {i}"), &["question"]);
        let (da, db) = (a.simple("m", &body), b.simple("m", &body));
        assert_eq!((da.match_depth(), db.match_depth()), (Some(0), Some(0)));
        assert_eq!(pod_port(&da), pod_port(&db), "{i}");
    }
}

#[test]
fn cache_aware_explicit_keys_win_as_in_prefix_routing() {
    let w = world(
        vec![model("m", Strategy::CacheAware, 1..5)],
        DEFAULT_HASH_BALANCE,
    );
    let mut h = HeaderMap::new();
    h.insert("x-flexinfer-cache-key", "tenant-a/doc-1".parse().unwrap());
    let d = w.decide("m", &h, &chat(SYS, &["q"]), 0);
    assert_eq!(d.key_source(), KeySource::ExplicitHeader);
    assert_eq!(d.match_depth(), None, "the index is not consulted");
    let m = w.model("m");
    assert_eq!(
        d.picked_pod().unwrap().addr,
        m.pods[m
            .ring
            .pick(crate::keys::hash_key("tenant-a/doc-1"))
            .unwrap()]
        .addr
    );
    assert!(
        w.router.index().is_empty(),
        "nothing learned from explicit keys"
    );
    // Without a prompt at all: the Service, as for prefix routing.
    let d = w.simple("m", "{}");
    assert_eq!(
        (d.outcome(), d.key_source()),
        (Outcome::ServiceFallback, KeySource::None)
    );
}

#[test]
fn the_index_forgets_pods_that_leave_the_table() {
    let mut w = world(
        vec![model("m", Strategy::CacheAware, 1..3)],
        DEFAULT_HASH_BALANCE,
    );
    let d = w.simple("m", &chat(SYS, &["q"]));
    let gone = d.picked_pod().unwrap().addr.port();
    let slot = d.picked_pod().unwrap().slot.unwrap();
    assert!(w.router.index().entries_of(slot) > 0);
    // The same slot allocator the proxy keeps: the pod that went keeps no slot.
    let kept: Vec<u16> = (1..3).filter(|&p| p != gone).collect();
    let mut spec = model("m", Strategy::CacheAware, 0..0);
    spec.endpoints = kept.iter().map(|&p| addr(p)).collect();
    let mut set = ModelSet::default();
    set.apply(Update::Reset(vec![spec]));
    let (table, _) = RoutingTable::rebuild(
        &set,
        &mut w.slots,
        &Metrics::new(10),
        LabelGroupMode::RoundRobin,
    );
    w.router.table_rebuilt(&table);
    assert_eq!(w.router.index().entries_of(slot), 0);
    assert!(w.router.index().is_empty());
}

#[test]
fn a_miss_while_the_prefix_is_still_taught_or_the_first_in_a_row_forgets_nothing() {
    let w = world(
        vec![model("m", Strategy::CacheAware, 1..4)],
        DEFAULT_HASH_BALANCE,
    );
    let doc = long("a document several links long");
    let ask = |q: &str| w.simple("m", &chat(&doc, &[q]));
    let miss = |d: &Decision| Usage {
        prompt_tokens: d.prompt().unwrap().chars() / 4,
        completion_tokens: 1,
        cached_tokens: Some(0),
    };
    let first = ask("first question");
    let port = pod_port(&first);
    let slot = first.picked_pod().unwrap().slot.unwrap();
    let held = w.router.index().entries_of(slot);
    // The second question reaches the pod while the first is in flight: the pod has not
    // cached the document yet, and its report of nothing cached forgets nothing.
    let second = ask("second question");
    assert_eq!(pod_port(&second), port);
    assert!(second.match_depth().unwrap() > 1);
    assert!(second.match_still_taught());
    w.router
        .cache_feedback(&second, second.picked_index().unwrap(), &miss(&second));
    assert!(w.router.index().entries_of(slot) >= held);
    let view = w.router.feedback().view(slot).unwrap();
    assert_eq!(
        (
            view.fell_short,
            view.fell_short_while_taught,
            view.forgotten_links
        ),
        (1, 1, 0)
    );
    // Once both have ended, a miss is a shortfall; the first in a row keeps the document (the
    // request that missed put it back), the second forgets it: the pod keeps little.
    drop((first, second));
    let third = ask("third question");
    assert_eq!(pod_port(&third), port);
    assert!(!third.match_still_taught());
    w.router
        .cache_feedback(&third, third.picked_index().unwrap(), &miss(&third));
    let view = w.router.feedback().view(slot).unwrap();
    assert_eq!(
        (view.fell_short, view.fell_short_kept, view.forgotten_links),
        (2, 1, 0)
    );
    drop(third);
    let fourth = ask("fourth question");
    assert_eq!(pod_port(&fourth), port);
    w.router
        .cache_feedback(&fourth, fourth.picked_index().unwrap(), &miss(&fourth));
    let view = w.router.feedback().view(slot).unwrap();
    assert_eq!((view.fell_short, view.fell_short_kept), (3, 1));
    assert!(view.forgotten_links > 0);
    assert!(w.router.index().entries_of(slot) < held);
}

#[test]
fn a_burst_of_bounded_picks_sees_itself_before_the_gauge_moves() {
    // Twelve requests for one key decided before any starts upstream: the gauge shows nothing,
    // the pending picks do, so the burst spreads along the walk instead of stampeding one pod.
    let w = world(
        vec![model("m", Strategy::Prefix, 1..5)],
        DEFAULT_HASH_BALANCE,
    );
    let body = chat(SYS, &["q"]);
    let held: Vec<Decision> = (0..12).map(|_| w.simple("m", &body)).collect();
    let mut per_pod = std::collections::BTreeMap::new();
    for d in &held {
        *per_pod.entry(pod_port(d)).or_insert(0) += 1;
        assert!(d.held().pending_pick);
    }
    assert!(per_pod.len() >= 3, "{per_pod:?}");
    assert!(per_pod.values().all(|&n| n <= 4), "{per_pod:?}");
    // The spec's counters are untouched: these are not least-loaded reservations.
    assert!(held.iter().all(|d| d.held().pod_reservation.is_none()));
    // Started (or gone) requests stop counting as pending.
    let slot = held[0].picked_pod().unwrap().slot.unwrap();
    drop(held);
    assert_eq!(w.router.pending.get(slot), 0);
    // The plain ring reads no load and holds nothing.
    let plain = world(vec![model("m", Strategy::Prefix, 1..5)], HashBalance::OFF);
    assert!(!plain.simple("m", &body).held().pending_pick);
}
