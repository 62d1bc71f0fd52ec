//! Phase 6, stream back: the pod's response head (its hop-by-hop headers were never read into
//! it) and its body, frame by frame as they arrive (SSE is never buffered). The body carries
//! the request's context: at the end of the body the context ends (the record phase), and the
//! upstream body gives its connection back to the pool; if the client goes away first, both
//! are dropped (the connection closes, the context still records).
//!
//! A body that stops (the pod dies, nothing arrives within the stream idle timeout, the
//! request timeout passes, or the proxy's drain timeout cuts it) ends an SSE stream with a
//! final `data: {"error": ...}` event, so the client reads an error instead of a cut stream;
//! any other body is aborted (the client sees a truncated response, which is all HTTP/1.1
//! allows once the head is out).

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::Response;
use http_body::{Body, Frame, SizeHint};
use serde_json::json;
use tokio::sync::futures::OwnedNotified;
use tokio::sync::Notify;
use tokio::time::Sleep;

use super::context::RequestCtx;
use super::forward::Forwarded;
use crate::signals::UsageObserver;
use crate::upstream::h1::response::BodyError;
use crate::upstream::UpstreamBody;

/// When a response body gives up.
#[derive(Debug, Clone, Default)]
pub struct Deadlines {
    /// Longest pause between frames (zero: none).
    pub idle: Duration,
    /// The request's end (none: no limit).
    pub end: Option<tokio::time::Instant>,
    /// Ends the body when the proxy's drain timeout passes.
    pub drain: Option<Arc<DrainCut>>,
}

/// Set when the drain timeout passed with responses still streaming: each of them ends as a
/// failed body does (an SSE stream with a final `proxy_shutdown` event) before the process
/// exits, instead of a bare close.
#[derive(Debug, Default)]
pub struct DrainCut {
    cut: AtomicBool,
    notify: Arc<Notify>,
}

impl DrainCut {
    pub fn trigger(&self) {
        self.cut.store(true, Ordering::Release);
        self.notify.notify_waiters();
    }

    fn is_cut(&self) -> bool {
        self.cut.load(Ordering::Acquire)
    }
}

pub struct ObservedBody {
    inner: UpstreamBody,
    ctx: Option<RequestCtx>,
    sse: bool,
    deadlines: Deadlines,
    /// Armed when the body first has to wait (a body that is all there never allocates one).
    idle: Option<Pin<Box<Sleep>>>,
    end: Option<Pin<Box<Sleep>>>,
    drain: Option<Pin<Box<OwnedNotified>>>,
    /// Finds the answer's `usage` as it streams by (successful JSON and SSE answers).
    usage: Option<UsageObserver>,
    done: bool,
}

/// The opt-in routing header (`--route-header`): how the request was routed, never its key.
pub const ROUTE_HEADER: http::HeaderName = http::HeaderName::from_static("x-flexinfer-route");

/// The client's response for a forwarded request; `route_header` adds [`ROUTE_HEADER`].
pub fn respond(
    f: Forwarded,
    mut ctx: RequestCtx,
    deadlines: Deadlines,
    route_header: bool,
) -> Response<Box<ObservedBody>> {
    // The pod's end-to-end fields travel with its body (`UpstreamBody::fields`), its
    // hop-by-hop ones were read and left out (see upstream::h1::head); the map holds only what
    // the proxy adds.
    let (mut parts, inner) = f.response.into_parts();
    if let Some(d) = ctx.decision.as_ref().filter(|_| route_header) {
        parts.headers.insert(ROUTE_HEADER, d.route_header());
    }
    ctx.status = Some(parts.status.as_u16());
    let content_type = inner.fields().get(http::header::CONTENT_TYPE.as_str());
    let sse = content_type.is_some_and(|v| v.starts_with(b"text/event-stream"));
    let usage = match parts.status.is_success() {
        true => UsageObserver::for_content_type(content_type),
        false => None,
    };
    // Boxed as it is made (the server keeps the box, see `ProxyBody`): built on the stack
    // and boxed after, the body (the request's context inside) was copied twice more.
    let mut body = Box::new(ObservedBody {
        inner,
        ctx: Some(ctx),
        sse,
        deadlines,
        idle: None,
        end: None,
        drain: None,
        usage,
        done: false,
    });
    if body.inner.is_end_stream() {
        // No body at all (204, HEAD, `content-length: 0`): it is over already.
        body.finish();
    }
    Response::from_parts(parts, body)
}

