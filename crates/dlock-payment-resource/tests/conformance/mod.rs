//! The payment store conformance suite: the same cases against every `PaymentStore`
//! (SQLite, PostgreSQL, and the simulation store), each over one fresh paydb that the
//! proxy's `RailStore` shares, so the simulation cannot drift from SQL semantics. Each case
//! names the behaviour it proves (docs/design/payment-resource.md §8).
#![allow(
    clippy::disallowed_methods,
    reason = "a test outside the services: it drives them over real sockets and bounds its own waits with the host's clock (the seam binds service code)"
)]

use std::collections::BTreeSet;
use std::fmt::Debug;
use std::sync::Arc;

use async_trait::async_trait;
use chrono::{DateTime, Duration, Utc};
use dlock_contract::batch::batch_target;
use dlock_contract::payout::PayoutState;
use dlock_contract::rail::SubmissionOutcome;
use dlock_payment_resource::answer::{self, Answering, Shape};
use dlock_payment_resource::store::{
    funding_account, settlement_account, snapshot_after_everything, AbandonOutcome, AccountKind, AccountView,
    AmbiguousResolution, Claim, ClaimBatch, ClaimBatchOutcome, ClaimBatchPayout, ClaimOutcome, CreateAccountOutcome,
    CreatePayoutOutcome, Decided, Direction, IdemRequest, Idempotent, LedgerEntry, ListQuery, NewAccount, NewPayout,
    Operation, PaymentStore, PayoutSummary, PayoutView, Post, PostBatch, PostBatchOutcome, PostBatchPayout,
    PostOutcome, ResolutionRow, ResolveOutcome, StoreError, StoredResponse, SubmissionSummary,
};
use dlock_rail_proxy::store::{self as rail, Admission, Attempt, RailStore, Resolution};
use uuid::Uuid;

mod events;
pub use events::*;

/// What an operator does by hand today (no API until a later issue): `UPDATE payouts SET
/// state = :to, updated_at = :at WHERE payout_id = :id`, through the database's guards.
/// Each backend's implementation also keeps its database alive (a temp dir, say).
#[async_trait]
pub trait Operator: Send + Sync {
    async fn set_payout_state(&self, payout_id: Uuid, to: PayoutState, at: DateTime<Utc>);
}

/// One fresh paydb, seen by the payment-resource and by the proxy.
pub struct Paydb {
    pub pay: Pay,
    pub rail: Arc<dyn RailStore>,
    pub operator: Arc<dyn Operator>,
}

/// The trace id every answer the suite asks the store to record carries.
pub const TRACE: &str = "trace-conformance";

/// How a request of `shape` under identity `i` is answered (its key, the suite's trace id).
pub fn answering(shape: Shape, i: &IdemRequest) -> Answering {
    Answering { shape, key: i.key.clone(), trace_id: TRACE.into() }
}

/// The payment store as the suite drives it: each request shape as the pipeline sends it
/// (a single claim or post is the batch of one of its payout's account, and its outcome is
/// the one item's), and every recorded answer checked against the pure renderer of
/// `dlock_payment_resource::answer` for the request (so the recorded bytes are the
/// rendered outcome, byte for byte). Everything else is the store itself (`Deref`).
pub struct Pay(pub Arc<dyn PaymentStore>);

impl std::ops::Deref for Pay {
    type Target = Arc<dyn PaymentStore>;
    fn deref(&self) -> &Self::Target {
        &self.0
    }
}

/// `decided`, after checking that a committed outcome recorded `render` of it.
fn checked<T: Debug>(decided: Decided<T>, render: impl FnOnce(&T) -> StoredResponse) -> Decided<T> {
    if let Ok(Idempotent::Executed { outcome, stored: Some(stored) }) = &decided {
        assert_eq!(stored, &render(outcome), "the recorded bytes are the rendered outcome of {outcome:?}");
    }
    decided
}

impl Pay {
    pub async fn create_account(&self, a: &NewAccount, i: &IdemRequest) -> Decided<CreateAccountOutcome> {
        let decided = self.0.create_account(a, i, &answering(Shape::Single, i)).await;
        checked(decided, |o| answer::account_created(o, TRACE))
    }

    pub async fn create_payout(&self, p: &NewPayout, i: &IdemRequest) -> Decided<CreatePayoutOutcome> {
        let decided = self.0.create_payout(p, i, &answering(Shape::Single, i)).await;
        checked(decided, |o| answer::payout_created(o, TRACE))
    }

    /// P2: the batch of one of the payout's account (an unknown payout reaches no store
    /// transaction: `NotFound`, as the pipeline answers it).
    pub async fn claim(&self, c: &Claim, i: &IdemRequest) -> Decided<ClaimOutcome> {
        let Some(account) = self.0.payout_account(c.payout_id).await? else {
            return Ok(Idempotent::Executed { outcome: ClaimOutcome::NotFound, stored: None });
        };
        let decided = self.0.claim(&c.batch_of_one(&account), i, &answering(Shape::Single, i)).await;
        let single = decided.map(|d| d.map(|o| o.into_single(&account)));
        checked(single, |o| answer::claim_item(o, c.payout_id, c.token, &i.key, TRACE))
    }

    /// P3, as [`Pay::claim`].
    pub async fn post(&self, p: &Post, i: &IdemRequest) -> Decided<PostOutcome> {
        let Some(account) = self.0.payout_account(p.payout_id).await? else {
            return Ok(Idempotent::Executed { outcome: PostOutcome::NotFound, stored: None });
        };
        let decided = self.0.post(&p.batch_of_one(&account), i, &answering(Shape::Single, i)).await;
        let single = decided.map(|d| d.map(|o| o.into_single(&account)));
        checked(single, |o| answer::post_item(o, p.payout_id, TRACE))
    }

    /// P2b.
    pub async fn claim_batch(&self, b: &ClaimBatch, i: &IdemRequest) -> Decided<ClaimBatchOutcome> {
        let how = answering(Shape::Batch, i);
        let decided = self.0.claim(b, i, &how).await;
        checked(decided, |o| answer::claim(o, &b.account_id, b.token, &how))
    }

    /// P3b.
    pub async fn post_batch(&self, b: &PostBatch, i: &IdemRequest) -> Decided<PostBatchOutcome> {
        let how = answering(Shape::Batch, i);
        let decided = self.0.post(b, i, &how).await;
        checked(decided, |o| answer::post(o, &b.account_id, b.token, &how))
    }

    /// The operator's resolution over HTTP (C3-extensions E-21).
    pub async fn resolve_recorded(&self, r: &AmbiguousResolution, i: &IdemRequest) -> Decided<ResolveOutcome> {
        let decided = self.0.resolve_recorded(r, i, &answering(Shape::Single, i)).await;
        checked(decided, |o| answer::resolved(o, r, TRACE))
    }
}

pub const EUR: &str = "EUR";

pub fn t0() -> DateTime<Utc> {
    DateTime::<Utc>::from_timestamp_millis(1_795_000_000_000).expect("valid instant")
}

/// `t0` plus whole milliseconds.
pub fn at(ms: i64) -> DateTime<Utc> {
    t0() + Duration::milliseconds(ms)
}

pub const DAY_MS: i64 = 86_400_000;
pub const HOUR_MS: i64 = 3_600_000;

/// A fresh lower-case hex SHA-256-shaped fingerprint.
pub fn fingerprint() -> String {
    format!("{}{}", Uuid::new_v4().simple(), Uuid::new_v4().simple())
}

pub fn fresh_key() -> String {
    format!("key-{}", Uuid::new_v4().simple())
}

/// An identity with a 24 h retention from `now`.
pub fn idem(operation: Operation, target: &str, key: &str, token: i64, fp: &str, now: DateTime<Utc>) -> IdemRequest {
    IdemRequest {
        operation,
        target_id: target.to_owned(),
        key: key.to_owned(),
        token,
        owner_id: "worker-1".into(),
        fingerprint: fp.to_owned(),
        at: now,
        expires_at: now + Duration::milliseconds(DAY_MS),
    }
}

/// The bytes a committed outcome recorded (checked against its rendering by [`Pay`]).
pub fn recorded<T: Debug>(r: Idempotent<T>) -> StoredResponse {
    match r {
        Idempotent::Executed { stored: Some(stored), .. } => stored,
        other => panic!("expected a committed outcome, got {other:?}"),
    }
}

pub fn new_account(id: &str, currency: &str, opening: i64, now: DateTime<Utc>) -> NewAccount {
    NewAccount {
        account_id: id.to_owned(),
        currency: currency.to_owned(),
        opening_balance_minor: opening,
        posting_id: Uuid::new_v4(),
        entry_ids: [Uuid::new_v4(), Uuid::new_v4()],
        at: now,
    }
}

pub fn new_payout(account: &str, amount: i64, currency: &str, now: DateTime<Utc>) -> NewPayout {
    NewPayout {
        payout_id: Uuid::new_v4(),
        account_id: account.to_owned(),
        amount_minor: amount,
        currency: currency.to_owned(),
        beneficiary_ref: "ben-1".into(),
        at: now,
    }
}

pub fn claim_of(payout_id: Uuid, token: i64, expected: PayoutState, now: DateTime<Utc>) -> Claim {
    Claim { payout_id, token, owner_id: "worker-1".into(), expected, at: now }
}

pub fn post_of(payout_id: Uuid, token: i64, submission_id: Uuid, reference: &str, now: DateTime<Utc>) -> Post {
    Post {
        payout_id,
        token,
        owner_id: "worker-2".into(),
        submission_id,
        rail_reference: reference.to_owned(),
        posting_id: Uuid::new_v4(),
        entry_ids: [Uuid::new_v4(), Uuid::new_v4()],
        at: now,
    }
}

/// A batch claim (P2b) of `payouts` (each with its expected state) on `account`.
pub fn claim_batch_of(account: &str, token: i64, payouts: &[(Uuid, PayoutState)], now: DateTime<Utc>) -> ClaimBatch {
    ClaimBatch {
        account_id: account.to_owned(),
        token,
        owner_id: "worker-1".into(),
        payouts: payouts
            .iter()
            .map(|(payout_id, expected)| ClaimBatchPayout { payout_id: *payout_id, expected: *expected })
            .collect(),
        at: now,
    }
}

/// A batch post (P3b) of `payouts` (each with the attempt it names) on `account`, with
/// fresh posting and entry ids.
pub fn post_batch_of(account: &str, token: i64, payouts: &[(Uuid, Uuid, &str)], now: DateTime<Utc>) -> PostBatch {
    PostBatch {
        account_id: account.to_owned(),
        token,
        owner_id: "worker-2".into(),
        payouts: payouts
            .iter()
            .map(|(payout_id, submission_id, reference)| PostBatchPayout {
                payout_id: *payout_id,
                submission_id: *submission_id,
                rail_reference: (*reference).to_owned(),
                posting_id: Uuid::new_v4(),
                entry_ids: [Uuid::new_v4(), Uuid::new_v4()],
            })
            .collect(),
        at: now,
    }
}

/// The committed claim of a payout of `new_payout`'s terms on account `acct` (the answer
/// carries the payout's terms, C3-extensions C-30).
fn claimed_outcome(account_fence: i64, attempt_count: i32, reclaimed: bool, amount_minor: i64) -> ClaimOutcome {
    ClaimOutcome::Claimed {
        account_id: "acct".into(),
        account_fence,
        attempt_count,
        reclaimed,
        amount_minor,
        currency: EUR.into(),
        beneficiary_ref: "ben-1".into(),
    }
}

fn committed<T: Debug>(r: Idempotent<T>) -> T {
    match r {
        // [`Pay`] checked that the recorded bytes are the rendered outcome.
        Idempotent::Executed { outcome, stored: Some(_) } => outcome,
        other => panic!("expected a committed outcome, got {other:?}"),
    }
}

fn refused<T: Debug>(r: Idempotent<T>) -> T {
    match r {
        Idempotent::Executed { outcome, stored: None } => outcome,
        other => panic!("expected an unrecorded refusal, got {other:?}"),
    }
}

impl Paydb {
    /// Creates a CUSTOMER account (fresh identity) and returns its view.
    pub async fn account(&self, id: &str, currency: &str, opening: i64, now: DateTime<Utc>) -> AccountView {
        let a = new_account(id, currency, opening, now);
        let i = idem(Operation::CreateAccount, "accounts", &fresh_key(), 0, &fingerprint(), now);
        match committed(self.pay.create_account(&a, &i).await.expect("create account")) {
            CreateAccountOutcome::Created(v) => v,
            other => panic!("{other:?}"),
        }
    }

    /// Creates a PENDING payout (fresh identity).
    pub async fn payout(&self, account: &str, amount: i64, now: DateTime<Utc>) -> Uuid {
        self.payout_in(account, amount, EUR, now).await
    }

    pub async fn payout_in(&self, account: &str, amount: i64, currency: &str, now: DateTime<Utc>) -> Uuid {
        let p = new_payout(account, amount, currency, now);
        let i = idem(Operation::CreatePayout, "payouts", &fresh_key(), 0, &fingerprint(), now);
        match committed(self.pay.create_payout(&p, &i).await.expect("create payout")) {
            CreatePayoutOutcome::Created(v) => assert_eq!(v.payout_id, p.payout_id),
            other => panic!("{other:?}"),
        }
        p.payout_id
    }

    /// A claim under a fresh key.
    pub async fn claim(
        &self,
        payout_id: Uuid,
        token: i64,
        expected: PayoutState,
        now: DateTime<Utc>,
    ) -> Idempotent<ClaimOutcome> {
        let c = claim_of(payout_id, token, expected, now);
        let i = idem(Operation::Claim, &payout_id.to_string(), &fresh_key(), token, &fingerprint(), now);
        self.pay.claim(&c, &i).await.expect("claim")
    }

    /// A claim that must commit CLAIMED.
    pub async fn claimed(&self, payout_id: Uuid, token: i64, expected: PayoutState, now: DateTime<Utc>) {
        let outcome = committed(self.claim(payout_id, token, expected, now).await);
        assert!(
            matches!(outcome, ClaimOutcome::Claimed { account_fence, .. } if account_fence == token),
            "{outcome:?}"
        );
    }

    /// A post under a fresh key.
    pub async fn post(
        &self,
        payout_id: Uuid,
        token: i64,
        submission_id: Uuid,
        reference: &str,
        now: DateTime<Utc>,
    ) -> Idempotent<PostOutcome> {
        let p = post_of(payout_id, token, submission_id, reference, now);
        let i = idem(Operation::Post, &payout_id.to_string(), &fresh_key(), token, &fingerprint(), now);
        self.pay.post(&p, &i).await.expect("post")
    }

    /// A batch claim under a fresh key.
    pub async fn claim_batch(
        &self,
        account: &str,
        token: i64,
        payouts: &[(Uuid, PayoutState)],
        now: DateTime<Utc>,
    ) -> Idempotent<ClaimBatchOutcome> {
        let b = claim_batch_of(account, token, payouts, now);
        let i = idem(Operation::Claim, &batch_target(account), &fresh_key(), token, &fingerprint(), now);
        self.pay.claim_batch(&b, &i).await.expect("claim batch")
    }

    /// A batch post under a fresh key.
    pub async fn post_batch(
        &self,
        account: &str,
        token: i64,
        payouts: &[(Uuid, Uuid, &str)],
        now: DateTime<Utc>,
    ) -> Idempotent<PostBatchOutcome> {
        let b = post_batch_of(account, token, payouts, now);
        let i = idem(Operation::Post, &batch_target(account), &fresh_key(), token, &fingerprint(), now);
        self.pay.post_batch(&b, &i).await.expect("post batch")
    }

    /// The proxy's attempt for `payout_id` under `token`.
    pub async fn attempt(&self, payout_id: Uuid, token: i64, now: DateTime<Utc>) -> Attempt {
        let p = self.rail.payout(payout_id).await.expect("rail read").expect("payout exists");
        Attempt {
            submission_id: Uuid::new_v4(),
            payout_id,
            account_id: p.account_id,
            presented_token: token,
            owner_id: "worker-1".into(),
            idempotency_key: format!("payout:{payout_id}"),
            amount_minor: p.amount_minor,
            currency: p.currency,
            at: now,
            fencing_enabled: true,
        }
    }

