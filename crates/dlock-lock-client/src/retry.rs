//! Retry decisions, structured so that a non-retry-safe failure cannot reach the loop.
//!
//! An attempt ends in one of three ways: success, [`Failure::Final`] (returned to the caller
//! as is), or [`Failure::Retry`] carrying a [`RetrySafe`]. A `RetrySafe` can be built in
//! exactly three places, all in this module:
//!
//! - [`RetrySafe::from_envelope`], which refuses unless the code's catalogue verdict
//!   ([`ErrorCode::retry_safe`]) *and* the envelope's own `retrySafe` say yes *and* the
//!   operation lists the code as one it retries. `FENCED_OUT`, `LOCK_LOST`, the session
//!   codes, `INVALID_TOKEN` … can therefore never become one;
//! - [`RetrySafe::nothing_sent`], for a connection that never opened;
//! - [`RetrySafe::read_only`], for an advisory read (a `GET`), which has no side effect.
//!
//! [`run`] only ever sees `RetrySafe` values, is bounded by `attempts_max`, and pauses with
//! jittered exponential backoff between attempts. A sent-but-unanswered write (timeout,
//! broken connection, `INTERNAL`, a non-C3 answer) is [`LockClientError::Ambiguous`] and
//! final: re-sending it as if nothing happened is the bug this project exists to prevent.

use std::future::Future;

use bytes::Bytes;
use dlock_contract::{ErrorCode, ErrorEnvelope};
use dlock_rt::http::ClientError;
use dlock_rt::Duration;

use crate::error::{LockClientError, Operation};
use crate::lease::backoff_ms;
use crate::wire::Answer;

/// Codes an acquire retries (C3 §3.8, FR-28). `CONTENTION_EXCEEDED` is retry-safe only after
/// its `retryAfterMillis`, so it ends the call instead.
pub(crate) const ACQUIRE_RETRY_CODES: &[ErrorCode] =
    &[ErrorCode::LockContended, ErrorCode::NotLeader, ErrorCode::NotReady];
/// Codes a renew or a session open retries: only "nothing was touched" answers.
pub(crate) const UNAVAILABLE_RETRY_CODES: &[ErrorCode] = &[ErrorCode::NotLeader, ErrorCode::NotReady];
/// Codes nothing retries (release, session close: expiry is the fallback).
pub(crate) const NO_RETRY_CODES: &[ErrorCode] = &[];

/// How one attempt failed.
#[derive(Debug)]
pub(crate) enum Failure {
    /// Return this to the caller; do not send again.
    Final(LockClientError),
    /// The identical request may be sent again. (Boxed: a failure is the rare path.)
    Retry(Box<RetrySafe>),
}

impl From<LockClientError> for Failure {
    fn from(e: LockClientError) -> Failure {
        Failure::Final(e)
    }
}

/// A failure after which the identical request may be re-sent. Only this module builds one.
#[derive(Debug)]
pub(crate) struct RetrySafe {
    /// What the caller gets if the budget runs out.
    error: LockClientError,
    /// The server's `retryAfterMillis`, honoured on anything but contention.
    retry_after_ms: Option<u64>,
    /// `LOCK_CONTENDED`: paced by backoff alone, and ends in `CONTENTION_EXCEEDED`.
    contended: bool,
}

impl RetrySafe {
    /// The envelope as a retry-safe failure, or as the final error it is.
    fn from_envelope(
        operation: Operation,
        envelope: ErrorEnvelope,
        allowed: &[ErrorCode],
    ) -> Result<RetrySafe, LockClientError> {
        let code = envelope.code;
        let safe = code.retry_safe() && envelope.retry_safe && allowed.contains(&code);
        let retry_after_ms = envelope.retry_after_millis;
        let error = LockClientError::from_envelope(operation, envelope);
        if !safe {
            return Err(error);
        }
        assert!(error.retry_safe(), "only catalogue-retry-safe codes are retried");
        Ok(RetrySafe { error, retry_after_ms, contended: code == ErrorCode::LockContended })
    }

    /// No connection opened: not a byte was sent, so nothing can have happened.
    fn nothing_sent(operation: Operation, cause: String) -> RetrySafe {
        RetrySafe { error: LockClientError::Unreachable { operation, cause }, retry_after_ms: None, contended: false }
    }

