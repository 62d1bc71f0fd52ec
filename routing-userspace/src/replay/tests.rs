//! Replays of tiny traces whose answers are worked out by hand in the comments.

use super::*;
use crate::balance::bounded::HashBalance;

fn req(t_ms: u64, ids: &[u64], input: u64, output: u64) -> TraceRequest {
    TraceRequest {
        timestamp: t_ms,
        input_length: input,
        output_length: output,
        hash_ids: ids.to_vec(),
    }
}

/// 1 ms per prompt token, 1 ms per output token, 512-token blocks.
fn fleet(pods: usize, cache_blocks: usize, max_running: usize) -> FleetSpec {
    FleetSpec {
        pods,
        cache_blocks,
        timing: PodTiming {
            block_tokens: 512,
            prefill_us_per_token: 1000,
            decode_us_per_token: 1000,
            max_running,
        },
        arrivals: Arrivals::Trace { speedup: 1.0 },
    }
}

/// One router that hears no engine report: what the hand-worked answers assume.
fn one_router() -> Front {
    Front {
        routers: 1,
        reports: ReportSettings {
            kinds: ReportKinds::None,
            ..ReportSettings::default()
        },
    }
}

fn run(row: Row, trace: &[TraceRequest], f: &FleetSpec) -> Report {
    run_with(row, trace, f, RoutingKnobs::default())
}

fn run_with(row: Row, trace: &[TraceRequest], f: &FleetSpec, knobs: RoutingKnobs) -> Report {
    let chat = ChatRenderer::new(MODEL, 512, 4);
    replay_row(row, trace, (f, &one_router()), knobs, &chat)
}

fn sorted(mut v: Vec<u64>) -> Vec<u64> {
    v.sort_unstable();
    v
}

#[test]
fn round_robin_by_hand() {
    // r0 -> pod 0, r1 -> pod 1, r2 -> pod 0, r3 -> pod 1.
    // r0, r1: nothing cached, 1024 tokens of prefill = 1.024 s to the first token.
    // r2 (t = 1 s, pod 0 holds [1, 2]): 2 of 3 blocks hit, 512 tokens left = 0.512 s; r3 alike.
    // Hit ratio 4 / 10; two requests per pod; nobody waited.
    let trace = [
        req(0, &[1, 2], 1024, 10),
        req(0, &[1, 3], 1024, 10),
        req(1000, &[1, 2, 4], 1536, 10),
        req(1000, &[1, 3, 5], 1536, 10),
    ];
    let r = run(Row::RoundRobin, &trace, &fleet(2, 100, 4));
    assert_eq!(r.per_pod, [2, 2]);
    assert!((r.hit_ratio - 0.4).abs() < 1e-9, "{r:?}");
    assert_eq!(r.max_over_mean, Some(1.0));
    // Nearest rank of [0.512, 0.512, 1.024, 1.024]: p50 is the 2nd, p95 and p99 the 4th.
    assert_eq!(
        (r.ttft_p50_s, r.ttft_p95_s, r.ttft_p99_s),
        (0.512, 1.024, 1.024)
    );
    assert_eq!((r.queued, r.spills), (0, Some(0)));
}

#[test]
fn a_full_pod_queues_by_hand() {
    // One pod running one request at a time. r0 starts at 0: prefill 0.512 s, decode 0.1 s,
    // done at 0.612 s. r1 arrived at 0 and waits: it starts at 0.612 s, first token at 1.124 s.
    let trace = [req(0, &[1], 512, 100), req(0, &[2], 512, 100)];
    let r = run(Row::RoundRobin, &trace, &fleet(1, 10, 1));
    assert_eq!(r.queued, 1);
    assert_eq!((r.ttft_p50_s, r.ttft_p99_s), (0.512, 1.124));
    assert_eq!(r.max_over_mean, None, "one pod has no spread");
}

