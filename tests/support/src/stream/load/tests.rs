use super::*;
use crate::harness::http::Request;
use crate::stream::upstream::{serve, Pacing};
use std::net::TcpListener;

fn upstream(pacing: Pacing) -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    std::thread::spawn(move || serve(l, pacing, "u0"));
    addr
}

fn config(targets: Vec<SocketAddr>, connections: usize) -> LoadConfig {
    let request = Request::post("/v1/chat/completions", b"{}")
        .keep_alive()
        .encode("127.0.0.1");
    LoadConfig {
        targets,
        connections,
        threads: 2,
        request,
        client: ClientMode::Stream,
        connect_rate: 10_000,
        open_timeout: Duration::from_secs(20),
        warmup: Duration::from_millis(50),
        duration: Duration::from_millis(400),
        watch: vec![("me".into(), std::process::id())],
    }
}

#[test]
fn streams_every_event_from_the_upstreams_and_times_it() {
    let pacing = Pacing {
        events: 5,
        interval: Duration::from_millis(10),
        bulk: false,
    };
    let targets = vec![upstream(pacing), upstream(pacing)];
    let r = run(&config(targets, 6)).unwrap();
    let c = &r.counts;
    assert_eq!(
        (r.opened, c.bad_status, c.decode_errors, c.connect_errors),
        (6, 0, 0, 0)
    );
    // Counts only, no timing thresholds: a slow machine streams fewer answers, never none.
    assert!(c.events > 0 && c.answers > 0, "{c:?}");
    assert_eq!(c.delay_us.count(), c.events);
    assert!(c.gap_us.count() > 0 && c.gap_us.count() <= c.events);
    let line = result_line(&r);
    assert!(line.starts_with("RESULT connections=6 opened=6 "), "{line}");
    assert!(
        line.contains(" me_cpu_us=") && line.contains(" delay_p99_us="),
        "{line}"
    );
}

#[test]
fn idle_connections_send_nothing_and_stay_open() {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let mut cfg = config(vec![l.local_addr().unwrap()], 5);
    cfg.client = ClientMode::Idle;
    let r = run(&cfg).unwrap();
    assert_eq!((r.opened, r.still_open, r.counts.events), (5, 5, 0));
    drop(l);
}

/// Idle after an answer: one whole answer per connection, counted open at its end, then
/// nothing more on the connection (no second answer in the window).
#[test]
fn idle_after_an_answer_reads_one_answer_and_sends_nothing_more() {
    let pacing = Pacing {
        events: 3,
        interval: Duration::ZERO,
        bulk: true,
    };
    let mut cfg = config(vec![upstream(pacing)], 4);
    cfg.client = ClientMode::IdleAfterAnswer;
    let r = run(&cfg).unwrap();
    let c = &r.counts;
    assert_eq!((r.opened, r.still_open, c.bad_status), (4, 4, 0));
    assert_eq!(
        (c.events, c.answers),
        (0, 0),
        "nothing streams in the window"
    );
}

#[test]
fn a_refused_target_fails_with_the_count() {
    let gone = crate::loopback(crate::free_port());
    let mut cfg = config(vec![gone], 3);
    cfg.open_timeout = Duration::from_millis(300);
    let e = run(&cfg).unwrap_err();
    assert!(
        e.to_string().contains("only 0 of 3 connections open"),
        "{e}"
    );
}
