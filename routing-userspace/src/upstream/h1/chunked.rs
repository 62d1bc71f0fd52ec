//! Decoding `Transfer-Encoding: chunked` (RFC 9112 section 7.1), incrementally, from the front
//! of a read buffer. Data is split off the buffer without copying, and the framing is stepped
//! over (`advance`: no handle on the buffer made and dropped per size line). Extensions and
//! trailers are read and dropped (the proxy forwards the data and frames it anew for the
//! client). Sizes, extension and trailer lengths are bounded, so a hostile peer cannot make
//! it buffer without end. A pod's answer may end its lines with a bare LF; a client's request
//! body is decoded [`ChunkedDecoder::strict`]: CRLF only, and no control byte in an extension,
//! since a framing read two ways is how a request gets smuggled past the proxy.

use bytes::{Buf, Bytes, BytesMut};

/// Longest chunk-size line (size, extensions and CRLF) or trailer line accepted.
const MAX_LINE: usize = 4096;
/// A client's trailer section (strict): at most this many lines, and fewer bytes than
/// [`MAX_TRAILER_BYTES`] with its closing CRLF; hyper's server limits, so that no request is
/// read whole here that hyper would refuse.
const MAX_TRAILER_LINES: u32 = 100;
const MAX_TRAILER_BYTES: usize = 16 * 1024;

/// What the decoder got out of the buffer.
#[derive(Debug, PartialEq, Eq)]
pub enum Decoded {
    /// Chunk data (possibly part of a chunk).
    Data(Bytes),
    /// More bytes are needed.
    NeedMore,
    /// The last chunk and the trailers were read: the body is over.
    End,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ChunkError {
    #[error("invalid chunk size line")]
    BadSize,
    #[error("chunk size line or trailers longer than {MAX_LINE} bytes")]
    TooLong,
    #[error("chunk data not followed by CRLF")]
    MissingCrlf,
    #[error("a line of the chunked framing ends with a bare LF")]
    BareLf,
    #[error("a trailer line is not a header field")]
    BadTrailer,
    #[error("more than {MAX_TRAILER_LINES} trailer lines, or {MAX_TRAILER_BYTES} bytes of them")]
    TooManyTrailers,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// At the start of a chunk-size line.
    Size,
    /// Inside chunk data, this much left.
    Data(u64),
    /// After chunk data, expecting CRLF.
    DataEnd,
    /// After the last chunk: trailer lines until an empty one.
    Trailers,
    Done,
}

#[derive(Debug)]
pub struct ChunkedDecoder {
    state: State,
    /// CRLF only, and no control byte in an extension (a client's body).
    strict: bool,
    /// Trailer lines and bytes read so far (counted when strict).
    trailer_lines: u32,
    trailer_bytes: usize,
}

impl Default for ChunkedDecoder {
    fn default() -> Self {
        Self {
            state: State::Size,
            strict: false,
            trailer_lines: 0,
            trailer_bytes: 0,
        }
    }
}

/// The index just past the first CRLF (or bare LF) in `buf`, if there is one.
fn line_end(buf: &[u8]) -> Option<usize> {
    memchr::memchr(b'\n', buf).map(|i| i + 1)
}

/// `line` (its CRLF cut) is a header field: a token, a colon, and a value with no control byte
/// but tab.
fn is_field_line(line: &[u8]) -> bool {
    let Some(colon) = line.iter().position(|&b| b == b':') else {
        return false;
    };
    let tchar = |b: u8| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b);
    colon > 0
        && line[..colon].iter().all(|&b| tchar(b))
        && line[colon + 1..]
            .iter()
            .all(|&b| b == b'\t' || (b >= 0x20 && b != 0x7f))
}

/// `line` (ending in LF) ends in CRLF.
fn ends_crlf(line: &[u8]) -> bool {
    line.len() >= 2 && line[line.len() - 2] == b'\r'
}

fn parse_size(line: &[u8], strict: bool) -> Result<u64, ChunkError> {
    if strict && !ends_crlf(line) {
        return Err(ChunkError::BareLf);
    }
    let line = line.strip_suffix(b"\n").ok_or(ChunkError::BadSize)?;
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    let digits_end = line
        .iter()
        .position(|b| !b.is_ascii_hexdigit())
        .unwrap_or(line.len());
    let (digits, rest) = line.split_at(digits_end);
    if digits.is_empty() {
        return Err(ChunkError::BadSize);
    }
    // Leading zeros are no part of the size's width (hyper reads `000...05` as 5).
    let significant = digits
        .iter()
        .position(|&b| b != b'0')
        .unwrap_or(digits.len() - 1);
    let digits = &digits[significant..];
    if digits.len() > 16 {
        return Err(ChunkError::BadSize);
    }
    if strict && rest.iter().any(|&b| (b < 0x20 && b != b'\t') || b == 0x7f) {
        return Err(ChunkError::BadSize);
    }
    // Anything after the size is white space and `;extensions`.
    let rest = rest.trim_ascii_start();
    if !rest.is_empty() && rest[0] != b';' {
        return Err(ChunkError::BadSize);
    }
    let text = std::str::from_utf8(digits).map_err(|_| ChunkError::BadSize)?;
    u64::from_str_radix(text, 16).map_err(|_| ChunkError::BadSize)
}

