//! The prefix cache: an LRU set of block ids, sized in blocks like a GPU's KV cache.
//!
//! Because a block id names its whole prefix (see [`super::tokens`]), a prompt's cached tokens
//! are the leading run of its block ids found here. Lookups never mutate; [`PrefixCache::insert`]
//! touches a served prompt's blocks last-to-first, so its first blocks are the freshest and
//! eviction eats prompts from the tail, as vLLM frees blocks. Two ordered maps give
//! O(log n) touch and evict without unsafe linked lists.

use std::collections::{BTreeMap, HashMap};

/// An LRU set of block ids with a fixed capacity in blocks (0 disables caching).
#[derive(Debug, Default)]
pub struct PrefixCache {
    capacity: usize,
    clock: u64,
    last_use: HashMap<u64, u64>,
    by_age: BTreeMap<u64, u64>,
    evictions: u64,
}

impl PrefixCache {
    pub fn new(capacity: usize) -> Self {
        Self {
            capacity,
            ..Self::default()
        }
    }

    /// How many of `ids`, from the first, are cached.
    pub fn cached_prefix_blocks(&self, ids: &[u64]) -> usize {
        ids.iter()
            .take_while(|id| self.last_use.contains_key(id))
            .count()
    }

    /// Insert or touch every block of a served prompt, evicting least recently used blocks.
    pub fn insert(&mut self, ids: &[u64]) {
        if self.capacity == 0 {
            return;
        }
        for &id in ids.iter().rev() {
            self.clock += 1;
            if let Some(old) = self.last_use.insert(id, self.clock) {
                self.by_age.remove(&old);
            }
            self.by_age.insert(self.clock, id);
        }
        while self.last_use.len() > self.capacity {
            let Some((_, id)) = self.by_age.pop_first() else {
                break;
            };
            self.last_use.remove(&id);
            self.evictions += 1;
        }
    }

    /// Blocks held now.
    pub fn len(&self) -> usize {
        self.last_use.len()
    }

    pub fn is_empty(&self) -> bool {
        self.last_use.is_empty()
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Blocks evicted since start.
    pub fn evictions(&self) -> u64 {
        self.evictions
    }
}

#[cfg(test)]
mod tests {
    use super::super::tokens::blocks;
    use super::*;

    #[test]
    fn counts_only_the_leading_run() {
        let mut c = PrefixCache::new(10);
        c.insert(&[1, 2, 3]);
        assert_eq!(c.cached_prefix_blocks(&[1, 2, 3, 4]), 3);
        assert_eq!(c.cached_prefix_blocks(&[1, 9, 3]), 1);
        assert_eq!(c.cached_prefix_blocks(&[9, 2, 3]), 0);
        assert_eq!(c.cached_prefix_blocks(&[]), 0);
    }

    #[test]
    fn evicts_least_recently_used_tails_first() {
        let mut c = PrefixCache::new(4);
        c.insert(&[1, 2]);
        c.insert(&[10, 20]);
        c.insert(&[1, 2]); // touch: prompt [10, 20] is now the oldest
        c.insert(&[30]);
        assert_eq!(c.len(), 4);
        assert_eq!(c.evictions(), 1);
        // The tail block of the oldest prompt went first; its head survives.
        assert_eq!(c.cached_prefix_blocks(&[10, 20]), 1);
        assert_eq!(c.cached_prefix_blocks(&[1, 2]), 2);
        assert_eq!(c.cached_prefix_blocks(&[30]), 1);
    }

    #[test]
    fn zero_capacity_caches_nothing() {
        let mut c = PrefixCache::new(0);
        c.insert(&[1, 2]);
        assert!(c.is_empty());
        assert_eq!(c.cached_prefix_blocks(&[1]), 0);
    }

    #[test]
    fn shared_system_prompt_is_a_cached_prefix() {
        let system = "You answer using provided document context only. ".repeat(8);
        let first = blocks(&format!("{system}Summarize section A"), 4);
        let second = blocks(&format!("{system}Summarize section B, briefly"), 4);
        let mut c = PrefixCache::new(1024);
        assert_eq!(c.cached_prefix_blocks(&second.ids), 0);
        c.insert(&first.ids);
        let hit = c.cached_prefix_blocks(&second.ids);
        assert!(hit > 0 && hit < second.ids.len(), "hit {hit}");
        // The same text moved behind another prefix hits nothing.
        let moved = blocks(&format!("Preamble. {system}"), 4);
        assert_eq!(c.cached_prefix_blocks(&moved.ids), 0);
    }
}
