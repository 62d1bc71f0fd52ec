use std::collections::{BTreeMap, HashSet};

use proptest::prelude::*;

use super::*;

fn label(s: &str) -> impl FnOnce() -> Arc<str> + '_ {
    move || Arc::from(s)
}

fn one() -> u32 {
    1
}

fn order(q: &mut Queue<&'static str>) -> Vec<&'static str> {
    q.drain().into_iter().map(|e| e.value).collect()
}

#[test]
fn a_high_priority_request_behind_twenty_default_ones_leaves_next() {
    let now = Instant::now();
    let mut q = Queue::default();
    for _ in 0..20 {
        q.push(0, 1, label("a"), one, now, "low");
    }
    q.push(10, 2, label("b"), one, now, "high");
    assert_eq!(q.next_priority(), Some(10));
    assert_eq!(q.pop().unwrap().value, "high");
    assert_eq!(q.len(), 20);
}

#[test]
fn tenants_take_turns_within_a_band_and_each_is_fcfs() {
    let now = Instant::now();
    let mut q = Queue::default();
    for v in ["a1", "a2", "a3", "a4"] {
        q.push(0, 1, label("a"), one, now, v);
    }
    for v in ["b1", "b2"] {
        q.push(0, 2, label("b"), one, now, v);
    }
    q.push(0, 3, label("c"), one, now, "c1");
    // A lower band waits for the whole higher one.
    q.push(-1, 1, label("a"), one, now, "shed1");
    q.push(5, 3, label("c"), one, now, "urgent");
    assert_eq!(
        order(&mut q),
        ["urgent", "a1", "b1", "c1", "a2", "b2", "a3", "a4", "shed1"]
    );
    assert!(q.is_empty() && q.bands(10).is_empty());
}

#[test]
fn a_tenant_that_comes_back_takes_the_last_turn() {
    let now = Instant::now();
    let mut q = Queue::default();
    q.push(0, 1, label("a"), one, now, "a1");
    q.push(0, 2, label("b"), one, now, "b1");
    q.push(0, 2, label("b"), one, now, "b2");
    assert_eq!(q.pop().unwrap().value, "a1");
    // a's lane is gone; it queues again behind b's turn.
    q.push(0, 1, label("a"), one, now, "a2");
    assert_eq!(order(&mut q), ["b1", "a2", "b2"]);
}

fn weighs(w: u32) -> impl FnOnce() -> u32 {
    move || w
}

#[test]
fn a_tenant_of_weight_two_takes_two_turns_to_one_and_stays_fcfs() {
    let now = Instant::now();
    let mut q = Queue::default();
    for v in ["a1", "a2", "a3", "a4"] {
        q.push(0, 1, label("a"), one, now, v);
    }
    for v in ["b1", "b2", "b3", "b4", "b5"] {
        q.push(0, 2, label("b"), weighs(2), now, v);
    }
    // The weight is read when the lane is made: a later push does not change it.
    q.push(0, 2, label("b"), weighs(50), now, "b6");
    assert_eq!(
        order(&mut q),
        ["a1", "b1", "b2", "a2", "b3", "b4", "a3", "b5", "b6", "a4"]
    );
}

#[test]
fn a_weighted_tenant_that_empties_mid_turn_passes_the_turn_and_starts_afresh() {
    let now = Instant::now();
    let mut q = Queue::default();
    q.push(0, 2, label("b"), weighs(3), now, "b1");
    q.push(0, 1, label("a"), one, now, "a1");
    q.push(0, 1, label("a"), one, now, "a2");
    assert_eq!(q.pop().unwrap().value, "b1");
    // b's lane is gone with two requests of its turn unused; it comes back last, whole.
    for v in ["b2", "b3", "b4", "b5"] {
        q.push(0, 2, label("b"), weighs(3), now, v);
    }
    assert_eq!(order(&mut q), ["a1", "b2", "b3", "b4", "a2", "b5"]);
}

#[test]
fn reweighing_applies_to_queued_tenants_and_cuts_a_turn_in_progress() {
    let now = Instant::now();
    let mut q = Queue::default();
    for v in ["b1", "b2", "b3", "b4", "b5"] {
        q.push(0, 2, label("b"), weighs(3), now, v);
    }
    for v in ["a1", "a2", "a3"] {
        q.push(0, 1, label("a"), one, now, v);
    }
    assert_eq!(q.pop().unwrap().value, "b1");
    // b had two left in its turn; at weight 1 it has one.
    q.reweigh(|t| if t == 1 { 2 } else { 1 });
    assert_eq!(order(&mut q), ["b2", "a1", "a2", "b3", "a3", "b4", "b5"]);
}

#[test]
fn removal_from_the_middle_keeps_the_order_of_the_rest() {
    let now = Instant::now();
    let mut q = Queue::default();
    let a1 = q.push(0, 1, label("a"), one, now, "a1");
    let b1 = q.push(0, 2, label("b"), one, now, "b1");
    q.push(0, 1, label("a"), one, now, "a2");
    let c1 = q.push(0, 3, label("c"), one, now, "c1");
    assert_eq!(q.remove(&b1).unwrap().value, "b1");
    assert!(q.remove(&b1).is_none(), "gone once");
    assert_eq!(q.remove(&c1).unwrap().value, "c1");
    assert_eq!(q.len(), 2);
    assert_eq!(order(&mut q), ["a1", "a2"]);
    assert!(q.remove(&a1).is_none());
}

#[test]
fn shed_victims_are_the_newest_of_the_biggest_tenant_in_the_lowest_sheddable_band() {
    let now = Instant::now();
    let mut q = Queue::default();
    assert_eq!(q.shed_victim(0), None);
    q.push(0, 1, label("a"), one, now, "a");
    assert_eq!(q.shed_victim(10), None, "priority 0 is never shed");
    q.push(-1, 2, label("b"), one, now, "b1");
    q.push(-1, 2, label("b"), one, now, "b2");
    let c1 = q.push(-1, 3, label("c"), one, now, "c1");
    assert_eq!(q.shed_victim(-1), None, "only a lower priority makes room");
    let v = q.shed_victim(0).unwrap();
    assert_eq!(q.remove(&v).unwrap().value, "b2");
    // One each: the newest of the tied tenants.
    let v = q.shed_victim(0).unwrap();
    assert_eq!(v, c1);
    // The lowest band goes first.
    let d = q.push(-5, 4, label("d"), one, now, "d1");
    assert_eq!(q.shed_victim(-1), Some(d));
}

#[test]
fn the_view_counts_bands_tenants_and_the_oldest() {
    let t0 = Instant::now();
    let t1 = t0 + std::time::Duration::from_secs(1);
    let mut q = Queue::default();
    q.push(0, 1, label("a"), one, t1, ());
    q.push(0, 1, label("a"), one, t1, ());
    q.push(0, 2, label("b"), one, t0, ());
    q.push(3, 2, label("b"), one, t1, ());
    assert_eq!(q.oldest(), Some(t0));
    let bands = q.bands(1);
    assert_eq!(bands.len(), 2);
    assert_eq!(
        (bands[0].priority, bands[0].depth, bands[0].tenants),
        (3, 1, 1)
    );
    assert_eq!(
        (bands[1].priority, bands[1].depth, bands[1].tenants),
        (0, 3, 2)
    );
    assert_eq!(bands[1].oldest, Some(t0));
    assert_eq!(
        bands[1].top_tenants,
        [LaneView {
            tenant: Arc::from("a"),
            depth: 2
        }]
    );
}

#[derive(Debug, Clone)]
enum Op {
    Push { priority: i32, tenant: u64 },
    Pop,
    Remove(usize),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (-2i32..3, 0u64..4).prop_map(|(priority, tenant)| Op::Push { priority, tenant }),
        2 => Just(Op::Pop),
        1 => any::<usize>().prop_map(Op::Remove),
    ]
}

