//! The reconciler's read budgets (C3 §3.8: reconciler → both databases, `1 s / 30 s`, 3
//! tries) and the one loop that spends them.
//!
//! Every read is a plain read: asking again has no side effect, so a transient failure (the
//! database unreachable or busy, a connection refused or broken, a timeout) is tried again,
//! at most [`READ_TRIES_MAX`] times in all. An answer the reconciler cannot interpret is not
//! transient and ends the read at once. A source that cannot be read within its budget
//! makes the run incomplete (exit code 3), never silently clean.

use std::future::Future;
use std::time::Duration;

/// Connect budget of one read: a paydb pool's first connection, or the rail's socket.
pub const READ_CONNECT_TIMEOUT_MS: u64 = 1_000;
/// Read budget of one try: from the request to the last byte (or row) of the answer.
pub const READ_TIMEOUT_MS: u64 = 30_000;
/// Tries per read, the first included.
pub const READ_TRIES_MAX: u32 = 3;
/// Pause between two tries of one read.
pub const READ_RETRY_PAUSE_MS: u64 = 200;

/// The budgets of every read in one run. [`ReadBudget::default`] is C3 §3.8's; tests shrink
/// it to keep an unreachable source quick.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReadBudget {
    pub connect_timeout_ms: u64,
    pub read_timeout_ms: u64,
    pub tries_max: u32,
    pub retry_pause_ms: u64,
}

impl Default for ReadBudget {
    fn default() -> Self {
        ReadBudget {
            connect_timeout_ms: READ_CONNECT_TIMEOUT_MS,
            read_timeout_ms: READ_TIMEOUT_MS,
            tries_max: READ_TRIES_MAX,
            retry_pause_ms: READ_RETRY_PAUSE_MS,
        }
    }
}

/// Why one try of a read failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadError {
    /// Whether asking again may succeed.
    pub transient: bool,
    pub message: String,
}

impl ReadError {
    pub fn transient(message: impl Into<String>) -> ReadError {
        ReadError { transient: true, message: message.into() }
    }

    pub fn permanent(message: impl Into<String>) -> ReadError {
        ReadError { transient: false, message: message.into() }
    }
}

impl From<dlock_paydb::StoreError> for ReadError {
    fn from(e: dlock_paydb::StoreError) -> ReadError {
        use dlock_paydb::StoreError;
        let transient = matches!(e, StoreError::Unavailable(_) | StoreError::CommitUnknown(_));
        ReadError { transient, message: e.to_string() }
    }
}

/// A read that failed within its budget: what was read, how often, and the last error.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{what}: {message} (after {tries} of at most {tries_max} tries)")]
pub struct BudgetExhausted {
    pub what: String,
    pub tries: u32,
    pub tries_max: u32,
    pub message: String,
}

/// Runs `read` until it answers, fails permanently, or has been tried `budget.tries_max`
/// times. Each try is bounded by `timeout_ms` on the runtime's timer; a try that runs out
/// is transient.
pub async fn with_budget<T, F, Fut>(
    budget: &ReadBudget,
    timeout_ms: u64,
    what: &str,
    mut read: F,
) -> Result<T, BudgetExhausted>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, ReadError>>,
{
    let tries_max = budget.tries_max.max(1);
    let mut tries = 0;
    loop {
        tries += 1;
        let error = match dlock_rt::timeout(Duration::from_millis(timeout_ms), read()).await {
            Some(Ok(v)) => return Ok(v),
            Some(Err(e)) => e,
            None => ReadError::transient(format!("no answer within {timeout_ms} ms")),
        };
        if !error.transient || tries >= tries_max {
            return Err(BudgetExhausted { what: what.to_owned(), tries, tries_max, message: error.message });
        }
        tracing::debug!(read = what, tries, error = %error.message, "reconcile_read_retried");
        dlock_rt::sleep(Duration::from_millis(budget.retry_pause_ms)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};

    fn quick() -> ReadBudget {
        ReadBudget { retry_pause_ms: 1, ..ReadBudget::default() }
    }

    #[tokio::test]
    async fn reads_follow_the_c3_budget_of_three_tries() {
        assert_eq!(
            ReadBudget::default(),
            ReadBudget { connect_timeout_ms: 1_000, read_timeout_ms: 30_000, tries_max: 3, retry_pause_ms: 200 }
        );
        let calls = AtomicU32::new(0);
        let r: Result<(), _> = with_budget(&quick(), 1_000, "x", || async {
            calls.fetch_add(1, Ordering::SeqCst);
            Err(ReadError::transient("down"))
        })
        .await;
        let e = r.expect_err("exhausted");
        assert_eq!((e.tries, e.tries_max, calls.load(Ordering::SeqCst)), (3, 3, 3));
        assert!(e.to_string().contains("down"), "{e}");
    }

    #[tokio::test]
    async fn a_transient_failure_is_tried_again_and_a_permanent_one_is_not() {
        let calls = AtomicU32::new(0);
        let r = with_budget(&quick(), 1_000, "x", || async {
            match calls.fetch_add(1, Ordering::SeqCst) {
                0 => Err(ReadError::transient("busy")),
                _ => Ok(7),
            }
        })
        .await;
        assert_eq!(r, Ok(7));
        assert_eq!(calls.load(Ordering::SeqCst), 2);
        let calls = AtomicU32::new(0);
        let r: Result<(), _> = with_budget(&quick(), 1_000, "x", || async {
            calls.fetch_add(1, Ordering::SeqCst);
            Err(ReadError::permanent("garbage"))
        })
        .await;
        assert_eq!(r.expect_err("permanent").tries, 1);
        assert_eq!(calls.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn a_try_that_outlives_its_read_timeout_is_transient() {
        let calls = AtomicU32::new(0);
        let r = with_budget(&quick(), 20, "x", || async {
            if calls.fetch_add(1, Ordering::SeqCst) == 0 {
                std::future::pending::<()>().await;
            }
            Ok(1)
        })
        .await;
        assert_eq!(r, Ok(1));
        assert_eq!(calls.load(Ordering::SeqCst), 2);
    }
}
