//! A strict, allocation-free JSON scanner over a `str`.
//!
//! The router reads a handful of fields from request bodies that may be megabytes long, so it
//! never builds a tree: it validates the document once (same grammar and limits as
//! `serde_json`, iteratively, so deep nesting cannot overflow the stack) and hands out the raw
//! text of the values it was asked for, as slices of the `str` it was given: the body's UTF-8
//! is checked once, by whoever made that `str`, and never again for a value. Strings are
//! skipped with `memchr`, which makes a long prompt cost little more than a memory scan.
//! Escapes, including surrogate pairs, are checked here, so decoding a string that passed the
//! scan cannot fail (an unpaired surrogate decodes to U+FFFD).

/// Why a body is not a JSON document the router can read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScanError {
    /// Not valid JSON (or not UTF-8).
    Syntax,
    /// Arrays and objects nest deeper than the limit.
    TooDeep,
}

/// The nesting limit `serde_json` applies by default; bodies within it parse the same here.
pub const DEFAULT_MAX_DEPTH: u32 = 128;

#[inline]
fn is_ws(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | b'\r')
}

/// Bytes of a string read one by one before memchr takes over.
const SHORT_STRING: usize = 16;

/// Whether any byte is a control character (JSON forbids them raw inside strings).
#[inline]
fn has_control(s: &[u8]) -> bool {
    // A branch-free fold, so the compiler vectorizes it.
    s.iter().fold(0u8, |acc, &c| acc | u8::from(c < 0x20)) != 0
}

fn hex4(b: &[u8]) -> Option<u16> {
    let s = b.get(..4)?;
    let mut v: u16 = 0;
    for &c in s {
        let d = (c as char).to_digit(16)? as u16;
        v = v << 4 | d;
    }
    Some(v)
}

/// The open containers of a value being skipped, one bit each (set: object), so skipping
/// never allocates.
#[derive(Default)]
struct Kinds {
    bits: [u64; 4],
    len: u32,
}

impl Kinds {
    /// Deeper values are rejected as too deep whatever the configured limit.
    const CAPACITY: u32 = 256;

    fn len(&self) -> u32 {
        self.len
    }

    fn push(&mut self, object: bool) {
        let (w, b) = ((self.len / 64) as usize, self.len % 64);
        if object {
            self.bits[w] |= 1 << b;
        } else {
            self.bits[w] &= !(1 << b);
        }
        self.len += 1;
    }

    fn pop(&mut self) {
        self.len -= 1;
    }

    fn last(&self) -> Option<bool> {
        let top = self.len.checked_sub(1)?;
        Some(self.bits[(top / 64) as usize] >> (top % 64) & 1 == 1)
    }
}

/// An object member as raw text: `(key with its quotes, value)`.
pub type RawMember<'a> = (&'a str, &'a str);

/// A cursor over one JSON text. The text is a `str` (UTF-8 checked once, by whoever made it),
/// and every value handed out is a slice of it: values start and end at ASCII bytes, so
/// slicing is a bounds check, not a second validation.
pub struct Scanner<'a> {
    s: &'a str,
    b: &'a [u8],
    i: usize,
    max_depth: u32,
}

impl<'a> Scanner<'a> {
    pub fn new(s: &'a str, max_depth: u32) -> Self {
        Self {
            s,
            b: s.as_bytes(),
            i: 0,
            max_depth,
        }
    }

    pub fn pos(&self) -> usize {
        self.i
    }

    #[inline]
    pub fn skip_ws(&mut self) {
        while self.i < self.b.len() && is_ws(self.b[self.i]) {
            self.i += 1;
        }
    }

    #[inline]
    pub fn peek(&self) -> Option<u8> {
        self.b.get(self.i).copied()
    }

    /// Consume `c` (after white space) or fail.
    #[inline]
    pub fn expect(&mut self, c: u8) -> Result<(), ScanError> {
        self.skip_ws();
        if self.peek() == Some(c) {
            self.i += 1;
            Ok(())
        } else {
            Err(ScanError::Syntax)
        }
    }

    /// Whether only white space remains.
    pub fn at_end(&mut self) -> bool {
        self.skip_ws();
        self.i == self.b.len()
    }

