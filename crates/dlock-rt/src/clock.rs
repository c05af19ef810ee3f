//! Monotonic and wall clocks, with a per-node wall-clock skew.
//!
//! The monotonic clock decides leases and timeouts. The wall clock only stamps records for
//! humans (C3 §3.1: "wall clocks appear in responses for humans only"), so skewing it must
//! never change a correctness decision: the simulation gives every node its own skew to
//! prove exactly that.

use chrono::{DateTime, Utc};
use tokio::time::Instant;

/// A node's view of time.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Clock {
    skew_ms: i64,
}

impl Clock {
    /// The clock of a node whose wall clock is correct.
    pub fn system() -> Clock {
        Clock { skew_ms: 0 }
    }

    /// The clock of a node whose wall clock runs `skew_ms` ahead (negative: behind).
    pub fn with_skew_ms(skew_ms: i64) -> Clock {
        Clock { skew_ms }
    }

    pub fn skew_ms(&self) -> i64 {
        self.skew_ms
    }

    /// Monotonic now (virtual in simulation). Unaffected by skew.
    pub fn now(&self) -> Instant {
        Instant::now()
    }

    /// Wall-clock now, including this node's skew, truncated to milliseconds (the precision
    /// every stored and wire timestamp has).
    pub fn wall(&self) -> DateTime<Utc> {
        let unix_ms = wall_unix_ms().saturating_add(self.skew_ms);
        DateTime::<Utc>::from_timestamp_millis(unix_ms).unwrap_or(DateTime::<Utc>::UNIX_EPOCH)
    }
}

#[cfg(not(madsim))]
fn wall_unix_ms() -> i64 {
    // The one real wall-clock read in the code base.
    let since = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    i64::try_from(since.as_millis()).unwrap_or(i64::MAX)
}

#[cfg(madsim)]
fn wall_unix_ms() -> i64 {
    let since =
        madsim::time::TimeHandle::current().now_time().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    i64::try_from(since.as_millis()).unwrap_or(i64::MAX)
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
}
