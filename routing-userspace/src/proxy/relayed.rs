//! A client's header fields that the proxy does not read, relayed to the pod as the lines they
//! came in.
//!
//! The proxy reads few of a request's fields ([`READ`]: the routing keys, the model, tenant and
//! priority, trace context, the forwarding, framing and hop-by-hop fields). Those go into the
//! request's header map. Every other field (an OpenAI SDK sends a dozen: `Accept`,
//! `User-Agent`, eight `X-Stainless-*`) goes to the pod as its line's bytes in the client's
//! head: no name made, no value checked again, no map insertion, nothing encoded. Each field
//! cost about 900 instructions through the map. httparse has checked the line already, and it
//! refuses exactly what `HeaderName` and `HeaderValue` refuse (tested in `proxy::h1`), so a
//! relayed line is one the map would have held.
//!
//! All fields of one name go the same way, so their order among themselves is kept; the pod
//! gets the map's fields first (the order of different names carries no meaning, RFC 9110
//! section 5.3). A client whose `Connection` header names other fields has all of its fields
//! put in the map, where those are taken out.

use bytes::Bytes;
use http::header::{self, HeaderName};

use crate::admission::priority::HEADER_PRIORITY;
use crate::admission::tenant::HEADER_TENANT;
use crate::keys::{HEADER_CACHE_KEY, HEADER_CONVERSATION_ID, HEADER_SESSION_ID};
use crate::proxy::headers::{X_FORWARDED_FOR, X_FORWARDED_HOST, X_FORWARDED_PROTO};
use crate::proxy::resolve::HEADER_MODEL_ID;
use crate::signals::orca;
use crate::telemetry::propagation::{TRACEPARENT, TRACESTATE};

/// Every name the proxy reads, removes or replaces in a request's head: a field of any other
/// name is relayed unread. A new reader of a request field adds its name here.
pub const READ: [HeaderName; 25] = [
    // Framing and the connection (read while parsing, then replaced or removed).
    header::HOST,
    header::CONTENT_LENGTH,
    header::TRANSFER_ENCODING,
    header::CONNECTION,
    header::EXPECT,
    // The rest of the hop-by-hop set (`upstream::h1::head::HOP_BY_HOP`), removed.
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
    header::TE,
    header::TRAILER,
    header::UPGRADE,
    header::PROXY_AUTHORIZATION,
    // Extended or replaced on the way to the pod.
    X_FORWARDED_FOR,
    X_FORWARDED_HOST,
    X_FORWARDED_PROTO,
    orca::REQUEST_HEADER,
    TRACEPARENT,
    TRACESTATE,
    // Routing, resolution and admission.
    HEADER_CACHE_KEY,
    HEADER_SESSION_ID,
    HEADER_CONVERSATION_ID,
    HEADER_MODEL_ID,
    HEADER_PRIORITY,
    HEADER_TENANT,
    header::AUTHORIZATION,
    // Kept with the forwarding headers the proxy appends (`Via`).
    header::VIA,
];

/// Whether the proxy reads fields named `name` (see [`READ`]).
pub fn is_read(name: &HeaderName) -> bool {
    let name = name.as_str();
    READ.iter()
        .any(|r| r.as_str().len() == name.len() && r.as_str() == name)
}

/// Most runs of adjacent relayed lines kept (in one allocation: with eight, the allocation
/// moved to a size class that cost about 300 instructions more a request). wrk sends the OpenAI
/// SDK's fields in five runs between the four the proxy reads (its header table has no order); a
/// head that needs more has all of its fields put in the map.
pub const RUNS: usize = 6;

/// The relayed lines of one request: runs of whole lines (CRLF included) in its head's bytes.
/// Boxed, and only when a line is relayed: moved inline through the request's futures, its
/// bytes cost more copying than the allocation.
#[derive(Debug, Clone, Default)]
pub struct Relayed(Option<Box<Runs>>);

#[derive(Debug, Clone)]
struct Runs {
    head: Bytes,
    runs: [(u32, u32); RUNS],
    count: u8,
}