    /// Admits an attempt (it must be admitted) and, if given, records its resolution.
    pub async fn submit(
        &self,
        payout_id: Uuid,
        token: i64,
        resolution: Option<Resolution>,
        now: DateTime<Utc>,
    ) -> Uuid {
        let a = self.attempt(payout_id, token, now).await;
        assert_eq!(self.rail.admit(&a).await, Ok(Admission::Admitted { submitted_at: now }));
        if let Some(r) = resolution {
            self.rail.resolve(a.submission_id, &r, now).await.expect("resolve");
        }
        a.submission_id
    }

    /// Claims with `token`, submits with `token`, and the rail acknowledges `reference`.
    pub async fn acked(&self, payout_id: Uuid, token: i64, reference: &str, now: DateTime<Utc>) -> Uuid {
        self.claimed(payout_id, token, PayoutState::Pending, now).await;
        self.submit(payout_id, token, Some(Resolution::Acked { rail_reference: reference.into() }), now).await
    }

    /// Claims, submits and posts (post token = `token + 1`).
    pub async fn posted(&self, payout_id: Uuid, token: i64, now: DateTime<Utc>) {
        let reference = format!("RR-{payout_id}");
        let s = self.acked(payout_id, token, &reference, now).await;
        let outcome = committed(self.post(payout_id, token + 1, s, &reference, now).await);
        assert!(matches!(outcome, PostOutcome::Posted { .. }), "{outcome:?}");
    }

    pub async fn view(&self, payout_id: Uuid) -> PayoutView {
        self.pay.payout(payout_id).await.expect("read payout").expect("payout exists")
    }

    pub async fn state(&self, payout_id: Uuid) -> PayoutState {
        self.view(payout_id).await.state
    }

    pub async fn acct(&self, id: &str) -> AccountView {
        self.pay.account(id).await.expect("read account").expect("account exists")
    }

    pub async fn ledger(&self, account: Option<&str>) -> Vec<LedgerEntry> {
        self.pay.ledger(account).await.expect("read ledger")
    }

    pub async fn records(&self) -> u64 {
        self.pay.idempotency_record_count().await.expect("count records")
    }

    pub async fn list(
        &self,
        state: PayoutState,
        account: Option<&str>,
        snapshot: DateTime<Utc>,
        after: Option<(DateTime<Utc>, Uuid)>,
        limit: i64,
    ) -> Vec<PayoutSummary> {
        let q =
            ListQuery { state, account_id: account.map(str::to_owned), snapshot, created_after: None, after, limit };
        self.pay.list(&q).await.expect("list")
    }

    /// Walks every page of `limit` rows, as a client following `nextCursor`.
    pub async fn walk(
        &self,
        state: PayoutState,
        account: Option<&str>,
        snapshot: DateTime<Utc>,
        limit: i64,
    ) -> Vec<Uuid> {
        let mut all = Vec::new();
        let mut after = None;
        loop {
            let page = self.list(state, account, snapshot, after, limit).await;
            assert!(page.len() as i64 <= limit);
            if let (Some(first), Some(after)) = (page.first(), after) {
                assert!((first.created_at, first.payout_id) > after, "a page starts strictly after its keyset");
            }
            all.extend(page.iter().map(|p| p.payout_id));
            match page.last() {
                Some(last) if page.len() as i64 == limit => after = Some((last.created_at, last.payout_id)),
                _ => return all,
            }
        }
    }
}

/// Σ DEBIT and Σ CREDIT over the whole ledger.
fn ledger_totals(entries: &[LedgerEntry]) -> (i64, i64) {
    let sum = |d| entries.iter().filter(|e| e.direction == d).map(|e| e.amount_minor).sum::<i64>();
    (sum(Direction::Debit), sum(Direction::Credit))
}

fn sorted_by_time_and_id(mut entries: Vec<LedgerEntry>) -> Vec<LedgerEntry> {
    entries.sort_by_key(|e| (e.created_at, e.entry_id));
    entries
}

// ---------------------------------------------------------------- creates

pub async fn create_account_posts_the_opening_balance_against_the_funding_account(db: Paydb) {
    let a = new_account("acct-1", EUR, 5_000, at(0));
    let i = idem(Operation::CreateAccount, "accounts", "k-1", 0, &fingerprint(), at(0));
    let r = db.pay.create_account(&a, &i).await.expect("create");
    let expected = AccountView {
        account_id: "acct-1".into(),
        kind: AccountKind::Customer,
        currency: EUR.into(),
        balance_minor: 5_000,
        fence: 0,
        ledger_sum_minor: 5_000,
        reserved_minor: 0,
        created_at: at(0),
        updated_at: at(0),
    };
    let outcome = CreateAccountOutcome::Created(expected.clone());
    assert_eq!(committed(r), outcome);
    assert_eq!(db.acct("acct-1").await, expected);
    let entry = |entry_id, account_id: String, direction| LedgerEntry {
        entry_id,
        posting_id: a.posting_id,
        payout_id: None,
        account_id,
        direction,
        amount_minor: 5_000,
        currency: EUR.into(),
        fence: 0,
        created_at: at(0),
    };
    let debit = entry(a.entry_ids[0], funding_account(EUR), Direction::Debit);
    let credit = entry(a.entry_ids[1], "acct-1".into(), Direction::Credit);
    assert_eq!(db.ledger(None).await, sorted_by_time_and_id(vec![debit.clone(), credit.clone()]));
    assert_eq!(db.ledger(Some("acct-1")).await, vec![credit]);
    assert_eq!(db.ledger(Some(&funding_account(EUR))).await, vec![debit]);
    let system = |id: String, kind, sum| AccountView {
        account_id: id,
        kind,
        currency: EUR.into(),
        balance_minor: 0,
        fence: 0,
        ledger_sum_minor: sum,
        reserved_minor: 0,
        created_at: at(0),
        updated_at: at(0),
    };
    let funding = system(funding_account(EUR), AccountKind::Funding, -5_000);
    let settlement = system(settlement_account(EUR), AccountKind::Settlement, 0);
    assert_eq!(db.acct(&funding_account(EUR)).await, funding);
    assert_eq!(db.acct(&settlement_account(EUR)).await, settlement);
    let ids: BTreeSet<String> = db.pay.accounts().await.expect("accounts").into_iter().map(|a| a.account_id).collect();
    assert_eq!(ids, BTreeSet::from(["acct-1".to_owned(), funding_account(EUR), settlement_account(EUR)]));
    // A second account in the currency reuses the system accounts.
    db.account("acct-2", EUR, 1_000, at(5)).await;
    assert_eq!(db.acct(&funding_account(EUR)).await.ledger_sum_minor, -6_000);
    assert_eq!(db.pay.accounts().await.expect("accounts").len(), 4);
    let (debits, credits) = ledger_totals(&db.ledger(None).await);
    assert_eq!((debits, credits), (6_000, 6_000));
    assert_eq!(db.records().await, 2);
}

pub async fn create_account_with_zero_opening_balance_writes_no_entries(db: Paydb) {
    let v = db.account("zero", EUR, 0, at(0)).await;
    assert_eq!((v.balance_minor, v.ledger_sum_minor, v.fence, v.reserved_minor), (0, 0, 0, 0));
    assert_eq!(db.ledger(None).await, vec![]);
    assert_eq!(db.acct("zero").await, v);
    // The system accounts exist all the same.
    assert_eq!(db.acct(&funding_account(EUR)).await.kind, AccountKind::Funding);
    assert_eq!(db.acct(&settlement_account(EUR)).await.kind, AccountKind::Settlement);
    assert_eq!(db.records().await, 1);
}

pub async fn create_account_twice_is_refused_without_a_second_entry(db: Paydb) {
    let first = db.account("dup", EUR, 100, at(0)).await;
    for (currency, opening) in [(EUR, 200), ("USD", 300), (EUR, 0)] {
        let a = new_account("dup", currency, opening, at(10));
        let i = idem(Operation::CreateAccount, "accounts", &fresh_key(), 0, &fingerprint(), at(10));
        let r = db.pay.create_account(&a, &i).await.expect("create");
        assert_eq!(refused(r), CreateAccountOutcome::Exists);
    }
    assert_eq!(db.acct("dup").await, first);
    assert_eq!(db.ledger(None).await.len(), 2);
    // The refusal rolled back the system accounts' upsert too.
    assert_eq!(db.pay.account(&funding_account("USD")).await, Ok(None));
    assert_eq!(db.pay.account(&settlement_account("USD")).await, Ok(None));
    assert_eq!(db.records().await, 1);
}

pub async fn create_payout_is_pending_and_reserves_nothing(db: Paydb) {
    db.account("acct", EUR, 1_000, at(0)).await;
    let p = new_payout("acct", 700, EUR, at(20));
    let i = idem(Operation::CreatePayout, "payouts", "k-p", 0, &fingerprint(), at(20));
    let r = db.pay.create_payout(&p, &i).await.expect("create");
    let view = PayoutView {
        payout_id: p.payout_id,
        account_id: "acct".into(),
        amount_minor: 700,
        currency: EUR.into(),
        beneficiary_ref: "ben-1".into(),
        state: PayoutState::Pending,
        attempt_count: 0,
        claim_token: None,
        claimed_by: None,
        claimed_at: None,
        created_at: at(20),
        updated_at: at(20),
        submissions: vec![],
    };
    let outcome = CreatePayoutOutcome::Created(view.clone());
    assert_eq!(committed(r), outcome);
    assert_eq!(db.view(p.payout_id).await, view);
    assert_eq!(
        db.rail.payout(p.payout_id).await,
        Ok(Some(rail::PayoutRow {
            payout_id: p.payout_id,
            account_id: "acct".into(),
            amount_minor: 700,
            currency: EUR.into(),
            beneficiary_ref: "ben-1".into(),
            state: PayoutState::Pending,
            attempt_count: 0,
        }))
    );
    // PENDING reserves nothing, so a second payout beyond the balance is accepted too.
    let second = db.payout("acct", 700, at(30)).await;
    let a = db.acct("acct").await;
    assert_eq!((a.balance_minor, a.reserved_minor, a.fence, a.updated_at), (1_000, 0, 0, at(0)));
    assert_eq!(db.pay.oldest_pending_created_at().await, Ok(Some(at(20))));
    assert_eq!(db.state(second).await, PayoutState::Pending);
    assert_eq!(db.ledger(None).await.len(), 2);
}

pub async fn create_payout_for_an_unknown_account_or_other_currency_is_refused(db: Paydb) {
    db.account("acct", EUR, 1_000, at(0)).await;
    let existing = db.payout("acct", 100, at(1)).await;
    let cases = [
        (new_payout("nobody", 100, EUR, at(2)), CreatePayoutOutcome::UnknownAccount),
        (new_payout(&funding_account(EUR), 100, EUR, at(2)), CreatePayoutOutcome::UnknownAccount),
        (new_payout(&settlement_account(EUR), 100, EUR, at(2)), CreatePayoutOutcome::UnknownAccount),
        (new_payout("acct", 100, "USD", at(2)), CreatePayoutOutcome::CurrencyMismatch { account_currency: EUR.into() }),
        (NewPayout { payout_id: existing, ..new_payout("acct", 55, EUR, at(2)) }, CreatePayoutOutcome::PayoutExists),
    ];
    for (p, expected) in cases {
        let i = idem(Operation::CreatePayout, "payouts", &fresh_key(), 0, &fingerprint(), at(2));
        let r = db.pay.create_payout(&p, &i).await.expect("create");
        assert_eq!(refused(r), expected, "{p:?}");
        if p.payout_id != existing {
            assert_eq!(db.pay.payout(p.payout_id).await, Ok(None));
        }
    }
    let v = db.view(existing).await;
    assert_eq!((v.amount_minor, v.created_at), (100, at(1)));
    assert_eq!(db.pay.account("nobody").await, Ok(None));
    assert_eq!(db.list(PayoutState::Pending, None, at(100), None, 10).await.len(), 1);
    assert_eq!(db.records().await, 2);
}

// ---------------------------------------------------------------- P2

pub async fn claim_moves_pending_to_claimed_and_raises_the_fence_to_the_token(db: Paydb) {
    db.account("acct", EUR, 1_000, at(0)).await;
    let p = db.payout("acct", 300, at(1)).await;
    let c = Claim { payout_id: p, token: 7, owner_id: "w-1".into(), expected: PayoutState::Pending, at: at(50) };
    let i = idem(Operation::Claim, &p.to_string(), "k-claim", 7, &fingerprint(), at(50));
    let r = db.pay.claim(&c, &i).await.expect("claim");
    let outcome = claimed_outcome(7, 0, false, 300);
    assert_eq!(committed(r), outcome);
    let v = db.view(p).await;
    assert_eq!(v.state, PayoutState::Claimed);
    assert_eq!((v.claim_token, v.claimed_by.as_deref(), v.claimed_at), (Some(7), Some("w-1"), Some(at(50))));
    assert_eq!((v.updated_at, v.created_at, v.attempt_count), (at(50), at(1), 0));
    let a = db.acct("acct").await;
    assert_eq!((a.fence, a.updated_at, a.balance_minor, a.reserved_minor), (7, at(50), 1_000, 300));
    assert_eq!(db.rail.payout(p).await.expect("read").map(|r| r.state), Some(PayoutState::Claimed));
    assert_eq!(db.pay.oldest_pending_created_at().await, Ok(None));
    assert_eq!(db.records().await, 3);
}

pub async fn claim_with_an_equal_or_lower_token_is_fenced_and_changes_nothing(db: Paydb) {
    db.account("acct", EUR, 1_000, at(0)).await;
    let p1 = db.payout("acct", 100, at(1)).await;
    let p2 = db.payout("acct", 100, at(2)).await;
    db.claimed(p1, 10, PayoutState::Pending, at(10)).await;
    let before = (db.view(p1).await, db.view(p2).await, db.acct("acct").await, db.records().await);
    for (payout, expected) in [(p2, PayoutState::Pending), (p1, PayoutState::Claimed)] {
        for token in [10, 9, 1] {
            let r = db.claim(payout, token, expected, at(20)).await;
            assert_eq!(refused(r), ClaimOutcome::Fenced { account_id: "acct".into(), highest_token: 10 });
        }
    }
    let after = (db.view(p1).await, db.view(p2).await, db.acct("acct").await, db.records().await);
    assert_eq!(after, before);
    assert_eq!(after.2.updated_at, at(10));
}

pub async fn reclaim_by_a_newer_token_keeps_claimed_and_raises_the_fence(db: Paydb) {
    db.account("acct", EUR, 1_000, at(0)).await;
    let p = db.payout("acct", 400, at(1)).await;
    db.claimed(p, 3, PayoutState::Pending, at(10)).await;
    let c = Claim { payout_id: p, token: 5, owner_id: "w-2".into(), expected: PayoutState::Claimed, at: at(20) };
    let i = idem(Operation::Claim, &p.to_string(), "k", 5, &fingerprint(), at(20));
    let outcome = committed(db.pay.claim(&c, &i).await.expect("claim"));
    assert_eq!(outcome, claimed_outcome(5, 0, true, 400));
    let v = db.view(p).await;
    assert_eq!(
        (v.state, v.claim_token, v.claimed_by.as_deref(), v.claimed_at),
        (PayoutState::Claimed, Some(5), Some("w-2"), Some(at(20)))
    );
    let a = db.acct("acct").await;
    assert_eq!((a.fence, a.reserved_minor), (5, 400), "a re-claim does not reserve twice");
    // After an attempt that presented nothing (UNSENT), the re-claim reports the attempt count.
    db.submit(p, 6, Some(Resolution::Unsent { detail: "refused".into() }), at(30)).await;
    assert_eq!(db.state(p).await, PayoutState::Claimed);
    let outcome = committed(db.claim(p, 7, PayoutState::Claimed, at(40)).await);
    assert_eq!(outcome, claimed_outcome(7, 1, true, 400));
    assert_eq!(db.acct("acct").await.fence, 7);
}

