//! Observability test support: a real Prometheus server scraping the proxy, its HTTP query API,
//! the spec's metric families and PromQL queries (read from the spec text itself), and parsing of
//! the text exposition format.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::{free_port, get, loopback, Proc};

/// The workspace root (the parent of this crate).
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace root")
        .to_path_buf()
}

/// The spec: `FLEXINFER_SPEC`, else `<workspace>/../shared/spec/request-routing.md`.
pub fn spec_path() -> PathBuf {
    std::env::var_os("FLEXINFER_SPEC")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join("../shared/spec/request-routing.md"))
}

pub fn spec_text() -> String {
    let p = spec_path();
    std::fs::read_to_string(&p).unwrap_or_else(|e| {
        panic!(
            "cannot read the spec at {} ({e}); set FLEXINFER_SPEC",
            p.display()
        )
    })
}

/// Every `flexinfer_proxy_*` family the spec names anywhere (histogram `_bucket`/`_sum`/`_count`
/// series mapped to their family).
pub fn spec_families(spec: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut rest = spec;
    while let Some(i) = rest.find("flexinfer_proxy_") {
        let tail = &rest[i..];
        let end = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(tail.len());
        let mut name = &tail[..end];
        for suffix in ["_bucket", "_sum", "_count"] {
            if let Some(base) = name.strip_suffix(suffix) {
                if base.ends_with("_seconds") {
                    name = base;
                }
            }
        }
        out.insert(name.to_string());
        rest = &tail[end..];
    }
    out
}

/// The spec's metrics table: family -> its label names, as written (`name{a,b}<TAB>...`).
pub fn spec_table(spec: &str) -> BTreeMap<String, Vec<String>> {
    spec.lines()
        .filter(|l| l.starts_with("flexinfer_proxy_") && l.contains('\t'))
        .filter_map(|l| {
            let head = l.split('\t').next()?;
            let (name, labels) = head.split_once('{')?;
            let labels = labels.strip_suffix('}')?;
            Some((
                name.to_string(),
                labels.split(',').map(|s| s.trim().to_string()).collect(),
            ))
        })
        .collect()
}

/// One query of the spec's "PromQL Signals" section.
#[derive(Debug, Clone)]
pub struct SpecQuery {
    /// The comment above it (without `# `).
    pub title: String,
    pub expr: String,
}

impl SpecQuery {
    /// The query for `model`, every range (`[5m]`, `[15m]`) replaced by `window`.
    pub fn for_model(&self, model: &str, window: Duration) -> String {
        let mut q = self.expr.replace("$MODEL", model);
        for r in ["[5m]", "[15m]"] {
            q = q.replace(r, &format!("[{}s]", window.as_secs().max(1)));
        }
        q
    }
}

/// The queries of the spec's "PromQL Signals" section, in order.
pub fn spec_queries(spec: &str) -> Vec<SpecQuery> {
    let start = spec
        .find("\nPromQL Signals")
        .expect("spec has a PromQL Signals section");
    let section = &spec[start..];
    let end = section
        .find("\nExpected Signals")
        .expect("spec has an Expected Signals section");
    let mut out: Vec<SpecQuery> = Vec::new();
    for line in section[..end].lines() {
        if let Some(title) = line.strip_prefix("# ") {
            out.push(SpecQuery {
                title: title.trim().to_string(),
                expr: String::new(),
            });
        } else if let Some(q) = out.last_mut() {
            if !line.trim().is_empty() {
                if !q.expr.is_empty() {
                    q.expr.push('\n');
                }
                q.expr.push_str(line);
            }
        }
    }
    out
}

/// The spec query whose title starts with `title`.
pub fn spec_query<'q>(queries: &'q [SpecQuery], title: &str) -> &'q SpecQuery {
    queries
        .iter()
        .find(|q| q.title.starts_with(title))
        .unwrap_or_else(|| panic!("no spec query titled {title:?} in {queries:#?}"))
}

/// The metric names a PromQL expression reads.
pub fn metric_names(expr: &str) -> BTreeSet<String> {
    spec_families(expr)
}

/// Whitespace-free form of a query, to compare queries as written.
pub fn squash(expr: &str) -> String {
    expr.chars().filter(|c| !c.is_whitespace()).collect()
}

/// Family -> type from the `# TYPE` lines of a text exposition.
pub fn exposition_types(text: &str) -> BTreeMap<String, String> {
    text.lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| {
            let (name, ty) = l.split_once(' ')?;
            Some((name.to_string(), ty.trim().to_string()))
        })
        .collect()
}

