//! The body of an upstream response, read from its connection as the client's side asks for
//! it. It carries the response head's own fields ([`Fields`]) until the client's head is
//! written: an `http::Response` has room for a header map only. Data frames are slices of the read buffer (no copy). When the body has been read to its
//! end and the connection can carry another request, the connection goes back to its pool;
//! when the body is dropped early (the client left), the connection is closed with it.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};

use super::chunked::{ChunkError, ChunkedDecoder, Decoded};
use super::fields::Fields;
use super::head::Framing;
use super::H1Conn;
use crate::upstream::pool::{Pool, PoolKey};

/// Where a connection goes once its response is over.
#[derive(Debug)]
pub struct Release {
    pub pool: Arc<Pool>,
    pub key: PoolKey,
}

/// A response body that could not be read to its end.
#[derive(Debug, thiserror::Error)]
pub enum BodyError {
    #[error(
        "the upstream closed the connection {got} bytes before the end of a {expected}-byte body"
    )]
    Truncated { got: u64, expected: u64 },
    #[error("the upstream closed the connection inside a chunked body")]
    TruncatedChunked,
    #[error("bad chunked encoding from the upstream: {0}")]
    Chunked(#[from] ChunkError),
    #[error("reading the response body: {0}")]
    Io(#[from] std::io::Error),
}

#[derive(Debug)]
enum State {
    Length { left: u64, total: u64 },
    Chunked(ChunkedDecoder),
    Close,
    Done,
}

#[derive(Debug)]
pub struct UpstreamBody {
    conn: Option<Box<H1Conn>>,
    state: State,
    keep_alive: bool,
    release: Option<Release>,
    fields: Fields,
}

impl UpstreamBody {
    pub(super) fn new(
        conn: Box<H1Conn>,
        framing: Framing,
        keep_alive: bool,
        release: Option<Release>,
        fields: Fields,
    ) -> Self {
        let state = match framing {
            Framing::Empty => State::Done,
            Framing::Length(n) => State::Length { left: n, total: n },
            Framing::Chunked => State::Chunked(ChunkedDecoder::default()),
            Framing::Close => State::Close,
        };
        let mut body = Self {
            conn: Some(conn),
            state,
            keep_alive,
            release,
            fields,
        };
        if matches!(body.state, State::Done) {
            body.finish();
        }
        body
    }

    /// The response head's end-to-end fields, as the pod sent them (empty once taken).
    pub fn fields(&self) -> &Fields {
        &self.fields
    }

    /// Take the fields, to write them: their bytes share the connection's read buffer, which
    /// can only be reused in place once they are gone.
    pub fn take_fields(&mut self) -> Fields {
        std::mem::take(&mut self.fields)
    }

    /// The body is over: give the connection back when it can serve another request (nothing
    /// left unread in its buffer), else close it.
    fn finish(&mut self) {
        self.state = State::Done;
        let conn = self.conn.take();
        if let Some(conn) = &conn {
            conn.mark_idle();
        }
        if let (Some(conn), Some(release)) = (conn, self.release.take()) {
            if self.keep_alive && conn.read_buf.is_empty() {
                release.pool.put(release.key, conn);
            }
        }
    }

    /// Read more from the socket into the connection's buffer; `Ok(0)` at end of stream.
    fn poll_fill(conn: &mut H1Conn, cx: &mut Context<'_>) -> Poll<std::io::Result<usize>> {
        let room = conn.make_room();
        // Through `AsyncRead`, not `try_read_buf`: a read that leaves room tells tokio the
        // socket is drained, so the next poll waits for the next readiness instead of reading
        // once more only to get EAGAIN (a system call per relayed SSE event).
        let n = ready!(tokio_util::io::poll_read_buf(
            Pin::new(&mut conn.io),
            cx,
            &mut conn.read_buf
        ))?;
        conn.read_done(n, room);
        Poll::Ready(Ok(n))
    }
}

impl Body for UpstreamBody {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        let this = &mut *self;
        loop {
            let Some(conn) = this.conn.as_mut() else {
                return Poll::Ready(None);
            };
            match &mut this.state {
                State::Done => {
                    this.finish();
                    return Poll::Ready(None);
                }
                State::Length { left, total } => {
                    if !conn.read_buf.is_empty() {
                        let take = (*left).min(conn.read_buf.len() as u64) as usize;
                        let data = conn.read_buf.split_to(take).freeze();
                        *left -= take as u64;
                        if *left == 0 {
                            this.finish();
                        }
                        return Poll::Ready(Some(Ok(Frame::data(data))));
                    }
                    let (left, total) = (*left, *total);
                    if ready!(Self::poll_fill(conn, cx))? == 0 {
                        this.conn = None;
                        return Poll::Ready(Some(Err(BodyError::Truncated {
                            got: total - left,
                            expected: total,
                        })));
                    }
                }
                State::Chunked(decoder) => match decoder.decode(&mut conn.read_buf)? {
                    Decoded::Data(data) => return Poll::Ready(Some(Ok(Frame::data(data)))),
                    Decoded::End => {
                        this.finish();
                        return Poll::Ready(None);
                    }
                    Decoded::NeedMore => {
                        if ready!(Self::poll_fill(conn, cx))? == 0 {
                            this.conn = None;
                            return Poll::Ready(Some(Err(BodyError::TruncatedChunked)));
                        }
                    }
                },
                State::Close => {
                    if !conn.read_buf.is_empty() {
                        let data = conn.read_buf.split().freeze();
                        return Poll::Ready(Some(Ok(Frame::data(data))));
                    }
                    if ready!(Self::poll_fill(conn, cx))? == 0 {
                        // The end of the body; the connection is not reusable.
                        this.keep_alive = false;
                        this.finish();
                        return Poll::Ready(None);
                    }
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        matches!(self.state, State::Done)
    }

    fn size_hint(&self) -> SizeHint {
        match self.state {
            State::Done => SizeHint::with_exact(0),
            State::Length { left, .. } => SizeHint::with_exact(left),
            _ => SizeHint::default(),
        }
    }
}
