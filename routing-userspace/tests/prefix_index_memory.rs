//! The cache-aware index's memory budget, measured by the allocator rather than by the index's
//! own arithmetic: a counting global allocator tracks every byte the index holds while a
//! million distinct prompt prefixes (two links each, over 16 pods) go through it.
#![allow(unsafe_code)] // see the SAFETY lines

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

use routing_userspace::keys::hash_key;
use routing_userspace::router::prefix_index::PrefixIndex;

/// Bytes live in this test process.
static LIVE: AtomicUsize = AtomicUsize::new(0);

struct Counting;

// SAFETY: every call is forwarded to the system allocator unchanged; only a counter is kept.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size(), Ordering::Relaxed);
        // SAFETY: the caller upholds `alloc`'s contract, which is `System.alloc`'s.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
        // SAFETY: `ptr` came from `alloc` above with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: as for `dealloc` and `alloc`; the contract is `System.realloc`'s.
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            LIVE.fetch_add(new_size, Ordering::Relaxed);
            LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
        }
        p
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

#[test]
fn the_index_holds_no_more_than_its_budget_under_a_million_distinct_prefixes() {
    let budget = 8 << 20;
    let base = LIVE.load(Ordering::Relaxed);
    let ix = PrefixIndex::new(budget);
    let mut held_max = 0;
    for i in 0..1_000_000u64 {
        let head = hash_key(&format!("conversation-{i}"));
        ix.learn((i % 16) as u32, &[head, head.rotate_left(17)]);
        if i % 1024 == 0 {
            held_max = held_max.max(LIVE.load(Ordering::Relaxed).saturating_sub(base));
        }
    }
    let held = LIVE.load(Ordering::Relaxed).saturating_sub(base);
    held_max = held_max.max(held);
    assert_eq!(
        ix.len(),
        ix.capacity(),
        "the index is full, so eviction ran"
    );
    assert!(held_max <= budget, "held {held_max} bytes, budget {budget}");
    // It used most of what it may: the budget is a bound, not a guess far above the need.
    assert!(held * 2 > budget, "held only {held} of {budget}");
    drop(ix);
    assert!(LIVE.load(Ordering::Relaxed) <= base + 4096, "freed on drop");
}
