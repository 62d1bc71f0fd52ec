//! The routing decision: (table entry, request, loads) -> ordered targets + labels.
//!
//! Synchronous and free of I/O; the only side effect is the least-loaded reservation a pick
//! records, which is the spec's burst-safety rule. The proxy tries `targets` in order: pods
//! first (the pick, then alternates for connect failures), the model's Service last.

use std::fmt;
use std::net::SocketAddr;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Instant;

use crate::balance::priority::{cold_start, top_ready_tier};
use crate::balance::random::RandomPick;
use crate::balance::ring::HashPick;
use crate::balance::round_robin::RoundRobin;
use crate::balance::Selection;
use crate::discovery::Strategy;
use crate::keys::{self, KeyLimits, KeySource, RequestParts};
use crate::load::reservations::ReservationLedger;
use crate::load::LoadGauge;
use crate::table::{LabelGroup, ModelRoute, Pod, Route};

/// How a label group picks a member (`FLEXINFER_PROXY_LABEL_GROUP_ROUTING`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LabelGroupMode {
    #[default]
    RoundRobin,
    LeastLoaded,
    Prefix,
    Session,
}

impl LabelGroupMode {
    pub fn as_str(self) -> &'static str {
        match self {
            LabelGroupMode::RoundRobin => "round-robin",
            LabelGroupMode::LeastLoaded => "least-loaded",
            LabelGroupMode::Prefix => "prefix",
            LabelGroupMode::Session => "session",
        }
    }
}

impl fmt::Display for LabelGroupMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for LabelGroupMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().replace('_', "-").as_str() {
            "" | "round-robin" | "roundrobin" => Ok(Self::RoundRobin),
            "least-loaded" | "leastloaded" => Ok(Self::LeastLoaded),
            "prefix" => Ok(Self::Prefix),
            "session" | "session-affinity" => Ok(Self::Session),
            other => Err(format!(
                "unknown label group mode {other:?} (expected round-robin, least-loaded, prefix or session)"
            )),
        }
    }
}

/// Per-model decision outcome (`outcome` label of `routing_decisions_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Pod,
    ServiceFallback,
}

impl Outcome {
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Pod => "pod",
            Outcome::ServiceFallback => "service-fallback",
        }
    }
}

/// Label-group decision outcome (`outcome` label of `label_group_route_decisions_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GroupOutcome {
    /// The mode chose among the ready top tier (named after the mode).
    Mode(LabelGroupMode),
    /// A higher-priority tier took the pick from other ready members.
    PriorityPick,
    /// No member was ready: the alphabetically first member of the top tier.
    ColdStart,
}

impl GroupOutcome {
    pub fn as_str(self) -> &'static str {
        match self {
            GroupOutcome::Mode(LabelGroupMode::RoundRobin) => "round_robin",
            GroupOutcome::Mode(LabelGroupMode::LeastLoaded) => "least_loaded",
            GroupOutcome::Mode(LabelGroupMode::Prefix) => "prefix",
            GroupOutcome::Mode(LabelGroupMode::Session) => "session",
            GroupOutcome::PriorityPick => "priority_pick",
            GroupOutcome::ColdStart => "cold_start",
        }
    }
}

/// Where a request may go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    Pod(Pod),
    Service(Arc<str>),
}

impl Target {
    /// The `target` metric label: `ip:port`, or `service-dns`.
    pub fn label(&self) -> &str {
        match self {
            Target::Pod(p) => &p.label,
            Target::Service(_) => "service-dns",
        }
    }

    pub fn pod_addr(&self) -> Option<SocketAddr> {
        match self {
            Target::Pod(p) => Some(p.addr),
            Target::Service(_) => None,
        }
    }
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Target::Pod(p) => f.write_str(&p.label),
            Target::Service(url) => f.write_str(url),
        }
    }
}

/// The label-group part of a decision.
#[derive(Debug, Clone)]
pub struct GroupChoice {
    pub label: Arc<str>,
    pub mode: LabelGroupMode,
    pub outcome: GroupOutcome,
}

/// A routing decision for one request.
#[derive(Debug, Clone)]
pub struct Decision {
    /// The model that serves the request (for a label group, the chosen member).
    pub model: Arc<ModelRoute>,
    pub strategy: Strategy,
    pub key_source: KeySource,
    /// The hashed routing key, if any (for the cardinality tracker).
    pub key_hash: Option<u64>,
    pub outcome: Outcome,
    /// Targets in the order to try them; empty when there is nowhere to go.
    pub targets: Vec<Target>,
    pub group: Option<GroupChoice>,
    /// Malformed explicit keys that were skipped.
    pub ignored: Vec<keys::Ignored>,
}

/// Everything a decision reads besides the table entry.
pub struct Context<'a, 'r, 'b> {
    pub parts: RequestParts<'r, 'b>,
    pub limits: &'a KeyLimits,
    pub gauge: &'a dyn LoadGauge,
    pub pod_ledger: &'a ReservationLedger<SocketAddr>,
    pub group_ledger: &'a ReservationLedger<Arc<str>>,
    pub group_mode: LabelGroupMode,
    /// Pods tried before the Service (the pick plus alternates).
    pub max_pod_attempts: usize,
    pub now: Instant,
    /// A random draw (for session requests without a key).
    pub draw: u64,
}

