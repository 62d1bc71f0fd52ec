use super::*;
use crate::keys::chain::chain_of_json;

/// A chain of a system prompt of `system` characters and one user message of `user`.
fn prompt(system: usize, user: usize) -> PromptChain {
    let body = serde_json::json!({"messages": [
        {"role": "system", "content": "s".repeat(system)},
        {"role": "user", "content": "u".repeat(user)},
    ]})
    .to_string();
    chain_of_json(&body, false).expect("a prompt")
}

fn usage(prompt_tokens: u64, cached: Option<u64>) -> Usage {
    Usage {
        prompt_tokens,
        completion_tokens: 1,
        cached_tokens: cached,
    }
}

#[test]
fn the_chain_knows_where_each_link_ends() {
    // System: cuts at 1024 and 2048, then its end at 2500; the user message ends at 3500.
    let c = prompt(2500, 1000);
    assert_eq!(c.links().len(), 4);
    let ends: Vec<u64> = (0..4).map(|i| c.chars_up_to(i)).collect();
    assert_eq!(ends, [1024, 2048, 2500, 3500]);
    assert_eq!(c.chars(), 3500);
    assert_eq!(c.links_within(0), 0);
    assert_eq!(c.links_within(2047), 1);
    assert_eq!(c.links_within(2500), 3);
    assert_eq!(c.links_within(u64::MAX), 4);
}

#[test]
fn a_report_well_short_of_the_prediction_forgets_what_the_pod_lost() {
    let c = prompt(2500, 1000); // 3500 characters; say 875 prompt tokens (4 per token)
                                // Predicted all four links; the pod found nothing cached: it holds none of them.
    assert_eq!(
        verdict(&c, 4, &usage(875, Some(0))),
        Verdict::Lost { held: 0 }
    );
    // It found the system prompt (625 tokens = 2500 characters): three links held.
    assert_eq!(verdict(&c, 4, &usage(875, Some(625))), Verdict::Agrees);
    // Half of the system prompt (320 tokens = 1280 characters): one link.
    assert_eq!(
        verdict(&c, 4, &usage(875, Some(320))),
        Verdict::Lost { held: 1 }
    );
    // Everything, or more than predicted: agrees.
    assert_eq!(verdict(&c, 4, &usage(875, Some(875))), Verdict::Agrees);
    assert_eq!(verdict(&c, 1, &usage(875, Some(875))), Verdict::Agrees);
    // No cached count reported: nothing to say.
    assert_eq!(verdict(&c, 4, &usage(875, None)), Verdict::Unknown);
    // No prompt count: four characters a token.
    assert_eq!(
        verdict(&c, 4, &usage(0, Some(0))),
        Verdict::Lost { held: 0 }
    );
}

#[test]
fn predictions_and_reports_add_up_per_pod() {
    let c = prompt(2500, 1000);
    let u = usage(875, Some(100));
    assert_eq!(predicted_tokens(&c, 4, &u), 875);
    assert_eq!(predicted_tokens(&c, 2, &u), 512);
    assert_eq!(predicted_tokens(&c, 0, &u), 0);
    let f = CacheFeedback::default();
    assert_eq!(f.view(3), None);
    f.record(3, 875, &u, Shortfall::Forgot(4));
    f.record(3, 512, &usage(875, Some(600)), Shortfall::None);
    f.record(3, 875, &usage(875, Some(0)), Shortfall::StillTaught);
    f.record(3, 875, &usage(875, Some(0)), Shortfall::Kept);
    assert_eq!(
        f.view(3),
        Some(FeedbackView {
            answers: 4,
            predicted_cached_tokens: 3137,
            reported_cached_tokens: 700,
            fell_short: 3,
            forgotten_links: 4,
            fell_short_while_taught: 1,
            fell_short_kept: 1,
        })
    );
    f.reset(3);
    assert_eq!(f.view(3), None);
}

#[test]
fn only_the_second_shortfall_in_a_row_forgets() {
    let f = CacheFeedback::default();
    assert!(
        !f.short_again(5),
        "the first: the request put the prefix back"
    );
    assert!(f.short_again(5), "the second in a row");
    assert!(f.short_again(5));
    assert!(!f.short_again(6), "another pod's row is its own");
    f.agreed(5);
    assert!(!f.short_again(5), "an answer that agreed ends the row");
    f.reset(5);
    assert!(
        !f.short_again(5),
        "a slot that stands for another pod starts afresh"
    );
    // Past the gauge's slots: never forgets, never panics.
    assert!(!f.short_again(u32::MAX) && !f.short_again(u32::MAX));
    f.agreed(u32::MAX);
}
