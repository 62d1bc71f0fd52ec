use std::sync::Arc;

use super::*;

const S: Slot = 3;

/// A store over a gauge of this process's requests, which the tests start and end.
fn store_with(staleness: Duration) -> (SignalStore, Arc<UserspaceGauge>) {
    let local = Arc::new(UserspaceGauge::default());
    (SignalStore::new(staleness, Arc::clone(&local)), local)
}

fn counts(running: Option<u64>, waiting: Option<u64>) -> EngineReport {
    EngineReport {
        running,
        waiting,
        kv_usage: None,
    }
}

fn kv(kv: f64) -> EngineReport {
    EngineReport {
        kv_usage: Some(kv),
        ..EngineReport::default()
    }
}

fn secs(s: f64) -> Duration {
    Duration::from_secs_f64(s)
}

#[test]
fn a_report_counts_until_it_is_stale() {
    let (store, _local) = store_with(secs(2.0));
    let t0 = Instant::now();
    assert_eq!(store.load(S, 1, t0), 1, "no report: the node-local count");
    store.report(S, &counts(Some(3), Some(2)), Source::InBand, t0);
    assert_eq!(store.load(S, 1, t0), 5);
    assert_eq!(store.load(S, 1, t0 + secs(1.999)), 5);
    assert_eq!(store.load(S, 1, t0 + secs(2.0)), 1, "stale");
    assert_eq!(store.load(S, 1, t0 + secs(60.0)), 1);
}

#[test]
fn the_node_count_is_a_floor() {
    let (store, _local) = store_with(DEFAULT_STALENESS);
    let t0 = Instant::now();
    store.report(S, &counts(Some(1), Some(0)), Source::InBand, t0);
    assert_eq!(store.load(S, 7, t0), 7);
    assert_eq!(store.load(S, 0, t0), 1);
}

#[test]
fn this_processs_requests_since_the_report_move_its_count() {
    let (store, local) = store_with(DEFAULT_STALENESS);
    let t0 = Instant::now();
    let earlier = [local.enter(S), local.enter(S)];
    store.report(S, &counts(Some(3), Some(1)), Source::InBand, t0);
    assert_eq!(
        store.load(S, 0, t0),
        4,
        "earlier requests are in the engine's count"
    );
    let later = [local.enter(S), local.enter(S)];
    assert_eq!(store.load(S, 0, t0), 6);
    // Another pod's requests do not count here.
    let _other = local.enter(S + 1);
    assert_eq!(store.load(S, 0, t0), 6);
    // Requests that end take their share away again, earlier ones included: one after
    // another, requests never pile up in the estimate.
    drop(later);
    assert_eq!(store.load(S, 0, t0), 4);
    drop(earlier);
    assert_eq!(store.load(S, 0, t0), 2);
    for _ in 0..100 {
        drop(local.enter(S));
    }
    assert_eq!(store.load(S, 0, t0), 2);
}

#[test]
fn a_stamp_taken_before_asking_counts_starts_during_the_scrape() {
    let (store, local) = store_with(DEFAULT_STALENESS);
    let t0 = Instant::now();
    let stamp = store.stamp(S, Source::Scrape, t0);
    let _during = local.enter(S);
    store.record(S, &counts(Some(2), Some(0)), stamp, secs(5.0));
    assert_eq!(store.load(S, 0, t0), 3);
    assert_eq!(store.load(S, 0, t0 + secs(4.9)), 3, "its own validity");
    assert_eq!(store.load(S, 0, t0 + secs(5.0)), 0);
}

#[test]
fn sources_keep_their_own_report() {
    let (store, local) = store_with(secs(2.0));
    let t0 = Instant::now();
    store.record(
        S,
        &counts(Some(10), Some(0)),
        store.stamp(S, Source::Scrape, t0),
        secs(5.0),
    );
    // vLLM's in-band report: waiting and KV only. It does not erase the running count.
    store.report(
        S,
        &EngineReport {
            running: None,
            waiting: Some(2),
            kv_usage: Some(0.3),
        },
        Source::InBand,
        t0 + secs(0.5),
    );
    assert_eq!(store.load(S, 0, t0 + secs(1.0)), 10);
    let _started = local.enter(S);
    assert_eq!(store.load(S, 0, t0 + secs(1.0)), 11);
    // The in-band one ages out first; the scraped one still counts.
    assert_eq!(store.load(S, 0, t0 + secs(3.0)), 11);
    let v = store.snapshot(S, t0 + secs(3.0)).unwrap();
    assert!(!v.inband.unwrap().fresh && v.scrape.unwrap().fresh);
}

#[test]
fn a_report_without_counts_is_no_load() {
    let (store, local) = store_with(DEFAULT_STALENESS);
    let t0 = Instant::now();
    store.report(S, &kv(0.9), Source::InBand, t0);
    let _started = local.enter(S);
    assert_eq!(store.load(S, 0, t0), 0);
    // And an empty report changes nothing.
    store.report(S, &counts(Some(4), None), Source::InBand, t0);
    store.report(S, &EngineReport::default(), Source::InBand, t0);
    assert_eq!(store.load(S, 0, t0), 4);
}

