//! The ledger's invariants under random interleavings of creates, claims, rail attempts,
//! posts and abandons, with fresh, equal and stale tokens (docs/design/payment-resource.md
//! §8 item 4). Each case runs on a fresh paydb, opened as the payment-resource's store and
//! as the proxy's, on a current-thread runtime: 256 cases in memory, 16 on SQLite, 8 on
//! PostgreSQL (`DLOCK_TEST_PG_URL`; like every PostgreSQL test here, it fails loudly when
//! the variable is unset rather than pass by skipping).
//!
//! After **every** step: each CUSTOMER balance equals its ledger sum; Σ DEBIT = Σ CREDIT;
//! balance − reserved ≥ 0; no fence falls (and each equals the highest token that
//! committed); system accounts hold no balance and no fence; a POSTED payout has exactly its
//! two entries and no other payout has any. At every claim and post, an equal or stale token
//! is `Fenced` with the stored fence, and a fresh one is judged exactly as the model says.

#![cfg(not(madsim))]

use std::collections::BTreeMap;
use std::sync::Arc;

use chrono::{DateTime, Duration, Utc};
use dlock_contract::payout::PayoutState;
use dlock_contract::rail::SubmissionOutcome;
use dlock_payment_resource::store::{
    is_unsettled, settlement_account, AbandonOutcome, AccountKind, Claim, ClaimOutcome, CreateAccountOutcome,
    CreatePayoutOutcome, Direction, IdemRequest, Idempotent, ListQuery, NewAccount, NewPayout, Operation, PaymentStore,
    PayoutSummary, Post, PostOutcome, SingleWrites,
};
use dlock_payment_resource::store_mem::MemPaydb;
use dlock_rail_proxy::store::{Admission, Attempt, RailStore, Resolution};
use proptest::collection::vec;
use proptest::prelude::*;
use proptest::test_runner::FileFailurePersistence;
use uuid::Uuid;

const CASES_MEMORY: u32 = 256;
const CASES_SQLITE: u32 = 16;
const CASES_POSTGRES: u32 = 8;

/// How a claim's or post's token relates to the account's stored fence.
#[derive(Debug, Clone, Copy)]
enum Token {
    /// A new grant from the lock server: above every token issued for the account.
    Fresh,
    /// Exactly the stored fence (skipped while the fence is 0: no valid token equals it).
    Equal,
    /// Strictly below the stored fence, and ≥ 1 (skipped while the fence is below 2).
    Stale(u8),
}

#[derive(Debug, Clone, Copy)]
enum Rail {
    Ack,
    Reject,
    Timeout,
    Unsent,
}

#[derive(Debug, Clone)]
enum Op {
    CreateAccount {
        opening: i64,
        usd: bool,
    },
    CreatePayout {
        account: usize,
        amount: i64,
    },
    /// `reclaim`: the claim expects CLAIMED (recovery), else PENDING.
    Claim {
        payout: Pick,
        token: Token,
        reclaim: bool,
    },
    /// Through `RailStore::admit` and, when admitted, `resolve`. `fresh`: a new grant,
    /// else the payout's claim token (the executor's usual flow).
    Submit {
        payout: Pick,
        outcome: Rail,
        fresh: bool,
    },
    Post {
        payout: Pick,
        token: Token,
    },
    Abandon {
        payout: Pick,
    },
}

/// Which payout an operation names: an index taken modulo the live set, which is every
/// payout, or (`targeted`, mostly) those in a state where the operation can commit, so that
/// random sequences still reach the rail and the ledger.
#[derive(Debug, Clone, Copy)]
struct Pick {
    index: usize,
    targeted: bool,
}

fn pick() -> impl Strategy<Value = Pick> {
    (0usize..32, prop::bool::weighted(0.75)).prop_map(|(index, targeted)| Pick { index, targeted })
}

fn token() -> impl Strategy<Value = Token> {
    prop_oneof![3 => Just(Token::Fresh), 1 => Just(Token::Equal), 1 => any::<u8>().prop_map(Token::Stale)]
}

