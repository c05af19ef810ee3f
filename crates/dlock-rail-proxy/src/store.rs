//! The rail-proxy's store: the trait every backend implements, and the records it speaks.
//!
//! The trait is shaped by T-024's transaction boundaries, not by tables:
//! [`RailStore::admit`] is steps 1–3 in **one** transaction (advance the mark, claim the
//! forwardable slot, move the payout to SUBMITTED), and [`RailStore::resolve`] is the
//! second transaction that records the outcome of the one forward in between. Nothing
//! between the two holds a database connection, so a slow rail never pins one.
//! [`RailStore::admit_checked`] is the submission's validation (the body against its
//! payout) and steps 1–3: in the SQL stores one transaction whose first statement checks
//! the payout (docs/performance.md "The rail-proxy's admission"), elsewhere the read and
//! then `admit`, which answers the same.
//!
//! **Batches** (C3-extensions E-19): [`RailStore::admit_batch`] is the validation and steps
//! 1–3 of several payouts of one account under one token in **one** transaction (one fence
//! pass for all of them, then each payout as `admit` decides it), and
//! [`RailStore::resolve_batch`] records every forward's outcome in one transaction.
//!
//! Invariants every implementation keeps (the conformance suite proves them on SQLite,
//! PostgreSQL and the simulation store alike):
//! 1. The mark for an account only rises, and only to a token strictly greater than it.
//! 2. At most one forwardable attempt (outcome NULL, ACKED, REJECTED or TIMEOUT) exists per
//!    payout, decided by the unique index, never by a prior read.
//! 3. Every attempt that passes validation leaves exactly one row carrying its token.
//! 4. A refused admission (fenced, duplicate) never changes the payout; a not-claimable
//!    one changes nothing at all.
//! 5. A batch passes the mark once: its payouts are all fenced or none is, the mark is
//!    written at most once (to the batch's token), and a payout that fails validation has
//!    nothing written for it.

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use uuid::Uuid;

pub use dlock_paydb::events::EventRead;
/// paydb's shared rail rows and the one store error, from `dlock-paydb`.
pub use dlock_paydb::rail::{is_forwardable, Admission, Attempt, NewPayout, PayoutRow, Resolution, SubmissionRow};
pub use dlock_paydb::{ClassifiedStoreError, StoreError, StoreFault};

/// A submission's attempt before it is stamped: what it asks, and the beneficiary its payout
/// must pay (validation before step 1 compares it with the payout's terms).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unstamped {
    pub payout_id: Uuid,
    pub account_id: String,
    pub presented_token: i64,
    pub owner_id: String,
    pub idempotency_key: String,
    pub amount_minor: i64,
    pub currency: String,
    pub beneficiary_ref: String,
    /// `rail.proxy.fencing.enabled`, as [`Attempt::fencing_enabled`].
    pub fencing_enabled: bool,
}

impl Unstamped {
    /// The attempt, with its id and its instant.
    pub fn stamped(&self, submission_id: Uuid, at: DateTime<Utc>) -> Attempt {
        Attempt {
            submission_id,
            payout_id: self.payout_id,
            account_id: self.account_id.clone(),
            presented_token: self.presented_token,
            owner_id: self.owner_id.clone(),
            idempotency_key: self.idempotency_key.clone(),
            amount_minor: self.amount_minor,
            currency: self.currency.clone(),
            at,
            fencing_enabled: self.fencing_enabled,
        }
    }

    /// Whether `payout` exists and the body names its terms (no [`Unstamped::mismatches`]):
    /// validation before step 1 passes.
    pub fn matches(&self, payout: Option<&PayoutRow>) -> bool {
        payout.is_some_and(|p| self.mismatches(p).is_empty())
    }

    /// The body fields (their wire names, in C3's order) whose values differ from the
    /// payout's: validation before step 1 admits only when there are none.
    pub fn mismatches(&self, payout: &PayoutRow) -> Vec<&'static str> {
        let mut fields = Vec::new();
        if payout.account_id != self.account_id {
            fields.push("accountId");
        }
        if payout.amount_minor != self.amount_minor {
            fields.push("amountMinor");
        }
        if payout.currency != self.currency {
            fields.push("currency");
        }
        // The rail pays whom the request names: a beneficiary that is not the payout's would
        // send its money elsewhere, whatever the fences say.
        if payout.beneficiary_ref != self.beneficiary_ref {
            fields.push("beneficiaryRef");
        }
        fields
    }
}

/// Draws an attempt's id and instant, once, before steps 1–3 (the SQL stores draw it before
/// the statement that validates, the default after its read).
pub type Stamp<'a> = &'a (dyn Fn() -> (Uuid, DateTime<Utc>) + Send + Sync);

