//! Every least-loaded reservation ends exactly once, consumed or expired, on every path a
//! request can take: straight to its pick, retried past a pod that refuses connections, down to
//! the Service, and through a least-loaded label group (member and pod reservations both).
//!
//! Per model, `reservations_total = consumed_total + expired_total` once nothing is pending, and
//! each path lands where it should: a pick that served is consumed, a pick that could not be
//! reached expired at once (it does not linger as load on a dead pod for the TTL).

use std::time::Duration;

use flexinfer_tests::{
    chat_body, free_port, loopback, metric_value, pending_reservations, post, start_proxy,
    start_sim, ModelEntry, ModelsFile, TempDir,
};

fn count(metrics: &str, family: &str, model: &str) -> u64 {
    metric_value(metrics, family, &[("model", model)]).unwrap_or(0.0) as u64
}

/// (made, consumed, expired) of a model.
fn ledger(metrics: &str, model: &str) -> (u64, u64, u64) {
    (
        count(
            metrics,
            "flexinfer_proxy_least_loaded_reservations_total",
            model,
        ),
        count(
            metrics,
            "flexinfer_proxy_least_loaded_reservations_consumed_total",
            model,
        ),
        count(
            metrics,
            "flexinfer_proxy_least_loaded_reservations_expired_total",
            model,
        ),
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn each_reservation_is_consumed_or_expired_exactly_once() {
    let dir = TempDir::new("reservations");
    let a = start_sim("a", &[], dir.path()).await;
    let b = start_sim("b", &[], dir.path()).await;
    let svc = start_sim("svc", &[], dir.path()).await;
    // Ports nothing listens on: connections are refused.
    let dead = loopback(free_port());
    let dead2 = loopback(free_port());
    let models = ModelsFile::new()
        .model(
            ModelEntry::new("retry")
                .routing("least-loaded")
                .endpoint(dead)
                .endpoint(a.addr)
                .endpoint(b.addr)
                .service_at(svc.addr),
        )
        .model(
            ModelEntry::new("to-service")
                .routing("least-loaded")
                .endpoint(dead)
                .endpoint(dead2)
                .service_at(svc.addr),
        )
        .model(
            ModelEntry::new("m-live")
                .routing("least-loaded")
                .service_label("grp")
                .endpoint(a.addr),
        )
        .model(
            ModelEntry::new("m-dead")
                .routing("least-loaded")
                .service_label("grp")
                .endpoint(dead2)
                .service_at(svc.addr),
        );
    let proxy = start_proxy(
        &models,
        // Ejection off: the dead pods stay candidates, so every pick of them is a reservation
        // that must expire (ejection has its own tests).
        &[
            "--label-group-routing",
            "least-loaded",
            "--eject-after-failures",
            "0",
        ],
        &[],
        dir.path(),
    )
    .await;

    // Sequential requests rotate over the idle pods, so the dead one is picked a third of the
    // time; concurrent ones overlap their reservations.
    let mut pods = std::collections::HashMap::new();
    for i in 0..30 {
        let r = post(
            proxy.addr,
            "/v1/chat/completions",
            &[],
            &chat_body("retry", None, &format!("q{i}"), ""),
        )
        .await
        .unwrap();
        assert_eq!(r.status, 200, "{}", r.text());
        *pods.entry(r.pod()).or_insert(0) += 1;
    }
    let burst: Vec<_> = (0..20)
        .map(|i| {
            let addr = proxy.addr;
            tokio::spawn(async move {
                post(
                    addr,
                    "/v1/chat/completions",
                    &[],
                    &chat_body("retry", None, &format!("b{i}"), ""),
                )
                .await
            })
        })
        .collect();
    for t in burst {
        assert_eq!(t.await.unwrap().unwrap().status, 200);
    }
    for i in 0..10 {
        let r = post(
            proxy.addr,
            "/v1/chat/completions",
            &[],
            &chat_body("to-service", None, &format!("s{i}"), ""),
        )
        .await
        .unwrap();
        assert_eq!((r.status.as_u16(), r.pod()), (200, "svc".into()));
    }
    let mut members = std::collections::HashMap::new();
    for i in 0..20 {
        let r = post(
            proxy.addr,
            "/v1/chat/completions",
            &[],
            &chat_body("grp", None, &format!("g{i}"), ""),
        )
        .await
        .unwrap();
        assert_eq!(r.status, 200, "{}", r.text());
        *members.entry(r.pod()).or_insert(0) += 1;
    }
    let live = flexinfer_tests::get(proxy.admin, "/debug/routing")
        .await
        .unwrap()
        .text()
        .to_owned();
    assert_eq!(
        (members.get("a").copied(), members.get("svc").copied()),
        (Some(10), Some(10)),
        "the least-loaded group alternates its idle members: {members:?}; routing view: {live}"
    );

    // Every request has its answer, so every reservation has ended; a pick that failed ends
    // its reservation as the retry moves on, which may trail the answer by a moment.
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    let mut pending = pending_reservations(proxy.admin).await;
    while pending != 0 && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(25)).await;
        pending = pending_reservations(proxy.admin).await;
    }
    assert_eq!(pending, 0, "nothing pending");
    let m = proxy.metrics().await;

    // Retried past the dead pod: its picks expired at once, the others were consumed.
    let (made, consumed, expired) = ledger(&m, "retry");
    assert_eq!(made, 50, "one reservation per pick");
    assert_eq!(
        made,
        consumed + expired,
        "retry: {made} = {consumed} + {expired}"
    );
    assert!(
        expired >= 10,
        "the dead pod was picked and its reservation ended: {expired}"
    );
    assert_eq!(pods.len(), 2, "a and b served everything: {pods:?}");

    // Every pod dead: each pick expired, every request went to the Service.
    assert_eq!(ledger(&m, "to-service"), (10, 0, 10));

    // The label group: each request made a member reservation (consumed when it started on
    // any target of that member) and a pod reservation of the member's own pick (consumed on
    // m-live's pod; expired on m-dead's refusing pod, whose requests then went to its Service).
    let (made, consumed, expired) = ledger(&m, "m-live");
    assert_eq!((made, consumed, expired), (20, 20, 0), "10 member + 10 pod");
    let (made, consumed, expired) = ledger(&m, "m-dead");
    assert_eq!(
        (made, consumed, expired),
        (20, 10, 10),
        "10 member consumed + 10 pod expired"
    );
}
