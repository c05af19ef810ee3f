//! Monotonic and wall clocks: per node, with a wall-clock skew, and in simulation a rate.
//!
//! The monotonic clock decides leases and timeouts. The wall clock only stamps records for
//! humans (C3 §3.1: "wall clocks appear in responses for humans only"), so skewing or
//! stepping it must never change a correctness decision: the simulation gives every node
//! its own skew to prove exactly that.
//!
//! # Frames
//!
//! Every reading belongs to a *frame*. In production there is one frame, the host's. Under
//! `cfg(madsim)` each simulated node has its own frame, driven by `dlock_rt::sim_clock`: its
//! monotonic clock runs at the node's own rate and its wall clock carries the node's steps.
//! [`Clock::system`] and [`Clock::with_skew_ms`] read the frame of the node whose task is
//! running; [`Clock::reference`] reads the simulation's reference frame (madsim's one global
//! clock), for state that lives outside every node, such as the simulated databases.
//!
//! # Invariants
//!
//! - An [`Instant`] may only be compared with, or subtracted from, an instant of the same
//!   frame. Under `cfg(madsim)` every instant carries its frame and mixing two frames
//!   panics (release builds too): the difference of two nodes' monotonic readings means
//!   nothing, and a lease computed from one would be luck, not arithmetic.
//! - Within a frame the monotonic clock never goes backwards, whatever its rate does.
//! - The wall clock may go backwards (a node's wall clock can be stepped back). Nothing that
//!   decides correctness reads it.
//! - Outside the simulation none of this costs anything: [`Instant`] is tokio's, and a
//!   [`Clock`] is a skew.

use chrono::{DateTime, Utc};

/// A monotonic instant (virtual in simulation). Outside `cfg(madsim)`, tokio's `Instant`.
#[cfg(not(madsim))]
pub use tokio::time::Instant;

/// A monotonic instant of one frame (a node's clock, or the reference clock).
#[cfg(madsim)]
pub use crate::sim_clock::Instant;

/// A node's view of time.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Clock {
    skew_ms: i64,
    /// Reads the reference frame instead of the current node's (simulation only; in
    /// production every frame is the host's).
    reference: bool,
}

impl Clock {
    /// The clock of the node running the caller, with no extra wall-clock skew.
    pub fn system() -> Clock {
        Clock { skew_ms: 0, reference: false }
    }

    /// The clock of the node running the caller, with its wall clock `skew_ms` ahead
    /// (negative: behind) on top of whatever the node's own wall clock says.
    pub fn with_skew_ms(skew_ms: i64) -> Clock {
        Clock { skew_ms, reference: false }
    }

    /// The reference clock: the simulation's global time, untouched by any node's rate or
    /// wall steps. For state that lives outside every node (the simulated lockdb and paydb
    /// take their `now()` from it, as a real database takes its own). In production the
    /// same as [`Clock::system`].
    pub fn reference() -> Clock {
        Clock { skew_ms: 0, reference: true }
    }

    pub fn skew_ms(&self) -> i64 {
        self.skew_ms
    }

    /// Whether this is the [`Clock::reference`] clock.
    pub fn is_reference(&self) -> bool {
        self.reference
    }

    /// Monotonic now (virtual in simulation, in this clock's frame). Unaffected by skew.
    pub fn now(&self) -> Instant {
        #[cfg(madsim)]
        if self.reference {
            return crate::sim_clock::reference_now();
        }
        Instant::now()
    }

    /// Wall-clock now, including the node's wall steps (simulation) and this clock's skew,
    /// truncated to milliseconds (the precision every stored and wire timestamp has).
    pub fn wall(&self) -> DateTime<Utc> {
        let unix_ms = wall_unix_ms(self.reference).saturating_add(self.skew_ms);
        DateTime::<Utc>::from_timestamp_millis(unix_ms).unwrap_or(DateTime::<Utc>::UNIX_EPOCH)
    }
}

#[cfg(not(madsim))]
fn wall_unix_ms(_reference: bool) -> i64 {
    // The one real wall-clock read in the code base.
    let since = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    i64::try_from(since.as_millis()).unwrap_or(i64::MAX)
}

#[cfg(madsim)]
fn wall_unix_ms(reference: bool) -> i64 {
    let global = crate::sim_clock::reference_wall_unix_ms();
    if reference {
        global
    } else {
        global.saturating_add(crate::sim_clock::current_wall_offset_ms())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn skew_moves_the_wall_clock_only() {
        let plain = Clock::system();
        let ahead = Clock::with_skew_ms(60_000);
        let gap = ahead.wall() - plain.wall();
        assert!(gap.num_milliseconds() >= 59_000, "{gap}");
        let a = plain.now();
        let b = ahead.now();
        assert!(b.duration_since(a).as_secs() < 5);
    }

    #[tokio::test]
    async fn the_reference_clock_reads_the_same_time_as_an_undrifted_node() {
        let node = Clock::system().wall();
        let reference = Clock::reference().wall();
        assert!((reference - node).num_milliseconds().abs() < 5_000);
        assert!(Clock::reference().is_reference() && !Clock::system().is_reference());
    }
}
