//! An ended span as the request path hands it to export: ids, times and typed attributes.
//!
//! It is built once per span on the request path, from what the request already has (static
//! names, shared `Arc<str>` model and pod names, numbers), and lives only until
//! [`super::otlp::SpanEncoder`] has written it, so it borrows its attributes, their values and
//! its error text instead of owning them (the SDK's `SpanData` copied every key and value into
//! strings of their own).

use std::sync::Arc;

use opentelemetry::trace::{SpanId, TraceId};
use smallvec::SmallVec;

/// Server (the request) or client (one upstream attempt).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SpanKind {
    Server,
    Client,
}

/// An attribute value, borrowed from what the request already holds: building a span's
/// attributes copies no string and counts no shared name up or down.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Value<'a> {
    /// A string that lives as long as the program (its address names it at export).
    Static(&'static str),
    /// A shared name (a model, a pod): export keeps a clone of the `Arc` only when it keeps
    /// an encoding of it.
    Shared(&'a Arc<str>),
    /// Any other string: encoded every time.
    Text(&'a str),
    Int(i64),
    Float(f64),
    Bool(bool),
}

impl From<&'static str> for Value<'_> {
    fn from(s: &'static str) -> Self {
        Value::Static(s)
    }
}

impl<'a> From<&'a Arc<str>> for Value<'a> {
    fn from(s: &'a Arc<str>) -> Self {
        Value::Shared(s)
    }
}

impl From<i64> for Value<'_> {
    fn from(n: i64) -> Self {
        Value::Int(n)
    }
}

impl From<f64> for Value<'_> {
    fn from(n: f64) -> Self {
        Value::Float(n)
    }
}

impl From<bool> for Value<'_> {
    fn from(b: bool) -> Self {
        Value::Bool(b)
    }
}

/// A string a trace holds until its span ends (a pod's name, a request's path).
#[derive(Debug, Clone, PartialEq)]
pub enum HeldStr {
    Static(&'static str),
    Shared(Arc<str>),
    Owned(Box<str>),
}

impl HeldStr {
    /// As an attribute value.
    pub fn value(&self) -> Value<'_> {
        match self {
            HeldStr::Static(s) => Value::Static(s),
            HeldStr::Shared(s) => Value::Shared(s),
            HeldStr::Owned(s) => Value::Text(s),
        }
    }
}

impl From<&'static str> for HeldStr {
    fn from(s: &'static str) -> Self {
        HeldStr::Static(s)
    }
}

impl From<Arc<str>> for HeldStr {
    fn from(s: Arc<str>) -> Self {
        HeldStr::Shared(s)
    }
}

/// One attribute: a semantic-convention or `flexinfer.*` name and its value.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Attribute<'a> {
    key: &'static str,
    value: Value<'a>,
}

/// What an attribute is, for export's cache of encodings: its name's address and length, and
/// its value's identity in two words (a string's address and length; a number or boolean and
/// a tag no string length can take). A value is known by identity, not content: a static
/// string by its address, a shared `Arc<str>` by its allocation (the cache holds a clone, so
/// no other string can take that address while its entry lives), integers and booleans by
/// value. Other strings and floats have none.
pub type Identity = [u64; 4];

/// The second value word of an integer's and a boolean's identity, and of the identities
/// export gives a float's and a measured integer's name (`FLOAT_NAME`, `INT_NAME`): no string's
/// length takes them, nor each other's.
const INT: u64 = u64::MAX;
const BOOL: u64 = u64::MAX - 1;
pub(crate) const FLOAT_NAME: u64 = u64::MAX - 2;
pub(crate) const INT_NAME: u64 = u64::MAX - 3;

impl<'a> Attribute<'a> {
    pub fn new(key: &'static str, value: impl Into<Value<'a>>) -> Self {
        Self {
            key,
            value: value.into(),
        }
    }

    pub fn key(&self) -> &'static str {
        self.key
    }

    pub fn value(&self) -> Value<'a> {
        self.value
    }

    /// See [`Identity`].
    pub fn identity(&self) -> Option<Identity> {
        let word = |x: usize| x as u64;
        let (x, y) = match self.value {
            Value::Static(s) => (word(s.as_ptr() as usize), word(s.len())),
            Value::Shared(s) => (word(s.as_ptr() as usize), word(s.len())),
            Value::Int(n) => (n as u64, INT),
            Value::Bool(b) => (u64::from(b), BOOL),
            Value::Text(_) | Value::Float(_) => return None,
        };
        Some([word(self.key.as_ptr() as usize), word(self.key.len()), x, y])
    }
}

/// A span's attributes: those whose values come from small sets first, then measurements.
///
/// The split is for export: most of a request span's attributes repeat from one request to the
/// next (the model, the strategy, the pod, the status), so [`super::otlp`] keeps their encoding
/// as one block per distinct set, while durations and token counts are written every time.
/// The lists live on the stack of the code that ends the span (a request span has at most 13
/// and 6; more spill to the heap).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Attributes<'a> {
    of_small_sets: SmallVec<[Attribute<'a>; 14]>,
    measured: SmallVec<[Attribute<'a>; 6]>,
}

impl Attributes<'_> {
    /// No attributes, as a constant.
    pub const EMPTY: Self = Self {
        of_small_sets: SmallVec::new_const(),
        measured: SmallVec::new_const(),
    };
}

impl<'a> Attributes<'a> {
    pub fn new() -> Self {
        Self::default()
    }

    /// An attribute whose value comes from a small set (a name, a kind, a status code, a
    /// count of retries): spans repeat it.
    pub fn set(&mut self, key: &'static str, value: impl Into<Value<'a>>) {
        self.of_small_sets.push(Attribute::new(key, value));
    }

    /// A measured attribute (a duration, a token count): it seldom repeats.
    pub fn measured(&mut self, key: &'static str, value: impl Into<Value<'a>>) {
        self.measured.push(Attribute::new(key, value));
    }

    /// The attributes from small sets, then the measured ones.
    pub fn split(&self) -> (&[Attribute<'a>], &[Attribute<'a>]) {
        (&self.of_small_sets, &self.measured)
    }
}

/// Every attribute of the list counts as one from a small set (tests and benches).
impl<'a> From<Vec<Attribute<'a>>> for Attributes<'a> {
    fn from(of_small_sets: Vec<Attribute<'a>>) -> Self {
        Self {
            of_small_sets: SmallVec::from_vec(of_small_sets),
            measured: SmallVec::new(),
        }
    }
}

/// What adds a span's own attributes when it ends, borrowing them for as long as the span's
/// list lives (`'x`), so nothing is copied or counted.
pub trait AddAttributes {
    fn add<'x>(&'x self, list: &mut Attributes<'x>);
}

/// A closure that adds only values of its own (numbers, static strings).
impl<F> AddAttributes for F
where
    F: for<'x> Fn(&mut Attributes<'x>),
{
    fn add<'x>(&'x self, list: &mut Attributes<'x>) {
        self(list)
    }
}

/// A span that has ended, as it goes to export.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EndedSpan<'a, 'v> {
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
    pub attributes: &'a Attributes<'v>,
}
