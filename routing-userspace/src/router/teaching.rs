//! Prefixes still on their way into a pod's cache. The index learns a chain when it picks the
//! pod, before the engine holds it: until the request that taught it ends, the pod is still
//! prefilling it, or holds it in a slot that request keeps busy. A second request for the same
//! prefix that reaches the pod meanwhile finds it uncached, and its report then says nothing
//! about what the pod lost, so the closed loop ([`super::feedback`]) must not forget the
//! prefix for it. It did: on three llama.cpp servers, a document's second request, sent while
//! the first was prefilling, made the index forget the document, and its next requests were
//! placed afresh on another server.
//!
//! Each cache-aware request registers the links it adds to the index for its pod (at most
//! [`MAX_LINKS`], the first of them) until its decision drops; a prediction that counts on a
//! registered link is marked as resting on a lesson in flight.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use crate::load::Slot;

/// Links a request registers at most: 256 cuts of the chain, about 64,000 tokens of new prompt.
/// A prediction past them rests on an unregistered link and is judged as any other.
pub const MAX_LINKS: usize = 256;

/// The links requests in flight are teaching, per pod.
#[derive(Debug, Default)]
pub struct Teaching {
    links: Mutex<HashMap<(Slot, u64), u32>>,
}

impl Teaching {
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<(Slot, u64), u32>> {
        crate::lock::lock(&self.links)
    }

    /// A request teaches `new_links` to the pod in `slot` until the lesson drops.
    pub fn start(self: &Arc<Self>, slot: Slot, new_links: &[u64]) -> Lesson {
        let links: Box<[u64]> = new_links[..new_links.len().min(MAX_LINKS)].into();
        if !links.is_empty() {
            let mut map = self.lock();
            for &link in links.iter() {
                *map.entry((slot, link)).or_insert(0) += 1;
            }
        }
        Lesson {
            teaching: Arc::clone(self),
            slot,
            links,
        }
    }

    /// Whether a request in flight is teaching `link` to the pod in `slot`.
    pub fn in_flight(&self, slot: Slot, link: u64) -> bool {
        self.lock().contains_key(&(slot, link))
    }

    /// Links registered over all pods (for tests and views).
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// One request's links; dropping it ends the lesson.
#[derive(Debug)]
pub struct Lesson {
    teaching: Arc<Teaching>,
    slot: Slot,
    links: Box<[u64]>,
}

impl Drop for Lesson {
    fn drop(&mut self) {
        if self.links.is_empty() {
            return;
        }
        let mut map = self.teaching.lock();
        for &link in self.links.iter() {
            if let Some(n) = map.get_mut(&(self.slot, link)) {
                *n -= 1;
                if *n == 0 {
                    map.remove(&(self.slot, link));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_link_is_in_flight_while_any_lesson_teaches_it_to_that_pod() {
        let t = Teaching::new();
        let a = t.start(1, &[10, 11, 12]);
        let b = t.start(1, &[12, 13]);
        let other_pod = t.start(2, &[20]);
        assert!(t.in_flight(1, 10) && t.in_flight(1, 12) && t.in_flight(1, 13));
        assert!(!t.in_flight(2, 10), "another pod's lesson");
        assert!(t.in_flight(2, 20));
        drop(a);
        assert!(!t.in_flight(1, 10));
        assert!(t.in_flight(1, 12), "b still teaches it");
        drop(b);
        drop(other_pod);
        assert!(t.is_empty(), "nothing left behind");
        // Nothing new to teach registers nothing.
        let none = t.start(1, &[]);
        assert!(t.is_empty());
        drop(none);
    }

    #[test]
    fn a_long_chain_registers_its_first_links_only() {
        let t = Teaching::new();
        let links: Vec<u64> = (0..(MAX_LINKS as u64 + 10)).collect();
        let lesson = t.start(0, &links);
        assert_eq!(t.len(), MAX_LINKS);
        assert!(t.in_flight(0, MAX_LINKS as u64 - 1));
        assert!(!t.in_flight(0, MAX_LINKS as u64));
        drop(lesson);
        assert!(t.is_empty());
    }
}