proptest! {
    /// Whatever happens: a pop is from the highest band present and the oldest of its tenant,
    /// every pushed request leaves exactly once, and the count is right.
    #[test]
    fn pops_respect_priority_and_fcfs_and_nothing_is_lost(ops in proptest::collection::vec(op(), 1..200)) {
        let now = Instant::now();
        let mut q = Queue::default();
        // Model: live keys by (priority, tenant) -> seqs in order.
        let mut live: BTreeMap<(i32, u64), Vec<u64>> = BTreeMap::new();
        let mut keys: Vec<Key> = Vec::new();
        let mut left: HashSet<u64> = HashSet::new();
        let mut pushed = 0usize;
        for op in ops {
            match op {
                Op::Push { priority, tenant } => {
                    let k = q.push(priority, tenant, || Arc::from("t"), one, now, pushed as u64);
                    prop_assert_eq!(k.seq, pushed as u64);
                    live.entry((priority, tenant)).or_default().push(k.seq);
                    keys.push(k);
                    pushed += 1;
                }
                Op::Pop => {
                    let Some(e) = q.pop() else {
                        prop_assert!(live.values().all(Vec::is_empty));
                        continue;
                    };
                    let top = live.iter().filter(|(_, v)| !v.is_empty()).map(|((p, _), _)| *p).max();
                    prop_assert_eq!(Some(e.key.priority), top);
                    let lane = live.get_mut(&(e.key.priority, e.key.tenant)).unwrap();
                    prop_assert_eq!(lane.first().copied(), Some(e.key.seq), "FCFS within a tenant");
                    lane.remove(0);
                    prop_assert!(left.insert(e.value), "left twice");
                }
                Op::Remove(i) => {
                    if keys.is_empty() { continue; }
                    let k = keys[i % keys.len()];
                    let lane = live.entry((k.priority, k.tenant)).or_default();
                    let was = lane.iter().position(|s| *s == k.seq);
                    let got = q.remove(&k);
                    prop_assert_eq!(got.is_some(), was.is_some());
                    if let (Some(e), Some(at)) = (got, was) {
                        lane.remove(at);
                        prop_assert!(left.insert(e.value), "left twice");
                    }
                }
            }
            let n: usize = live.values().map(Vec::len).sum();
            prop_assert_eq!(q.len(), n);
            prop_assert_eq!(q.bands(usize::MAX).iter().map(|b| b.depth).sum::<usize>(), n);
        }
        for e in q.drain() {
            prop_assert!(left.insert(e.value), "left twice");
        }
        prop_assert_eq!(left.len(), pushed, "every request left exactly once");
    }

    /// With every tenant of a band backlogged, each round serves every tenant up to its weight,
    /// in the order they arrived, each in FCFS order.
    #[test]
    fn backlogged_weighted_tenants_take_their_weight_per_round(
        tenants in proptest::collection::vec((1usize..12, 1u32..5), 1..5),
    ) {
        let now = Instant::now();
        let mut q = Queue::default();
        for (t, &(n, w)) in tenants.iter().enumerate() {
            for i in 0..n {
                q.push(0, t as u64, || Arc::from("t"), move || w, now, (t, i));
            }
        }
        let got: Vec<(usize, usize)> = q.drain().into_iter().map(|e| e.value).collect();
        let mut want = Vec::new();
        let mut next = vec![0usize; tenants.len()];
        while want.len() < got.len() {
            for (t, &(n, w)) in tenants.iter().enumerate() {
                for _ in 0..w {
                    if next[t] < n {
                        want.push((t, next[t]));
                        next[t] += 1;
                    }
                }
            }
        }
        prop_assert_eq!(got, want);
    }

    /// With every tenant of a band backlogged, no tenant is served twice before each other
    /// tenant is served once.
    #[test]
    fn backlogged_tenants_alternate(counts in proptest::collection::vec(1usize..6, 1..5)) {
        let now = Instant::now();
        let mut q = Queue::default();
        let max = *counts.iter().max().unwrap();
        for round in 0..max {
            for (t, &n) in counts.iter().enumerate() {
                if round < n {
                    q.push(0, t as u64, || Arc::from("t"), one, now, t);
                }
            }
        }
        let got: Vec<usize> = q.drain().into_iter().map(|e| e.value).collect();
        let mut want = Vec::new();
        for round in 0..max {
            for (t, &n) in counts.iter().enumerate() {
                if round < n {
                    want.push(t);
                }
            }
        }
        prop_assert_eq!(got, want);
    }
}
