//! The fence checks over *traced* fenced writes: the `fenced_write` and `intent_outcome`
//! events that real processes write to their trace files (`dlock_rt::events`), merged on the
//! host's monotonic clock (the real run, docs/real-runs.md). In the simulation the
//! [`super::Checker`] sees each fenced write inside its transaction, in commit order; a real
//! run sees only what each process wrote after it committed, so these checks judge what an
//! event proves alone, and order two events only when their stamps lie further apart than a
//! slack no emission delay reaches:
//! - [`ids::FENCED_OUT_HAS_NEWER_HOLDER`]: a write refused `FENCED_OUT` names the stored
//!   token it did not exceed; a stored token below the presented one is a refusal with no
//!   newer holder. Exact, one event.
//! - [`ids::FENCE_ACCEPTS_RISING_TOKENS`]: per account and fence (claim, post, the rail's
//!   mark), a write accepted with a token that does not exceed one the same fence accepted
//!   more than the slack earlier. A batch passes its fence once for all its payouts and
//!   writes their events at once, so within the slack an equal token is that pass; an
//!   idempotent replay writes no acceptance (`replay`, `no_decision`).
//! - [`ids::AMBIGUOUS_NEVER_RESUBMITTED`]: a payout whose attempt ended ambiguous
//!   (`intent_outcome` `Timeout`) submitted again: any admission of it after the ambiguous
//!   attempt's own, with a token at least that attempt's, whatever the proxy answered (an
//!   executor defect even when the proxy refused it, as in the simulation). A lower token
//!   is a stale writer the fences stop. A newer holder whose claim was accepted before the
//!   ambiguous attempt was admitted (within the slack) is excused, as the simulation
//!   excuses it (docs/testing/bugs.md, B15). No slack is needed after the admission: once
//!   the payout is SUBMITTED, no correct holder can claim it, so no correct admission of
//!   it at that token or above can follow.
//!
//! And one check of a single event, [`contradiction_failures`]:
//! - [`ids::NO_CONTRADICTION`]: a service met a state its rules say cannot be, such as a
//!   store guard refusing what the rule decided (`contradiction`, answered `500 INTERNAL`;
//!   an unknown outcome is `INTERNAL` too, and no contradiction). The simulation does not
//!   judge it: its store faults inject corrupt content on purpose.
//!
//! A process stopped (SIGSTOP) between a commit and its event writes that event late by
//! the whole stop: the order checks excuse an event of a process that was stopped between
//! the two events they compare ([`Stopped`]).
//!
//! Invariants: every failure is one of the four ids above; with `slack_ms` larger than any
//! gap between a commit and its event in a process that runs, no correct history fails (the
//! unit tests hold each check to a hand-made violation and to its excused twin).

use std::collections::BTreeMap;

use super::ids;
use crate::outcome::Failure;

/// One `fenced_write` event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TracedWrite {
    /// The host-monotonic stamp of the event (ms).
    pub at_ms: u64,
    /// The process that wrote it.
    pub node: String,
    /// `claim`, `post` or `admit`.
    pub op: String,
    pub payout: String,
    pub account: String,
    pub owner: String,
    pub presented: i64,
    /// The stored token: the one a refusal did not exceed; the presented one for an acceptance.
    pub stored: Option<i64>,
    /// `accepted`, `fenced_out` or `no_decision`.
    pub answer: String,
    /// The proxy's admission tag (`admitted`, `duplicate`, `fenced`, `not_claimable`).
    pub admission: Option<String>,
}

/// One `intent_outcome` event whose payout is known.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TracedOutcome {
    pub at_ms: u64,
    pub payout: String,
    pub presented: i64,
    /// `SubmissionOutcome`'s debug name (`Accepted`, `Declined`, `Timeout`, ...).
    pub outcome: String,
}

/// One `contradiction` event: a state a service's rules say cannot be, answered `500 INTERNAL`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TracedContradiction {
    pub at_ms: u64,
    /// The process that answered it.
    pub node: String,
    pub method: String,
    pub path: String,
    /// Its internal cause, as the event carries it (cut to a bound).
    pub cause: String,
}