fn op() -> impl Strategy<Value = Op> {
    let rail =
        prop_oneof![4 => Just(Rail::Ack), 1 => Just(Rail::Reject), 1 => Just(Rail::Timeout), 1 => Just(Rail::Unsent)];
    prop_oneof![
        2 => (0i64..=2_000, any::<bool>()).prop_map(|(opening, usd)| Op::CreateAccount { opening, usd }),
        4 => (0usize..16, 1i64..=600).prop_map(|(account, amount)| Op::CreatePayout { account, amount }),
        5 => (pick(), token(), prop::bool::weighted(0.2))
            .prop_map(|(payout, token, reclaim)| Op::Claim { payout, token, reclaim }),
        5 => (pick(), rail, prop::bool::weighted(0.2))
            .prop_map(|(payout, outcome, fresh)| Op::Submit { payout, outcome, fresh }),
        5 => (pick(), token()).prop_map(|(payout, token)| Op::Post { payout, token }),
        1 => (0usize..32, prop::bool::weighted(0.3))
            .prop_map(|(index, targeted)| Op::Abandon { payout: Pick { index, targeted } }),
    ]
}

/// How the store answers this test's single writes (the key and trace id it records).
fn render() -> dlock_payment_resource::answer::Answering {
    dlock_payment_resource::answer::Answering {
        shape: dlock_payment_resource::answer::Shape::Single,
        key: "test-key".into(),
        trace_id: "test-trace".into(),
    }
}

fn t0() -> DateTime<Utc> {
    DateTime::<Utc>::from_timestamp_millis(1_795_000_000_000).expect("valid instant")
}

/// The case's paydb and what the test knows about it.
struct World {
    pay: Arc<dyn PaymentStore>,
    rail: Arc<dyn RailStore>,
    /// CUSTOMER accounts and their currencies, in creation order.
    accounts: Vec<(String, String)>,
    payouts: Vec<Uuid>,
    /// The lock server: the highest token issued per account.
    issued: BTreeMap<String, i64>,
    /// The highest token that committed a claim or post, per account.
    committed: BTreeMap<String, i64>,
    /// Fences and marks as last observed.
    fences: BTreeMap<String, i64>,
    marks: BTreeMap<String, i64>,
    clock_ms: i64,
}

struct Before {
    state: PayoutState,
    amount: i64,
    currency: String,
    attempt_count: i32,
    claim_token: Option<i64>,
    account: String,
    balance: i64,
    /// Σ amount of the account's other unsettled payouts.
    reserved_other: i64,
    fence: i64,
}

fn idem(operation: Operation, target: String, token: i64, at: DateTime<Utc>) -> IdemRequest {
    IdemRequest {
        operation,
        target_id: target,
        key: format!("key-{}", Uuid::new_v4().simple()),
        token,
        owner_id: "worker".into(),
        fingerprint: format!("{}{}", Uuid::new_v4().simple(), Uuid::new_v4().simple()),
        at,
        expires_at: at + Duration::hours(24),
    }
}

impl World {
    fn new(pay: Arc<dyn PaymentStore>, rail: Arc<dyn RailStore>) -> World {
        World {
            pay,
            rail,
            accounts: Vec::new(),
            payouts: Vec::new(),
            issued: BTreeMap::new(),
            committed: BTreeMap::new(),
            fences: BTreeMap::new(),
            marks: BTreeMap::new(),
            clock_ms: 0,
        }
    }

    fn tick(&mut self) -> DateTime<Utc> {
        self.clock_ms += 1;
        t0() + Duration::milliseconds(self.clock_ms)
    }

    fn fresh_token(&mut self, account: &str) -> i64 {
        let t = self.issued.entry(account.to_owned()).or_insert(0);
        *t += 1;
        *t
    }

