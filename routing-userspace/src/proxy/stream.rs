//! Phase 6, stream back: the pod's response head (hop-by-hop headers removed) and its body,
//! frame by frame as they arrive (SSE is never buffered). The body carries the request's
//! context: at the end of the body the context ends (the record phase), and the upstream body
//! gives its connection back to the pool; if the client goes away first, both are dropped (the
//! connection closes, the context still records).

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Instant;

use bytes::Bytes;
use http::Response;
use http_body::{Body, Frame, SizeHint};

use super::context::RequestCtx;
use super::forward::Forwarded;
use super::headers;
use crate::upstream::h1::response::BodyError;
use crate::upstream::UpstreamBody;

pub struct ObservedBody {
    inner: UpstreamBody,
    ctx: Option<RequestCtx>,
}

/// The opt-in routing header (`--route-header`): how the request was routed, never its key.
pub const ROUTE_HEADER: http::HeaderName = http::HeaderName::from_static("x-flexinfer-route");

/// The client's response for a forwarded request; `route_header` adds [`ROUTE_HEADER`].
pub fn respond(f: Forwarded, mut ctx: RequestCtx, route_header: bool) -> Response<ObservedBody> {
    let (mut parts, inner) = f.response.into_parts();
    headers::strip_hop_by_hop(&mut parts.headers);
    if let Some(d) = ctx.decision.as_ref().filter(|_| route_header) {
        parts.headers.insert(ROUTE_HEADER, d.route_header());
    }
    ctx.status = Some(parts.status.as_u16());
    let mut body = ObservedBody {
        inner,
        ctx: Some(ctx),
    };
    if body.inner.is_end_stream() {
        // No body at all (204, HEAD, `content-length: 0`): it is over already.
        body.finish();
    }
    Response::from_parts(parts, body)
}

impl ObservedBody {
    /// The body was read to its end: the request is over.
    fn finish(&mut self) {
        self.ctx.take();
    }
}

impl Body for ObservedBody {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        match &polled {
            Poll::Ready(Some(Ok(frame))) => {
                let end = self.inner.is_end_stream();
                if let Some(ctx) = self.ctx.as_mut() {
                    if ctx.first_byte.is_none() && frame.is_data() {
                        let now = Instant::now();
                        ctx.first_byte = Some(now);
                        if end {
                            ctx.end = Some(now);
                        }
                    }
                }
                // A body of known length ends with its last frame; the server stops polling
                // then, so this is where the end is seen.
                if end {
                    self.finish();
                }
            }
            Poll::Ready(None) => self.finish(),
            Poll::Ready(Some(Err(_))) => self.finish(),
            Poll::Pending => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