#[test]
fn full_pods() {
    let (store, _local) = store_with(DEFAULT_STALENESS);
    let t0 = Instant::now();
    assert!(!store.is_full(S, t0, 0, 0.5), "nothing known: not full");
    store.report(S, &counts(Some(8), Some(3)), Source::InBand, t0);
    assert!(store.is_full(S, t0, 2, 0.95));
    assert!(!store.is_full(S, t0, 3, 0.95));
    assert!(!store.is_full(S, t0 + secs(2.0), 2, 0.95), "stale");
    store.report(S, &kv(0.97), Source::InBand, t0 + secs(3.0));
    assert!(store.is_full(S, t0 + secs(3.0), 100, 0.95));
    assert!(!store.is_full(S, t0 + secs(3.0), 100, 0.97));
}

#[test]
fn the_freshest_report_of_a_field_decides_fullness() {
    let (store, _local) = store_with(secs(1.0));
    let t0 = Instant::now();
    let stamp = store.stamp(S, Source::Scrape, t0);
    store.record(S, &counts(Some(8), Some(20)), stamp, secs(10.0));
    assert!(store.is_full(S, t0 + secs(0.5), 5, 1.0));
    // A newer in-band report says the queue drained.
    store.report(S, &counts(None, Some(0)), Source::InBand, t0 + secs(0.5));
    assert!(!store.is_full(S, t0 + secs(1.0), 5, 1.0));
    // Once it is stale, the older scraped one is the freshest again.
    assert!(store.is_full(S, t0 + secs(1.6), 5, 1.0));
}

#[test]
fn a_reported_queue_makes_its_pod_full_for_a_short_while_only() {
    let (store, _local) = store_with(DEFAULT_STALENESS);
    let t0 = Instant::now();
    store.report(S, &counts(Some(8), Some(20)), Source::InBand, t0);
    assert!(store.is_full(S, t0 + secs(1.9), 5, 1.0));
    // The report still gives the pod's load, but no longer keeps requests off it: a full pod
    // gets none from this node, so none of its answers could refresh the report.
    let later = t0 + QUEUE_STATE_FRESHNESS;
    assert!(!store.is_full(S, later, 5, 1.0));
    assert_eq!(store.queue_state(S, later), (None, None));
    assert_eq!(store.load(S, 0, later), 28);
}

#[test]
fn scrapes_are_wanted_unless_a_complete_in_band_report_came_within_the_interval() {
    let (store, _local) = store_with(DEFAULT_STALENESS);
    let t0 = Instant::now();
    let every = secs(4.0);
    assert!(store.wants_scrape(S, t0, every));
    store.report(S, &counts(None, Some(1)), Source::InBand, t0);
    assert!(
        store.wants_scrape(S, t0, every),
        "vLLM's report has no running count"
    );
    store.report(S, &counts(Some(2), Some(1)), Source::InBand, t0);
    assert!(!store.wants_scrape(S, t0, every));
    assert!(!store.wants_scrape(S, t0 + secs(3.9), every));
    assert!(
        store.wants_scrape(S, t0 + secs(4.0), every),
        "one interval old: read the page"
    );
    assert!(
        !store.wants_scrape(MAX_SLOTS as Slot, t0, every),
        "no such slot"
    );
}

#[test]
fn the_newest_report_with_a_running_count_is_the_load() {
    let (store, _local) = store_with(secs(30.0));
    let t0 = Instant::now();
    let stamp = store.stamp(S, Source::Scrape, t0);
    store.record(S, &counts(Some(9), Some(3)), stamp, secs(30.0));
    assert_eq!(store.load(S, 1, t0 + secs(1.0)), 12);
    // A newer in-band report says the pod drained: it replaces the higher, older one.
    store.report(S, &counts(Some(2), Some(0)), Source::InBand, t0 + secs(1.0));
    assert_eq!(store.load(S, 1, t0 + secs(1.0)), 2);
    // As it ages, the other nodes' part it sampled gives way to the pod's average over its
    // reports (12, then 2: 9.5): after 1 s, 0.6 of the way is left (4.9).
    assert_eq!(store.load(S, 1, t0 + secs(2.0)), 5);
    assert_eq!(store.snapshot(S, t0).unwrap().others_average, Some(9.5));
    // A report with no running count (vLLM's in-band) says nothing of the load.
    store.report(S, &counts(None, Some(0)), Source::InBand, t0 + secs(3.0));
    assert_eq!(
        store.load(S, 1, t0 + secs(4.0)),
        10,
        "the scraped one stands, 4 s old: 12 most of the way to 9.5 (10.0)"
    );
    assert_eq!(store.snapshot(S, t0).unwrap().others_average, Some(9.5));
    // Never below this node's own count.
    assert_eq!(store.load(S, 20, t0 + secs(4.0)), 20);
}