    /// The token a claim or post presents, or `None` when the kind is impossible now.
    fn token(&mut self, kind: Token, account: &str, fence: i64) -> Option<i64> {
        match kind {
            Token::Fresh => Some(self.fresh_token(account)),
            Token::Equal => (fence > 0).then_some(fence),
            Token::Stale(k) => (fence >= 2).then(|| 1 + i64::from(k) % (fence - 1)),
        }
    }

    /// The payout `p` names: among those in `states` when targeted (and any exist), else
    /// among all.
    async fn pick(&self, p: Pick, states: &[PayoutState]) -> Option<Uuid> {
        if p.targeted {
            let listed = self.all_payouts().await;
            let live: Vec<Uuid> = self
                .payouts
                .iter()
                .copied()
                .filter(|id| listed.iter().any(|l| l.payout_id == *id && states.contains(&l.state)))
                .collect();
            if !live.is_empty() {
                return Some(live[p.index % live.len()]);
            }
        }
        (!self.payouts.is_empty()).then(|| self.payouts[p.index % self.payouts.len()])
    }

    /// What the model needs of a payout and its account before an operation.
    async fn before(&self, payout: Uuid) -> Before {
        let p = self.pay.payout(payout).await.expect("read payout").expect("payout exists");
        let a = self.pay.account(&p.account_id).await.expect("read account").expect("account exists");
        let own = if is_unsettled(p.state) { p.amount_minor } else { 0 };
        Before {
            state: p.state,
            amount: p.amount_minor,
            currency: p.currency,
            attempt_count: p.attempt_count,
            claim_token: p.claim_token,
            account: p.account_id,
            balance: a.balance_minor,
            reserved_other: a.reserved_minor - own,
            fence: a.fence,
        }
    }

