//! A [`RailStore`] with injected faults: the fault layer's hook (C3-extensions C-29).
//!
//! [`FaultyRailStore`] wraps any store (`MemRailStore` or `MemPaydb` in the simulation) and
//! fails the calls queued in its [`StoreFaults`], per operation (the trait method's name),
//! in the one classification every store answers: `Unavailable` and `Corrupt` fail the call
//! before it changes anything, `CommitUnknown` lets it commit and loses the answer. It is a
//! [`RailStoreLayer`]: the delegation of every method is `crate::store_layer`'s;
//! `admit_checked` is the trait's default, a `payout` read then an `admit`, each faulted.

use std::future::Future;
use std::sync::Arc;

use dlock_contract::store::StoreFaults;
use dlock_http::metrics::ClosedTag;

use crate::store::{RailStore, StoreError};
use crate::store_layer::{RailStoreLayer, RailStoreOp};

/// `inner`, failing the calls `faults` holds.
pub struct FaultyRailStore {
    pub inner: Arc<dyn RailStore>,
    pub faults: Arc<StoreFaults>,
}

impl FaultyRailStore {
    pub fn new(inner: Arc<dyn RailStore>) -> FaultyRailStore {
        FaultyRailStore { inner, faults: Arc::new(StoreFaults::new()) }
    }
}

impl RailStoreLayer for FaultyRailStore {
    const ADMIT_CHECKED_READ_THEN_ADMIT: bool = true;

    fn inner(&self) -> &dyn RailStore {
        &*self.inner
    }

    async fn around<T: Send>(
        &self,
        op: RailStoreOp,
        call: impl Future<Output = Result<T, StoreError>> + Send,
    ) -> Result<T, StoreError> {
        self.faults.run(op.tag(), call).await
    }
}