pub fn decide(route: &Route, cx: &Context<'_, '_, '_>) -> Decision {
    match route {
        Route::Model(m) => decide_model(m, cx),
        Route::Group(g) => decide_group(g, cx),
    }
}

fn pod_load(pod: &Pod, cx: &Context<'_, '_, '_>) -> u64 {
    pod.slot.map_or(0, |s| cx.gauge.active(s))
}

/// Pick a pod of one model by its strategy.
pub fn decide_model(m: &Arc<ModelRoute>, cx: &Context<'_, '_, '_>) -> Decision {
    let strategy = m.spec.routing;
    let parts = RequestParts {
        model: Some(&m.name),
        ..cx.parts
    };
    let extraction = keys::extract(strategy, &parts, cx.limits);
    let key = extraction.key;
    let n = m.pods.len();
    let order: Vec<usize> = if n == 0 {
        Vec::new()
    } else {
        match strategy {
            Strategy::Default if m.service.is_some() => Vec::new(),
            // No Service to balance for us (local file without `service:`): round-robin.
            Strategy::Default => RoundRobin {
                ticket: m.next_ticket(),
            }
            .order(n),
            Strategy::LeastLoaded => {
                let addrs: Vec<SocketAddr> = m.pods.iter().map(|p| p.addr).collect();
                cx.pod_ledger.pick_and_reserve(
                    &addrs,
                    |i| pod_load(&m.pods[i], cx),
                    m.next_ticket(),
                    |_| Arc::clone(&m.name),
                    cx.now,
                )
            }
            Strategy::SessionAffinity | Strategy::Prefix => match key {
                Some(k) => HashPick {
                    ring: &m.ring,
                    hash: k.hash,
                }
                .order(n),
                // Spec: session ID not found -> random pod.
                None if strategy == Strategy::SessionAffinity => {
                    RandomPick { draw: cx.draw }.order(n)
                }
                // Spec: prefix with no key -> Service; with no Service, any pod beats none.
                None if m.service.is_some() => Vec::new(),
                None => RandomPick { draw: cx.draw }.order(n),
            },
        }
    };
    let mut targets: Vec<Target> = order
        .into_iter()
        .take(cx.max_pod_attempts.max(1))
        .map(|i| Target::Pod(m.pods[i].clone()))
        .collect();
    let outcome = if targets.is_empty() {
        Outcome::ServiceFallback
    } else {
        Outcome::Pod
    };
    if let Some(url) = &m.service {
        targets.push(Target::Service(Arc::clone(url)));
    }
    Decision {
        model: Arc::clone(m),
        strategy,
        key_source: key.map_or(KeySource::None, |k| k.source),
        key_hash: key.map(|k| k.hash),
        outcome,
        targets,
        group: None,
        ignored: extraction.ignored,
    }
}

/// Pick a member of a label group, then a pod of that member.
pub fn decide_group(g: &Arc<LabelGroup>, cx: &Context<'_, '_, '_>) -> Decision {
    let mode = cx.group_mode;
    let (member, outcome) = match top_ready_tier(&g.members) {
        None => {
            let i = cold_start(&g.members).expect("a label group has at least one member");
            (i, GroupOutcome::ColdStart)
        }
        Some(tier) => {
            let pick = pick_in_tier(g, &tier.members, cx);
            let outcome = if tier.narrowed {
                GroupOutcome::PriorityPick
            } else {
                GroupOutcome::Mode(mode)
            };
            (pick, outcome)
        }
    };
    let mut d = decide_model(&g.members[member], cx);
    d.group = Some(GroupChoice {
        label: Arc::clone(&g.label),
        mode,
        outcome,
    });
    d
}

/// The member (index into `g.members`) the group mode picks among `tier`.
fn pick_in_tier(g: &LabelGroup, tier: &[usize], cx: &Context<'_, '_, '_>) -> usize {
    if tier.len() == 1 {
        // Least-loaded still reserves a lone member, so its gauge story stays consistent.
        if cx.group_mode != LabelGroupMode::LeastLoaded {
            return tier[0];
        }
    }
    match cx.group_mode {
        LabelGroupMode::RoundRobin => {
            tier[RoundRobin {
                ticket: g.next_ticket(),
            }
            .order(tier.len())[0]]
        }
        LabelGroupMode::LeastLoaded => {
            let names: Vec<Arc<str>> = tier
                .iter()
                .map(|&i| Arc::clone(&g.members[i].name))
                .collect();
            let order = cx.group_ledger.pick_and_reserve(
                &names,
                |k| {
                    let m = &g.members[tier[k]];
                    m.pods.iter().map(|p| pod_load(p, cx)).sum()
                },
                g.next_ticket(),
                |k| Arc::clone(&names[k]),
                cx.now,
            );
            tier[order[0]]
        }
        LabelGroupMode::Prefix | LabelGroupMode::Session => {
            let strategy = if cx.group_mode == LabelGroupMode::Prefix {
                Strategy::Prefix
            } else {
                Strategy::SessionAffinity
            };
            match keys::extract(strategy, &cx.parts, cx.limits).key {
                // Walk the group ring (built over all members) to the first one in the tier.
                Some(k) => g
                    .ring
                    .candidates(k.hash)
                    .into_iter()
                    .find(|i| tier.contains(i))
                    .unwrap_or(tier[0]),
                None => tier[RandomPick { draw: cx.draw }.order(tier.len())[0]],
            }
        }
    }
}

#[cfg(test)]
mod tests;
