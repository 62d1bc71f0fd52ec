//! The chunked body decoder (`upstream::h1::chunked::ChunkedDecoder`), fed arbitrary bytes in
//! arbitrary splits, the way a pod's response body reaches it.
//!
//! Checked: it never panics and never returns data beyond its input (data out plus bytes
//! consumed by framing never exceed the bytes in); the data and the end of the body are the
//! same however the input was split; once it reports the end, every byte after the body stays
//! in the buffer; a body it decoded, chunked again with sizes of our own, decodes to the same
//! data; and a limit on what it buffers holds (it errors instead of waiting past 4 KiB for a
//! size line or trailer).
#![no_main]

use bytes::BytesMut;
use flexinfer_fuzz::{fnv1a, split_lengths, split_patterns};
use libfuzzer_sys::fuzz_target;
use routing_userspace::upstream::h1::chunked::{ChunkError, ChunkedDecoder, Decoded};

/// The most the decoder may hold while it waits for more (its `MAX_LINE`).
const WAIT_LIMIT: usize = 4096;

#[derive(Debug, PartialEq, Eq)]
struct Run {
    data: Vec<u8>,
    /// `Some(bytes left after the body)` when the decoder reported the end.
    ended: Option<Vec<u8>>,
    error: Option<ChunkError>,
}

fn feed(input: &[u8], lengths: &[usize]) -> Run {
    let mut d = ChunkedDecoder::default();
    let mut buf = BytesMut::new();
    let mut run = Run {
        data: Vec::new(),
        ended: None,
        error: None,
    };
    let mut fed = 0;
    for &n in lengths {
        buf.extend_from_slice(&input[fed..fed + n]);
        fed += n;
        loop {
            let before = buf.len();
            match d.decode(&mut buf) {
                Ok(Decoded::Data(b)) => {
                    assert!(!b.is_empty(), "empty data frame");
                    assert!(b.len() <= before, "data beyond the buffer");
                    run.data.extend_from_slice(&b);
                }
                Ok(Decoded::NeedMore) => {
                    assert!(!d.is_done());
                    assert!(
                        buf.len() <= WAIT_LIMIT,
                        "waits with {} bytes buffered",
                        buf.len()
                    );
                    break;
                }
                Ok(Decoded::End) => {
                    assert!(d.is_done());
                    assert_eq!(
                        d.decode(&mut buf),
                        Ok(Decoded::End),
                        "the end stays the end"
                    );
                    let mut rest = buf.to_vec();
                    rest.extend_from_slice(&input[fed..]);
                    assert!(input.ends_with(&rest));
                    run.ended = Some(rest);
                    return run;
                }
                Err(e) => {
                    run.error = Some(e);
                    return run;
                }
            }
            let consumed = fed - buf.len();
            assert!(
                run.data.len() <= consumed,
                "more data out than bytes consumed"
            );
        }
    }
    assert!(run.data.len() <= input.len());
    run
}

/// `data` chunked again, with chunk sizes drawn from `seed`.
fn rechunk(data: &[u8], seed: u64) -> Vec<u8> {
    let mut out = Vec::new();
    let mut at = 0;
    for n in split_lengths(data.len(), seed, 300) {
        out.extend_from_slice(format!("{n:x}\r\n").as_bytes());
        out.extend_from_slice(&data[at..at + n]);
        out.extend_from_slice(b"\r\n");
        at += n;
    }
    out.extend_from_slice(b"0\r\n\r\n");
    out
}

fuzz_target!(|data: &[u8]| {
    let mut first: Option<Run> = None;
    for lengths in split_patterns(data) {
        let run = feed(data, &lengths);
        match &first {
            None => first = Some(run),
            Some(f) => assert_eq!(&run, f, "split {lengths:?} decodes differently"),
        }
    }
    let run = first.expect("at least one pattern");
    if run.ended.is_some() {
        let again = rechunk(&run.data, fnv1a(data));
        for lengths in split_patterns(&again) {
            let r = feed(&again, &lengths);
            assert_eq!(r.data, run.data, "re-chunked body decodes differently");
            assert_eq!(r.ended, Some(Vec::new()));
        }
    }
});