/// [`ids::NO_CONTRADICTION`], once per contradiction met (module doc).
pub fn contradiction_failures(errors: &[TracedContradiction]) -> Vec<Failure> {
    errors
        .iter()
        .map(|e| {
            Failure::correctness(
                ids::NO_CONTRADICTION,
                format!(
                    "{} met a contradiction, answered 500 INTERNAL to {} {} at {} ms: {}",
                    e.node, e.method, e.path, e.at_ms, e.cause
                ),
            )
        })
        .collect()
}

/// A span of host-monotonic time during which a process was stopped (SIGSTOP to SIGCONT):
/// what it had committed before may have been written to its trace only after.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stopped {
    pub node: String,
    pub from_ms: u64,
    pub to_ms: u64,
}

/// Whether `node` was stopped at some instant of `[from_ms, to_ms]`.
fn stopped_within(stopped: &[Stopped], node: &str, from_ms: u64, to_ms: u64) -> bool {
    stopped.iter().any(|s| s.node == node && s.from_ms <= to_ms && from_ms <= s.to_ms)
}

/// One acceptance at a fence: (at, token, owner, payout).
type Accepted<'a> = (u64, i64, &'a str, &'a str);

/// The failures of a traced history (module doc); `writes` and `outcomes` in any order.
pub fn traced_failures(
    writes: &[TracedWrite],
    outcomes: &[TracedOutcome],
    stopped: &[Stopped],
    slack_ms: u64,
) -> Vec<Failure> {
    let mut found = Vec::new();
    let mut writes: Vec<&TracedWrite> = writes.iter().collect();
    writes.sort_by_key(|w| w.at_ms);
    for w in &writes {
        if w.answer == "fenced_out" && w.stored.is_some_and(|s| s < w.presented) {
            found.push(Failure::correctness(
                ids::FENCED_OUT_HAS_NEWER_HOLDER,
                format!(
                    "account {}: token {} by {} refused FENCED_OUT at its {} (payout {}), the fence at {} below it: no newer holder",
                    w.account,
                    w.presented,
                    w.owner,
                    w.op,
                    w.payout,
                    w.stored.unwrap_or_default()
                ),
            ));
        }
    }
    // Per (account, fence): every acceptance so far.
    let mut accepted: BTreeMap<(&str, &str), Vec<Accepted<'_>>> = BTreeMap::new();
    for w in &writes {
        if w.answer != "accepted" {
            continue;
        }
        let seen = accepted.entry((w.account.as_str(), w.op.as_str())).or_default();
        // Before it by more than the slack, a token it does not exceed (one pass of a batch
        // writes its events at once; a later pass, or the same write again, needs a new token).
        let before = seen
            .iter()
            .filter(|(at, _, _, _)| at + slack_ms < w.at_ms)
            .filter(|(_, t, _, _)| w.presented <= *t)
            .filter(|(at, _, _, _)| !stopped_within(stopped, &w.node, at.saturating_sub(slack_ms), w.at_ms))
            .max_by_key(|(_, t, _, _)| *t);
        if let Some((at, token, owner, _)) = before {
            found.push(Failure::correctness(
                ids::FENCE_ACCEPTS_RISING_TOKENS,
                format!(
                    "account {} accepted token {} by {} at its {} (payout {}) {} ms after token {} by {}",
                    w.account,
                    w.presented,
                    w.owner,
                    w.op,
                    w.payout,
                    w.at_ms - at,
                    token,
                    owner
                ),
            ));
        }
        seen.push((w.at_ms, w.presented, w.owner.as_str(), w.payout.as_str()));
    }
    for o in outcomes.iter().filter(|o| o.outcome == "Timeout") {
        let admits = || writes.iter().filter(|w| w.op == "admit" && w.payout == o.payout);
        // The ambiguous attempt's own admission; every other admission of the payout after
        // it, at its token or above, is a submission again (module doc).
        let own = admits().find(|w| w.presented == o.presented && w.admission.as_deref() == Some("admitted"));
        let from = own.map_or(o.at_ms, |w| w.at_ms);
        for w in admits() {
            if own.is_some_and(|a| std::ptr::eq(*a, *w)) || w.at_ms < from || w.presented < o.presented {
                continue;
            }
            let raced = w.presented > o.presented
                && writes.iter().any(|c| {
                    c.op == "claim"
                        && c.payout == o.payout
                        && c.answer == "accepted"
                        && c.presented == w.presented
                        && (c.at_ms <= from + slack_ms || stopped_within(stopped, &c.node, from, c.at_ms))
                });
            if !raced {
                found.push(Failure::correctness(
                    ids::AMBIGUOUS_NEVER_RESUBMITTED,
                    format!(
                        "payout {} was submitted again {} ms after its attempt under token {} (ambiguous: the rail timed out): token {} by {} ({})",
                        o.payout,
                        w.at_ms - from,
                        o.presented,
                        w.presented,
                        w.owner,
                        w.admission.as_deref().unwrap_or("?")
                    ),
                ));
            }
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    fn w(at_ms: u64, op: &str, payout: &str, presented: i64, answer: &str, stored: i64) -> TracedWrite {
        TracedWrite {
            at_ms,
            node: if op == "admit" { "rail-proxy-1" } else { "payment-resource" }.into(),
            op: op.into(),
            payout: payout.into(),
            account: "acct-1".into(),
            owner: format!("exec/{presented}"),
            presented,
            stored: Some(stored),
            answer: answer.into(),
            admission: (op == "admit").then(|| if answer == "accepted" { "admitted" } else { "fenced" }.to_owned()),
        }
    }

    fn ids_of(f: &[Failure]) -> Vec<&str> {
        f.iter().map(|f| f.invariant).collect()
    }

    #[test]
    fn every_contradiction_met_is_a_failure_naming_its_process_and_cause() {
        assert!(contradiction_failures(&[]).is_empty());
        let e = TracedContradiction {
            at_ms: 42,
            node: "lock-server-1".into(),
            method: "POST".into(),
            path: "/v1/locks/k/rotate".into(),
            cause: "unexpected store content: etcd: rotate granted without a live session and grant".into(),
        };
        let found = contradiction_failures(&[e.clone(), e]);
        assert_eq!(ids_of(&found), [ids::NO_CONTRADICTION, ids::NO_CONTRADICTION]);
        assert!(
            found[0]
                .detail
                .contains("lock-server-1 met a contradiction, answered 500 INTERNAL to POST /v1/locks/k/rotate"),
            "{}",
            found[0].detail
        );
        assert!(found[0].detail.contains("rotate granted without a live session"), "{}", found[0].detail);
    }

    #[test]
    fn a_refusal_below_the_presented_token_has_no_newer_holder() {
        let ok = [w(10, "claim", "p1", 5, "fenced_out", 7), w(11, "claim", "p2", 5, "fenced_out", 5)];
        assert!(traced_failures(&ok, &[], &[], 100).is_empty());
        let bad = [w(10, "claim", "p1", 6, "fenced_out", 5)];
        assert_eq!(ids_of(&traced_failures(&bad, &[], &[], 100)), [ids::FENCED_OUT_HAS_NEWER_HOLDER]);
    }

    #[test]
    fn a_lower_token_accepted_past_the_slack_is_found_and_within_it_is_not_judged() {
        let racing = [w(1_000, "claim", "p1", 7, "accepted", 7), w(1_050, "claim", "p2", 5, "accepted", 5)];
        assert!(traced_failures(&racing, &[], &[], 100).is_empty());
        let one_pass = [w(1_000, "claim", "p1", 7, "accepted", 7), w(1_001, "claim", "p2", 7, "accepted", 7)];
        let other_account = [
            w(1_000, "claim", "p1", 7, "accepted", 7),
            TracedWrite { account: "acct-2".into(), ..w(5_000, "claim", "p2", 5, "accepted", 5) },
        ];
        assert!(traced_failures(&other_account, &[], &[], 100).is_empty());
        assert!(traced_failures(&one_pass, &[], &[], 100).is_empty());
        let again = [w(1_000, "admit", "p1", 7, "accepted", 7), w(5_000, "admit", "p1", 7, "accepted", 7)];
        assert_eq!(ids_of(&traced_failures(&again, &[], &[], 100)), [ids::FENCE_ACCEPTS_RISING_TOKENS]);
        let equal_later = [w(1_000, "admit", "p1", 7, "accepted", 7), w(5_000, "admit", "p2", 7, "accepted", 7)];
        assert_eq!(ids_of(&traced_failures(&equal_later, &[], &[], 100)), [ids::FENCE_ACCEPTS_RISING_TOKENS]);
        let other_fence = [w(1_000, "claim", "p1", 7, "accepted", 7), w(5_000, "post", "p2", 5, "accepted", 5)];
        assert!(traced_failures(&other_fence, &[], &[], 100).is_empty());
        let stale = [w(1_000, "claim", "p1", 7, "accepted", 7), w(1_500, "claim", "p2", 5, "accepted", 5)];
        assert_eq!(ids_of(&traced_failures(&stale, &[], &[], 100)), [ids::FENCE_ACCEPTS_RISING_TOKENS]);
        // Its process was stopped in between: its event may be a commit from before.
        let stop = Stopped { node: "payment-resource".into(), from_ms: 1_200, to_ms: 1_450 };
        assert!(traced_failures(&stale, &[], std::slice::from_ref(&stop), 100).is_empty());
        let elsewhere = Stopped { node: "rail-proxy-1".into(), ..stop };
        assert_eq!(ids_of(&traced_failures(&stale, &[], &[elsewhere], 100)), [ids::FENCE_ACCEPTS_RISING_TOKENS]);
    }

    fn timeout(at_ms: u64, payout: &str, presented: i64) -> TracedOutcome {
        TracedOutcome { at_ms, payout: payout.into(), presented, outcome: "Timeout".into() }
    }

    #[test]
    fn an_ambiguous_payout_admitted_again_is_found_unless_a_newer_holder_raced_it() {
        let first = w(1_000, "admit", "p1", 5, "accepted", 5);
        // Submitted again: the proxy found the payout not claimable.
        let again = w(9_000, "admit", "p1", 5, "no_decision", 5);
        let found = traced_failures(&[first.clone(), again], &[timeout(3_000, "p1", 5)], &[], 100);
        assert_eq!(ids_of(&found), [ids::AMBIGUOUS_NEVER_RESUBMITTED]);
        // A newer holder that claimed before the ambiguous attempt was admitted: excused.
        let claim = w(900, "claim", "p1", 8, "accepted", 8);
        let newer = w(9_000, "admit", "p1", 8, "accepted", 8);
        assert!(
            traced_failures(&[first.clone(), claim, newer.clone()], &[timeout(3_000, "p1", 5)], &[], 100).is_empty()
        );
        // The same newer holder, claiming only after the outcome: found.
        let late_claim = w(6_000, "claim", "p1", 8, "accepted", 8);
        let found = traced_failures(&[first.clone(), late_claim, newer], &[timeout(3_000, "p1", 5)], &[], 100);
        assert_eq!(ids_of(&found), [ids::AMBIGUOUS_NEVER_RESUBMITTED]);
        // Submitted again and refused (the proxy held): still a resubmission.
        let refused = w(9_000, "admit", "p1", 5, "fenced_out", 5);
        let found = traced_failures(&[first.clone(), refused], &[timeout(3_000, "p1", 5)], &[], 100);
        assert_eq!(ids_of(&found), [ids::AMBIGUOUS_NEVER_RESUBMITTED]);
        // Right after the outcome (the executor's immediate retry): found.
        let retry = w(3_001, "admit", "p1", 5, "fenced_out", 5);
        let found = traced_failures(&[first.clone(), retry], &[timeout(3_000, "p1", 5)], &[], 100);
        assert_eq!(ids_of(&found), [ids::AMBIGUOUS_NEVER_RESUBMITTED]);
        // A stale writer's lower token, or an admission before the ambiguous one: not judged.
        let stale = w(9_000, "admit", "p1", 4, "fenced_out", 5);
        let before = w(500, "admit", "p1", 5, "fenced_out", 5);
        assert!(traced_failures(&[first, stale, before], &[timeout(3_000, "p1", 5)], &[], 100).is_empty());
    }
}
