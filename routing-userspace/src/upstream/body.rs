//! The body of a request sent upstream: bytes the proxy read (to route by them), or the
//! client's body passed through as it arrives, with the body limit still enforced.

use std::pin::Pin;
use std::task::{Context, Poll};

use crate::proxy::RequestBody;
use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};

/// A streamed body grew past the limit.
#[derive(Debug, thiserror::Error)]
#[error("request body larger than {limit} bytes")]
pub struct TooLarge {
    pub limit: usize,
}

#[derive(Debug)]
pub enum UpBody {
    /// A body read in full (possibly rewritten); `None` once sent.
    Bytes(Option<Bytes>),
    /// The client's body, streamed; `left` bytes may still pass.
    Stream {
        inner: RequestBody,
        left: usize,
        limit: usize,
    },
}

impl UpBody {
    pub fn bytes(b: Bytes) -> Self {
        UpBody::Bytes((!b.is_empty()).then_some(b))
    }

    /// The length of a body the proxy read (`None` for a streamed one, whose own length
    /// header stays).
    pub fn read_len(&self) -> Option<usize> {
        match self {
            UpBody::Bytes(b) => Some(b.as_ref().map_or(0, Bytes::len)),
            UpBody::Stream { .. } => None,
        }
    }

    pub fn stream(inner: RequestBody, limit: usize) -> Self {
        UpBody::Stream {
            inner,
            left: limit,
            limit,
        }
    }
}

impl Body for UpBody {
    type Data = Bytes;
    type Error = Box<dyn std::error::Error + Send + Sync>;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        match self.get_mut() {
            UpBody::Bytes(b) => Poll::Ready(b.take().map(|b| Ok(Frame::data(b)))),
            UpBody::Stream { inner, left, limit } => {
                match std::task::ready!(Pin::new(inner).poll_frame(cx)) {
                    Some(Ok(frame)) => {
                        if let Some(d) = frame.data_ref() {
                            if d.len() > *left {
                                return Poll::Ready(Some(Err(Box::new(TooLarge {
                                    limit: *limit,
                                }))));
                            }
                            *left -= d.len();
                        }
                        Poll::Ready(Some(Ok(frame)))
                    }
                    Some(Err(e)) => Poll::Ready(Some(Err(e))),
                    None => Poll::Ready(None),
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            UpBody::Bytes(b) => b.is_none(),
            UpBody::Stream { inner, .. } => inner.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            UpBody::Bytes(b) => SizeHint::with_exact(b.as_ref().map_or(0, |b| b.len() as u64)),
            UpBody::Stream { inner, .. } => inner.size_hint(),
        }
    }
}
