//! The HTTP/1.1 client against scripted servers on loopback: framing, reuse, stale pooled
//! connections, streamed request bodies, truncation.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::request::Parts;
use http::{Method, Request, StatusCode};
use http_body_util::BodyExt;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use super::response::{BodyError, Release};
use super::*;
use crate::upstream::pool::{Pool, PoolKey};

/// Read one request (head, and a body of its Content-Length or chunked) from `s`.
async fn read_request(s: &mut TcpStream) -> Option<(String, Vec<u8>)> {
    let mut buf = Vec::new();
    let head_end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        let mut chunk = [0u8; 4096];
        let n = s.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).to_lowercase();
    let mut body = buf[head_end..].to_vec();
    if let Some(len) = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length: "))
        .and_then(|v| v.trim().parse::<usize>().ok())
    {
        while body.len() < len {
            let mut chunk = [0u8; 4096];
            let n = s.read(&mut chunk).await.ok()?;
            body.extend_from_slice(&chunk[..n]);
        }
    } else if head.contains("transfer-encoding: chunked") {
        while !body.ends_with(b"0\r\n\r\n") {
            let mut chunk = [0u8; 4096];
            let n = s.read(&mut chunk).await.ok()?;
            body.extend_from_slice(&chunk[..n]);
        }
    }
    Some((head, body))
}

/// A server answering each request on each connection with the next scripted reply (written
/// in the given pieces, with a pause between them). Returns its address and, per accepted
/// connection, the requests it saw.
async fn server(
    replies: Vec<Vec<&'static [u8]>>,
) -> (
    std::net::SocketAddr,
    tokio::sync::mpsc::UnboundedReceiver<(usize, String, Vec<u8>)>,
) {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let replies = Arc::new(std::sync::Mutex::new(replies.into_iter()));
    tokio::spawn(async move {
        let mut conn_no = 0;
        loop {
            let Ok((mut s, _)) = l.accept().await else {
                return;
            };
            conn_no += 1;
            let (tx, replies) = (tx.clone(), replies.clone());
            let id = conn_no;
            tokio::spawn(async move {
                while let Some((head, body)) = read_request(&mut s).await {
                    let _ = tx.send((id, head, body));
                    let Some(pieces) = replies.lock().unwrap().next() else {
                        return;
                    };
                    for p in pieces {
                        if p == b"<close>" {
                            return;
                        }
                        s.write_all(p).await.unwrap();
                        tokio::time::sleep(Duration::from_millis(5)).await;
                    }
                }
            });
        }
    });
    (addr, rx)
}

fn parts(method: Method, len: Option<usize>) -> Parts {
    let mut b = Request::builder()
        .method(method)
        .uri("/v1/chat/completions")
        .header("host", "pod");
    if let Some(n) = len {
        b = b.header("content-length", n);
    }
    b.body(()).unwrap().into_parts().0
}

async fn conn(addr: std::net::SocketAddr) -> Box<H1Conn> {
    H1Conn::new(TcpStream::connect(addr).await.unwrap())
}

async fn body_of(r: http::Response<UpstreamBody>) -> Result<Vec<u8>, BodyError> {
    Ok(r.into_body().collect().await?.to_bytes().to_vec())
}

/// A pool for connections to `addr`, and its key there.
fn pool_for(addr: std::net::SocketAddr) -> (Arc<Pool>, PoolKey) {
    (
        Arc::new(Pool::new(8, Duration::from_secs(10))),
        PoolKey::Addr(addr),
    )
}

/// What `send` needs to hand a connection read to its end back to `pool`.
fn release(pool: &Arc<Pool>, key: &PoolKey) -> Option<Release> {
    Some(Release {
        pool: pool.clone(),
        key: key.clone(),
    })
}