#[test]
fn this_processs_own_requests_are_counted_as_they_are_now_however_old_the_report() {
    let (store, local) = store_with(secs(30.0));
    let t0 = Instant::now();
    // Two reports: others had 6, then 2 (average 5).
    let mine = local.enter(S);
    store.report(S, &counts(Some(7), None), Source::InBand, t0);
    store.report(S, &counts(Some(3), None), Source::InBand, t0);
    assert_eq!(store.load(S, 0, t0), 3, "1 of mine + 2 of the others");
    drop(mine);
    assert_eq!(store.load(S, 0, t0), 2, "mine ended: the others' 2");
    let _three = [local.enter(S), local.enter(S), local.enter(S)];
    assert_eq!(
        store.load(S, 0, t0 + secs(28.0)),
        3 + 5,
        "the others' average, nearly"
    );
}

#[test]
fn reset_forgets_the_previous_pod() {
    let (store, _local) = store_with(DEFAULT_STALENESS);
    let t0 = Instant::now();
    store.report(S, &counts(Some(5), Some(5)), Source::InBand, t0);
    let stamp = store.stamp(S, Source::Scrape, t0);
    store.record(S, &counts(Some(5), Some(5)), stamp, secs(5.0));
    store.reset(S);
    assert_eq!(store.load(S, 1, t0), 1);
    assert_eq!(store.snapshot(S, t0).unwrap().others_average, None);
    assert!(!store.is_full(S, t0, 0, 0.0));
    let v = store.snapshot(S, t0).unwrap();
    assert_eq!((v.inband, v.scrape), (None, None));
    // It works again for the new pod.
    store.report(S, &counts(Some(1), Some(0)), Source::InBand, t0);
    assert_eq!(store.load(S, 0, t0), 1);
}

#[test]
fn snapshot_shows_ages_and_this_processs_requests() {
    let (store, local) = store_with(DEFAULT_STALENESS);
    let t0 = Instant::now();
    assert_eq!(
        store.snapshot(S, t0),
        Some(SignalView {
            in_flight_here: 0,
            others_average: None,
            inband: None,
            scrape: None
        })
    );
    store.report(
        S,
        &EngineReport {
            running: Some(2),
            waiting: None,
            kv_usage: Some(0.25),
        },
        Source::InBand,
        t0,
    );
    let _started = local.enter(S);
    let v = store.snapshot(S, t0 + secs(1.5)).unwrap();
    assert_eq!(
        v.inband,
        Some(ReportView {
            running: Some(2),
            waiting: None,
            kv_usage: Some(0.25),
            age_seconds: 1.5,
            fresh: true,
            in_flight_here_then: 0,
        })
    );
    assert_eq!(v.in_flight_here, 1);
    let json = serde_json::to_value(v).unwrap();
    assert_eq!(json["inband"]["kv_usage"], 0.25);
    assert!(json["scrape"].is_null());
    assert_eq!(store.snapshot(MAX_SLOTS as Slot, t0), None);
}

#[test]
fn slots_past_capacity_are_ignored() {
    let (store, local) = store_with(DEFAULT_STALENESS);
    let t0 = Instant::now();
    let past = MAX_SLOTS as Slot;
    let _ignored = local.enter(past);
    store.report(past, &counts(Some(9), Some(9)), Source::InBand, t0);
    store.reset(past);
    assert_eq!(store.load(past, 2, t0), 2);
    assert!(!store.is_full(past, t0, 0, 0.0));
}

#[test]
fn concurrent_writes_never_tear_a_read() {
    let store = Arc::new(store_with(Duration::from_secs(3600)).0);
    let t0 = Instant::now();
    let writers: Vec<_> = (0..3u64)
        .map(|w| {
            let store = Arc::clone(&store);
            std::thread::spawn(move || {
                for i in 0..20_000u64 {
                    let n = w * 100_000 + i;
                    let r = EngineReport {
                        running: Some(n),
                        waiting: Some(n),
                        kv_usage: Some((n % 1000) as f64 / 1000.0),
                    };
                    store.report(S, &r, Source::InBand, t0);
                }
            })
        })
        .collect();
    let mut reads = 0;
    while writers.iter().any(|w| !w.is_finished()) || reads < 1000 {
        if let Some(v) = store.snapshot(S, t0).and_then(|v| v.inband) {
            let (r, w, k) = (v.running.unwrap(), v.waiting.unwrap(), v.kv_usage.unwrap());
            assert_eq!(r, w, "a torn read");
            assert_eq!(k, (r % 1000) as f64 / 1000.0, "a torn read");
            reads += 1;
        }
    }
    for w in writers {
        w.join().unwrap();
    }
    assert!(reads >= 1000);
}
