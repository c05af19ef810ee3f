//! Coverage probes: named "this interesting thing happened" counters, in the spirit of
//! FoundationDB's code probes and "sometimes" assertions.
//!
//! Service code calls [`hit`] where an event the simulation must keep exploring happens (a
//! stale writer fenced out at the account, an orphaned intent swept, ...). A simulation
//! campaign sums the counts over its seeds and fails if a probe never fired, so the
//! simulation cannot quietly stop reaching the paths that matter.
//!
//! Invariants:
//! - The set of probes is closed ([`Probe::ALL`]); a campaign checks every one of them.
//! - Outside `cfg(madsim)` [`hit`] compiles to nothing: production pays no cost and keeps
//!   no state.
//! - Under `cfg(madsim)` counts are per thread. A madsim runtime runs one seed on the thread
//!   that calls it, so [`reset`] before a seed and [`snapshot`] after it give that seed's
//!   counts, whatever other seeds run on other threads.

/// Every probe. The name is stable (campaign summaries and `--json` print it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Probe {
    /// A claim was refused `FENCED_OUT` at the account fence.
    FencedOutAccount,
    /// A post was refused `FENCED_OUT` at the ledger.
    FencedOutLedger,
    /// A submission was refused `FENCED_OUT` at the rail's high-water mark.
    FencedOutRail,
    /// A submission was forwarded and its outcome is unknown (`RAIL_AMBIGUOUS`).
    AmbiguousOutcome,
    /// The proxy refused a second forwardable attempt of one payout (`DUPLICATE_SUBMISSION`).
    DuplicateRefused,
    /// A holder evicted by an operator revoke was then fenced out.
    RevokeFencedHolder,
    /// A store committed the intent row and the acknowledgement was lost.
    LostAckIntent,
    /// A store committed a claim and the acknowledgement was lost.
    LostAckClaim,
    /// A store committed a post and the acknowledgement was lost.
    LostAckPost,
    /// An executor re-claimed a payout left CLAIMED by an earlier holder (recovery).
    RecoveryReclaim,
    /// A queued waiter was granted the key after waiting.
    WaiterGrantedAfterWait,
    /// A writer on a node whose clock drifted past the lock client's margin was fenced out.
    DriftCaughtByFence,
    /// The orphan sweep resolved an intent left by a dead forward.
    OrphanIntentSwept,
    /// A partition healed while a lease taken before it was still live.
    PartitionHealedMidLease,
    /// A resource refused a fenced write whose grant signature it could not verify
    /// (`INVALID_TOKEN`: unsigned, forged, for another lock key, from an untrusted key).
    ForgedTokenRefused,
    /// An executor rotated a posted payout's grant into a grant for the next payout of its
    /// account (a chain link, issue 14).
    GrantChained,
    /// Two or more payouts of one account were posted by one batch (C3-extensions E-19):
    /// claimed, submitted and posted together, each fence passed once for all of them.
    BatchPosted,
    /// A lock replica on etcd that had just started found, at its first scan, a grant it had
    /// never watched, and judged it from then: a full TTL more (it extends, never shortens;
    /// C1 §1.5.4).
    JudgeExtendedAfterStart,
    /// A lock replica took the judge's role of lockdb's clock from a judge that fell silent
    /// without handing it back (it died or stalled), after watching the clock stand still
    /// for the whole grace (C1 §1.4.2; the simulation store plays the same judge).
    JudgeTookOverAfterGrace,
    /// A signed write presented again with the very token it passed under (the forger's
    /// equal-token replay) was refused `FENCED_OUT` by the strict `>` (issue 41).
    EqualTokenReplayRefused,
    /// A claim batch that passed one account's fence named another account's payout, and
    /// that payout's item came back `NOT_FOUND` (the forger's cross-account batch, issue 41).
    ForeignPayoutRefusedInBatch,
    /// A renew or rotate of a grant whose session had lapsed was refused (the forger's
    /// lapsed-session calls, issue 41).
    LapsedGrantRefused,
}

impl Probe {
    pub const ALL: [Probe; 22] = [
        Probe::FencedOutAccount,
        Probe::FencedOutLedger,
        Probe::FencedOutRail,
        Probe::AmbiguousOutcome,
        Probe::DuplicateRefused,
        Probe::RevokeFencedHolder,
        Probe::LostAckIntent,
        Probe::LostAckClaim,
        Probe::LostAckPost,
        Probe::RecoveryReclaim,
        Probe::WaiterGrantedAfterWait,
        Probe::DriftCaughtByFence,
        Probe::OrphanIntentSwept,
        Probe::PartitionHealedMidLease,
        Probe::ForgedTokenRefused,
        Probe::GrantChained,
        Probe::BatchPosted,
        Probe::JudgeExtendedAfterStart,
        Probe::JudgeTookOverAfterGrace,
        Probe::EqualTokenReplayRefused,
        Probe::ForeignPayoutRefusedInBatch,
        Probe::LapsedGrantRefused,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Probe::FencedOutAccount => "fenced_out_account",
            Probe::FencedOutLedger => "fenced_out_ledger",
            Probe::FencedOutRail => "fenced_out_rail",
            Probe::AmbiguousOutcome => "ambiguous_outcome",
            Probe::DuplicateRefused => "duplicate_refused",
            Probe::RevokeFencedHolder => "revoke_fenced_holder",
            Probe::LostAckIntent => "lost_ack_intent",
            Probe::LostAckClaim => "lost_ack_claim",
            Probe::LostAckPost => "lost_ack_post",
            Probe::RecoveryReclaim => "recovery_reclaim",
            Probe::WaiterGrantedAfterWait => "waiter_granted_after_wait",
            Probe::DriftCaughtByFence => "drift_caught_by_fence",
            Probe::OrphanIntentSwept => "orphan_intent_swept",
            Probe::PartitionHealedMidLease => "partition_healed_mid_lease",
            Probe::ForgedTokenRefused => "forged_token_refused",
            Probe::GrantChained => "grant_chained",
            Probe::BatchPosted => "batch_posted",
            Probe::JudgeExtendedAfterStart => "judge_extended_after_start",
            Probe::JudgeTookOverAfterGrace => "judge_took_over_after_grace",
            Probe::EqualTokenReplayRefused => "equal_token_replay_refused",
            Probe::ForeignPayoutRefusedInBatch => "foreign_payout_refused_in_batch",
            Probe::LapsedGrantRefused => "lapsed_grant_refused",
        }
    }
}

per_thread_tally!(Probe);

/// Records that `probe` fired (a no-op outside the simulation).
#[inline]
pub fn hit(probe: Probe) {
    add(probe);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probe_names_are_unique_snake_case() {
        let mut names: Vec<&str> = Probe::ALL.iter().map(|p| p.name()).collect();
        assert!(names.iter().all(|n| n.chars().all(|c| c.is_ascii_lowercase() || c == '_')));
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), Probe::ALL.len());
    }

    #[cfg(madsim)]
    #[test]
    fn hits_are_counted_per_thread_until_reset() {
        reset();
        hit(Probe::FencedOutRail);
        hit(Probe::FencedOutRail);
        assert_eq!(snapshot().get(&Probe::FencedOutRail), Some(&2));
        let other = std::thread::spawn(|| snapshot().len()).join().unwrap_or(usize::MAX);
        assert_eq!(other, 0);
        reset();
        assert!(snapshot().is_empty());
    }

    #[cfg(not(madsim))]
    #[test]
    fn outside_the_simulation_a_hit_keeps_nothing() {
        hit(Probe::FencedOutRail);
        assert!(snapshot().is_empty());
    }
}
