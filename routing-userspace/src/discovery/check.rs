//! `flexinfer-proxy config check FILE`: validate a models file before a proxy loads it, and
//! show how each model will be routed.
//!
//! A running proxy keeps its last good table when the file turns bad, so a typo shows up only
//! as an error line in its log. This command fails fast instead (exit status 1, the error with
//! its line and column). It uses the proxy's own parser ([`super::file::parse`]), so a
//! file that passes here is one `serve` accepts, and it describes each model from the same
//! normalized [`ModelSet`] the routing table is built from (pods sorted, duplicates dropped).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use clap::Args;

use super::file::{parse, ParseError};
use super::{EngineKind, ModelSet, ModelSpec, Strategy, Update};
use crate::admission::AdmissionDefaults;
use crate::config::settings::admission_defaults;
use crate::config::{routing_knobs, AdmissionArgs, KnobWarning, RoutingArgs};
use crate::router::RoutingKnobs;
use crate::vocab::LabelGroupMode;

/// `flexinfer-proxy config check` options: the file, and the routing flags `serve` will run
/// with (the same flags and variables, so the report shows what that proxy does).
#[derive(Debug, Clone, Args)]
pub struct CheckArgs {
    /// The models file (`--discovery file` format).
    pub file: PathBuf,

    #[command(flatten)]
    pub routing: RoutingArgs,

    /// The admission defaults `serve` will run with (shown per model).
    #[command(flatten)]
    pub admission: AdmissionArgs,
}

/// A file that does not pass: `FILE:LINE:COLUMN: message`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}", located(.path, .error))]
pub struct CheckError {
    pub path: PathBuf,
    pub error: ParseError,
}

fn located(path: &Path, e: &ParseError) -> String {
    let message = match (e.line, e.column) {
        // serde_yaml_ng ends its messages with the position; it leads here instead.
        (Some(l), Some(c)) => e
            .message
            .strip_suffix(&format!(" at line {l} column {c}"))
            .unwrap_or(&e.message)
            .to_owned(),
        _ => e.message.clone(),
    };
    match (e.line, e.column) {
        (Some(l), Some(c)) => format!("{}:{l}:{c}: {message}", path.display()),
        _ => format!("{}: {message}", path.display()),
    }
}

/// Check `text` (read from `path`) and describe it as a proxy with the default knobs would
/// route it; `Err` when the proxy would refuse it.
pub fn check(path: &Path, text: &str) -> Result<String, CheckError> {
    let proxy = Proxy {
        knobs: RoutingKnobs::DEFAULT,
        admission: AdmissionDefaults::default(),
        fallbacks: Vec::new(),
    };
    check_with(path, text, &proxy)
}

/// What the report describes models against: the proxy's routing knobs, its admission
/// defaults, and the knobs whose flags were unusable (shown as warnings: `serve` warns of them
/// too).
pub struct Proxy {
    pub knobs: RoutingKnobs,
    pub admission: AdmissionDefaults,
    pub fallbacks: Vec<KnobWarning>,
}

/// [`check`], describing the routing and admission as `proxy` would run them.
pub fn check_with(path: &Path, text: &str, proxy: &Proxy) -> Result<String, CheckError> {
    let models = parse(text).map_err(|error| CheckError {
        path: path.to_owned(),
        error,
    })?;
    Ok(describe(path, models, proxy))
}

/// Run the command: the report on stdout and `Ok(true)`, or the error on stderr and
/// `Ok(false)`. An unreadable file is an `Err`.
pub fn run(args: &CheckArgs) -> anyhow::Result<bool> {
    use anyhow::Context as _;
    let text = std::fs::read_to_string(&args.file)
        .with_context(|| format!("cannot read {}", args.file.display()))?;
    let (knobs, fallbacks) = routing_knobs(&args.routing);
    let proxy = Proxy {
        knobs,
        admission: admission_defaults(&args.admission),
        fallbacks,
    };
    match check_with(&args.file, &text, &proxy) {
        Ok(report) => {
            print!("{report}");
            Ok(true)
        }
        Err(e) => {
            eprintln!("{e}");
            Ok(false)
        }
    }
}