    /// An advisory read lost its answer. A `GET` has no side effect to duplicate.
    fn read_only(operation: Operation, cause: String) -> RetrySafe {
        assert!(operation == Operation::Inspect, "only advisory reads retry a lost answer");
        RetrySafe { error: LockClientError::Ambiguous { operation, cause }, retry_after_ms: None, contended: false }
    }

    /// The error itself, for a call that never repeats (release, session close).
    pub(crate) fn into_error(self) -> LockClientError {
        self.error
    }

    /// The error the caller gets when no attempt is left.
    fn exhausted(self, attempts: u32) -> LockClientError {
        if self.contended {
            LockClientError::ContentionExceeded { attempts, retry_after_ms: self.retry_after_ms }
        } else {
            self.error
        }
    }
}

/// A 2xx answer's body.
#[derive(Debug)]
pub(crate) struct Success {
    pub body: Bytes,
    /// The HTTP status of a refusal the caller asked to see as success (advisory 404).
    pub not_found: bool,
}

/// Reads one write's fate. `attempt` is 1-based (for `CONTENTION_EXCEEDED`'s count).
pub(crate) fn classify(
    operation: Operation,
    attempt: u32,
    sent: Result<Answer, ClientError>,
    allowed: &[ErrorCode],
) -> Result<Success, Failure> {
    match sent {
        Ok(Answer::Success { body }) => Ok(Success { body, not_found: false }),
        Ok(Answer::Refused { status, envelope }) => Err(refused(operation, attempt, status, envelope, allowed)),
        Ok(Answer::Garbled { status, cause }) => Err(Failure::Final(LockClientError::Ambiguous {
            operation,
            cause: format!("HTTP {status} without a C3 envelope: {cause}"),
        })),
        Err(ClientError::Connect(cause)) => Err(Failure::Retry(Box::new(RetrySafe::nothing_sent(operation, cause)))),
        Err(ClientError::BadUrl(cause)) => Err(Failure::Final(LockClientError::Invalid(cause))),
        Err(e @ (ClientError::Timeout(_) | ClientError::Broken(_))) => {
            Err(Failure::Final(LockClientError::Ambiguous { operation, cause: e.to_string() }))
        }
    }
}

/// Reads an advisory read's fate: like [`classify`], but a lost answer may be asked again,
/// and a 404 is an answer ("never seen"), not an error.
pub(crate) fn classify_read(
    operation: Operation,
    attempt: u32,
    sent: Result<Answer, ClientError>,
) -> Result<Success, Failure> {
    match sent {
        Ok(Answer::Refused { status: 404, .. }) => Ok(Success { body: Bytes::new(), not_found: true }),
        Err(e @ (ClientError::Timeout(_) | ClientError::Broken(_))) => {
            Err(Failure::Retry(Box::new(RetrySafe::read_only(operation, e.to_string()))))
        }
        other => classify(operation, attempt, other, UNAVAILABLE_RETRY_CODES),
    }
}

fn refused(operation: Operation, attempt: u32, status: u16, envelope: ErrorEnvelope, allowed: &[ErrorCode]) -> Failure {
    match envelope.code {
        ErrorCode::ContentionExceeded => Failure::Final(LockClientError::ContentionExceeded {
            attempts: attempt,
            retry_after_ms: envelope.retry_after_millis,
        }),
        // "Whether a side effect happened is unknown" (catalogue): an ambiguity, not a no.
        ErrorCode::Internal => Failure::Final(LockClientError::Ambiguous {
            operation,
            cause: format!("HTTP {status} INTERNAL (trace {})", envelope.trace_id),
        }),
        _ => match RetrySafe::from_envelope(operation, envelope, allowed) {
            Ok(retry) => Failure::Retry(Box::new(retry)),
            Err(error) => Failure::Final(error),
        },
    }
}

/// Attempts and pacing of one call.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RetryPolicy {
    /// Attempts, the first included. At least 1.
    pub attempts_max: u32,
    pub backoff_ms_min: u64,
    pub backoff_ms_max: u64,
    /// Longest server `retryAfterMillis` waited for; a longer one ends the call.
    pub retry_after_ms_max: u64,
}

