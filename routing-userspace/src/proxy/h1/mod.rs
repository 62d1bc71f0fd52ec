//! The proxy's HTTP/1.1 server side: one client connection, served on its own task.
//!
//! A general-purpose server keeps a read and a write buffer for each connection's whole life
//! (hyper: 8 KiB each, 12 KiB of memory between two requests) and passes the request body
//! through a channel. Here a connection between two requests holds no buffer: it waits for
//! readability, then reads into a buffer that the request's head and body point into (no
//! copy), and that goes back to the allocator with the request. The request body is read from
//! the socket as the handler pulls it, on the same task ([`body`]). The response head and the
//! body frames the response has ready go out in one write; chunked framing when the length is
//! unknown.
//!
//! Framing is strict where a lenient reading lets two parsers disagree ([`request`]), and the
//! fuzz target `h1_request` compares every head and body with hyper's reading of the same
//! bytes. What the connection does not do: upgrades (a 101 closes the connection), trailers
//! in either direction (read and dropped), and half-closed clients (the end of the client's
//! side cancels the request, as in hyper by default).

pub mod body;
mod names;
pub mod request;
pub mod response;

#[cfg(test)]
mod tests;

use std::future::{poll_fn, Future};
use std::pin::{pin, Pin};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http::{Request, Response};
use tokio::io::Interest;
use tokio::net::TcpStream;
use tokio::sync::watch;
use tokio::time::Sleep;

pub use body::{Body, BodyError};
use body::{Handback, Link};
use request::{Framing, Head, HeadError};
use response::{Asked, BodyFraming, CarriesFields};

use super::errors::ApiError;
use super::request_body::RequestBody;
use super::server::{Peer, RefusalCounter};
use crate::buffers;

/// The first read of a request head: most heads (and small bodies) fit.
const HEAD_READ: usize = 4 * 1024;
/// A body up to this size that did not come whole with its head is read on (if its bytes are
/// already there) before the request is built, so it can be handed over whole.
const WHOLE_BODY: u64 = 64 * 1024;
/// Room made for a response head (more when it grows past it).
const HEAD_WRITE: usize = 512;
/// Past this much, ready body frames are written before more are gathered.
const FLUSH_AT: usize = 64 * 1024;

/// How a connection treats its client.
#[derive(Debug, Clone, Copy)]
pub struct Settings {
    /// A request head must arrive within this, counted from when the connection waits for it
    /// (0: no limit). An idle keep-alive connection closes after it too.
    pub header_read_timeout: Duration,
    /// Largest request head (431 past it).
    pub max_head_bytes: usize,
}

/// What waiting for a request head came to.
enum Next {
    Head(Head),
    /// The client closed, or the proxy is stopping and no request was begun.
    Closed,
    Refused(ApiError),
}

