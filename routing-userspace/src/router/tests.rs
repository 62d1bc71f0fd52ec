//! Decision tests: every strategy, graceful degradation, label groups and priority tiers, and
//! the reservation tokens decisions carry.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::Duration;

use http::{HeaderMap, HeaderValue};

use super::test_world::{addr, model, World};
use super::*;
use crate::discovery::ModelSpec;
use crate::table::Route;
use crate::vocab::{GroupOutcome, KeySource, LabelGroupMode, Outcome, Strategy};

/// A model with no ready pod.
const NO_PODS: [u16; 0] = [];

fn world_with_mode(models: Vec<ModelSpec>, ttl: Duration, mode: LabelGroupMode) -> World {
    let knobs = RoutingKnobs {
        reservation_ttl: ttl,
        label_group_mode: mode,
        ..RoutingKnobs::default()
    };
    World::new(models, knobs)
}

fn world(models: Vec<ModelSpec>, ttl: Duration) -> World {
    world_with_mode(models, ttl, LabelGroupMode::RoundRobin)
}

/// Where a request may go, in order.
#[derive(Debug, PartialEq, Eq)]
enum T {
    Pod(SocketAddr),
    Service(String),
}

/// Every target of a decision, in order (consumes its candidates).
fn targets(d: &mut Decision) -> Vec<T> {
    let mut out = Vec::new();
    while let Some(a) = d.next_attempt() {
        out.push(match d.target(a) {
            Target::Pod(p) => T::Pod(p.addr),
            Target::Service(u) => T::Service(u.to_string()),
        });
    }
    out
}

fn first_pod(d: &Decision) -> Option<SocketAddr> {
    d.picked_pod().map(|p| p.addr)
}

const SYS_BODY: &str = r#"{"messages":[{"role":"system","content":"Shared system prompt"},{"role":"user","content":"q"}]}"#;

#[test]
fn default_routes_to_the_service() {
    let w = world(vec![model("m", Strategy::Default, [1, 2])], Duration::ZERO);
    let mut d = w.simple("m", SYS_BODY);
    assert_eq!(d.outcome(), Outcome::ServiceFallback);
    assert_eq!(d.key_source(), KeySource::None);
    assert_eq!(targets(&mut d), vec![T::Service("http://m.svc:80".into())]);
}

#[test]
fn prefix_same_context_same_pod_with_alternates_then_service() {
    let w = world(
        vec![model("m", Strategy::Prefix, [1, 2, 3, 4])],
        Duration::ZERO,
    );
    let mut a = w.simple("m", SYS_BODY);
    assert_eq!(a.outcome(), Outcome::Pod);
    assert_eq!(a.key_source(), KeySource::Canonical);
    let first = first_pod(&a);
    let all = targets(&mut a);
    assert_eq!(all.len(), 4, "3 pod attempts + service");
    assert_eq!(all[0], T::Pod(first.unwrap()));
    assert!(matches!(all[3], T::Service(_)));
    for _ in 0..20 {
        assert_eq!(first_pod(&w.simple("m", SYS_BODY)), first);
    }
}