/// The samples of one series name: labels and value.
pub fn samples(text: &str, name: &str) -> Vec<(BTreeMap<String, String>, f64)> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter(|l| l.starts_with(name) && l[name.len()..].starts_with(['{', ' ']))
        .map(|l| {
            let (head, value) = l.rsplit_once(' ').expect("sample line has a value");
            let mut labels = BTreeMap::new();
            if let Some(inner) = head
                .strip_prefix(name)
                .and_then(|s| s.strip_prefix('{'))
                .and_then(|s| s.strip_suffix('}'))
            {
                // Label values here never contain `",` (no quotes or commas in our values).
                for pair in inner.split("\",").filter(|p| !p.is_empty()) {
                    let (k, v) = pair.split_once("=\"").expect("label pair");
                    labels.insert(k.to_string(), v.trim_end_matches('"').to_string());
                }
            }
            (labels, value.parse().unwrap_or(f64::NAN))
        })
        .collect()
}

/// Seconds since the Unix epoch.
pub fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock after 1970")
        .as_secs_f64()
}

/// Percent-encoding for a URL query value.
pub fn url_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len() * 3);
    for b in s.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                out.push(b as char)
            }
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

/// The Prometheus binary: `PROMETHEUS_BIN`, else `/usr/bin/prometheus`. When it is missing the
/// test fails under CI (env `CI` set) and otherwise records a skip (returns `None`).
pub fn prometheus_bin_or_skip() -> Option<PathBuf> {
    let bin = std::env::var_os("PROMETHEUS_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/usr/bin/prometheus"));
    if bin.exists() {
        return Some(bin);
    }
    if std::env::var_os("CI").is_some() {
        panic!(
            "{}: Prometheus not found at {} and CI is set: install it (Debian: apt-get install prometheus) or set PROMETHEUS_BIN",
            flexinfer_test_support::running_test(),
            bin.display()
        );
    }
    flexinfer_test_support::skip(&format!(
        "Prometheus not found at {}: install it (Debian: apt-get install prometheus) or set \
         PROMETHEUS_BIN; set CI to make a missing Prometheus fail",
        bin.display()
    ));
    None
}

/// One row of an instant-query answer.
#[derive(Debug, Clone)]
pub struct PromSample {
    pub labels: BTreeMap<String, String>,
    pub value: f64,
}

/// A Prometheus server scraping one target every second, with its data in a scratch dir.
pub struct Prometheus {
    pub addr: SocketAddr,
    pub proc: Proc,
}

pub const SCRAPE_JOB: &str = "flexinfer-proxy";

