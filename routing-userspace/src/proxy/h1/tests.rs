use std::time::Instant;

use bytes::BytesMut;
use http::{Method, StatusCode, Version};
use http_body_util::{BodyExt, Full};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use super::request::{parse, Framing, HeadError};
use super::*;

fn head(text: &str) -> Result<Option<request::Head>, HeadError> {
    parse(&mut BytesMut::from(text.as_bytes()))
}

fn framing(text: &str) -> Result<Framing, HeadError> {
    Ok(head(text)?.expect("a whole head").framing)
}

/// The request-smuggling table: each way two parsers can frame one request differently is
/// refused with its own reason, and the plain forms are read as RFC 9112 says.
#[test]
fn the_smuggling_table() {
    let cases: &[(&str, Result<Framing, HeadError>)] = &[
        // Plain framings.
        (
            "POST / HTTP/1.1\r\nContent-Length: 5\r\n\r\n",
            Ok(Framing::Length(5)),
        ),
        (
            "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n",
            Ok(Framing::Chunked),
        ),
        (
            "POST / HTTP/1.1\r\nTransfer-Encoding: ChUnKeD\r\n\r\n",
            Ok(Framing::Chunked),
        ),
        ("GET / HTTP/1.1\r\n\r\n", Ok(Framing::Empty)),
        (
            "POST / HTTP/1.1\r\nContent-Length: 0\r\n\r\n",
            Ok(Framing::Empty),
        ),
        // CL + TE, in either order.
        (
            "POST / HTTP/1.1\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n",
            Err(HeadError::LengthAndTransferEncoding),
        ),
        (
            "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n",
            Err(HeadError::LengthAndTransferEncoding),
        ),
        // Duplicate Content-Length: equal lines are one length, different ones are refused, and a
        // list in one line is no length (hyper refuses it too).
        (
            "POST / HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\n",
            Ok(Framing::Length(5)),
        ),
        (
            "POST / HTTP/1.1\r\nContent-Length: 5, 5\r\n\r\n",
            Err(HeadError::BadContentLength),
        ),
        (
            "POST / HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n",
            Err(HeadError::ConflictingContentLength),
        ),
        (
            "POST / HTTP/1.1\r\nContent-Length: 5, 6\r\n\r\n",
            Err(HeadError::BadContentLength),
        ),
        // Leading zeros are digits too; a length past u64 is none.
        (
            "POST / HTTP/1.1\r\nContent-Length: 0000000000000000000000005\r\n\r\n",
            Ok(Framing::Length(5)),
        ),
        // Lengths that are not plain decimal digits.
        (
            "POST / HTTP/1.1\r\nContent-Length: +5\r\n\r\n",
            Err(HeadError::BadContentLength),
        ),
        (
            "POST / HTTP/1.1\r\nContent-Length: 0x5\r\n\r\n",
            Err(HeadError::BadContentLength),
        ),
        (
            "POST / HTTP/1.1\r\nContent-Length: 5 5\r\n\r\n",
            Err(HeadError::BadContentLength),
        ),
        (
            "POST / HTTP/1.1\r\nContent-Length: -1\r\n\r\n",
            Err(HeadError::BadContentLength),
        ),
        (
            "POST / HTTP/1.1\r\nContent-Length: \r\n\r\n",
            Err(HeadError::BadContentLength),
        ),
        (
            "POST / HTTP/1.1\r\nContent-Length: 99999999999999999999\r\n\r\n",
            Err(HeadError::BadContentLength),
        ),
        // Transfer codings other than a lone chunked; an empty element only in front.
        (
            "POST / HTTP/1.1\r\nTransfer-Encoding: chunked,\r\n\r\n",
            Err(HeadError::ChunkedNotLast),
        ),
        (
            "POST / HTTP/1.1\r\nTransfer-Encoding: , chunked\r\n\r\n",
            Ok(Framing::Chunked),
        ),
        (
            "POST / HTTP/1.1\r\nTransfer-Encoding: chunked, gzip\r\n\r\n",
            Err(HeadError::ChunkedNotLast),
        ),
        (
            "POST / HTTP/1.1\r\nTransfer-Encoding: gzip\r\n\r\n",
            Err(HeadError::ChunkedNotLast),
        ),
        (
            "POST / HTTP/1.1\r\nTransfer-Encoding: xchunked\r\n\r\n",
            Err(HeadError::ChunkedNotLast),
        ),
        (
            "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: x\r\n\r\n",
            Err(HeadError::ChunkedNotLast),
        ),
        (
            "POST / HTTP/1.1\r\nTransfer-Encoding: gzip, chunked\r\n\r\n",
            Err(HeadError::UnsupportedTransferEncoding),
        ),
        (
            "POST / HTTP/1.1\r\nTransfer-Encoding: chunked, chunked\r\n\r\n",
            Err(HeadError::ChunkedTwice),
        ),
        (
            "POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n",
            Err(HeadError::TransferEncodingInHttp10),
        ),
        // obs-fold: a header line continued on the next.
        (
            "POST / HTTP/1.1\r\nContent-Length: 5\r\n 6\r\n\r\n",
            Err(HeadError::Syntax("header name")),
        ),
        (
            "POST / HTTP/1.1\r\nX-A: a\r\n\tb\r\n\r\n",
            Err(HeadError::Syntax("header name")),
        ),
        // Bare LF, anywhere in the head.
        (
            "POST / HTTP/1.1\nContent-Length: 5\r\n\r\n",
            Err(HeadError::BareLf),
        ),
        (
            "POST / HTTP/1.1\r\nContent-Length: 5\n\r\n",
            Err(HeadError::BareLf),
        ),
        (
            "POST / HTTP/1.1\r\nContent-Length: 5\r\n\n",
            Err(HeadError::BareLf),
        ),
        // White space before the colon, and a second Host.
        (
            "POST / HTTP/1.1\r\nContent-Length : 5\r\n\r\n",
            Err(HeadError::Syntax("header name")),
        ),
        (
            "GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n",
            Err(HeadError::DuplicateHost),
        ),
        // Versions other than 1.0 and 1.1.
        ("GET / HTTP/1.2\r\n\r\n", Err(HeadError::Syntax("version"))),
        ("GET / HTTP/2.0\r\n\r\n", Err(HeadError::Syntax("version"))),
    ];
    for (text, want) in cases {
        assert_eq!(&framing(text), want, "{text:?}");
    }
    for e in [
        HeadError::LengthAndTransferEncoding,
        HeadError::BareLf,
        HeadError::ConflictingContentLength,
    ] {
        assert_eq!(e.status(), StatusCode::BAD_REQUEST);
    }
    assert_eq!(
        HeadError::UnsupportedTransferEncoding.status(),
        StatusCode::NOT_IMPLEMENTED
    );
    assert_eq!(
        HeadError::TooManyHeaders.status(),
        StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE
    );
}

