//! The soak's clients and how a request's end is judged: each client sends one request after
//! another on a new connection (half stream), and every answer is classified: ok, an HTTP
//! error with its OpenAI code, an SSE error event, a stream that ended without `[DONE]`, a body
//! cut mid-way, or no response at all.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use flexinfer_test_support::harness::http::{Conn, Reply, Request, Timeouts};
use serde_json::Value;

use super::workload::{request_body, Rng};
use super::{PATH, READ_TIMEOUT};

/// How one request ended, as the client saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Outcome {
    Ok,
    /// A non-200 answer (its OpenAI error code, or `-`).
    Http {
        status: u16,
        code: String,
    },
    /// A 200 stream that carried an SSE error event.
    SseError {
        code: String,
    },
    /// A 200 stream whose body ended cleanly but without `data: [DONE]`.
    Ended,
    /// The body stopped before its end (connection closed or reset mid-body).
    Cut {
        stream: bool,
    },
    /// A 200 whose body is not a completion.
    Unreadable,
    /// No response head at all.
    NoResponse {
        what: String,
    },
}

impl Outcome {
    pub(super) fn is_ok(&self) -> bool {
        *self == Outcome::Ok
    }

    pub(super) fn cause(&self) -> String {
        match self {
            Outcome::Ok => "ok".into(),
            Outcome::Http { status, code } => format!("HTTP {status} {code}"),
            Outcome::SseError { code } => format!("stream: SSE error event ({code})"),
            Outcome::Ended => "stream: ended without [DONE]".into(),
            Outcome::Cut { stream: true } => "stream: cut".into(),
            Outcome::Cut { stream: false } => "body: cut".into(),
            Outcome::Unreadable => "HTTP 200, not a completion".into(),
            Outcome::NoResponse { what } => format!("no response: {what}"),
        }
    }
}

#[derive(Debug, Clone)]
pub(super) struct Record {
    pub model: usize,
    pub stream: bool,
    /// Since the run started.
    pub start: Duration,
    pub end: Duration,
    pub pod: Option<String>,
    pub outcome: Outcome,
}

fn io_kind(e: &std::io::Error) -> String {
    match e.kind() {
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => "timeout".into(),
        std::io::ErrorKind::ConnectionReset => "reset".into(),
        std::io::ErrorKind::ConnectionRefused => "refused".into(),
        std::io::ErrorKind::BrokenPipe => "broken pipe".into(),
        k => format!("{k:?}"),
    }
}

/// How a failed read of the head reads in the report.
fn head_error(e: &std::io::Error) -> String {
    match e.kind() {
        std::io::ErrorKind::UnexpectedEof | std::io::ErrorKind::InvalidData => e.to_string(),
        _ => format!("head {}", io_kind(e)),
    }
}

/// One POST on a new connection; `Err` (with what failed) when no response head came back.
pub(super) fn exchange(addr: SocketAddr, body: &[u8]) -> Result<Reply, String> {
    let t = Timeouts {
        connect: Duration::from_secs(2),
        read: READ_TIMEOUT,
        write: Duration::from_secs(10),
    };
    let mut conn = Conn::connect(addr, t).map_err(|e| format!("connect {}", io_kind(&e)))?;
    conn.send(&Request::post(PATH, body))
        .map_err(|e| format!("write {}", io_kind(&e)))?;
    let head = conn.head().map_err(|e| head_error(&e))?;
    Ok(conn.reply(head))
}

/// The `error.code` of an OpenAI-shaped error object (or its type, or `-`).
fn error_code(v: &Value) -> String {
    let e = &v["error"];
    match (&e["code"], &e["type"]) {
        (Value::String(c), _) => c.clone(),
        (Value::Number(n), _) => n.to_string(),
        (_, Value::String(t)) => t.clone(),
        _ => "-".into(),
    }
}