impl Prometheus {
    /// Start `bin` scraping `target` (`/metrics`) every second; wait until it is ready and has
    /// scraped the target successfully once.
    pub async fn start(bin: &Path, target: SocketAddr, dir: &Path) -> Self {
        let config = dir.join("prometheus.yml");
        std::fs::write(
            &config,
            format!(
                "global:\n  scrape_interval: 1s\n  scrape_timeout: 800ms\n  evaluation_interval: 1s\n\
                 scrape_configs:\n  - job_name: {SCRAPE_JOB}\n    metrics_path: /metrics\n    \
                 static_configs:\n      - targets: ['{target}']\n"
            ),
        )
        .expect("write prometheus.yml");
        let data = dir.join("prometheus-data");
        std::fs::create_dir_all(&data).expect("tsdb dir");
        let addr = loopback(free_port());
        let log = dir.join("prometheus.log");
        let mut cmd = Command::new(bin);
        cmd.arg(format!("--config.file={}", config.display()))
            .arg(format!("--storage.tsdb.path={}", data.display()))
            .arg(format!("--web.listen-address={addr}"))
            .arg("--storage.tsdb.retention.time=1h")
            .arg("--log.level=warn");
        let p = Self {
            addr,
            proc: Proc::spawn("prometheus", cmd, &log).unwrap_or_else(|e| panic!("{e}")),
        };
        if let Err(e) = crate::wait_ok(addr, "/-/ready", Duration::from_secs(20)).await {
            panic!("prometheus: {e}\n{}", p.proc.log_text());
        }
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            let up = p
                .query(&format!("up{{job=\"{SCRAPE_JOB}\"}}"), unix_now())
                .await;
            if matches!(&up, Ok(v) if v.iter().any(|s| s.value == 1.0)) {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "prometheus never scraped {target}: {up:?}\n{}",
                p.proc.log_text()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        p
    }

    /// Waits until Prometheus has scraped its target `n` times after `since` (Unix seconds), so
    /// a query over that time finds the samples it needs, however late a loaded machine ran
    /// the scrapes. Panics after 30 s.
    pub async fn wait_scrapes_since(&self, since: f64, n: usize) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let now = unix_now();
            let window_ms = ((now - since) * 1000.0).ceil().max(1.0) as u64;
            let q = format!("count_over_time(up{{job=\"{SCRAPE_JOB}\"}}[{window_ms}ms])");
            let got = self.query(&q, now).await;
            let scrapes = got
                .as_ref()
                .ok()
                .and_then(|v| v.first())
                .map_or(0.0, |s| s.value);
            if scrapes >= n as f64 {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{scrapes} of {n} scrapes after {since:.3} within 30 s: {got:?}\n{}",
                self.proc.log_text()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// `GET /api/v1/query` at `time` (Unix seconds); the vector or scalar result.
    pub async fn query(&self, q: &str, time: f64) -> anyhow::Result<Vec<PromSample>> {
        let path = format!("/api/v1/query?query={}&time={time:.3}", url_encode(q));
        let r = get(self.addr, &path).await?;
        let v: serde_json::Value = serde_json::from_slice(&r.body)
            .map_err(|e| anyhow::anyhow!("{q}: not JSON ({e}): {}", r.text()))?;
        if v["status"] != "success" {
            anyhow::bail!("{q}: {}", r.text());
        }
        let value = |pair: &serde_json::Value| -> f64 {
            pair[1]
                .as_str()
                .and_then(|s| s.parse().ok())
                .unwrap_or(f64::NAN)
        };
        let data = &v["data"];
        Ok(match data["resultType"].as_str() {
            Some("vector") => data["result"]
                .as_array()
                .map(Vec::as_slice)
                .unwrap_or_default()
                .iter()
                .map(|s| PromSample {
                    labels: s["metric"]
                        .as_object()
                        .map(|m| {
                            m.iter()
                                .map(|(k, v)| (k.clone(), v.as_str().unwrap_or("").to_string()))
                                .collect()
                        })
                        .unwrap_or_default(),
                    value: value(&s["value"]),
                })
                .collect(),
            Some("scalar") => vec![PromSample {
                labels: BTreeMap::new(),
                value: value(&data["result"]),
            }],
            other => anyhow::bail!("{q}: unexpected result type {other:?}"),
        })
    }

    /// The query's rows as `label value -> value`, keyed by `by` (empty key for no label).
    pub async fn query_by(&self, q: &str, time: f64, by: &str) -> BTreeMap<String, f64> {
        self.query(q, time)
            .await
            .unwrap_or_else(|e| panic!("{e}"))
            .into_iter()
            .map(|s| (s.labels.get(by).cloned().unwrap_or_default(), s.value))
            .collect()
    }

    /// A query that must answer exactly one number.
    pub async fn query_one(&self, q: &str, time: f64) -> f64 {
        let rows = self.query(q, time).await.unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            rows.len(),
            1,
            "{q} at {time}: expected one row, got {rows:?}"
        );
        rows[0].value
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn url_encoding_and_sample_parsing() {
        assert_eq!(
            url_encode("a b{c=\"d\"}[5m]"),
            "a%20b%7Bc%3D%22d%22%7D%5B5m%5D"
        );
        let text = "# TYPE x counter\nx{a=\"1\",b=\"p:80\"} 3\nx_other 1\nx 2\n";
        let s = samples(text, "x");
        assert_eq!(s.len(), 2);
        assert_eq!(s[0].0["b"], "p:80");
        assert_eq!(s[0].1, 3.0);
        assert!(s[1].0.is_empty());
    }

    #[test]
    fn spec_parsing_finds_the_table_the_families_and_the_queries() {
        let spec = "Metric\tDescription\nflexinfer_proxy_a_total{model,status}\tA\n\
                    PromQL Signals\n\n# One\nsum(rate(flexinfer_proxy_a_total{model=\"$MODEL\"}[5m]))\n\n\
                    # Two\nhistogram_quantile(0.95,\n rate(flexinfer_proxy_d_seconds_bucket[5m]))\n\nExpected Signals\n";
        let spec = format!("\n{spec}");
        assert_eq!(
            spec_table(&spec)["flexinfer_proxy_a_total"],
            ["model", "status"]
        );
        let fams: Vec<_> = spec_families(&spec).into_iter().collect();
        assert_eq!(
            fams,
            ["flexinfer_proxy_a_total", "flexinfer_proxy_d_seconds"]
        );
        let q = spec_queries(&spec);
        assert_eq!(q.len(), 2);
        assert_eq!(
            q[1].for_model("m", Duration::from_secs(12)),
            "histogram_quantile(0.95,\n rate(flexinfer_proxy_d_seconds_bucket[12s]))"
        );
    }
}
