//! The response body as it streams back: frames pass through as they arrive (SSE is never
//! buffered), while a watch records time to first byte, total duration, and holds the request's
//! in-flight count until the body ends or the client goes away.

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Instant;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;
use prometheus::{Histogram, IntGauge};

use crate::load::userspace::InFlight;

/// Bookkeeping that ends with the response.
pub struct Watch {
    pub start: Instant,
    pub ttfb: Histogram,
    pub duration: Histogram,
    pub active: IntGauge,
    pub inflight: Option<InFlight>,
    pub first_seen: bool,
}

impl Drop for Watch {
    fn drop(&mut self) {
        self.duration.observe(self.start.elapsed().as_secs_f64());
        self.active.dec();
    }
}

pub struct ObservedBody {
    inner: Incoming,
    watch: Option<Watch>,
}

impl ObservedBody {
    pub fn new(inner: Incoming, watch: Watch) -> Self {
        Self {
            inner,
            watch: Some(watch),
        }
    }
}

impl Body for ObservedBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        match &polled {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(w) = self.watch.as_mut() {
                    if !w.first_seen && frame.is_data() {
                        w.first_seen = true;
                        w.ttfb.observe(w.start.elapsed().as_secs_f64());
                    }
                }
            }
            Poll::Ready(None) | Poll::Ready(Some(Err(_))) => {
                self.watch.take();
            }
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