fn describe(path: &Path, models: Vec<ModelSpec>, proxy: &Proxy) -> String {
    let listed: BTreeMap<String, usize> = models
        .iter()
        .map(|m| (m.name.clone(), m.endpoints.len()))
        .collect();
    let mut set = ModelSet::default();
    set.apply(Update::Reset(models));
    let mut warnings: Vec<String> = proxy
        .fallbacks
        .iter()
        .map(|w| {
            format!(
                "{} = {:?} is not usable; serve falls back to {}",
                w.knob, w.value, w.used
            )
        })
        .collect();
    let mut groups: BTreeMap<&str, Vec<&ModelSpec>> = BTreeMap::new();
    for m in set.models() {
        if let Some(label) = &m.service_label {
            groups.entry(label).or_default().push(m);
        }
    }
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{}: ok, {} model{}, {} label group{}",
        path.display(),
        set.len(),
        plural(set.len()),
        groups.len(),
        plural(groups.len()),
    );
    for m in set.models() {
        describe_model(&mut out, m, proxy);
        let listed_twice = listed.get(&m.name).is_some_and(|&n| n > m.endpoints.len());
        warnings.extend(model_warnings(m, listed_twice));
    }
    let mode = proxy.knobs.label_group_mode;
    for (label, members) in &groups {
        if listed.contains_key(*label) {
            warnings.push(format!(
                "label {label} is also a model name: requests for {label} go to that model, not to the group"
            ));
        }
        describe_group(&mut out, label, members, mode);
    }
    if !warnings.is_empty() {
        out.push('\n');
        for w in &warnings {
            let _ = writeln!(out, "warning: {w}");
        }
    }
    out
}

/// One model's lines: its routing as the proxy will run it, pods, fallback, names, group,
/// admission.
fn describe_model(out: &mut String, m: &ModelSpec, proxy: &Proxy) {
    let _ = writeln!(out, "\nmodel {}", m.name);
    let _ = writeln!(out, "  routing:           {}", routing(m));
    if let Some(line) = hash_balance(m, &proxy.knobs) {
        let _ = writeln!(out, "  hash balance:      {line}");
    }
    if !m.endpoints.is_empty() {
        let _ = writeln!(out, "  engine signals:    {}", engine(m.engine));
    }
    let pods: Vec<String> = m.endpoints.iter().map(ToString::to_string).collect();
    let pods = match pods.is_empty() {
        true => "none".to_owned(),
        false => format!("{} ({})", pods.join(", "), pods.len()),
    };
    let _ = writeln!(out, "  pods:              {pods}");
    let service = m.service.as_deref().unwrap_or("none");
    let _ = writeln!(out, "  service fallback:  {service}");
    let served = m
        .served_model_name
        .as_deref()
        .map_or("as requested".to_owned(), |n| {
            format!("{n} (the body's \"model\" is rewritten)")
        });
    let _ = writeln!(out, "  served model name: {served}");
    let group = m.service_label.as_deref().map_or("none".to_owned(), |l| {
        let ready = if m.ready { "ready" } else { "not ready" };
        format!("{l}, priority {}, {ready}", m.route_priority)
    });
    let _ = writeln!(out, "  label group:       {group}");
    for (label, text) in proxy.admission.describe(&m.admission) {
        let _ = writeln!(out, "  {:<19}{text}", format!("{label}:"));
    }
}

/// What is valid but probably not meant in one model.
fn model_warnings(m: &ModelSpec, listed_twice: bool) -> Vec<String> {
    let mut w = Vec::new();
    if listed_twice {
        w.push(format!(
            "model {}: an endpoint is listed twice (routed once)",
            m.name
        ));
    }
    if m.endpoints.is_empty() && m.service.is_none() {
        w.push(format!(
            "model {}: no pods and no service: its requests are answered 503",
            m.name
        ));
    } else if m.endpoints.is_empty() && m.routing != Strategy::Default {
        w.push(format!(
            "model {}: {} routing without pods: every request goes to the service",
            m.name, m.routing
        ));
    }
    if m.service_label.is_none() && !m.ready {
        w.push(format!(
            "model {}: ready: false only matters inside a label group; requests naming the model are still routed",
            m.name
        ));
    }
    w
}

