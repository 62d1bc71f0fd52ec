use super::*;
use std::net::TcpListener;

fn body_of(raw: &[u8], framing: Framing) -> (Vec<u8>, io::Result<bool>) {
    let mut r = raw;
    let mut out = Vec::new();
    let done = read_body(&mut r, framing, &mut out);
    (out, done)
}

#[test]
fn requests_carry_length_type_and_close() {
    let r = Request::post("/v1/x", b"{}")
        .header("X-A", "1")
        .encode("h:1");
    assert_eq!(
        String::from_utf8(r).unwrap(),
        "POST /v1/x HTTP/1.1\r\nHost: h:1\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: 2\r\nX-A: 1\r\n\r\n{}"
    );
    let g = String::from_utf8(Request::get("/h").keep_alive().encode("h")).unwrap();
    assert_eq!(g, "GET /h HTTP/1.1\r\nHost: h\r\nContent-Length: 0\r\n\r\n");
    let typed = Request::post("/", b"x")
        .header("content-type", "text/plain")
        .encode("h");
    assert_eq!(
        String::from_utf8_lossy(&typed).matches("ontent-").count(),
        2
    );
}

#[test]
fn heads_and_their_framing() {
    let mut r = &b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nX-Sim-Pod: a\r\n\r\nrest"[..];
    let h = read_head(&mut r).unwrap();
    assert_eq!((h.status, h.header("x-sim-pod")), (200, Some("a")));
    assert_eq!(h.framing(), Framing::Chunked);
    assert_eq!(r, b"rest");
    let len = |t: &str| read_head(&mut t.as_bytes()).unwrap().framing();
    assert_eq!(
        len("HTTP/1.1 200 OK\r\nContent-Length: 7\r\n\r\n"),
        Framing::Length(7)
    );
    assert_eq!(len("HTTP/1.0 200 OK\r\n\r\n"), Framing::UntilClose);
    assert_eq!(len("HTTP/1.1 204 No Content\r\n\r\n"), Framing::Length(0));
    let eof = read_head(&mut &b"HTTP/1.1 200 OK\r\nX: 1\r\n"[..]).unwrap_err();
    assert_eq!(eof.kind(), io::ErrorKind::UnexpectedEof);
    let bad = read_head(&mut &b"SSH-2.0-x\r\n\r\n"[..]).unwrap_err();
    assert_eq!(bad.kind(), io::ErrorKind::InvalidData);
    assert!(bad.to_string().starts_with("bad status line"), "{bad}");
}

#[test]
fn reads_chunked_bodies_and_notices_cuts() {
    let (b, done) = body_of(
        b"5\r\nhello\r\n1;x=y\r\n!\r\n0\r\nTrailer: t\r\n\r\n",
        Framing::Chunked,
    );
    assert_eq!((b.as_slice(), done.unwrap()), (&b"hello!"[..], true));
    let (b, done) = body_of(b"5\r\nhel", Framing::Chunked);
    assert_eq!((b.as_slice(), done.unwrap()), (&b"hel"[..], false));
    let (_, done) = body_of(b"5\r\nhello\r\n", Framing::Chunked);
    assert!(!done.unwrap(), "no last chunk");
    let (_, done) = body_of(b"zz\r\nhello\r\n", Framing::Chunked);
    assert_eq!(done.unwrap_err().kind(), io::ErrorKind::InvalidData);
    let (_, done) = body_of(b"2\r\nhixx\r\n0\r\n\r\n", Framing::Chunked);
    assert!(done.is_err(), "chunk data longer than its size");
}

#[test]
fn reads_length_and_close_delimited_bodies() {
    let (b, done) = body_of(b"abcdef", Framing::Length(4));
    assert_eq!((b.as_slice(), done.unwrap()), (&b"abcd"[..], true));
    let (b, done) = body_of(b"ab", Framing::Length(4));
    assert_eq!((b.as_slice(), done.unwrap()), (&b"ab"[..], false));
    let (b, done) = body_of(b"", Framing::Length(0));
    assert_eq!((b.len(), done.unwrap()), (0, true));
    let (b, done) = body_of(b"to the end", Framing::UntilClose);
    assert_eq!((b.as_slice(), done.unwrap()), (&b"to the end"[..], true));
}

#[test]
fn parses_whole_responses() {
    let r =
        parse_response(b"HTTP/1.1 201 Created\r\nX-A: 1\r\nContent-Length: 2\r\n\r\nok").unwrap();
    assert_eq!(
        (r.status, r.header("x-a"), r.text().as_str()),
        (201, Some("1"), "ok")
    );
    let r = parse_response(
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n4\r\nflex\r\n5;x=y\r\ninfer\r\n0\r\n\r\n",
    )
    .unwrap();
    assert_eq!(r.text(), "flexinfer");
    assert!(parse_response(b"HTTP/1.1 200 OK\r\n").is_err());
    assert!(
        parse_response(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n9\r\nab").is_err()
    );
}

#[test]
fn splits_events_and_their_fields() {
    assert_eq!(event_end(b"data: a\n\ndata: b\n\n"), Some(9));
    assert_eq!(event_end(b"data: a\r\n\r\n"), Some(11));
    assert_eq!(event_end(b"data: a\n"), None);
    assert_eq!(
        parse_event("data: {\"a\":1}\n"),
        (None, "{\"a\":1}".to_owned())
    );
    assert_eq!(
        parse_event(": comment\nevent: error\ndata: x\ndata:y\nid: 3\n"),
        (Some("error".to_owned()), "x\ny".to_owned())
    );
}

#[test]
fn streams_events_from_a_real_listener_one_by_one() {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
    let server = std::thread::spawn(move || {
        let (mut s, _) = l.accept().unwrap();
        let mut buf = [0u8; 1024];
        let n = s.read(&mut buf).unwrap();
        assert!(String::from_utf8_lossy(&buf[..n]).starts_with("POST /v1/chat/completions"));
        s.write_all(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
            .unwrap();
        s.write_all(b"f\r\ndata: {\"n\":1}\n\n\r\n").unwrap();
        // The second event goes out only once the client has seen the first.
        go_rx.recv().unwrap();
        s.write_all(b"e\r\ndata: [DONE]\n\n\r\n0\r\n\r\n").unwrap();
    });
    let mut c = Conn::connect(addr, Timeouts::default()).unwrap();
    c.send(&Request::post("/v1/chat/completions", b"{}"))
        .unwrap();
    let head = c.head().unwrap();
    let mut events = c.events(&head);
    let first = events.next_event().unwrap().unwrap();
    assert_eq!(first.data, "{\"n\":1}");
    go_tx.send(()).unwrap();
    let second = events.next_event().unwrap().unwrap();
    assert_eq!(second.data, "[DONE]");
    assert!(second.at >= first.at);
    assert!(events.next_event().unwrap().is_none());
    assert!(events.complete());
    server.join().unwrap();
}
