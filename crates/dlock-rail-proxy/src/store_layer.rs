//! The one delegation of [`RailStore`]: a [`RailStoreLayer`] (timing, faults, the
//! simulation's fault plan) says what happens around one call, and the blanket
//! `impl<L: RailStoreLayer> RailStore for L` below forwards every method to the layer's
//! inner store through [`RailStoreLayer::around`] (issue 36 §4).
//!
//! Invariants:
//! - Adding a store method touches the trait, its implementations, [`RailStoreOp`] and the
//!   one delegating impl here; no layer re-states it.
//! - Every async method is one [`RailStoreOp`]: its metric tag ([`ClosedTag::tag`],
//!   `rail_store_op_seconds{op}`, also the fault name) and whether it writes
//!   ([`RailStoreOp::is_write`]) are fixed here, once. `admit_checked` is one `admit`.
//! - The call's future is created before the layer runs and polled only by it, so a layer
//!   may refuse a call before any of it runs.
//! - A layer with [`RailStoreLayer::ADMIT_CHECKED_READ_THEN_ADMIT`] answers `admit_checked`
//!   with the trait's default over itself (its `payout` read, then its `admit`, each a call
//!   of the layer); one with [`RailStoreLayer::DELEGATES_DEFAULTED`] `false` answers
//!   `pool_stats` and `writer_thread` with the trait's defaults. Everything else, the
//!   defaulted batch methods included, goes to the inner store.

use std::future::Future;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use dlock_http::metrics::{ClosedTag, PoolStats};
use uuid::Uuid;

use crate::store::{
    read_then_admit, Admission, Attempt, Checked, EventRead, NewPayout, PayoutRow, RailStore, Resolution, Stamp,
    StoreError, SubmissionRow, Unstamped,
};

/// The `op` tag of `rail_store_op_seconds`: one value per [`RailStore`] method.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RailStoreOp {
    Ping,
    Payout,
    Admit,
    Resolve,
    AdmitBatch,
    ResolveBatch,
    HighWater,
    Submissions,
    UnresolvedBefore,
    InsertPayout,
    ReadEvents,
    CursorSecret,
}

impl ClosedTag for RailStoreOp {
    const LABEL: &'static str = "op";

    fn all() -> &'static [Self] {
        use RailStoreOp::*;
        &[
            Ping,
            Payout,
            Admit,
            Resolve,
            AdmitBatch,
            ResolveBatch,
            HighWater,
            Submissions,
            UnresolvedBefore,
            InsertPayout,
            ReadEvents,
            CursorSecret,
        ]
    }

    fn tag(self) -> &'static str {
        match self {
            RailStoreOp::Ping => "ping",
            RailStoreOp::Payout => "payout",
            RailStoreOp::Admit => "admit",
            RailStoreOp::Resolve => "resolve",
            RailStoreOp::AdmitBatch => "admit_batch",
            RailStoreOp::ResolveBatch => "resolve_batch",
            RailStoreOp::HighWater => "high_water",
            RailStoreOp::Submissions => "submissions",
            RailStoreOp::UnresolvedBefore => "unresolved_before",
            RailStoreOp::InsertPayout => "insert_payout",
            RailStoreOp::ReadEvents => "read_events",
            RailStoreOp::CursorSecret => "cursor_secret",
        }
    }
}

impl RailStoreOp {
    /// Whether the method writes (its call is noted on or off the store's writer thread).
    pub fn is_write(self) -> bool {
        use RailStoreOp::*;
        matches!(self, Admit | Resolve | AdmitBatch | ResolveBatch | InsertPayout | CursorSecret)
    }
}

/// What happens around each call of a wrapped [`RailStore`]: the whole of a decorator.
pub trait RailStoreLayer: Send + Sync + 'static {
    /// `false`: `pool_stats` and `writer_thread` keep the trait's defaults (module doc).
    const DELEGATES_DEFAULTED: bool = true;

    /// `true`: `admit_checked` is the trait's default over this layer, two calls (module doc).
    const ADMIT_CHECKED_READ_THEN_ADMIT: bool = false;

    /// The wrapped store.
    fn inner(&self) -> &dyn RailStore;

    /// Runs `call`, one not yet polled call of `op` on [`Self::inner`].
    fn around<T: Send>(
        &self,
        op: RailStoreOp,
        call: impl Future<Output = Result<T, StoreError>> + Send,
    ) -> impl Future<Output = Result<T, StoreError>> + Send;
}