/// The vectorized check finds a bare LF exactly where a search for every LF would: at the
/// head's first byte or after any byte but CR.
#[test]
fn a_bare_lf_is_found_wherever_it_is() {
    let reference = |h: &[u8]| memchr::memchr_iter(b'\n', h).any(|i| i == 0 || h[i - 1] != b'\r');
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    for len in 0..300 {
        for _ in 0..20 {
            let mut head = Vec::with_capacity(2 * len);
            for _ in 0..len {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                // mostly text and CRLF pairs, now and then a lone LF or CR
                match x % 64 {
                    0 => head.push(b'\n'),
                    1 => head.push(b'\r'),
                    2..=9 => head.extend_from_slice(b"\r\n"),
                    _ => head.push(b'a'),
                }
            }
            assert_eq!(request::has_bare_lf(&head), reference(&head), "{head:?}");
        }
    }
}

/// A request for one of the API's paths gets the very target a parse of it gives; anything
/// near one (a query, another case, one byte more or less) is parsed as itself.
#[test]
fn an_api_path_reads_as_its_target_parsed() {
    let near = [
        "/v1/models?x=1",
        "/V1/models",
        "/v1/model",
        "/v1/modelss",
        "/v1/chat/completions/",
        "http://a.example/v1/models",
        "*",
    ];
    for target in crate::vocab::API_PATHS.iter().chain(&near) {
        let h = head(&format!("POST {target} HTTP/1.1\r\n\r\n"))
            .unwrap()
            .unwrap();
        let parsed: http::Uri = target.parse().unwrap();
        assert_eq!(h.parts.uri, parsed, "{target}");
        assert_eq!(h.parts.uri.to_string(), parsed.to_string(), "{target}");
        assert_eq!(
            h.parts.uri.path_and_query(),
            parsed.path_and_query(),
            "{target}"
        );
    }
}

