//! A minimal HTTP/1.1 client connection, driven by the request's own task.
//!
//! A general-purpose client runs each connection as a task of its own and passes requests,
//! responses and body chunks to it through channels: several task wake-ups and allocations per
//! request. A proxy already has a task per request, so here the request task writes the
//! request head (and body) to the socket itself, reads and parses the response head, and the
//! response body reads the same socket as the client's side pulls it. One write and one read
//! for a small request, as a proxy written in C does. An idle connection sits in the pool
//! unpolled; one its server closed in the meantime is found on the next write or read and
//! reported as [`SendError::Broken`] with `reused: true`, with the request handed back when it
//! can go out again.

pub mod chunked;
pub mod fields;
pub mod head;
pub mod response;

#[cfg(test)]
mod tests;

use bytes::BytesMut;
use http::request::Parts;
use http::Response;
use http_body_util::BodyExt;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::body::{TooLarge, UpBody};
use head::{HeadError, ResponseHead};
pub use response::UpstreamBody;

/// Bodies up to this size are written together with the head, in one write.
const INLINE_BODY: usize = 32 * 1024;
/// A connection's first read buffer, and its growth step while reads come in small: an SSE
/// event is a few hundred bytes, and every open stream holds one buffer.
const READ_MIN: usize = 2 * 1024;
/// Room made for a request head in the write buffer (more when it grows past it).
const HEAD_ROOM: usize = 1024;
/// The largest growth step, reached by doubling while reads fill all the room they had (bulk
/// bodies).
const READ_MAX: usize = 64 * 1024;

/// One HTTP/1.1 connection to an upstream.
#[derive(Debug)]
pub struct H1Conn {
    pub(crate) io: TcpStream,
    pub(crate) read_buf: BytesMut,
    /// What the next growth of `read_buf` reserves (see [`READ_MIN`]).
    read_step: usize,
    write_buf: Vec<u8>,
    /// Requests this connection has carried.
    pub(crate) served: u64,
    /// Its bit in the node-wide gauge, when the kernel counts it (eBPF).
    pub(crate) track: Option<crate::load::ebpf::ConnTrack>,
    /// Whether its requests count in flight on the pod (see `UpstreamOptions`).
    pub(crate) counts_as_load: bool,
}

impl Drop for H1Conn {
    fn drop(&mut self) {
        // Closing: no request on it any more (the kernel clears the bit at the close, too).
        self.mark_idle();
    }
}

impl H1Conn {
    /// Whether the server closed (or reset) this idle connection: seen from the readiness the
    /// runtime already recorded for the socket, without a system call.
    pub fn peer_closed(&self) -> bool {
        use futures::FutureExt;
        match self.io.ready(tokio::io::Interest::READABLE).now_or_never() {
            Some(Ok(r)) => r.is_read_closed() || r.is_error(),
            Some(Err(_)) => true,
            None => false,
        }
    }
}

/// Why a request failed on a connection.
#[derive(Debug, thiserror::Error)]
pub enum SendError {
    /// The connection broke (a failed write, a reset, or a close) before any byte of a response
    /// arrived. `reused`: it had carried requests before, so its server most likely closed it
    /// while it was idle. `replay`: the body again, when it can go out again (a body the proxy
    /// read, or a streamed one short enough to have been kept).
    #[error("the upstream connection broke before a response: {reason}")]
    Broken {
        reason: String,
        reused: bool,
        replay: Option<UpBody>,
    },
    /// The streamed request body passed the limit.
    #[error(transparent)]
    TooLarge(TooLarge),
    #[error("reading the request body: {0}")]
    ClientBody(String),
    #[error(transparent)]
    Head(HeadError),
}

/// A response head, and the request body again if it can be sent once more (to retry on
/// another pod after a retryable status).
#[derive(Debug)]
pub struct Sent {
    pub response: Response<UpstreamBody>,
    pub replay: Option<UpBody>,
}

fn broken(reason: String, reused: bool, replay: Option<UpBody>) -> SendError {
    SendError::Broken {
        reason,
        reused,
        replay,
    }
}

/// Why passing a streamed body on stopped.
enum WriteFailure {
    /// The client's body failed (or passed the limit).
    Body(SendError),
    /// The upstream connection broke.
    Io(std::io::Error),
}

/// The next data chunk of a streamed body (`None` at its end).
async fn next_data(body: &mut UpBody) -> Result<Option<bytes::Bytes>, SendError> {
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| match e.downcast::<TooLarge>() {
            Ok(t) => SendError::TooLarge(*t),
            Err(e) => SendError::ClientBody(e.to_string()),
        })?;
        if let Ok(data) = frame.into_data() {
            if !data.is_empty() {
                return Ok(Some(data));
            }
        }
    }
    Ok(None)
}

/// Append `data` to `out`, as a chunk when `chunked`.
fn chunk(out: &mut Vec<u8>, data: &[u8], chunked: bool) {
    if chunked {
        out.extend_from_slice(format!("{:x}\r\n", data.len()).as_bytes());
    }
    out.extend_from_slice(data);
    if chunked {
        out.extend_from_slice(b"\r\n");
    }
}

