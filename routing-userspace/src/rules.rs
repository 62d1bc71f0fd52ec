//! What each strategy does with a request, as data: which key sources it can report and how it
//! picks pods with or without a key. The router follows these rules when it decides, and the
//! metric handles are resolved from the same rules when a routing table is built, so the series
//! that exist at zero are exactly the ones a decision can touch. Imports only the vocabulary.

use crate::vocab::{KeySource, Outcome, Strategy};

/// The key sources a strategy can report (the `key_source` label values it may produce).
pub fn sources_for(strategy: Strategy) -> &'static [KeySource] {
    use KeySource::*;
    match strategy {
        Strategy::Default | Strategy::LeastLoaded => &[None],
        Strategy::SessionAffinity => &[
            SessionHeader,
            ConversationHeader,
            SessionBody,
            ImplicitSession,
            None,
        ],
        Strategy::Prefix => &KeySource::ALL,
    }
}

/// How a model orders its pods for one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PodChoice {
    /// No pod: the Service takes it (default routing, or a keyless prefix request).
    Service,
    /// Round-robin over the pods (default routing without a Service to balance for us).
    RoundRobin,
    /// Fewest active requests plus reservations.
    LeastLoaded,
    /// The consistent-hash ring walked from the key.
    Ring,
    /// A random pod (spec: "Session ID not found -> Random pod selection"; also a keyless
    /// prefix request with no Service, where any pod beats none).
    Random,
}

/// The rule for a model with `strategy`, for a request with or without a key.
pub fn pod_choice(strategy: Strategy, has_key: bool, has_service: bool) -> PodChoice {
    match strategy {
        Strategy::Default if has_service => PodChoice::Service,
        Strategy::Default => PodChoice::RoundRobin,
        Strategy::LeastLoaded => PodChoice::LeastLoaded,
        Strategy::SessionAffinity | Strategy::Prefix if has_key => PodChoice::Ring,
        Strategy::SessionAffinity => PodChoice::Random,
        Strategy::Prefix if has_service => PodChoice::Service,
        Strategy::Prefix => PodChoice::Random,
    }
}

/// The outcomes a pod choice can end in: a pod, or the Service when there is no pod.
pub fn outcomes(choice: PodChoice) -> &'static [Outcome] {
    match choice {
        PodChoice::Service => &[Outcome::ServiceFallback],
        _ => &[Outcome::Pod, Outcome::ServiceFallback],
    }
}

/// Every `(key source, outcome)` a model can report.
pub fn possible_decisions(
    strategy: Strategy,
    has_service: bool,
) -> impl Iterator<Item = (KeySource, Outcome)> {
    sources_for(strategy).iter().flat_map(move |&source| {
        let choice = pod_choice(strategy, source != KeySource::None, has_service);
        outcomes(choice).iter().map(move |&o| (source, o))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keyless_default_and_prefix_with_a_service_never_report_a_pod() {
        let pairs: Vec<_> = possible_decisions(Strategy::Prefix, true).collect();
        assert!(pairs.contains(&(KeySource::Canonical, Outcome::Pod)));
        assert!(!pairs.contains(&(KeySource::None, Outcome::Pod)));
        assert!(pairs.contains(&(KeySource::None, Outcome::ServiceFallback)));
        let pairs: Vec<_> = possible_decisions(Strategy::Default, false).collect();
        assert_eq!(
            pairs,
            [
                (KeySource::None, Outcome::Pod),
                (KeySource::None, Outcome::ServiceFallback)
            ]
        );
    }
}
