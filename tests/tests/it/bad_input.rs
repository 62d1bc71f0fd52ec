//! Bad input, one row per case, over raw sockets: the status each case gets, the OpenAI-shaped
//! error code where the proxy answers itself, and after every row a check that the proxy did
//! not crash and still serves.
//!
//! Rows the pod answers (`Pod`) show that the proxy routed what it could not read instead of
//! failing the request. Everything else is the proxy's own JSON error, those its HTTP/1 reader
//! refuses before they became requests (`malformed_request`: bad syntax, ambiguous framing)
//! included.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use flexinfer_test_support::raw_exchange;
use flexinfer_tests::*;

/// Who answers a row.
#[derive(Debug, Clone, Copy, PartialEq)]
enum From {
    /// The proxy, with this `error.code`.
    Proxy(&'static str),
    /// The model pod (the sim), reached through the proxy.
    Pod,
}

/// What the proxy's HTTP/1 reader answers a request it will not read.
const MALFORMED: From = From::Proxy("malformed_request");

struct Row {
    case: &'static str,
    request: Vec<u8>,
    status: u16,
    from: From,
}

fn post_raw(path: &str, headers: &[(&str, &[u8])], body: &[u8]) -> Vec<u8> {
    let mut r = format!(
        "POST {path} HTTP/1.1\r\nhost: proxy\r\nconnection: close\r\ncontent-length: {}\r\n",
        body.len()
    )
    .into_bytes();
    for (k, v) in headers {
        r.extend_from_slice(k.as_bytes());
        r.extend_from_slice(b": ");
        r.extend_from_slice(v);
        r.extend_from_slice(b"\r\n");
    }
    r.extend_from_slice(b"\r\n");
    r.extend_from_slice(body);
    r
}

fn chat(headers: &[(&str, &[u8])], body: &str) -> Vec<u8> {
    let mut h = vec![("content-type", b"application/json".as_slice())];
    h.extend_from_slice(headers);
    post_raw("/v1/chat/completions", &h, body.as_bytes())
}

fn raw(text: &str) -> Vec<u8> {
    text.as_bytes().to_vec()
}

fn ok_body() -> String {
    chat_body("solo", None, "hi", r#"{"max_tokens":2}"#)
}

fn rows() -> Vec<Row> {
    let deep = format!(
        r#"{{"model":"solo","messages":[{{"role":"user","content":"hi"}}],"x":{}{}}}"#,
        "[".repeat(10_000),
        "]".repeat(10_000)
    );
    let many = {
        let msgs: Vec<String> = (0..100_000)
            .map(|i| format!(r#"{{"role":"user","content":"m{i}"}}"#))
            .collect();
        format!(
            r#"{{"model":"solo","max_tokens":1,"messages":[{}]}}"#,
            msgs.join(",")
        )
    };
    let mut chunked = raw(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: proxy\r\nconnection: close\r\n\
         content-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n",
    );
    for part in ok_body().as_bytes().chunks(7) {
        chunked.extend_from_slice(format!("{:x}\r\n", part.len()).as_bytes());
        chunked.extend_from_slice(part);
        chunked.extend_from_slice(b"\r\n");
    }
    chunked.extend_from_slice(b"0\r\n\r\n");
    let big_header = "a".repeat(100 * 1024);
    let mut rows = vec![
        Row {
            case: "a well-formed request (the control row)",
            request: chat(&[], &ok_body()),
            status: 200,
            from: From::Pod,
        },
        Row {
            case: "invalid JSON body: routed without a key, the pod's own 400",
            request: chat(&[], "{not json"),
            status: 400,
            from: From::Pod,
        },
        Row {
            case: "empty body",
            request: chat(&[], ""),
            status: 400,
            from: From::Pod,
        },
        Row {
            case: "wrong content type",
            request: post_raw(
                "/v1/chat/completions",
                &[("content-type", b"text/plain")],
                ok_body().as_bytes(),
            ),
            status: 200,
            from: From::Pod,
        },
        Row {
            case: "chunked request body",
            request: chunked,
            status: 200,
            from: From::Pod,
        },
        Row {
            case: "10,000-deep JSON nesting",
            request: chat(&[], &deep),
            status: 400,
            from: From::Proxy("json_too_deep"),
        },
        Row {
            case: "100,000 messages (3.9 MB)",
            request: chat(&[], &many),
            status: 200,
            from: From::Pod,
        },
        Row {
            case: "body over --max-body-bytes",
            request: chat(&[], &format!(r#"{{"model":"solo","x":"{}"}}"#, "x".repeat(5 << 20))),
            status: 413,
            from: From::Proxy("request_too_large"),
        },
        Row {
            case: "non-UTF-8 header values",
            request: chat(
                &[
                    ("x-session-id", b"\xff\xfe\xfd"),
                    ("x-flexinfer-cache-key", b"caf\xe9"),
                ],
                &ok_body(),
            ),
            status: 200,
            from: From::Pod,
        },
        Row {
            case: "unknown model",
            request: chat(&[], &chat_body("nope", None, "hi", "")),
            status: 404,
            from: From::Proxy("model_not_found"),
        },
        Row {
            case: "model is not a string",
            request: chat(&[], r#"{"model":5,"messages":[{"role":"user","content":"hi"}]}"#),
            status: 200,
            from: From::Pod,
        },
        Row {
            case: "100 KB header value",
            request: chat(&[("x-padding", big_header.as_bytes())], &ok_body()),
            status: 431,
            from: From::Proxy("header_too_large"),
        },
        Row {
            case: "70 KB of headers",
            request: chat(&[("x-padding", "b".repeat(70 * 1024).as_bytes())], &ok_body()),
            status: 431,
            from: From::Proxy("header_too_large"),
        },
        Row {
            case: "200 headers",
            request: {
                let names: Vec<String> = (0..200).map(|i| format!("x-h{i}")).collect();
                let h: Vec<(&str, &[u8])> = names.iter().map(|n| (n.as_str(), b"v".as_slice())).collect();
                chat(&h, &ok_body())
            },
            status: 431,
            from: MALFORMED,
        },
        Row {
            case: "CONNECT with X-Model-ID",
            request: raw("CONNECT example.com:443 HTTP/1.1\r\nhost: example.com:443\r\nx-model-id: solo\r\n\r\n"),
            status: 405,
            from: From::Proxy("method_not_allowed"),
        },
        Row {
            case: "TRACE",
            request: raw("TRACE /v1/models HTTP/1.1\r\nhost: proxy\r\nconnection: close\r\nx-model-id: solo\r\n\r\n"),
            status: 405,
            from: From::Proxy("method_not_allowed"),
        },
        Row {
            case: "absolute-form target aimed at another host",
            request: raw("GET http://169.254.169.254/latest/meta-data HTTP/1.1\r\nhost: 169.254.169.254\r\nconnection: close\r\nx-model-id: solo\r\n\r\n"),
            status: 400,
            from: From::Proxy("absolute_form_not_allowed"),
        },
        Row {
            case: "request line that is not HTTP",
            request: raw("HELLO THERE\r\n\r\n"),
            status: 400,
            from: MALFORMED,
        },
        Row {
            case: "header line without a colon",
            request: raw("GET /v1/models HTTP/1.1\r\nhost: proxy\r\nbroken header\r\n\r\n"),
            status: 400,
            from: MALFORMED,
        },
        Row {
            case: "content-length that is not a number",
            request: raw("POST /v1/chat/completions HTTP/1.1\r\nhost: proxy\r\ncontent-length: abc\r\n\r\n{}"),
            status: 400,
            from: MALFORMED,
        },
        Row {
            case: "two different content-lengths",
            request: raw("POST /v1/chat/completions HTTP/1.1\r\nhost: proxy\r\ncontent-length: 2\r\ncontent-length: 3\r\n\r\n{}"),
            status: 400,
            from: MALFORMED,
        },
        Row {
            case: "transfer-encoding that does not end in chunked",
            request: raw("POST /v1/chat/completions HTTP/1.1\r\nhost: proxy\r\ntransfer-encoding: chunked, identity\r\n\r\n0\r\n\r\n"),
            status: 400,
            from: MALFORMED,
        },
        Row {
            case: "a control character in a header value (not a key that falls through: invalid HTTP)",
            request: chat(&[("x-session-id", b"ab\x01c".as_slice())], &ok_body()),
            status: 400,
            from: MALFORMED,
        },
        Row {
            case: "NUL in the path",
            request: raw("GET /v1/mod\0els HTTP/1.1\r\nhost: proxy\r\n\r\n"),
            status: 400,
            from: MALFORMED,
        },
    ];
    // Malformed routing keys fall through to the next source; none fails the request.
    for (case, headers) in [
        ("empty session id", vec![("x-session-id", b"".as_slice())]),
        (
            "whitespace cache key",
            vec![("x-flexinfer-cache-key", b"   ".as_slice())],
        ),
        (
            "control characters in a key",
            vec![("x-flexinfer-cache-key", b"a\tb".as_slice())],
        ),
        (
            "over-long explicit key",
            vec![("x-flexinfer-cache-key", "k".repeat(4096).leak().as_bytes())],
        ),
        (
            "two session headers",
            vec![
                ("x-session-id", b"a".as_slice()),
                ("x-session-id", b"b".as_slice()),
            ],
        ),
    ] {
        rows.push(Row {
            case,
            request: chat(&headers, &ok_body()),
            status: 200,
            from: From::Pod,
        });
    }
    rows
}

async fn exchange(
    addr: SocketAddr,
    request: Vec<u8>,
) -> std::io::Result<Option<flexinfer_test_support::HttpReply>> {
    tokio::task::spawn_blocking(move || raw_exchange(addr, &request, Duration::from_secs(10)))
        .await
        .unwrap()
}

/// The proxy is alive and answers a normal request.
async fn still_serves(proxy: &mut Proxy, after: &str) {
    assert!(
        proxy.proc.exited().is_none(),
        "the proxy exited after {after:?}:\n{}",
        proxy.proc.log_text()
    );
    let r = post(proxy.addr, "/v1/chat/completions", &[], &ok_body())
        .await
        .unwrap_or_else(|e| panic!("no answer after {after:?}: {e}"));
    assert_eq!(r.status, 200, "after {after:?}: {}", r.text());
}

#[tokio::test(flavor = "multi_thread")]
async fn every_bad_input_gets_its_status_and_the_proxy_keeps_serving() {
    let dir = TempDir::new("bad-input");
    // Free prefill: the 100,000-message row is about the proxy, not the simulated GPU.
    let sim = start_sim(
        "solo",
        &["--prefill-us-per-token", "0", "--ttft-base-ms", "0"],
        dir.path(),
    )
    .await;
    let models =
        ModelsFile::new().model(ModelEntry::new("solo").routing("prefix").endpoint(sim.addr));
    let mut proxy = start_proxy(
        &models,
        &[
            "--header-read-timeout",
            "1s",
            "--max-client-connections",
            "16",
            "--max-body-bytes",
            "4194304",
        ],
        &[],
        dir.path(),
    )
    .await;
    let mut failures = Vec::new();
    let mut refused = std::collections::BTreeMap::new();
    for row in rows() {
        let got = exchange(proxy.addr, row.request.clone()).await;
        let verdict = match &got {
            Err(e) => Some(format!("no answer: {e}")),
            Ok(None) => Some("closed without an answer".into()),
            Ok(Some(r)) => {
                let json: Option<serde_json::Value> = serde_json::from_slice(&r.body).ok();
                let code = json
                    .as_ref()
                    .and_then(|j| j["error"]["code"].as_str().map(str::to_owned));
                let pod = r.header("x-sim-pod").map(str::to_owned);
                let from = match (&code, &pod) {
                    (_, Some(_)) => From::Pod,
                    (Some(c), None) => From::Proxy(Box::leak(c.clone().into_boxed_str())),
                    (None, None) => From::Proxy("<no code>"),
                };
                (r.status != row.status || from != row.from).then(|| {
                    format!(
                        "got {} from {from:?}, want {} from {:?}: {}",
                        r.status,
                        row.status,
                        row.from,
                        r.text().chars().take(200).collect::<String>()
                    )
                })
            }
        };
        if let Some(v) = verdict {
            failures.push(format!("{}: {v}", row.case));
        }
        if let (From::Proxy(code @ "malformed_request"), Ok(Some(_))) = (row.from, &got) {
            *refused.entry((code, row.status)).or_insert(0.0) += 1.0;
        }
        still_serves(&mut proxy, row.case).await;
    }
    assert!(
        failures.is_empty(),
        "{} rows failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
    // The heads refused unread are counted by code and status (they are no requests).
    assert!(!refused.is_empty());
    let text = proxy.metrics().await;
    for ((code, status), want) in refused {
        let status = status.to_string();
        let labels = [("code", code), ("status", status.as_str())];
        let got = metric_value(&text, "flexinfer_proxy_client_refusals_total", &labels);
        assert_eq!(got, Some(want), "{code} {status}");
    }
}

/// Slowloris: a head sent a byte at a time is cut off at the header-read timeout, while other
/// clients are served.
#[tokio::test(flavor = "multi_thread")]
async fn a_slow_header_is_cut_off_at_the_header_read_timeout() {
    use std::io::{Read, Write};
    let dir = TempDir::new("slowloris");
    let sim = start_sim("solo", &[], dir.path()).await;
    let models =
        ModelsFile::new().model(ModelEntry::new("solo").routing("prefix").endpoint(sim.addr));
    let mut proxy = start_proxy(&models, &["--header-read-timeout", "1s"], &[], dir.path()).await;
    let addr = proxy.addr;
    let slow = tokio::task::spawn_blocking(move || {
        let mut s = std::net::TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_millis(100)))
            .unwrap();
        let start = Instant::now();
        let head = b"POST /v1/chat/completions HTTP/1.1\r\nhost: proxy\r\nx-a: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\r\n";
        let mut got = Vec::new();
        for b in head.iter().cycle().take(200) {
            if s.write_all(&[*b]).is_err() {
                break;
            }
            let mut buf = [0u8; 512];
            match s.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => got.extend_from_slice(&buf[..n]),
                Err(_) => {} // nothing yet
            }
            if start.elapsed() > Duration::from_secs(15) {
                break;
            }
            // The pace is the point (a byte per 100 ms), not a wait for a condition.
            std::thread::sleep(Duration::from_millis(100));
        }
        (start.elapsed(), String::from_utf8_lossy(&got).into_owned())
    });
    // Meanwhile others are served.
    for _ in 0..5 {
        still_serves(&mut proxy, "a slow client").await;
    }
    let (took, answer) = slow.await.unwrap();
    assert!(
        took >= Duration::from_millis(900) && took < Duration::from_secs(5),
        "cut off after {took:?} (timeout 1s); answer {answer:?}"
    );
    assert!(
        answer.is_empty() || answer.starts_with("HTTP/1.1 408"),
        "{answer:?}"
    );
    still_serves(&mut proxy, "slowloris").await;
}

/// Past --max-client-connections, a new client gets 503 with Retry-After, OpenAI-shaped; the
/// ones already connected keep being served, and the slot frees when one leaves.
#[tokio::test(flavor = "multi_thread")]
async fn connections_past_the_limit_get_503_with_retry_after() {
    let dir = TempDir::new("conn-limit");
    let sim = start_sim("solo", &[], dir.path()).await;
    let models =
        ModelsFile::new().model(ModelEntry::new("solo").routing("prefix").endpoint(sim.addr));
    let mut proxy = start_proxy(&models, &["--max-client-connections", "4"], &[], dir.path()).await;
    let held: Vec<std::net::TcpStream> = (0..4)
        .map(|_| std::net::TcpStream::connect(proxy.addr).unwrap())
        .collect();
    // No wait for the proxy to take them: it accepts in the order the kernel queued the
    // connections, counting each as it accepts it, and these four connected before the next.
    refused_as_too_many(&proxy).await;
    let refused = metric_value(
        &proxy.metrics().await,
        "flexinfer_proxy_client_refusals_total",
        &[("code", "too_many_connections"), ("status", "503")],
    );
    assert_eq!(refused, Some(1.0), "the refused connection is counted");
    drop(held);
    served_once_the_held_close(&proxy).await;
    still_serves(&mut proxy, "the connection limit").await;
}

/// The next client gets 503 `too_many_connections` with Retry-After, OpenAI-shaped.
async fn refused_as_too_many(proxy: &Proxy) {
    let r = exchange(proxy.addr, chat(&[], &ok_body()))
        .await
        .unwrap()
        .expect("an answer");
    assert_eq!(r.status, 503, "{}", r.text());
    assert!(r.header("retry-after").is_some(), "{:?}", r.headers);
    let j: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
    assert_eq!(j["error"]["code"], "too_many_connections");
}

/// The slots free once the proxy sees the held connections close: until then a new client
/// still gets 503.
async fn served_once_the_held_close(proxy: &Proxy) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let r = exchange(proxy.addr, chat(&[], &ok_body()))
            .await
            .unwrap()
            .expect("an answer");
        if r.status != 503 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "still 503 10 s after the held connections closed"
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// The proxy's open-files limit as the kernel holds it: (soft, hard).
fn open_files_limit(pid: u32) -> (u64, u64) {
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).unwrap();
    let line = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .unwrap_or_else(|| panic!("no open-files line in {limits}"));
    let n: Vec<u64> = line
        .split_whitespace()
        .filter_map(|w| w.parse().ok())
        .collect();
    (n[0], n[1])
}

/// Started as a container runtime often starts it (1,024 open files), the proxy does not let
/// descriptors run out under a flood: it raises the hard limit where it may, and where it may
/// not, it serves the client connections that fit (two descriptors each, beside a reserve)
/// and refuses the next with 503, counted, instead of failing accepts and upstream connects.
#[tokio::test]
async fn an_open_files_limit_caps_client_connections_with_503() {
    let dir = TempDir::new("nofile");
    let sim = start_sim("solo", &[], dir.path()).await;
    let models =
        ModelsFile::new().model(ModelEntry::new("solo").routing("prefix").endpoint(sim.addr));
    let mut proxy = start_proxy(&models, &[], &[(NOFILE_LIMIT, "1024")], dir.path()).await;
    let (soft, hard) = open_files_limit(proxy.proc.pid());
    assert_eq!(soft, hard, "the soft limit is raised to the hard one");
    let log = proxy.proc.log_text();
    if hard > 1024 {
        // CAP_SYS_RESOURCE: the hard limit went up to what the default 16,384 connections need.
        assert!(hard >= 16_384 * 2, "raised to {hard}");
        assert!(!log.contains("open files allow fewer"), "{log}");
        still_serves(&mut proxy, "a raised open-files limit").await;
        return;
    }
    // 1,024 files: a quarter (256) kept for listeners, pools, scrapes; two per connection.
    assert!(
        log.contains("open files allow fewer client connections") && log.contains("serving=384"),
        "{log}"
    );
    let held: Vec<std::net::TcpStream> = (0..384)
        .map(|_| std::net::TcpStream::connect(proxy.addr).unwrap())
        .collect();
    refused_as_too_many(&proxy).await;
    assert!(
        !proxy.proc.log_text().contains("accept failed"),
        "no descriptor ran out"
    );
    drop(held);
    served_once_the_held_close(&proxy).await;
    still_serves(&mut proxy, "the open-files cap").await;
}
