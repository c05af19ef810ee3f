//! The hole logic of an event outbox on PostgreSQL (C3-extensions E-20), shared by paydb's
//! and lockdb's readers: pure, over a snapshot's text and the seqs one read returned.
//!
//! An outbox's `seq` is drawn from a sequence when the event row is inserted, inside the
//! transaction of the change. Two unrelated transactions may commit out of seq order, so a
//! reader may see seq `n + 1` while `n` is still in flight: a *hole*. A read must return
//! only *final* seqs (every seq up to its head is returned, purged, or will never exist), so
//! it stops below a hole until every transaction that was in flight when it first saw the
//! hole has ended ([`HoleGate`]): a filler of the hole drew its seq before the visible one
//! above it, so it was one of them.
//!
//! Invariants (asserted):
//! - a read's seqs strictly increase above `after` ([`walk`]);
//! - a hole is passed only once every transaction in flight at the read that first saw it
//!   (with a seq above it visible) has ended.

use std::sync::Mutex;

/// A PostgreSQL snapshot as `pg_current_snapshot()` prints it: `xmin:xmax:xip,…`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Snapshot {
    pub xmin: u64,
    pub xmax: u64,
    pub xip: Vec<u64>,
}

impl Snapshot {
    pub fn parse(s: &str) -> Option<Snapshot> {
        let mut parts = s.split(':');
        let xmin = parts.next()?.parse().ok()?;
        let xmax = parts.next()?.parse().ok()?;
        let xip = match parts.next() {
            Some("") | None => Vec::new(),
            Some(list) => list.split(',').map(|x| x.parse().ok()).collect::<Option<Vec<u64>>>()?,
        };
        Some(Snapshot { xmin, xmax, xip })
    }

    /// Whether transaction `xid` was still in progress when this snapshot was taken.
    pub fn in_progress(&self, xid: u64) -> bool {
        xid >= self.xmax || (xid >= self.xmin && self.xip.contains(&xid))
    }
}

/// Walks the rows of one read from `after`: returns how many of them are final and the
/// head. A hole below a visible row is passed only when `passable` says every transaction
/// that could still fill it has ended.
pub fn walk(after: i64, seqs: &[i64], mut passable: impl FnMut(i64, i64) -> bool) -> (usize, i64) {
    let mut expected = after + 1;
    for (i, &seq) in seqs.iter().enumerate() {
        assert!(seq >= expected, "events: a read returned seq {seq} at or below {}", expected - 1);
        if seq > expected && !passable(expected, seq) {
            return (i, expected - 1);
        }
        expected = seq + 1;
    }
    (seqs.len(), expected - 1)
}

/// A hole a reader saw below a visible seq: the transactions in flight at that read.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Hole {
    /// Holes below this seq (the highest one that read saw) are covered.
    below: i64,
    in_flight: Vec<u64>,
}

/// The hole one reader of an outbox waits on, across its reads.
#[derive(Debug, Default)]
pub struct HoleGate {
    hole: Mutex<Option<Hole>>,
}

impl HoleGate {
    pub fn new() -> HoleGate {
        HoleGate::default()
    }

    /// Of the seqs one read returned after `from` (the cursor, or the purge mark if higher)
    /// under `snap`, how many are final, and the head: [`walk`] with this gate's hole, which
    /// it then remembers (or forgets, once passed).
    pub fn pass(&self, from: i64, seqs: &[i64], snap: &Snapshot) -> (usize, i64) {
        let mut hole = self.hole.lock().unwrap_or_else(|e| e.into_inner());
        let max_seen = seqs.last().copied().unwrap_or(from);
        let (n, head) = walk(from, seqs, |_from, to| {
            hole.as_ref().is_some_and(|h| to <= h.below && h.in_flight.iter().all(|&x| !snap.in_progress(x)))
        });
        if let Some(&next) = seqs.get(n) {
            // Waiting on the hole below `next`: remember who could fill it, unless a
            // remembered read already covers it.
            if hole.as_ref().is_none_or(|h| next > h.below) {
                *hole = Some(Hole { below: max_seen, in_flight: snap.xip.clone() });
            }
        } else {
            *hole = None;
        }
        (n, head)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_snapshot_parses_and_knows_what_was_in_progress() {
        let s = Snapshot::parse("10:20:12,15").expect("parses");
        assert_eq!(s, Snapshot { xmin: 10, xmax: 20, xip: vec![12, 15] });
        assert!(s.in_progress(12) && s.in_progress(20) && !s.in_progress(11) && !s.in_progress(9));
        assert_eq!(Snapshot::parse("7:7:"), Some(Snapshot { xmin: 7, xmax: 7, xip: vec![] }));
        assert_eq!(Snapshot::parse("x"), None);
    }

    #[test]
    fn a_read_stops_below_a_hole_until_it_may_pass_it() {
        assert_eq!(walk(0, &[1, 2, 3], |_, _| false), (3, 3));
        assert_eq!(walk(0, &[1, 3, 4], |_, _| false), (1, 1), "seq 2 may still commit");
        assert_eq!(walk(0, &[1, 3, 4], |_, _| true), (3, 4), "seq 2 will never exist");
        assert_eq!(walk(5, &[], |_, _| false), (0, 5));
        assert_eq!(walk(5, &[7], |_, _| false), (0, 5));
    }

    #[test]
    fn a_gate_passes_a_hole_only_after_every_transaction_in_flight_at_its_first_sight_ended() {
        let gate = HoleGate::new();
        let busy = Snapshot::parse("10:20:12").expect("parses");
        assert_eq!(gate.pass(0, &[1, 3], &busy), (1, 1), "12 may still fill seq 2");
        assert_eq!(gate.pass(1, &[3], &busy), (0, 1), "12 is still in flight");
        let later = Snapshot::parse("13:25:").expect("parses");
        assert_eq!(gate.pass(1, &[3, 4], &later), (2, 4), "12 ended: seq 2 will never exist");
        // A hole above what the first read saw is judged by a later read's in-flight set.
        assert_eq!(gate.pass(4, &[6], &later), (0, 4));
        assert_eq!(gate.pass(4, &[6], &Snapshot::parse("30:30:").expect("parses")), (1, 6));
    }
}