/// Up to this much of a streamed body is kept (as the chunks themselves, not copies) so the
/// request can go out again if its pooled connection turns out closed.
const REPLAY_LIMIT: usize = 64 * 1024;

/// The chunks of a streamed body sent so far, while they fit in [`REPLAY_LIMIT`].
#[derive(Default)]
struct Replay {
    chunks: Vec<bytes::Bytes>,
    len: usize,
    overflowed: bool,
}

impl Replay {
    fn push(&mut self, data: bytes::Bytes) {
        if self.overflowed || self.len + data.len() > REPLAY_LIMIT {
            self.overflowed = true;
            self.chunks.clear();
            return;
        }
        self.len += data.len();
        self.chunks.push(data);
    }

    /// The whole body it sent, as bytes, if it was kept (sent again, it carries its length).
    fn body(self) -> Option<UpBody> {
        if self.overflowed {
            return None;
        }
        let body: bytes::Bytes = match self.chunks.len() {
            0 => bytes::Bytes::new(),
            1 => self.chunks.into_iter().next().unwrap_or_default(),
            _ => self.chunks.concat().into(),
        };
        Some(UpBody::bytes(body))
    }
}

/// Why no response head was read.
enum ReadFailure {
    Head(head::HeadError),
    /// The connection closed or failed; `got_nothing`: before any byte of a head.
    Closed {
        reason: String,
        got_nothing: bool,
    },
}

impl H1Conn {
    /// Boxed: a connection moves from the pool into the request's send, into the response
    /// body and back, and the send's future and the response body hold it; as a pointer each
    /// move is 8 bytes and each holder one word, not the connection's 136 bytes.
    pub fn new(io: TcpStream) -> Box<Self> {
        Box::new(Self {
            io,
            read_buf: BytesMut::with_capacity(READ_MIN),
            read_step: READ_MIN,
            write_buf: Vec::new(),
            served: 0,
            track: None,
            counts_as_load: true,
        })
    }

    /// An empty write buffer with room for a request head and `body` bytes after it, from the
    /// thread's buffer pool ([`crate::buffers`]). The buffer goes back there once the response
    /// head is in (see [`Self::respond`]): a pooled or streaming connection would otherwise
    /// hold the largest request it ever wrote, up to [`INLINE_BODY`] past the head.
    fn start_write(&mut self, body: usize) {
        if self.write_buf.capacity() == 0 {
            self.write_buf = crate::buffers::write_buffer();
        }
        self.write_buf.clear();
        self.write_buf.reserve(HEAD_ROOM + body);
    }

    /// Room for the next read: the growth step when less than a quarter of it is left. Returns
    /// the room there is.
    pub(crate) fn make_room(&mut self) -> usize {
        if self.read_buf.capacity() - self.read_buf.len() < self.read_step / 4 {
            self.read_buf.reserve(self.read_step);
        }
        self.read_buf.capacity() - self.read_buf.len()
    }

    /// A read of `n` bytes into `room`: one that filled it all doubles the growth step.
    pub(crate) fn read_done(&mut self, n: usize, room: usize) {
        if n == room && self.read_step < READ_MAX {
            self.read_step *= 2;
        }
    }

    /// The response on this connection has ended.
    pub(crate) fn mark_idle(&self) {
        if let Some(t) = &self.track {
            t.idle();
        }
    }

    /// Send one request and read its response head. The connection moves into the response
    /// body, which gives it back through `release` once read to its end (if it can be reused).
    pub async fn send(
        mut self: Box<Self>,
        head: &Parts,
        lines: &[&[u8]],
        body: UpBody,
        release: Option<response::Release>,
    ) -> Result<Sent, SendError> {
        let reused = self.served > 0;
        // A request starts here: it counts in flight on the pod, node-wide.
        if let Some(t) = self.track.as_ref().filter(|_| self.counts_as_load) {
            t.busy();
        }
        let replay = match body {
            UpBody::Bytes(bytes) => self.write_read_body(head, lines, bytes, reused).await?,
            body @ UpBody::Stream { .. } => {
                self.write_streamed_body(head, lines, body, reused).await?
            }
        };
        match self.read_head(&head.method).await {
            Ok(h) => Ok(Sent {
                response: self.respond(h, release),
                replay,
            }),
            Err(ReadFailure::Head(e)) => Err(SendError::Head(e)),
            // Part of a head and then nothing: the request may have been served; do not send
            // it again.
            Err(ReadFailure::Closed {
                reason,
                got_nothing,
            }) => Err(broken(reason, reused, replay.filter(|_| got_nothing))),
        }
    }