/// A field the proxy does not read goes to the pod as its line; one it reads is in the map;
/// a `Connection` header that names a field puts them all in the map (where it is removed).
#[test]
fn fields_the_proxy_does_not_read_are_relayed_as_their_lines() {
    let text = "POST /v1/chat/completions HTTP/1.1\r\nHost: p\r\nAccept: application/json\r\nUser-Agent: OpenAI/Python 1.54.4\r\nX-Stainless-Lang:python \r\nAuthorization: Bearer sk\r\nX-Session-ID: s1\r\nx-stainless-retry-count: 0\r\nX-Custom: a\r\nx-custom: b\r\nContent-Length: 0\r\n\r\n";
    let h = head(text).unwrap().unwrap();
    let mapped: Vec<&str> = h.parts.headers.keys().map(|k| k.as_str()).collect();
    assert_eq!(
        mapped,
        ["host", "authorization", "x-session-id", "content-length"]
    );
    let runs: Vec<&[u8]> = h.relayed.runs().collect();
    assert_eq!(
        runs,
        [
            &b"Accept: application/json\r\nUser-Agent: OpenAI/Python 1.54.4\r\nX-Stainless-Lang:python \r\n"[..],
            b"x-stainless-retry-count: 0\r\nX-Custom: a\r\nx-custom: b\r\n",
        ],
        "runs of whole lines as they came"
    );
    let fields: Vec<(&[u8], &[u8])> = h.relayed.fields().collect();
    assert_eq!(fields[2], (&b"X-Stainless-Lang"[..], &b"python"[..]));
    assert_eq!(
        fields[4..],
        [(&b"X-Custom"[..], &b"a"[..]), (b"x-custom", b"b")],
        "in order"
    );
    assert_eq!(h.relayed.len(), runs.iter().map(|r| r.len()).sum::<usize>());

    // The last line ends at the blank line.
    let h = head("GET / HTTP/1.1\r\nHost: p\r\nAccept: */*\r\n\r\n")
        .unwrap()
        .unwrap();
    assert_eq!(
        h.relayed.runs().collect::<Vec<_>>(),
        [&b"Accept: */*\r\n"[..]]
    );

    let h = head("GET / HTTP/1.1\r\nConnection: x-custom\r\nAccept: */*\r\nX-Custom: a\r\n\r\n")
        .unwrap()
        .unwrap();
    assert!(
        h.relayed.is_empty(),
        "Connection names a field: all in the map"
    );
    assert_eq!(h.parts.headers.len(), 3);

    // More runs than are kept inline: all go into the map (so the fields of one name keep
    // their order), nothing is lost.
    let interleaved: String = (0..10)
        .map(|i| format!("x-session-id: s{i}\r\nx-u{i}: v\r\n"))
        .collect();
    let h = head(&format!("GET / HTTP/1.1\r\n{interleaved}\r\n"))
        .unwrap()
        .unwrap();
    assert!(h.relayed.is_empty());
    assert_eq!(h.parts.headers.len(), 20);
    let (sessions, us) = (0..10).fold((0, 0), |(s, u), i| {
        (
            s + h
                .parts
                .headers
                .get_all("x-session-id")
                .iter()
                .filter(|v| *v == format!("s{i}").as_str())
                .count(),
            u + usize::from(h.parts.headers.contains_key(format!("x-u{i}").as_str())),
        )
    });
    assert_eq!((sessions, us), (10, 10));
}