/// Serve HTTP/1.1 requests on `io` with `handler` until the client or the proxy closes.
/// `stopping` turns true when the proxy stops: a connection then closes between two requests,
/// and the request in progress is answered with `connection: close`. A head refused unread is
/// counted in `refusals`.
pub async fn serve_connection<H, F, B>(
    io: TcpStream,
    handler: H,
    peer: Arc<Peer>,
    settings: Settings,
    mut stopping: watch::Receiver<bool>,
    refusals: RefusalCounter,
) -> std::io::Result<()>
where
    H: Fn(Request<RequestBody>, Arc<Peer>) -> F,
    F: Future<Output = Response<B>>,
    B: http_body::Body<Data = Bytes> + CarriesFields,
{
    let link = Arc::new(Link::new(io));
    // The header-read timer, re-armed lazily (see `read_head`); never earlier than a deadline.
    let mut timer = pin!(tokio::time::sleep(settings.header_read_timeout));
    let mut buf = BytesMut::new();
    let mut out: Vec<u8> = Vec::new();
    loop {
        let head = match read_head(
            &link,
            &mut buf,
            &mut out,
            &settings,
            &mut stopping,
            timer.as_mut(),
        )
        .await?
        {
            Next::Head(h) => h,
            Next::Closed => return Ok(()),
            Next::Refused(error) => {
                refusals.count(&error);
                refuse(&link, &mut out, error).await;
                return Ok(());
            }
        };
        let Head {
            parts,
            relayed,
            framing,
            keep_alive,
            expect_continue,
        } = head;
        if let Framing::Length(n) = framing {
            read_on_if_there(&link, &mut buf, n);
        }
        // Whether the read buffer went with the body (to come back when the body ends).
        let mut lent = false;
        let body = match framing {
            Framing::Empty => Body::empty(),
            Framing::Length(n) if buf.len() as u64 >= n => {
                Body::full(buf.split_to(n as usize).freeze())
            }
            // Streamed: a length not all here yet, or chunks (no length).
            Framing::Length(_) | Framing::Chunked => {
                lent = true;
                let length = match framing {
                    Framing::Length(n) => Some(n),
                    _ => None,
                };
                Body::streamed(
                    Arc::clone(&link),
                    std::mem::take(&mut buf),
                    length,
                    expect_continue,
                )
            }
        };
        let asked = Asked::of(&parts.method, parts.version, keep_alive);
        link.answered.store(false, Ordering::Relaxed);
        let request = Request::from_parts(parts, RequestBody::Http1(body, relayed));
        let mut watch = Watch {
            lent,
            body_finished: !lent,
        };
        let answered = {
            let mut pipeline = pin!(handler(request, Arc::clone(&peer)));
            poll_fn(|cx| {
                if let Poll::Ready(r) = pipeline.as_mut().poll(cx) {
                    return Poll::Ready(Some(r));
                }
                if watch.client_gone(cx, &link, &mut buf) {
                    return Poll::Ready(None);
                }
                Poll::Pending
            })
            .await
        };
        let Some(response) = answered else {
            // The client went away: the request is dropped (cancelled) with the connection.
            return Ok(());
        };
        link.answered.store(true, Ordering::Relaxed);
        let asked = Asked {
            keep_alive: asked.keep_alive && !*stopping.borrow(),
            ..asked
        };
        let (parts, mut body) = response.into_parts();
        let size = body.size_hint().exact();
        if out.capacity() == 0 {
            out = buffers::write_buffer();
        }
        // Room for the head and a body that comes whole, made once: grown a push at a time,
        // the buffer went through seven reallocations per short answer.
        out.reserve(HEAD_WRITE + size.map_or(0, |n| n.min(FLUSH_AT as u64) as usize));
        let relayed = body.take_fields();
        let written = response::write_head(
            &mut out,
            parts.status,
            &parts.headers,
            relayed.as_ref(),
            size,
            asked,
        );
        drop((parts, relayed));
        let sent = send_body(&link, &mut out, body, written.framing, &mut watch, &mut buf).await?;
        if !sent || !written.keep_alive || *stopping.borrow() {
            close(&link);
            return Ok(());
        }
        if watch.lent {
            if let Some(Handback {
                buf: back,
                finished,
            }) = link.take_handback()
            {
                buf = back;
                watch.lent = false;
                watch.body_finished = finished;
            }
        }
        if watch.lent || !watch.body_finished {
            // The body was left unread (or is still held): what follows on the socket is not a
            // request head.
            close(&link);
            return Ok(());
        }
    }
}

/// Watches the client's side of the connection while a request runs: an end of stream there
/// cancels the request. Only once the request body has been read (its bytes are the body's to
/// read, not ours), and only until a pipelined request's first bytes come.
struct Watch {
    /// The read buffer went with a streamed body.
    lent: bool,
    body_finished: bool,
}

impl Watch {
    fn client_gone(&mut self, cx: &mut Context<'_>, link: &Link, buf: &mut BytesMut) -> bool {
        if self.lent {
            match link.take_handback() {
                Some(back) => {
                    *buf = back.buf;
                    self.lent = false;
                    self.body_finished = back.finished;
                }
                None => return false,
            }
        }
        if !self.body_finished || !buf.is_empty() {
            return false;
        }
        loop {
            match link.io.poll_read_ready(cx) {
                Poll::Pending => return false,
                Poll::Ready(Err(_)) => return true,
                Poll::Ready(Ok(())) => {}
            }
            if buf.capacity() - buf.len() < 512 {
                buf.reserve(1024);
            }
            match link.io.try_read_buf(buf) {
                Ok(0) => return true,
                Ok(_) => return false,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
                Err(_) => return true,
            }
        }
    }
}