/// Two conversations behind one shared system block 0: [0,1,2] then its second turn
/// [0,1,2,5]; [0,3,4] then [0,3,4,6]; second turns 100 s later, when all is idle.
fn two_conversations() -> Vec<TraceRequest> {
    vec![
        req(0, &[0, 1, 2], 1536, 10),
        req(0, &[0, 3, 4], 1536, 10),
        req(100_000, &[0, 1, 2, 5], 2048, 10),
        req(100_000, &[0, 3, 4, 6], 2048, 10),
    ]
}

#[test]
fn greedy_and_limit_by_hand() {
    // Greedy: r0 ties at 0 cached blocks everywhere -> fewest in flight, lowest index: pod 0.
    // r1 finds block 0 on pod 0 (1 block) and nothing on pod 1, pod 0 is under the bound (1 in
    // flight, floor 4) -> pod 0. The second turns find 3 blocks each on pod 0. Hits
    // 0 + 1 + 3 + 3 = 7 of 14 blocks; all four on pod 0.
    let f = fleet(2, 100, 4);
    let g = run(Row::Greedy, &two_conversations(), &f);
    assert_eq!(g.per_pod, [4, 0]);
    assert!((g.hit_ratio - 0.5).abs() < 1e-9, "{g:?}");
    assert_eq!(g.max_over_mean, Some(2.0));
    // The limit: one cache of 200 blocks sees the same 7 hits.
    let l = run(Row::Limit, &two_conversations(), &f);
    assert!((l.hit_ratio - 0.5).abs() < 1e-9, "{l:?}");
    assert_eq!(l.per_pod, [4]);
}

#[test]
fn cache_aware_by_hand() {
    // Each block is 2048 characters, two chain links. r0: nothing learned -> the ring pick of
    // its first link (block 0), pod X. r1 shares only block 0 (2 links) with X: within the tie
    // margin, so the walk of its first own link decides (X or the other pod), as session
    // affinity would. The second turns match their whole first turns (6 links) on their pods and
    // go there: 3 blocks cached each. The first turns hit 1 block if they shared a pod.
    let r = run(Row::CacheAware, &two_conversations(), &fleet(2, 100, 4));
    let hits_exact = |h: f64| (r.hit_ratio - h / 14.0).abs() < 1e-9;
    if r.per_pod.contains(&4) {
        assert!(hits_exact(7.0), "{r:?}");
    } else {
        assert_eq!(r.per_pod, [2, 2]);
        assert!(hits_exact(6.0), "{r:?}");
    }
    assert_eq!(r.spills, Some(0));
}

#[test]
fn session_affinity_keeps_each_conversation_on_its_pod() {
    // The implicit session key is system + first user message (blocks 0 and 1, or 0 and 3):
    // each second turn lands where its first turn did and finds its 3 blocks cached. The first
    // turns hit 1 block if both conversations share a pod, else 0.
    let r = run(
        Row::SessionAffinity,
        &two_conversations(),
        &fleet(2, 100, 4),
    );
    let hits_exact = |h: f64| (r.hit_ratio - h / 14.0).abs() < 1e-9;
    if r.per_pod.contains(&4) {
        assert!(hits_exact(7.0), "{r:?}");
    } else {
        assert_eq!(r.per_pod, [2, 2]);
        assert!(hits_exact(6.0), "{r:?}");
    }
}

