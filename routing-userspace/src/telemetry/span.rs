//! An ended span as the request path hands it to export: ids, times and typed attributes.
//!
//! It is built once per span on the request path, from what the request already has (static
//! names, shared `Arc<str>` model and pod names, numbers), and lives only until
//! [`super::otlp::SpanEncoder`] has written it, so it borrows its attributes and error text
//! instead of owning them (the SDK's `SpanData` copied every key and value into strings of
//! their own).

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
    key: &'static str,
    value: Value,
    /// Worked out once, when made: export reads it for every span that carries the attribute.
    identity: Option<Identity>,
}

/// What an attribute is, for export's cache of encodings: its name's address and length, and
/// its value's identity in two words (a string's address and length; a number or boolean and
/// a tag no string length can take). A value is known by identity, not content: a static
/// string by its address, a shared `Arc<str>` by its allocation (the cache holds a clone, so
/// no other string can take that address while its entry lives), integers and booleans by
/// value. Owned strings and floats have none.
pub type Identity = [u64; 4];

/// The second value word of an integer's and a boolean's identity, and of the identity export
/// gives a float's name (`FLOAT_NAME`): no string's length takes them, nor each other's.
const INT: u64 = u64::MAX;
const BOOL: u64 = u64::MAX - 1;
pub(crate) const FLOAT_NAME: u64 = u64::MAX - 2;

impl Attribute {
    pub fn new(key: &'static str, value: impl Into<Value>) -> Self {
        let value = value.into();
        let word = |x: usize| x as u64;
        let identity = match &value {
            Value::Static(s) => Some((word(s.as_ptr() as usize), word(s.len()))),
            Value::Shared(s) => Some((word(s.as_ptr() as usize), word(s.len()))),
            Value::Int(n) => Some((*n as u64, INT)),
            Value::Bool(b) => Some((u64::from(*b), BOOL)),
            Value::Owned(_) | Value::Float(_) => None,
        }
        .map(|(x, y)| [word(key.as_ptr() as usize), word(key.len()), x, y]);
        Self {
            key,
            value,
            identity,
        }
    }

    pub fn key(&self) -> &'static str {
        self.key
    }

    pub fn value(&self) -> &Value {
        &self.value
    }

    /// See [`Identity`].
    pub fn identity(&self) -> Option<&Identity> {
        self.identity.as_ref()
    }
}

/// A span's attributes: those whose values come from small sets first, then measurements.
///
/// The split is for export: most of a request span's attributes repeat from one request to the
/// next (the model, the strategy, the pod, the status), so [`super::otlp`] keeps their encoding
/// as one block per distinct set, while durations and token counts are written every time.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Attributes {
    of_small_sets: Vec<Attribute>,
    measured: Vec<Attribute>,
}

impl Attributes {
    pub const fn new() -> Self {
        Self {
            of_small_sets: Vec::new(),
            measured: Vec::new(),
        }
    }

    /// An attribute whose value comes from a small set (a name, a kind, a status code, a
    /// count of retries): spans repeat it.
    pub fn set(&mut self, key: &'static str, value: impl Into<Value>) {
        self.of_small_sets.push(Attribute::new(key, value));
    }

    /// A measured attribute (a duration, a token count): it seldom repeats.
    pub fn measured(&mut self, key: &'static str, value: impl Into<Value>) {
        self.measured.push(Attribute::new(key, value));
    }

    /// The attributes from small sets, then the measured ones.
    pub fn split(&self) -> (&[Attribute], &[Attribute]) {
        (&self.of_small_sets, &self.measured)
    }

    /// Empty, keeping the room (a span's attributes are built in the same lists span after
    /// span).
    pub fn clear(&mut self) {
        self.of_small_sets.clear();
        self.measured.clear();
    }
}

/// Every attribute of the list counts as one from a small set (tests and benches).
impl From<Vec<Attribute>> for Attributes {
    fn from(of_small_sets: Vec<Attribute>) -> Self {
        Self {
            of_small_sets,
            measured: Vec::new(),
        }
    }
}

/// A span that has ended, as it goes to export.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EndedSpan<'a> {
    pub trace_id: TraceId,
    pub span_id: SpanId,
    /// `SpanId::INVALID` for a root span.
    pub parent: SpanId,
    /// The parent is the client's span (it came in a `traceparent`).
    pub parent_is_remote: bool,
    /// The W3C `tracestate` that came with the client's `traceparent`.
    pub trace_state: Option<&'a str>,
    pub kind: SpanKind,
    pub name: &'static str,
    pub start_unix_nano: u64,
    pub end_unix_nano: u64,
    /// `None`: unset; `Some(message)`: an error.
    pub error: Option<&'a str>,
    pub attributes: &'a Attributes,
}
