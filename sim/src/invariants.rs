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

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::{DateTime, Utc};
    use dlock_contract::rail::RailCallOutcome;
    use uuid::Uuid;

    fn at() -> DateTime<Utc> {
        DateTime::<Utc>::from_timestamp_millis(1_795_000_000_000).expect("instant")
    }

    fn call(client_ref: &str) -> RailCall {
        RailCall {
            client_ref: client_ref.into(),
            amount_minor: 1,
            currency: "EUR".into(),
            outcome: RailCallOutcome::Accepted,
            paid: true,
            rail_reference: Some("RR".into()),
            received_at: at(),
        }
    }

    fn row(payout: Uuid, token: i64, outcome: Option<SubmissionOutcome>) -> SubmissionRow {
        SubmissionRow {
            submission_id: Uuid::new_v4(),
            payout_id: payout,
            account_id: "a".into(),
            presented_token: token,
            owner_id: "w".into(),
            idempotency_key: "k".into(),
            amount_minor: 1,
            currency: "EUR".into(),
            outcome,
            outcome_detail: None,
            rail_reference: None,
            submitted_at: at(),
            resolved_at: None,
        }
    }

    #[test]
    fn a_payout_on_the_rail_twice_is_reported() {
        let p = Uuid::new_v4().to_string();
        assert_eq!(at_most_one_forward_per_payout(&[call(&p)]), Vec::<String>::new());
        let broken = at_most_one_forward_per_payout(&[call(&p), call("other"), call(&p)]);
        assert_eq!(broken.len(), 1);
        assert!(broken[0].starts_with("at_most_one_forward_per_payout: "), "{}", broken[0]);
    }

    #[test]
    fn a_fenced_payout_on_the_rail_is_reported() {
        let p = Uuid::new_v4();
        let rows = [row(p, 5, Some(SubmissionOutcome::Fenced))];
        let broken = fenced_never_forwarded(&[call(&p.to_string())], &rows);
        assert_eq!(broken.len(), 1);
        assert!(broken[0].starts_with("fenced_never_forwarded: "));
        let admitted = [row(p, 6, Some(SubmissionOutcome::Acked))];
        assert!(fenced_never_forwarded(&[call(&p.to_string())], &admitted).is_empty());
    }

    #[test]
    fn a_mark_that_disagrees_with_the_admitted_tokens_is_reported() {
        let p = Uuid::new_v4();
        let rows = [row(p, 7, Some(SubmissionOutcome::Acked)), row(p, 9, Some(SubmissionOutcome::Fenced))];
        assert!(mark_equals_highest_admitted("a", Some(7), &rows).is_empty());
        assert_eq!(mark_equals_highest_admitted("a", Some(9), &rows).len(), 1);
        assert_eq!(mark_equals_highest_admitted("a", None, &rows).len(), 1);
    }
}
