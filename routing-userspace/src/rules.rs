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
        Strategy::Prefix => &[
            ExplicitHeader,
            ExplicitBody,
            PrefixField,
            Canonical,
            SessionHeader,
            ConversationHeader,
            SessionBody,
            ImplicitSession,
            None,
        ],
        Strategy::CacheAware => &[ExplicitHeader, ExplicitBody, PrefixField, PromptChain, None],
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
    /// The consistent-hash ring walked from the key, passing over pods at the hash-balance
    /// bound when it is on.
    Ring,
    /// The pod whose prefix index matches the longest run of the prompt chain, among the pods
    /// under the hash-balance bound; ties and no match go by the bounded ring.
    CacheAware,
    /// A random pod (spec: "Session ID not found -> Random pod selection"; also a keyless
    /// prefix request with no Service, where any pod beats none).
    Random,
}

/// The rule for a model with `strategy`, for a request whose key came from `source`
/// ([`KeySource::None`] when it has no key).
pub fn pod_choice(strategy: Strategy, source: KeySource, has_service: bool) -> PodChoice {
    let has_key = source != KeySource::None;
    match strategy {
        Strategy::Default if has_service => PodChoice::Service,
        Strategy::Default => PodChoice::RoundRobin,
        Strategy::LeastLoaded => PodChoice::LeastLoaded,
        Strategy::CacheAware if source == KeySource::PromptChain => PodChoice::CacheAware,
        Strategy::SessionAffinity | Strategy::Prefix | Strategy::CacheAware if has_key => {
            PodChoice::Ring
        }
        Strategy::SessionAffinity => PodChoice::Random,
        Strategy::Prefix | Strategy::CacheAware if has_service => PodChoice::Service,
        Strategy::Prefix | Strategy::CacheAware => PodChoice::Random,
    }
}

/// The outcomes a pod choice can end in: a pod (or, for the choices a hash-balance bound
/// applies to, a spill past a pod at the bound), or the Service when there is no pod.
pub fn outcomes(choice: PodChoice) -> &'static [Outcome] {
    match choice {
        PodChoice::Service => &[Outcome::ServiceFallback],
        PodChoice::Ring | PodChoice::CacheAware => {
            &[Outcome::Pod, Outcome::Spill, Outcome::ServiceFallback]
        }
        _ => &[Outcome::Pod, Outcome::ServiceFallback],
    }
}

/// Whether a strategy can spill (it walks a ring with some key source).
pub fn can_spill(strategy: Strategy, has_service: bool) -> bool {
    possible_decisions(strategy, has_service).any(|(_, o)| o == Outcome::Spill)
}

/// Every `(key source, outcome)` a model can report.
pub fn possible_decisions(
    strategy: Strategy,
    has_service: bool,
) -> impl Iterator<Item = (KeySource, Outcome)> {
    sources_for(strategy).iter().flat_map(move |&source| {
        let choice = pod_choice(strategy, source, has_service);
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

    #[test]
    fn ring_choices_can_spill_and_only_cache_aware_reports_the_prompt_chain() {
        for s in [
            Strategy::SessionAffinity,
            Strategy::Prefix,
            Strategy::CacheAware,
        ] {
            assert!(can_spill(s, true), "{s}");
        }
        for s in [Strategy::Default, Strategy::LeastLoaded] {
            assert!(!can_spill(s, true) && !can_spill(s, false), "{s}");
        }
        let pairs: Vec<_> = possible_decisions(Strategy::CacheAware, true).collect();
        assert!(pairs.contains(&(KeySource::PromptChain, Outcome::Spill)));
        assert!(pairs.contains(&(KeySource::ExplicitHeader, Outcome::Spill)));
        assert!(!pairs.contains(&(KeySource::None, Outcome::Pod)));
        for s in [Strategy::Prefix, Strategy::SessionAffinity] {
            assert!(!sources_for(s).contains(&KeySource::PromptChain), "{s}");
        }
        assert_eq!(
            pod_choice(Strategy::CacheAware, KeySource::None, false),
            PodChoice::Random
        );
    }
}
