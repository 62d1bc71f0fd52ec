use super::*;
use crate::harness::http::{Conn, Request, Timeouts};
use crate::stream::wire::stamp_of;
use std::net::SocketAddr;

fn start(pacing: Pacing) -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    std::thread::spawn(move || serve(l, pacing, "u0"));
    addr
}

/// One streamed answer on `conn`: the stamps of its data events and whether it ended.
fn answer(conn: &mut Conn) -> (Vec<Option<u64>>, bool) {
    conn.send(&Request::post("/v1/chat/completions", b"{}").keep_alive())
        .unwrap();
    let head = conn.head().unwrap();
    assert_eq!(head.status, 200);
    assert_eq!(head.header("x-upstream"), Some("u0"));
    let mut events = conn.events(&head);
    let mut stamps = Vec::new();
    while let Some(ev) = events.next_event().unwrap() {
        stamps.push(stamp_of(ev.data.as_bytes()));
    }
    (stamps, events.complete())
}

#[test]
fn paced_answers_come_one_after_another_on_one_connection() {
    let addr = start(Pacing {
        events: 3,
        interval: Duration::from_millis(5),
        bulk: false,
    });
    let mut conn = Conn::connect(addr, Timeouts::default()).unwrap();
    for _ in 0..2 {
        let (stamps, complete) = answer(&mut conn);
        assert!(complete);
        assert_eq!(
            stamps.len(),
            5,
            "3 content events, usage, [DONE]: {stamps:?}"
        );
        assert!(stamps[..4].iter().all(Option::is_some) && stamps[4].is_none());
        let sent: Vec<u64> = stamps[..3].iter().map(|s| s.unwrap()).collect();
        assert!(
            sent.windows(2).all(|w| w[1] >= w[0] + 5_000_000),
            "paced: {sent:?}"
        );
    }
}

#[test]
fn bulk_and_fast_answers_carry_every_event() {
    for bulk in [true, false] {
        let addr = start(Pacing {
            events: 200,
            interval: Duration::ZERO,
            bulk,
        });
        let mut conn = Conn::connect(addr, Timeouts::default()).unwrap();
        let (stamps, complete) = answer(&mut conn);
        assert!(
            complete && stamps.len() == 202,
            "bulk {bulk}: {}",
            stamps.len()
        );
    }
}

#[test]
fn answers_health_and_models() {
    let addr = start(Pacing {
        events: 1,
        interval: Duration::ZERO,
        bulk: true,
    });
    let r = crate::http_request(addr, "GET", "/health", &[], b"").unwrap();
    assert_eq!((r.status, r.text().as_str()), (200, r#"{"status":"ok"}"#));
    let r = crate::http_request(addr, "GET", "/v1/models", &[], b"").unwrap();
    assert!(r.text().contains(MODEL));
    let r = crate::http_request(addr, "GET", "/nope", &[], b"").unwrap();
    assert_eq!(r.status, 404);
}

#[test]
fn finds_whole_requests_only() {
    let get = b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n";
    assert_eq!(request_len(get), Some((get.len(), "/health".into(), true)));
    let post = b"POST /v1/chat/completions HTTP/1.1\r\ncontent-length: 2\r\n\r\n{}";
    assert_eq!(
        request_len(post),
        Some((post.len(), "/v1/chat/completions".into(), false))
    );
    assert_eq!(request_len(&post[..post.len() - 1]), None);
    assert_eq!(request_len(b"GET / HTTP/1.1\r\n"), None);
}
