//! Per-thread tallies: the storage under [`crate::probe`] and [`crate::traffic`].
//!
//! [`per_thread_tally!`] defines, in the module that invokes it, a thread-local count per
//! key and three functions: `add(key)` (private), `snapshot()` and `reset()` (public). A
//! madsim runtime runs one seed on the thread that calls it, so `reset` before a seed and
//! `snapshot` after it give that seed's counts. Outside `cfg(madsim)` nothing is stored:
//! `add` does nothing and `snapshot` is empty.

/// `per_thread_tally!(Key)`: see the module doc.
macro_rules! per_thread_tally {
    ($key:ty) => {
        #[cfg(madsim)]
        thread_local! {
            static COUNTS: std::cell::RefCell<std::collections::BTreeMap<$key, u64>> =
                const { std::cell::RefCell::new(std::collections::BTreeMap::new()) };
        }

        /// Counts `key` once on this thread (nothing outside the simulation).
        #[inline]
        #[cfg_attr(not(madsim), allow(dead_code))]
        fn add(key: $key) {
            #[cfg(madsim)]
            COUNTS.with(|c| *c.borrow_mut().entry(key).or_insert(0) += 1);
            #[cfg(not(madsim))]
            let _ = key;
        }

        /// This thread's counts since the last [`reset`] (empty outside the simulation).
        pub fn snapshot() -> std::collections::BTreeMap<$key, u64> {
            #[cfg(madsim)]
            return COUNTS.with(|c| c.borrow().clone());
            #[cfg(not(madsim))]
            std::collections::BTreeMap::new()
        }

        /// Forgets this thread's counts (call before each seed).
        pub fn reset() {
            #[cfg(madsim)]
            COUNTS.with(|c| c.borrow_mut().clear());
        }
    };
}