/// The fields are relayed unchecked after httparse: it refuses every name byte `HeaderName`
/// refuses and every value byte `HeaderValue` refuses in a request head too, and accepts the
/// rest, so a relayed line is one the map would have taken.
#[test]
fn httparse_checks_a_requests_fields_as_http_does() {
    for b in 0..=255u8 {
        let read = |name: &[u8], value: &[u8]| {
            let mut text = b"GET / HTTP/1.1\r\n".to_vec();
            text.extend_from_slice(name);
            text.extend_from_slice(b": ");
            text.extend_from_slice(value);
            text.extend_from_slice(b"\r\n\r\n");
            parse(&mut BytesMut::from(&text[..]))
        };
        let value = [b'a', b, b'z'];
        let got = read(b"X-V", &value);
        let valid = http::HeaderValue::from_bytes(&value).is_ok();
        assert_eq!(got.is_ok(), valid, "value byte {b:#x}");
        if let Ok(Some(h)) = got {
            assert_eq!(
                h.relayed.fields().collect::<Vec<_>>(),
                [(&b"X-V"[..], &value[..])]
            );
        }
        if b == b':' {
            continue;
        }
        let name = [b'x', b, b'y'];
        assert_eq!(
            read(&name, b"v").is_ok(),
            http::HeaderName::from_bytes(&name).is_ok(),
            "name byte {b:#x}"
        );
    }
}

#[test]
fn a_head_reads_its_method_target_version_headers_and_connection() {
    let mut buf = BytesMut::from(
        &b"POST /v1/chat/completions?x=1 HTTP/1.1\r\nHost: p\r\nX-Session-ID: s1\r\nx-session-id: s2\r\nConnection: Keep-Alive, Close\r\nExpect: 100-Continue\r\nContent-Length: 3\r\n\r\nabcNEXT"[..],
    );
    let h = parse(&mut buf).unwrap().unwrap();
    assert_eq!(h.parts.method, Method::POST);
    assert_eq!(h.parts.uri, "/v1/chat/completions?x=1");
    assert_eq!(h.parts.version, Version::HTTP_11);
    let sessions: Vec<_> = h.parts.headers.get_all("x-session-id").iter().collect();
    assert_eq!(sessions, ["s1", "s2"], "repeated headers keep their order");
    let room = h.parts.headers.capacity() - h.parts.headers.len();
    assert!(
        room >= crate::proxy::prepare::ADDED_HEADERS,
        "the forwarding headers fit without growing the map: {room}"
    );
    assert!(!h.keep_alive, "close wins");
    assert!(h.expect_continue);
    assert_eq!(h.framing, Framing::Length(3));
    assert_eq!(
        &buf[..],
        b"abcNEXT",
        "the head is split off, the body stays"
    );

    let h = head("GET / HTTP/1.0\r\n\r\n").unwrap().unwrap();
    assert!(!h.keep_alive, "HTTP/1.0 closes unless asked");
    let h = head("GET / HTTP/1.0\r\nConnection: keep-alive\r\nExpect: 100-continue\r\n\r\n")
        .unwrap()
        .unwrap();
    assert!(h.keep_alive && !h.expect_continue);
    let h = head("GET http://a.example/x HTTP/1.1\r\n\r\n")
        .unwrap()
        .unwrap();
    assert_eq!(h.parts.uri.path(), "/x", "absolute form");
    let h = head("\r\nGET / HTTP/1.1\r\n\r\n").unwrap().unwrap();
    assert_eq!(
        h.parts.method,
        Method::GET,
        "an empty line before the request line is skipped"
    );
    assert!(
        head("GET / HTTP/1.1\r\nHost: a\r\n").unwrap().is_none(),
        "incomplete"
    );
    assert!(head("GET / HT").unwrap().is_none(), "incomplete");
    let many: String = (0..=request::MAX_HEADERS)
        .map(|i| format!("x-{i}: v\r\n"))
        .collect();
    assert_eq!(
        head(&format!("GET / HTTP/1.1\r\n{many}\r\n")).unwrap_err(),
        HeadError::TooManyHeaders
    );
}

// ---- The connection, over loopback.

/// Serve one connection per accept with a handler that answers `method path body-length
/// body` (and a few special paths), until the test ends.
async fn serving(settings: Settings) -> (std::net::SocketAddr, watch::Sender<bool>) {
    let (addr, stop, _) = serving_counted(settings).await;
    (addr, stop)
}

