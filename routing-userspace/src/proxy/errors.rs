//! OpenAI-shaped error responses: `{"error":{"message","type","code"}}` with the right status.

use bytes::Bytes;
use http::{header, HeaderValue, Response, StatusCode};
use http_body_util::Full;
use serde_json::json;

/// A client-facing error.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    pub status: StatusCode,
    pub kind: &'static str,
    pub code: &'static str,
    pub message: String,
    /// Seconds for a `Retry-After` header (an overloaded proxy or a spent budget says when).
    pub retry_after: Option<u64>,
}

impl ApiError {
    pub fn model_not_found(name: &str) -> Self {
        Self {
            status: StatusCode::NOT_FOUND,
            kind: "invalid_request_error",
            code: "model_not_found",
            message: format!("The model `{name}` does not exist or is not served by this proxy."),
            retry_after: None,
        }
    }

    pub fn model_required() -> Self {
        Self {
            status: StatusCode::BAD_REQUEST,
            kind: "invalid_request_error",
            code: "model_required",
            message: "No model given: set the X-Model-ID header, use a /model/<name>/ path prefix, or put \"model\" in the JSON body.".into(),
            retry_after: None,
        }
    }

    /// No model in the head, and the body that should name it is not a JSON object.
    pub fn model_in_unreadable_body() -> Self {
        Self {
            status: StatusCode::BAD_REQUEST,
            kind: "invalid_request_error",
            code: "invalid_body",
            message: "No model given, and the request body is not a JSON object to read \"model\" from: send valid JSON, or set the X-Model-ID header or a /model/<name>/ path prefix.".into(),
            retry_after: None,
        }
    }

    pub fn body_too_large(limit: usize) -> Self {
        Self {
            status: StatusCode::PAYLOAD_TOO_LARGE,
            kind: "invalid_request_error",
            code: "request_too_large",
            message: format!("The request body is larger than the proxy's limit of {limit} bytes."),
            retry_after: None,
        }
    }

    pub fn bad_body(detail: impl std::fmt::Display) -> Self {
        Self {
            status: StatusCode::BAD_REQUEST,
            kind: "invalid_request_error",
            code: "invalid_body",
            message: format!("The request body could not be read: {detail}"),
            retry_after: None,
        }
    }

    pub fn no_upstream(model: &str) -> Self {
        Self {
            status: StatusCode::SERVICE_UNAVAILABLE,
            kind: "service_unavailable",
            code: "no_ready_endpoints",
            message: format!(
                "Model `{model}` has no ready endpoints and no Service to fall back to."
            ),
            retry_after: None,
        }
    }

    pub fn upstream_unreachable(model: &str, detail: impl std::fmt::Display) -> Self {
        Self {
            status: StatusCode::BAD_GATEWAY,
            kind: "upstream_error",
            code: "upstream_unreachable",
            message: format!("No upstream of model `{model}` could be reached: {detail}"),
            retry_after: None,
        }
    }

    pub fn upstream_failed(model: &str, detail: impl std::fmt::Display) -> Self {
        Self {
            status: StatusCode::BAD_GATEWAY,
            kind: "upstream_error",
            code: "upstream_failed",
            message: format!("The upstream of model `{model}` failed: {detail}"),
            retry_after: None,
        }
    }

    pub fn upstream_timeout(model: &str, target: &str, after: std::time::Duration) -> Self {
        Self {
            status: StatusCode::GATEWAY_TIMEOUT,
            kind: "upstream_error",
            code: "upstream_timeout",
            message: format!(
                "The upstream {target} of model `{model}` sent no response within {after:?}."
            ),
            retry_after: None,
        }
    }

    pub fn request_timeout(after: std::time::Duration) -> Self {
        Self {
            status: StatusCode::GATEWAY_TIMEOUT,
            kind: "upstream_error",
            code: "request_timeout",
            message: format!("The request did not complete within {after:?}."),
            retry_after: None,
        }
    }

    pub fn header_too_large(limit: usize) -> Self {
        Self {
            status: StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            kind: "invalid_request_error",
            code: "header_too_large",
            message: format!("The request head is larger than the proxy's limit of {limit} bytes."),
            retry_after: None,
        }
    }

    pub fn method_not_allowed(method: &http::Method) -> Self {
        Self {
            status: StatusCode::METHOD_NOT_ALLOWED,
            kind: "invalid_request_error",
            code: "method_not_allowed",
            message: format!("{method} is not served by this proxy (it is not a forward proxy)."),
            retry_after: None,
        }
    }

    pub fn absolute_form() -> Self {
        Self {
            status: StatusCode::BAD_REQUEST,
            kind: "invalid_request_error",
            code: "absolute_form_not_allowed",
            message: "The request target names a host: this proxy is not a forward proxy; send the path only (e.g. POST /v1/chat/completions).".into(),
            retry_after: None,
        }
    }

    pub fn json_too_deep(limit: u32) -> Self {
        Self {
            status: StatusCode::BAD_REQUEST,
            kind: "invalid_request_error",
            code: "json_too_deep",
            message: format!(
                "The request body nests deeper than the proxy's limit of {limit} levels."
            ),
            retry_after: None,
        }
    }

    /// An HTTP/1 request head the proxy will not read (see `proxy::h1::request`).
    pub fn malformed_request(status: StatusCode, detail: impl std::fmt::Display) -> Self {
        Self {
            status,
            kind: "invalid_request_error",
            code: "malformed_request",
            message: format!("The request could not be read as HTTP/1.1: {detail}."),
            retry_after: None,
        }
    }

    /// A request head that did not arrive whole within the header-read timeout.
    pub fn head_timeout() -> Self {
        Self {
            status: StatusCode::REQUEST_TIMEOUT,
            kind: "invalid_request_error",
            code: "request_timeout",
            message: "The request head did not arrive within the proxy's header-read timeout."
                .into(),
            retry_after: None,
        }
    }

    pub fn too_many_connections() -> Self {
        Self {
            status: StatusCode::SERVICE_UNAVAILABLE,
            kind: "service_unavailable",
            code: "too_many_connections",
            message: "The proxy serves as many client connections as it may; retry shortly.".into(),
            retry_after: None,
        }
    }

    pub fn body(&self) -> Bytes {
        Bytes::from(
            json!({"error": {"message": self.message, "type": self.kind, "code": self.code}})
                .to_string(),
        )
    }

    pub fn into_response(self) -> Response<Full<Bytes>> {
        let mut r = Response::new(Full::new(self.body()));
        *r.status_mut() = self.status;
        r.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        if let Some(s) = self.retry_after {
            r.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(s));
        }
        r
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shape() {
        let e = ApiError::model_not_found("x");
        let v: serde_json::Value = serde_json::from_slice(&e.body()).unwrap();
        assert_eq!(v["error"]["code"], "model_not_found");
        assert_eq!(v["error"]["type"], "invalid_request_error");
        assert!(v["error"]["message"].as_str().unwrap().contains("`x`"));
    }
}
