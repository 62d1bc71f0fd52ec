//! The targets of `bench stream` and their configs: the upstreams directly, haproxy
//! (`http-no-delay`) and nginx (`proxy_buffering off`), so each event is relayed as it arrives,
//! and flexinfer-proxy with
//! `--gauge userspace` and with its default flags as root. All balance least-connections over
//! the three upstreams, keep client and upstream connections alive, and allow the 8,000-stream
//! mode's connections (two descriptors per stream in the proxy, within 20,000 open files).

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::Path;

use crate::bench::peers::nginx_common;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) enum Target {
    Direct,
    Haproxy,
    Nginx,
    FxUserspace,
    FxDefault,
}

pub(super) const TARGETS: [Target; 5] = [
    Target::Direct,
    Target::Haproxy,
    Target::Nginx,
    Target::FxUserspace,
    Target::FxDefault,
];

/// Client connections a proxy accepts (a scale run opens 8,000; idle runs more).
pub(super) const MAX_CLIENTS: u32 = 9500;

impl Target {
    pub(super) fn name(self) -> &'static str {
        match self {
            Target::Direct => "direct",
            Target::Haproxy => "haproxy",
            Target::Nginx => "nginx",
            Target::FxUserspace => "fx-userspace",
            Target::FxDefault => "fx-default",
        }
    }

    pub(super) fn what(self) -> &'static str {
        match self {
            Target::Direct => "load generator -> the three upstreams, no proxy",
            Target::Haproxy => "haproxy nbthread 1, balance leastconn, http-no-delay, keep-alive",
            Target::Nginx => {
                "nginx 1 worker, least_conn, proxy_buffering off, multi_accept, keepalive"
            }
            Target::FxUserspace => "flexinfer --worker-threads 1 --gauge userspace, least-loaded",
            Target::FxDefault => {
                "flexinfer --worker-threads 1, default flags as root (eBPF gauge), least-loaded"
            }
        }
    }
}

/// haproxy for streams: `option http-no-delay`, or haproxy corks what it relays (MSG_MORE)
/// and a paced event waits up to 200 ms for the next (measured here: 90 ms median with 10
/// streams at 50 events/s, 0.2 ms with the option).
pub(super) fn haproxy_conf(port: u16, upstreams: &[SocketAddr]) -> String {
    let servers: String = upstreams
        .iter()
        .enumerate()
        .map(|(i, u)| format!("    server u{i} {u}\n"))
        .collect();
    format!(
        r#"global
    nbthread 1
    maxconn {MAX_CLIENTS}
defaults
    mode http
    timeout connect 2s
    timeout client 300s
    timeout server 300s
    timeout http-keep-alive 300s
    option http-keep-alive
    option http-no-delay
    http-reuse safe
frontend fe
    bind 127.0.0.1:{port} backlog 4096
    maxconn {MAX_CLIENTS}
    default_backend be
backend be
    balance leastconn
{servers}"#
    )
}

pub(super) fn nginx_conf(dir: &Path, port: u16, upstreams: &[SocketAddr]) -> String {
    let servers: String = upstreams
        .iter()
        .map(|u| format!("        server {u};\n"))
        .collect();
    let mut s = nginx_common(dir, 2 * MAX_CLIENTS + 64, true);
    let _ = write!(
        s,
        r#"    upstream be {{
        least_conn;
{servers}        keepalive 1024;
        keepalive_requests 1000000;
    }}
    server {{
        listen 127.0.0.1:{port} backlog=4096;
        location / {{
            proxy_pass http://be;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_buffering off;
            proxy_read_timeout 300s;
            proxy_send_timeout 300s;
        }}
    }}
}}
"#
    );
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use flexinfer_test_support::loopback;

    #[test]
    fn the_peers_relay_unbuffered_to_three_upstreams_with_room_for_8000_streams() {
        let ups = [loopback(1), loopback(2), loopback(3)];
        let n = nginx_conf(Path::new("/t"), 9, &ups);
        assert!(n.contains("proxy_buffering off;") && n.contains("least_conn;"));
        assert_eq!(n.matches("server 127.0.0.1:").count(), 3);
        assert!(
            n.contains("worker_connections 19064; multi_accept on;"),
            "{n}"
        );
        let h = haproxy_conf(9, &ups);
        assert!(h.contains("balance leastconn") && h.contains("maxconn 9500"));
        assert!(h.contains("option http-no-delay"));
        assert_eq!(h.matches("    server u").count(), 3);
    }
}