impl Relayed {
    /// Relay the line at `start..end` of `head` (its CRLF included); `false` (and nothing
    /// kept) when it would start a run past [`RUNS`].
    pub fn push(&mut self, head: &Bytes, start: u32, end: u32) -> bool {
        let r = self.0.get_or_insert_with(|| {
            Box::new(Runs {
                head: head.clone(),
                runs: [(0, 0); RUNS],
                count: 0,
            })
        });
        let count = usize::from(r.count);
        if let Some(last) = r.runs[..count].last_mut() {
            if last.1 == start {
                last.1 = end;
                return true;
            }
        }
        if count == RUNS {
            return false;
        }
        r.runs[count] = (start, end);
        r.count += 1;
        true
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_none()
    }

    /// The runs' bytes, to be written one after the other.
    pub fn runs(&self) -> impl Iterator<Item = &[u8]> {
        let (head, runs) = match self.0.as_deref() {
            Some(r) => (&r.head[..], &r.runs[..usize::from(r.count)]),
            None => (&[][..], &[][..]),
        };
        runs.iter()
            .map(move |&(from, to)| &head[from as usize..to as usize])
    }

    /// The bytes of all the lines (what the head-size limit counts).
    pub fn len(&self) -> usize {
        self.runs().map(<[u8]>::len).sum()
    }

    /// Each relayed field's name and value, as `HeaderName` and `HeaderValue` would hold them
    /// (the value without the white space around it), for checks.
    pub fn fields(&self) -> impl Iterator<Item = (&[u8], &[u8])> {
        self.runs()
            .flat_map(|run| run.split(|&b| b == b'\n'))
            .filter_map(|line| line.strip_suffix(b"\r"))
            .filter_map(|line| {
                let colon = line.iter().position(|&b| b == b':')?;
                Some((&line[..colon], trim_ows(&line[colon + 1..])))
            })
    }
}

/// `value` without the spaces and tabs around it.
fn trim_ows(value: &[u8]) -> &[u8] {
    let is_ows = |b: &u8| *b == b' ' || *b == b'\t';
    let start = value.iter().position(|b| !is_ows(b)).unwrap_or(value.len());
    let end = value
        .iter()
        .rposition(|b| !is_ows(b))
        .map_or(start, |e| e + 1);
    &value[start..end]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn adjacent_lines_are_one_run_and_runs_stop_at_their_number() {
        let head = Bytes::from((0..=255u8).collect::<Vec<u8>>());
        let last = 5 * (RUNS as u32 - 1);
        let mut r = Relayed::default();
        assert!(r.is_empty());
        assert!(r.push(&head, 0, 2));
        assert!(r.push(&head, 2, 4), "adjacent: the same run");
        for i in 1..RUNS as u32 {
            assert!(r.push(&head, 5 * i, 5 * i + 1));
        }
        assert!(!r.push(&head, last + 3, last + 4), "one run more than kept");
        assert!(r.push(&head, last + 1, last + 3), "but a run still grows");
        let runs: Vec<&[u8]> = r.runs().collect();
        assert_eq!(runs.len(), RUNS);
        assert_eq!(runs[0], &head[0..4]);
        assert_eq!(runs[RUNS - 1], &head[last as usize..last as usize + 3]);
        assert_eq!(r.len(), runs.iter().map(|x| x.len()).sum::<usize>());
    }

    #[test]
    fn fields_read_back_from_the_lines() {
        let head = Bytes::from_static(b"Accept: */*\r\nX-A:b \t\r\nX-Empty:\r\n");
        let mut r = Relayed::default();
        assert!(r.push(&head, 0, head.len() as u32));
        let fields: Vec<_> = r.fields().collect();
        assert_eq!(
            fields,
            vec![
                (&b"Accept"[..], &b"*/*"[..]),
                (b"X-A", b"b"),
                (b"X-Empty", b""),
            ]
        );
    }

    /// What a client SDK sends besides is relayed; the hop-by-hop set (removed on the way) is
    /// never relayed. (That each reader's names are read is shown end to end: the integration
    /// tests route, admit and trace by them over HTTP/1.)
    #[test]
    fn sdk_fields_are_relayed_and_hop_by_hop_ones_are_read() {
        for other in [
            "accept",
            "user-agent",
            "content-type",
            "x-stainless-lang",
            "openai-organization",
        ] {
            assert!(!is_read(&HeaderName::from_static(other)), "{other}");
        }
        // The hop-by-hop set is all read (so never relayed past its removal).
        for name in crate::upstream::h1::head::HOP_BY_HOP {
            assert!(is_read(&HeaderName::from_static(name)), "{name}");
        }
    }
}