    /// Write the head and a body the proxy read (small ones in the same write); the body comes
    /// back for a resend.
    async fn write_read_body(
        &mut self,
        head: &Parts,
        lines: &[&[u8]],
        bytes: Option<bytes::Bytes>,
        reused: bool,
    ) -> Result<Option<UpBody>, SendError> {
        // A body sent again after a streamed first attempt has no length header yet.
        let has_length =
            crate::header_lookup::contains(&head.headers, &http::header::CONTENT_LENGTH);
        let length = bytes.as_ref().filter(|_| !has_length).map(|b| b.len());
        let inline = bytes.as_ref().is_some_and(|b| b.len() <= INLINE_BODY);
        self.start_write(bytes.as_ref().filter(|_| inline).map_or(0, |b| b.len()));
        head::encode_request(
            &mut self.write_buf,
            head,
            lines,
            head::BodyFraming::of(length, false),
        );
        if let (true, Some(b)) = (inline, &bytes) {
            self.write_buf.extend_from_slice(b);
        }
        let mut written = self.io.write_all(&self.write_buf).await;
        if let (false, Some(b), Ok(())) = (inline, &bytes, &written) {
            written = self.io.write_all(b).await;
        }
        let replay = Some(UpBody::Bytes(bytes));
        match written {
            Ok(()) => Ok(replay),
            Err(e) => Err(broken(e.to_string(), reused, replay)),
        }
    }

    /// Write the head and the client's body as it arrives (chunked when it has no length), the
    /// first chunk with the head; what was sent is kept for a resend while it is small.
    async fn write_streamed_body(
        &mut self,
        head: &Parts,
        lines: &[&[u8]],
        mut body: UpBody,
        reused: bool,
    ) -> Result<Option<UpBody>, SendError> {
        let chunked = !crate::header_lookup::contains(&head.headers, &http::header::CONTENT_LENGTH);
        self.start_write(0);
        head::encode_request(
            &mut self.write_buf,
            head,
            lines,
            head::BodyFraming::of(None, chunked),
        );
        let mut kept = Replay::default();
        let first = next_data(&mut body).await?;
        let ended = first.is_none() || http_body::Body::is_end_stream(&body);
        if let Some(data) = first {
            chunk(&mut self.write_buf, &data, chunked);
            kept.push(data);
        }
        if ended && chunked {
            self.write_buf.extend_from_slice(b"0\r\n\r\n");
        }
        if let Err(e) = self.io.write_all(&self.write_buf).await {
            let replay = if ended { kept.body() } else { None };
            return Err(broken(e.to_string(), reused, replay));
        }
        if !ended {
            self.write_stream(&mut body, chunked, &mut kept)
                .await
                .map_err(|e| match e {
                    WriteFailure::Body(e) => e,
                    WriteFailure::Io(e) => broken(e.to_string(), reused, None),
                })?;
        }
        Ok(kept.body())
    }

    /// Read until a response head to `method` is complete.
    async fn read_head(&mut self, method: &http::Method) -> Result<ResponseHead, ReadFailure> {
        loop {
            // A connection's buffer is empty until the answer comes (nothing to parse yet).
            if !self.read_buf.is_empty() {
                if let Some(h) =
                    head::parse_response(&mut self.read_buf, method).map_err(ReadFailure::Head)?
                {
                    return Ok(h);
                }
            }
            let room = self.make_room();
            let got_nothing = self.read_buf.is_empty();
            let reason = match self.io.read_buf(&mut self.read_buf).await {
                Ok(0) => "closed before a response".to_owned(),
                Ok(n) => {
                    self.read_done(n, room);
                    continue;
                }
                Err(e) => e.to_string(),
            };
            return Err(ReadFailure::Closed {
                reason,
                got_nothing,
            });
        }
    }

    /// Pass the rest of a streamed body on (chunk-encoding it when it has no length).
    async fn write_stream(
        &mut self,
        body: &mut UpBody,
        chunked: bool,
        kept: &mut Replay,
    ) -> Result<(), WriteFailure> {
        while let Some(data) = next_data(body).await.map_err(WriteFailure::Body)? {
            if chunked {
                self.write_buf.clear();
                chunk(&mut self.write_buf, &data, true);
                self.io.write_all(&self.write_buf).await
            } else {
                self.io.write_all(&data).await
            }
            .map_err(WriteFailure::Io)?;
            kept.push(data);
        }
        if chunked {
            self.io
                .write_all(b"0\r\n\r\n")
                .await
                .map_err(WriteFailure::Io)?;
        }
        Ok(())
    }

    fn respond(
        mut self: Box<Self>,
        h: ResponseHead,
        release: Option<response::Release>,
    ) -> Response<UpstreamBody> {
        self.served += 1;
        crate::buffers::give_write_buffer(std::mem::take(&mut self.write_buf));
        let ResponseHead {
            status,
            fields,
            framing,
            keep_alive,
        } = h;
        // The pod's fields go with the body, to be written as they came (see `fields`).
        let body = UpstreamBody::new(self, framing, keep_alive, release, fields);
        let mut r = Response::new(body);
        *r.status_mut() = status;
        r
    }
}