/// One label group: its priority tiers and whom it picks among (or its cold start).
fn describe_group(out: &mut String, label: &str, members: &[&ModelSpec], mode: LabelGroupMode) {
    let _ = writeln!(out, "\nlabel group {label} (mode {mode})");
    let mut tiers: BTreeMap<std::cmp::Reverse<i64>, Vec<&ModelSpec>> = BTreeMap::new();
    for m in members {
        tiers
            .entry(std::cmp::Reverse(m.route_priority))
            .or_default()
            .push(m);
    }
    for (std::cmp::Reverse(p), ms) in &tiers {
        let names: Vec<String> = ms
            .iter()
            .map(|m| match m.ready {
                true => m.name.clone(),
                false => format!("{} (not ready)", m.name),
            })
            .collect();
        let _ = writeln!(out, "  priority {p}: {}", names.join(", "));
    }
    let top_ready = tiers
        .values()
        .find(|ms| ms.iter().any(|m| m.ready))
        .map(|ms| ms.iter().filter(|m| m.ready).map(|m| m.name.as_str()));
    match top_ready {
        Some(names) => {
            let names: Vec<&str> = names.collect();
            let _ = writeln!(out, "  picks among:       {} ({mode})", names.join(", "));
        }
        None => {
            // Members are sorted by name, so the first of the top tier is the cold start.
            let first = tiers
                .values()
                .next()
                .and_then(|ms| ms.first())
                .map_or("", |m| m.name.as_str());
            let _ = writeln!(
                out,
                "  picks among:       no member is ready: cold start on {first}"
            );
        }
    }
}

/// The hash-balance line of a model whose strategy walks a ring, with where each value comes
/// from.
fn hash_balance(m: &ModelSpec, knobs: &RoutingKnobs) -> Option<String> {
    if !matches!(
        m.routing,
        Strategy::SessionAffinity | Strategy::Prefix | Strategy::CacheAware
    ) {
        return None;
    }
    let b = knobs.balance_for(m);
    let from = |own: bool| if own { "this model" } else { "proxy" };
    if !b.is_on() {
        return Some(format!(
            "off, the plain ring ({})",
            from(m.hash_balance.factor_milli.is_some())
        ));
    }
    Some(format!(
        "factor {} ({}), floor {} ({}): a pod at max(ceil(factor x mean load), floor) requests in flight passes its keys on",
        b.factor(),
        from(m.hash_balance.factor_milli.is_some()),
        b.floor,
        from(m.hash_balance.floor.is_some()),
    ))
}

/// What the proxy reads of the pods' engine.
fn engine(kind: EngineKind) -> String {
    let page = match kind {
        EngineKind::None => return "none (node-local load only)".to_owned(),
        EngineKind::Auto => "the metrics page of vLLM, SGLang or llama.cpp, detected".to_owned(),
        EngineKind::Vllm => "vLLM's metrics page".to_owned(),
        EngineKind::Sglang => "SGLang's metrics page".to_owned(),
        EngineKind::LlamaCpp => "llama.cpp's metrics page (--metrics)".to_owned(),
    };
    format!("{kind} (in-band load reports, and {page} while they do not give the whole load)")
}

fn plural(n: usize) -> &'static str {
    if n == 1 {
        ""
    } else {
        "s"
    }
}