    /// A string starting at the cursor (on its opening quote); returns its raw text, quotes
    /// included.
    pub fn string(&mut self) -> Result<&'a str, ScanError> {
        let start = self.i;
        if self.peek() != Some(b'"') {
            return Err(ScanError::Syntax);
        }
        let mut i = self.i + 1;
        // Most strings of a request are short (keys, roles, model names): a byte loop finds
        // their end sooner than memchr's setup does. Long ones go on by memchr.
        let short = (i + SHORT_STRING).min(self.b.len());
        while i < short {
            match self.b[i] {
                b'"' => {
                    self.i = i + 1;
                    return Ok(&self.s[start..self.i]);
                }
                b'\\' => i = self.escape(i)?,
                c if c < 0x20 => return Err(ScanError::Syntax),
                _ => i += 1,
            }
        }
        loop {
            let rest = &self.b[i..];
            let Some(k) = memchr::memchr2(b'"', b'\\', rest) else {
                return Err(ScanError::Syntax);
            };
            if has_control(&rest[..k]) {
                return Err(ScanError::Syntax);
            }
            i += k;
            if self.b[i] == b'"' {
                self.i = i + 1;
                return Ok(&self.s[start..self.i]);
            }
            i = self.escape(i)?;
        }
    }

    /// Check the escape at `i` (a backslash); returns the index after it.
    fn escape(&self, i: usize) -> Result<usize, ScanError> {
        match self.b.get(i + 1) {
            Some(b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't') => Ok(i + 2),
            Some(b'u') => {
                let hi = hex4(&self.b[i + 2..]).ok_or(ScanError::Syntax)?;
                let j = i + 6;
                // A surrogate pair is one escape. An unpaired surrogate is accepted, as
                // `serde_json` accepts it in strings it skips and Python's json (vLLM, SGLang)
                // everywhere; it decodes to U+FFFD (clients cutting a string inside a pair make
                // these, and refusing one would hide the body's model).
                if (0xD800..=0xDBFF).contains(&hi) && self.b.get(j..j + 2) == Some(b"\\u") {
                    if let Some(0xDC00..=0xDFFF) = hex4(&self.b[j + 2..]) {
                        return Ok(j + 6);
                    }
                }
                Ok(j)
            }
            _ => Err(ScanError::Syntax),
        }
    }

    fn number(&mut self) -> Result<(), ScanError> {
        let b = self.b;
        let mut i = self.i;
        if b.get(i) == Some(&b'-') {
            i += 1;
        }
        match b.get(i) {
            Some(b'0') => i += 1,
            Some(b'1'..=b'9') => {
                while b.get(i).is_some_and(u8::is_ascii_digit) {
                    i += 1;
                }
            }
            _ => return Err(ScanError::Syntax),
        }
        if b.get(i) == Some(&b'.') {
            i += 1;
            if !b.get(i).is_some_and(u8::is_ascii_digit) {
                return Err(ScanError::Syntax);
            }
            while b.get(i).is_some_and(u8::is_ascii_digit) {
                i += 1;
            }
        }
        if matches!(b.get(i), Some(b'e' | b'E')) {
            i += 1;
            if matches!(b.get(i), Some(b'+' | b'-')) {
                i += 1;
            }
            if !b.get(i).is_some_and(u8::is_ascii_digit) {
                return Err(ScanError::Syntax);
            }
            while b.get(i).is_some_and(u8::is_ascii_digit) {
                i += 1;
            }
        }
        self.i = i;
        Ok(())
    }

    fn literal(&mut self, word: &[u8]) -> Result<(), ScanError> {
        if self.b[self.i..].starts_with(word) {
            self.i += word.len();
            Ok(())
        } else {
            Err(ScanError::Syntax)
        }
    }

    /// One scalar value at the cursor (string, number or literal).
    fn scalar(&mut self) -> Result<(), ScanError> {
        match self.peek() {
            Some(b'"') => self.string().map(|_| ()),
            Some(b'-' | b'0'..=b'9') => self.number(),
            Some(b't') => self.literal(b"true"),
            Some(b'f') => self.literal(b"false"),
            Some(b'n') => self.literal(b"null"),
            _ => Err(ScanError::Syntax),
        }
    }

    /// Skip one complete value at `depth` (the number of containers already open around it)
    /// and return its raw text. Iterative: a stack of open containers instead of recursion.
    pub fn value(&mut self, depth: u32) -> Result<&'a str, ScanError> {
        self.skip_ws();
        let start = self.i;
        let mut kinds = Kinds::default();
        'value: loop {
            self.skip_ws();
            match self.peek() {
                Some(open @ (b'{' | b'[')) => {
                    if depth + kinds.len() >= self.max_depth || kinds.len() >= Kinds::CAPACITY {
                        return Err(ScanError::TooDeep);
                    }
                    self.i += 1;
                    let object = open == b'{';
                    kinds.push(object);
                    self.skip_ws();
                    let close = if object { b'}' } else { b']' };
                    if self.peek() == Some(close) {
                        self.i += 1;
                        kinds.pop();
                    } else {
                        if object {
                            self.member_key()?;
                        }
                        continue 'value;
                    }
                }
                _ => self.scalar()?,
            }
            // A value ended: close containers or move to the next element.
            loop {
                let Some(object) = kinds.last() else {
                    return Ok(&self.s[start..self.i]);
                };
                self.skip_ws();
                match (object, self.peek()) {
                    (_, Some(b',')) => {
                        self.i += 1;
                        if object {
                            self.member_key()?;
                        }
                        continue 'value;
                    }
                    (true, Some(b'}')) | (false, Some(b']')) => {
                        self.i += 1;
                        kinds.pop();
                    }
                    _ => return Err(ScanError::Syntax),
                }
            }
        }
    }

    /// `"key" :` inside an object.
    fn member_key(&mut self) -> Result<&'a str, ScanError> {
        self.skip_ws();
        let k = self.string()?;
        self.expect(b':')?;
        Ok(k)
    }

    /// The text from `start` to the cursor.
    pub fn since(&self, start: usize) -> &'a str {
        &self.s[start..self.i]
    }

    /// Fails as [`Scanner::value`] does for a container opened at `depth`.
    pub fn check_depth(&self, depth: u32) -> Result<(), ScanError> {
        match depth >= self.max_depth {
            true => Err(ScanError::TooDeep),
            false => Ok(()),
        }
    }

    /// The next key of an object opened with [`Scanner::open`], with its quotes, the cursor
    /// past its colon (read its value next); `None` at the closing brace.
    pub fn next_key(&mut self, first: bool) -> Result<Option<&'a str>, ScanError> {
        self.skip_ws();
        match self.peek() {
            Some(b'}') => {
                self.i += 1;
                return Ok(None);
            }
            Some(b',') if !first => self.i += 1,
            Some(b'"') if first => {}
            _ => return Err(ScanError::Syntax),
        }
        self.member_key().map(Some)
    }

    /// Start reading a container at the cursor: `Some(true)` for an object, `Some(false)` for
    /// an array, `None` (cursor unchanged) for anything else.
    pub fn open(&mut self) -> Option<bool> {
        self.skip_ws();
        let object = match self.peek()? {
            b'{' => true,
            b'[' => false,
            _ => return None,
        };
        self.i += 1;
        Some(object)
    }

    /// The next member of an object opened with [`Scanner::open`]: `(raw key, raw value)`, or
    /// `None` at the closing brace. `first` says whether no member was read yet.
    pub fn next_member(
        &mut self,
        first: bool,
        depth: u32,
    ) -> Result<Option<RawMember<'a>>, ScanError> {
        let Some(key) = self.next_key(first)? else {
            return Ok(None);
        };
        let value = self.value(depth)?;
        Ok(Some((key, value)))
    }

    /// Moves to the next element of an array opened with [`Scanner::open`] (past its comma);
    /// `false` at the closing `]`, which is consumed.
    pub fn element_start(&mut self, first: bool) -> Result<bool, ScanError> {
        self.skip_ws();
        match self.peek() {
            Some(b']') => {
                self.i += 1;
                Ok(false)
            }
            Some(b',') if !first => {
                self.i += 1;
                Ok(true)
            }
            Some(_) if first => Ok(true),
            _ => Err(ScanError::Syntax),
        }
    }

    /// The next element of an array opened with [`Scanner::open`], or `None` at `]`.
    pub fn next_element(&mut self, first: bool, depth: u32) -> Result<Option<&'a str>, ScanError> {
        if !self.element_start(first)? {
            return Ok(None);
        }
        self.value(depth).map(Some)
    }
}

