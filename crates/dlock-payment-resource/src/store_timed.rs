//! A [`PaymentStore`] that measures every call: `payout_store_op_seconds{op}` (issue 13).
//!
//! [`TimedPaymentStore`] wraps the store the [`crate::service::PaymentResource`] is given, so every store call is timed in one
//! place, on the service's `dlock-rt` clock. The `op` tag is the trait method
//! ([`PaymentStoreOp`], a closed set); nothing else differs from the wrapped store. It is a
//! [`PaymentStoreLayer`]: the delegation of every method is `crate::store_layer`'s.

use std::future::Future;
use std::sync::Arc;

use dlock_http::metrics::{ClosedTag, OffWriterWrites, TaggedHistogram};
use dlock_rt::Clock;

use crate::store::{PaymentStore, StoreError};
use crate::store_layer::PaymentStoreLayer;
pub use crate::store_layer::PaymentStoreOp;

/// `inner`, timing every call into `ops`.
pub struct TimedPaymentStore {
    pub inner: Arc<dyn PaymentStore>,
    pub ops: Arc<TaggedHistogram<PaymentStoreOp>>,
    /// Where each write is noted: it runs on the store's writer thread, or is counted.
    pub off_writer: Arc<OffWriterWrites>,
    pub clock: Clock,
}

impl PaymentStoreLayer for TimedPaymentStore {
    fn inner(&self) -> &dyn PaymentStore {
        &*self.inner
    }

    /// Times `call` under `op`; a write is first noted as running on the store's writer
    /// thread or not (`*_store_writes_off_writer_total`).
    async fn around<T: Send>(
        &self,
        op: PaymentStoreOp,
        call: impl Future<Output = Result<T, StoreError>> + Send,
    ) -> Result<T, StoreError> {
        if op.is_write() {
            self.off_writer.note(self.inner.writer_thread(), op.tag());
        }
        self.ops.time(&self.clock, op, call).await
    }
}