/// Wait for the next request head and parse it.
async fn read_head(
    link: &Link,
    buf: &mut BytesMut,
    out: &mut Vec<u8>,
    settings: &Settings,
    stopping: &mut watch::Receiver<bool>,
    mut timer: Pin<&mut Sleep>,
) -> std::io::Result<Next> {
    let timeout = settings.header_read_timeout;
    let deadline = (!timeout.is_zero()).then(|| tokio::time::Instant::now() + timeout);
    loop {
        if !buf.is_empty() {
            match request::parse(buf) {
                Ok(Some(head)) => return Ok(Next::Head(head)),
                Ok(None) if buf.len() >= settings.max_head_bytes => {
                    return Ok(Next::Refused(ApiError::header_too_large(
                        settings.max_head_bytes,
                    )))
                }
                Ok(None) => {}
                Err(e) => return Ok(Next::Refused(refusal(e))),
            }
        }
        if buf.capacity() == 0 {
            *buf = buffers::read_buffer();
        }
        room_for_head(buf, settings.max_head_bytes);
        match read_ready(&link.io, buf) {
            Ok(0) => return Ok(Next::Closed),
            Ok(_) => continue,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(e),
        }
        let idle = buf.is_empty();
        if idle {
            // Between two requests a connection holds no buffer.
            buffers::give_read_buffer(std::mem::take(buf));
            buffers::give_write_buffer(std::mem::take(out));
        }
        let wait = async {
            let Some(d) = deadline else {
                return Some(link.io.readable().await);
            };
            // The connection's one timer is armed at a deadline no later than this head's, and
            // moved on only when it fires early: a busy connection touches the timer wheel
            // once per timeout, not once per request.
            loop {
                tokio::select! {
                    biased;
                    ready = link.io.readable() => return Some(ready),
                    () = timer.as_mut() => {
                        if timer.deadline() >= d {
                            return None;
                        }
                        timer.as_mut().reset(d);
                    }
                }
            }
        };
        tokio::select! {
            ready = wait => match ready {
                Some(r) => r?,
                None if idle => return Ok(Next::Closed),
                None => return Ok(Next::Refused(ApiError::head_timeout())),
            },
            _ = stopping.wait_for(|&s| s), if idle => return Ok(Next::Closed),
        }
    }
}

/// Make room in `buf` for a whole head in one read. A pooled buffer's view may have shrunk to
/// the tail of its block (a few hundred bytes, after the requests it held were split off): its
/// block is reclaimed here, so a head never takes two reads for want of room. A head that
/// keeps coming doubles it, up to `max_head` (at least [`HEAD_READ`]).
fn room_for_head(buf: &mut BytesMut, max_head: usize) {
    if buf.capacity() - buf.len() < 512 {
        let grow = HEAD_READ.max(buf.len());
        buf.reserve(grow.min(max_head.max(HEAD_READ)));
    }
}

/// Read what the client sent into `buf`, without waiting. A read that leaves room in the
/// buffer drained the socket, so it also clears the socket's readiness, as tokio's own
/// `poll_read` does after a short read: the wait for the next request then goes to epoll, not
/// to a `recv` that finds nothing (one system call less per keep-alive request). Race-free: the
/// readiness is cleared only if no event came after the one the read started from.
fn read_ready(io: &TcpStream, buf: &mut BytesMut) -> std::io::Result<usize> {
    let mut got = 0;
    let read = io.try_io(Interest::READABLE, || {
        let room = buf.capacity() - buf.len();
        got = io.try_read_buf(buf)?;
        if got > 0 && got < room {
            return Err(std::io::ErrorKind::WouldBlock.into());
        }
        Ok(got)
    });
    match read {
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock && got > 0 => Ok(got),
        read => read,
    }
}

fn refusal(e: HeadError) -> ApiError {
    ApiError::malformed_request(e.status(), e)
}