    async fn step(&mut self, op: &Op) {
        let at = self.tick();
        match *op {
            Op::CreateAccount { opening, usd } => {
                let id = format!("acct-{}", self.accounts.len());
                let currency = if usd { "USD" } else { "EUR" };
                let a = NewAccount {
                    account_id: id.clone(),
                    currency: currency.into(),
                    opening_balance_minor: opening,
                    posting_id: Uuid::new_v4(),
                    entry_ids: [Uuid::new_v4(), Uuid::new_v4()],
                    at,
                };
                let i = idem(Operation::CreateAccount, "accounts".into(), 0, at);
                let r = self.pay.create_account(&a, &i, &render()).await.expect("create account");
                assert!(matches!(
                    r,
                    Idempotent::Executed { outcome: CreateAccountOutcome::Created(_), stored: Some(_) }
                ));
                self.accounts.push((id, currency.into()));
            }
            Op::CreatePayout { account, amount } => {
                if self.accounts.is_empty() {
                    return;
                }
                let (account_id, currency) = self.accounts[account % self.accounts.len()].clone();
                let p = NewPayout {
                    payout_id: Uuid::new_v4(),
                    account_id,
                    amount_minor: amount,
                    currency,
                    beneficiary_ref: "ben".into(),
                    at,
                };
                let i = idem(Operation::CreatePayout, "payouts".into(), 0, at);
                let r = self.pay.create_payout(&p, &i, &render()).await.expect("create payout");
                assert!(matches!(
                    r,
                    Idempotent::Executed { outcome: CreatePayoutOutcome::Created(_), stored: Some(_) }
                ));
                self.payouts.push(p.payout_id);
            }
            Op::Claim { payout, token, reclaim } => {
                let target = if reclaim { PayoutState::Claimed } else { PayoutState::Pending };
                let Some(payout_id) = self.pick(payout, &[target]).await else { return };
                let Before { state, amount, currency, account, balance, reserved_other, fence, attempt_count, .. } =
                    self.before(payout_id).await;
                let Some(presented) = self.token(token, &account, fence) else { return };
                let expected = if reclaim { PayoutState::Claimed } else { PayoutState::Pending };
                let c = Claim { payout_id, token: presented, owner_id: "worker".into(), expected, at };
                let i = idem(Operation::Claim, payout_id.to_string(), presented, at);
                let r = self.pay.claim_one(&c, &i, &render()).await.expect("claim");
                let (outcome, stored) = match r {
                    Idempotent::Executed { outcome, stored } => (outcome, stored),
                    other => panic!("a fresh identity executes: {other:?}"),
                };
                let model = if presented <= fence {
                    ClaimOutcome::Fenced { account_id: account.clone(), highest_token: fence }
                } else if state != expected {
                    ClaimOutcome::NotClaimable { state }
                } else if balance - reserved_other >= amount {
                    ClaimOutcome::Claimed {
                        account_id: account.clone(),
                        account_fence: presented,
                        attempt_count,
                        reclaimed: reclaim,
                        amount_minor: amount,
                        currency,
                        beneficiary_ref: "ben".into(),
                    }
                } else {
                    ClaimOutcome::InsufficientFunds {
                        account_id: account.clone(),
                        amount_minor: amount,
                        available_minor: balance - reserved_other,
                    }
                };
                if !matches!(token, Token::Fresh) {
                    assert!(matches!(model, ClaimOutcome::Fenced { .. }), "{token:?} {presented} vs fence {fence}");
                }
                assert_eq!(outcome, model, "claim {token:?} {presented} of a {state:?} payout, fence {fence}");
                let commits = matches!(outcome, ClaimOutcome::Claimed { .. } | ClaimOutcome::InsufficientFunds { .. });
                assert_eq!(stored.is_some(), commits);
                if commits {
                    self.committed.insert(account, presented);
                }
            }
            Op::Submit { payout, outcome, fresh } => {
                let Some(payout_id) = self.pick(payout, &[PayoutState::Claimed]).await else { return };
                let Before { state, amount, account, claim_token, currency, .. } = self.before(payout_id).await;
                let presented = match claim_token {
                    Some(t) if !fresh => t,
                    _ => self.fresh_token(&account),
                };
                let a = Attempt {
                    submission_id: Uuid::new_v4(),
                    payout_id,
                    account_id: account,
                    presented_token: presented,
                    owner_id: "worker".into(),
                    idempotency_key: format!("payout:{payout_id}"),
                    amount_minor: amount,
                    currency,
                    at,
                    fencing_enabled: true,
                };
                let admission = self.rail.admit(&a).await.expect("admit");
                if let Admission::Admitted { .. } = admission {
                    assert_eq!(state, PayoutState::Claimed, "only a CLAIMED payout is admitted");
                    let resolution = match outcome {
                        Rail::Ack => Resolution::Acked { rail_reference: format!("RR-{}", a.submission_id) },
                        Rail::Reject => Resolution::Rejected { detail: "declined".into() },
                        Rail::Timeout => Resolution::Timeout { detail: "no answer".into() },
                        Rail::Unsent => Resolution::Unsent { detail: "refused".into() },
                    };
                    self.rail.resolve(a.submission_id, &resolution, at).await.expect("resolve");
                }
            }
            Op::Post { payout, token } => {
                let Some(payout_id) = self.pick(payout, &[PayoutState::RailAcked]).await else { return };
                let Before { state, amount, account, balance, fence, .. } = self.before(payout_id).await;
                let Some(presented) = self.token(token, &account, fence) else { return };
                let submissions = self.rail.submissions(Some(payout_id)).await.expect("submissions");
                let acked = submissions.iter().find(|s| s.outcome == Some(SubmissionOutcome::Acked));
                let (submission_id, reference) = match acked {
                    Some(s) => (s.submission_id, s.rail_reference.clone().unwrap_or_default()),
                    None => (Uuid::new_v4(), "RR-none".into()),
                };
                let p = Post {
                    payout_id,
                    token: presented,
                    owner_id: "worker".into(),
                    submission_id,
                    rail_reference: reference,
                    posting_id: Uuid::new_v4(),
                    entry_ids: [Uuid::new_v4(), Uuid::new_v4()],
                    at,
                };
                let i = idem(Operation::Post, payout_id.to_string(), presented, at);
                let r = self.pay.post_one(&p, &i, &render()).await.expect("post");
                let (outcome, stored) = match r {
                    Idempotent::Executed { outcome, stored } => (outcome, stored),
                    other => panic!("a fresh identity executes: {other:?}"),
                };
                if presented <= fence {
                    assert!(!matches!(token, Token::Fresh));
                    assert_eq!(outcome, PostOutcome::Fenced { account_id: account, highest_token: fence });
                    assert!(stored.is_none());
                } else if state != PayoutState::RailAcked {
                    assert_eq!(outcome, PostOutcome::NotClaimable { state });
                    assert!(stored.is_none());
                } else {
                    let PostOutcome::Posted { account_id, entries, balance_minor } = &outcome else {
                        panic!("a fresh post of a RAIL_ACKED payout posts: {outcome:?}")
                    };
                    assert_eq!((account_id, *balance_minor), (&account, balance - amount));
                    assert_eq!(entries.iter().map(|e| e.amount_minor).collect::<Vec<_>>(), vec![amount, amount]);
                    assert!(stored.is_some());
                    self.committed.insert(account, presented);
                }
                if !matches!(token, Token::Fresh) {
                    assert!(presented <= fence, "{token:?} {presented} vs fence {fence}");
                }
            }
            Op::Abandon { payout } => {
                let live = [PayoutState::Pending, PayoutState::Claimed];
                let Some(payout_id) = self.pick(payout, &live).await else { return };
                let state = self.before(payout_id).await.state;
                let r = self.pay.abandon(payout_id, at).await.expect("abandon");
                let model = if matches!(state, PayoutState::Pending | PayoutState::Claimed) {
                    AbandonOutcome::Abandoned
                } else {
                    AbandonOutcome::NotAbandonable { state }
                };
                assert_eq!(r, model);
            }
        }
    }

