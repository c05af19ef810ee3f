//! The one classification of store failures, shared by every store (lockdb and paydb; SQL,
//! etcd and memory), and the one rule that turns a class into a C3 code.
//!
//! A store failure is in exactly one class ([`StoreFault`]):
//! - [`StoreFault::Unavailable`]: provably nothing happened (no connection, a pool or
//!   statement timeout before the commit was sent, a busy answer, a guard that failed, a
//!   rollback). Asking again is safe.
//! - [`StoreFault::CommitUnknown`]: the commit was sent and its answer lost; the write may
//!   have committed.
//! - [`StoreFault::Corrupt`]: the store answered something it cannot interpret, or a guard
//!   refused a write the store issued.
//!
//! Invariant (checked by [`StoreFault::code`] in release builds too, and by the tests
//! below): only `Unavailable` becomes a retry-safe code, the service's own "nothing
//! happened" code (`NOT_LEADER`, `RAIL_UNAVAILABLE`, `NOT_READY`); every other class becomes
//! `INTERNAL`, which is never retry-safe. An unknown outcome is never a retry-safe answer.
//!
//! [`StoreFaults`] is the injection point of the simulation's fault layer: each service's
//! `Faulty*Store` wraps a store (the memory store in the simulation) and asks it, for each
//! operation, whether to fail that call in a given class (C3-extensions C-29).

use std::collections::{BTreeMap, VecDeque};
use std::sync::Mutex;

use crate::ErrorCode;

/// The class of a store failure (module doc).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum StoreFault {
    /// Provably nothing happened.
    Unavailable,
    /// The write may have committed; its answer was lost.
    CommitUnknown,
    /// Unreadable content, or a guard refused a write the store issued.
    Corrupt,
}

impl StoreFault {
    pub const ALL: [StoreFault; 3] = [StoreFault::Unavailable, StoreFault::CommitUnknown, StoreFault::Corrupt];

    /// Whether nothing can have happened, so that the caller may ask again.
    pub fn nothing_happened(self) -> bool {
        self == StoreFault::Unavailable
    }

    /// The C3 code a service answers for this class. `unavailable` is the service's
    /// retry-safe "nothing happened" code (`NOT_LEADER`, `RAIL_UNAVAILABLE`, `NOT_READY`);
    /// it must be retry-safe, and it is answered only for [`StoreFault::Unavailable`].
    pub fn code(self, unavailable: ErrorCode) -> ErrorCode {
        assert!(unavailable.retry_safe(), "{} is not a retry-safe code", unavailable.as_str());
        match self {
            StoreFault::Unavailable => unavailable,
            StoreFault::CommitUnknown | StoreFault::Corrupt => ErrorCode::Internal,
        }
    }
}

/// A store error that knows its class: every store's error type implements it.
pub trait ClassifiedStoreError: Sized {
    /// The class of this failure.
    fn fault(&self) -> StoreFault;
    /// A failure of class `fault` (what an injected fault answers).
    fn of_fault(fault: StoreFault, cause: String) -> Self;
}

/// Faults to inject into a store, per operation (the store trait's method name, e.g.
/// `"admit"`, `"claim"`, `"acquire"`), each consumed by one call, in the order queued.
///
/// [`StoreFaults::run`] honours each class as the real failure behaves: `Unavailable` and
/// `Corrupt` fail the operation before it changes anything; `CommitUnknown` runs the
/// operation (it commits) and then fails it, as a lost commit answer does.
#[derive(Debug, Default)]
pub struct StoreFaults {
    queued: Mutex<BTreeMap<&'static str, VecDeque<StoreFault>>>,
}

impl StoreFaults {
    pub fn new() -> StoreFaults {
        StoreFaults::default()
    }

    /// Fails the next call of `operation` in class `fault`.
    pub fn inject(&self, operation: &'static str, fault: StoreFault) {
        if let Ok(mut q) = self.queued.lock() {
            q.entry(operation).or_default().push_back(fault);
        }
    }

    /// The fault queued for this call of `operation`, if any (consumed).
    pub fn take(&self, operation: &str) -> Option<StoreFault> {
        let mut q = self.queued.lock().ok()?;
        let faults = q.get_mut(operation)?;
        let fault = faults.pop_front();
        if faults.is_empty() {
            q.remove(operation);
        }
        fault
    }

    /// Runs `call`, one call of `operation`, under the fault queued for it (type doc).
    /// `call` is a future not yet polled: nothing of it runs when the fault strikes first.
    pub async fn run<T, E: ClassifiedStoreError>(
        &self,
        operation: &'static str,
        call: impl std::future::Future<Output = Result<T, E>>,
    ) -> Result<T, E> {
        let injected = |fault| E::of_fault(fault, format!("injected into {operation}"));
        match self.take(operation) {
            None => call.await,
            Some(fault @ (StoreFault::Unavailable | StoreFault::Corrupt)) => Err(injected(fault)),
            Some(StoreFault::CommitUnknown) => {
                call.await?;
                Err(injected(StoreFault::CommitUnknown))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_unavailable_becomes_a_retry_safe_code() {
        for unavailable in [ErrorCode::NotLeader, ErrorCode::RailUnavailable, ErrorCode::NotReady] {
            for fault in StoreFault::ALL {
                let code = fault.code(unavailable);
                assert_eq!(code.retry_safe(), fault.nothing_happened(), "{fault:?} -> {}", code.as_str());
                if !fault.nothing_happened() {
                    assert_eq!(code, ErrorCode::Internal);
                }
            }
        }
    }

    #[test]
    #[should_panic(expected = "not a retry-safe code")]
    fn a_store_fault_never_maps_to_a_code_that_is_not_retry_safe_for_unavailable() {
        StoreFault::Unavailable.code(ErrorCode::RailAmbiguous);
    }

    #[test]
    fn injected_faults_are_consumed_per_operation_in_order() {
        let f = StoreFaults::new();
        f.inject("admit", StoreFault::CommitUnknown);
        f.inject("admit", StoreFault::Unavailable);
        assert_eq!(f.take("resolve"), None);
        assert_eq!(f.take("admit"), Some(StoreFault::CommitUnknown));
        assert_eq!(f.take("admit"), Some(StoreFault::Unavailable));
        assert_eq!(f.take("admit"), None);
    }

    #[derive(Debug, PartialEq)]
    struct E(StoreFault);

    impl ClassifiedStoreError for E {
        fn fault(&self) -> StoreFault {
            self.0
        }
        fn of_fault(fault: StoreFault, _: String) -> E {
            E(fault)
        }
    }

    fn block_on<F: std::future::Future>(f: F) -> F::Output {
        // The futures here never wait: one poll with a no-op waker finishes them.
        let mut f = std::pin::pin!(f);
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        match f.as_mut().poll(&mut cx) {
            std::task::Poll::Ready(v) => v,
            std::task::Poll::Pending => panic!("a store call under test waited"),
        }
    }

    #[test]
    fn an_injected_commit_unknown_runs_the_call_and_the_others_do_not() {
        for (fault, runs) in
            [(StoreFault::Unavailable, false), (StoreFault::CommitUnknown, true), (StoreFault::Corrupt, false)]
        {
            let f = StoreFaults::new();
            f.inject("write", fault);
            let ran = std::cell::Cell::new(false);
            let answer: Result<(), E> = block_on(f.run("write", async {
                ran.set(true);
                Ok(())
            }));
            assert_eq!((answer, ran.get()), (Err(E(fault)), runs), "{fault:?}");
            let again: Result<(), E> = block_on(f.run("write", async { Ok(()) }));
            assert_eq!(again, Ok(()), "a fault strikes one call");
        }
    }
}