pub async fn claim_of_a_payout_not_in_the_expected_state_is_not_claimable_and_keeps_the_fence(db: Paydb) {
    // One account per state, so each fence is the state's own.
    for (i, name) in ["posted", "failed", "abandoned", "ambiguous", "pending", "claimed"].iter().enumerate() {
        db.account(name, EUR, 1_000, at(i as i64)).await;
    }
    let posted = db.payout("posted", 100, at(10)).await;
    db.posted(posted, 1, at(11)).await;
    let failed = db.payout("failed", 100, at(10)).await;
    db.claimed(failed, 1, PayoutState::Pending, at(11)).await;
    db.submit(failed, 1, Some(Resolution::Rejected { detail: "declined".into() }), at(12)).await;
    let abandoned = db.payout("abandoned", 100, at(10)).await;
    assert_eq!(db.pay.abandon(abandoned, at(11)).await, Ok(AbandonOutcome::Abandoned));
    let ambiguous = db.payout("ambiguous", 100, at(10)).await;
    db.claimed(ambiguous, 1, PayoutState::Pending, at(11)).await;
    db.submit(ambiguous, 1, Some(Resolution::Timeout { detail: "no answer".into() }), at(12)).await;
    let pending = db.payout("pending", 100, at(10)).await;
    let claimed = db.payout("claimed", 100, at(10)).await;
    db.claimed(claimed, 1, PayoutState::Pending, at(11)).await;
    let cases = [
        (posted, "posted", PayoutState::Posted, vec![PayoutState::Pending, PayoutState::Claimed]),
        (failed, "failed", PayoutState::Failed, vec![PayoutState::Pending, PayoutState::Claimed]),
        (abandoned, "abandoned", PayoutState::Abandoned, vec![PayoutState::Pending, PayoutState::Claimed]),
        (ambiguous, "ambiguous", PayoutState::RailAmbiguous, vec![PayoutState::Pending, PayoutState::Claimed]),
        (pending, "pending", PayoutState::Pending, vec![PayoutState::Claimed]),
        (claimed, "claimed", PayoutState::Claimed, vec![PayoutState::Pending]),
    ];
    let records = db.records().await;
    for (payout, account, state, expectations) in cases {
        let (view, acct) = (db.view(payout).await, db.acct(account).await);
        assert_eq!(view.state, state);
        for expected in expectations {
            let r = db.claim(payout, 100, expected, at(100)).await;
            assert_eq!(refused(r), ClaimOutcome::NotClaimable { state }, "{account} expecting {expected:?}");
        }
        assert_eq!(db.view(payout).await, view);
        assert_eq!(db.acct(account).await, acct, "{account}: the fence did not move");
    }
    assert_eq!(db.records().await, records);
}

pub async fn claim_that_would_overdraw_fails_the_payout_and_raises_the_fence(db: Paydb) {
    db.account("acct", EUR, 500, at(0)).await;
    let p1 = db.payout("acct", 400, at(1)).await;
    let p2 = db.payout("acct", 200, at(2)).await;
    let p3 = db.payout("acct", 100, at(3)).await;
    db.claimed(p1, 1, PayoutState::Pending, at(10)).await;
    let c = Claim { payout_id: p2, token: 2, owner_id: "w-9".into(), expected: PayoutState::Pending, at: at(20) };
    let i = idem(Operation::Claim, &p2.to_string(), "k-2", 2, &fingerprint(), at(20));
    let r = db.pay.claim(&c, &i).await.expect("claim");
    let outcome =
        ClaimOutcome::InsufficientFunds { account_id: "acct".into(), amount_minor: 200, available_minor: 100 };
    let stored = answer::claim_item(&outcome, p2, 2, "k-2", TRACE);
    assert_eq!(stored.status, 422, "the failed claim's answer is the recorded 422");
    assert_eq!(r, Idempotent::Executed { stored: Some(stored.clone()), outcome });
    let v = db.view(p2).await;
    assert_eq!(
        (v.state, v.claim_token, v.claimed_by.as_deref(), v.claimed_at, v.updated_at),
        (PayoutState::Failed, Some(2), Some("w-9"), Some(at(20)), at(20))
    );
    let a = db.acct("acct").await;
    assert_eq!((a.fence, a.balance_minor, a.reserved_minor, a.updated_at), (2, 500, 400, at(20)));
    assert_eq!(db.ledger(Some("acct")).await.len(), 1, "only the opening entry");
    // The 422 was recorded: the same request replays it.
    assert_eq!(db.pay.claim(&c, &i).await, Ok(Idempotent::Replayed(stored)));
    // Exactly the available amount still fits.
    let outcome = committed(db.claim(p3, 3, PayoutState::Pending, at(30)).await);
    assert_eq!(outcome, claimed_outcome(3, 0, false, 100));
    assert_eq!(db.acct("acct").await.reserved_minor, 500);
}

pub async fn available_balance_counts_every_unsettled_payout(db: Paydb) {
    db.account("acct", EUR, 1_000, at(0)).await;
    // Settled states reserve nothing: POSTED (debited instead), FAILED, ABANDONED, PENDING.
    let posted = db.payout("acct", 50, at(1)).await;
    db.posted(posted, 1, at(2)).await;
    let failed = db.payout("acct", 900, at(1)).await;
    db.claimed(failed, 3, PayoutState::Pending, at(3)).await;
    db.submit(failed, 3, Some(Resolution::Rejected { detail: "declined".into() }), at(3)).await;
    let abandoned = db.payout("acct", 900, at(1)).await;
    db.claimed(abandoned, 4, PayoutState::Pending, at(4)).await;
    assert_eq!(db.pay.abandon(abandoned, at(4)).await, Ok(AbandonOutcome::Abandoned));
    let _pending = db.payout("acct", 900, at(1)).await;
    assert_eq!(db.acct("acct").await.reserved_minor, 0);
    // Each unsettled state reserves: CLAIMED, SUBMITTED, RAIL_ACKED, RAIL_AMBIGUOUS.
    let claimed = db.payout("acct", 100, at(5)).await;
    db.claimed(claimed, 5, PayoutState::Pending, at(5)).await;
    let submitted = db.payout("acct", 200, at(5)).await;
    db.claimed(submitted, 6, PayoutState::Pending, at(6)).await;
    db.submit(submitted, 6, None, at(6)).await;
    let acked = db.payout("acct", 300, at(5)).await;
    db.acked(acked, 7, "RR-7", at(7)).await;
    let ambiguous = db.payout("acct", 150, at(5)).await;
    db.claimed(ambiguous, 8, PayoutState::Pending, at(8)).await;
    db.submit(ambiguous, 8, Some(Resolution::Timeout { detail: "no answer".into() }), at(8)).await;
    for (p, s) in [
        (posted, PayoutState::Posted),
        (failed, PayoutState::Failed),
        (abandoned, PayoutState::Abandoned),
        (claimed, PayoutState::Claimed),
        (submitted, PayoutState::Submitted),
        (acked, PayoutState::RailAcked),
        (ambiguous, PayoutState::RailAmbiguous),
    ] {
        assert_eq!(db.state(p).await, s);
    }
    let a = db.acct("acct").await;
    assert_eq!((a.balance_minor, a.reserved_minor), (950, 750));
    // Available = 950 - 750 = 200.
    let over = db.payout("acct", 201, at(9)).await;
    let r = db.claim(over, 9, PayoutState::Pending, at(9)).await;
    assert_eq!(
        committed(r),
        ClaimOutcome::InsufficientFunds { account_id: "acct".into(), amount_minor: 201, available_minor: 200 }
    );
    let fits = db.payout("acct", 200, at(10)).await;
    db.claimed(fits, 10, PayoutState::Pending, at(10)).await;
    assert_eq!(db.acct("acct").await.reserved_minor, 950);
}

pub async fn claim_of_an_unknown_payout_is_not_found(db: Paydb) {
    db.account("acct", EUR, 1_000, at(0)).await;
    let unknown = Uuid::new_v4();
    for expected in [PayoutState::Pending, PayoutState::Claimed] {
        assert_eq!(refused(db.claim(unknown, 5, expected, at(1)).await), ClaimOutcome::NotFound);
    }
    assert_eq!(refused(db.post(unknown, 6, Uuid::new_v4(), "RR", at(1)).await), PostOutcome::NotFound);
    assert_eq!(db.pay.abandon(unknown, at(1)).await, Ok(AbandonOutcome::NotFound));
    assert_eq!(db.pay.payout(unknown).await, Ok(None));
    assert_eq!(db.acct("acct").await.fence, 0);
    assert_eq!(db.records().await, 1);
}

// ---------------------------------------------------------------- P3

pub async fn post_writes_two_balanced_entries_and_debits_the_balance(db: Paydb) {
    db.account("acct", EUR, 1_000, at(0)).await;
    let p = db.payout("acct", 300, at(1)).await;
    let s = db.acked(p, 1, "RR-1", at(10)).await;
    let post = post_of(p, 2, s, "RR-1", at(30));
    let i = idem(Operation::Post, &p.to_string(), "k-post", 2, &fingerprint(), at(30));
    let r = db.pay.post(&post, &i).await.expect("post");
    let entry = |entry_id, account_id: String, direction| LedgerEntry {
        entry_id,
        posting_id: post.posting_id,
        payout_id: Some(p),
        account_id,
        direction,
        amount_minor: 300,
        currency: EUR.into(),
        fence: 2,
        created_at: at(30),
    };
    let debit = entry(post.entry_ids[0], "acct".into(), Direction::Debit);
    let credit = entry(post.entry_ids[1], settlement_account(EUR), Direction::Credit);
    let outcome =
        PostOutcome::Posted { account_id: "acct".into(), entries: [debit.clone(), credit.clone()], balance_minor: 700 };
    assert_eq!(committed(r), outcome);
    let v = db.view(p).await;
    assert_eq!((v.state, v.updated_at, v.claim_token), (PayoutState::Posted, at(30), Some(1)));
    let a = db.acct("acct").await;
    assert_eq!(
        (a.balance_minor, a.ledger_sum_minor, a.fence, a.reserved_minor, a.updated_at),
        (700, 700, 2, 0, at(30))
    );
    let s = db.acct(&settlement_account(EUR)).await;
    assert_eq!((s.balance_minor, s.fence, s.ledger_sum_minor), (0, 0, 300));
    let ledger = db.ledger(Some("acct")).await;
    assert_eq!(ledger.len(), 2);
    assert_eq!(ledger[1], debit);
    assert_eq!(db.ledger(Some(&settlement_account(EUR))).await, vec![credit]);
    let all = db.ledger(None).await;
    assert_eq!(all.iter().filter(|e| e.payout_id == Some(p)).count(), 2);
    assert_eq!(ledger_totals(&all), (1_300, 1_300));
    // The proxy's mark is its own fence: the post did not move it.
    assert_eq!(db.rail.high_water("acct").await, Ok(Some(1)));
}

pub async fn post_requires_rail_acked_and_a_matching_acknowledged_attempt(db: Paydb) {
    db.account("acct", EUR, 1_000, at(0)).await;
    let p = db.payout("acct", 300, at(1)).await;
    // CLAIMED, not yet submitted.
    db.claimed(p, 1, PayoutState::Pending, at(2)).await;
    assert_eq!(
        refused(db.post(p, 50, Uuid::new_v4(), "RR", at(3)).await),
        PostOutcome::NotClaimable { state: PayoutState::Claimed }
    );
    // SUBMITTED, outcome unknown yet.
    let s = db.submit(p, 1, None, at(4)).await;
    assert_eq!(
        refused(db.post(p, 50, s, "RR-1", at(5)).await),
        PostOutcome::NotClaimable { state: PayoutState::Submitted }
    );
    db.rail.resolve(s, &Resolution::Acked { rail_reference: "RR-1".into() }, at(6)).await.expect("resolve");
    // Another payout's acknowledged attempt.
    let other = db.payout("acct", 100, at(7)).await;
    let other_s = db.acked(other, 2, "RR-2", at(8)).await;
    let before = (db.view(p).await, db.acct("acct").await, db.ledger(None).await, db.records().await);
    for (submission, reference) in
        [(Uuid::new_v4(), "RR-1"), (s, "RR-x"), (s, ""), (other_s, "RR-2"), (other_s, "RR-1")]
    {
        let r = db.post(p, 50, submission, reference, at(9)).await;
        assert_eq!(refused(r), PostOutcome::RailMismatch, "{submission} {reference}");
    }
    assert_eq!((db.view(p).await, db.acct("acct").await, db.ledger(None).await, db.records().await), before);
    // A quarantined payout is not RAIL_ACKED.
    let ambiguous = db.payout("acct", 100, at(10)).await;
    db.claimed(ambiguous, 3, PayoutState::Pending, at(10)).await;
    let amb_s = db.submit(ambiguous, 3, Some(Resolution::Timeout { detail: "no answer".into() }), at(10)).await;
    assert_eq!(
        refused(db.post(ambiguous, 50, amb_s, "RR-3", at(11)).await),
        PostOutcome::NotClaimable { state: PayoutState::RailAmbiguous }
    );
    // The refusals left the fence at 3, so the same token now posts.
    assert_eq!(db.acct("acct").await.fence, 3);
    let outcome = committed(db.post(p, 50, s, "RR-1", at(12)).await);
    assert!(matches!(outcome, PostOutcome::Posted { balance_minor: 700, .. }), "{outcome:?}");
    assert_eq!(db.acct("acct").await.fence, 50);
}

pub async fn post_with_an_equal_or_lower_token_is_fenced_as_a_ledger_write(db: Paydb) {
    db.account("acct", EUR, 1_000, at(0)).await;
    let p = db.payout("acct", 300, at(1)).await;
    let s = db.acked(p, 5, "RR-5", at(2)).await;
    let before = (db.view(p).await, db.acct("acct").await, db.ledger(None).await, db.records().await);
    // The claim's own token is equal to the fence: a post needs a newer grant.
    for token in [5, 4, 1] {
        let r = db.post(p, token, s, "RR-5", at(3)).await;
        assert_eq!(refused(r), PostOutcome::Fenced { account_id: "acct".into(), highest_token: 5 });
    }
    assert_eq!((db.view(p).await, db.acct("acct").await, db.ledger(None).await, db.records().await), before);
    let outcome = committed(db.post(p, 6, s, "RR-5", at(4)).await);
    assert!(matches!(outcome, PostOutcome::Posted { balance_minor: 700, .. }), "{outcome:?}");
}

pub async fn post_of_a_posted_payout_is_not_claimable_and_writes_nothing(db: Paydb) {
    db.account("acct", EUR, 1_000, at(0)).await;
    let p = db.payout("acct", 300, at(1)).await;
    let s = db.acked(p, 1, "RR-1", at(2)).await;
    committed(db.post(p, 2, s, "RR-1", at(3)).await);
    let before = (db.view(p).await, db.acct("acct").await, db.ledger(None).await, db.records().await);
    for token in [3, 1_000] {
        let r = db.post(p, token, s, "RR-1", at(4)).await;
        assert_eq!(refused(r), PostOutcome::NotClaimable { state: PayoutState::Posted });
    }
    assert_eq!((db.view(p).await, db.acct("acct").await, db.ledger(None).await, db.records().await), before);
    assert_eq!(before.1.balance_minor, 700);
    assert_eq!(before.2.len(), 4);
}

// ---------------------------------------------------------------- P2b, P3b (C3-extensions E-19)