impl ChunkedDecoder {
    /// A decoder for a client's body: CRLF only, no control byte in an extension.
    pub fn strict() -> Self {
        Self {
            strict: true,
            ..Self::default()
        }
    }

    pub fn is_done(&self) -> bool {
        self.state == State::Done
    }

    /// Decode what `buf` holds from its front, consuming what was decoded.
    pub fn decode(&mut self, buf: &mut BytesMut) -> Result<Decoded, ChunkError> {
        loop {
            match self.state {
                State::Done => return Ok(Decoded::End),
                State::Size => {
                    let Some(end) = line_end(buf) else {
                        return if buf.len() > MAX_LINE {
                            Err(ChunkError::TooLong)
                        } else {
                            Ok(Decoded::NeedMore)
                        };
                    };
                    if end > MAX_LINE {
                        return Err(ChunkError::TooLong);
                    }
                    let size = parse_size(&buf[..end], self.strict)?;
                    buf.advance(end);
                    self.state = if size == 0 {
                        State::Trailers
                    } else {
                        State::Data(size)
                    };
                }
                State::Data(left) => {
                    if buf.is_empty() {
                        return Ok(Decoded::NeedMore);
                    }
                    let take = left.min(buf.len() as u64) as usize;
                    let data = buf.split_to(take).freeze();
                    let left = left - take as u64;
                    self.state = if left == 0 {
                        State::DataEnd
                    } else {
                        State::Data(left)
                    };
                    return Ok(Decoded::Data(data));
                }
                State::DataEnd => {
                    if buf.first() == Some(&b'\n') && !self.strict {
                        buf.advance(1);
                    } else if buf.len() < 2 {
                        if buf.first().is_some_and(|&b| b != b'\r') {
                            return Err(ChunkError::MissingCrlf);
                        }
                        return Ok(Decoded::NeedMore);
                    } else if &buf[..2] == b"\r\n" {
                        buf.advance(2);
                    } else {
                        return Err(ChunkError::MissingCrlf);
                    }
                    self.state = State::Size;
                }
                State::Trailers => {
                    // A client's trailer line may be as long as the section's room allows.
                    let (longest, too_long) = if self.strict {
                        (
                            MAX_TRAILER_BYTES - 1 - self.trailer_bytes,
                            ChunkError::TooManyTrailers,
                        )
                    } else {
                        (MAX_LINE, ChunkError::TooLong)
                    };
                    let Some(end) = line_end(buf) else {
                        return if buf.len() > longest {
                            Err(too_long)
                        } else {
                            Ok(Decoded::NeedMore)
                        };
                    };
                    if end > longest {
                        return Err(too_long);
                    }
                    if self.strict && !ends_crlf(&buf[..end]) {
                        return Err(ChunkError::BareLf);
                    }
                    let empty = &buf[..end] == b"\r\n" || &buf[..end] == b"\n";
                    if self.strict && !empty {
                        if !is_field_line(&buf[..end - 2]) {
                            return Err(ChunkError::BadTrailer);
                        }
                        self.trailer_lines += 1;
                        if self.trailer_lines > MAX_TRAILER_LINES {
                            return Err(ChunkError::TooManyTrailers);
                        }
                    }
                    self.trailer_bytes += end;
                    buf.advance(end);
                    if empty {
                        self.state = State::Done;
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Decode `input` fed in pieces of `step` bytes; returns the data and whether it ended.
    fn run(input: &[u8], step: usize) -> Result<(Vec<u8>, bool, usize), ChunkError> {
        let mut d = ChunkedDecoder::default();
        let mut buf = BytesMut::new();
        let mut out = Vec::new();
        for piece in input.chunks(step.max(1)) {
            buf.extend_from_slice(piece);
            loop {
                match d.decode(&mut buf)? {
                    Decoded::Data(b) => out.extend_from_slice(&b),
                    Decoded::NeedMore => break,
                    Decoded::End => return Ok((out, true, buf.len())),
                }
            }
        }
        Ok((out, false, buf.len()))
    }

    #[test]
    fn decodes_in_any_split() {
        let body = b"5\r\nhello\r\n1;ext=1\r\n \r\n6\r\nworld!\r\n0\r\nX-Trailer: t\r\n\r\nNEXT";
        for step in [1, 2, 3, 7, 100] {
            let (data, ended, left) = run(body, step).unwrap();
            assert_eq!(data, b"hello world!", "step {step}");
            assert!(ended);
            if step >= 100 {
                assert_eq!(left, 4, "bytes after the body stay in the buffer");
            }
        }
        let (data, ended, _) = run(b"A\r\n0123456789\r\n0\r\n\r\n", 4).unwrap();
        assert_eq!((data.as_slice(), ended), (&b"0123456789"[..], true));
        let (_, ended, _) = run(b"5\r\nhel", 3).unwrap();
        assert!(!ended, "a cut body has not ended");
    }

    #[test]
    fn strict_refuses_bare_lf_and_control_bytes_in_extensions() {
        let strict = |input: &[u8]| -> Result<Vec<u8>, ChunkError> {
            let mut d = ChunkedDecoder::strict();
            let mut buf = BytesMut::from(input);
            let mut out = Vec::new();
            loop {
                match d.decode(&mut buf)? {
                    Decoded::Data(b) => out.extend_from_slice(&b),
                    Decoded::NeedMore | Decoded::End => return Ok(out),
                }
            }
        };
        assert_eq!(
            strict(b"5;name=v\r\nhello\r\n0\r\nT: 1\r\n\r\n").unwrap(),
            b"hello"
        );
        assert_eq!(strict(b"5\nhello\r\n0\r\n\r\n"), Err(ChunkError::BareLf));
        assert_eq!(
            strict(b"5\r\nhello\n0\r\n\r\n"),
            Err(ChunkError::MissingCrlf)
        );
        assert_eq!(strict(b"5\r\nhello\r\n0\r\n\n"), Err(ChunkError::BareLf));
        assert_eq!(strict(b"5;a\rb\r\nhello\r\n"), Err(ChunkError::BadSize));
        assert_eq!(strict(b"5;a\x00\r\nhello\r\n"), Err(ChunkError::BadSize));
        assert_eq!(strict(b"5\r\r\nhello\r\n"), Err(ChunkError::BadSize));
        assert_eq!(
            strict(b"0\r\n\r\x01 x\r\n\r\n"),
            Err(ChunkError::BadTrailer)
        );
        assert_eq!(
            strict(b"0\r\nno colon\r\n\r\n"),
            Err(ChunkError::BadTrailer)
        );
        assert_eq!(
            strict(b"0\r\nX-T: a\x00\r\n\r\n"),
            Err(ChunkError::BadTrailer)
        );
        // hyper's limits on a trailer section: 100 lines, and under 16 KiB with its last CRLF.
        let lines = |n: usize| {
            let mut b = b"0\r\n".to_vec();
            for _ in 0..n {
                b.extend_from_slice(b"X-T: 1\r\n");
            }
            b.extend_from_slice(b"\r\n");
            b
        };
        assert!(strict(&lines(100)).is_ok());
        assert_eq!(strict(&lines(101)), Err(ChunkError::TooManyTrailers));
        // One trailer line making the section (the line, then the closing CRLF) this long.
        let bytes = |section: usize| {
            let mut b = b"0\r\nX-T: ".to_vec();
            b.extend(std::iter::repeat_n(b'a', section - 2 - 5 - 2));
            b.extend_from_slice(b"\r\n\r\n");
            b
        };
        assert!(strict(&bytes(MAX_TRAILER_BYTES - 1)).is_ok());
        assert_eq!(
            strict(&bytes(MAX_TRAILER_BYTES)),
            Err(ChunkError::TooManyTrailers)
        );
        // The lenient decoder (a pod's answer) takes the bare LFs.
        assert_eq!(run(b"5\nhello\n0\n\n", 100).unwrap().0, b"hello");
    }

    #[test]
    fn rejects_broken_framing() {
        assert_eq!(run(b"zz\r\n", 10), Err(ChunkError::BadSize));
        assert_eq!(run(b"\r\n", 10), Err(ChunkError::BadSize));
        assert_eq!(run(b"11111111111111111\r\n", 40), Err(ChunkError::BadSize));
        let padded = format!("{}5\r\nhello\r\n0\r\n\r\n", "0".repeat(40));
        assert_eq!(
            run(padded.as_bytes(), 7).unwrap().0,
            b"hello",
            "leading zeros"
        );
        let zero = format!("{}\r\n\r\n", "0".repeat(40));
        assert!(run(zero.as_bytes(), 100).unwrap().1, "a padded last chunk");
        assert_eq!(run(b"3\r\nabcXY", 10), Err(ChunkError::MissingCrlf));
        let long = vec![b'1'; MAX_LINE + 10];
        assert_eq!(run(&long, 1000), Err(ChunkError::TooLong));
        let mut long_ext = b"1;".to_vec();
        long_ext.extend(vec![b'x'; MAX_LINE + 10]);
        assert_eq!(run(&long_ext, 64), Err(ChunkError::TooLong));
    }
}