pub(super) fn classify(stream: bool, reply: Result<Reply, String>) -> (Outcome, Option<String>) {
    let reply = match reply {
        Ok(r) => r,
        Err(what) => return (Outcome::NoResponse { what }, None),
    };
    let pod = reply.header("x-sim-pod").map(str::to_owned);
    if reply.status != 200 {
        let code = serde_json::from_slice::<Value>(&reply.body)
            .map(|v| error_code(&v))
            .unwrap_or_else(|_| "-".into());
        return (
            Outcome::Http {
                status: reply.status,
                code,
            },
            pod,
        );
    }
    if !stream {
        if !reply.complete {
            return (Outcome::Cut { stream: false }, pod);
        }
        let ok = serde_json::from_slice::<Value>(&reply.body)
            .is_ok_and(|v| v["choices"].is_array() && v.get("error").is_none());
        let o = if ok { Outcome::Ok } else { Outcome::Unreadable };
        return (o, pod);
    }
    let text = String::from_utf8_lossy(&reply.body);
    let mut done = false;
    let mut error = None;
    for event in text.split("\n\n") {
        let mut is_error = false;
        for line in event.lines() {
            if line.trim() == "event: error" {
                is_error = true;
            }
            if let Some(data) = line.strip_prefix("data:") {
                let data = data.trim();
                if data == "[DONE]" {
                    done = true;
                } else if let Ok(v) = serde_json::from_str::<Value>(data) {
                    if v.get("error").is_some() {
                        error.get_or_insert_with(|| error_code(&v));
                    }
                }
            }
        }
        if is_error && error.is_none() {
            error = Some("-".into());
        }
    }
    let o = match (error, done, reply.complete) {
        (Some(code), _, _) => Outcome::SseError { code },
        (None, true, true) => Outcome::Ok,
        (None, false, true) => Outcome::Ended,
        (None, _, false) => Outcome::Cut { stream: true },
    };
    (o, pod)
}

pub(super) fn client(
    id: usize,
    proxy: SocketAddr,
    seed: u64,
    t0: Instant,
    deadline: Instant,
) -> Vec<Record> {
    let mut rng = Rng::new(seed ^ (id as u64).wrapping_mul(0x2545_f491_4f6c_dd1d));
    let model = id % 2;
    let stream = (id / 2) % 2 == 1;
    // Spread the first requests over a second, so clients do not start in lock step.
    std::thread::sleep(Duration::from_millis(rng.below(1000)));
    let mut out = Vec::new();
    while Instant::now() < deadline {
        let body = request_body(&mut rng, model, stream);
        let start = t0.elapsed();
        let (outcome, pod) = classify(stream, exchange(proxy, &body));
        out.push(Record {
            model,
            stream,
            start,
            end: t0.elapsed(),
            pod,
            outcome,
        });
        std::thread::sleep(Duration::from_millis(rng.below(100)));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reply(status: u16, body: &str, complete: bool) -> Result<Reply, String> {
        Ok(Reply {
            status,
            headers: vec![("x-sim-pod".into(), "ll-1".into())],
            body: body.as_bytes().to_vec(),
            complete,
        })
    }

    #[test]
    fn classifies_what_clients_see() {
        let done = "data: {\"choices\":[]}\n\ndata: [DONE]\n\n";
        assert_eq!(classify(true, reply(200, done, true)).0, Outcome::Ok);
        assert_eq!(
            classify(true, reply(200, done, true)).1.as_deref(),
            Some("ll-1")
        );
        assert_eq!(
            classify(true, reply(200, "data: {\"choices\":[]}\n\n", false)).0,
            Outcome::Cut { stream: true }
        );
        assert_eq!(
            classify(true, reply(200, "data: {\"choices\":[]}\n\n", true)).0,
            Outcome::Ended
        );
        let err = "data: {\"choices\":[]}\n\nevent: error\ndata: {\"error\":{\"message\":\"m\",\"type\":\"upstream_error\",\"code\":\"upstream_failed\"}}\n\n";
        assert_eq!(
            classify(true, reply(200, err, true)).0,
            Outcome::SseError {
                code: "upstream_failed".into()
            }
        );
        let e502 = r#"{"error":{"message":"m","type":"upstream_error","code":"upstream_failed"}}"#;
        assert_eq!(
            classify(false, reply(502, e502, true)).0.cause(),
            "HTTP 502 upstream_failed"
        );
        assert_eq!(
            classify(false, reply(200, r#"{"choices":[{}]}"#, true)).0,
            Outcome::Ok
        );
        assert_eq!(
            classify(false, reply(200, r#"{"choi"#, false)).0,
            Outcome::Cut { stream: false }
        );
        assert_eq!(
            classify(false, Err("head reset".into())).0.cause(),
            "no response: head reset"
        );
    }
}