/// One line: the strategy and what the router does with it, given the pods and Service.
fn routing(m: &ModelSpec) -> String {
    let n = m.endpoints.len();
    let service = m.service.is_some();
    let what = match m.routing {
        Strategy::Default if service => "every request goes to the service".to_owned(),
        Strategy::Default if n > 0 => format!("round-robin over {n} pod{} (no service)", plural(n)),
        Strategy::Default => "nowhere to send requests".to_owned(),
        _ if n == 0 => "no pods: the service".to_owned(),
        Strategy::SessionAffinity => format!(
            "consistent hash of the session key over {n} pod{}; no key: a random pod",
            plural(n)
        ),
        Strategy::Prefix => format!(
            "consistent hash of the cache key over {n} pod{}; no key: {}",
            plural(n),
            if service {
                "the service"
            } else {
                "a random pod (no service)"
            }
        ),
        Strategy::LeastLoaded => format!(
            "fewest requests in flight plus reservations among {n} pod{}, ties round-robin",
            plural(n)
        ),
        Strategy::CacheAware => format!(
            "longest prompt-prefix match in the proxy's index among {n} pod{} under the load bound; no match or an explicit key: the ring; no key: {}",
            plural(n),
            if service {
                "the service"
            } else {
                "a random pod (no service)"
            }
        ),
    };
    let failover = if n > 0 && service {
        "; connect failures try the next pods, then the service"
    } else if n > 1 {
        "; connect failures try the next pods"
    } else {
        ""
    };
    format!("{} ({what}{failover})", m.routing)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run_check(text: &str) -> Result<String, String> {
        check(Path::new("models.yaml"), text).map_err(|e| e.to_string())
    }

    #[test]
    fn a_good_file_is_described_model_by_model() {
        let report = run_check(
            r#"
models:
  - name: chat-a
    routing: prefix
    servedModelName: llama3:8b
    serviceLabel: chat
    routePriority: 100
    service: http://127.0.0.1:9000
    endpoints: [127.0.0.1:9002, "[::1]:9001"]
  - name: chat-b
    routing: least-loaded
    serviceLabel: chat
    ready: false
    engine: none
    endpoints: [127.0.0.1:9003]
"#,
        )
        .unwrap();
        assert!(
            report.starts_with("models.yaml: ok, 2 models, 1 label group\n"),
            "{report}"
        );
        for line in [
            "model chat-a",
            "  routing:           prefix (consistent hash of the cache key over 2 pods; no key: the service; connect failures try the next pods, then the service)",
            // Sorted as the router holds them.
            "  pods:              127.0.0.1:9002, [::1]:9001 (2)",
            "  service fallback:  http://127.0.0.1:9000",
            "  served model name: llama3:8b (the body's \"model\" is rewritten)",
            "  engine signals:    auto (in-band load reports, and the metrics page of vLLM, SGLang or llama.cpp, detected while they do not give the whole load)",
            "  engine signals:    none (node-local load only)",
            "  label group:       chat, priority 100, ready",
            "  routing:           least-loaded (fewest requests in flight plus reservations among 1 pod, ties round-robin)",
            "  label group:       chat, priority 0, not ready",
            "label group chat (mode round-robin)",
            "  priority 100: chat-a",
            "  priority 0: chat-b (not ready)",
            "  picks among:       chat-a (round-robin)",
        ] {
            assert!(report.lines().any(|l| l == line), "missing {line:?} in\n{report}");
        }
        assert!(!report.contains("warning"), "{report}");
    }

    #[test]
    fn hash_balance_is_shown_with_where_it_comes_from() {
        let report = run_check(
            "models:\n  - name: a\n    routing: cache-aware\n    hashBalanceFactor: 1.5\n    endpoints: [127.0.0.1:1]\n  - name: b\n    routing: prefix\n    hashBalanceFactor: 0\n    endpoints: [127.0.0.1:2]\n  - name: c\n    routing: least-loaded\n    endpoints: [127.0.0.1:3]\n",
        )
        .unwrap();
        for line in [
            "  hash balance:      factor 1.5 (this model), floor 4 (proxy): a pod at max(ceil(factor x mean load), floor) requests in flight passes its keys on",
            "  hash balance:      off, the plain ring (this model)",
        ] {
            assert!(report.lines().any(|l| l == line), "missing {line:?} in\n{report}");
        }
        assert_eq!(report.matches("hash balance:").count(), 2, "{report}");
        assert!(report.contains("longest prompt-prefix match"), "{report}");
    }

    #[test]
    fn admission_is_shown_with_where_each_value_comes_from() {
        let report = run_check(
            "models:\n  - name: a\n    maxConcurrency: 2\n    queue: {maxSize: 10, timeout: 5s}\n    tokensPerMinute: 6000\n    endpoints: [127.0.0.1:1]\n  - name: b\n    queue: {maxSize: 0}\n    endpoints: [127.0.0.1:2]\n",
        )
        .unwrap();
        for line in [
            "  pods full at:      2 requests in flight (this model), or a fresh engine report with more than 0 waiting or KV cache above 0.95 (proxy)",
            "  queue:             up to 10 requests (this model), waiting 5s (this model), sheddable 5s (proxy)",
            "  token budget:      6000 tokens a minute per tenant, burst 6000 (this model; per proxy)",
            "  pods full at:      a fresh engine report with more than 0 waiting or KV cache above 0.95 (proxy); no concurrency limit",
            "  queue:             none: a full model answers 429 queue_full at once (this model)",
            "  token budget:      none",
        ] {
            assert!(report.lines().any(|l| l == line), "missing {line:?} in\n{report}");
        }
        // As serve would run with other flags.
        let mut admission = AdmissionDefaults::default();
        admission.full_when.waiting_above = crate::admission::Above(None);
        admission.full_when.kv_usage_above = crate::admission::Above(None);
        admission.queue_timeout = std::time::Duration::from_secs(2);
        admission.sheddable_timeout = std::time::Duration::from_secs(2);
        let proxy = Proxy {
            knobs: RoutingKnobs::DEFAULT,
            admission,
            fallbacks: Vec::new(),
        };
        let report = check_with(Path::new("m.yaml"), "models:\n  - name: c\n", &proxy).unwrap();
        for line in [
            "  pods full at:      never: no concurrency limit, engine reports ignored (proxy)",
            "  queue:             up to 1000 requests (proxy), waiting 2s (proxy), sheddable 2s (proxy)",
        ] {
            assert!(report.lines().any(|l| l == line), "missing {line:?} in\n{report}");
        }
    }

    #[test]
    fn mistakes_name_line_and_column() {
        for (text, want) in [
            (
                "models:\n  - name: a\n    sevice: http://127.0.0.1:1\n",
                "models.yaml:3:5: models[0]: unknown field `sevice`, expected one of",
            ),
            (
                "models:\n  - name: a\n    routing: fastest\n",
                "models.yaml:3:14: models[0].routing: unknown routing strategy \"fastest\"",
            ),
            (
                "models:\n  - name: a\n    endpoints: [127.0.0.1:1, 10.0.0.1]\n",
                "models.yaml:3:30: models[0].endpoints[1]: endpoint \"10.0.0.1\" is not IP:port",
            ),
            (
                "models:\n  - name: a\n  - name: a\n",
                "models.yaml:3:5: models[1]: model \"a\" is listed twice",
            ),
            (
                "models:\n  - name: a\n    service: 127.0.0.1:9000\n",
                "models.yaml:3:14: models[0].service: service \"127.0.0.1:9000\" must be an http:// URL",
            ),
            (
                "models:\n  - name: a\n    routePriority: high\n",
                "models.yaml:3:20: models[0].routePriority: invalid type: string \"high\", expected i64",
            ),
        ] {
            let err = run_check(text).unwrap_err();
            assert!(err.starts_with(want), "{text:?}:\n got  {err}\n want {want}");
        }
    }

    #[test]
    fn suspicious_but_valid_files_pass_with_warnings() {
        let report = run_check(
            "models:\n  - name: lonely\n    routing: prefix\n  - name: chat\n  - name: m\n    serviceLabel: chat\n    endpoints: [127.0.0.1:1, 127.0.0.1:1]\n",
        )
        .unwrap();
        for w in [
            "warning: model lonely: no pods and no service: its requests are answered 503",
            "warning: model chat: no pods and no service: its requests are answered 503",
            "warning: label chat is also a model name: requests for chat go to that model, not to the group",
            "warning: model m: an endpoint is listed twice (routed once)",
        ] {
            assert!(report.lines().any(|l| l == w), "missing {w:?} in\n{report}");
        }
    }

    #[test]
    fn a_group_without_a_ready_member_cold_starts_on_the_first_of_the_top_tier() {
        let report = run_check(
            "models:\n  - name: b\n    serviceLabel: g\n    ready: false\n    endpoints: [127.0.0.1:1]\n  - name: a\n    serviceLabel: g\n    ready: false\n    endpoints: [127.0.0.1:2]\n",
        )
        .unwrap();
        assert!(
            report
                .lines()
                .any(|l| l == "  picks among:       no member is ready: cold start on a"),
            "{report}"
        );
    }
}
