//! Percent-decoding (`%XX`, RFC 3986), strict: a path segment that names a model and the values
//! of `OTEL_EXPORTER_OTLP_HEADERS` both use it. A cut escape, one that is not two hex digits,
//! or bytes that do not decode to UTF-8 make the whole string invalid: a name is never guessed.

use std::borrow::Cow;

/// `s` with its `%XX` escapes decoded (borrowed when it has none); `None` when it is invalid.
pub fn decode(s: &str) -> Option<Cow<'_, str>> {
    if !s.contains('%') {
        return Some(Cow::Borrowed(s));
    }
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = b.get(i + 1..i + 3)?;
            out.push(hex_digit(hex[0])? << 4 | hex_digit(hex[1])?);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok().map(Cow::Owned)
}

fn hex_digit(c: u8) -> Option<u8> {
    (c as char).to_digit(16).map(|d| d as u8)
}

#[cfg(test)]
mod tests {
    use super::decode;

    #[test]
    fn escapes_decode_and_broken_ones_make_the_string_invalid() {
        assert_eq!(decode("plain").as_deref(), Some("plain"));
        assert_eq!(decode("Bearer%20t0ken").as_deref(), Some("Bearer t0ken"));
        assert_eq!(decode("a%2Cb%2c").as_deref(), Some("a,b,"));
        assert_eq!(decode("caf%C3%A9").as_deref(), Some("café"));
        for bad in ["%", "%2", "x%zz", "%+1", "%-1", "%C3", "%FF"] {
            assert_eq!(decode(bad), None, "{bad}");
        }
    }
}
