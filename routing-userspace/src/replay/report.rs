//! The numbers of one replayed strategy, and the markdown table they print as.

use super::fleet::Served;

/// What one strategy did with the trace.
#[derive(Debug, Clone, PartialEq)]
pub struct Report {
    pub name: String,
    /// Prompt blocks found cached over all prompt blocks.
    pub hit_ratio: f64,
    /// Requests of the busiest pod over the mean per pod (`None` for a single cache).
    pub max_over_mean: Option<f64>,
    pub ttft_p50_s: f64,
    pub ttft_p95_s: f64,
    pub ttft_p99_s: f64,
    /// Requests that waited for a free running slot.
    pub queued: usize,
    /// Decisions the hash-balance bound moved (`None` where no router decided).
    pub spills: Option<u64>,
    /// Requests per pod.
    pub per_pod: Vec<u64>,
    /// For a bounded router row: the greedy oracle's hit ratio under the same bound (it reads
    /// every pod's cache), what the row's hits are measured against.
    pub oracle_hit_ratio: Option<f64>,
}

/// Nearest-rank quantile of sorted values.
fn quantile(sorted: &[u64], q: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

impl Report {
    pub fn new(name: &str, served: &[Served], pods: usize, spills: Option<u64>) -> Self {
        let blocks: u64 = served.iter().map(|s| s.blocks).sum();
        let hits: u64 = served.iter().map(|s| s.hit_blocks).sum();
        let mut per_pod = vec![0u64; pods];
        for s in served {
            per_pod[s.pod] += 1;
        }
        let mean = served.len() as f64 / pods.max(1) as f64;
        let max = per_pod.iter().copied().max().unwrap_or(0) as f64;
        let mut ttft: Vec<u64> = served.iter().map(|s| s.ttft_us).collect();
        ttft.sort_unstable();
        let secs = |q| quantile(&ttft, q) as f64 / 1e6;
        Self {
            name: name.to_owned(),
            hit_ratio: if blocks == 0 {
                0.0
            } else {
                hits as f64 / blocks as f64
            },
            max_over_mean: (pods > 1 && mean > 0.0).then(|| max / mean),
            ttft_p50_s: secs(0.50),
            ttft_p95_s: secs(0.95),
            ttft_p99_s: secs(0.99),
            queued: served.iter().filter(|s| s.queued).count(),
            spills,
            per_pod,
            oracle_hit_ratio: None,
        }
    }
}

/// The router rows of several fleet sizes side by side: for each N, the hit ratio as a share
/// of `limit` (one cache with the whole fleet's capacity), against the oracle under the same
/// bound where there is one, and the max/mean load.
pub fn fleets(limit: f64, fleets: &[(usize, Vec<Report>)]) -> String {
    let mut out = String::from("| strategy |");
    let mut rule = String::from("|---|");
    for (n, _) in fleets {
        out.push_str(&format!(" N={n}: hit (x limit, x oracle) | max/mean |"));
        rule.push_str("---:|---:|");
    }
    out.push('\n');
    out.push_str(&rule);
    out.push('\n');
    let Some((_, first)) = fleets.first() else {
        return out;
    };
    for (row, r0) in first.iter().enumerate() {
        if r0.spills.is_none() {
            continue; // greedy and limit do not depend on the routers
        }
        out.push_str(&format!("| {} |", r0.name));
        for (_, reports) in fleets {
            let r = &reports[row];
            let x_limit = if limit > 0.0 {
                r.hit_ratio / limit
            } else {
                0.0
            };
            let x_oracle = r
                .oracle_hit_ratio
                .filter(|&o| o > 0.0)
                .map_or(String::new(), |o| format!(", {:.2}x", r.hit_ratio / o));
            let mm = r.max_over_mean.map_or("-".into(), |v| format!("{v:.2}"));
            out.push_str(&format!(
                " {:.3} ({x_limit:.2}x{x_oracle}) | {mm} |",
                r.hit_ratio
            ));
        }
        out.push('\n');
    }
    out
}

/// The markdown table of several reports.
pub fn table(reports: &[Report]) -> String {
    let mut out = String::from(
        "| strategy | block hit ratio | x oracle, same bound | max/mean load | TTFT p50 (s) | TTFT p95 (s) | TTFT p99 (s) | queued | spills | requests per pod |\n\
         |---|---:|---:|---:|---:|---:|---:|---:|---:|---|\n",
    );
    for r in reports {
        let opt = |v: Option<String>| v.unwrap_or_else(|| "-".into());
        out.push_str(&format!(
            "| {} | {:.3} | {} | {} | {:.2} | {:.2} | {:.2} | {} | {} | {} |\n",
            r.name,
            r.hit_ratio,
            opt(r.oracle_hit_ratio.map(|o| match o > 0.0 {
                true => format!("{:.2}x (of {o:.3})", r.hit_ratio / o),
                false => "-".into(),
            })),
            opt(r.max_over_mean.map(|v| format!("{v:.2}"))),
            r.ttft_p50_s,
            r.ttft_p95_s,
            r.ttft_p99_s,
            r.queued,
            opt(r.spills.map(|s| s.to_string())),
            r.per_pod
                .iter()
                .map(u64::to_string)
                .collect::<Vec<_>>()
                .join(" "),
        ));
    }
    out
}