#[async_trait]
impl<L: RailStoreLayer> RailStore for L {
    async fn ping(&self) -> Result<(), StoreError> {
        self.around(RailStoreOp::Ping, self.inner().ping()).await
    }

    async fn payout(&self, payout_id: Uuid) -> Result<Option<PayoutRow>, StoreError> {
        self.around(RailStoreOp::Payout, self.inner().payout(payout_id)).await
    }

    async fn admit(&self, attempt: &Attempt) -> Result<Admission, StoreError> {
        self.around(RailStoreOp::Admit, self.inner().admit(attempt)).await
    }

    async fn admit_checked(&self, asked: &Unstamped, stamp: Stamp<'_>) -> Result<Checked, StoreError> {
        if L::ADMIT_CHECKED_READ_THEN_ADMIT {
            read_then_admit(self, asked, stamp).await
        } else {
            self.around(RailStoreOp::Admit, self.inner().admit_checked(asked, stamp)).await
        }
    }

    async fn resolve(&self, submission_id: Uuid, resolution: &Resolution, at: DateTime<Utc>) -> Result<(), StoreError> {
        self.around(RailStoreOp::Resolve, self.inner().resolve(submission_id, resolution, at)).await
    }

    async fn admit_batch(&self, asked: &[Unstamped], stamp: Stamp<'_>) -> Result<Vec<Checked>, StoreError> {
        self.around(RailStoreOp::AdmitBatch, self.inner().admit_batch(asked, stamp)).await
    }

    async fn resolve_batch(&self, outcomes: &[(Uuid, Resolution)], at: DateTime<Utc>) -> Result<(), StoreError> {
        self.around(RailStoreOp::ResolveBatch, self.inner().resolve_batch(outcomes, at)).await
    }

    async fn high_water(&self, account_id: &str) -> Result<Option<i64>, StoreError> {
        self.around(RailStoreOp::HighWater, self.inner().high_water(account_id)).await
    }

    async fn submissions(&self, payout_id: Option<Uuid>) -> Result<Vec<SubmissionRow>, StoreError> {
        self.around(RailStoreOp::Submissions, self.inner().submissions(payout_id)).await
    }

    async fn unresolved_before(&self, before: DateTime<Utc>, limit: i64) -> Result<Vec<Uuid>, StoreError> {
        self.around(RailStoreOp::UnresolvedBefore, self.inner().unresolved_before(before, limit)).await
    }

    async fn insert_payout(&self, payout: &NewPayout, at: DateTime<Utc>) -> Result<(), StoreError> {
        self.around(RailStoreOp::InsertPayout, self.inner().insert_payout(payout, at)).await
    }

    async fn read_events(&self, after: i64, limit: usize) -> Result<EventRead, StoreError> {
        self.around(RailStoreOp::ReadEvents, self.inner().read_events(after, limit)).await
    }

    async fn read_final_events(&self, after: i64, upto: i64, limit: usize) -> Result<EventRead, StoreError> {
        self.around(RailStoreOp::ReadEvents, self.inner().read_final_events(after, upto, limit)).await
    }

    async fn cursor_secret(&self, candidate: [u8; 32], at: DateTime<Utc>) -> Result<[u8; 32], StoreError> {
        self.around(RailStoreOp::CursorSecret, self.inner().cursor_secret(candidate, at)).await
    }

    fn pool_stats(&self) -> Option<PoolStats> {
        if L::DELEGATES_DEFAULTED {
            self.inner().pool_stats()
        } else {
            None
        }
    }

    fn writer_thread(&self) -> Option<dlock_rt::dedicated::WriterThread> {
        if L::DELEGATES_DEFAULTED {
            self.inner().writer_thread()
        } else {
            None
        }
    }
}
