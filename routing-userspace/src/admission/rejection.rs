//! Why a request was not admitted, and the OpenAI-shaped answer it gets.
//!
//! Queue and budget refusals are `429` with `Retry-After` (the client may come back); a drain
//! is `503 proxy_shutdown` (another proxy of the fleet can take it); a model removed while its
//! requests waited is the `404` any request for it now gets. The reason's string form is the
//! `reason` label of `flexinfer_proxy_admission_rejections_total`.

use std::time::Duration;

use bytes::Bytes;
use http::{Response, StatusCode};
use http_body_util::Full;

use crate::proxy::errors::ApiError;

/// A request admission turned away.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rejection {
    /// The queue was full and nothing in it could make room.
    QueueFull { retry_after: Duration },
    /// Dropped from the full queue to make room for a request of higher priority.
    Shed { retry_after: Duration },
    /// Waited its whole queue timeout.
    QueueTimeout {
        waited: Duration,
        retry_after: Duration,
    },
    /// The tenant's token budget does not hold this request's estimate yet.
    RateLimited { retry_after: Duration },
    /// The proxy is shutting down and no room appeared before the drain deadline.
    Shutdown,
    /// The model went away while the request waited.
    ModelRemoved,
}

/// The metric label of a rejection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Reason {
    QueueFull,
    Shed,
    QueueTimeout,
    RateLimited,
    Shutdown,
    ModelRemoved,
}

impl Reason {
    pub const ALL: [Reason; 6] = [
        Reason::QueueFull,
        Reason::Shed,
        Reason::QueueTimeout,
        Reason::RateLimited,
        Reason::Shutdown,
        Reason::ModelRemoved,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Reason::QueueFull => "queue_full",
            Reason::Shed => "shed",
            Reason::QueueTimeout => "queue_timeout",
            Reason::RateLimited => "rate_limited",
            Reason::Shutdown => "proxy_shutdown",
            Reason::ModelRemoved => "model_removed",
        }
    }

    pub fn index(self) -> usize {
        self as usize
    }
}

/// Whole seconds, rounded up, at least 1 (the `Retry-After` of a 429).
pub fn retry_after_secs(d: Duration) -> u64 {
    let s = d.as_secs() + u64::from(d.subsec_nanos() > 0);
    s.max(1)
}

impl Rejection {
    pub fn reason(&self) -> Reason {
        match self {
            Rejection::QueueFull { .. } => Reason::QueueFull,
            Rejection::Shed { .. } => Reason::Shed,
            Rejection::QueueTimeout { .. } => Reason::QueueTimeout,
            Rejection::RateLimited { .. } => Reason::RateLimited,
            Rejection::Shutdown => Reason::Shutdown,
            Rejection::ModelRemoved => Reason::ModelRemoved,
        }
    }

    pub fn status(&self) -> StatusCode {
        match self {
            Rejection::Shutdown => StatusCode::SERVICE_UNAVAILABLE,
            Rejection::ModelRemoved => StatusCode::NOT_FOUND,
            _ => StatusCode::TOO_MANY_REQUESTS,
        }
    }

    /// The `code` of the error JSON.
    pub fn code(&self) -> &'static str {
        match self {
            Rejection::QueueFull { .. } | Rejection::Shed { .. } => "queue_full",
            Rejection::QueueTimeout { .. } => "queue_timeout",
            Rejection::RateLimited { .. } => "rate_limited",
            Rejection::Shutdown => "proxy_shutdown",
            Rejection::ModelRemoved => "model_not_found",
        }
    }

    /// The `Retry-After` seconds, for the answers that have one.
    pub fn retry_after(&self) -> Option<u64> {
        match self {
            Rejection::QueueFull { retry_after }
            | Rejection::Shed { retry_after }
            | Rejection::QueueTimeout { retry_after, .. }
            | Rejection::RateLimited { retry_after } => Some(retry_after_secs(*retry_after)),
            // Another proxy of the fleet can serve it at once.
            Rejection::Shutdown => Some(1),
            Rejection::ModelRemoved => None,
        }
    }

    /// The OpenAI-shaped error for a request of `model`.
    pub fn api_error(&self, model: &str) -> ApiError {
        if let Rejection::ModelRemoved = self {
            return ApiError::model_not_found(model);
        }
        let message = match self {
            Rejection::QueueFull { .. } => format!(
                "The pods of model `{model}` are busy and its queue is full; retry later."
            ),
            Rejection::Shed { .. } => format!(
                "The queue of model `{model}` is full and this request was dropped for one of higher priority; retry later."
            ),
            Rejection::QueueTimeout { waited, .. } => format!(
                "The request waited {waited:?} in the queue of model `{model}` without a pod becoming free; retry later."
            ),
            Rejection::RateLimited { .. } => format!(
                "The token budget of this tenant for model `{model}` is spent; retry after the Retry-After seconds."
            ),
            _ => "The proxy is shutting down and no pod became free before its drain deadline; retry on another proxy.".to_owned(),
        };
        ApiError {
            status: self.status(),
            kind: if self.status() == StatusCode::TOO_MANY_REQUESTS {
                "rate_limit_error"
            } else {
                "service_unavailable"
            },
            code: self.code(),
            message,
            retry_after: self.retry_after(),
        }
    }

    /// The whole answer: the error JSON, with `Retry-After` where it has one.
    pub fn into_response(self, model: &str) -> Response<Full<Bytes>> {
        self.api_error(model).into_response()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

    const S: Duration = Duration::from_secs(1);

    #[test]
    fn retry_after_rounds_up_to_whole_seconds_and_is_at_least_one() {
        assert_eq!(retry_after_secs(Duration::ZERO), 1);
        assert_eq!(retry_after_secs(Duration::from_millis(1)), 1);
        assert_eq!(retry_after_secs(Duration::from_millis(1001)), 2);
        assert_eq!(retry_after_secs(Duration::from_secs(30)), 30);
    }

    #[tokio::test]
    async fn every_rejection_is_an_openai_error_with_its_status_code_and_retry_after() {
        for (r, status, code, retry) in [
            (
                Rejection::QueueFull { retry_after: 3 * S },
                429,
                "queue_full",
                Some("3"),
            ),
            (
                Rejection::Shed { retry_after: S / 2 },
                429,
                "queue_full",
                Some("1"),
            ),
            (
                Rejection::QueueTimeout {
                    waited: 30 * S,
                    retry_after: 30 * S,
                },
                429,
                "queue_timeout",
                Some("30"),
            ),
            (
                Rejection::RateLimited {
                    retry_after: Duration::from_millis(4200),
                },
                429,
                "rate_limited",
                Some("5"),
            ),
            (Rejection::Shutdown, 503, "proxy_shutdown", Some("1")),
            (Rejection::ModelRemoved, 404, "model_not_found", None),
        ] {
            let resp = r.into_response("m");
            assert_eq!(resp.status().as_u16(), status, "{r:?}");
            assert_eq!(
                resp.headers()
                    .get(http::header::RETRY_AFTER)
                    .map(|v| v.to_str().unwrap()),
                retry,
                "{r:?}"
            );
            let body = resp.into_body().collect().await.unwrap().to_bytes();
            let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
            assert_eq!(v["error"]["code"], code, "{r:?}");
            assert!(
                v["error"]["message"].as_str().unwrap().contains("`m`") || r == Rejection::Shutdown,
                "{v}"
            );
        }
    }
}
