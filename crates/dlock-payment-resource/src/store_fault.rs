//! A [`PaymentStore`] with injected faults: the fault layer's hook (C3-extensions C-29).
//!
//! [`FaultyPaymentStore`] wraps any store (`MemPaydb` in the simulation) and fails the calls
//! queued in its [`StoreFaults`], per operation (the trait method's name), in the one
//! classification every store answers: `Unavailable` and `Corrupt` fail the call before it
//! changes anything, `CommitUnknown` lets it commit and loses the answer. The batch writes
//! (`claim_batch`, `post_batch`, C3-extensions E-19) are faulted exactly as `claim` and
//! `post` are, under their own names.
//! It is a [`PaymentStoreLayer`]: the delegation of every method is `crate::store_layer`'s,
//! and `payout_account` is faulted as `payout` ([`crate::store_layer::PaymentStoreOp::fault_op`]).

use std::future::Future;
use std::sync::Arc;

use dlock_contract::store::StoreFaults;

use crate::store::{PaymentStore, StoreError};
use crate::store_layer::{PaymentStoreLayer, PaymentStoreOp};

/// `inner`, failing the calls `faults` holds.
pub struct FaultyPaymentStore {
    pub inner: Arc<dyn PaymentStore>,
    pub faults: Arc<StoreFaults>,
}

impl FaultyPaymentStore {
    pub fn new(inner: Arc<dyn PaymentStore>) -> FaultyPaymentStore {
        FaultyPaymentStore { inner, faults: Arc::new(StoreFaults::new()) }
    }
}

impl PaymentStoreLayer for FaultyPaymentStore {
    fn inner(&self) -> &dyn PaymentStore {
        &*self.inner
    }

    async fn around<T: Send>(
        &self,
        op: PaymentStoreOp,
        call: impl Future<Output = Result<T, StoreError>> + Send,
    ) -> Result<T, StoreError> {
        self.faults.run(op.fault_op(), call).await
    }
}