/// A server whose refusals are counted in the returned family (`code`, `status`).
async fn serving_counted(
    settings: Settings,
) -> (
    std::net::SocketAddr,
    watch::Sender<bool>,
    prometheus::IntCounterVec,
) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopping) = watch::channel(false);
    let counter = prometheus::IntCounterVec::new(
        prometheus::Opts::new("refusals", "refusals"),
        &["code", "status"],
    )
    .unwrap();
    let refusals = RefusalCounter::new(counter.clone());
    tokio::spawn(async move {
        loop {
            let (io, peer) = listener.accept().await.unwrap();
            let peer = Arc::new(Peer {
                addr: peer,
                ip_header: http::HeaderValue::from_static("127.0.0.1"),
            });
            let stopping = stopping.clone();
            tokio::spawn(serve_connection(
                io,
                answer,
                peer,
                settings,
                stopping,
                refusals.clone(),
            ));
        }
    });
    (addr, stop, counter)
}

type Answer = http_body_util::Either<Full<Bytes>, Parts>;

/// A body whose parts come from a channel.
struct Parts(tokio::sync::mpsc::Receiver<Bytes>);

impl http_body::Body for Parts {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, std::io::Error>>> {
        self.0
            .poll_recv(cx)
            .map(|b| b.map(|b| Ok(http_body::Frame::data(b))))
    }
}

impl response::CarriesFields for Parts {}

async fn answer(req: Request<RequestBody>, _peer: Arc<Peer>) -> Response<Answer> {
    let (parts, body) = req.into_parts();
    match parts.uri.path() {
        "/stream" => {
            // Three chunks, 50 ms apart.
            let (tx, rx) = tokio::sync::mpsc::channel(4);
            tokio::spawn(async move {
                for part in ["one ", "two ", "three"] {
                    let _ = tx.send(Bytes::from(part)).await;
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            });
            return Response::new(http_body_util::Either::Right(Parts(rx)));
        }
        "/no-content" => {
            let mut r = Response::new(http_body_util::Either::Left(Full::new(Bytes::new())));
            *r.status_mut() = StatusCode::NO_CONTENT;
            return r;
        }
        "/ignore-body" => {
            return Response::new(http_body_util::Either::Left(Full::new(Bytes::from(
                "ignored",
            ))));
        }
        "/slow" => tokio::time::sleep(Duration::from_secs(30)).await,
        _ => {}
    }
    let text = match body.collect().await {
        Ok(b) => {
            let b = b.to_bytes();
            format!(
                "{} {} {} {}",
                parts.method,
                parts.uri,
                b.len(),
                String::from_utf8_lossy(&b)
            )
        }
        Err(e) => format!("body error: {e}"),
    };
    Response::new(http_body_util::Either::Left(Full::new(Bytes::from(text))))
}

const SETTINGS: Settings = Settings {
    header_read_timeout: Duration::from_secs(5),
    max_head_bytes: 16 * 1024,
};

/// Send `raw`, then read until the server closes or `until` appears; returns what came.
async fn exchange(addr: std::net::SocketAddr, raw: &[u8], until: Option<&str>) -> String {
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(raw).await.unwrap();
    read_until(&mut s, until).await
}

async fn read_until(s: &mut TcpStream, until: Option<&str>) -> String {
    let mut got = Vec::new();
    let mut chunk = [0u8; 4096];
    let _ = tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            match s.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => got.extend_from_slice(&chunk[..n]),
            }
            if until.is_some_and(|u| String::from_utf8_lossy(&got).contains(u)) {
                return;
            }
        }
    })
    .await;
    String::from_utf8_lossy(&got).into_owned()
}

#[tokio::test]
async fn keep_alive_pipelining_and_bodies_of_every_framing() {
    let (addr, _stop) = serving(SETTINGS).await;
    let raw = b"POST /a HTTP/1.1\r\nContent-Length: 3\r\n\r\nabc\
POST /b HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n2;x=y\r\nhe\r\n3\r\nllo\r\n0\r\nT: 1\r\n\r\n\
GET /c HTTP/1.1\r\nConnection: close\r\n\r\n";
    let got = exchange(addr, raw, None).await;
    let answers: Vec<&str> = got.split("HTTP/1.1 200 OK").skip(1).collect();
    assert_eq!(answers.len(), 3, "{got}");
    assert!(answers[0].ends_with("POST /a 3 abc"), "{got}");
    assert!(answers[1].ends_with("POST /b 5 hello"), "{got}");
    assert!(answers[2].contains("connection: close"), "{got}");
    assert!(answers[2].ends_with("GET /c 0 "), "{got}");
    assert!(answers[0].contains("content-length: 13\r\n") && answers[0].contains("date: "));
}

