//! Route-priority tiers for label groups (spec: "Preferred member (route-priority)").
//!
//! Every pick is narrowed to the highest-priority tier of the Ready members before the group's
//! mode runs. With no Ready member, the cold-start target is the alphabetically first member of
//! the highest-priority tier of all members.

/// What a member looks like to the tier logic.
pub trait Member {
    fn name(&self) -> &str;
    fn priority(&self) -> i64;
    fn ready(&self) -> bool;
}

/// The top tier of the ready members.
#[derive(Debug, PartialEq, Eq)]
pub struct Tier {
    /// Indices of the members in the top tier, in input order.
    pub members: Vec<usize>,
    /// Whether the tier left out some ready member (decision outcome `priority_pick`).
    pub narrowed: bool,
}

/// The highest-priority tier among ready members, or `None` when no member is ready.
pub fn top_ready_tier<M: Member>(members: &[M]) -> Option<Tier> {
    let ready: Vec<usize> = (0..members.len()).filter(|&i| members[i].ready()).collect();
    let top = ready.iter().map(|&i| members[i].priority()).max()?;
    let tier: Vec<usize> = ready
        .iter()
        .copied()
        .filter(|&i| members[i].priority() == top)
        .collect();
    Some(Tier {
        narrowed: tier.len() < ready.len(),
        members: tier,
    })
}

/// The cold-start target: alphabetically first member of the highest-priority tier.
pub fn cold_start<M: Member>(members: &[M]) -> Option<usize> {
    let top = members.iter().map(Member::priority).max()?;
    (0..members.len())
        .filter(|&i| members[i].priority() == top)
        .min_by(|&a, &b| members[a].name().cmp(members[b].name()))
}

#[cfg(test)]
mod tests {
    use super::*;

    struct M(&'static str, i64, bool);
    impl Member for M {
        fn name(&self) -> &str {
            self.0
        }
        fn priority(&self) -> i64 {
            self.1
        }
        fn ready(&self) -> bool {
            self.2
        }
    }

    #[test]
    fn narrows_to_the_ready_top_tier() {
        let g = [
            M("slow", 0, true),
            M("fast", 100, true),
            M("fast2", 100, true),
        ];
        assert_eq!(
            top_ready_tier(&g),
            Some(Tier {
                members: vec![1, 2],
                narrowed: true
            })
        );
        let g = [M("slow", 0, true), M("fast", 100, false)];
        assert_eq!(
            top_ready_tier(&g),
            Some(Tier {
                members: vec![0],
                narrowed: false
            }),
            "primary left Ready"
        );
        let g = [M("a", 0, true), M("b", 0, true)];
        assert_eq!(
            top_ready_tier(&g),
            Some(Tier {
                members: vec![0, 1],
                narrowed: false
            }),
            "symmetric fleet unaffected"
        );
        let g = [M("a", 0, false)];
        assert_eq!(top_ready_tier(&g), None);
    }

    #[test]
    fn cold_start_is_alphabetically_first_of_the_top_tier() {
        let g = [
            M("zeta", 5, false),
            M("beta", 5, false),
            M("alpha", 0, false),
        ];
        assert_eq!(cold_start(&g), Some(1));
        let none: [M; 0] = [];
        assert_eq!(cold_start(&none), None);
    }
}