pub async fn a_batch_claim_passes_the_fence_once_and_raises_it_to_the_token(db: Paydb) {
    db.account("acct", EUR, 1_000, at(0)).await;
    let p1 = db.payout("acct", 100, at(1)).await;
    let p2 = db.payout("acct", 200, at(2)).await;
    let p3 = db.payout("acct", 300, at(3)).await;
    let records = db.records().await;
    let pending = PayoutState::Pending;
    let outcome = committed(db.claim_batch("acct", 7, &[(p1, pending), (p2, pending), (p3, pending)], at(50)).await);
    assert_eq!(
        outcome,
        ClaimBatchOutcome::Decided {
            items: vec![
                (p1, claimed_outcome(7, 0, false, 100)),
                (p2, claimed_outcome(7, 0, false, 200)),
                (p3, claimed_outcome(7, 0, false, 300)),
            ]
        }
    );
    for p in [p1, p2, p3] {
        let v = db.view(p).await;
        assert_eq!(
            (v.state, v.claim_token, v.claimed_by.as_deref(), v.claimed_at, v.updated_at),
            (PayoutState::Claimed, Some(7), Some("worker-1"), Some(at(50)), at(50))
        );
    }
    let a = db.acct("acct").await;
    assert_eq!((a.fence, a.updated_at, a.balance_minor, a.reserved_minor), (7, at(50), 1_000, 600));
    assert_eq!(db.records().await, records + 1, "one identity row for the whole batch");
    // The fence was passed once: the same token passes it no more, in a batch or alone.
    let again = db.claim_batch("acct", 7, &[(p1, PayoutState::Claimed)], at(60)).await;
    assert_eq!(refused(again), ClaimBatchOutcome::Fenced { highest_token: 7 });
    let single = db.claim(p2, 7, PayoutState::Claimed, at(60)).await;
    assert_eq!(refused(single), ClaimOutcome::Fenced { account_id: "acct".into(), highest_token: 7 });
    // A newer token re-claims.
    let re = committed(db.claim_batch("acct", 8, &[(p2, PayoutState::Claimed)], at(70)).await);
    assert_eq!(re, ClaimBatchOutcome::Decided { items: vec![(p2, claimed_outcome(8, 0, true, 200))] });
    assert_eq!(db.acct("acct").await.fence, 8);
}

pub async fn a_batch_claim_with_an_equal_or_lower_token_is_fenced_and_writes_nothing(db: Paydb) {
    db.account("acct", EUR, 1_000, at(0)).await;
    let p1 = db.payout("acct", 100, at(1)).await;
    let p2 = db.payout("acct", 100, at(2)).await;
    db.claimed(p1, 10, PayoutState::Pending, at(10)).await;
    let snapshot = || async { (db.view(p1).await, db.view(p2).await, db.acct("acct").await, db.records().await) };
    let before = snapshot().await;
    for token in [10, 9, 1] {
        let r = db.claim_batch("acct", token, &[(p2, PayoutState::Pending), (p1, PayoutState::Claimed)], at(20)).await;
        assert_eq!(refused(r), ClaimBatchOutcome::Fenced { highest_token: 10 }, "token {token}");
        let r = db.post_batch("acct", token, &[(p1, Uuid::new_v4(), "RR")], at(20)).await;
        assert_eq!(refused(r), PostBatchOutcome::Fenced { highest_token: 10 }, "token {token}");
    }
    let after = snapshot().await;
    assert_eq!(after, before);
    assert_eq!(after.2.updated_at, at(10));
    // No such CUSTOMER account: refused, and nothing written either.
    for account in ["nobody", &funding_account(EUR)] {
        let r = db.claim_batch(account, 11, &[(p2, PayoutState::Pending)], at(30)).await;
        assert_eq!(refused(r), ClaimBatchOutcome::AccountNotFound, "{account}");
        let r = db.post_batch(account, 11, &[(p2, Uuid::new_v4(), "RR")], at(30)).await;
        assert_eq!(refused(r), PostBatchOutcome::AccountNotFound, "{account}");
    }
    assert_eq!(snapshot().await, before);
}

pub async fn a_batch_claim_decides_each_payout_on_the_reservation_the_earlier_ones_left(db: Paydb) {
    // Balance for two of three payouts: the third is FAILED for funds.
    db.account("b", EUR, 800, at(0)).await;
    let q: Vec<Uuid> =
        [db.payout("b", 400, at(1)).await, db.payout("b", 400, at(2)).await, db.payout("b", 400, at(3)).await].into();
    let pending = PayoutState::Pending;
    let outcome = committed(db.claim_batch("b", 1, &[(q[0], pending), (q[1], pending), (q[2], pending)], at(10)).await);
    let claimed_b = |fence, amount_minor| ClaimOutcome::Claimed {
        account_id: "b".into(),
        account_fence: fence,
        attempt_count: 0,
        reclaimed: false,
        amount_minor,
        currency: EUR.into(),
        beneficiary_ref: "ben-1".into(),
    };
    assert_eq!(
        outcome,
        ClaimBatchOutcome::Decided {
            items: vec![
                (q[0], claimed_b(1, 400)),
                (q[1], claimed_b(1, 400)),
                (
                    q[2],
                    ClaimOutcome::InsufficientFunds { account_id: "b".into(), amount_minor: 400, available_minor: 0 }
                ),
            ]
        }
    );
    assert_eq!(db.state(q[2]).await, PayoutState::Failed);
    assert_eq!(db.view(q[2]).await.claim_token, Some(1));
    assert_eq!(db.acct("b").await.reserved_minor, 800);

    // A re-claim is not reserved against itself; a payout failed for funds releases nothing
    // it did not hold, and the next one sees what is left.
    db.account("acct", EUR, 1_000, at(0)).await;
    let p0 = db.payout("acct", 400, at(1)).await;
    db.claimed(p0, 1, PayoutState::Pending, at(2)).await;
    let p1 = db.payout("acct", 500, at(3)).await;
    let p2 = db.payout("acct", 300, at(4)).await;
    let p3 = db.payout("acct", 100, at(5)).await;
    let batch = [(p0, PayoutState::Claimed), (p1, pending), (p2, pending), (p3, pending)];
    let outcome = committed(db.claim_batch("acct", 2, &batch, at(20)).await);
    assert_eq!(
        outcome,
        ClaimBatchOutcome::Decided {
            items: vec![
                (p0, claimed_outcome(2, 0, true, 400)),
                (p1, claimed_outcome(2, 0, false, 500)),
                (
                    p2,
                    ClaimOutcome::InsufficientFunds {
                        account_id: "acct".into(),
                        amount_minor: 300,
                        available_minor: 100
                    }
                ),
                (p3, claimed_outcome(2, 0, false, 100)),
            ]
        }
    );
    let states = [db.state(p0).await, db.state(p1).await, db.state(p2).await, db.state(p3).await];
    assert_eq!(states, [PayoutState::Claimed, PayoutState::Claimed, PayoutState::Failed, PayoutState::Claimed]);
    let a = db.acct("acct").await;
    assert_eq!((a.balance_minor, a.reserved_minor, a.fence), (1_000, 1_000, 2));
}

pub async fn a_batch_claim_refuses_unclaimable_foreign_and_missing_payouts_and_changes_nothing_for_them(db: Paydb) {
    db.account("acct", EUR, 1_000, at(0)).await;
    db.account("other", EUR, 1_000, at(0)).await;
    let ok = db.payout("acct", 100, at(1)).await;
    let claimed = db.payout("acct", 100, at(1)).await;
    db.claimed(claimed, 1, PayoutState::Pending, at(2)).await;
    let foreign = db.payout("other", 100, at(1)).await;
    let missing = Uuid::new_v4();
    let before = (db.view(claimed).await, db.view(foreign).await, db.acct("other").await);
    let batch = [
        (claimed, PayoutState::Pending),
        (foreign, PayoutState::Pending),
        (missing, PayoutState::Pending),
        (ok, PayoutState::Pending),
    ];
    let outcome = committed(db.claim_batch("acct", 5, &batch, at(10)).await);
    assert_eq!(
        outcome,
        ClaimBatchOutcome::Decided {
            items: vec![
                (claimed, ClaimOutcome::NotClaimable { state: PayoutState::Claimed }),
                (foreign, ClaimOutcome::NotFound),
                (missing, ClaimOutcome::NotFound),
                (ok, claimed_outcome(5, 0, false, 100)),
            ]
        }
    );
    assert_eq!((db.view(claimed).await, db.view(foreign).await, db.acct("other").await), before);
    assert_eq!(db.pay.payout(missing).await, Ok(None));
    let a = db.acct("acct").await;
    assert_eq!((a.fence, a.reserved_minor), (5, 200));
}

pub async fn a_batch_where_no_payout_moves_leaves_no_fence_no_identity_and_nothing_else(db: Paydb) {
    db.account("acct", EUR, 1_000, at(0)).await;
    let p = db.payout("acct", 100, at(1)).await;
    db.claimed(p, 3, PayoutState::Pending, at(2)).await;
    let q = db.payout("acct", 100, at(1)).await;
    let missing = Uuid::new_v4();
    let snapshot = || async {
        (db.view(p).await, db.view(q).await, db.acct("acct").await, db.records().await, db.ledger(None).await)
    };
    let before = snapshot().await;
    let b = claim_batch_of(
        "acct",
        9,
        &[(p, PayoutState::Pending), (q, PayoutState::Claimed), (missing, PayoutState::Pending)],
        at(10),
    );
    let i = idem(Operation::Claim, &batch_target("acct"), "k-batch", 9, &fingerprint(), at(10));
    let nothing = ClaimBatchOutcome::Decided {
        items: vec![
            (p, ClaimOutcome::NotClaimable { state: PayoutState::Claimed }),
            (q, ClaimOutcome::NotClaimable { state: PayoutState::Pending }),
            (missing, ClaimOutcome::NotFound),
        ],
    };
    for _ in 0..2 {
        // Not recorded, so never replayed: judged afresh each time.
        assert_eq!(refused(db.pay.claim_batch(&b, &i).await.expect("claim batch")), nothing);
        assert_eq!(snapshot().await, before, "no fence, no identity row, no payout moved");
    }
    let post = db.post_batch("acct", 9, &[(p, Uuid::new_v4(), "RR")], at(10)).await;
    assert_eq!(
        refused(post),
        PostBatchOutcome::Decided { items: vec![(p, PostOutcome::NotClaimable { state: PayoutState::Claimed })] }
    );
    assert_eq!(snapshot().await, before);
    // Once q is CLAIMED (a newer holder), the same request re-claims it, and commits.
    db.claimed(q, 4, PayoutState::Pending, at(11)).await;
    let outcome = committed(db.pay.claim_batch(&b, &i).await.expect("claim batch"));
    assert_eq!(
        outcome,
        ClaimBatchOutcome::Decided {
            items: vec![
                (p, ClaimOutcome::NotClaimable { state: PayoutState::Claimed }),
                (q, claimed_outcome(9, 0, true, 100)),
                (missing, ClaimOutcome::NotFound),
            ]
        }
    );
    assert_eq!(db.acct("acct").await.fence, 9);
    assert_eq!(db.records().await, before.3 + 2, "the claim of q, then the batch");
}

pub async fn a_batch_replays_its_recorded_bytes_and_another_body_under_its_key_and_token_conflicts(db: Paydb) {
    db.account("acct", EUR, 1_000, at(0)).await;
    let p1 = db.payout("acct", 100, at(1)).await;
    let p2 = db.payout("acct", 200, at(1)).await;
    let fp = fingerprint();
    let b = claim_batch_of("acct", 5, &[(p1, PayoutState::Pending), (p2, PayoutState::Pending)], at(2));
    let i = idem(Operation::Claim, &batch_target("acct"), "k-batch", 5, &fp, at(2));
    let stored = recorded(db.pay.claim_batch(&b, &i).await.expect("claim batch"));
    // The state moves on; the batch still replays its first answer.
    db.claimed(p1, 6, PayoutState::Claimed, at(3)).await;
    assert_eq!(replayed(db.pay.claim_batch(&b, &i).await.expect("claim batch")), stored);
    // Another body under the same key and token: a conflict, and nothing changes.
    let before = (db.view(p1).await, db.view(p2).await, db.acct("acct").await, db.records().await);
    let other = IdemRequest { fingerprint: fingerprint(), ..i.clone() };
    let b2 = claim_batch_of("acct", 5, &[(p2, PayoutState::Claimed)], at(4));
    assert_eq!(db.pay.claim_batch(&b2, &other).await, Ok(Idempotent::Conflict));
    assert_eq!((db.view(p1).await, db.view(p2).await, db.acct("acct").await, db.records().await), before);
    // The batch's identity is its account's: P2 under the same key and token is another
    // request, which the fence judges.
    let single = idem(Operation::Claim, &p2.to_string(), "k-batch", 5, &fp, at(5));
    let r = db.pay.claim(&claim_of(p2, 5, PayoutState::Claimed, at(5)), &single).await.expect("claim");
    assert_eq!(refused(r), ClaimOutcome::Fenced { account_id: "acct".into(), highest_token: 6 });
    // A post batch replays too, after the state moved on.
    let s2 = db.submit(p2, 7, Some(Resolution::Acked { rail_reference: "RR-2".into() }), at(6)).await;
    let pb = post_batch_of("acct", 8, &[(p2, s2, "RR-2")], at(7));
    let pi = idem(Operation::Post, &batch_target("acct"), "k-batch", 8, &fingerprint(), at(7));
    let posted = recorded(db.pay.post_batch(&pb, &pi).await.expect("post batch"));
    assert_eq!(replayed(db.pay.post_batch(&pb, &pi).await.expect("post batch")), posted);
    let other = IdemRequest { fingerprint: fingerprint(), ..pi.clone() };
    assert_eq!(db.pay.post_batch(&pb, &other).await, Ok(Idempotent::Conflict));
}

pub async fn a_batch_post_writes_two_balanced_entries_per_payout_and_the_balance_follows(db: Paydb) {
    db.account("acct", EUR, 1_000, at(0)).await;
    let p =
        [db.payout("acct", 100, at(1)).await, db.payout("acct", 200, at(2)).await, db.payout("acct", 300, at(3)).await];
    let pending = PayoutState::Pending;
    committed(db.claim_batch("acct", 1, &[(p[0], pending), (p[1], pending), (p[2], pending)], at(10)).await);
    let mut named = Vec::new();
    for (k, payout) in p.iter().enumerate() {
        let reference = format!("RR-{k}");
        let token = 2 + k as i64;
        let s = db.submit(*payout, token, Some(Resolution::Acked { rail_reference: reference.clone() }), at(20)).await;
        named.push((*payout, s, reference));
    }
    let refs: Vec<(Uuid, Uuid, &str)> = named.iter().map(|(p, s, r)| (*p, *s, r.as_str())).collect();
    let b = post_batch_of("acct", 5, &refs, at(30));
    let i = idem(Operation::Post, &batch_target("acct"), "k-post", 5, &fingerprint(), at(30));
    let r = db.pay.post_batch(&b, &i).await.expect("post batch");
    let items: Vec<(Uuid, PostOutcome)> = b
        .payouts
        .iter()
        .zip([(100, 900), (200, 700), (300, 400)])
        .map(|(bp, (amount, balance_minor))| {
            let entries = b.post(bp).entries("acct", amount, EUR, at(30));
            (bp.payout_id, PostOutcome::Posted { account_id: "acct".into(), entries, balance_minor })
        })
        .collect();
    let outcome = PostBatchOutcome::Decided { items: items.clone() };
    assert_eq!(committed(r), outcome);
    for payout in p {
        let v = db.view(payout).await;
        assert_eq!((v.state, v.updated_at), (PayoutState::Posted, at(30)));
    }
    let a = db.acct("acct").await;
    assert_eq!(
        (a.balance_minor, a.ledger_sum_minor, a.fence, a.reserved_minor, a.updated_at),
        (400, 400, 5, 0, at(30))
    );
    assert_eq!(db.acct(&settlement_account(EUR)).await.ledger_sum_minor, 600);
    let all = db.ledger(None).await;
    let mut written: Vec<LedgerEntry> = all.iter().filter(|e| e.payout_id.is_some()).cloned().collect();
    let mut expected: Vec<LedgerEntry> = items
        .iter()
        .flat_map(|(_, o)| match o {
            PostOutcome::Posted { entries, .. } => entries.to_vec(),
            other => panic!("{other:?}"),
        })
        .collect();
    written.sort_by_key(|e| e.entry_id);
    expected.sort_by_key(|e| e.entry_id);
    assert_eq!(written, expected, "two entries per payout, each carrying the token");
    assert!(written.iter().all(|e| e.fence == 5));
    assert_eq!(ledger_totals(&all), (1_600, 1_600));
    // Posted is final: a newer token's batch finds nothing to post, and writes nothing.
    let again = db.post_batch("acct", 6, &[refs[0]], at(40)).await;
    assert_eq!(
        refused(again),
        PostBatchOutcome::Decided { items: vec![(p[0], PostOutcome::NotClaimable { state: PayoutState::Posted })] }
    );
    assert_eq!(db.acct("acct").await.fence, 5);
}

