//! A [`LockStore`] with injected faults: the fault layer's hook (C3-extensions C-29).
//!
//! [`FaultyLockStore`] wraps any store (the memory store in the simulation) and fails the
//! calls queued in its [`StoreFaults`], per operation (the trait method's name), in the one
//! classification every store answers: `Unavailable` and `Corrupt` fail the call before it
//! changes anything, `CommitUnknown` lets it commit and loses the answer. Nothing else
//! differs from the wrapped store. It is a
//! [`LockStoreLayer`]: the delegation of every method is `crate::store_layer`'s.

use std::future::Future;
use std::sync::Arc;

use dlock_contract::store::StoreFaults;
use dlock_http::metrics::ClosedTag;

use crate::store::{LockStore, StoreError};
use crate::store_layer::{LockStoreLayer, LockStoreOp};

/// `inner`, failing the calls `faults` holds.
pub struct FaultyLockStore {
    pub inner: Arc<dyn LockStore>,
    pub faults: Arc<StoreFaults>,
}

impl FaultyLockStore {
    pub fn new(inner: Arc<dyn LockStore>) -> FaultyLockStore {
        FaultyLockStore { inner, faults: Arc::new(StoreFaults::new()) }
    }
}

impl LockStoreLayer for FaultyLockStore {
    fn inner(&self) -> &dyn LockStore {
        &*self.inner
    }

    async fn around<T: Send>(
        &self,
        op: LockStoreOp,
        call: impl Future<Output = Result<T, StoreError>> + Send,
    ) -> Result<T, StoreError> {
        self.faults.run(op.tag(), call).await
    }
}