/// What [`RailStore::admit_checked`] came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Checked {
    /// No such payout (`None`), or the body does not match it (the payout as read: some
    /// [`Unstamped::mismatches`]). Nothing was written.
    Unmatched(Option<PayoutRow>),
    /// The body matches its payout; the attempt as stamped and what steps 1–3 decided.
    Decided { attempt: Attempt, admission: Admission },
}

/// The rail-proxy's view of paydb.
#[async_trait]
pub trait RailStore: Send + Sync + 'static {
    /// Cheap round trip, for readiness.
    async fn ping(&self) -> Result<(), StoreError>;

    /// The payout, for body validation before step 1 (advisory: `admit` decides).
    async fn payout(&self, payout_id: Uuid) -> Result<Option<PayoutRow>, StoreError>;

    /// Steps 1–3 in one transaction. See [`Admission`].
    async fn admit(&self, attempt: &Attempt) -> Result<Admission, StoreError>;

    /// Validation before step 1 and steps 1–3: the payout must exist and match `asked`
    /// ([`Unstamped::mismatches`]), else nothing is written; the attempt, stamped by `stamp`
    /// (called at most once, and once whenever it is decided), is admitted as
    /// [`RailStore::admit`] admits it. This
    /// default reads the payout and then calls `admit`, in that order, so a store without
    /// its own (the simulation's) makes the calls, and the draws, it always made; the SQL
    /// stores check the payout inside the admission's transaction instead, one round trip
    /// fewer, with the same answers (the conformance suite).
    async fn admit_checked(&self, asked: &Unstamped, stamp: Stamp<'_>) -> Result<Checked, StoreError> {
        read_then_admit(self, asked, stamp).await
    }

    /// Records the outcome of the forward of `submission_id` and moves its payout out of
    /// SUBMITTED, in one transaction. Resolving an already-resolved row is a no-op.
    async fn resolve(&self, submission_id: Uuid, resolution: &Resolution, at: DateTime<Utc>) -> Result<(), StoreError>;

    /// A batch (C3-extensions E-19), in ONE transaction: `asked` (one account, one token,
    /// one owner, one fencing switch, each payout once: else [`StoreError::Corrupt`], nothing
    /// written) is validated payout by payout as [`RailStore::admit_checked`] validates (a
    /// missing or mismatched payout is [`Checked::Unmatched`] and nothing is written for
    /// it); `stamp` is called once per payout that passes validation, and for no other; the
    /// mark is compared with the token once, by C-11's upsert, for all of them; then each
    /// validated payout is decided and written as `admit` decides and writes it
    /// ([`crate::admission::decide_batch_admission`]): a FENCED row each when the mark
    /// fences, else a DUPLICATE row, nothing (not claimable), or its intent row with the
    /// payout SUBMITTED. The answers are in `asked`'s order. Everything commits before it
    /// returns, so every intent exists before any socket opens.
    ///
    /// This default refuses, writing nothing ([`StoreError::Unavailable`]): a store that
    /// cannot pass the fence once for several payouts must not pretend to by looping
    /// `admit` (the second payout would be fenced by the first's mark, C-12).
    async fn admit_batch(&self, asked: &[Unstamped], stamp: Stamp<'_>) -> Result<Vec<Checked>, StoreError> {
        let _ = (asked, stamp);
        Err(StoreError::Unavailable("this store does not admit batches".into()))
    }

    /// Records every outcome of a batch's forwards, each exactly as [`RailStore::resolve`]
    /// records it (a no-op when already resolved). The stores record them all in one
    /// transaction; this default, for a store without its own, resolves them one by one.
    async fn resolve_batch(&self, outcomes: &[(Uuid, Resolution)], at: DateTime<Utc>) -> Result<(), StoreError> {
        for (submission_id, resolution) in outcomes {
            self.resolve(*submission_id, resolution, at).await?;
        }
        Ok(())
    }

    /// The mark for an account, if it was ever set.
    async fn high_water(&self, account_id: &str) -> Result<Option<i64>, StoreError>;

    /// Attempts, in the order they were written; all of them, or one payout's.
    async fn submissions(&self, payout_id: Option<Uuid>) -> Result<Vec<SubmissionRow>, StoreError>;

    /// Ids of at most `limit` attempts whose outcome is still unrecorded and that were
    /// submitted before `before`, oldest first (the orphan sweep).
    async fn unresolved_before(&self, before: DateTime<Utc>, limit: i64) -> Result<Vec<Uuid>, StoreError>;

    /// Inserts a payout. Fails if the id exists.
    async fn insert_payout(&self, payout: &NewPayout, at: DateTime<Utc>) -> Result<(), StoreError>;

    /// The event outbox (C3-extensions E-20): the final events after `after`, at most `limit`
    /// ([`EventRead`]).
    async fn read_events(&self, after: i64, limit: usize) -> Result<EventRead, StoreError>;

    /// [`RailStore::read_events`] below `upto`, every seq at or below which the caller
    /// already knows final: a store whose reads wait on holes (PostgreSQL) reads the range
    /// without waiting. The default is `read_events`.
    async fn read_final_events(&self, after: i64, upto: i64, limit: usize) -> Result<EventRead, StoreError> {
        Ok(self.read_events(after, limit).await?.clipped(after, upto, limit))
    }

    /// The deployment's cursor key (`paydb_secrets` row `p1-cursor`, the payment-resource's
    /// too): `candidate` is written if no key is, and the stored one answered. The event
    /// stream signs its cursors with it (C3-extensions E-20).
    async fn cursor_secret(&self, candidate: [u8; 32], at: DateTime<Utc>) -> Result<[u8; 32], StoreError>;

    /// The SQL pool's connections now, for `dlock_db_pool_connections` (`None`: no pool).
    fn pool_stats(&self) -> Option<dlock_http::metrics::PoolStats> {
        None
    }

    /// The thread this store's write transactions run on (`dlock_rt::dedicated`; SQLite's
    /// one writer connection, docs/performance.md "The SQLite writer thread"), `None`: on
    /// the caller's task.
    fn writer_thread(&self) -> Option<dlock_rt::dedicated::WriterThread> {
        None
    }
}