pub async fn a_batch_post_refuses_only_the_payout_whose_attempt_does_not_match(db: Paydb) {
    db.account("acct", EUR, 1_000, at(0)).await;
    db.account("other", EUR, 1_000, at(0)).await;
    let p1 = db.payout("acct", 100, at(1)).await;
    let p2 = db.payout("acct", 200, at(1)).await;
    let p3 = db.payout("acct", 300, at(1)).await;
    let pending = PayoutState::Pending;
    committed(db.claim_batch("acct", 1, &[(p1, pending), (p2, pending), (p3, pending)], at(2)).await);
    let s1 = db.submit(p1, 2, Some(Resolution::Acked { rail_reference: "RR-1".into() }), at(3)).await;
    let s2 = db.submit(p2, 3, Some(Resolution::Acked { rail_reference: "RR-2".into() }), at(3)).await;
    let f = db.payout("other", 50, at(1)).await;
    let fs = db.acked(f, 1, "RR-F", at(2)).await;
    let before = (db.view(p2).await, db.view(p3).await, db.view(f).await, db.acct("other").await);
    let batch = [(p2, s2, "RR-x"), (p1, s1, "RR-1"), (p3, Uuid::new_v4(), "RR-3"), (f, fs, "RR-F")];
    let outcome = committed(db.post_batch("acct", 5, &batch, at(10)).await);
    let PostBatchOutcome::Decided { items } = &outcome else { panic!("{outcome:?}") };
    assert_eq!(items.iter().map(|(p, _)| *p).collect::<Vec<_>>(), vec![p2, p1, p3, f]);
    assert_eq!(items[0].1, PostOutcome::RailMismatch);
    assert!(matches!(&items[1].1, PostOutcome::Posted { balance_minor: 900, .. }), "{:?}", items[1]);
    assert_eq!(items[2].1, PostOutcome::NotClaimable { state: PayoutState::Claimed });
    assert_eq!(items[3].1, PostOutcome::NotFound);
    assert_eq!((db.view(p2).await, db.view(p3).await, db.view(f).await, db.acct("other").await), before);
    assert!(db.ledger(None).await.iter().all(|e| e.payout_id != Some(p2) && e.payout_id != Some(f)));
    let a = db.acct("acct").await;
    assert_eq!((a.balance_minor, a.fence, a.reserved_minor), (900, 5, 500));
    // The post's fence is a ledger write's: an equal or lower token is fenced, a newer posts.
    for token in [5, 4] {
        let r = db.post_batch("acct", token, &[(p2, s2, "RR-2")], at(11)).await;
        assert_eq!(refused(r), PostBatchOutcome::Fenced { highest_token: 5 });
    }
    let outcome = committed(db.post_batch("acct", 6, &[(p2, s2, "RR-2")], at(12)).await);
    assert!(
        matches!(&outcome, PostBatchOutcome::Decided { items } if matches!(items[0].1, PostOutcome::Posted { balance_minor: 700, .. })),
        "{outcome:?}"
    );
}

// ---------------------------------------------------------------- P4, P5, P1

pub async fn account_view_recomputes_the_ledger_sum(db: Paydb) {
    db.account("a", EUR, 1_000, at(0)).await;
    db.account("b", EUR, 250, at(0)).await;
    db.account("u", "USD", 70, at(0)).await;
    let p1 = db.payout("a", 300, at(1)).await;
    db.posted(p1, 1, at(2)).await;
    let p2 = db.payout("a", 200, at(3)).await;
    db.posted(p2, 3, at(4)).await;
    let p3 = db.payout("a", 100, at(5)).await;
    db.claimed(p3, 5, PayoutState::Pending, at(5)).await;
    let a = db.acct("a").await;
    assert_eq!((a.balance_minor, a.ledger_sum_minor, a.reserved_minor), (500, 500, 100));
    let from_entries: i64 = db
        .ledger(Some("a"))
        .await
        .iter()
        .map(|e| if e.direction == Direction::Credit { e.amount_minor } else { -e.amount_minor })
        .sum();
    assert_eq!(from_entries, 500);
    assert_eq!(db.acct(&funding_account(EUR)).await.ledger_sum_minor, -1_250);
    assert_eq!(db.acct(&settlement_account(EUR)).await.ledger_sum_minor, 500);
    assert_eq!(db.acct(&funding_account("USD")).await.ledger_sum_minor, -70);
    assert_eq!(db.acct("u").await.ledger_sum_minor, 70);
    let all = db.pay.accounts().await.expect("accounts");
    assert_eq!(all.len(), 7);
    for v in &all {
        if v.kind == AccountKind::Customer {
            assert_eq!(v.balance_minor, v.ledger_sum_minor, "{v:?}");
        } else {
            assert_eq!((v.balance_minor, v.fence), (0, 0), "{v:?}");
        }
    }
    assert_eq!(all.iter().map(|v| v.ledger_sum_minor).sum::<i64>(), 0);
    assert_eq!(db.pay.account("nobody").await, Ok(None));
}

pub async fn payout_view_lists_its_submissions_in_order(db: Paydb) {
    db.account("acct", EUR, 1_000, at(0)).await;
    let p = db.payout("acct", 300, at(1)).await;
    let other = db.payout("acct", 100, at(1)).await;
    db.claimed(p, 1, PayoutState::Pending, at(2)).await;
    db.claimed(other, 2, PayoutState::Pending, at(2)).await;
    let s1 = db.submit(p, 1, Some(Resolution::Unsent { detail: "refused".into() }), at(10)).await;
    db.submit(other, 2, None, at(11)).await;
    // The mark is 2 now, so token 2 is fenced for this payout's account.
    let fenced = db.attempt(p, 2, at(12)).await;
    assert_eq!(db.rail.admit(&fenced).await, Ok(Admission::Fenced { highest_token: 2 }));
    let s3 = db.submit(p, 3, None, at(13)).await;
    db.rail.resolve(s3, &Resolution::Acked { rail_reference: "RR-3".into() }, at(14)).await.expect("resolve");
    let dup = db.attempt(p, 4, at(15)).await;
    assert!(matches!(db.rail.admit(&dup).await, Ok(Admission::Duplicate { .. })));
    let v = db.view(p).await;
    let summary = |submission_id, presented_token, outcome, rail_reference: Option<&str>, sub, res| SubmissionSummary {
        submission_id,
        presented_token,
        outcome,
        rail_reference: rail_reference.map(str::to_owned),
        submitted_at: sub,
        resolved_at: res,
    };
    assert_eq!(
        v.submissions,
        vec![
            summary(s1, 1, Some(SubmissionOutcome::Unsent), None, at(10), Some(at(10))),
            summary(fenced.submission_id, 2, Some(SubmissionOutcome::Fenced), None, at(12), Some(at(12))),
            summary(s3, 3, Some(SubmissionOutcome::Acked), Some("RR-3"), at(13), Some(at(14))),
            summary(dup.submission_id, 4, Some(SubmissionOutcome::Duplicate), None, at(15), Some(at(15))),
        ]
    );
    assert_eq!((v.state, v.attempt_count), (PayoutState::RailAcked, 2));
    assert_eq!(db.view(other).await.submissions.len(), 1);
    assert_eq!(db.view(db.payout("acct", 5, at(20)).await).await.submissions, vec![]);
}

pub async fn listing_pages_in_created_order_without_repeats_or_gaps(db: Paydb) {
    db.account("a", EUR, 1_000, at(0)).await;
    db.account("b", EUR, 1_000, at(0)).await;
    // 24 payouts over 6 instants, four per instant, so ties are decided by payout_id.
    let mut expected = Vec::new();
    for n in 0..24i64 {
        let when = at(100 + (n * 7 % 6) * 10);
        let account = if n % 2 == 0 { "a" } else { "b" };
        let id = db.payout(account, 10, when).await;
        expected.push((when, id));
    }
    expected.sort();
    let expected: Vec<Uuid> = expected.into_iter().map(|(_, id)| id).collect();
    let snapshot = at(1_000);
    for limit in [1, 4, 5, 24, 25, 100] {
        let walked = db.walk(PayoutState::Pending, None, snapshot, limit).await;
        assert_eq!(walked, expected, "limit {limit}");
    }
    // Keyset: strictly after the given row.
    let page = db.list(PayoutState::Pending, None, snapshot, None, 24).await;
    for w in page.windows(2) {
        assert!((w[0].created_at, w[0].payout_id) < (w[1].created_at, w[1].payout_id));
    }
    let after = db.list(PayoutState::Pending, None, snapshot, Some((page[9].created_at, page[9].payout_id)), 3).await;
    assert_eq!(after, page[10..13].to_vec());
    assert_eq!(page[0].amount_minor, 10);
    assert_eq!(page[0].currency, EUR);
    assert_eq!(page[0].attempt_count, 0);
    // The snapshot bound is inclusive.
    let bound = db.list(PayoutState::Pending, None, at(110), None, 100).await;
    assert_eq!(bound.len(), 8);
    assert!(bound.iter().all(|p| p.created_at <= at(110)));
    assert_eq!(db.list(PayoutState::Pending, None, at(99), None, 100).await, vec![]);
    assert_eq!(db.list(PayoutState::Pending, None, snapshot, None, 0).await, vec![]);
}

/// The rows created after an instant (`created_after`, the lower bound a P1 first page reads
/// the rows stamped ahead of its clock with): only those, oldest first, under the snapshot and
/// the keyset like any page; the instant itself is not after it.
pub async fn listing_bounds_rows_below_by_created_after(db: Paydb) {
    db.account("a", EUR, 1_000, at(0)).await;
    let _past = db.payout("a", 10, at(100)).await;
    let _at_the_bound = db.payout("a", 10, at(200)).await;
    let ahead = db.payout("a", 10, at(200 + 116_330)).await;
    let further = db.payout("a", 10, at(200 + 116_331)).await;
    let page = |snapshot, after| ListQuery {
        state: PayoutState::Pending,
        account_id: None,
        snapshot,
        created_after: Some(at(200)),
        after,
        limit: 10,
    };
    let ids = |rows: Vec<PayoutSummary>| rows.iter().map(|p| p.payout_id).collect::<Vec<_>>();
    let all = ids(db.pay.list(&page(snapshot_after_everything(), None)).await.expect("list"));
    assert_eq!(all, vec![ahead, further]);
    let bounded = ids(db.pay.list(&page(at(200 + 116_330), None)).await.expect("list"));
    assert_eq!(bounded, vec![ahead], "the snapshot still bounds it");
    let keyset =
        ids(db.pay.list(&page(snapshot_after_everything(), Some((at(200 + 116_330), ahead)))).await.expect("list"));
    assert_eq!(keyset, vec![further], "and the keyset");
}

pub async fn pages_are_stable_under_concurrent_inserts(db: Paydb) {
    db.account("a", EUR, 1_000, at(0)).await;
    let mut originals = Vec::new();
    for n in 0..10i64 {
        originals.push((at(100 + n), db.payout("a", 10, at(100 + n)).await));
    }
    let snapshot = at(200);
    let first = db.list(PayoutState::Pending, None, snapshot, None, 3).await;
    let mut walked: Vec<Uuid> = first.iter().map(|p| p.payout_id).collect();
    let mut after = first.last().map(|p| (p.created_at, p.payout_id));
    // Between pages: new payouts arrive (after the snapshot), and one row leaves the state.
    let mut late = Vec::new();
    let leaving = originals[7].1;
    let mut round = 0;
    loop {
        round += 1;
        late.push(db.payout("a", 10, at(300 + round)).await);
        late.push(db.payout("a", 10, at(200 + round)).await);
        if round == 1 {
            db.claimed(leaving, 1, PayoutState::Pending, at(300)).await;
        }
        let page = db.list(PayoutState::Pending, None, snapshot, after, 3).await;
        walked.extend(page.iter().map(|p| p.payout_id));
        match page.last() {
            Some(last) if page.len() == 3 => after = Some((last.created_at, last.payout_id)),
            _ => break,
        }
    }
    let expected: Vec<Uuid> = originals.iter().map(|(_, id)| *id).filter(|id| *id != leaving).collect();
    assert_eq!(walked, expected);
    assert!(round >= 2);
    // A fresh walk with a later snapshot sees the new rows.
    let fresh = db.walk(PayoutState::Pending, None, at(10_000), 4).await;
    assert_eq!(fresh.len(), expected.len() + late.len());
}

pub async fn listing_filters_by_state_and_account(db: Paydb) {
    db.account("a", EUR, 1_000, at(0)).await;
    db.account("b", EUR, 1_000, at(0)).await;
    let a1 = db.payout("a", 10, at(1)).await;
    let a2 = db.payout("a", 10, at(2)).await;
    let a3 = db.payout("a", 10, at(3)).await;
    let b1 = db.payout("b", 10, at(4)).await;
    let b2 = db.payout("b", 10, at(5)).await;
    db.claimed(a2, 1, PayoutState::Pending, at(6)).await;
    db.claimed(b2, 1, PayoutState::Pending, at(6)).await;
    db.pay.abandon(a3, at(7)).await.expect("abandon");
    let ids = |v: Vec<PayoutSummary>| v.into_iter().map(|p| p.payout_id).collect::<Vec<_>>();
    let snap = at(1_000);
    assert_eq!(ids(db.list(PayoutState::Pending, None, snap, None, 100).await), vec![a1, b1]);
    assert_eq!(ids(db.list(PayoutState::Pending, Some("a"), snap, None, 100).await), vec![a1]);
    assert_eq!(ids(db.list(PayoutState::Pending, Some("b"), snap, None, 100).await), vec![b1]);
    assert_eq!(ids(db.list(PayoutState::Claimed, None, snap, None, 100).await), vec![a2, b2]);
    assert_eq!(ids(db.list(PayoutState::Claimed, Some("b"), snap, None, 100).await), vec![b2]);
    assert_eq!(ids(db.list(PayoutState::Abandoned, Some("a"), snap, None, 100).await), vec![a3]);
    assert_eq!(ids(db.list(PayoutState::Abandoned, Some("b"), snap, None, 100).await), Vec::<Uuid>::new());
    assert_eq!(ids(db.list(PayoutState::Posted, None, snap, None, 100).await), Vec::<Uuid>::new());
    assert_eq!(ids(db.list(PayoutState::Pending, Some("nobody"), snap, None, 100).await), Vec::<Uuid>::new());
    let claimed = db.list(PayoutState::Claimed, Some("a"), snap, None, 100).await;
    assert_eq!(claimed[0].state, PayoutState::Claimed);
    assert_eq!(claimed[0].account_id, "a");
    assert_eq!(db.pay.oldest_pending_created_at().await, Ok(Some(at(1))));
}

// ---------------------------------------------------------------- coexistence

