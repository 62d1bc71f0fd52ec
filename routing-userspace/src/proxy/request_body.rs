//! A client's request body, whichever protocol carried it: the proxy's own HTTP/1 connection
//! ([`super::h1`]) or hyper's (h2c, and a connection whose first bytes did not yet tell). An
//! HTTP/1 request's body carries the fields relayed unread ([`Relayed`]) to the pipeline, as a
//! pod's answer carries its fields to the client's head (a `Request` has room for a map only).

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;

use super::relayed::Relayed;

/// Why a request body could not be read, from either protocol.
pub type BodyError = Box<dyn std::error::Error + Send + Sync>;

#[derive(Debug)]
pub enum RequestBody {
    Http1(super::h1::Body, Relayed),
    Hyper(Incoming),
}

impl RequestBody {
    /// The fields to relay unread (none from hyper's connections: its map holds them all).
    pub fn take_relayed(&mut self) -> Relayed {
        match self {
            RequestBody::Http1(_, relayed) => std::mem::take(relayed),
            RequestBody::Hyper(_) => Relayed::default(),
        }
    }
}

impl Body for RequestBody {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        match self.get_mut() {
            RequestBody::Http1(b, _) => Pin::new(b).poll_frame(cx).map_err(Into::into),
            RequestBody::Hyper(b) => Pin::new(b).poll_frame(cx).map_err(Into::into),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            RequestBody::Http1(b, _) => b.is_end_stream(),
            RequestBody::Hyper(b) => b.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            RequestBody::Http1(b, _) => b.size_hint(),
            RequestBody::Hyper(b) => b.size_hint(),
        }
    }
}
