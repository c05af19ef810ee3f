//! A [`LockStore`] that measures every call: `lock_store_op_seconds{op}` (issue 13).
//!
//! [`TimedLockStore`] wraps the store a [`crate::service::LockServer`] is given, so every
//! store call of the replica (HTTP handlers, waiters, reaper) is timed in one place, on the
//! replica's `dlock-rt` clock. The `op` tag is the trait method ([`LockStoreOp`], a closed
//! set); nothing else differs from the wrapped store. It is a
//! [`LockStoreLayer`]: the delegation of every method is `crate::store_layer`'s.

use std::future::Future;
use std::sync::Arc;

use dlock_http::metrics::{ClosedTag, OffWriterWrites, TaggedHistogram};
use dlock_rt::Clock;

use crate::store::{LockStore, StoreError};
use crate::store_layer::LockStoreLayer;
pub use crate::store_layer::LockStoreOp;

/// `inner`, timing every call into `ops`.
pub struct TimedLockStore {
    pub inner: Arc<dyn LockStore>,
    pub ops: Arc<TaggedHistogram<LockStoreOp>>,
    /// Where each write is noted: it runs on the store's writer thread, or is counted.
    pub off_writer: Arc<OffWriterWrites>,
    pub clock: Clock,
}

impl LockStoreLayer for TimedLockStore {
    fn inner(&self) -> &dyn LockStore {
        &*self.inner
    }

    /// Times `call` under `op`; a write is first noted as running on the store's writer
    /// thread or not (`*_store_writes_off_writer_total`).
    async fn around<T: Send>(
        &self,
        op: LockStoreOp,
        call: impl Future<Output = Result<T, StoreError>> + Send,
    ) -> Result<T, StoreError> {
        if op.is_write() {
            self.off_writer.note(self.inner.writer_thread(), op.tag());
        }
        self.ops.time(&self.clock, op, call).await
    }
}
