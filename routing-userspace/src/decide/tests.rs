//! Decision tests: every strategy, graceful degradation, label groups and priority tiers.

use std::collections::HashMap;
use std::time::Duration;

use http::{HeaderMap, HeaderValue};

use super::*;
use crate::body::BodyFields;
use crate::discovery::{ModelSet, ModelSpec, Update};
use crate::load::slots::SlotAllocator;
use crate::load::userspace::UserspaceGauge;
use crate::table::RoutingTable;

struct World {
    table: RoutingTable,
    gauge: Arc<UserspaceGauge>,
    pods: ReservationLedger<SocketAddr>,
    groups: ReservationLedger<Arc<str>>,
    limits: KeyLimits,
    slots: SlotAllocator,
}

fn addr(p: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], p))
}

fn model(name: &str, routing: Strategy, ports: &[u16]) -> ModelSpec {
    let mut m = ModelSpec::new(name);
    m.routing = routing;
    m.service = Some(format!("http://{name}.svc:80"));
    m.endpoints = ports.iter().map(|&p| addr(p)).collect();
    m
}

fn world(models: Vec<ModelSpec>, ttl: Duration) -> World {
    let mut set = ModelSet::default();
    set.apply(Update::Reset(models));
    let mut slots = SlotAllocator::default();
    slots.sync(&RoutingTable::pod_addrs(&set));
    World {
        table: RoutingTable::build(&set, &slots),
        gauge: Arc::new(UserspaceGauge::default()),
        pods: ReservationLedger::new(ttl),
        groups: ReservationLedger::new(ttl),
        limits: KeyLimits::default(),
        slots,
    }
}

impl World {
    fn decide(
        &self,
        name: &str,
        headers: &HeaderMap,
        body: &str,
        mode: LabelGroupMode,
        draw: u64,
    ) -> Decision {
        let fields = BodyFields::parse(body.as_bytes());
        let cx = Context {
            parts: RequestParts {
                headers,
                body: fields.as_ref(),
                model: Some(name),
            },
            limits: &self.limits,
            gauge: self.gauge.as_ref(),
            pod_ledger: &self.pods,
            group_ledger: &self.groups,
            group_mode: mode,
            max_pod_attempts: 3,
            now: Instant::now(),
            draw,
        };
        decide(&self.table.lookup(name).expect("route"), &cx)
    }

    fn simple(&self, name: &str, body: &str) -> Decision {
        self.decide(name, &HeaderMap::new(), body, LabelGroupMode::RoundRobin, 0)
    }
}

fn first_pod(d: &Decision) -> Option<SocketAddr> {
    d.targets.first().and_then(Target::pod_addr)
}

const SYS_BODY: &str = r#"{"messages":[{"role":"system","content":"Shared system prompt"},{"role":"user","content":"q"}]}"#;

#[test]
fn default_routes_to_the_service() {
    let w = world(vec![model("m", Strategy::Default, &[1, 2])], Duration::ZERO);
    let d = w.simple("m", SYS_BODY);
    assert_eq!(d.outcome, Outcome::ServiceFallback);
    assert_eq!(d.key_source, KeySource::None);
    assert_eq!(
        d.targets,
        vec![Target::Service(Arc::from("http://m.svc:80"))]
    );
}