impl RetryPolicy {
    /// The pause after failed attempt `attempt`, or `None` when the server asks for a wait
    /// longer than this call may take.
    fn pause_ms(&self, attempt: u32, retry: &RetrySafe, random: u64) -> Option<u64> {
        let backoff = backoff_ms(attempt, self.backoff_ms_min, self.backoff_ms_max, random);
        match retry.retry_after_ms {
            Some(after) if !retry.contended => (after <= self.retry_after_ms_max).then_some(backoff.max(after)),
            _ => Some(backoff),
        }
    }
}

/// Runs `attempt(1)`, `attempt(2)`, … until one succeeds or fails finally, at most
/// `policy.attempts_max` times, pausing between attempts.
pub(crate) async fn run<T, F, Fut>(policy: RetryPolicy, mut attempt: F) -> Result<T, LockClientError>
where
    F: FnMut(u32) -> Fut,
    Fut: Future<Output = Result<T, Failure>>,
{
    assert!(policy.attempts_max >= 1, "a call makes at least one attempt");
    let mut number: u32 = 1;
    loop {
        let retry = match attempt(number).await {
            Ok(value) => return Ok(value),
            Err(Failure::Final(error)) => return Err(error),
            Err(Failure::Retry(retry)) => retry,
        };
        if number >= policy.attempts_max {
            return Err((*retry).exhausted(number));
        }
        let Some(pause_ms) = policy.pause_ms(number, &retry, dlock_rt::rand::random_u64()) else {
            return Err((*retry).exhausted(number));
        };
        tracing::debug!(attempt = number, pause_ms, cause = %retry.error, "lock_client_retry");
        dlock_rt::sleep(Duration::from_millis(pause_ms)).await;
        number += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};

    fn refusal(code: ErrorCode, envelope_says_safe: bool) -> Result<Answer, ClientError> {
        let mut envelope = ErrorEnvelope::new(code, "m", "t");
        envelope.retry_safe = envelope_says_safe;
        Ok(Answer::Refused { status: code.http_status(), envelope })
    }

    #[test]
    fn no_non_retry_safe_code_can_become_a_retry() {
        for code in ErrorCode::ALL.into_iter().filter(|c| !c.retry_safe()) {
            for lying_envelope in [false, true] {
                let allowed = ErrorCode::ALL; // even if an operation listed every code
                let r = classify(Operation::Acquire, 1, refusal(code, lying_envelope), &allowed);
                assert!(matches!(r, Err(Failure::Final(_))), "{code} became retryable");
            }
        }
    }

    #[test]
    fn a_retry_safe_code_is_retried_only_when_the_operation_lists_it_and_the_envelope_agrees() {
        let contended = classify(Operation::Acquire, 1, refusal(ErrorCode::LockContended, true), ACQUIRE_RETRY_CODES);
        assert!(matches!(contended, Err(Failure::Retry(_))));
        let on_renew = classify(Operation::Renew, 1, refusal(ErrorCode::LockContended, true), UNAVAILABLE_RETRY_CODES);
        assert!(matches!(on_renew, Err(Failure::Final(_))));
        let disowned = classify(Operation::Acquire, 1, refusal(ErrorCode::NotLeader, false), ACQUIRE_RETRY_CODES);
        assert!(matches!(disowned, Err(Failure::Final(_))));
        let release = classify(Operation::Release, 1, refusal(ErrorCode::NotLeader, true), NO_RETRY_CODES);
        assert!(matches!(release, Err(Failure::Final(_))));
    }

    #[test]
    fn only_a_connection_that_never_opened_is_retried_among_transport_failures() {
        let refused = classify(Operation::Acquire, 1, Err(ClientError::Connect("refused".into())), NO_RETRY_CODES);
        assert!(matches!(refused, Err(Failure::Retry(_))));
        for e in [ClientError::Timeout(2_000), ClientError::Broken("reset".into())] {
            match classify(Operation::Acquire, 1, Err(e), ACQUIRE_RETRY_CODES) {
                Err(Failure::Final(LockClientError::Ambiguous { operation: Operation::Acquire, .. })) => {}
                other => panic!("{other:?}"),
            }
        }
        let internal = classify(Operation::Acquire, 1, refusal(ErrorCode::Internal, true), ACQUIRE_RETRY_CODES);
        assert!(matches!(internal, Err(Failure::Final(LockClientError::Ambiguous { .. }))));
    }

    #[test]
    fn advisory_reads_retry_a_lost_answer_and_read_404_as_never_seen() {
        let lost = classify_read(Operation::Inspect, 1, Err(ClientError::Timeout(1_000)));
        assert!(matches!(lost, Err(Failure::Retry(_))));
        let never_seen = classify_read(Operation::Inspect, 1, refusal(ErrorCode::NotFound, false));
        assert!(matches!(never_seen, Ok(Success { not_found: true, .. })));
    }

    #[test]
    fn server_contention_exceeded_ends_the_call_with_its_retry_after() {
        let mut envelope = ErrorEnvelope::new(ErrorCode::ContentionExceeded, "m", "t");
        envelope.retry_after_millis = Some(700);
        let sent = Ok(Answer::Refused { status: 429, envelope });
        match classify(Operation::Acquire, 3, sent, ACQUIRE_RETRY_CODES) {
            Err(Failure::Final(LockClientError::ContentionExceeded { attempts: 3, retry_after_ms: Some(700) })) => {}
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn retry_after_is_honoured_for_unavailability_and_bounded() {
        let policy =
            RetryPolicy { attempts_max: 5, backoff_ms_min: 50, backoff_ms_max: 1_000, retry_after_ms_max: 2_000 };
        let mut env = ErrorEnvelope::new(ErrorCode::NotLeader, "m", "t");
        env.retry_after_millis = Some(300);
        let not_leader = RetrySafe::from_envelope(Operation::Acquire, env.clone(), ACQUIRE_RETRY_CODES).expect("safe");
        assert_eq!(policy.pause_ms(1, &not_leader, 0), Some(300));
        env.retry_after_millis = Some(5_000);
        let too_long = RetrySafe::from_envelope(Operation::Acquire, env, ACQUIRE_RETRY_CODES).expect("safe");
        assert_eq!(policy.pause_ms(1, &too_long, 0), None);
        let mut contended = ErrorEnvelope::new(ErrorCode::LockContended, "m", "t");
        contended.retry_after_millis = Some(30_000);
        let contended = RetrySafe::from_envelope(Operation::Acquire, contended, ACQUIRE_RETRY_CODES).expect("safe");
        assert_eq!(policy.pause_ms(1, &contended, 0), Some(50), "contention is paced by backoff alone");
    }

    #[tokio::test]
    async fn run_stops_at_attempts_max_and_reports_contention_exceeded() {
        let policy = RetryPolicy { attempts_max: 5, backoff_ms_min: 1, backoff_ms_max: 2, retry_after_ms_max: 10 };
        let calls = AtomicU32::new(0);
        let r: Result<(), _> = run(policy, |n| {
            calls.fetch_add(1, Ordering::SeqCst);
            async move {
                Err(classify(Operation::Acquire, n, refusal(ErrorCode::LockContended, true), ACQUIRE_RETRY_CODES)
                    .expect_err("refused"))
            }
        })
        .await;
        assert_eq!(calls.load(Ordering::SeqCst), 5);
        assert!(matches!(r, Err(LockClientError::ContentionExceeded { attempts: 5, .. })), "{r:?}");
    }

    #[tokio::test]
    async fn run_never_repeats_a_final_failure() {
        let policy = RetryPolicy { attempts_max: 5, backoff_ms_min: 1, backoff_ms_max: 2, retry_after_ms_max: 10 };
        let calls = AtomicU32::new(0);
        let r: Result<(), _> = run(policy, |n| {
            calls.fetch_add(1, Ordering::SeqCst);
            async move {
                Err(classify(Operation::Renew, n, refusal(ErrorCode::FencedOut, true), &ErrorCode::ALL)
                    .expect_err("refused"))
            }
        })
        .await;
        assert_eq!(calls.load(Ordering::SeqCst), 1);
        assert_eq!(r.err().and_then(|e| e.code()), Some(ErrorCode::FencedOut));
    }
}
