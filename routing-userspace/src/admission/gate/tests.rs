use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::AtomicBool;

use futures::FutureExt;
use proptest::prelude::*;

use super::*;
use crate::admission::budget::TokenBudget;
use crate::admission::tenant::Tenant;

const S: Duration = Duration::from_secs(1);

struct World {
    gate: Arc<ModelGate>,
    families: AdmissionFamilies,
    /// Requests the model may have admitted at once.
    cap: Arc<AtomicUsize>,
}

fn world(settings: GateSettings, cap: usize) -> World {
    let families = AdmissionFamilies::new();
    let cap = Arc::new(AtomicUsize::new(cap));
    let c = Arc::clone(&cap);
    let room: Arc<dyn Room> =
        Arc::new(move |admitted: Admitted| admitted.live < c.load(Ordering::SeqCst));
    let gate = ModelGate::new(
        Arc::from("m"),
        settings,
        room,
        &families,
        &AdmissionDefaults::default(),
    );
    World {
        gate,
        families,
        cap,
    }
}

impl World {
    fn free(&self, n: usize) {
        self.cap.fetch_add(n, Ordering::SeqCst);
        self.gate.notify();
    }

    fn admissions(&self) -> u64 {
        self.families.queue_wait_seconds.admitted("m")
    }

    fn rejected(&self, reason: &str) -> u64 {
        self.families
            .rejections_total
            .with_label_values(&["m", reason])
            .get()
    }

    fn depth(&self, priority: &str) -> i64 {
        self.families
            .queue_depth
            .with_label_values(&["m", priority])
            .get()
    }
}