/// Validate that `b` is exactly one JSON value (white space around it allowed).
pub fn validate(b: &[u8], max_depth: u32) -> Result<(), ScanError> {
    let Ok(text) = std::str::from_utf8(b) else {
        return Err(ScanError::Syntax);
    };
    let mut s = Scanner::new(text, max_depth);
    s.value(0)?;
    if s.at_end() {
        Ok(())
    } else {
        Err(ScanError::Syntax)
    }
}

/// Iterate over the elements of an already validated array value (`raw` is its text).
/// Yields nothing when `raw` is not an array.
pub fn elements(raw: &str) -> impl Iterator<Item = &str> {
    let mut s = Scanner::new(raw, u32::MAX);
    let mut state = match s.open() {
        Some(false) => Some(true),
        _ => None,
    };
    std::iter::from_fn(move || {
        let first = state?;
        match s.next_element(first, 1) {
            Ok(Some(v)) => {
                state = Some(false);
                Some(v)
            }
            _ => {
                state = None;
                None
            }
        }
    })
}

/// Iterate over the members of an already validated object value as `(raw key, raw value)`.
/// Yields nothing when `raw` is not an object.
pub fn members(raw: &str) -> impl Iterator<Item = (&str, &str)> {
    let mut s = Scanner::new(raw, u32::MAX);
    let mut state = match s.open() {
        Some(true) => Some(true),
        _ => None,
    };
    std::iter::from_fn(move || {
        let first = state?;
        match s.next_member(first, 1) {
            Ok(Some(kv)) => {
                state = Some(false);
                Some(kv)
            }
            _ => {
                state = None;
                None
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(s: &str) -> bool {
        validate(s.as_bytes(), DEFAULT_MAX_DEPTH).is_ok()
    }

    #[test]
    fn accepts_what_json_accepts() {
        for s in [
            r#"{}"#,
            r#" {"a":1,"b":[true,false,null,-0.5e+3,"x\"y\\z\u00e9\ud83d\ude00"],"c":{}} "#,
            r#"[]"#,
            r#""plain""#,
            "0",
            "-12.25E-4",
            r#"{"k":"héllo wörld"}"#,
        ] {
            assert!(ok(s), "{s}");
            assert!(serde_json::from_str::<serde_json::Value>(s).is_ok(), "{s}");
        }
    }

    #[test]
    fn rejects_what_json_rejects() {
        for s in [
            "",
            "{",
            r#"{"a"}"#,
            r#"{"a":1,}"#,
            r#"[1,]"#,
            r#"[1 2]"#,
            r#"{"a":01}"#,
            r#"{"a":1.}"#,
            r#"{"a":.5}"#,
            r#"{"a":tru}"#,
            "{\"a\":\"x\ny\"}",
            r#"{"a":"\x"}"#,
            r#"{} {}"#,
            r#"{'a':1}"#,
        ] {
            assert!(!ok(s), "{s:?}");
            assert!(
                serde_json::from_str::<serde_json::Value>(s).is_err(),
                "{s:?}"
            );
        }
        assert!(validate(b"{\"a\":\"\xff\"}", DEFAULT_MAX_DEPTH).is_err());
    }

    #[test]
    fn accepts_unpaired_surrogates() {
        // `serde_json::Value` refuses these, but serde skips them and Python's json (the model
        // servers') takes them; a client cutting a string inside a pair must keep its model.
        for s in [
            r#"{"a":"\ud800"}"#,
            r#"{"a":"\udc00"}"#,
            r#"{"a":"\ud800\u0041"}"#,
            r#"{"a":"cut \ud83d"}"#,
            r#"{"a":"\ude00\ud83d"}"#,
        ] {
            assert!(ok(s), "{s}");
        }
        for s in [r#"{"a":"\ud800\u00"}"#, r#"{"a":"\ud800\"}"#] {
            assert!(!ok(s), "{s}");
        }
    }

    #[test]
    fn depth_limit_without_recursion() {
        let deep = "[".repeat(100_000);
        assert_eq!(
            validate(deep.as_bytes(), DEFAULT_MAX_DEPTH),
            Err(ScanError::TooDeep)
        );
        let fine = format!("{}{}", "[".repeat(100), "]".repeat(100));
        assert!(ok(&fine));
    }

    #[test]
    fn walks_members_and_elements() {
        let raw = r#"{ "a" : [1, {"b":2}] , "c":"d" }"#;
        let m: Vec<_> = members(raw).collect();
        assert_eq!(m.len(), 2);
        assert_eq!(m[0].0, r#""a""#);
        assert_eq!(m[0].1, r#"[1, {"b":2}]"#);
        assert_eq!(m[1], (r#""c""#, r#""d""#));
        let e: Vec<_> = elements(m[0].1).collect();
        assert_eq!(e, vec!["1", r#"{"b":2}"#]);
        assert_eq!(elements("{}").count(), 0);
        assert_eq!(members("[]").count(), 0);
    }
}