/// [`RailStore::admit_checked`] as two calls: the payout's read, then (the body matching
/// it) the stamp and [`RailStore::admit`]. The trait's default, and the SQL stores' path
/// with fencing off.
pub async fn read_then_admit<S: RailStore + ?Sized>(
    store: &S,
    asked: &Unstamped,
    stamp: Stamp<'_>,
) -> Result<Checked, StoreError> {
    let payout = store.payout(asked.payout_id).await?;
    if !asked.matches(payout.as_ref()) {
        return Ok(Checked::Unmatched(payout));
    }
    let (submission_id, at) = stamp();
    let attempt = asked.stamped(submission_id, at);
    let admission = store.admit(&attempt).await?;
    Ok(Checked::Decided { attempt, admission })
}

/// A batch's asks share one account, token, owner and fencing switch, and name each payout
/// once (what one fence pass covers, [`dlock_paydb::mem::one_pass`]); else
/// [`StoreError::Corrupt`]: the caller broke the batch's shape, and nothing is written.
pub fn check_batch(asked: &[Unstamped]) -> Result<(), StoreError> {
    dlock_paydb::mem::one_pass(asked.iter().map(|a| dlock_paydb::mem::PassKey {
        account_id: &a.account_id,
        presented_token: a.presented_token,
        owner_id: &a.owner_id,
        fencing_enabled: a.fencing_enabled,
        payout_id: a.payout_id,
    }))
}

/// One ask of a batch after validation: stamped, or unmatched (its payout as read).
pub type Validated = Result<Attempt, Option<PayoutRow>>;

/// A batch's validation, in `asked`'s order: each payout as `payout_of` reads it must
/// match its ask ([`Unstamped::matches`]); each that does is stamped, once, in order.
pub fn validate_batch(
    asked: &[Unstamped],
    payout_of: impl Fn(Uuid) -> Option<PayoutRow>,
    stamp: Stamp<'_>,
) -> Vec<Validated> {
    asked
        .iter()
        .map(|a| {
            let payout = payout_of(a.payout_id);
            if a.matches(payout.as_ref()) {
                let (submission_id, at) = stamp();
                Ok(a.stamped(submission_id, at))
            } else {
                Err(payout)
            }
        })
        .collect()
}

/// The validated attempts of a batch, in order (what the fence pass decides).
pub fn validated_attempts(validated: &[Validated]) -> Vec<Attempt> {
    validated.iter().filter_map(|v| v.as_ref().ok().cloned()).collect()
}

/// A batch's answers in request order: each validated attempt with its admission
/// (`admissions` in the order of [`validated_attempts`]), each unmatched ask as read.
/// A count that does not match is [`StoreError::Corrupt`].
pub fn batch_answers(validated: Vec<Validated>, admissions: Vec<Admission>) -> Result<Vec<Checked>, StoreError> {
    let expected = validated.iter().filter(|v| v.is_ok()).count();
    if admissions.len() != expected {
        return Err(StoreError::Corrupt(format!("{} admissions for {expected} validated payouts", admissions.len())));
    }
    let mut admissions = admissions.into_iter();
    validated
        .into_iter()
        .map(|v| match v {
            Err(payout) => Ok(Checked::Unmatched(payout)),
            Ok(attempt) => admissions
                .next()
                .map(|admission| Checked::Decided { attempt, admission })
                .ok_or_else(|| StoreError::Corrupt("an admission is missing".into())),
        })
        .collect()
}