#[test]
fn prefix_same_context_same_pod_with_alternates_then_service() {
    let w = world(
        vec![model("m", Strategy::Prefix, &[1, 2, 3, 4])],
        Duration::ZERO,
    );
    let a = w.simple("m", SYS_BODY);
    assert_eq!(a.outcome, Outcome::Pod);
    assert_eq!(a.key_source, KeySource::Canonical);
    assert_eq!(a.targets.len(), 4, "3 pod attempts + service");
    assert!(matches!(a.targets[3], Target::Service(_)));
    for _ in 0..20 {
        assert_eq!(first_pod(&w.simple("m", SYS_BODY)), first_pod(&a));
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
        let w = world(vec![model("m", s, &[])], Duration::from_secs(10));
        let d = w.simple("m", SYS_BODY);
        assert_eq!(d.outcome, Outcome::ServiceFallback, "{s}");
        assert_eq!(
            d.targets,
            vec![Target::Service(Arc::from("http://m.svc:80"))]
        );
    }
    // Prefix with no key at all -> Service.
    let w = world(vec![model("m", Strategy::Prefix, &[1, 2])], Duration::ZERO);
    let d = w.simple("m", r#"{"model":"m"}"#);
    assert_eq!(
        (d.outcome, d.key_source),
        (Outcome::ServiceFallback, KeySource::None)
    );
    // Session with no key -> a random pod (the draw decides).
    let w = world(
        vec![model("m", Strategy::SessionAffinity, &[1, 2, 3])],
        Duration::ZERO,
    );
    let picks: Vec<_> = (0..3)
        .map(|draw| {
            first_pod(&w.decide(
                "m",
                &HeaderMap::new(),
                "{}",
                LabelGroupMode::RoundRobin,
                draw,
            ))
        })
        .collect();
    assert_eq!(picks, vec![Some(addr(1)), Some(addr(2)), Some(addr(3))]);
    // Nothing at all: no targets (the proxy answers 503), never a panic.
    let mut m = model("m", Strategy::Prefix, &[]);
    m.service = None;
    let w = world(vec![m], Duration::ZERO);
    assert!(w.simple("m", SYS_BODY).targets.is_empty());
}

#[test]
fn session_headers_stick() {
    let w = world(
        vec![model("m", Strategy::SessionAffinity, &[1, 2, 3, 4, 5])],
        Duration::ZERO,
    );
    let mut seen = HashMap::new();
    for i in 0..50 {
        let mut h = HeaderMap::new();
        h.insert(
            "x-session-id",
            HeaderValue::from_str(&format!("user-{}", i % 10)).unwrap(),
        );
        let d = w.decide("m", &h, "{}", LabelGroupMode::RoundRobin, i);
        assert_eq!(d.key_source, KeySource::SessionHeader);
        let pod = first_pod(&d).unwrap();
        assert_eq!(*seen.entry(i % 10).or_insert(pod), pod);
    }
}

#[test]
fn least_loaded_prefers_idle_pods_and_reservations_spread_a_burst() {
    let w = world(
        vec![model("m", Strategy::LeastLoaded, &[1, 2, 3, 4])],
        Duration::from_secs(10),
    );
    // Pods 1-3 busy; the burst must start on pod 4.
    let busy: Vec<_> = [1, 2, 3]
        .iter()
        .map(|&p| w.gauge.enter(w.slots.get(&addr(p)).unwrap()))
        .collect();
    assert_eq!(first_pod(&w.simple("m", "{}")), Some(addr(4)));
    drop(busy);
    let mut hits: HashMap<SocketAddr, usize> = HashMap::new();
    for _ in 0..49 {
        *hits
            .entry(first_pod(&w.simple("m", "{}")).unwrap())
            .or_default() += 1;
    }
    // 50 picks in all (1 above + 49) over 4 pods: at most 13 each.
    assert!(hits.values().all(|&n| n <= 13), "{hits:?}");
}

#[test]
fn least_loaded_without_reservations_is_raw_load_plus_round_robin() {
    let w = world(
        vec![model("m", Strategy::LeastLoaded, &[1, 2])],
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
    let names: Vec<&str> = d.iter().map(|d| &*d.model.name).collect();
    assert_eq!(names, vec!["a", "b", "a", "b"]);
    let g = d[0].group.as_ref().unwrap();
    assert_eq!(
        (g.mode, g.outcome.as_str(), &*g.label),
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
        assert_eq!(&*d.model.name, "fast");
        assert_eq!(d.group.unwrap().outcome, GroupOutcome::PriorityPick);
    }
    let w = world(
        vec![
            member("fast", "tts", 100, false, &[1]),
            member("slow", "tts", 0, true, &[2]),
        ],
        Duration::ZERO,
    );
    let d = w.simple("tts", "{}");
    assert_eq!(&*d.model.name, "slow", "primary left Ready: next tier");
    assert_eq!(
        d.group.unwrap().outcome,
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
    let d = w.simple("tts", "{}");
    assert_eq!(&*d.model.name, "beta");
    assert_eq!(d.group.unwrap().outcome, GroupOutcome::ColdStart);
    assert_eq!(
        d.targets,
        vec![Target::Service(Arc::from("http://beta.svc:80"))]
    );
}

#[test]
fn label_group_least_loaded_reserves_members() {
    let w = world(
        vec![
            member("a", "g", 0, true, &[1]),
            member("b", "g", 0, true, &[2]),
            member("c", "g", 0, true, &[3]),
        ],
        Duration::from_secs(10),
    );
    let _busy = w.gauge.enter(w.slots.get(&addr(1)).unwrap());
    let names: Vec<String> = (0..5)
        .map(|_| {
            w.decide("g", &HeaderMap::new(), "{}", LabelGroupMode::LeastLoaded, 0)
                .model
                .name
                .to_string()
        })
        .collect();
    // a is busy: b and c first; then reservations make every member equal at 1, so the next
    // three picks take each member once.
    let mut first_two = names[..2].to_vec();
    first_two.sort();
    assert_eq!(first_two, ["b", "c"]);
    let mut next = names[2..].to_vec();
    next.sort();
    assert_eq!(next, ["a", "b", "c"]);
    let d = w.decide("g", &HeaderMap::new(), "{}", LabelGroupMode::LeastLoaded, 0);
    assert_eq!(d.group.unwrap().outcome.as_str(), "least_loaded");
}

#[test]
fn label_group_prefix_mode_pins_a_context_to_one_member() {
    let w = world(
        (0..4)
            .map(|i| member(&format!("m{i}"), "g", 0, true, &[10 + i]))
            .collect(),
        Duration::ZERO,
    );
    let first = w
        .decide("g", &HeaderMap::new(), SYS_BODY, LabelGroupMode::Prefix, 0)
        .model
        .name
        .clone();
    for draw in 0..10 {
        assert_eq!(
            w.decide(
                "g",
                &HeaderMap::new(),
                SYS_BODY,
                LabelGroupMode::Prefix,
                draw
            )
            .model
            .name,
            first
        );
    }
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