fn class(priority: i32, tenant: &'static str) -> Class<'static> {
    Class {
        priority,
        tenant: Tenant::named(tenant),
    }
}

/// Run other tasks until `cond` holds (a bounded poll, never a sleep).
async fn until(what: &str, cond: impl Fn() -> bool) {
    for _ in 0..100_000 {
        if cond() {
            return;
        }
        tokio::task::yield_now().await;
    }
    panic!("never happened: {what}");
}

type Order = Arc<Mutex<Vec<&'static str>>>;

/// A client that records its name when admitted and ends its request at once.
fn client(
    gate: &Arc<ModelGate>,
    c: Class<'static>,
    name: &'static str,
    order: &Order,
) -> tokio::task::JoinHandle<Result<(), Rejection>> {
    let (gate, order) = (Arc::clone(gate), Arc::clone(order));
    tokio::spawn(async move {
        let permit = gate.admit(&c, 0).await?;
        order.lock().unwrap().push(name);
        drop(permit);
        Ok(())
    })
}

#[tokio::test(start_paused = true)]
async fn with_room_and_nobody_waiting_admission_is_immediate() {
    let w = world(GateSettings::default(), 2);
    let a = w
        .gate
        .admit(&Class::DEFAULT, 0)
        .now_or_never()
        .unwrap()
        .unwrap();
    let b = w
        .gate
        .admit(&Class::DEFAULT, 0)
        .now_or_never()
        .unwrap()
        .unwrap();
    assert_eq!(
        (a.waited(), w.gate.admitted().live, w.gate.queued()),
        (Duration::ZERO, 2, 0)
    );
    assert_eq!(a.model(), "m");
    // Full now: the third waits.
    let mut third = Box::pin(w.gate.admit(&Class::DEFAULT, 0));
    assert!(futures::poll!(&mut third).is_pending());
    assert_eq!(w.gate.queued(), 1);
    assert_eq!(w.depth("0"), 1);
    drop(a);
    let c = third.await.unwrap();
    assert_eq!(
        (w.gate.admitted().live, w.gate.queued(), w.depth("0")),
        (2, 0, 0)
    );
    drop((b, c));
    assert_eq!(w.gate.admitted().live, 0);
    assert_eq!(w.admissions(), 3);
}

#[tokio::test(start_paused = true)]
async fn requests_admitted_but_not_yet_in_the_gauges_count_as_starting() {
    // A room rule that reads a load gauge (two slots) and counts the admitted-but-not-started.
    let families = AdmissionFamilies::new();
    let in_flight = Arc::new(AtomicUsize::new(0));
    let gauge = Arc::clone(&in_flight);
    let room: Arc<dyn Room> =
        Arc::new(move |a: Admitted| gauge.load(Ordering::SeqCst) + a.starting < 2);
    let gate = ModelGate::new(
        Arc::from("m"),
        GateSettings::default(),
        room,
        &families,
        &AdmissionDefaults::default(),
    );
    let mut a = gate.admit(&Class::DEFAULT, 0).await.unwrap();
    let b = gate.admit(&Class::DEFAULT, 0).await.unwrap();
    assert_eq!(
        gate.admitted(),
        Admitted {
            live: 2,
            starting: 2
        }
    );
    // The gauge has seen neither yet, but the third must wait.
    let mut third = Box::pin(gate.admit(&Class::DEFAULT, 0));
    assert!(futures::poll!(&mut third).is_pending());
    // `a` reaches its pod: the gauge counts it, it is no longer starting.
    in_flight.fetch_add(1, Ordering::SeqCst);
    a.started();
    a.started();
    gate.notify();
    assert_eq!(
        gate.admitted(),
        Admitted {
            live: 2,
            starting: 1
        }
    );
    assert!(futures::poll!(&mut third).is_pending(), "still two in use");
    // `a` ends: its slot goes to the third.
    in_flight.fetch_sub(1, Ordering::SeqCst);
    drop(a);
    let c = third.await.unwrap();
    assert_eq!(
        gate.admitted(),
        Admitted {
            live: 2,
            starting: 2
        }
    );
    drop((b, c));
    assert_eq!(gate.admitted(), Admitted::default());
}

#[tokio::test(start_paused = true)]
async fn a_priority_10_request_behind_20_default_ones_is_the_next_admitted() {
    let w = world(GateSettings::default(), 1);
    let busy = w.gate.admit(&class(0, "a"), 0).await.unwrap();
    let order: Order = Arc::default();
    let mut clients = Vec::new();
    for _ in 0..20 {
        clients.push(client(&w.gate, class(0, "a"), "low", &order));
    }
    until("20 queued", || w.gate.queued() == 20).await;
    clients.push(client(&w.gate, class(10, "b"), "high", &order));
    until("21 queued", || w.gate.queued() == 21).await;
    assert_eq!((w.depth("0"), w.depth("10+")), (20, 1));
    drop(busy);
    for c in clients {
        c.await.unwrap().unwrap();
    }
    let order = order.lock().unwrap();
    assert_eq!(order.len(), 21);
    assert_eq!(order[0], "high");
}

#[tokio::test(start_paused = true)]
async fn tenants_take_turns_within_a_band_and_each_tenant_is_fcfs() {
    let w = world(GateSettings::default(), 1);
    let busy = w.gate.admit(&class(0, "x"), 0).await.unwrap();
    let order: Order = Arc::default();
    let mut clients = Vec::new();
    for (tenant, name) in [
        ("a", "a1"),
        ("a", "a2"),
        ("a", "a3"),
        ("a", "a4"),
        ("b", "b1"),
        ("b", "b2"),
        ("c", "c1"),
    ] {
        clients.push(client(&w.gate, class(0, tenant), name, &order));
        let n = clients.len();
        until("queued in arrival order", || w.gate.queued() == n).await;
    }
    drop(busy);
    for c in clients {
        c.await.unwrap().unwrap();
    }
    assert_eq!(
        *order.lock().unwrap(),
        ["a1", "b1", "c1", "a2", "b2", "a3", "a4"]
    );
}

#[tokio::test(start_paused = true)]
async fn a_waiter_leaves_with_queue_timeout_after_its_timeout_and_a_sheddable_one_sooner() {
    let w = world(GateSettings::default(), 0);
    let t0 = Instant::now();
    let (gate, gate2) = (Arc::clone(&w.gate), Arc::clone(&w.gate));
    let normal = tokio::spawn(async move { gate.admit(&class(0, "a"), 0).await });
    let sheddable = tokio::spawn(async move { gate2.admit(&class(-1, "a"), 0).await });
    match sheddable.await.unwrap() {
        Err(Rejection::QueueTimeout { waited, .. }) => assert_eq!(waited, 5 * S),
        other => panic!("{other:?}"),
    }
    assert_eq!(Instant::now() - t0, 5 * S);
    match normal.await.unwrap() {
        Err(Rejection::QueueTimeout {
            waited,
            retry_after,
        }) => {
            assert_eq!(waited, 30 * S);
            assert_eq!(
                retry_after,
                30 * S,
                "the queue takes its whole timeout to turn"
            );
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(Instant::now() - t0, 30 * S);
    assert_eq!((w.gate.queued(), w.rejected("queue_timeout")), (0, 2));
    assert_eq!((w.depth("0"), w.depth("sheddable")), (0, 0));
    // Room after the deadline admits nobody.
    w.free(5);
    assert_eq!((w.gate.admitted().live, w.admissions()), (0, 0));
}

#[tokio::test(start_paused = true)]
async fn a_dropped_waiter_leaves_at_once_and_is_never_admitted() {
    let w = world(GateSettings::default(), 0);
    let mut gone = Box::pin(w.gate.admit(&class(5, "a"), 0));
    assert!(futures::poll!(&mut gone).is_pending());
    let mut stays = Box::pin(w.gate.admit(&class(0, "b"), 0));
    assert!(futures::poll!(&mut stays).is_pending());
    assert_eq!(w.gate.queued(), 2);
    drop(gone);
    assert_eq!(
        w.gate.queued(),
        1,
        "out of the queue before anything else runs"
    );
    assert_eq!(w.depth("5"), 0);
    w.free(2);
    let permit = stays.await.unwrap();
    // One slot handed out in all, to the request still waiting.
    assert_eq!((w.gate.admitted().live, w.admissions()), (1, 1));
    let cancelled = w.families.cancelled_total.with_label_values(&["m"]).get();
    assert_eq!(cancelled, 1);
    drop(permit);

    // A spawned client whose task is aborted (its connection closed) leaves too.
    w.cap.store(0, Ordering::SeqCst);
    let gate = Arc::clone(&w.gate);
    let task = tokio::spawn(async move { gate.admit(&class(0, "c"), 0).await });
    until("queued", || w.gate.queued() == 1).await;
    task.abort();
    assert!(task.await.unwrap_err().is_cancelled());
    assert_eq!(w.gate.queued(), 0);
    w.free(1);
    assert_eq!((w.gate.admitted().live, w.admissions()), (0, 1));
}

#[tokio::test(start_paused = true)]
async fn a_full_queue_sheds_the_newest_lower_sheddable_request_or_refuses() {
    let settings = GateSettings {
        max_size: 3,
        ..GateSettings::default()
    };
    let w = world(settings, 0);
    let mut q: Vec<Pin<Box<dyn Future<Output = Answer>>>> = Vec::new();
    for c in [class(-1, "a"), class(-1, "a"), class(-2, "b")] {
        let g = Arc::clone(&w.gate);
        let mut f: Pin<Box<dyn Future<Output = Answer>>> =
            Box::pin(async move { g.admit(&c, 0).await });
        assert!(futures::poll!(&mut f).is_pending());
        q.push(f);
    }
    // A sheddable request of the same priority as the lowest finds no room.
    let refused = w.gate.admit(&class(-2, "c"), 0).now_or_never().unwrap();
    assert!(
        matches!(refused, Err(Rejection::QueueFull { .. })),
        "{refused:?}"
    );
    // Priority 0 makes room by shedding the lowest band's request.
    let g = Arc::clone(&w.gate);
    let mut high: Pin<Box<dyn Future<Output = Answer>>> =
        Box::pin(async move { g.admit(&class(0, "c"), 0).await });
    assert!(futures::poll!(&mut high).is_pending());
    let shed = q.remove(2).await;
    assert!(matches!(shed, Err(Rejection::Shed { .. })), "{shed:?}");
    // Next: -1 makes room too (the biggest tenant's newest is its second).
    let g = Arc::clone(&w.gate);
    let mut mid: Pin<Box<dyn Future<Output = Answer>>> =
        Box::pin(async move { g.admit(&class(0, "d"), 0).await });
    assert!(futures::poll!(&mut mid).is_pending());
    let shed = q.remove(1).await;
    assert!(matches!(shed, Err(Rejection::Shed { .. })), "{shed:?}");
    assert!(futures::poll!(&mut q[0]).is_pending(), "the oldest stays");
    // Full of 0, 0, -1: a 0 can still shed the -1; then nothing is sheddable.
    let mut e = Box::pin(w.gate.admit(&class(0, "e"), 0));
    assert!(futures::poll!(&mut e).is_pending());
    let shed = q.remove(0).await;
    assert!(matches!(shed, Err(Rejection::Shed { .. })), "{shed:?}");
    let refused = w.gate.admit(&class(50, "f"), 0).now_or_never().unwrap();
    assert!(
        matches!(refused, Err(Rejection::QueueFull { .. })),
        "{refused:?}"
    );
    assert_eq!((w.rejected("shed"), w.rejected("queue_full")), (3, 2));
    assert_eq!(w.gate.queued(), 3);
    // The survivors are served, in priority then arrival order.
    w.free(3);
    assert!(high.await.is_ok() && mid.await.is_ok() && e.await.is_ok());
}

#[tokio::test(start_paused = true)]
async fn a_queue_size_of_zero_never_queues() {
    let w = world(
        GateSettings {
            max_size: 0,
            ..GateSettings::default()
        },
        1,
    );
    let p = w.gate.admit(&Class::DEFAULT, 0).await.unwrap();
    let r = w.gate.admit(&Class::DEFAULT, 0).now_or_never().unwrap();
    match r {
        Err(Rejection::QueueFull { retry_after }) => assert_eq!(retry_after, S),
        other => panic!("{other:?}"),
    }
    drop(p);
}

#[tokio::test(start_paused = true)]
async fn room_that_appears_without_a_notify_is_found_by_the_recheck() {
    let families = AdmissionFamilies::new();
    let open = Arc::new(AtomicBool::new(false));
    let o = Arc::clone(&open);
    let room: Arc<dyn Room> = Arc::new(move |_: Admitted| o.load(Ordering::SeqCst));
    let gate = ModelGate::new(
        Arc::from("m"),
        GateSettings::default(),
        room,
        &families,
        &AdmissionDefaults::default(),
    );
    let g = Arc::clone(&gate);
    let t0 = Instant::now();
    let waiter = tokio::spawn(async move { g.admit(&Class::DEFAULT, 0).await.map(|p| p.waited()) });
    until("queued", || gate.queued() == 1).await;
    tokio::time::advance(Duration::from_millis(100)).await;
    // Another node's requests ended: the loads fell, nobody told this gate.
    open.store(true, Ordering::SeqCst);
    let waited = waiter.await.unwrap().unwrap();
    assert!(waited >= Duration::from_millis(100), "{waited:?}");
    assert!(
        waited <= Duration::from_millis(100) + RECHECK_EVERY,
        "{waited:?}"
    );
    assert!(Instant::now() - t0 <= Duration::from_millis(100) + RECHECK_EVERY);
    // Its next round finds the queue empty and stops.
    tokio::time::advance(RECHECK_EVERY).await;
    until("the re-check stops with the queue empty", || {
        !gate.lock().ticking
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn token_budgets_charge_the_estimate_refund_and_correct_from_usage() {
    let settings = GateSettings {
        budget: Some(TokenBudget {
            tokens_per_minute: 600,
            burst: 100,
        }),
        ..GateSettings::default()
    };
    let w = world(settings, 10);
    let a = class(0, "a");
    let mut first = w.gate.admit(&a, 60).await.unwrap();
    assert_eq!(first.charged(), Some(60));
    // 40 left; 60 more needs 20 more at 10 a second.
    match w.gate.admit(&a, 60).await {
        Err(Rejection::RateLimited { retry_after }) => assert_eq!(retry_after, 2 * S),
        other => panic!("{other:?}"),
    }
    // The answer used 10: 50 back, and 90 now covers 60.
    first.correct_tokens(10);
    first.correct_tokens(999);
    assert_eq!(first.charged(), None, "corrected once");
    let second = w.gate.admit(&a, 60).await.unwrap();
    // Another tenant has a bucket of its own.
    let other = w.gate.admit(&class(0, "b"), 100).await.unwrap();
    drop((first, second, other));
    let tokens = |t: &str| {
        w.families
            .tokens_charged_total
            .with_label_values(&["m", t])
            .get()
    };
    // a: 10 (corrected) + 60 (dropped uncorrected: the estimate stays); b: 100.
    assert_eq!((tokens("a"), tokens("b")), (70, 100));
    assert_eq!(w.rejected("rate_limited"), 1);

    // A charge is given back when the request is not served.
    w.cap.store(0, Ordering::SeqCst);
    let mut waiting = Box::pin(w.gate.admit(&class(0, "c"), 100));
    assert!(futures::poll!(&mut waiting).is_pending());
    drop(waiting);
    let view = w.gate.view();
    assert_eq!(view.budget.as_ref().unwrap().tokens_per_minute, 600);
    w.cap.store(1, Ordering::SeqCst);
    let again = w.gate.admit(&class(0, "c"), 100).await;
    assert!(
        again.is_ok(),
        "the refund restored the full burst: {again:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_drain_serves_what_room_allows_and_answers_the_rest_503_by_the_deadline() {
    let w = world(GateSettings::default(), 1);
    let busy = w.gate.admit(&Class::DEFAULT, 0).await.unwrap();
    let mut clients = Vec::new();
    for i in 0..4 {
        let g = Arc::clone(&w.gate);
        // Each holds its permit (its request runs past the drain).
        clients.push(tokio::spawn(
            async move { g.admit(&class(i, "a"), 0).await },
        ));
    }
    until("4 queued", || w.gate.queued() == 4).await;
    let t0 = Instant::now();
    let deadline = t0 + 10 * S;
    let gate = Arc::clone(&w.gate);
    let drain = tokio::spawn(async move { gate.close(deadline).await });
    until("closing", || w.gate.view().closing).await;
    // A new request that would have to wait is answered at once.
    let late = w.gate.admit(&Class::DEFAULT, 0).now_or_never().unwrap();
    assert!(matches!(late, Err(Rejection::Shutdown)), "{late:?}");
    // One request ends during the drain: one waiting request is served.
    tokio::time::advance(2 * S).await;
    drop(busy);
    let answered = drain.await.unwrap();
    assert_eq!(Instant::now(), deadline);
    assert_eq!(answered, 3);
    let mut served = Vec::new();
    let mut refused = 0;
    for c in clients {
        match c.await.unwrap() {
            Ok(permit) => {
                assert_eq!(permit.waited(), 2 * S);
                served.push(permit);
            }
            Err(Rejection::Shutdown) => refused += 1,
            Err(other) => panic!("{other:?}"),
        }
    }
    assert_eq!((served.len(), refused), (1, 3));
    assert_eq!(w.rejected("proxy_shutdown"), 4);
    assert_eq!(w.gate.queued(), 0);
}

#[tokio::test(start_paused = true)]
async fn a_drain_with_an_empty_queue_returns_at_once() {
    let w = world(GateSettings::default(), 1);
    let t0 = Instant::now();
    assert_eq!(w.gate.close(t0 + 30 * S).await, 0);
    assert_eq!(Instant::now(), t0);
    // While draining, a request that finds room is still served.
    assert!(w.gate.admit(&Class::DEFAULT, 0).await.is_ok());
}

#[tokio::test(start_paused = true)]
async fn a_removed_model_answers_its_waiters_and_refuses_new_requests() {
    let w = world(GateSettings::default(), 0);
    let mut waiting = Box::pin(w.gate.admit(&Class::DEFAULT, 0));
    assert!(futures::poll!(&mut waiting).is_pending());
    assert_eq!(w.gate.remove(), 1);
    assert!(matches!(waiting.await, Err(Rejection::ModelRemoved)));
    let r = w.gate.admit(&Class::DEFAULT, 0).now_or_never().unwrap();
    assert!(matches!(r, Err(Rejection::ModelRemoved)));
}

#[tokio::test(start_paused = true)]
async fn new_settings_keep_the_waiters_and_new_room_lets_them_in() {
    let w = world(GateSettings::default(), 0);
    let mut waiting = Box::pin(w.gate.admit(&Class::DEFAULT, 0));
    assert!(futures::poll!(&mut waiting).is_pending());
    let room: Arc<dyn Room> = Arc::new(|_: Admitted| true);
    let settings = GateSettings {
        max_size: 5,
        ..GateSettings::default()
    };
    w.gate.update(settings, room);
    assert!(waiting.await.is_ok());
    assert_eq!(w.gate.view().max_size, 5);
}

#[tokio::test(start_paused = true)]
async fn the_view_shows_bands_tenants_and_the_oldest_wait() {
    let w = world(GateSettings::default(), 0);
    let mut futs: Vec<Pin<Box<dyn Future<Output = Answer>>>> = Vec::new();
    for c in [class(0, "a"), class(0, "a"), class(0, "b"), class(7, "c")] {
        let g = Arc::clone(&w.gate);
        let mut f: Pin<Box<dyn Future<Output = Answer>>> =
            Box::pin(async move { g.admit(&c, 0).await });
        assert!(futures::poll!(&mut f).is_pending());
        futs.push(f);
        tokio::time::advance(S).await;
    }
    let v = w.gate.view();
    assert_eq!((v.queued, v.admitted, v.oldest_wait_ms), (4, 0, Some(4000)));
    assert_eq!(v.bands.len(), 2);
    assert_eq!((v.bands[0].priority, v.bands[0].depth), (7, 1));
    assert_eq!(v.bands[1].tenants, 2);
    assert_eq!(v.bands[1].top_tenants[0].tenant, "a");
    assert_eq!(v.bands[1].top_tenants[0].depth, 2);
    assert!(v.budget.is_none());
    let json = serde_json::to_value(&v).unwrap();
    assert_eq!(json["bands"][1]["oldest_wait_ms"], 4000);
}

/// One step of the property test.
#[derive(Debug, Clone)]
enum Step {
    Arrive {
        priority: i32,
        tenant: u8,
    },
    /// Room for one more request.
    Free,
    /// An admitted request ends.
    End(usize),
    /// A waiting client goes away.
    Cancel(usize),
    Advance(u64),
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        4 => (-2i32..3, 0u8..3).prop_map(|(priority, tenant)| Step::Arrive { priority, tenant }),
        2 => Just(Step::Free),
        2 => any::<usize>().prop_map(Step::End),
        1 => any::<usize>().prop_map(Step::Cancel),
        1 => (0u64..8_000).prop_map(Step::Advance),
    ]
}

const TENANTS: [&str; 3] = ["t0", "t1", "t2"];

struct Pending {
    id: usize,
    priority: i32,
    fut: Pin<Box<dyn Future<Output = Answer>>>,
}

#[derive(Default)]
struct Tally {
    arrived: usize,
    admitted: usize,
    rejected: usize,
    cancelled: usize,
}

/// What one round of polls saw: (id, priority) of the admitted, (priority, why) of the refused.
type Seen = (Vec<(usize, i32)>, Vec<(i32, Rejection)>);

/// Poll every waiting client once; the ones that got an answer leave `pending`.
fn poll_all(
    pending: &mut Vec<Pending>,
    held: &mut Vec<AdmissionPermit>,
    tally: &mut Tally,
) -> Seen {
    let mut admitted = Vec::new();
    let mut rejected = Vec::new();
    pending.retain_mut(|p| match (&mut p.fut).now_or_never() {
        None => true,
        Some(Ok(permit)) => {
            held.push(permit);
            tally.admitted += 1;
            admitted.push((p.id, p.priority));
            false
        }
        Some(Err(r)) => {
            tally.rejected += 1;
            rejected.push((p.priority, r));
            false
        }
    });
    (admitted, rejected)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Over random arrivals, room, ends, cancellations and time: never more admitted than
    /// room, each request ends exactly once (admitted, refused or cancelled), what leaves the
    /// queue for room is of the highest waiting priority, sheds hit the lowest, and with room
    /// at last nobody is left behind.
    #[test]
    fn admission_respects_room_priority_and_loses_nothing(
        steps in proptest::collection::vec(step(), 1..120)
    ) {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .unwrap();
        rt.block_on(async move {
            let settings = GateSettings {
                max_size: 6,
                timeout: 10 * S,
                sheddable_timeout: 3 * S,
                ..GateSettings::default()
            };
            let w = world(settings, 1);
            let mut pending: Vec<Pending> = Vec::new();
            let mut held: Vec<AdmissionPermit> = Vec::new();
            let mut tally = Tally::default();
            for step in steps {
                let before: Vec<i32> = pending.iter().map(|p| p.priority).collect();
                let mut freed = false;
                match step {
                    Step::Arrive { priority, tenant } => {
                        // The request enters at the call, as a proxy's would.
                        let c = class(priority, TENANTS[tenant as usize]);
                        pending.push(Pending {
                            id: tally.arrived,
                            priority,
                            fut: Box::pin(w.gate.admit(&c, 0)),
                        });
                        tally.arrived += 1;
                    }
                    Step::Free => {
                        w.free(1);
                        freed = true;
                    }
                    Step::End(i) => {
                        if !held.is_empty() {
                            drop(held.swap_remove(i % held.len()));
                            freed = true;
                        }
                    }
                    Step::Cancel(i) => {
                        if !pending.is_empty() {
                            drop(pending.swap_remove(i % pending.len()));
                            tally.cancelled += 1;
                        }
                    }
                    Step::Advance(ms) => tokio::time::advance(Duration::from_millis(ms)).await,
                }
                let (admitted, rejected) = poll_all(&mut pending, &mut held, &mut tally);
                if freed {
                    prop_assert!(admitted.len() <= 1, "one slot, one admission: {admitted:?}");
                    if let Some((_, p)) = admitted.first() {
                        let top = before.iter().copied().max().unwrap();
                        prop_assert_eq!(*p, top, "the highest waiting priority goes first");
                    }
                }
                if let Step::Arrive { priority, .. } = step {
                    for (p, r) in &rejected {
                        if matches!(r, Rejection::Shed { .. }) {
                            prop_assert!(*p < 0 && *p < priority);
                            prop_assert_eq!(Some(p), before.iter().min(), "the lowest is shed");
                        }
                    }
                }
                prop_assert!(w.gate.admitted().live <= w.cap.load(Ordering::SeqCst));
                prop_assert_eq!(w.gate.admitted().live, held.len());
                prop_assert_eq!(w.gate.queued(), pending.len());
            }
            // Room for everyone: every waiting request that has time left gets in.
            w.free(1_000);
            poll_all(&mut pending, &mut held, &mut tally);
            prop_assert!(pending.is_empty(), "{} left waiting", pending.len());
            prop_assert_eq!(tally.arrived, tally.admitted + tally.rejected + tally.cancelled);
            prop_assert_eq!(w.admissions() as usize, tally.admitted);
            drop(held);
            prop_assert_eq!(w.gate.admitted().live, 0);
            Ok(())
        })?;
    }
}
