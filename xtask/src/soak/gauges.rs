//! Reading the proxy's and the pods' state: `/debug/routing`, `/metrics`, `ebpf status` and a
//! sim's in-flight gauge, and the counts that must come back to zero once no request is in
//! flight; also the proxy log's upstream failures by target.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::process::Command;

use anyhow::{Context, Result};
use flexinfer_test_support::{http_request, PinDir};
use serde_json::Value;

pub(super) fn routing_view(admin: SocketAddr) -> Result<Value> {
    let r = http_request(admin, "GET", "/debug/routing", &[], b"")?;
    Ok(serde_json::from_slice(&r.body)?)
}

/// `sim_requests_in_flight` from a sim's /metrics.
pub(super) fn sim_in_flight(addr: SocketAddr) -> Option<u64> {
    let r = http_request(addr, "GET", "/metrics", &[], b"").ok()?;
    r.text()
        .lines()
        .find(|l| l.starts_with("sim_requests_in_flight{"))?
        .rsplit(' ')
        .next()?
        .parse()
        .ok()
}

/// The proxy's counts that must come back to zero once no request is in flight.
#[derive(Debug, Default, Clone, PartialEq)]
pub(super) struct Gauges {
    /// Per pod in /debug/routing: `active` (what least-loaded reads), `in_flight_here`,
    /// `reservations`; and `reservations_pending`.
    pub active: u64,
    pub in_flight_here: u64,
    pub reservations: u64,
    pub reservations_pending: u64,
    /// `flexinfer_proxy_active_connections`, summed over models.
    pub active_connections: f64,
    /// `ebpf status`: (tracked connections, active, in_flight), eBPF mode only.
    pub ebpf: Option<(u64, u64, u64)>,
}

impl Gauges {
    pub(super) fn zero(&self) -> bool {
        self.active == 0
            && self.in_flight_here == 0
            && self.reservations == 0
            && self.reservations_pending == 0
            && self.active_connections == 0.0
            && self.ebpf.is_none_or(|(_, a, f)| a == 0 && f == 0)
    }
}

pub(super) fn metric_sum(text: &str, name: &str) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter(|l| l.starts_with(name) && l[name.len()..].starts_with(['{', ' ']))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// `ebpf status` output: `tracked connections: N` and the per-pod table.
pub(super) fn parse_ebpf_status(text: &str) -> Option<(u64, u64, u64)> {
    let tracked = text
        .lines()
        .find_map(|l| l.strip_prefix("tracked connections:"))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()?;
    let mut rows = text.lines().skip_while(|l| !l.starts_with("slot"));
    rows.next()?;
    let (mut active, mut in_flight) = (0, 0);
    for row in rows {
        let f: Vec<&str> = row.split_whitespace().collect();
        if f.len() >= 3 {
            active += f[1].parse::<u64>().unwrap_or(0);
            in_flight += f[2].parse::<u64>().unwrap_or(0);
        }
    }
    Some((tracked, active, in_flight))
}

pub(super) fn gauges(admin: SocketAddr, bin: &Path, pins: Option<&PinDir>) -> Result<Gauges> {
    let view = routing_view(admin)?;
    let mut g = Gauges::default();
    for p in view["models"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|m| m["pods"].as_array().cloned().unwrap_or_default())
    {
        g.active += p["active"].as_u64().unwrap_or(0);
        g.in_flight_here += p["in_flight_here"].as_u64().unwrap_or(0);
        g.reservations += p["reservations"].as_u64().unwrap_or(0);
    }
    g.reservations_pending = view["reservations_pending"].as_u64().unwrap_or(0);
    let metrics = http_request(admin, "GET", "/metrics", &[], b"")?.text();
    g.active_connections = metric_sum(&metrics, "flexinfer_proxy_active_connections");
    if let Some(pins) = pins {
        let out = Command::new(bin)
            .args(["ebpf", "status", "--bpf-pin-dir"])
            .arg(pins.path())
            .output()
            .context("running ebpf status")?;
        g.ebpf = parse_ebpf_status(&String::from_utf8_lossy(&out.stdout));
    }
    Ok(g)
}

/// `target=<addr>` of every `upstream request failed` line of the proxy's log.
pub(super) fn upstream_failures(log: &str) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    for l in log
        .lines()
        .filter(|l| l.contains("upstream request failed"))
    {
        if let Some(t) = l.split_whitespace().find_map(|w| w.strip_prefix("target=")) {
            *out.entry(t.to_owned()).or_default() += 1;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_ebpf_status_and_metrics() {
        let status = "pinned set: /sys/fs/bpf/x/v2\ntracked connections: 4   pods: 2\nslot   active in_flight  idle unregistered  pod\n0           2         2     0            0  127.0.0.1:18080\n1           1         0     1            1  127.0.0.1:18081\n";
        assert_eq!(parse_ebpf_status(status), Some((4, 3, 2)));
        let m = "# HELP x\nflexinfer_proxy_active_connections{model=\"a\"} 2\nflexinfer_proxy_active_connections{model=\"b\"} 1\nflexinfer_proxy_active_connections_other 9\n";
        assert_eq!(metric_sum(m, "flexinfer_proxy_active_connections"), 3.0);
        let log = "WARN routing_userspace::proxy::forward: upstream request failed model=m target=127.0.0.1:5 error=x\nINFO other target=1\n";
        assert_eq!(
            upstream_failures(log),
            BTreeMap::from([("127.0.0.1:5".to_owned(), 1)])
        );
    }
}
