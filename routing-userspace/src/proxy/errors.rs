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
}

impl ApiError {
    pub fn model_not_found(name: &str) -> Self {
        Self {
            status: StatusCode::NOT_FOUND,
            kind: "invalid_request_error",
            code: "model_not_found",
            message: format!("The model `{name}` does not exist or is not served by this proxy."),
        }
    }

    pub fn model_required() -> Self {
        Self {
            status: StatusCode::BAD_REQUEST,
            kind: "invalid_request_error",
            code: "model_required",
            message: "No model given: set the X-Model-ID header, use a /model/<name>/ path prefix, or put \"model\" in the JSON body.".into(),
        }
    }

    pub fn body_too_large(limit: usize) -> Self {
        Self {
            status: StatusCode::PAYLOAD_TOO_LARGE,
            kind: "invalid_request_error",
            code: "request_too_large",
            message: format!("The request body is larger than the proxy's limit of {limit} bytes."),
        }
    }

    pub fn bad_body(detail: impl std::fmt::Display) -> Self {
        Self {
            status: StatusCode::BAD_REQUEST,
            kind: "invalid_request_error",
            code: "invalid_body",
            message: format!("The request body could not be read: {detail}"),
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
        }
    }

    pub fn upstream_unreachable(model: &str, detail: impl std::fmt::Display) -> Self {
        Self {
            status: StatusCode::BAD_GATEWAY,
            kind: "upstream_error",
            code: "upstream_unreachable",
            message: format!("No upstream of model `{model}` could be reached: {detail}"),
        }
    }

    pub fn upstream_failed(model: &str, detail: impl std::fmt::Display) -> Self {
        Self {
            status: StatusCode::BAD_GATEWAY,
            kind: "upstream_error",
            code: "upstream_failed",
            message: format!("The upstream of model `{model}` failed: {detail}"),
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