    async fn all_payouts(&self) -> Vec<PayoutSummary> {
        let mut all = Vec::new();
        for state in PayoutState::ALL {
            let q = ListQuery {
                state,
                account_id: None,
                snapshot: t0() + Duration::days(365),
                created_after: None,
                after: None,
                limit: 10_000,
            };
            all.extend(self.pay.list(&q).await.expect("list"));
        }
        all
    }

    async fn check_invariants(&mut self, after: &Op) {
        let accounts = self.pay.accounts().await.expect("accounts");
        let ledger = self.pay.ledger(None).await.expect("ledger");
        let payouts = self.all_payouts().await;
        assert_eq!(payouts.len(), self.payouts.len(), "every payout is listed once");
        // Σ DEBIT = Σ CREDIT.
        let total = |d| ledger.iter().filter(|e| e.direction == d).map(|e| i128::from(e.amount_minor)).sum::<i128>();
        assert_eq!(total(Direction::Debit), total(Direction::Credit), "after {after:?}");
        for a in &accounts {
            let fence = a.fence;
            let previous = self.fences.insert(a.account_id.clone(), fence).unwrap_or(0);
            assert!(fence >= previous, "{}'s fence fell from {previous} to {fence} after {after:?}", a.account_id);
            if a.kind != AccountKind::Customer {
                assert_eq!((a.balance_minor, a.fence, a.reserved_minor), (0, 0, 0), "{a:?}");
                continue;
            }
            assert_eq!(fence, self.committed.get(&a.account_id).copied().unwrap_or(0), "{a:?} after {after:?}");
            assert_eq!(a.balance_minor, a.ledger_sum_minor, "FR-25 for {a:?} after {after:?}");
            let reserved: i64 = payouts
                .iter()
                .filter(|p| p.account_id == a.account_id && is_unsettled(p.state))
                .map(|p| p.amount_minor)
                .sum();
            assert_eq!(a.reserved_minor, reserved, "{a:?}");
            assert!(a.balance_minor - a.reserved_minor >= 0, "overdrawn: {a:?} after {after:?}");
            let mark = self.rail.high_water(&a.account_id).await.expect("mark").unwrap_or(0);
            let previous = self.marks.insert(a.account_id.clone(), mark).unwrap_or(0);
            assert!(mark >= previous, "{}'s mark fell from {previous} to {mark}", a.account_id);
        }
        for p in &payouts {
            let entries: Vec<_> = ledger.iter().filter(|e| e.payout_id == Some(p.payout_id)).collect();
            if p.state == PayoutState::Posted {
                assert_eq!(entries.len(), 2, "a POSTED payout has exactly two entries: {p:?}");
                let debit = entries.iter().find(|e| e.direction == Direction::Debit).expect("a debit");
                let credit = entries.iter().find(|e| e.direction == Direction::Credit).expect("a credit");
                assert_eq!((debit.account_id.as_str(), debit.amount_minor), (p.account_id.as_str(), p.amount_minor));
                assert_eq!(
                    (credit.account_id.clone(), credit.amount_minor),
                    (settlement_account(&p.currency), p.amount_minor)
                );
                assert_eq!(debit.fence, credit.fence);
                assert_eq!(debit.posting_id, credit.posting_id);
            } else {
                assert!(entries.is_empty(), "only a POSTED payout has entries: {p:?}");
            }
        }
    }
}