#[test]
fn graceful_degradation() {
    // No ready endpoints -> Service DNS, for every strategy.
    for s in [
        Strategy::Prefix,
        Strategy::SessionAffinity,
        Strategy::LeastLoaded,
    ] {
        let w = world(vec![model("m", s, NO_PODS)], Duration::from_secs(10));
        let mut d = w.simple("m", SYS_BODY);
        assert_eq!(d.outcome(), Outcome::ServiceFallback, "{s}");
        assert_eq!(targets(&mut d), vec![T::Service("http://m.svc:80".into())]);
    }
    // Prefix with no key at all -> Service.
    let w = world(vec![model("m", Strategy::Prefix, [1, 2])], Duration::ZERO);
    let d = w.simple("m", r#"{"model":"m"}"#);
    assert_eq!(
        (d.outcome(), d.key_source()),
        (Outcome::ServiceFallback, KeySource::None)
    );
    // Session with no key -> a random pod (the draw decides).
    let w = world(
        vec![model("m", Strategy::SessionAffinity, [1, 2, 3])],
        Duration::ZERO,
    );
    let picks: Vec<_> = (0..3)
        .map(|draw| first_pod(&w.decide("m", &HeaderMap::new(), "{}", draw)))
        .collect();
    assert_eq!(picks, vec![Some(addr(1)), Some(addr(2)), Some(addr(3))]);
    // Nothing at all: no targets (the proxy answers 503), never a panic.
    let mut m = model("m", Strategy::Prefix, NO_PODS);
    m.service = None;
    let w = world(vec![m], Duration::ZERO);
    let mut d = w.simple("m", SYS_BODY);
    assert!(!d.has_targets());
    assert!(targets(&mut d).is_empty());
}

#[test]
fn session_headers_stick() {
    let w = world(
        vec![model("m", Strategy::SessionAffinity, [1, 2, 3, 4, 5])],
        Duration::ZERO,
    );
    let mut seen = HashMap::new();
    for i in 0..50 {
        let mut h = HeaderMap::new();
        h.insert(
            "x-session-id",
            HeaderValue::from_str(&format!("user-{}", i % 10)).unwrap(),
        );
        let d = w.decide("m", &h, "{}", i);
        assert_eq!(d.key_source(), KeySource::SessionHeader);
        let pod = first_pod(&d).unwrap();
        assert_eq!(*seen.entry(i % 10).or_insert(pod), pod);
    }
}

#[test]
fn least_loaded_prefers_idle_pods_and_reservations_spread_a_burst() {
    let w = world(
        vec![model("m", Strategy::LeastLoaded, [1, 2, 3, 4])],
        Duration::from_secs(10),
    );
    // Pods 1-3 busy; the burst must start on pod 4.
    let busy: Vec<_> = [1, 2, 3]
        .iter()
        .map(|&p| w.gauge.enter(w.slots.get(&addr(p)).unwrap()))
        .collect();
    let mut held = vec![w.simple("m", "{}")];
    assert_eq!(first_pod(&held[0]), Some(addr(4)));
    drop(busy);
    let mut hits: HashMap<SocketAddr, usize> = HashMap::new();
    for _ in 0..49 {
        // Each decision holds its reservation, as a request in flight does.
        let d = w.simple("m", "{}");
        *hits.entry(first_pod(&d).unwrap()).or_default() += 1;
        held.push(d);
    }
    // 50 picks in all (1 above + 49) over 4 pods: at most 13 each.
    assert!(hits.values().all(|&n| n <= 13), "{hits:?}");
}

#[test]
fn least_loaded_alternates_are_the_next_least_loaded() {
    let w = world(
        vec![model("m", Strategy::LeastLoaded, [1, 2, 3, 4])],
        Duration::ZERO,
    );
    let slot = |p| w.slots.get(&addr(p)).unwrap();
    let _load = [
        w.gauge.enter(slot(1)),
        w.gauge.enter(slot(1)),
        w.gauge.enter(slot(2)),
        w.gauge.enter(slot(4)),
        w.gauge.enter(slot(4)),
        w.gauge.enter(slot(4)),
    ];
    let mut d = w.simple("m", "{}");
    assert_eq!(
        targets(&mut d),
        vec![
            T::Pod(addr(3)),
            T::Pod(addr(2)),
            T::Pod(addr(1)),
            T::Service("http://m.svc:80".into())
        ]
    );
}

#[test]
fn least_loaded_without_reservations_is_raw_load_plus_round_robin() {
    let w = world(
        vec![model("m", Strategy::LeastLoaded, [1, 2])],
        Duration::ZERO,
    );
    let picks: Vec<_> = (0..4)
        .map(|_| first_pod(&w.simple("m", "{}")).unwrap())
        .collect();
    assert_eq!(picks, vec![addr(1), addr(2), addr(1), addr(2)]);
}

fn member(name: &str, label: &str, prio: i64, ready: bool, ports: &[u16]) -> ModelSpec {
    let mut m = model(name, Strategy::LeastLoaded, ports);
    m.service_label = Some(label.into());
    m.route_priority = prio;
    m.ready = ready;
    m
}

#[test]
fn label_group_round_robin_spreads_over_members() {
    let w = world(
        vec![
            member("a", "chat", 0, true, &[1]),
            member("b", "chat", 0, true, &[2]),
        ],
        Duration::ZERO,
    );
    let d: Vec<_> = (0..4).map(|_| w.simple("chat", "{}")).collect();
    let names: Vec<&str> = d.iter().map(|d| &*d.model().name).collect();
    assert_eq!(names, vec!["a", "b", "a", "b"]);
    let g = d[0].group().unwrap();
    assert_eq!(
        (g.mode, g.outcome.as_str(), &*g.group.label),
        (LabelGroupMode::RoundRobin, "round_robin", "chat")
    );
}

#[test]
fn label_group_priority_pick_then_degrade_then_cold_start() {
    let w = world(
        vec![
            member("fast", "tts", 100, true, &[1]),
            member("slow", "tts", 0, true, &[2]),
        ],
        Duration::ZERO,
    );
    for _ in 0..5 {
        let d = w.simple("tts", "{}");
        assert_eq!(&*d.model().name, "fast");
        assert_eq!(d.group().unwrap().outcome, GroupOutcome::PriorityPick);
    }
    let w = world(
        vec![
            member("fast", "tts", 100, false, &[1]),
            member("slow", "tts", 0, true, &[2]),
        ],
        Duration::ZERO,
    );
    let d = w.simple("tts", "{}");
    assert_eq!(&*d.model().name, "slow", "primary left Ready: next tier");
    assert_eq!(
        d.group().unwrap().outcome,
        GroupOutcome::Mode(LabelGroupMode::RoundRobin)
    );
    let w = world(
        vec![
            member("zeta", "tts", 100, false, &[]),
            member("beta", "tts", 100, false, &[]),
            member("alpha", "tts", 0, false, &[]),
        ],
        Duration::ZERO,
    );
    let mut d = w.simple("tts", "{}");
    assert_eq!(&*d.model().name, "beta");
    assert_eq!(d.group().unwrap().outcome, GroupOutcome::ColdStart);
    assert_eq!(
        targets(&mut d),
        vec![T::Service("http://beta.svc:80".into())]
    );
}

#[test]
fn label_group_least_loaded_reserves_members() {
    let w = world_with_mode(
        vec![
            member("a", "g", 0, true, &[1]),
            member("b", "g", 0, true, &[2]),
            member("c", "g", 0, true, &[3]),
        ],
        Duration::from_secs(10),
        LabelGroupMode::LeastLoaded,
    );
    let _busy = w.gauge.enter(w.slots.get(&addr(1)).unwrap());
    let held: Vec<Decision> = (0..5).map(|_| w.simple("g", "{}")).collect();
    let names: Vec<String> = held.iter().map(|d| d.model().name.to_string()).collect();
    // a is busy: b and c first; then reservations make every member equal at 1, so the next
    // three picks take each member once.
    let mut first_two = names[..2].to_vec();
    first_two.sort();
    assert_eq!(first_two, ["b", "c"]);
    let mut next = names[2..].to_vec();
    next.sort();
    assert_eq!(next, ["a", "b", "c"]);
    let d = w.simple("g", "{}");
    assert_eq!(d.group().unwrap().outcome.as_str(), "least_loaded");
}

#[test]
fn label_group_prefix_mode_pins_a_context_to_one_member() {
    let w = world_with_mode(
        (0..4)
            .map(|i| member(&format!("m{i}"), "g", 0, true, &[10 + i]))
            .collect(),
        Duration::ZERO,
        LabelGroupMode::Prefix,
    );
    let first = w
        .decide("g", &HeaderMap::new(), SYS_BODY, 0)
        .model()
        .name
        .clone();
    for draw in 0..10 {
        assert_eq!(
            w.decide("g", &HeaderMap::new(), SYS_BODY, draw)
                .model()
                .name,
            first
        );
    }
}

/// Made, consumed and expired reservations of model `m` in the world's table.
fn ledger(w: &World, m: &str) -> (u64, u64, u64) {
    let Some(Route::Model(r)) = w.table.lookup(m) else {
        panic!("no model {m}")
    };
    let c = &r.metrics.reservations;
    (c.made.get(), c.consumed.get(), c.expired.get())
}

/// The one meaning of "a request starts on a pod", which the proxy's forward phase and the
/// replay both use: counted in flight there first, then what stood for it released (the
/// reservation consumed only when it is that pod's); an attempt that fails before starting
/// abandons its pod's reservation; a decision dropped unstarted lets everything expire. Each
/// reservation ends exactly once.
#[test]
fn a_decision_starts_on_its_pick_or_abandons_it_and_each_hold_ends_once() {
    let w = world(
        vec![model("m", Strategy::LeastLoaded, [1, 2])],
        Duration::from_secs(10),
    );
    let gauge = &w.gauge;
    // Started on the reserved pod.
    let mut d = w.simple("m", "{}");
    let slot = d
        .picked_pod()
        .and_then(|p| p.slot)
        .expect("a pod with a slot");
    assert_eq!(d.held().pod_reservation, Some(u64::from(slot)));
    let first = d.next_attempt().expect("a first attempt");
    let in_flight = d.start_on(first, gauge);
    assert!(in_flight.is_some());
    assert_eq!(gauge.active(slot), 1, "counted in flight where it started");
    assert_eq!(
        d.held(),
        Held {
            pod_reservation: None,
            member_reservation: false,
            pending_pick: false
        }
    );
    assert_eq!(ledger(&w, "m"), (1, 1, 0));
    drop(in_flight);
    assert_eq!(gauge.active(slot), 0);
    // Abandoned (the connect failed), then started on the next pod: nothing to consume there.
    let mut d = w.simple("m", "{}");
    let first = d.next_attempt().expect("a first attempt");
    d.abandon(first);
    assert_eq!(ledger(&w, "m"), (2, 1, 1));
    let second = d.next_attempt().expect("an alternate");
    assert_ne!(second, first);
    let _in_flight = d.start_on(second, gauge);
    assert_eq!(ledger(&w, "m"), (2, 1, 1));
    // Dropped without starting: expired at once.
    drop(w.simple("m", "{}"));
    assert_eq!(ledger(&w, "m"), (3, 1, 2));
    // Expired by the sweep while its decision is alive; starting later consumes nothing.
    let mut d = w.simple("m", "{}");
    assert_eq!(w.router.sweep(Instant::now() + Duration::from_secs(11)), 1);
    let a = d.next_attempt().expect("a first attempt");
    assert!(d.start_on(a, gauge).is_some());
    assert_eq!(ledger(&w, "m"), (4, 1, 3));
    assert_eq!(w.router.pending_reservations(), 0);
}

#[test]
fn strategies_that_do_not_read_load_reserve_nothing() {
    let w = world(
        vec![
            model("p", Strategy::Prefix, [1, 2]),
            model("s", Strategy::SessionAffinity, [3, 4]),
            model("d", Strategy::Default, [5]),
        ],
        Duration::from_secs(10),
    );
    for m in ["p", "s", "d"] {
        let d = w.simple(m, SYS_BODY);
        let held = d.held();
        assert!(held.pod_reservation.is_none() && !held.member_reservation);
        assert_eq!(ledger(&w, m), (0, 0, 0));
    }
}

/// Admission lets a request go once the room rule counts it: for a model with a
/// `maxConcurrency`, a pick that reads no bound still counts on its pod (pending) from the
/// decision until the request starts, then the gauge counts it.
#[test]
fn a_pick_of_a_model_with_max_concurrency_counts_until_its_request_starts() {
    let mut limited = model("l", Strategy::Default, [1]);
    limited.service = None;
    limited.admission.max_concurrency = Some(1);
    let mut open = model("o", Strategy::Default, [2]);
    open.service = None;
    let w = world(vec![limited, open], Duration::from_secs(10));
    let Some(Route::Model(m)) = w.table.lookup("l") else {
        panic!("model l")
    };
    let now = Instant::now;
    assert!(w.router.has_room(&m, 0, now()));
    let mut d = w.simple("l", "{}");
    assert!(d.held().pending_pick, "counted from the decision on");
    assert!(!w.router.has_room(&m, 0, now()), "its one slot is taken");
    let a = d.next_attempt().expect("the pod");
    let in_flight = d.start_on(a, &w.gauge);
    assert!(!d.held().pending_pick, "the gauge counts it now, once");
    assert!(!w.router.has_room(&m, 0, now()));
    drop(in_flight);
    assert!(w.router.has_room(&m, 0, now()));
    // Dropped before it started (the client left): the slot is free again.
    let d = w.simple("l", "{}");
    assert!(!w.router.has_room(&m, 0, now()));
    drop(d);
    assert!(w.router.has_room(&m, 0, now()));
    // Without a limit nothing reads the count, and nothing is held.
    assert!(!w.simple("o", "{}").held().pending_pick);
}

#[test]
fn the_rules_cover_every_decision_a_model_makes() {
    // Every (key source, outcome) a decision reports has a pre-resolved counter.
    let bodies = [
        "{}",
        SYS_BODY,
        r#"{"cache_key":"k"}"#,
        r#"{"prefix":"p"}"#,
        r#"{"session_id":"s"}"#,
        r#"{"messages":[{"role":"user","content":"u"}]}"#,
    ];
    let header_sets: [&[(&str, &str)]; 4] = [
        &[],
        &[("x-session-id", "s")],
        &[("x-conversation-id", "c")],
        &[("x-flexinfer-cache-key", "k")],
    ];
    for s in Strategy::ALL {
        for service in [true, false] {
            for ports in [&[][..], &[1, 2][..]] {
                let mut spec = model("m", s, ports);
                if !service {
                    spec.service = None;
                }
                let w = world(vec![spec], Duration::ZERO);
                for body in bodies {
                    for hs in header_sets {
                        let mut h = HeaderMap::new();
                        for (k, v) in hs {
                            h.insert(*k, HeaderValue::from_static(v));
                        }
                        let d = w.decide("m", &h, body, 0);
                        assert!(
                            d.model()
                                .metrics
                                .decision(d.key_source(), d.outcome())
                                .is_some(),
                            "{s} service={service} pods={ports:?} {body} {hs:?}: {:?} {:?}",
                            d.key_source(),
                            d.outcome()
                        );
                    }
                }
            }
        }
    }
}

/// Ejects the pod at port `p` of model `m` with a timeout (which ejects at once).
fn eject(w: &World, m: &str, p: u16) {
    let Some(Route::Model(route)) = w.table.lookup(m) else {
        panic!("{m} is a model");
    };
    let pod = route.pods.iter().find(|x| x.addr == addr(p)).unwrap();
    let verdict = w.router.health().failure(
        pod.slot,
        health::Failure::FirstByteTimeout,
        route.pods.iter().map(|x| x.slot),
        Instant::now(),
    );
    assert!(
        matches!(verdict, health::Verdict::Ejected(_)),
        "{verdict:?}"
    );
}

#[test]
fn ejected_pods_leave_the_candidates_and_a_lone_ejected_pod_is_still_tried() {
    let w = world(
        vec![
            model("m", Strategy::Prefix, [1, 2, 3]),
            model("one", Strategy::Prefix, [9]),
        ],
        Duration::ZERO,
    );
    let first = first_pod(&w.simple("m", SYS_BODY)).unwrap();
    eject(&w, "m", first.port());
    let mut d = w.simple("m", SYS_BODY);
    let after = targets(&mut d);
    assert!(
        !after.contains(&T::Pod(first)),
        "the ejected pod is no candidate: {after:?}"
    );
    assert_eq!(
        after.len(),
        3,
        "the two others, then the Service: {after:?}"
    );

    // Every pod of a model ejected: the first pick still tries it, then the Service.
    eject(&w, "one", 9);
    let mut d = w.simple("one", SYS_BODY);
    assert_eq!(d.outcome(), Outcome::Pod);
    assert_eq!(
        targets(&mut d),
        vec![T::Pod(addr(9)), T::Service("http://one.svc:80".into())]
    );
}

/// A cache-aware pick that passive health moves off an ejected pod teaches the index the pod
/// that really got the request, so the conversation's next turn follows it there.
#[test]
fn cache_aware_learns_the_pod_health_moved_the_pick_to() {
    let w = world(
        vec![model("ca", Strategy::CacheAware, [1, 2, 3])],
        Duration::ZERO,
    );
    // A long first question (several links), so a match decides over load.
    let question = "words of a long question ".repeat(200);
    let turn1 = serde_json::json!({"model": "ca", "messages": [
        {"role": "system", "content": "S"}, {"role": "user", "content": question}]})
    .to_string();
    let turn2 = serde_json::json!({"model": "ca", "messages": [
        {"role": "system", "content": "S"}, {"role": "user", "content": question},
        {"role": "assistant", "content": "an answer"}, {"role": "user", "content": "second"}]})
    .to_string();
    let (turn1, turn2) = (turn1.as_str(), turn2.as_str());
    // Without ejection the first turn goes to the ring pick of its first link.
    let preferred = first_pod(&w.simple("ca", turn1)).unwrap();
    let w = world(
        vec![model("ca", Strategy::CacheAware, [1, 2, 3])],
        Duration::ZERO,
    );
    eject(&w, "ca", preferred.port());
    let d = w.simple("ca", turn1);
    let moved = first_pod(&d).unwrap();
    assert_ne!(moved, preferred, "the ejected pod is skipped");
    assert_eq!(d.match_depth(), Some(0));
    // The route says the pick moved, though the bound did not move it.
    let route = d.route_header();
    let route = route.to_str().unwrap();
    assert!(route.ends_with("spill=false; passed-over=1"), "{route}");
    // The second turn extends the first turn's chain: it finds it on the pod that served it.
    let d2 = w.simple("ca", turn2);
    assert_eq!(first_pod(&d2), Some(moved));
    assert!(d2.match_depth().unwrap() >= 2, "{:?}", d2.match_depth());
    assert!(d2.route_header().to_str().unwrap().ends_with("spill=false"));
}

/// A cache-aware request waits in the queue of the one pod that holds its prompt: an engine
/// report of a waiting request on that pod does not pass it over (the prompt's prefill
/// anywhere else costs more than the wait), while the same pod still counts as full for a
/// request it holds nothing of, and a pod at its `maxConcurrency` is passed over whatever it
/// holds.
#[test]
fn a_queueing_pod_that_alone_holds_the_prompt_keeps_its_requests() {
    use crate::signals::report::{EngineReport, Source};
    let mut spec = model("ca", Strategy::CacheAware, [1, 2, 3]);
    spec.service = None;
    let w = world(vec![spec.clone()], Duration::ZERO);
    let document = "a page of the tenant's long document ".repeat(160);
    let ask = |q: &str| {
        serde_json::json!({"model": "ca", "messages": [
            {"role": "system", "content": document}, {"role": "user", "content": q}]})
        .to_string()
    };
    let holder = first_pod(&w.simple("ca", &ask("first question"))).unwrap();
    let Some(Route::Model(m)) = w.table.lookup("ca") else {
        panic!("model ca")
    };
    let pod = m.pods.iter().find(|p| p.addr == holder).unwrap();
    let queueing = EngineReport {
        running: Some(2),
        waiting: Some(1),
        kv_usage: None,
    };
    w.router
        .signals()
        .report(pod.slot.unwrap(), &queueing, Source::Scrape, Instant::now());
    // Full for everything else...
    let flags = w
        .router
        .full_pods(&m, Instant::now())
        .expect("one pod full");
    assert_eq!(flags.iter().filter(|&&f| f).count(), 1);
    // ...but the document's next question waits there.
    let d = w.simple("ca", &ask("second question"));
    assert_eq!(first_pod(&d), Some(holder));
    assert!(d.match_depth().unwrap() > 2, "{:?}", d.match_depth());
    assert!(!d.route_header().to_str().unwrap().contains("passed-over"));

    // At its maxConcurrency the holder is passed over.
    spec.admission.max_concurrency = Some(1);
    let w = world(vec![spec], Duration::ZERO);
    let mut first = w.simple("ca", &ask("first question"));
    let holder = first_pod(&first).unwrap();
    let a = first.next_attempt().unwrap();
    let _busy = first.start_on(a, &w.gauge);
    let d = w.simple("ca", &ask("second question"));
    assert_ne!(first_pod(&d), Some(holder));
    assert!(d
        .route_header()
        .to_str()
        .unwrap()
        .ends_with("passed-over=1"));
}

/// A streamed request still prefilling a document on its pod holds back the document's next
/// request to that pod until its first token (or its end); a non-streamed one holds nobody
/// back, and neither does a proxy whose wait is off.
#[test]
fn a_request_waits_for_the_prefill_of_its_prompt_in_progress_on_its_pod() {
    let mut spec = model("ca", Strategy::CacheAware, [1, 2, 3]);
    spec.service = None;
    let document = "a page of the tenant's long document ".repeat(160);
    let ask = |q: &str, stream: bool| {
        serde_json::json!({"model": "ca", "stream": stream, "messages": [
            {"role": "system", "content": document}, {"role": "user", "content": q}]})
        .to_string()
    };
    let w = world(vec![spec.clone()], Duration::ZERO);
    let first = w.simple("ca", &ask("first question", true));
    let mut second = w.simple("ca", &ask("second question", false));
    assert_eq!(first_pod(&second), first_pod(&first));
    let prefill = own_prefill(&second).expect("the first is still prefilling the document");
    assert!(!prefill.is_done());
    first.prefilled();
    assert!(prefill.is_done(), "the first token ends the prefill");
    second.waited_for_prefill(Duration::from_millis(1200), None);
    assert!(second
        .route_header()
        .to_str()
        .unwrap()
        .ends_with("; prefill-wait=1200ms"));
    // Once prefilled, nobody waits.
    let third = w.simple("ca", &ask("third question", true));
    assert!(own_prefill(&third).is_none());
    drop((first, second, third));

    // A non-streamed first request: its first byte is its end, nothing to wait for.
    let w = world(vec![spec.clone()], Duration::ZERO);
    let quiet = w.simple("ca", &ask("first question", false));
    let next = w.simple("ca", &ask("second question", true));
    assert_eq!(first_pod(&next), first_pod(&quiet));
    assert!(own_prefill(&next).is_none());

    // llama.cpp keeps the prompt in the first request's slot until its answer ends (the
    // model's engine, or its pods' metrics pages read as llama.cpp's): the wait lasts until
    // that end, for a proxy alone as for a fleet's. Only a streamed first request is waited
    // for: its first token says how long the prompt took, which bounds the wait.
    let mut llama = spec.clone();
    llama.engine = crate::vocab::EngineKind::LlamaCpp;
    let w = world(vec![llama.clone()], Duration::ZERO);
    let quiet = w.simple("ca", &ask("first question", false));
    let next = w.simple("ca", &ask("second question", true));
    assert!(own_prefill(&next).is_none(), "not streamed");
    drop((quiet, next));
    let w = world(vec![llama.clone()], Duration::ZERO);
    let first = w.simple("ca", &ask("first question", true));
    let next = w.simple("ca", &ask("second question", false));
    let held = own_prefill(&next).expect("a proxy alone waits");
    assert_eq!(held.reusable(), teaching::Reusable::AtAnswerEnd);
    first.prefilled();
    assert!(
        !held.is_done(),
        "not at the first token: at the answer's end"
    );
    drop(first);
    assert!(held.is_done());
    let w = world(vec![llama], Duration::ZERO).in_fleet(3);
    let _first = w.simple("ca", &ask("first question", true));
    let next = w.simple("ca", &ask("second question", true));
    let held = own_prefill(&next).expect("a fleet's proxy waits too");
    assert_eq!(held.reusable(), teaching::Reusable::AtAnswerEnd);
    let w = world(vec![spec.clone()], Duration::ZERO);
    let first = w.simple("ca", &ask("first question", true));
    let slot = first.picked_pod().and_then(|p| p.slot).unwrap();
    w.router
        .signals()
        .note_engine(slot, crate::vocab::EngineKind::LlamaCpp);
    let next = w.simple("ca", &ask("second question", true));
    let waits_for = |d: &Decision| own_prefill(d).map(|p| p.reusable());
    assert_eq!(
        waits_for(&next),
        Some(teaching::Reusable::AtFirstToken),
        "the lesson began before the page was read: its first token"
    );
    let w = world(vec![spec.clone()], Duration::ZERO);
    w.router
        .signals()
        .note_engine(slot, crate::vocab::EngineKind::LlamaCpp);
    let first = w.simple("ca", &ask("first question", true));
    assert_eq!(first.picked_pod().and_then(|p| p.slot), Some(slot));
    let next = w.simple("ca", &ask("second question", true));
    assert_eq!(waits_for(&next), Some(teaching::Reusable::AtAnswerEnd));
    drop((first, next));
    let w = world(vec![spec.clone()], Duration::ZERO);
    for engine in [
        crate::vocab::EngineKind::LlamaCpp,
        crate::vocab::EngineKind::Vllm,
    ] {
        w.router.signals().note_engine(slot, engine);
    }
    let _first = w.simple("ca", &ask("first question", true));
    let next = w.simple("ca", &ask("second question", true));
    assert_eq!(
        waits_for(&next),
        Some(teaching::Reusable::AtFirstToken),
        "read as vLLM's again"
    );

    // The wait turned off.
    let knobs = RoutingKnobs {
        cache_aware_prefill_wait: Duration::ZERO,
        ..RoutingKnobs::default()
    };
    let w = World::new(vec![spec], knobs);
    let _first = w.simple("ca", &ask("first question", true));
    let next = w.simple("ca", &ask("second question", true));
    assert!(own_prefill(&next).is_none());
}

/// In a fleet, a proxy that never saw a document sends its question where the hash sends it,
/// as the proxy that placed the document did, and waits there while that pod's engine queues;
/// a proxy alone knows the document is new and passes the queueing pod over.
#[test]
fn a_fleet_proxy_that_knows_no_holder_waits_at_the_pod_the_hash_agrees_on() {
    use crate::signals::report::{EngineReport, Source};
    let mut spec = model("ca", Strategy::CacheAware, [1, 2, 3]);
    spec.service = None;
    let document = "a page of the tenant's long document ".repeat(160);
    let ask = |q: &str| {
        serde_json::json!({"model": "ca", "messages": [
            {"role": "system", "content": document}, {"role": "user", "content": q}]})
        .to_string()
    };
    // The proxy that placed the document: its first question goes to the hash's pod.
    let placer = world(vec![spec.clone()], Duration::ZERO).in_fleet(3);
    let agreed = first_pod(&placer.simple("ca", &ask("first question"))).unwrap();
    let queueing = EngineReport {
        running: Some(2),
        waiting: Some(1),
        kv_usage: None,
    };
    let queue_at_agreed = |w: &World| {
        let Some(Route::Model(m)) = w.table.lookup("ca") else {
            panic!("model ca")
        };
        let pod = m.pods.iter().find(|p| p.addr == agreed).unwrap();
        w.router
            .signals()
            .report(pod.slot.unwrap(), &queueing, Source::Scrape, Instant::now());
    };
    // Another proxy of the fleet, with an empty index, while that pod queues.
    let other = world(vec![spec.clone()], Duration::ZERO).in_fleet(3);
    queue_at_agreed(&other);
    let d = other.simple("ca", &ask("second question"));
    assert_eq!(first_pod(&d), Some(agreed));
    assert_eq!(
        d.route_header().to_str().unwrap(),
        "strategy=cache-aware; key-source=prompt-chain; outcome=pod; depth=0; spill=false"
    );
    // A prompt too short for a holder's match to count is passed over as before.
    let short = serde_json::json!({"model": "ca", "messages": [
        {"role": "user", "content": "a short question"}]})
    .to_string();
    let short_pick = |w: &World| first_pod(&w.simple("ca", &short));
    let fresh = world(vec![spec.clone()], Duration::ZERO).in_fleet(3);
    let hashed = short_pick(&fresh).unwrap();
    let other = world(vec![spec.clone()], Duration::ZERO).in_fleet(3);
    let Some(Route::Model(m)) = other.table.lookup("ca") else {
        panic!("model ca")
    };
    let pod = m.pods.iter().find(|p| p.addr == hashed).unwrap();
    other
        .router
        .signals()
        .report(pod.slot.unwrap(), &queueing, Source::Scrape, Instant::now());
    assert_ne!(short_pick(&other), Some(hashed));
    // A proxy alone never sent the document anywhere: the question is new, and goes to a pod
    // that does not queue.
    let alone = world(vec![spec], Duration::ZERO);
    queue_at_agreed(&alone);
    let d = alone.simple("ca", &ask("second question"));
    assert_ne!(first_pod(&d), Some(agreed));
}

/// The full flags a decision passes over: none while no pod is full, and none once every pod
/// is (nothing to prefer).
#[test]
fn full_pods_are_flagged_only_when_some_but_not_all_are_full() {
    let mut limited = model("l", Strategy::Default, [1, 2]);
    limited.service = None;
    limited.admission.max_concurrency = Some(1);
    let w = world(vec![limited], Duration::from_secs(10));
    let Some(Route::Model(m)) = w.table.lookup("l") else {
        panic!("model l")
    };
    assert_eq!(w.router.full_pods(&m, Instant::now()), None);
    let mut first = w.simple("l", "{}");
    let a = first.next_attempt().expect("a pod");
    let _one = first.start_on(a, &w.gauge);
    let flags = w
        .router
        .full_pods(&m, Instant::now())
        .expect("one of two is full");
    assert_eq!(flags.iter().filter(|&&f| f).count(), 1);
    let mut second = w.simple("l", "{}");
    let b = second.next_attempt().expect("the other pod");
    let _two = second.start_on(b, &w.gauge);
    assert_eq!(w.router.full_pods(&m, Instant::now()), None);
}

/// The prefill of this proxy's own request that the decision waits for.
fn own_prefill(d: &Decision) -> Option<Arc<teaching::Prefill>> {
    match d.prefill_in_progress()? {
        super::decision::PrefillInProgress::Here(p) => Some(p),
        super::decision::PrefillInProgress::Elsewhere(_) => None,
    }
}
