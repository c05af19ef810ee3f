//! Invariant checkers over the rail's call log and paydb's rail tables. Each returns one
//! line per violation, naming the invariant first.

use std::collections::BTreeMap;

use dlock_contract::rail::{RailCall, SubmissionOutcome};
use dlock_rail_proxy::store::SubmissionRow;

fn calls_per_ref(calls: &[RailCall]) -> BTreeMap<&str, usize> {
    let mut m = BTreeMap::new();
    for c in calls {
        *m.entry(c.client_ref.as_str()).or_insert(0) += 1;
    }
    m
}

/// A payout whose every attempt was refused (fenced or duplicate) never reaches the rail,
/// and no payout reaches the rail more often than it was forwarded.
pub fn fenced_never_forwarded(calls: &[RailCall], rows: &[SubmissionRow]) -> Vec<String> {
    let per_ref = calls_per_ref(calls);
    let mut forwarded: BTreeMap<String, usize> = BTreeMap::new();
    for r in rows {
        let was_forwarded = matches!(
            r.outcome,
            None | Some(SubmissionOutcome::Acked | SubmissionOutcome::Rejected | SubmissionOutcome::Timeout)
        );
        let n = forwarded.entry(r.payout_id.to_string()).or_insert(0);
        if was_forwarded {
            *n += 1;
        }
    }
    per_ref
        .iter()
        .filter_map(|(client_ref, n)| {
            let allowed = forwarded.get(*client_ref).copied().unwrap_or(0);
            (*n > allowed).then(|| {
                format!(
                    "fenced_never_forwarded: payout {client_ref} reached the rail {n} times but was admitted {allowed}"
                )
            })
        })
        .collect()
}

/// No payout is presented to the rail twice.
pub fn at_most_one_forward_per_payout(calls: &[RailCall]) -> Vec<String> {
    calls_per_ref(calls)
        .into_iter()
        .filter(|(_, n)| *n > 1)
        .map(|(r, n)| format!("at_most_one_forward_per_payout: payout {r} reached the rail {n} times"))
        .collect()
}

/// The account's mark equals the highest token that passed step 1.
pub fn mark_equals_highest_admitted(account: &str, mark: Option<i64>, rows: &[SubmissionRow]) -> Vec<String> {
    let highest = rows
        .iter()
        .filter(|r| r.account_id == account && r.outcome != Some(SubmissionOutcome::Fenced))
        .map(|r| r.presented_token)
        .max();
    if mark == highest {
        vec![]
    } else {
        vec![format!("mark_equals_highest_admitted: account {account} mark {mark:?}, highest admitted {highest:?}")]
    }
}
