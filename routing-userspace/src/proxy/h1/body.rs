//! The body of a request on an HTTP/1 connection, read from the connection's socket as the
//! handler pulls it, on the connection's own task (no channel, no task of its own).
//!
//! A body that came whole with its head (most requests: a chat request of a few KB arrives in
//! one read) is split off the read buffer and needs the socket no more. A longer one takes the
//! read buffer with it and hands it back, with what follows the body, when it ends or is
//! dropped: the connection reads the next request from there, or closes if the body was left
//! unread.

use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{ready, Context, Poll};

use bytes::{Bytes, BytesMut};
use http_body::{Frame, SizeHint};
use tokio::net::TcpStream;

use super::response::CONTINUE;
use crate::upstream::h1::chunked::{ChunkError, ChunkedDecoder, Decoded};

/// The largest read a streamed body makes at once.
const READ_MAX: usize = 64 * 1024;

/// What a connection and the body of its current request share.
#[derive(Debug)]
pub(super) struct Link {
    pub io: TcpStream,
    /// The read buffer, given back by a streamed body when it ends or is dropped.
    pub handback: Mutex<Option<Handback>>,
    /// Set once the response head is written: a `100 Continue` is too late from then on.
    pub answered: AtomicBool,
}

impl Link {
    pub(super) fn new(io: TcpStream) -> Self {
        Self {
            io,
            handback: Mutex::new(None),
            answered: AtomicBool::new(false),
        }
    }

    pub(super) fn take_handback(&self) -> Option<Handback> {
        self.handback
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
    }
}

/// The read buffer back from a streamed body.
#[derive(Debug)]
pub(super) struct Handback {
    pub buf: BytesMut,
    /// The body was read to its end (what `buf` holds comes after it).
    pub finished: bool,
}

/// Why a request body could not be read.
#[derive(Debug, thiserror::Error)]
pub enum BodyError {
    #[error("the client closed the connection before the body's end")]
    Incomplete,
    #[error("invalid chunked body: {0}")]
    Chunked(#[from] ChunkError),
    #[error("reading the request body: {0}")]
    Io(#[from] std::io::Error),
}

/// A request body on an HTTP/1 connection.
#[derive(Debug)]
pub struct Body(Kind);

#[derive(Debug)]
enum Kind {
    Empty,
    /// Came whole with the head.
    Full(Option<Bytes>),
    Stream(Box<Streaming>),
}

#[derive(Debug)]
enum Remaining {
    Length(u64),
    Chunked(ChunkedDecoder),
}

#[derive(Debug)]
struct Streaming {
    link: Arc<Link>,
    buf: BytesMut,
    remaining: Remaining,
    /// Bytes of `100 Continue` still to write before the first read.
    continue_left: usize,
    finished: bool,
}

impl Drop for Streaming {
    fn drop(&mut self) {
        let back = Handback {
            buf: std::mem::take(&mut self.buf),
            finished: self.finished,
        };
        *self.link.handback.lock().unwrap_or_else(|p| p.into_inner()) = Some(back);
    }
}

impl Body {
    pub(super) fn empty() -> Self {
        Body(Kind::Empty)
    }

    pub(super) fn full(bytes: Bytes) -> Self {
        Body(Kind::Full(Some(bytes)))
    }

    /// A body still (partly) to be read, `buf` holding what came of it so far.
    pub(super) fn streamed(
        link: Arc<Link>,
        buf: BytesMut,
        length: Option<u64>,
        expect_continue: bool,
    ) -> Self {
        let remaining = match length {
            Some(n) => Remaining::Length(n),
            None => Remaining::Chunked(ChunkedDecoder::strict()),
        };
        // The client waits for `100 Continue` only while none of its body has come.
        let continue_left = if expect_continue && buf.is_empty() {
            CONTINUE.len()
        } else {
            0
        };
        Body(Kind::Stream(Box::new(Streaming {
            link,
            buf,
            remaining,
            continue_left,
            finished: false,
        })))
    }
}

impl Streaming {
    /// Decode what the buffer holds: `Some` when it gave a frame or the end.
    fn decode(&mut self) -> Option<Result<Option<Bytes>, BodyError>> {
        match &mut self.remaining {
            Remaining::Length(0) => {
                self.finished = true;
                Some(Ok(None))
            }
            Remaining::Length(left) => {
                if self.buf.is_empty() {
                    return None;
                }
                let take = (*left).min(self.buf.len() as u64) as usize;
                *left -= take as u64;
                if *left == 0 {
                    self.finished = true;
                }
                Some(Ok(Some(self.buf.split_to(take).freeze())))
            }
            Remaining::Chunked(decoder) => match decoder.decode(&mut self.buf) {
                Ok(Decoded::Data(d)) => Some(Ok(Some(d))),
                Ok(Decoded::End) => {
                    self.finished = true;
                    Some(Ok(None))
                }
                Ok(Decoded::NeedMore) => None,
                Err(e) => Some(Err(e.into())),
            },
        }
    }

    fn poll_continue(&mut self, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        while self.continue_left > 0 {
            if self.link.answered.load(Ordering::Relaxed) {
                self.continue_left = 0;
                break;
            }
            ready!(self.link.io.poll_write_ready(cx))?;
            let from = CONTINUE.len() - self.continue_left;
            match self.link.io.try_write(&CONTINUE[from..]) {
                Ok(n) => self.continue_left -= n,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
                Err(e) => return Poll::Ready(Err(e)),
            }
        }
        Poll::Ready(Ok(()))
    }

    fn poll_next(&mut self, cx: &mut Context<'_>) -> Poll<Result<Option<Bytes>, BodyError>> {
        if self.finished {
            return Poll::Ready(Ok(None));
        }
        loop {
            if let Some(decoded) = self.decode() {
                return Poll::Ready(decoded);
            }
            ready!(self.poll_continue(cx))?;
            ready!(self.link.io.poll_read_ready(cx))?;
            let want = match self.remaining {
                Remaining::Length(left) => (left as usize).clamp(1, READ_MAX),
                Remaining::Chunked(_) => 16 * 1024,
            };
            if self.buf.capacity() - self.buf.len() < want.min(4096) {
                self.buf.reserve(want);
            }
            match self.link.io.try_read_buf(&mut self.buf) {
                Ok(0) => return Poll::Ready(Err(BodyError::Incomplete)),
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(e) => return Poll::Ready(Err(e.into())),
            }
        }
    }
}

impl http_body::Body for Body {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        match &mut self.get_mut().0 {
            Kind::Empty => Poll::Ready(None),
            Kind::Full(b) => Poll::Ready(b.take().map(|b| Ok(Frame::data(b)))),
            Kind::Stream(s) => s
                .poll_next(cx)
                .map(|r| r.transpose().map(|r| r.map(Frame::data))),
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.0 {
            Kind::Empty => true,
            Kind::Full(b) => b.is_none(),
            Kind::Stream(s) => s.finished,
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.0 {
            Kind::Empty => SizeHint::with_exact(0),
            Kind::Full(b) => SizeHint::with_exact(b.as_ref().map_or(0, |b| b.len() as u64)),
            Kind::Stream(s) => match s.remaining {
                Remaining::Length(left) => SizeHint::with_exact(left),
                Remaining::Chunked(_) => SizeHint::default(),
            },
        }
    }
}