pub async fn proxy_transitions_and_claims_share_one_payout_state_machine(db: Paydb) {
    db.account("acct", EUR, 1_000, at(0)).await;
    let p = db.payout("acct", 300, at(1)).await;
    // PENDING: the proxy refuses, writing nothing.
    let early = db.attempt(p, 1, at(2)).await;
    assert_eq!(db.rail.admit(&early).await, Ok(Admission::NotClaimable { state: PayoutState::Pending }));
    db.claimed(p, 1, PayoutState::Pending, at(3)).await;
    let s1 = db.submit(p, 1, None, at(4)).await;
    let v = db.view(p).await;
    assert_eq!((v.state, v.attempt_count), (PayoutState::Submitted, 1));
    // SUBMITTED is the proxy's: neither claim nor post may take it.
    assert_eq!(
        refused(db.claim(p, 2, PayoutState::Claimed, at(5)).await),
        ClaimOutcome::NotClaimable { state: PayoutState::Submitted }
    );
    assert_eq!(db.acct("acct").await.fence, 1);
    assert_eq!(db.acct("acct").await.reserved_minor, 300);
    // UNSENT hands it back as CLAIMED; a newer holder re-claims and submits.
    db.rail.resolve(s1, &Resolution::Unsent { detail: "refused".into() }, at(6)).await.expect("resolve");
    assert_eq!(committed(db.claim(p, 3, PayoutState::Claimed, at(7)).await), claimed_outcome(3, 1, true, 300));
    let s2 = db.submit(p, 3, Some(Resolution::Acked { rail_reference: "RR-3".into() }), at(8)).await;
    assert_eq!(
        db.rail.payout(p).await.expect("read").map(|r| (r.state, r.attempt_count)),
        Some((PayoutState::RailAcked, 2))
    );
    assert_eq!(
        refused(db.claim(p, 4, PayoutState::Claimed, at(9)).await),
        ClaimOutcome::NotClaimable { state: PayoutState::RailAcked }
    );
    committed(db.post(p, 4, s2, "RR-3", at(10)).await);
    assert_eq!(db.rail.payout(p).await.expect("read").map(|r| r.state), Some(PayoutState::Posted));
    let late = db.attempt(p, 5, at(11)).await;
    assert!(matches!(db.rail.admit(&late).await, Ok(Admission::Duplicate { .. })));
    assert_eq!(db.state(p).await, PayoutState::Posted);
    // A payout the proxy seeds is visible to the payment-resource, on an upserted
    // zero-balance CUSTOMER account.
    let seeded = rail::NewPayout {
        payout_id: Uuid::new_v4(),
        account_id: "seeded".into(),
        amount_minor: 40,
        currency: "GBP".into(),
        beneficiary_ref: "ben-s".into(),
        state: PayoutState::Pending,
    };
    db.rail.insert_payout(&seeded, at(12)).await.expect("seed");
    let v = db.view(seeded.payout_id).await;
    assert_eq!((v.state, v.account_id.as_str(), v.created_at), (PayoutState::Pending, "seeded", at(12)));
    let a = db.acct("seeded").await;
    assert_eq!(
        (a.kind, a.currency.as_str(), a.balance_minor, a.fence, a.ledger_sum_minor),
        (AccountKind::Customer, "GBP", 0, 0, 0)
    );
    // A seeded payout on an existing account leaves the account as it was.
    let again = rail::NewPayout {
        payout_id: Uuid::new_v4(),
        account_id: "acct".into(),
        currency: EUR.into(),
        ..seeded.clone()
    };
    let before = db.acct("acct").await;
    db.rail.insert_payout(&again, at(13)).await.expect("seed");
    assert_eq!(db.acct("acct").await, before);
    // The funds check still applies to a seeded payout's claim.
    assert_eq!(
        committed(db.claim(seeded.payout_id, 1, PayoutState::Pending, at(14)).await),
        ClaimOutcome::InsufficientFunds { account_id: "seeded".into(), amount_minor: 40, available_minor: 0 }
    );
}

pub async fn a_payout_failed_for_funds_is_never_admitted_by_the_proxy(db: Paydb) {
    db.account("acct", EUR, 100, at(0)).await;
    let p = db.payout("acct", 200, at(1)).await;
    assert!(matches!(
        committed(db.claim(p, 1, PayoutState::Pending, at(2)).await),
        ClaimOutcome::InsufficientFunds { .. }
    ));
    for token in [1, 2, 1_000] {
        let a = db.attempt(p, token, at(3)).await;
        assert_eq!(db.rail.admit(&a).await, Ok(Admission::NotClaimable { state: PayoutState::Failed }));
    }
    assert_eq!(db.rail.submissions(Some(p)).await, Ok(vec![]));
    assert_eq!(db.rail.high_water("acct").await, Ok(None));
    for expected in [PayoutState::Pending, PayoutState::Claimed] {
        assert_eq!(
            refused(db.claim(p, 5, expected, at(4)).await),
            ClaimOutcome::NotClaimable { state: PayoutState::Failed }
        );
    }
    assert_eq!(db.pay.abandon(p, at(5)).await, Ok(AbandonOutcome::NotAbandonable { state: PayoutState::Failed }));
    let v = db.view(p).await;
    assert_eq!((v.state, v.attempt_count, v.submissions.len()), (PayoutState::Failed, 0, 0));
    let a = db.acct("acct").await;
    assert_eq!((a.balance_minor, a.reserved_minor, a.fence), (100, 0, 1));
}

pub async fn rail_ambiguous_keeps_its_reservation_until_an_operator_resolves_it(db: Paydb) {
    db.account("acct", EUR, 1_000, at(0)).await;
    let p = db.payout("acct", 600, at(1)).await;
    db.claimed(p, 1, PayoutState::Pending, at(2)).await;
    let s = db.submit(p, 1, Some(Resolution::Timeout { detail: "no answer".into() }), at(3)).await;
    assert_eq!(db.state(p).await, PayoutState::RailAmbiguous);
    assert_eq!(db.acct("acct").await.reserved_minor, 600);
    // Nothing but an operator moves it: not the proxy...
    db.rail.resolve(s, &Resolution::Acked { rail_reference: "RR-late".into() }, at(4)).await.expect("resolve");
    let a = db.attempt(p, 9, at(5)).await;
    assert!(matches!(db.rail.admit(&a).await, Ok(Admission::Duplicate { .. })));
    // ...nor a claim, a post or an abandon.
    for expected in [PayoutState::Pending, PayoutState::Claimed] {
        assert_eq!(
            refused(db.claim(p, 10, expected, at(6)).await),
            ClaimOutcome::NotClaimable { state: PayoutState::RailAmbiguous }
        );
    }
    assert_eq!(
        refused(db.post(p, 10, s, "RR-late", at(6)).await),
        PostOutcome::NotClaimable { state: PayoutState::RailAmbiguous }
    );
    assert_eq!(
        db.pay.abandon(p, at(6)).await,
        Ok(AbandonOutcome::NotAbandonable { state: PayoutState::RailAmbiguous })
    );
    // Money may have moved: its reservation still counts against every other claim.
    let q = db.payout("acct", 500, at(7)).await;
    assert_eq!(
        committed(db.claim(q, 10, PayoutState::Pending, at(8)).await),
        ClaimOutcome::InsufficientFunds { account_id: "acct".into(), amount_minor: 500, available_minor: 400 }
    );
    let a = db.acct("acct").await;
    assert_eq!((a.balance_minor, a.reserved_minor), (1_000, 600));
    // The operator finds the transfer never happened: FAILED releases the reservation.
    db.operator.set_payout_state(p, PayoutState::Failed, at(9)).await;
    assert_eq!(db.state(p).await, PayoutState::Failed);
    assert_eq!(db.acct("acct").await.reserved_minor, 0);
    let r = db.payout("acct", 500, at(10)).await;
    db.claimed(r, 11, PayoutState::Pending, at(11)).await;
    assert_eq!(db.acct("acct").await.reserved_minor, 500);
}

// ---------------------------------------------------------------- idempotency

pub async fn replay_returns_the_stored_bytes_after_the_state_moved_on(db: Paydb) {
    db.account("acct", EUR, 1_000, at(0)).await;
    let p = db.payout("acct", 300, at(1)).await;
    let c = claim_of(p, 1, PayoutState::Pending, at(2));
    let i = idem(Operation::Claim, &p.to_string(), "payout-key", 1, &fingerprint(), at(2));
    let first = db.pay.claim(&c, &i).await.expect("claim");
    let Idempotent::Executed { stored: Some(stored), .. } = first else { panic!("{first:?}") };
    assert!(String::from_utf8_lossy(&stored.body).contains("\"state\":\"CLAIMED\""));
    // The state moves on: submitted, acknowledged, posted.
    let s = db.submit(p, 1, Some(Resolution::Acked { rail_reference: "RR".into() }), at(3)).await;
    let post = post_of(p, 2, s, "RR", at(4));
    let post_i = idem(Operation::Post, &p.to_string(), "payout-key", 2, &fingerprint(), at(4));
    let posted = db.pay.post(&post, &post_i).await.expect("post");
    let Idempotent::Executed { stored: Some(post_stored), .. } = posted else { panic!("{posted:?}") };
    assert_eq!(db.state(p).await, PayoutState::Posted);
    // Replays, later, with new instants, answer the recorded bytes and run nothing.
    let later = IdemRequest { at: at(HOUR_MS), expires_at: at(HOUR_MS + DAY_MS), ..i.clone() };
    let later_c = Claim { at: at(HOUR_MS), ..c.clone() };
    assert_eq!(db.pay.claim(&later_c, &later).await, Ok(Idempotent::Replayed(stored.clone())));
    // A replay renders nothing: asked to answer as a batch under another trace id, it still
    // answers the first request's bytes.
    let other = Answering { shape: Shape::Batch, key: "another".into(), trace_id: "trace-other".into() };
    assert_eq!(db.pay.0.claim(&c.batch_of_one("acct"), &i, &other).await, Ok(Idempotent::Replayed(stored)));
    let another_post = post_of(p, 2, s, "RR", at(5));
    assert_eq!(db.pay.post(&another_post, &post_i).await, Ok(Idempotent::Replayed(post_stored)));
    // Creates replay too, although a second execution would now be refused.
    let a = new_account("acct-2", EUR, 10, at(6));
    let ai = idem(Operation::CreateAccount, "accounts", "acct-key", 0, &fingerprint(), at(6));
    let created = db.pay.create_account(&a, &ai).await.expect("create");
    let Idempotent::Executed { stored: Some(created_stored), .. } = created else { panic!("{created:?}") };
    assert_eq!(db.pay.create_account(&a, &ai).await, Ok(Idempotent::Replayed(created_stored)));
    assert_eq!(db.ledger(Some("acct-2")).await.len(), 1);
    assert_eq!(db.acct("acct").await.fence, 2);
}

pub async fn same_identity_with_another_fingerprint_is_a_conflict_and_changes_nothing(db: Paydb) {
    db.account("acct", EUR, 1_000, at(0)).await;
    let p = db.payout("acct", 300, at(1)).await;
    let p2 = db.payout("acct", 300, at(1)).await;
    let fp_a = fingerprint();
    let c = claim_of(p, 1, PayoutState::Pending, at(2));
    let i = idem(Operation::Claim, &p.to_string(), "k", 1, &fp_a, at(2));
    let stored = recorded(db.pay.claim(&c, &i).await.expect("claim"));
    let before = (db.view(p).await, db.view(p2).await, db.acct("acct").await, db.records().await);
    let other = IdemRequest { fingerprint: fingerprint(), owner_id: "worker-7".into(), ..i.clone() };
    // Whatever the second body would have done (here: a re-claim that would commit).
    let reclaim = Claim { expected: PayoutState::Claimed, ..c.clone() };
    assert_eq!(db.pay.claim(&reclaim, &other).await, Ok(Idempotent::Conflict));
    assert_eq!(db.pay.claim(&c, &other).await, Ok(Idempotent::Conflict));
    assert_eq!((db.view(p).await, db.view(p2).await, db.acct("acct").await, db.records().await), before);
    // The record is intact: the first fingerprint still replays.
    assert_eq!(db.pay.claim(&c, &i).await, Ok(Idempotent::Replayed(stored)));
    // Creates: another body under the same key creates nothing.
    let a = new_account("b", EUR, 10, at(3));
    let ai = idem(Operation::CreateAccount, "accounts", "acct-key", 0, &fingerprint(), at(3));
    committed(db.pay.create_account(&a, &ai).await.expect("create"));
    let a2 = new_account("c", EUR, 20, at(4));
    let ai2 = IdemRequest { fingerprint: fingerprint(), at: at(4), ..ai.clone() };
    assert_eq!(db.pay.create_account(&a2, &ai2).await, Ok(Idempotent::Conflict));
    assert_eq!(db.pay.account("c").await, Ok(None));
    let pi = idem(Operation::CreatePayout, "payouts", "payout-key", 0, &fingerprint(), at(5));
    committed(db.pay.create_payout(&new_payout("b", 5, EUR, at(5)), &pi).await.expect("create"));
    let np = new_payout("b", 6, EUR, at(6));
    let pi2 = IdemRequest { fingerprint: fingerprint(), ..pi.clone() };
    assert_eq!(db.pay.create_payout(&np, &pi2).await, Ok(Idempotent::Conflict));
    assert_eq!(db.pay.payout(np.payout_id).await, Ok(None));
    assert_eq!(db.records().await, before.3 + 2);
}

