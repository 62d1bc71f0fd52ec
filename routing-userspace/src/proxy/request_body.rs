//! A client's request body, whichever protocol carried it: the proxy's own HTTP/1 connection
//! ([`super::h1`]) or hyper's (h2c, and a connection whose first bytes did not yet tell).

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;

/// Why a request body could not be read, from either protocol.
pub type BodyError = Box<dyn std::error::Error + Send + Sync>;

#[derive(Debug)]
pub enum RequestBody {
    Http1(super::h1::Body),
    Hyper(Incoming),
}

impl Body for RequestBody {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        match self.get_mut() {
            RequestBody::Http1(b) => Pin::new(b).poll_frame(cx).map_err(Into::into),
            RequestBody::Hyper(b) => Pin::new(b).poll_frame(cx).map_err(Into::into),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            RequestBody::Http1(b) => b.is_end_stream(),
            RequestBody::Hyper(b) => b.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            RequestBody::Http1(b) => b.size_hint(),
            RequestBody::Hyper(b) => b.size_hint(),
        }
    }
}