#[test]
fn twelve_at_once_on_one_key_by_hand() {
    // Prefix routing: every request has the same system block, so one canonical key. Twelve
    // arrive together and run a long time (1000 output tokens), so none finishes meanwhile.
    let trace: Vec<TraceRequest> = (0..12).map(|k| req(0, &[0, 100 + k], 1024, 1000)).collect();
    let f = fleet(4, 100, 16);
    // Plain ring: all twelve on the key's pod.
    let plain = run(Row::Prefix, &trace, &f);
    assert_eq!(sorted(plain.per_pod.clone()), [0, 0, 0, 12]);
    assert_eq!(plain.max_over_mean, Some(4.0));
    // Bounded (c = 1.25, floor 2), placing the m-th request with m already in flight:
    // bound = max(ceil(1.25 (m + 1) / 4), 2) = 2 for m <= 5, 3 for m = 6..8, 4 for m = 9..11.
    // The key's walk is A, B, C, D: m = 0, 1 -> A; 2, 3 -> B; 4, 5 -> C (A and B hold 2);
    // 6 -> A (3rd); 7 -> B; 8 -> C; 9 -> A (4th); 10 -> B; 11 -> C. D gets none; 8 spills.
    let knobs = RoutingKnobs {
        hash_balance: HashBalance {
            factor_milli: 1250,
            floor: 2,
        },
        ..RoutingKnobs::default()
    };
    let bounded = run_with(Row::PrefixBounded, &trace, &f, knobs);
    assert_eq!(sorted(bounded.per_pod.clone()), [0, 4, 4, 4]);
    assert_eq!(bounded.spills, Some(8));
    let ratio = bounded.max_over_mean.unwrap();
    assert!((ratio - 4.0 / 3.0).abs() < 1e-9, "{ratio}");
}

#[test]
fn row_names_are_the_flag_values() {
    for row in Row::ALL {
        assert_eq!(row.name(), row.clap_name());
    }
}

#[test]
fn a_closed_loop_keeps_its_count_in_flight() {
    // One pod that runs one request at a time. At the trace's times both first turns arrive
    // at t = 0 and one waits; a closed loop of one starts each request when the last one ends,
    // so none waits, and a loop of two starts two at once again.
    let mut f = fleet(1, 100, 1);
    assert!(run(Row::RoundRobin, &two_conversations(), &f).queued >= 1);
    f.arrivals = Arrivals::Closed { in_flight: 1 };
    assert_eq!(run(Row::RoundRobin, &two_conversations(), &f).queued, 0);
    f.arrivals = Arrivals::Closed { in_flight: 2 };
    assert!(run(Row::RoundRobin, &two_conversations(), &f).queued >= 1);
}

#[test]
fn a_second_turn_through_a_router_that_never_saw_the_first_lands_where_it_did() {
    // Request i goes through router i mod 2: A's first turn through router 0 and its second
    // through router 1, B's the other way round. Neither router saw the other's turns, yet
    // each second turn goes where its first turn went (the tie walk starts at the same link
    // on both), so the routers place the trace as they do when each second turn goes through
    // the router that saw the first: 3 blocks cached per second turn. (One router alone also
    // keeps its pods' content even, so it may put the conversations elsewhere.)
    let t = two_conversations();
    let crossed = vec![t[0].clone(), t[1].clone(), t[3].clone(), t[2].clone()];
    let f = fleet(2, 100, 4);
    let chat = ChatRenderer::new(MODEL, 512, 4);
    let two = Front {
        routers: 2,
        ..one_router()
    };
    let one = replay_row(
        Row::CacheAware,
        &t,
        (&f, &two),
        RoutingKnobs::default(),
        &chat,
    );
    let both = replay_row(
        Row::CacheAware,
        &crossed,
        (&f, &two),
        RoutingKnobs::default(),
        &chat,
    );
    assert_eq!(both.per_pod, one.per_pod);
    assert!(
        (both.hit_ratio - one.hit_ratio).abs() < 1e-9,
        "{both:?} {one:?}"
    );
    assert!(both.hit_ratio >= 6.0 / 14.0 - 1e-9, "{both:?}");
}

#[test]
fn bounded_rows_are_measured_against_the_oracle_under_their_bound() {
    let f = fleet(2, 100, 4);
    let r = run(Row::CacheAware, &two_conversations(), &f);
    let oracle = r.oracle_hit_ratio.expect("cache-aware is bounded");
    assert!(
        (oracle - 0.5).abs() < 1e-9,
        "greedy keeps all four on one pod: {r:?}"
    );
    assert_eq!(
        run(Row::SessionAffinity, &two_conversations(), &f).oracle_hit_ratio,
        None
    );
    assert!(run(Row::SessionAffinityBounded, &two_conversations(), &f)
        .oracle_hit_ratio
        .is_some());
}