pub async fn concurrent_duplicates_execute_once_and_replay_the_same_bytes(db: Paydb) {
    db.account("acct", EUR, 1_000, at(0)).await;
    let p = db.payout("acct", 300, at(1)).await;
    let c = claim_of(p, 1, PayoutState::Pending, at(2));
    let i = idem(Operation::Claim, &p.to_string(), "k", 1, &fingerprint(), at(2));
    let mut tasks = Vec::new();
    for n in 0..16 {
        let (pay, c, i) = (Pay(db.pay.0.clone()), c.clone(), i.clone());
        tasks.push(tokio::spawn(async move {
            // Each duplicate would render under its own trace id: only one is recorded.
            let how = Answering { shape: Shape::Single, key: i.key.clone(), trace_id: format!("trace-{n}") };
            pay.0.claim(&c.batch_of_one("acct"), &i, &how).await.map(|d| d.map(|o| o.into_single("acct")))
        }));
    }
    let mut executed = Vec::new();
    let mut replayed = Vec::new();
    for t in tasks {
        match t.await.expect("task").expect("claim") {
            Idempotent::Executed { outcome, stored: Some(stored) } => executed.push((outcome, stored)),
            Idempotent::Replayed(stored) => replayed.push(stored),
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(executed.len(), 1, "exactly one execution");
    assert_eq!(replayed.len(), 15);
    let (outcome, stored) = &executed[0];
    assert_eq!(*outcome, claimed_outcome(1, 0, false, 300));
    assert!(replayed.iter().all(|r| r == stored), "every replay is byte-identical");
    assert_eq!(db.acct("acct").await.fence, 1);
    assert_eq!(db.records().await, 3);
}

pub async fn expired_record_is_evaluated_afresh_and_purged(db: Paydb) {
    let later = at(25 * HOUR_MS);
    db.account("acct", EUR, 1_000, at(0)).await;
    let p = db.payout("acct", 300, at(1)).await;
    let fp = fingerprint();
    let c = claim_of(p, 1, PayoutState::Pending, at(2));
    let i = idem(Operation::Claim, &p.to_string(), "k", 1, &fp, at(2));
    let stored = recorded(db.pay.claim(&c, &i).await.expect("claim"));
    // Live just before expiry, expired at it: `expires_at <= now` is expired.
    let edge = IdemRequest { at: at(2 + DAY_MS - 1), ..i.clone() };
    assert_eq!(db.pay.claim(&c, &edge).await, Ok(Idempotent::Replayed(stored)));
    let at_expiry = IdemRequest { at: at(2 + DAY_MS), expires_at: at(2 + 2 * DAY_MS), ..i.clone() };
    assert_eq!(
        refused(db.pay.claim(&c, &at_expiry).await.expect("claim")),
        ClaimOutcome::Fenced { account_id: "acct".into(), highest_token: 1 }
    );
    // 25 h later the same request is judged afresh: the fence refuses it, and a refusal
    // records nothing.
    let again = IdemRequest { at: later, expires_at: later + Duration::milliseconds(DAY_MS), ..i.clone() };
    let c_again = Claim { at: later, ..c.clone() };
    assert_eq!(
        refused(db.pay.claim(&c_again, &again).await.expect("claim")),
        ClaimOutcome::Fenced { account_id: "acct".into(), highest_token: 1 }
    );
    let records = db.records().await;
    assert_eq!(records, 3);
    // An expired identity that commits again replaces its record (and a new fingerprint is
    // no conflict once the old record expired).
    let ai = idem(Operation::CreateAccount, "accounts", "acct-key", 0, &fingerprint(), at(0));
    committed(db.pay.create_account(&new_account("x", EUR, 10, at(0)), &ai).await.expect("create"));
    let ai_later = IdemRequest {
        fingerprint: fingerprint(),
        at: later,
        expires_at: later + Duration::milliseconds(DAY_MS),
        ..ai.clone()
    };
    let created = committed(db.pay.create_account(&new_account("y", EUR, 20, later), &ai_later).await.expect("create"));
    assert!(matches!(created, CreateAccountOutcome::Created(ref v) if v.account_id == "y"));
    assert_eq!(db.records().await, records + 1, "replaced, not added");
    assert_eq!(
        db.pay.create_account(&new_account("y", EUR, 20, later), &ai_later).await,
        Ok(Idempotent::Replayed(answer::account_created(&created, TRACE)))
    );
    // The purge deletes the expired records (the three of t0) and keeps the live one.
    assert_eq!(db.pay.purge_idempotency(later, 100).await, Ok(3));
    assert_eq!(db.records().await, 1);
    assert_eq!(db.pay.purge_idempotency(later, 100).await, Ok(0));
    // With its record gone, the claim is still judged by the fence.
    assert_eq!(
        refused(db.pay.claim(&c, &i).await.expect("claim")),
        ClaimOutcome::Fenced { account_id: "acct".into(), highest_token: 1 }
    );
}

pub async fn a_newer_token_under_the_same_key_is_a_new_request_judged_by_the_fence(db: Paydb) {
    db.account("acct", EUR, 1_000, at(0)).await;
    let p = db.payout("acct", 300, at(1)).await;
    let q = db.payout("acct", 300, at(1)).await;
    let key = format!("payout:{p}");
    let claim = |token, expected, when| {
        let c = claim_of(p, token, expected, at(when));
        let i = idem(Operation::Claim, &p.to_string(), &key, token, &fingerprint(), at(when));
        (c, i)
    };
    let (c1, i1) = claim(1, PayoutState::Pending, 2);
    let first = recorded(db.pay.claim(&c1, &i1).await.expect("claim"));
    // A newer holder, the same stable key: a new identity, executed.
    let (c2, i2) = claim(2, PayoutState::Claimed, 3);
    assert_eq!(committed(db.pay.claim(&c2, &i2).await.expect("claim")), claimed_outcome(2, 0, true, 300));
    assert_eq!(db.records().await, 5);
    // The older identity still replays its own answer.
    assert_eq!(db.pay.claim(&c1, &i1).await, Ok(Idempotent::Replayed(first)));
    // Another payout's claim raises the fence past the next holder's token...
    db.claimed(q, 4, PayoutState::Pending, at(4)).await;
    // ...so that holder, under the same key, is fenced, and nothing is recorded.
    let (c3, i3) = claim(3, PayoutState::Claimed, 5);
    assert_eq!(
        refused(db.pay.claim(&c3, &i3).await.expect("claim")),
        ClaimOutcome::Fenced { account_id: "acct".into(), highest_token: 4 }
    );
    let (c5, i5) = claim(5, PayoutState::Claimed, 6);
    assert!(matches!(committed(db.pay.claim(&c5, &i5).await.expect("claim")), ClaimOutcome::Claimed { .. }));
    assert_eq!(db.records().await, 7);
    let v = db.view(p).await;
    assert_eq!((v.claim_token, v.state), (Some(5), PayoutState::Claimed));
}

pub async fn refusals_are_not_recorded_and_are_judged_afresh(db: Paydb) {
    db.account("acct", EUR, 1_000, at(0)).await;
    let base = db.records().await;
    // NotFound, then the payout appears: the same request now claims.
    let id = Uuid::new_v4();
    let c = claim_of(id, 9, PayoutState::Pending, at(1));
    let i = idem(Operation::Claim, &id.to_string(), "k-nf", 9, &fingerprint(), at(1));
    assert_eq!(refused(db.pay.claim(&c, &i).await.expect("claim")), ClaimOutcome::NotFound);
    assert_eq!(db.records().await, base);
    let np = NewPayout { payout_id: id, ..new_payout("acct", 100, EUR, at(2)) };
    let pi = idem(Operation::CreatePayout, "payouts", "k-p", 0, &fingerprint(), at(2));
    committed(db.pay.create_payout(&np, &pi).await.expect("create"));
    assert!(matches!(committed(db.pay.claim(&c, &i).await.expect("claim")), ClaimOutcome::Claimed { .. }));
    // Fenced stays fenced, and is never replayed.
    let other = db.payout("acct", 100, at(3)).await;
    let fc = claim_of(other, 3, PayoutState::Pending, at(4));
    let fi = idem(Operation::Claim, &other.to_string(), "k-f", 3, &fingerprint(), at(4));
    for _ in 0..2 {
        assert_eq!(
            refused(db.pay.claim(&fc, &fi).await.expect("claim")),
            ClaimOutcome::Fenced { account_id: "acct".into(), highest_token: 9 }
        );
    }
    // NotClaimable, then the rail acknowledges: the same post request now posts.
    let s = db.submit(id, 9, None, at(5)).await;
    let post = post_of(id, 10, s, "RR-9", at(6));
    let post_i = idem(Operation::Post, &id.to_string(), "k-post", 10, &fingerprint(), at(6));
    assert_eq!(
        refused(db.pay.post(&post, &post_i).await.expect("post")),
        PostOutcome::NotClaimable { state: PayoutState::Submitted }
    );
    db.rail.resolve(s, &Resolution::Acked { rail_reference: "RR-9".into() }, at(7)).await.expect("resolve");
    assert!(matches!(committed(db.pay.post(&post, &post_i).await.expect("post")), PostOutcome::Posted { .. }));
    // A refused create (the id is taken) is not recorded either.
    let ai = idem(Operation::CreateAccount, "accounts", "k-a", 0, &fingerprint(), at(8));
    let dup = new_account("acct", EUR, 5, at(8));
    for _ in 0..2 {
        assert_eq!(refused(db.pay.create_account(&dup, &ai).await.expect("create")), CreateAccountOutcome::Exists);
    }
    // Only the commits were recorded: the payout, the claim, the other payout, the post.
    assert_eq!(db.records().await, base + 4);
}

pub async fn purge_is_bounded_by_its_batch(db: Paydb) {
    // Seven records expiring an hour apart, and one live record.
    let mut keys = Vec::new();
    for n in 1..=7i64 {
        let a = new_account(&format!("acct-{n}"), EUR, 10, at(0));
        let mut i = idem(Operation::CreateAccount, "accounts", &format!("k-{n}"), 0, &fingerprint(), at(0));
        i.expires_at = at(n * HOUR_MS);
        committed(db.pay.create_account(&a, &i).await.expect("create"));
        keys.push((a, i));
    }
    let live = idem(Operation::CreateAccount, "accounts", "k-live", 0, &fingerprint(), at(0));
    committed(db.pay.create_account(&new_account("live", EUR, 10, at(0)), &live).await.expect("create"));
    assert_eq!(db.records().await, 8);
    let now = at(10 * HOUR_MS);
    assert_eq!(db.pay.purge_idempotency(now, 3).await, Ok(3));
    assert_eq!(db.records().await, 5);
    // The oldest expiries went first: replayed before their expiry, 1–3 are gone (a
    // re-execution, refused as the account exists) and 4–7 still replay.
    for (n, (a, i)) in keys.iter().enumerate() {
        let r = db.pay.create_account(a, i).await.expect("create");
        if n < 3 {
            assert_eq!(refused(r), CreateAccountOutcome::Exists, "record {}", n + 1);
        } else {
            assert!(matches!(r, Idempotent::Replayed(_)), "record {}: {r:?}", n + 1);
        }
    }
    assert_eq!(db.pay.purge_idempotency(now, 0).await, Ok(0));
    assert_eq!(db.pay.purge_idempotency(at(5 * HOUR_MS), 10).await, Ok(2), "only those expired at `now`");
    assert_eq!(db.pay.purge_idempotency(now, 3).await, Ok(2));
    assert_eq!(db.pay.purge_idempotency(now, 3).await, Ok(0));
    assert_eq!(db.records().await, 1);
}

pub async fn no_committed_record_lacks_its_response(db: Paydb) {
    // [`Pay`] checks each recorded answer against its rendering; here each is replayed.
    let mut replays: Vec<(StoredResponse, StoredResponse)> = Vec::new();

    let a = new_account("acct", EUR, 500, at(0));
    let ai = idem(Operation::CreateAccount, "accounts", "ka", 0, &fingerprint(), at(0));
    let r = db.pay.create_account(&a, &ai).await.expect("create");
    let Idempotent::Executed { stored: Some(s), .. } = r else { panic!("{r:?}") };
    replays.push((s, db.pay.create_account(&a, &ai).await.map(replayed).expect("replay")));

    let mut payouts = Vec::new();
    for (n, amount) in [(1, 300), (2, 400)] {
        let p = new_payout("acct", amount, EUR, at(n));
        let pi = idem(Operation::CreatePayout, "payouts", &format!("kp{n}"), 0, &fingerprint(), at(n));
        let r = db.pay.create_payout(&p, &pi).await.expect("create");
        let Idempotent::Executed { stored: Some(s), .. } = r else { panic!("{r:?}") };
        replays.push((s, db.pay.create_payout(&p, &pi).await.map(replayed).expect("replay")));
        payouts.push(p.payout_id);
    }

    let c = claim_of(payouts[0], 1, PayoutState::Pending, at(3));
    let ci = idem(Operation::Claim, &payouts[0].to_string(), "kc", 1, &fingerprint(), at(3));
    let r = db.pay.claim(&c, &ci).await.expect("claim");
    let Idempotent::Executed { stored: Some(s), .. } = r else { panic!("{r:?}") };
    replays.push((s, db.pay.claim(&c, &ci).await.map(replayed).expect("replay")));

    let c = claim_of(payouts[1], 2, PayoutState::Pending, at(4));
    let ci = idem(Operation::Claim, &payouts[1].to_string(), "kc", 2, &fingerprint(), at(4));
    let r = db.pay.claim(&c, &ci).await.expect("claim");
    let Idempotent::Executed { outcome: ClaimOutcome::InsufficientFunds { .. }, stored: Some(s) } = r else {
        panic!("{r:?}")
    };
    replays.push((s, db.pay.claim(&c, &ci).await.map(replayed).expect("replay")));

    let sub = db.submit(payouts[0], 1, Some(Resolution::Acked { rail_reference: "RR".into() }), at(5)).await;
    let p = post_of(payouts[0], 3, sub, "RR", at(6));
    let pi = idem(Operation::Post, &payouts[0].to_string(), "kpost", 3, &fingerprint(), at(6));
    let r = db.pay.post(&p, &pi).await.expect("post");
    let Idempotent::Executed { stored: Some(s), .. } = r else { panic!("{r:?}") };
    replays.push((s, db.pay.post(&p, &pi).await.map(replayed).expect("replay")));

    assert_eq!(db.records().await, 6, "one record per committed outcome");
    for (first, replay) in &replays {
        assert_eq!(first, replay, "every record holds its complete response");
        assert!(!replay.body.is_empty());
    }
    assert_eq!(replays.iter().map(|(s, _)| s.status).collect::<Vec<_>>(), vec![201, 201, 201, 200, 422, 200]);
}

fn replayed<T: Debug>(r: Idempotent<T>) -> StoredResponse {
    match r {
        Idempotent::Replayed(s) => s,
        other => panic!("expected a replay, got {other:?}"),
    }
}

// ---------------------------------------------------------------- operator

pub async fn abandon_moves_only_pending_or_claimed_payouts(db: Paydb) {
    db.account("acct", EUR, 10_000, at(0)).await;
    let pending = db.payout("acct", 100, at(1)).await;
    let claimed = db.payout("acct", 100, at(1)).await;
    db.claimed(claimed, 1, PayoutState::Pending, at(2)).await;
    assert_eq!(db.acct("acct").await.reserved_minor, 100);
    let fence = db.acct("acct").await.fence;
    for p in [pending, claimed] {
        assert_eq!(db.pay.abandon(p, at(3)).await, Ok(AbandonOutcome::Abandoned));
        let v = db.view(p).await;
        assert_eq!((v.state, v.updated_at), (PayoutState::Abandoned, at(3)));
    }
    let a = db.acct("acct").await;
    assert_eq!((a.reserved_minor, a.fence), (0, fence), "abandon releases the reservation and is unfenced");
    // Every other state refuses.
    let submitted = db.payout("acct", 100, at(4)).await;
    db.claimed(submitted, 2, PayoutState::Pending, at(4)).await;
    db.submit(submitted, 2, None, at(4)).await;
    let acked = db.payout("acct", 100, at(4)).await;
    db.acked(acked, 3, "RR-3", at(4)).await;
    let posted = db.payout("acct", 100, at(4)).await;
    db.posted(posted, 4, at(4)).await;
    let failed = db.payout("acct", 100, at(4)).await;
    db.claimed(failed, 6, PayoutState::Pending, at(4)).await;
    db.submit(failed, 6, Some(Resolution::Rejected { detail: "no".into() }), at(4)).await;
    let ambiguous = db.payout("acct", 100, at(4)).await;
    db.claimed(ambiguous, 7, PayoutState::Pending, at(4)).await;
    db.submit(ambiguous, 7, Some(Resolution::Timeout { detail: "?".into() }), at(4)).await;
    for (p, state) in [
        (submitted, PayoutState::Submitted),
        (acked, PayoutState::RailAcked),
        (posted, PayoutState::Posted),
        (failed, PayoutState::Failed),
        (ambiguous, PayoutState::RailAmbiguous),
        (pending, PayoutState::Abandoned),
    ] {
        let before = db.view(p).await;
        assert_eq!(db.pay.abandon(p, at(9)).await, Ok(AbandonOutcome::NotAbandonable { state }));
        assert_eq!(db.view(p).await, before);
    }
    assert_eq!(db.pay.abandon(Uuid::new_v4(), at(9)).await, Ok(AbandonOutcome::NotFound));
}

/// An operator's resolution of `payout_id` as `resolved_as`, with fresh ids.
pub fn resolution_of(payout_id: Uuid, resolved_as: PayoutState, now: DateTime<Utc>) -> AmbiguousResolution {
    AmbiguousResolution {
        resolution_id: Uuid::new_v4(),
        payout_id,
        resolved_as,
        operator: "ops-alice".into(),
        reason: "rail statement line checked by hand".into(),
        rail_reference: "RR-statement-1".into(),
        posting_id: Uuid::new_v4(),
        entry_ids: [Uuid::new_v4(), Uuid::new_v4()],
        at: now,
    }
}

impl Paydb {
    /// A payout of `amount` that was claimed and forwarded, and whose answer was lost.
    pub async fn ambiguous(&self, account: &str, amount: i64, token: i64, now: DateTime<Utc>) -> (Uuid, Uuid) {
        let p = self.payout(account, amount, now).await;
        self.claimed(p, token, PayoutState::Pending, now).await;
        let s = self.submit(p, token, Some(Resolution::Timeout { detail: "no answer".into() }), now).await;
        assert_eq!(self.state(p).await, PayoutState::RailAmbiguous);
        (p, s)
    }

    pub async fn resolutions(&self, payout_id: Option<Uuid>) -> Vec<ResolutionRow> {
        self.pay.resolutions(payout_id).await.expect("read resolutions")
    }
}

pub async fn resolve_as_posted_writes_balanced_entries_and_an_audit_row(db: Paydb) {
    db.account("acct", EUR, 1_000, at(0)).await;
    let (p, s) = db.ambiguous("acct", 600, 4, at(1)).await;
    let before = db.acct("acct").await;
    assert_eq!((before.balance_minor, before.reserved_minor, before.fence), (1_000, 600, 4));
    let r = resolution_of(p, PayoutState::Posted, at(50));
    assert_eq!(
        db.pay.resolve_ambiguous(&r).await,
        Ok(ResolveOutcome::Resolved { state: PayoutState::Posted, balance_minor: 400 })
    );
    let v = db.view(p).await;
    assert_eq!((v.state, v.updated_at, v.claim_token), (PayoutState::Posted, at(50), Some(4)));
    // The proxy's observation stays as it was: the verdict lives in the audit row.
    assert_eq!(v.submissions.len(), 1);
    assert_eq!((v.submissions[0].submission_id, v.submissions[0].outcome), (s, Some(SubmissionOutcome::Timeout)));
    // Two balanced entries, exactly as a post writes them, with fence 0 (no lock holder).
    let entry = |entry_id, account_id: String, direction| LedgerEntry {
        entry_id,
        posting_id: r.posting_id,
        payout_id: Some(p),
        account_id,
        direction,
        amount_minor: 600,
        currency: EUR.into(),
        fence: 0,
        created_at: at(50),
    };
    let debit = entry(r.entry_ids[0], "acct".into(), Direction::Debit);
    let credit = entry(r.entry_ids[1], settlement_account(EUR), Direction::Credit);
    assert_eq!(r.entries("acct", 600, EUR, at(50)), [debit.clone(), credit.clone()]);
    let mine: Vec<LedgerEntry> = db.ledger(None).await.into_iter().filter(|e| e.payout_id == Some(p)).collect();
    assert_eq!(mine, sorted_by_time_and_id(vec![debit, credit]));
    assert_eq!(ledger_totals(&db.ledger(None).await), (1_600, 1_600));
    // The balance follows the ledger, the reservation is gone, and the fence did not move.
    let a = db.acct("acct").await;
    assert_eq!((a.balance_minor, a.ledger_sum_minor, a.reserved_minor, a.fence), (400, 400, 0, 4));
    assert_eq!(db.acct(&settlement_account(EUR)).await.ledger_sum_minor, 600);
    // The audit row.
    let row = ResolutionRow {
        resolution_id: r.resolution_id,
        payout_id: p,
        resolved_as: PayoutState::Posted,
        operator: "ops-alice".into(),
        reason: "rail statement line checked by hand".into(),
        rail_reference: "RR-statement-1".into(),
        resolved_at: at(50),
    };
    assert_eq!(db.resolutions(Some(p)).await, vec![row.clone()]);
    assert_eq!(db.resolutions(None).await, vec![row]);
    assert_eq!(db.resolutions(Some(Uuid::new_v4())).await, vec![]);
    // Resolving again is refused and writes nothing: a payout leaves quarantine once.
    let again = resolution_of(p, PayoutState::Failed, at(60));
    assert_eq!(db.pay.resolve_ambiguous(&again).await, Ok(ResolveOutcome::NotAmbiguous { state: PayoutState::Posted }));
    assert_eq!((db.ledger(None).await.len(), db.resolutions(None).await.len()), (4, 1));
    assert_eq!(db.acct("acct").await, a);
    // Resolution needs no idempotency record: it is not a request.
    assert_eq!(db.records().await, 3);
}

pub async fn resolve_as_failed_releases_the_reservation(db: Paydb) {
    db.account("acct", EUR, 1_000, at(0)).await;
    let (p, _) = db.ambiguous("acct", 600, 1, at(1)).await;
    // While quarantined the amount stays reserved: a 500 payout does not fit.
    let q = db.payout("acct", 500, at(2)).await;
    assert_eq!(
        committed(db.claim(q, 2, PayoutState::Pending, at(3)).await),
        ClaimOutcome::InsufficientFunds { account_id: "acct".into(), amount_minor: 500, available_minor: 400 }
    );
    let ledger_before = db.ledger(None).await;
    let r = resolution_of(p, PayoutState::Failed, at(10));
    assert_eq!(
        db.pay.resolve_ambiguous(&r).await,
        Ok(ResolveOutcome::Resolved { state: PayoutState::Failed, balance_minor: 1_000 })
    );
    let v = db.view(p).await;
    assert_eq!((v.state, v.updated_at), (PayoutState::Failed, at(10)));
    // Only the state moved: no entry, the balance and the fence as they were.
    assert_eq!(db.ledger(None).await, ledger_before);
    let a = db.acct("acct").await;
    assert_eq!((a.balance_minor, a.ledger_sum_minor, a.reserved_minor, a.fence), (1_000, 1_000, 0, 2));
    let rows = db.resolutions(Some(p)).await;
    assert_eq!(rows.len(), 1);
    assert_eq!(
        (rows[0].resolution_id, rows[0].resolved_as, rows[0].resolved_at),
        (r.resolution_id, PayoutState::Failed, at(10))
    );
    // The released amount can be claimed again.
    let next = db.payout("acct", 900, at(11)).await;
    db.claimed(next, 3, PayoutState::Pending, at(12)).await;
    assert_eq!(db.acct("acct").await.reserved_minor, 900);
}

pub async fn resolve_is_refused_unless_rail_ambiguous(db: Paydb) {
    db.account("acct", EUR, 10_000, at(0)).await;
    let pending = db.payout("acct", 100, at(1)).await;
    let claimed = db.payout("acct", 100, at(1)).await;
    db.claimed(claimed, 1, PayoutState::Pending, at(2)).await;
    let submitted = db.payout("acct", 100, at(1)).await;
    db.claimed(submitted, 2, PayoutState::Pending, at(2)).await;
    db.submit(submitted, 2, None, at(2)).await;
    let acked = db.payout("acct", 100, at(1)).await;
    db.acked(acked, 3, "RR-3", at(2)).await;
    let posted = db.payout("acct", 100, at(1)).await;
    db.posted(posted, 4, at(2)).await;
    let failed = db.payout("acct", 100, at(1)).await;
    db.claimed(failed, 6, PayoutState::Pending, at(2)).await;
    db.submit(failed, 6, Some(Resolution::Rejected { detail: "no".into() }), at(2)).await;
    let abandoned = db.payout("acct", 100, at(1)).await;
    assert_eq!(db.pay.abandon(abandoned, at(2)).await, Ok(AbandonOutcome::Abandoned));
    let (ambiguous, _) = db.ambiguous("acct", 100, 7, at(2)).await;
    let before = (db.acct("acct").await, db.ledger(None).await);
    for (p, state) in [
        (pending, PayoutState::Pending),
        (claimed, PayoutState::Claimed),
        (submitted, PayoutState::Submitted),
        (acked, PayoutState::RailAcked),
        (posted, PayoutState::Posted),
        (failed, PayoutState::Failed),
        (abandoned, PayoutState::Abandoned),
    ] {
        for resolved_as in [PayoutState::Posted, PayoutState::Failed] {
            let view = db.view(p).await;
            let r = resolution_of(p, resolved_as, at(9));
            assert_eq!(db.pay.resolve_ambiguous(&r).await, Ok(ResolveOutcome::NotAmbiguous { state }), "{state:?}");
            assert_eq!(db.view(p).await, view);
        }
    }
    let unknown = resolution_of(Uuid::new_v4(), PayoutState::Posted, at(9));
    assert_eq!(db.pay.resolve_ambiguous(&unknown).await, Ok(ResolveOutcome::NotFound));
    // C2 allows only POSTED or FAILED out of quarantine; anything else is refused unwritten.
    for resolved_as in [PayoutState::Claimed, PayoutState::Pending, PayoutState::Abandoned, PayoutState::RailAmbiguous]
    {
        let r = resolution_of(ambiguous, resolved_as, at(9));
        assert!(matches!(db.pay.resolve_ambiguous(&r).await, Err(StoreError::Corrupt(_))), "{resolved_as:?}");
    }
    assert_eq!(db.state(ambiguous).await, PayoutState::RailAmbiguous);
    assert_eq!((db.acct("acct").await, db.ledger(None).await), before);
    assert_eq!(db.resolutions(None).await, vec![]);
}

pub async fn a_recorded_resolution_commits_with_its_answer_replays_it_and_records_no_refusal(db: Paydb) {
    db.account("acct", EUR, 1_000, at(0)).await;
    let (p, _) = db.ambiguous("acct", 600, 4, at(1)).await;
    let pending = db.payout("acct", 100, at(2)).await;
    let records = db.records().await;
    let refused = |outcome| Ok(Idempotent::Executed { outcome, stored: None });
    // Refusals roll back, identity row included: nothing is recorded, each is judged afresh.
    let i = idem(Operation::Resolve, &pending.to_string(), "k-1", 0, &fingerprint(), at(5));
    let r = resolution_of(pending, PayoutState::Posted, at(5));
    assert_eq!(
        db.pay.resolve_recorded(&r, &i).await,
        refused(ResolveOutcome::NotAmbiguous { state: PayoutState::Pending })
    );
    let unknown = Uuid::new_v4();
    let i = idem(Operation::Resolve, &unknown.to_string(), "k-1", 0, &fingerprint(), at(5));
    assert_eq!(
        db.pay.resolve_recorded(&resolution_of(unknown, PayoutState::Failed, at(5)), &i).await,
        refused(ResolveOutcome::NotFound)
    );
    assert_eq!(db.records().await, records);
    assert_eq!(db.state(pending).await, PayoutState::Pending);
    // A resolution commits with its answer, in one transaction: the state, the entries, the
    // audit row and the identity row.
    let i = idem(Operation::Resolve, &p.to_string(), "k-1", 0, &fingerprint(), at(10));
    let r = resolution_of(p, PayoutState::Posted, at(10));
    let stored = recorded(db.pay.resolve_recorded(&r, &i).await.expect("resolve"));
    assert_eq!(stored.status, 200);
    assert_eq!(db.records().await, records + 1);
    assert_eq!(db.state(p).await, PayoutState::Posted);
    let a = db.acct("acct").await;
    assert_eq!((a.balance_minor, a.ledger_sum_minor, a.reserved_minor, a.fence), (400, 400, 0, 4));
    assert_eq!(db.resolutions(Some(p)).await.len(), 1);
    // The same request again replays the recorded bytes and runs nothing; another request
    // under its identity is a conflict and runs nothing.
    let again = resolution_of(p, PayoutState::Posted, at(11));
    let later = IdemRequest { at: at(11), ..i.clone() };
    assert_eq!(db.pay.resolve_recorded(&again, &later).await, Ok(Idempotent::Replayed(stored)));
    let other = IdemRequest { fingerprint: fingerprint(), ..later };
    assert_eq!(db.pay.resolve_recorded(&again, &other).await, Ok(Idempotent::Conflict));
    assert_eq!((db.resolutions(None).await.len(), db.records().await), (1, records + 1));
    assert_eq!(db.acct("acct").await, a);
}

// ---------------------------------------------------------------- cursor key

pub async fn cursor_secret_is_stored_once_and_then_returned(db: Paydb) {
    db.pay.ping().await.expect("ping");
    let first = db.pay.cursor_secret([7; 32], at(0)).await.expect("secret");
    assert_eq!(first, [7; 32], "the first candidate is stored");
    // Every later candidate (another replica, a restart) gets the stored key.
    assert_eq!(db.pay.cursor_secret([9; 32], at(1)).await, Ok([7; 32]));
    assert_eq!(db.pay.cursor_secret([0; 32], at(2)).await, Ok([7; 32]));
}

/// Declares one test per case for a backend. `$make` is an async block that yields
/// `(Arc<dyn PaymentStore>, Arc<dyn RailStore>, Arc<dyn Operator>)` over one fresh paydb;
/// the operator also keeps the database alive for the test's length.
#[macro_export]
macro_rules! payment_store_conformance {
    ($backend:ident, $make:expr) => {
        mod $backend {
            #[allow(unused_imports)]
            use super::*;
            use super::conformance as c;
            $crate::payment_store_conformance!(@cases $make;
                create_account_posts_the_opening_balance_against_the_funding_account,
                create_account_with_zero_opening_balance_writes_no_entries,
                create_account_twice_is_refused_without_a_second_entry,
                create_payout_is_pending_and_reserves_nothing,
                create_payout_for_an_unknown_account_or_other_currency_is_refused,
                claim_moves_pending_to_claimed_and_raises_the_fence_to_the_token,
                claim_with_an_equal_or_lower_token_is_fenced_and_changes_nothing,
                reclaim_by_a_newer_token_keeps_claimed_and_raises_the_fence,
                claim_of_a_payout_not_in_the_expected_state_is_not_claimable_and_keeps_the_fence,
                claim_that_would_overdraw_fails_the_payout_and_raises_the_fence,
                available_balance_counts_every_unsettled_payout,
                claim_of_an_unknown_payout_is_not_found,
                post_writes_two_balanced_entries_and_debits_the_balance,
                post_requires_rail_acked_and_a_matching_acknowledged_attempt,
                post_with_an_equal_or_lower_token_is_fenced_as_a_ledger_write,
                post_of_a_posted_payout_is_not_claimable_and_writes_nothing,
                account_view_recomputes_the_ledger_sum,
                payout_view_lists_its_submissions_in_order,
                listing_pages_in_created_order_without_repeats_or_gaps,
                pages_are_stable_under_concurrent_inserts,
                listing_bounds_rows_below_by_created_after,
                listing_filters_by_state_and_account,
                proxy_transitions_and_claims_share_one_payout_state_machine,
                a_payout_failed_for_funds_is_never_admitted_by_the_proxy,
                rail_ambiguous_keeps_its_reservation_until_an_operator_resolves_it,
                replay_returns_the_stored_bytes_after_the_state_moved_on,
                same_identity_with_another_fingerprint_is_a_conflict_and_changes_nothing,
                concurrent_duplicates_execute_once_and_replay_the_same_bytes,
                expired_record_is_evaluated_afresh_and_purged,
                a_newer_token_under_the_same_key_is_a_new_request_judged_by_the_fence,
                refusals_are_not_recorded_and_are_judged_afresh,
                purge_is_bounded_by_its_batch,
                no_committed_record_lacks_its_response,
                abandon_moves_only_pending_or_claimed_payouts,
                resolve_as_posted_writes_balanced_entries_and_an_audit_row,
                resolve_as_failed_releases_the_reservation,
                resolve_is_refused_unless_rail_ambiguous,
                a_recorded_resolution_commits_with_its_answer_replays_it_and_records_no_refusal,
                cursor_secret_is_stored_once_and_then_returned,
                a_batch_claim_passes_the_fence_once_and_raises_it_to_the_token,
                a_batch_claim_with_an_equal_or_lower_token_is_fenced_and_writes_nothing,
                a_batch_claim_decides_each_payout_on_the_reservation_the_earlier_ones_left,
                a_batch_claim_refuses_unclaimable_foreign_and_missing_payouts_and_changes_nothing_for_them,
                a_batch_where_no_payout_moves_leaves_no_fence_no_identity_and_nothing_else,
                a_batch_replays_its_recorded_bytes_and_another_body_under_its_key_and_token_conflicts,
                a_batch_post_writes_two_balanced_entries_per_payout_and_the_balance_follows,
                a_batch_post_refuses_only_the_payout_whose_attempt_does_not_match,
                every_change_writes_its_event_in_its_own_transaction_on_every_backend,
                a_refused_write_leaves_no_event_but_a_fenced_out_one_leaves_its_refusal,
                event_reads_page_by_their_final_head,
                the_purge_keeps_the_newest_events_and_never_reuses_a_seq
            );
        }
    };
    (@cases $make:expr; $($case:ident),*) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $case() {
                let (pay, rail, operator) = $make.await;
                c::$case(c::Paydb { pay: c::Pay(pay), rail, operator }).await;
            }
        )*
    };
}
