//! Locks that outlive a panic. The proxy's shared state (indexes, pools, ledgers, span queues)
//! stays usable after a thread panicked while holding it: every writer leaves it consistent
//! between statements, and a router that stopped routing because one request panicked would
//! be worse than one that reads what that request left.

use std::sync::{Mutex, MutexGuard, PoisonError};

/// Lock `m`, ignoring poisoning.
#[inline]
pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_poisoned_lock_still_gives_its_state() {
        let m = std::sync::Arc::new(Mutex::new(1));
        let held = m.clone();
        let _ = std::thread::spawn(move || {
            let mut g = held.lock().unwrap();
            *g = 2;
            panic!("poison it");
        })
        .join();
        assert!(m.is_poisoned());
        assert_eq!(*lock(&m), 2);
    }
}
