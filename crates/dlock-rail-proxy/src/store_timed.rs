//! A [`RailStore`] that measures every call: `rail_store_op_seconds{op}` (issue 13).
//!
//! [`TimedRailStore`] wraps the store the [`crate::service::RailProxy`] is given, so every store call is timed in one
//! place, on the service's `dlock-rt` clock. The `op` tag is the trait method
//! ([`RailStoreOp`], a closed set); nothing else differs from the wrapped store. It is a
//! [`RailStoreLayer`]: the delegation of every method is `crate::store_layer`'s
//! (`admit_checked` is timed as one `admit`, its validation read part of it).

use std::future::Future;
use std::sync::Arc;

use dlock_http::metrics::{ClosedTag, OffWriterWrites, TaggedHistogram};
use dlock_rt::Clock;

use crate::store::{RailStore, StoreError};
use crate::store_layer::RailStoreLayer;
pub use crate::store_layer::RailStoreOp;

/// `inner`, timing every call into `ops`.
pub struct TimedRailStore {
    pub inner: Arc<dyn RailStore>,
    pub ops: Arc<TaggedHistogram<RailStoreOp>>,
    /// Where each write is noted: it runs on the store's writer thread, or is counted.
    pub off_writer: Arc<OffWriterWrites>,
    pub clock: Clock,
}

impl RailStoreLayer for TimedRailStore {
    fn inner(&self) -> &dyn RailStore {
        &*self.inner
    }

    /// Times `call` under `op`; a write is first noted as running on the store's writer
    /// thread or not (`*_store_writes_off_writer_total`).
    async fn around<T: Send>(
        &self,
        op: RailStoreOp,
        call: impl Future<Output = Result<T, StoreError>> + Send,
    ) -> Result<T, StoreError> {
        if op.is_write() {
            self.off_writer.note(self.inner.writer_thread(), op.tag());
        }
        self.ops.time(&self.clock, op, call).await
    }
}
