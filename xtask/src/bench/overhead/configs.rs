//! The configs of one `bench overhead` run: the upstream nginx that answers every POST with a
//! fixed completion, the nginx and haproxy proxy configs per case (how each balances), and the
//! wrk script.

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::Path;

use super::targets::{Case, COMPLETION, MODEL, SDK_FIELDS};
use crate::bench::peers::nginx_common;

/// nginx `worker_connections` of the upstreams and the nginx proxy.
const NGINX_CONNECTIONS: u32 = 4096;

/// POSTs `body` (the case's); a case that sends a session gives every request a new
/// `X-Session-ID` (a counter, so about 10 000 distinct values cycle), and the `sdk` case adds the
/// SDK's fields.
pub(super) fn wrk_script(case: Case, body: &str) -> String {
    let request = if case.sends_session() {
        r#"
local n = 0
request = function()
  n = n + 1
  wrk.headers["X-Session-ID"] = "session-" .. (n % 10000)
  return wrk.format()
end
"#
    } else {
        ""
    };
    let mut fields = String::new();
    if case == Case::Sdk {
        for (name, value) in SDK_FIELDS {
            let _ = writeln!(fields, r#"wrk.headers["{name}"] = "{value}""#);
        }
    }
    format!(
        r#"wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
{fields}wrk.body = [==[{body}]==]
{request}
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format("BENCH requests=%d duration_us=%d errors=%d non2xx=%d p50_us=%d p99_us=%d\n",
    summary.requests, summary.duration, e.connect + e.read + e.write + e.timeout, e.status,
    latency:percentile(50), latency:percentile(99)))
end
"#
    )
}

/// The upstreams on `ports`, and with `collector` an OTLP/HTTP traces sink there (it answers
/// every export 200 with an empty body, a valid empty `ExportTraceServiceResponse`).
pub(super) fn upstream_conf(dir: &Path, ports: &[u16], collector: Option<u16>) -> String {
    let models = format!(
        r#"{{"object":"list","data":[{{"id":"{MODEL}","object":"model","owned_by":"bench"}}]}}"#
    );
    let mut s = nginx_common(dir, NGINX_CONNECTIONS, false);
    for (i, p) in ports.iter().enumerate() {
        let _ = write!(
            s,
            r#"    server {{
        listen 127.0.0.1:{p};
        default_type application/json;
        add_header X-Upstream u{i};
        location = /health {{ return 200 '{{"status":"ok"}}'; }}
        location = /v1/models {{ return 200 '{models}'; }}
        location / {{ return 200 '{COMPLETION}'; }}
    }}
"#
        );
    }
    if let Some(p) = collector {
        let _ = write!(
            s,
            r#"    server {{
        listen 127.0.0.1:{p};
        client_max_body_size 64m;
        location = /v1/traces {{ default_type application/x-protobuf; return 200 ''; }}
    }}
"#
        );
    }
    s.push_str("}\n");
    s
}

pub(super) fn nginx_proxy_conf(
    dir: &Path,
    port: u16,
    upstreams: &[SocketAddr],
    case: Case,
) -> String {
    let balance = match case.sends_session() {
        true => "hash $http_x_session_id consistent;",
        false => "least_conn;",
    };
    let servers: String = upstreams
        .iter()
        .map(|u| format!("        server {u};\n"))
        .collect();
    let mut s = nginx_common(dir, NGINX_CONNECTIONS, false);
    let _ = write!(
        s,
        r#"    upstream be {{
        {balance}
{servers}        keepalive 64;
        keepalive_requests 1000000;
    }}
    server {{
        listen 127.0.0.1:{port};
        location / {{
            proxy_pass http://be;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
        }}
    }}
}}
"#
    );
    s
}

pub(super) fn haproxy_conf(port: u16, upstreams: &[SocketAddr], case: Case) -> String {
    let balance = match case.sends_session() {
        true => "balance hdr(X-Session-ID)\n    hash-type consistent",
        false => "balance leastconn",
    };
    let servers: String = upstreams
        .iter()
        .enumerate()
        .map(|(i, u)| format!("    server u{i} {u}\n"))
        .collect();
    format!(
        r#"global
    nbthread 1
    maxconn 4096
defaults
    mode http
    timeout connect 2s
    timeout client 30s
    timeout server 30s
    option http-keep-alive
    http-reuse safe
frontend fe
    bind 127.0.0.1:{port}
    default_backend be
backend be
    {balance}
{servers}"#
    )
}