async fn run_ops(pay: Arc<dyn PaymentStore>, rail: Arc<dyn RailStore>, ops: &[Op]) {
    let mut world = World::new(pay, rail);
    for op in ops {
        world.step(op).await;
        world.check_invariants(op).await;
    }
}

/// `cases` cases; a failing case is kept beside this file (an integration test has no
/// `lib.rs` for proptest's default to find).
fn config(cases: u32) -> ProptestConfig {
    ProptestConfig {
        failure_persistence: Some(Box::new(FileFailurePersistence::WithSource("proptest-regressions"))),
        ..ProptestConfig::with_cases(cases)
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime")
}

mod memory {
    use super::*;

    #[test]
    fn ledger_invariants_hold_under_random_operations_with_stale_tokens() {
        proptest!(config(CASES_MEMORY), |(ops in vec(op(), 1..40))| {
            runtime().block_on(async {
                let paydb = Arc::new(MemPaydb::new());
                run_ops(paydb.clone(), paydb, &ops).await;
            });
        });
    }
}

mod sqlite {
    use super::*;
    use dlock_payment_resource::store_sql::SqlitePaymentStore;
    use dlock_rail_proxy::store_sql::SqliteRailStore;
    use dlock_testkit::{fresh_database, Db};

    #[test]
    fn ledger_invariants_hold_under_random_operations_with_stale_tokens() {
        proptest!(config(CASES_SQLITE), |(ops in vec(op(), 1..40))| {
            runtime().block_on(async {
                let (url, _dir) = fresh_database(Db::Sqlite).await;
                let pay = SqlitePaymentStore::open(&url).await.expect("open sqlite payment store");
                let rail = SqliteRailStore::open(&url).await.expect("open sqlite rail store");
                run_ops(Arc::new(pay), Arc::new(rail), &ops).await;
            });
        });
    }
}

mod postgres {
    use super::*;
    use dlock_payment_resource::store_sql::PgPaymentStore;
    use dlock_rail_proxy::store_sql::PgRailStore;

    #[test]
    fn ledger_invariants_hold_under_random_operations_with_stale_tokens() {
        // Fails loudly, once, when DLOCK_TEST_PG_URL is unset.
        let admin = dlock_testkit::pg_admin_url();
        proptest!(config(CASES_POSTGRES), |(ops in vec(op(), 1..40))| {
            runtime().block_on(async {
                let url = dlock_testkit::pg_database_on(&admin).await;
                let pay = PgPaymentStore::open(&url).await.expect("open postgres payment store");
                let rail = PgRailStore::open(&url).await.expect("open postgres rail store");
                run_ops(Arc::new(pay), Arc::new(rail), &ops).await;
            });
        });
    }
}
