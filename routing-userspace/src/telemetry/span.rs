//! An ended span as the request path hands it to export: ids, times and typed attributes.
//!
//! It is built once per span on the request path, so it holds what the request already has
//! (static names, shared `Arc<str>` model and pod names, numbers) instead of the SDK's
//! `SpanData`, whose attribute list and conversion to OTLP copied every key and value into
//! strings of their own. [`super::otlp`] writes it into the OTLP protobuf types at export.

use std::sync::Arc;

use opentelemetry::trace::{SpanId, TraceId};

/// Server (the request) or client (one upstream attempt).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SpanKind {
    Server,
    Client,
}

/// An attribute value, as cheap to hold as the request makes it.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    Static(&'static str),
    Shared(Arc<str>),
    Owned(String),
    Int(i64),
    Float(f64),
    Bool(bool),
}

impl From<&'static str> for Value {
    fn from(s: &'static str) -> Self {
        Value::Static(s)
    }
}

impl From<Arc<str>> for Value {
    fn from(s: Arc<str>) -> Self {
        Value::Shared(s)
    }
}

impl From<String> for Value {
    fn from(s: String) -> Self {
        Value::Owned(s)
    }
}

impl From<i64> for Value {
    fn from(n: i64) -> Self {
        Value::Int(n)
    }
}

impl From<f64> for Value {
    fn from(n: f64) -> Self {
        Value::Float(n)
    }
}

impl From<bool> for Value {
    fn from(b: bool) -> Self {
        Value::Bool(b)
    }
}

/// One attribute: a semantic-convention or `flexinfer.*` name and its value.
#[derive(Debug, Clone, PartialEq)]
pub struct Attribute {
    pub key: &'static str,
    pub value: Value,
}

impl Attribute {
    pub fn new(key: &'static str, value: impl Into<Value>) -> Self {
        Self {
            key,
            value: value.into(),
        }
    }
}

/// A span that has ended and waits for export.
#[derive(Debug, Clone, PartialEq)]
pub struct EndedSpan {
    pub trace_id: TraceId,
    pub span_id: SpanId,
    /// `SpanId::INVALID` for a root span.
    pub parent: SpanId,
    /// The parent is the client's span (it came in a `traceparent`).
    pub parent_is_remote: bool,
    /// The W3C `tracestate` that came with the client's `traceparent`.
    pub trace_state: Option<Arc<str>>,
    pub kind: SpanKind,
    pub name: &'static str,
    pub start_unix_nano: u64,
    pub end_unix_nano: u64,
    /// `None`: unset; `Some(message)`: an error.
    pub error: Option<String>,
    pub attributes: Vec<Attribute>,
}

impl EndedSpan {
    /// The attribute `key`, if the span has it.
    pub fn attribute(&self, key: &str) -> Option<&Value> {
        self.attributes
            .iter()
            .find(|a| a.key == key)
            .map(|a| &a.value)
    }
}