/// A body of `n` bytes that did not come whole with its head: read what of it is already
/// there (no waiting), so a body of a few KB split over two segments is handed over whole.
/// The room offered is more than the body needs, so a read that drains the socket is short
/// and clears its readiness (see [`read_ready`]): watching the client during the request then
/// costs no system call.
fn read_on_if_there(link: &Link, buf: &mut BytesMut, n: u64) {
    if buf.len() as u64 >= n || n > WHOLE_BODY {
        return;
    }
    buf.reserve(n as usize - buf.len() + 512);
    while (buf.len() as u64) < n {
        match read_ready(&link.io, buf) {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
    }
}

/// What the response body loop saw next.
enum Event {
    Data(Bytes),
    /// Trailers, or an empty data frame: nothing to send.
    Nothing,
    /// The body failed.
    Failed,
    End,
    /// The body has nothing ready: write what was gathered.
    Flush,
    ClientGone,
}

/// Send the response body with `framing` after the head already in `out`. `Ok(false)` when it
/// did not end as framed (the body failed, or the client went away): the connection closes.
async fn send_body<B>(
    link: &Link,
    out: &mut Vec<u8>,
    body: B,
    framing: BodyFraming,
    watch: &mut Watch,
    buf: &mut BytesMut,
) -> std::io::Result<bool>
where
    B: http_body::Body<Data = Bytes>,
{
    if framing == BodyFraming::None {
        drop(body);
        write_all(link, out).await?;
        out.clear();
        return Ok(true);
    }
    let mut body = pin!(body);
    let mut left = match framing {
        BodyFraming::Length(n) => n,
        _ => u64::MAX,
    };
    loop {
        let event = poll_fn(|cx| match body.as_mut().poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => Poll::Ready(match frame.into_data() {
                Ok(data) if !data.is_empty() => Event::Data(data),
                _ => Event::Nothing,
            }),
            Poll::Ready(Some(Err(_))) => Poll::Ready(Event::Failed),
            Poll::Ready(None) => Poll::Ready(Event::End),
            Poll::Pending if !out.is_empty() => Poll::Ready(Event::Flush),
            Poll::Pending if watch.client_gone(cx, link, buf) => Poll::Ready(Event::ClientGone),
            Poll::Pending => Poll::Pending,
        })
        .await;
        match event {
            Event::Flush => {
                write_all(link, out).await?;
                out.clear();
            }
            Event::ClientGone => return Ok(false),
            // Trailers are not sent.
            Event::Nothing => {}
            Event::Data(data) => {
                match framing {
                    BodyFraming::Chunked => response::push_chunk(out, &data),
                    BodyFraming::Length(_) => {
                        if data.len() as u64 > left {
                            // More than the length said: what was framed is sent, then close.
                            write_all(link, out).await?;
                            return Ok(false);
                        }
                        left -= data.len() as u64;
                        out.extend_from_slice(&data);
                    }
                    BodyFraming::UntilClose => out.extend_from_slice(&data),
                    BodyFraming::None => {}
                }
                if out.len() >= FLUSH_AT {
                    write_all(link, out).await?;
                    out.clear();
                }
            }
            Event::Failed => {
                // The upstream body failed: what came is sent, and the unfinished framing tells
                // the client the body is cut.
                write_all(link, out).await?;
                return Ok(false);
            }
            Event::End => {
                let complete = match framing {
                    BodyFraming::Chunked => {
                        out.extend_from_slice(response::LAST_CHUNK);
                        true
                    }
                    BodyFraming::Length(_) => left == 0,
                    BodyFraming::UntilClose => false,
                    BodyFraming::None => true,
                };
                write_all(link, out).await?;
                out.clear();
                return Ok(complete);
            }
        }
    }
}

async fn write_all(link: &Link, mut bytes: &[u8]) -> std::io::Result<()> {
    while !bytes.is_empty() {
        match link.io.try_write(bytes) {
            Ok(n) => bytes = &bytes[n..],
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => link.io.writable().await?,
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Close the connection: the write side at once (the client reads the end of the answer even
/// while a body of this request still holds the socket), the socket itself as the link drops.
fn close(link: &Link) {
    // Already shut or reset by the client: nothing left to close.
    let _ = socket2::SockRef::from(&link.io).shutdown(std::net::Shutdown::Write);
}

/// Answer a request head the proxy will not read, then close after a short drain of what the
/// client still sends (so its reads see the answer, not a reset).
async fn refuse(link: &Link, out: &mut Vec<u8>, error: ApiError) {
    let body = error.body();
    let mut headers = http::HeaderMap::new();
    headers.insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    out.clear();
    response::write_head(
        out,
        error.status,
        &headers,
        None,
        Some(body.len() as u64),
        Asked {
            head_method: false,
            version: http::Version::HTTP_11,
            keep_alive: false,
        },
    );
    out.extend_from_slice(&body);
    if write_all(link, out).await.is_err() {
        return;
    }
    close(link);
    let mut sink = BytesMut::with_capacity(4096);
    let _ = tokio::time::timeout(Duration::from_secs(1), async {
        loop {
            if link.io.readable().await.is_err() {
                return;
            }
            sink.clear();
            match link.io.try_read_buf(&mut sink) {
                Ok(0) => return,
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(_) => return,
            }
        }
    })
    .await;
}