#[tokio::test]
async fn a_body_split_over_many_writes_and_one_that_waits_for_100_continue() {
    let (addr, _stop) = serving(SETTINGS).await;
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(b"POST /a HTTP/1.1\r\nContent-Length: 100000\r\nExpect: 100-continue\r\n\r\n")
        .await
        .unwrap();
    let interim = read_until(&mut s, Some("\r\n\r\n")).await;
    assert_eq!(interim, "HTTP/1.1 100 Continue\r\n\r\n");
    for _ in 0..10 {
        s.write_all(&[b'x'; 10_000]).await.unwrap();
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let got = read_until(&mut s, Some("xxxxxxxxxx")).await;
    assert!(got.starts_with("HTTP/1.1 200 OK\r\n"), "{got}");
    assert!(got.contains("POST /a 100000 xxxx"), "{}", &got[..200]);
    // The connection serves the next request.
    s.write_all(b"GET /next HTTP/1.1\r\n\r\n").await.unwrap();
    let got = read_until(&mut s, Some("GET /next 0 ")).await;
    assert!(got.ends_with("GET /next 0 "), "{got}");
}

#[tokio::test]
async fn a_streamed_answer_is_chunked_and_each_part_goes_out_as_it_comes() {
    let (addr, _stop) = serving(SETTINGS).await;
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(b"GET /stream HTTP/1.1\r\n\r\n").await.unwrap();
    let first = read_until(&mut s, Some("one \r\n")).await;
    assert!(first.contains("transfer-encoding: chunked\r\n"), "{first}");
    assert!(
        first.ends_with("\r\n\r\n4\r\none \r\n"),
        "the first part before the rest: {first}"
    );
    let rest = read_until(&mut s, Some("0\r\n\r\n")).await;
    assert!(
        rest.ends_with("4\r\ntwo \r\n5\r\nthree\r\n0\r\n\r\n"),
        "{rest}"
    );
    // HTTP/1.0: no chunks, the close ends the body.
    let got = exchange(addr, b"GET /stream HTTP/1.0\r\n\r\n", None).await;
    assert!(
        got.contains("connection: close\r\n") && got.ends_with("\r\n\r\none two three"),
        "{got}"
    );
}

#[tokio::test]
async fn head_and_no_content_answers_have_no_body() {
    let (addr, _stop) = serving(SETTINGS).await;
    let raw = b"HEAD /h HTTP/1.1\r\n\r\nGET /no-content HTTP/1.1\r\n\r\nGET /z HTTP/1.1\r\nConnection: close\r\n\r\n";
    let got = exchange(addr, raw, None).await;
    let answers: Vec<&str> = got.split("HTTP/1.1 ").skip(1).collect();
    assert_eq!(answers.len(), 3, "{got}");
    assert!(answers[0].starts_with("200 OK") && answers[0].contains("content-length: 10\r\n"));
    assert!(
        answers[0].ends_with("\r\n\r\n"),
        "a HEAD answer has no body: {got}"
    );
    assert!(
        answers[1].starts_with("204 No Content") && answers[1].ends_with("\r\n\r\n"),
        "{got}"
    );
    assert!(!answers[1].contains("content-length") && !answers[1].contains("transfer-encoding"));
    assert!(answers[2].ends_with("GET /z 0 "), "{got}");
}

#[tokio::test]
async fn malformed_heads_get_an_openai_error_and_a_close() {
    let (addr, _stop, refusals) = serving_counted(SETTINGS).await;
    for (raw, status) in [
        (
            &b"POST / HTTP/1.1\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\nhello"[..],
            "400 Bad Request",
        ),
        (
            b"POST / HTTP/1.1\nContent-Length: 5\n\nhello",
            "400 Bad Request",
        ),
        (
            b"POST / HTTP/1.1\r\nTransfer-Encoding: gzip, chunked\r\n\r\n",
            "501 Not Implemented",
        ),
        (b"GET / HTTP/1.1\r\nX: \x01\r\n\r\n", "400 Bad Request"),
        (b"GARBAGE\r\n\r\n", "400 Bad Request"),
    ] {
        let got = exchange(addr, raw, None).await;
        assert!(
            got.starts_with(&format!("HTTP/1.1 {status}\r\n")),
            "{raw:?}: {got}"
        );
        assert!(got.contains("connection: close\r\n"), "{got}");
        assert!(got.contains(r#""code":"malformed_request""#), "{got}");
    }
    // A head past the limit: 431.
    let big = format!("GET / HTTP/1.1\r\nX-Big: {}\r\n\r\n", "a".repeat(20_000));
    let got = exchange(addr, big.as_bytes(), None).await;
    assert!(
        got.starts_with("HTTP/1.1 431 Request Header Fields Too Large\r\n"),
        "{got}"
    );
    // Each refusal counted by its code and status; a bad body (below) is a request's error.
    let count = |code: &str, status: &str| refusals.with_label_values(&[code, status]).get();
    assert_eq!(count("malformed_request", "400"), 4);
    assert_eq!(count("malformed_request", "501"), 1);
    assert_eq!(count("header_too_large", "431"), 1);
    // A bad chunk in a body: the handler sees the error, the connection closes.
    let got = exchange(
        addr,
        b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n5\nhello\r\n0\r\n\r\nGET /x HTTP/1.1\r\n\r\n",
        None,
    )
    .await;
    assert!(got.contains("body error: invalid chunked body"), "{got}");
    assert!(
        !got.contains("GET /x"),
        "nothing after a broken body is read as a request: {got}"
    );
    assert_eq!(count("malformed_request", "400"), 4);
}

#[tokio::test]
async fn an_unread_body_closes_the_connection_after_the_answer() {
    let (addr, _stop) = serving(SETTINGS).await;
    let mut s = TcpStream::connect(addr).await.unwrap();
    // Part of the body, which reads like a request: the handler answers without reading it.
    s.write_all(b"POST /ignore-body HTTP/1.1\r\nContent-Length: 200000\r\n\r\nGET /smuggled HTTP/1.1\r\n\r\n")
        .await
        .unwrap();
    let started = Instant::now();
    let got = read_until(&mut s, None).await;
    assert!(
        got.starts_with("HTTP/1.1 200 OK") && got.ends_with("ignored"),
        "the answer, and nothing for the body's bytes: {got}"
    );
    assert!(started.elapsed() < Duration::from_secs(3), "closed at once");
}

#[tokio::test]
async fn a_client_that_leaves_cancels_its_request_and_a_silent_one_is_closed() {
    let settings = Settings {
        header_read_timeout: Duration::from_millis(300),
        ..SETTINGS
    };
    let (addr, _stop, refusals) = serving_counted(settings).await;
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(b"GET /slow HTTP/1.1\r\n\r\n").await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    s.shutdown().await.unwrap();
    let started = Instant::now();
    let got = read_until(&mut s, None).await;
    assert_eq!(got, "", "closed without an answer");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "closed at once, not after the handler"
    );

    // A partial head past the timeout: 408.
    let got = exchange(addr, b"GET / HTTP/1.1\r\nHost:", None).await;
    assert!(got.starts_with("HTTP/1.1 408 Request Timeout\r\n"), "{got}");
    let timeouts = refusals.with_label_values(&["request_timeout", "408"]);
    assert_eq!(timeouts.get(), 1);
    // An idle keep-alive connection is closed at the timeout, without an answer.
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(b"GET /a HTTP/1.1\r\n\r\n").await.unwrap();
    let got = read_until(&mut s, Some("GET /a 0 ")).await;
    assert!(got.ends_with("GET /a 0 "));
    let started = Instant::now();
    assert_eq!(read_until(&mut s, None).await, "");
    assert!(started.elapsed() < Duration::from_secs(3));
    assert_eq!(
        timeouts.get(),
        1,
        "an idle connection closed is not a refusal"
    );
}

#[tokio::test]
async fn every_head_has_the_whole_timeout_from_its_own_wait() {
    // The connection's one timer is re-armed lazily: a request that comes after the first
    // head's deadline, but within the timeout of its own wait, is served; and the wait after
    // the last answer still ends at its own deadline, not at an earlier one.
    let settings = Settings {
        header_read_timeout: Duration::from_millis(300),
        ..SETTINGS
    };
    let (addr, _stop) = serving(settings).await;
    let mut s = TcpStream::connect(addr).await.unwrap();
    let opened = Instant::now();
    for path in ["/a", "/b", "/c", "/d"] {
        s.write_all(format!("GET {path} HTTP/1.1\r\n\r\n").as_bytes())
            .await
            .unwrap();
        let want = format!("GET {path} 0 ");
        let got = read_until(&mut s, Some(&want)).await;
        assert!(got.ends_with(&want), "{path}: {got:?}");
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
    assert!(
        opened.elapsed() > Duration::from_millis(600),
        "past two timeouts in all"
    );
    let waited = Instant::now();
    assert_eq!(read_until(&mut s, None).await, "", "closed when idle");
    assert!(waited.elapsed() < Duration::from_secs(3));
}

#[tokio::test]
async fn stopping_closes_idle_connections_and_ends_the_one_in_progress_with_close() {
    let (addr, stop) = serving(SETTINGS).await;
    let mut idle = TcpStream::connect(addr).await.unwrap();
    idle.write_all(b"GET /a HTTP/1.1\r\n\r\n").await.unwrap();
    read_until(&mut idle, Some("GET /a 0 ")).await;
    let mut busy = TcpStream::connect(addr).await.unwrap();
    busy.write_all(b"GET /stream HTTP/1.1\r\n\r\n")
        .await
        .unwrap();
    read_until(&mut busy, Some("one \r\n")).await;
    stop.send(true).unwrap();
    assert_eq!(read_until(&mut idle, None).await, "", "the idle one closes");
    let rest = read_until(&mut busy, None).await;
    assert!(
        rest.ends_with("0\r\n\r\n"),
        "the stream in progress ends whole: {rest}"
    );
}

#[tokio::test]
async fn a_short_read_clears_readiness_and_the_next_bytes_still_wake_the_reader() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let mut client = TcpStream::connect(listener.local_addr().unwrap())
        .await
        .unwrap();
    let (server, _) = listener.accept().await.unwrap();
    let mut buf = BytesMut::with_capacity(4096);
    for round in 0..3u8 {
        client.write_all(&[b'a' + round; 10]).await.unwrap();
        // Whatever tokio knew before, the bytes make the socket readable.
        tokio::time::timeout(Duration::from_secs(5), server.readable())
            .await
            .expect("woken by the client's bytes")
            .unwrap();
        assert_eq!(read_ready(&server, &mut buf).unwrap(), 10, "round {round}");
        // The short read drained the socket: nothing more, and no wait succeeds falsely.
        let again = read_ready(&server, &mut buf).unwrap_err();
        assert_eq!(again.kind(), std::io::ErrorKind::WouldBlock);
    }
    assert_eq!(&buf[..], b"aaaaaaaaaabbbbbbbbbbcccccccccc");
}

/// A pooled read buffer whose view shrank to the tail of its block (requests split off its
/// front) gets room for a whole head back, from its own block; a head that keeps coming
/// doubles the room.
#[test]
fn a_head_is_read_whole_from_a_shrunk_buffer() {
    let mut buf = BytesMut::with_capacity(HEAD_READ);
    buf.resize(HEAD_READ - 152, b'x');
    drop(buf.split_to(HEAD_READ - 152));
    buf.clear();
    assert!(buf.capacity() < 512, "the tail view: {}", buf.capacity());
    room_for_head(&mut buf, 64 * 1024);
    assert!(buf.capacity() >= HEAD_READ, "{}", buf.capacity());
    // a head still coming after the first 4 KiB
    buf.resize(buf.capacity() - 100, b'h');
    let had = buf.len();
    room_for_head(&mut buf, 64 * 1024);
    assert!(
        buf.capacity() - buf.len() >= had,
        "doubled: {}",
        buf.capacity()
    );
    // room enough already: untouched
    let mut roomy = BytesMut::with_capacity(HEAD_READ);
    room_for_head(&mut roomy, 64 * 1024);
    assert_eq!(roomy.capacity(), HEAD_READ);
}