/// The final event of an SSE stream that could not finish.
fn sse_error(code: &str, message: &str) -> Bytes {
    let event = json!({"error": {"message": message, "type": "upstream_error", "code": code}});
    Bytes::from(format!("data: {event}\n\n"))
}

impl super::h1::response::CarriesFields for ObservedBody {
    fn take_fields(&mut self) -> Option<crate::upstream::h1::fields::Fields> {
        Some(self.inner.take_fields())
    }
}

impl ObservedBody {
    /// The body was read to its end: the request is over (what its usage said goes with it).
    fn finish(&mut self) {
        self.done = true;
        if let (Some(ctx), Some(usage)) = (self.ctx.as_mut(), self.usage.take()) {
            ctx.usage = usage.usage();
        }
        self.ctx.take();
    }

    /// The body cannot finish: an SSE stream gets an error event (then ends); others abort.
    fn fail(
        &mut self,
        code: &str,
        message: String,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        if let Some(ctx) = &self.ctx {
            if let Some(d) = &ctx.decision {
                tracing::warn!(model = %d.model().name, code, error = %message, "response stream ended early");
            }
        }
        self.finish();
        if self.sse {
            Poll::Ready(Some(Ok(Frame::data(sse_error(code, &message)))))
        } else {
            Poll::Ready(Some(Err(BodyError::Io(std::io::Error::other(message)))))
        }
    }

    /// Whether a deadline passed while the body waits.
    fn poll_deadlines(&mut self, cx: &mut Context<'_>) -> Option<(&'static str, String)> {
        if let Some(cut) = &self.deadlines.drain {
            let waiting = self
                .drain
                .get_or_insert_with(|| Box::pin(Arc::clone(&cut.notify).notified_owned()));
            // The flag is read after the wait is registered, so a trigger in between counts.
            if waiting.as_mut().poll(cx).is_ready() || cut.is_cut() {
                return Some((
                    "proxy_shutdown",
                    "the proxy is shutting down and its drain timeout passed".into(),
                ));
            }
        }
        if let Some(end) = self.deadlines.end {
            let sleep = self
                .end
                .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(end)));
            if sleep.as_mut().poll(cx).is_ready() {
                return Some(("request_timeout", "the request timeout passed".into()));
            }
        }
        let idle = self.deadlines.idle;
        if !idle.is_zero() {
            let sleep = self
                .idle
                .get_or_insert_with(|| Box::pin(tokio::time::sleep(idle)));
            if sleep.as_mut().poll(cx).is_ready() {
                return Some((
                    "upstream_idle_timeout",
                    format!("no data from the upstream for {idle:?}"),
                ));
            }
        }
        None
    }
}

impl Body for ObservedBody {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        if self.done {
            return Poll::Ready(None);
        }
        match Pin::new(&mut self.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                let end = self.inner.is_end_stream();
                if let (Some(usage), Some(data)) = (self.usage.as_mut(), frame.data_ref()) {
                    usage.feed(data);
                }
                if let Some(ctx) = self.ctx.as_mut() {
                    if ctx.first_byte.is_none() && frame.is_data() {
                        let now = Instant::now();
                        ctx.first_byte = Some(now);
                        // A streamed answer's first token: its prompt is in the pod's cache.
                        if let Some(d) = &ctx.decision {
                            d.prefilled();
                        }
                        if end {
                            ctx.end = Some(now);
                        }
                    }
                }
                // Progress: the idle timer starts over from the next wait.
                let idle_for = self.deadlines.idle;
                if let Some(idle) = self.idle.as_mut() {
                    idle.as_mut().reset(tokio::time::Instant::now() + idle_for);
                }
                // A body of known length ends with its last frame; the server stops polling
                // then, so this is where the end is seen.
                if end {
                    self.finish();
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(None) => {
                self.finish();
                Poll::Ready(None)
            }
            Poll::Ready(Some(Err(e))) => self.fail("upstream_stream_broken", e.to_string()),
            Poll::Pending => match self.poll_deadlines(cx) {
                Some((code, message)) => self.fail(code, message),
                None => Poll::Pending,
            },
        }
    }

    fn is_end_stream(&self) -> bool {
        self.done || self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The streamed body is boxed once per response; past 1,032 bytes glibc's malloc serves a
    /// request from its slow path (and merges free chunks first) instead of the per-thread
    /// cache, which cost about 1,100 instructions per short request.
    #[test]
    fn the_streamed_body_box_stays_in_mallocs_per_thread_cache() {
        let size = std::mem::size_of::<ObservedBody>();
        assert!(size <= 1024, "ObservedBody is {size} bytes");
    }
}