#[tokio::test]
async fn reads_length_and_chunked_bodies_and_reuses_the_connection() {
    let (addr, mut seen) = server(vec![
        vec![b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello"],
        vec![
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Type: text/event-stream\r\n\r\n",
            b"6\r\ndata: \r\n",
            b"3\r\nabc\r\n",
            b"0\r\n\r\n",
        ],
    ])
    .await;
    let (pool, key) = pool_for(addr);
    let r = conn(addr)
        .await
        .send(
            &parts(Method::POST, Some(2)),
            &[],
            UpBody::bytes(Bytes::from_static(b"{}")),
            release(&pool, &key),
        )
        .await
        .unwrap()
        .response;
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(body_of(r).await.unwrap(), b"hello");
    assert_eq!(pool.idle(), 1, "read to its end: back in the pool");
    let reused = pool.take(&key).unwrap();
    assert_eq!(reused.served, 1);
    let r = reused
        .send(
            &parts(Method::GET, None),
            &[],
            UpBody::bytes(Bytes::new()),
            release(&pool, &key),
        )
        .await
        .unwrap()
        .response;
    assert_eq!(
        r.body().fields().get("content-type"),
        Some(&b"text/event-stream"[..])
    );
    assert_eq!(body_of(r).await.unwrap(), b"data: abc");
    let (first, second) = (seen.recv().await.unwrap(), seen.recv().await.unwrap());
    assert_eq!((first.0, second.0), (1, 1), "both on one connection");
    assert!(first
        .1
        .starts_with("post /v1/chat/completions http/1.1\r\n"));
    assert_eq!(first.2, b"{}");
    assert_eq!(pool.idle(), 1);
}

#[tokio::test]
async fn close_delimited_and_connection_close_are_not_pooled() {
    let (addr, _seen) = server(vec![vec![
        b"HTTP/1.1 200 OK\r\n\r\nuntil ",
        b"close",
        b"<close>",
    ]])
    .await;
    let (pool, key) = pool_for(addr);
    let r = conn(addr)
        .await
        .send(
            &parts(Method::GET, None),
            &[],
            UpBody::bytes(Bytes::new()),
            release(&pool, &key),
        )
        .await
        .unwrap()
        .response;
    assert_eq!(body_of(r).await.unwrap(), b"until close");
    assert_eq!(pool.idle(), 0);
}

#[tokio::test]
async fn a_pooled_connection_its_server_closed_is_skipped_or_hands_the_request_back() {
    let (addr, _seen) = server(vec![vec![
        b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok",
        b"<close>",
    ]])
    .await;
    let (pool, key) = pool_for(addr);
    let r = conn(addr)
        .await
        .send(
            &parts(Method::POST, Some(1)),
            &[],
            UpBody::bytes(Bytes::from_static(b"a")),
            release(&pool, &key),
        )
        .await
        .unwrap()
        .response;
    body_of(r).await.unwrap();
    assert_eq!(pool.idle(), 1);
    tokio::time::sleep(Duration::from_millis(50)).await;
    // The server closed it while idle: the pool sees that and does not hand it out.
    assert!(
        pool.take(&key).is_none(),
        "a closed idle connection is skipped"
    );

    // If the close is not seen yet (it races the request), the request comes back untouched.
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let closing = l.local_addr().unwrap();
    tokio::spawn(async move {
        let (mut s, _) = l.accept().await.unwrap();
        let mut b = [0u8; 1024];
        let _ = s.read(&mut b).await;
        // Closed without a response, as a server closing an idle connection does.
    });
    let mut c = conn(closing).await;
    c.served = 1;
    match c
        .send(
            &parts(Method::POST, Some(1)),
            &[],
            UpBody::bytes(Bytes::from_static(b"b")),
            None,
        )
        .await
    {
        Err(SendError::Broken {
            reused: true,
            replay: Some(body),
            ..
        }) => {
            assert!(matches!(body, UpBody::Bytes(Some(b)) if b == "b"));
        }
        other => panic!("expected a stale connection, got {other:?}"),
    }
}

#[tokio::test]
async fn empty_bodies_and_interim_responses() {
    let (addr, _seen) = server(vec![
        vec![b"HTTP/1.1 204 No Content\r\n\r\n"],
        vec![b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nhi"],
    ])
    .await;
    let (pool, key) = pool_for(addr);
    let r = conn(addr)
        .await
        .send(
            &parts(Method::DELETE, None),
            &[],
            UpBody::bytes(Bytes::new()),
            release(&pool, &key),
        )
        .await
        .unwrap()
        .response;
    assert_eq!(r.status(), StatusCode::NO_CONTENT);
    assert!(http_body::Body::is_end_stream(r.body()));
    assert_eq!(pool.idle(), 1, "no body: reusable at once");
    let r = pool
        .take(&key)
        .unwrap()
        .send(
            &parts(Method::GET, None),
            &[],
            UpBody::bytes(Bytes::new()),
            release(&pool, &key),
        )
        .await
        .unwrap()
        .response;
    assert_eq!(
        (r.status(), body_of(r).await.unwrap()),
        (StatusCode::OK, b"hi".to_vec())
    );
}

#[tokio::test]
async fn a_truncated_body_is_an_error() {
    let (addr, _seen) = server(vec![vec![
        b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nonly",
        b"<close>",
    ]])
    .await;
    let r = conn(addr)
        .await
        .send(
            &parts(Method::GET, None),
            &[],
            UpBody::bytes(Bytes::new()),
            None,
        )
        .await
        .unwrap()
        .response;
    assert!(matches!(
        body_of(r).await,
        Err(BodyError::Truncated {
            got: 4,
            expected: 10
        })
    ));
}

#[tokio::test]
async fn a_streamed_body_without_length_goes_out_chunked() {
    // The client side: a hyper server whose request body the proxy streams upstream.
    let (up, mut seen) = server(vec![vec![b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"]]).await;
    let front = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let front_addr = front.local_addr().unwrap();
    tokio::spawn(async move {
        let (s, _) = front.accept().await.unwrap();
        let svc =
            hyper::service::service_fn(move |req: Request<hyper::body::Incoming>| async move {
                let (p, incoming) = req.into_parts();
                let mut head = parts(p.method, None);
                head.headers.remove("content-length");
                let r = conn(up)
                    .await
                    .send(
                        &head,
                        &[],
                        UpBody::stream(crate::proxy::RequestBody::Hyper(incoming), 1 << 20),
                        None,
                    )
                    .await
                    .unwrap()
                    .response;
                Ok::<_, std::convert::Infallible>(http::Response::new(http_body_util::Full::new(
                    Bytes::from(format!("{}", r.status())),
                )))
            });
        hyper::server::conn::http1::Builder::new()
            .serve_connection(hyper_util::rt::TokioIo::new(s), svc)
            .await
            .unwrap();
    });
    let mut c = TcpStream::connect(front_addr).await.unwrap();
    c.write_all(b"POST / HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n")
        .await
        .unwrap();
    let (_, head, body) = seen.recv().await.unwrap();
    assert!(head.contains("transfer-encoding: chunked"), "{head}");
    assert!(!head.contains("content-length"));
    let mut d = chunked::ChunkedDecoder::default();
    let mut buf = bytes::BytesMut::from(&body[..]);
    let mut got = Vec::new();
    while let chunked::Decoded::Data(b) = d.decode(&mut buf).unwrap() {
        got.extend_from_slice(&b);
    }
    assert_eq!(got, b"abcde");
}

#[tokio::test]
async fn a_pooled_connection_keeps_no_write_buffer_after_a_large_request() {
    let (addr, mut seen) = server(vec![vec![
        b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok",
    ]])
    .await;
    let (pool, key) = pool_for(addr);
    let body = Bytes::from(vec![b'x'; 30 * 1024]);
    let r = conn(addr)
        .await
        .send(
            &parts(Method::POST, Some(body.len())),
            &[],
            UpBody::bytes(body.clone()),
            release(&pool, &key),
        )
        .await
        .unwrap()
        .response;
    assert_eq!(body_of(r).await.unwrap(), b"ok");
    assert_eq!(seen.recv().await.unwrap().2, body, "head and body went out");
    let pooled = pool.take(&key).expect("back in the pool");
    assert_eq!(
        pooled.write_buf.capacity(),
        0,
        "the 30 KiB request is not held while the connection waits"
    );
    assert!(pooled.read_buf.capacity() <= 2 * READ_MIN);
}
