//! BUGGIFY-style fault points, in the spirit of FoundationDB's `BUGGIFY`: places in our own
//! code paths where the simulation may inject a realistic delay or early error.
//!
//! ```text
//! dlock_rt::buggify::delay(0.05, 300).await; // sometimes this hop is slow
//! if dlock_rt::buggify::fires(0.01) { return Err(...) } // sometimes it fails early
//! ```
//!
//! Invariants:
//! - Outside `cfg(madsim)` [`fires`] is the constant `false`: production never takes a fault
//!   point's branch and keeps no state.
//! - Under `cfg(madsim)` it is `false` until the world calls [`enable`] on the thread running
//!   the seed (one madsim runtime per thread, as with [`crate::probe`]); the draws come from
//!   the runtime's seeded stream, so a seed replays its faults bit for bit, and a world that
//!   does not enable buggify draws nothing (its traces are unchanged).
//! - As in FoundationDB, each fault point (call site) is first *activated* or not, once per
//!   run, with probability [`SITE_ACTIVATION_P`]; an inactive site never fires during that
//!   run, so different seeds explore different combinations of fault points.
//! - This is not madsim's own `madsim::buggify` flag, which also makes madsim's network delay
//!   10 % of its sends by 1–5 s; the world turns that on separately if it wants it.

/// Probability that a fault point is active for a whole run once buggify is enabled.
pub const SITE_ACTIVATION_P: f64 = 0.5;

#[cfg(madsim)]
mod state {
    use std::cell::RefCell;
    use std::collections::BTreeMap;

    pub struct Buggify {
        pub enabled: bool,
        /// Call site (file, line, column) -> active for this run.
        pub sites: BTreeMap<(&'static str, u32, u32), bool>,
        pub fired: u64,
    }

    thread_local! {
        pub static STATE: RefCell<Buggify> = const {
            RefCell::new(Buggify { enabled: false, sites: BTreeMap::new(), fired: 0 })
        };
    }
}

/// Turns the fault points on for the runtime on this thread (and forgets which sites were
/// activated before). A no-op outside the simulation.
pub fn enable() {
    #[cfg(madsim)]
    state::STATE.with(|s| {
        let mut s = s.borrow_mut();
        s.enabled = true;
        s.sites.clear();
        s.fired = 0;
    });
}

/// Turns the fault points off on this thread.
pub fn disable() {
    #[cfg(madsim)]
    state::STATE.with(|s| s.borrow_mut().enabled = false);
}

/// Whether the fault points are on for this thread (always `false` outside the simulation).
pub fn is_enabled() -> bool {
    #[cfg(madsim)]
    return state::STATE.with(|s| s.borrow().enabled);
    #[cfg(not(madsim))]
    false
}

/// How many times a fault point fired on this thread since [`enable`].
pub fn fired() -> u64 {
    #[cfg(madsim)]
    return state::STATE.with(|s| s.borrow().fired);
    #[cfg(not(madsim))]
    0
}

/// Whether the fault point at the caller's location fires now, with probability `p` when
/// its site is active (module doc). Always `false` outside the simulation, outside a madsim
/// runtime, or when the world has not enabled buggify.
#[track_caller]
#[inline]
pub fn fires(p: f64) -> bool {
    #[cfg(madsim)]
    {
        use rand::Rng;
        let loc = std::panic::Location::caller();
        if !is_enabled() || madsim::runtime::Handle::try_current().is_err() {
            return false;
        }
        let site = (loc.file(), loc.line(), loc.column());
        let active = state::STATE.with(|s| s.borrow().sites.get(&site).copied());
        let active = match active {
            Some(a) => a,
            None => {
                let a = madsim::rand::thread_rng().gen_bool(SITE_ACTIVATION_P);
                state::STATE.with(|s| s.borrow_mut().sites.insert(site, a));
                a
            }
        };
        let p = if p.is_finite() { p.clamp(0.0, 1.0) } else { 0.0 };
        let hit = active && madsim::rand::thread_rng().gen_bool(p);
        if hit {
            state::STATE.with(|s| s.borrow_mut().fired += 1);
        }
        hit
    }
    #[cfg(not(madsim))]
    {
        let _ = p;
        false
    }
}

/// Sleeps up to `max_ms` (at least 1 ms) when the fault point at the caller fires with
/// probability `p`, and returns at once otherwise: the common fault point, "this hop is
/// slow today".
#[track_caller]
pub fn delay(p: f64, max_ms: u64) -> impl std::future::Future<Output = ()> {
    let ms = if fires(p) { crate::rand::random_u64() % max_ms.max(1) + 1 } else { 0 };
    async move {
        if ms > 0 {
            crate::sleep(crate::Duration::from_millis(ms)).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(not(madsim))]
    #[test]
    fn outside_the_simulation_a_fault_point_never_fires() {
        enable();
        assert!(!is_enabled());
        assert!((0..1000).all(|_| !fires(1.0)));
        assert_eq!(fired(), 0);
    }

    #[cfg(madsim)]
    #[test]
    fn a_fault_point_fires_only_once_enabled_and_only_at_active_sites() {
        let rt = madsim::runtime::Runtime::with_seed_and_config(3, madsim::Config::default());
        rt.block_on(async {
            disable();
            assert!((0..100).all(|_| !fires(1.0)), "disabled buggify fired");
            // Over many runs a p=1 site is sometimes active (fires every time) and sometimes
            // not (never fires): both must be seen.
            let (mut active, mut inactive) = (0, 0);
            for _ in 0..64 {
                enable();
                let n = (0..10).filter(|_| fires(1.0)).count();
                assert!(n == 0 || n == 10, "a p=1 site fired {n}/10 times in one run");
                if n == 10 {
                    active += 1
                } else {
                    inactive += 1
                }
            }
            assert!(active > 0 && inactive > 0, "site activation is not drawn: {active} active, {inactive} not");
            disable();
        });
    }
}
