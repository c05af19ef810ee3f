//! The reconciler, finding by finding (FR-26). Each test builds one state of paydb through
//! the stores the services use (the simulation store `MemPaydb`, whose `with_tables` stands
//! in for hand-run SQL when a test needs a corruption no service can write), drives a real
//! rail-stub on loopback for the rail's own record, runs the reconciler at an explicit
//! "now", and checks the one finding the state must produce. The last tests run the same
//! reconciler, and `dlock resolve`, over SQLite and PostgreSQL paydbs through the CLI entry
//! points.

#![cfg(not(madsim))]

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;

use chrono::{DateTime, Duration, Utc};
use dlock_contract::payout::PayoutState;
use dlock_contract::rail::SubmissionOutcome;
use dlock_paydb::StoreError;
use dlock_payment_resource::store::{
    funding_account, AccountView, AmbiguousResolution, Claim, ClaimOutcome, CreateAccountOutcome, CreatePayoutOutcome,
    Direction, IdemRequest, Idempotent, LedgerEntry, ListQuery, NewAccount, NewPayout, Operation, PaymentStore,
    PayoutSummary, PayoutView, Post, PostOutcome, ResolutionRow, ResolveOutcome, SingleWrites,
};
use dlock_payment_resource::store_mem::MemPaydb;
use dlock_rail_proxy::store::{self as rail, Admission, Attempt, RailStore, Resolution};
use dlock_rail_stub::RailStub;
use dlock_reconciler::budget::ReadBudget;
use dlock_reconciler::cli::{reconcile_once, run_resolve, ReconcileSettings, ResolveArgs};
use dlock_reconciler::rail::HttpRailRecord;
use dlock_reconciler::report::{AmbiguousClass, EXIT_CLEAN, EXIT_INCIDENT, EXIT_INCOMPLETE, FENCED_OUT_NOTE};
use dlock_reconciler::resolve::{ResolveAs, ResolveRequest};
use dlock_reconciler::store::ReconcileStore;
use dlock_reconciler::{reconcile, Bounds, FindingKind, Params, Paydb, Report, Severity};
use dlock_rt::http::{BaseUrl, HttpClient};
use dlock_rt::Clock;
use uuid::Uuid;

const EUR: &str = "EUR";

fn t0() -> DateTime<Utc> {
    DateTime::<Utc>::from_timestamp_millis(1_795_000_000_000).expect("valid instant")
}

fn at(ms: i64) -> DateTime<Utc> {
    t0() + Duration::milliseconds(ms)
}

/// C3's budget with short pauses: an unreachable source fails in well under a second.
fn budget() -> ReadBudget {
    ReadBudget { retry_pause_ms: 10, ..ReadBudget::default() }
}

/// How the store answers this test's single writes (the key and trace id it records).
fn render() -> dlock_payment_resource::answer::Answering {
    dlock_payment_resource::answer::Answering {
        shape: dlock_payment_resource::answer::Shape::Single,
        key: "test-key".into(),
        trace_id: "test-trace".into(),
    }
}

fn idem(operation: Operation, target: &str, token: i64, now: DateTime<Utc>) -> IdemRequest {
    IdemRequest {
        operation,
        target_id: target.to_owned(),
        key: format!("key-{}", Uuid::new_v4().simple()),
        token,
        owner_id: "worker-1".into(),
        fingerprint: format!("{}{}", Uuid::new_v4().simple(), Uuid::new_v4().simple()),
        at: now,
        expires_at: now + Duration::days(1),
    }
}

fn committed<T: std::fmt::Debug>(r: Idempotent<T>) -> T {
    match r {
        Idempotent::Executed { outcome, stored: Some(_) } => outcome,
        other => panic!("expected a committed outcome, got {other:?}"),
    }
}

/// A rail-stub started through its entry point on loopback, its knobs set by `knobs` (C5
/// keys `rail.stub.*`); dropping the sender stops it.
async fn serve_stub(knobs: &[(&str, &str)]) -> (Arc<RailStub>, BaseUrl, tokio::sync::oneshot::Sender<()>) {
    let cfg = dlock_rail_stub::config::resolve(&dlock_config::Layers::of(knobs), dlock_config::Profile::Production)
        .expect("stub settings")
        .config;
    let listener = dlock_rt::http::bind("127.0.0.1:0".parse().expect("addr")).await.expect("bind");
    let base = BaseUrl::parse(&format!("http://{}", listener.local_addr().expect("addr"))).expect("url");
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let h = dlock_rail_stub::start(cfg, Clock::system(), listener, async {
        let _ = rx.await;
    })
    .await
    .expect("stub");
    (h.service.clone(), base, tx)
}

/// A base URL nobody listens on.
async fn closed_port() -> BaseUrl {
    let listener = dlock_rt::http::bind("127.0.0.1:0".parse().expect("addr")).await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    drop(listener);
    BaseUrl::parse(&format!("http://{addr}")).expect("url")
}

/// One paydb (as both stores), one rail-stub, and a token source.
struct World {
    pay: Arc<dyn PaymentStore>,
    rail: Arc<dyn RailStore>,
    mem: Option<Arc<MemPaydb>>,
    stub: Arc<RailStub>,
    base: BaseUrl,
    next_token: AtomicI64,
    _stop: tokio::sync::oneshot::Sender<()>,
    _dir: Option<dlock_testkit::TempDir>,
    url: Option<String>,
}

async fn world() -> World {
    world_with(&[]).await
}

async fn world_with(knobs: &[(&str, &str)]) -> World {
    let mem = Arc::new(MemPaydb::new());
    let (stub, base, stop) = serve_stub(knobs).await;
    World {
        pay: mem.clone(),
        rail: mem.clone(),
        mem: Some(mem),
        stub,
        base,
        next_token: AtomicI64::new(1),
        _stop: stop,
        _dir: None,
        url: None,
    }
}

/// A fresh SQL paydb (migrated by the services' own `open`).
async fn sql_world(kind: dlock_testkit::Db) -> World {
    let (url, dir) = dlock_testkit::fresh_database(kind).await;
    let pay = dlock_payment_resource::store_sql::open(&url).await.expect("open payment store");
    let rail = dlock_rail_proxy::store_sql::open(&url).await.expect("open rail store");
    let (stub, base, stop) = serve_stub(&[]).await;
    World {
        pay,
        rail,
        mem: None,
        stub,
        base,
        next_token: AtomicI64::new(1),
        _stop: stop,
        _dir: Some(dir),
        url: Some(url),
    }
}

impl World {
    fn mem(&self) -> &MemPaydb {
        self.mem.as_deref().expect("a simulation-store world")
    }

    fn paydb(&self) -> Paydb {
        Paydb { store: self.mem.clone().expect("a simulation-store world"), describe: "memory".into() }
    }

    fn token(&self) -> i64 {
        self.next_token.fetch_add(1, Ordering::SeqCst)
    }

    async fn account(&self, id: &str, opening: i64) {
        let a = NewAccount {
            account_id: id.into(),
            currency: EUR.into(),
            opening_balance_minor: opening,
            posting_id: Uuid::new_v4(),
            entry_ids: [Uuid::new_v4(), Uuid::new_v4()],
            at: at(0),
        };
        let r = self.pay.create_account(&a, &idem(Operation::CreateAccount, "accounts", 0, at(0)), &render()).await;
        assert!(matches!(committed(r.expect("create account")), CreateAccountOutcome::Created(_)));
    }

    async fn payout(&self, account: &str, amount: i64, now: DateTime<Utc>) -> Uuid {
        let p = NewPayout {
            payout_id: Uuid::new_v4(),
            account_id: account.into(),
            amount_minor: amount,
            currency: EUR.into(),
            beneficiary_ref: "ben-1".into(),
            at: now,
        };
        let r = self.pay.create_payout(&p, &idem(Operation::CreatePayout, "payouts", 0, now), &render()).await;
        assert!(matches!(committed(r.expect("create payout")), CreatePayoutOutcome::Created(_)));
        p.payout_id
    }

    /// Claims `p` under a fresh token; the claim's outcome.
    async fn claim(&self, p: Uuid, now: DateTime<Utc>) -> (i64, ClaimOutcome) {
        let token = self.token();
        let c = Claim { payout_id: p, token, owner_id: "worker-1".into(), expected: PayoutState::Pending, at: now };
        let r = self.pay.claim_one(&c, &idem(Operation::Claim, &p.to_string(), token, now), &render()).await;
        (token, committed(r.expect("claim")))
    }

    async fn claimed(&self, p: Uuid, now: DateTime<Utc>) -> i64 {
        let (token, outcome) = self.claim(p, now).await;
        assert!(matches!(outcome, ClaimOutcome::Claimed { .. }), "{outcome:?}");
        token
    }

    async fn attempt(&self, p: Uuid, token: i64, now: DateTime<Utc>) -> (Attempt, Admission) {
        let row = self.rail.payout(p).await.expect("read").expect("payout exists");
        let a = Attempt {
            submission_id: Uuid::new_v4(),
            payout_id: p,
            account_id: row.account_id,
            presented_token: token,
            owner_id: "worker-1".into(),
            idempotency_key: format!("payout:{p}"),
            amount_minor: row.amount_minor,
            currency: row.currency,
            at: now,
            fencing_enabled: true,
        };
        let admission = self.rail.admit(&a).await.expect("admit");
        (a, admission)
    }

    /// The proxy's transaction 1: the attempt must be admitted.
    async fn admit(&self, p: Uuid, token: i64, now: DateTime<Utc>) -> Uuid {
        let (a, admission) = self.attempt(p, token, now).await;
        assert_eq!(admission, Admission::Admitted { submitted_at: now });
        a.submission_id
    }

    /// One call to the rail, as the proxy's forward: the status and the reference paid.
    async fn rail_call(&self, client_ref: &str, amount: i64) -> (u16, Option<String>) {
        let body = serde_json::json!({"clientRef": client_ref, "amountMinor": amount, "currency": EUR}).to_string();
        let resp = HttpClient::new(1_000, 5_000)
            .send(&self.base, http::Method::POST, "/submit", &[("content-type", "application/json")], Some(body.into()))
            .await
            .expect("the stub answers");
        let reference = serde_json::from_slice::<serde_json::Value>(&resp.body)
            .ok()
            .and_then(|v| v["railReference"].as_str().map(str::to_owned));
        (resp.status, reference)
    }

    async fn record(&self, s: Uuid, r: Resolution, now: DateTime<Utc>) {
        self.rail.resolve(s, &r, now).await.expect("resolve");
    }

    /// Claimed, admitted, forwarded once and acknowledged: RAIL_ACKED. Returns the
    /// submission, its reference and the claim token.
    async fn acked(&self, account: &str, amount: i64, now: DateTime<Utc>) -> (Uuid, Uuid, String, i64) {
        let p = self.payout(account, amount, now).await;
        let token = self.claimed(p, now).await;
        let s = self.admit(p, token, now).await;
        let (status, reference) = self.rail_call(&p.to_string(), amount).await;
        assert_eq!(status, 200);
        let reference = reference.expect("a reference");
        self.record(s, Resolution::Acked { rail_reference: reference.clone() }, now).await;
        (p, s, reference, token)
    }

    /// The whole happy path: POSTED under a newer token.
    async fn paid(&self, account: &str, amount: i64, now: DateTime<Utc>) -> Uuid {
        let (p, s, reference, _) = self.acked(account, amount, now).await;
        let token = self.token();
        let post = Post {
            payout_id: p,
            token,
            owner_id: "worker-1".into(),
            submission_id: s,
            rail_reference: reference,
            posting_id: Uuid::new_v4(),
            entry_ids: [Uuid::new_v4(), Uuid::new_v4()],
            at: now,
        };
        let r = self.pay.post_one(&post, &idem(Operation::Post, &p.to_string(), token, now), &render()).await;
        assert!(matches!(committed(r.expect("post")), PostOutcome::Posted { .. }));
        p
    }

    /// Claimed, admitted, forwarded (when `call`), answer lost: RAIL_AMBIGUOUS.
    async fn ambiguous(&self, account: &str, amount: i64, call: bool, now: DateTime<Utc>) -> Uuid {
        let p = self.payout(account, amount, now).await;
        let token = self.claimed(p, now).await;
        let s = self.admit(p, token, now).await;
        if call {
            self.rail_call(&p.to_string(), amount).await;
        }
        self.record(s, Resolution::Timeout { detail: "no answer".into() }, now).await;
        p
    }

    async fn run_at(&self, now: DateTime<Utc>) -> Report {
        self.run_with(now, HttpRailRecord::new(self.base.clone(), &budget())).await
    }

    async fn run_with(&self, now: DateTime<Utc>, rail: HttpRailRecord) -> Report {
        reconcile(&self.paydb(), &rail, &Params { now, bounds: Bounds::default(), budget: budget() }).await
    }

    async fn run(&self) -> Report {
        self.run_at(at(10_000)).await
    }

    /// Everything paydb holds, as text: the reconciler must leave it unchanged.
    async fn everything(&self) -> String {
        let mut payouts = Vec::new();
        for s in PayoutState::ALL {
            let q = dlock_payment_resource::store::ListQuery {
                state: s,
                account_id: None,
                snapshot: at(1_000_000_000),
                created_after: None,
                after: None,
                limit: 10_000,
            };
            for p in self.pay.list(&q).await.expect("list") {
                payouts.push(format!("{:?}", self.pay.payout(p.payout_id).await.expect("payout")));
            }
        }
        let mut marks = BTreeMap::new();
        for a in self.pay.accounts().await.expect("accounts") {
            marks.insert(a.account_id.clone(), self.rail.high_water(&a.account_id).await.expect("mark"));
        }
        format!(
            "{payouts:?}\n{:?}\n{:?}\n{:?}\n{:?}\n{marks:?}\n{}",
            self.pay.accounts().await,
            self.pay.ledger(None).await,
            self.rail.submissions(None).await,
            self.pay.resolutions(None).await,
            self.stub.calls().len()
        )
    }
}

fn kinds(r: &Report) -> Vec<FindingKind> {
    r.findings.iter().map(|f| f.kind).collect()
}

/// The report's incident kinds, deduplicated.
fn incident_kinds(r: &Report) -> Vec<FindingKind> {
    let mut k: Vec<FindingKind> =
        r.findings.iter().filter(|f| f.severity == Severity::Incident).map(|f| f.kind).collect();
    k.dedup();
    k
}

// ---------------------------------------------------------------- a clean run

#[tokio::test]
async fn a_clean_run_reports_clean_and_exits_zero() {
    let w = world().await;
    w.account("acct-1", 10_000).await;
    w.account("acct-2", 100).await;
    for amount in [100, 200, 300] {
        w.paid("acct-1", amount, at(10)).await;
    }
    w.payout("acct-1", 50, at(20)).await;
    let claimed = w.payout("acct-1", 60, at(20)).await;
    w.claimed(claimed, at(21)).await;
    // Declined by the rail (the proxy recorded REJECTED): FAILED.
    let declined = w.payout("acct-1", 70, at(30)).await;
    let token = w.claimed(declined, at(30)).await;
    let s = w.admit(declined, token, at(30)).await;
    w.record(s, Resolution::Rejected { detail: "declined".into() }, at(30)).await;
    // Short of funds: FAILED at the claim.
    let poor = w.payout("acct-2", 500, at(40)).await;
    assert!(matches!(w.claim(poor, at(40)).await.1, ClaimOutcome::InsufficientFunds { .. }));
    let abandoned = w.payout("acct-1", 80, at(50)).await;
    w.pay.abandon(abandoned, at(51)).await.expect("abandon");
    let before = w.everything().await;

    let r = w.run().await;
    assert_eq!(r.findings, vec![], "{}", r.render_table());
    assert_eq!((r.exit_code(), r.clean, r.incidents, r.warnings), (EXIT_CLEAN, true, 0, 0));
    assert!(r.sources.paydb.read && r.sources.rail.read);
    let by_state = |s| r.payouts_by_state[&s];
    assert_eq!(
        [PayoutState::Posted, PayoutState::Pending, PayoutState::Claimed, PayoutState::Failed, PayoutState::Abandoned]
            .map(by_state),
        [3, 1, 1, 2, 1]
    );
    assert_eq!(r.payouts_total, 8);
    assert_eq!((r.rail_calls_total, r.max_rail_calls_per_payout), (3, 1));
    assert!(r.ledger_balanced);
    let eur = r.ledger_totals[EUR];
    assert_eq!((eur.debits_minor, eur.credits_minor), (10_700, 10_700));
    assert_eq!(r.ambiguous, vec![]);
    let table = r.render_table();
    assert!(table.contains(": CLEAN\n"), "{table}");
    assert!(table.contains("ledger balanced: yes"), "{table}");
    // Detective only: nothing changed anywhere.
    assert_eq!(w.everything().await, before);
}

// ---------------------------------------------------------------- the rail's record

#[tokio::test]
async fn a_payout_paid_twice_at_the_rail_is_an_incident() {
    let w = world().await;
    w.account("acct", 1_000).await;
    let p = w.paid("acct", 100, at(10)).await;
    w.paid("acct", 200, at(10)).await;
    // A second presentation of the same payout: the memoryless rail pays it again.
    assert_eq!(w.rail_call(&p.to_string(), 100).await.0, 200);
    let before = w.everything().await;
    let r = w.run().await;
    assert_eq!(incident_kinds(&r), vec![FindingKind::DoublePayment], "{}", r.render_table());
    let f = r.of_kind(FindingKind::DoublePayment);
    assert_eq!((f.len(), f[0].payout_id, f[0].severity), (1, Some(p), Severity::Incident));
    assert!(f[0].detail.contains("2 times"), "{}", f[0].detail);
    assert_eq!((r.exit_code(), r.clean, r.max_rail_calls_per_payout), (EXIT_INCIDENT, false, 2));
    assert!(r.render_table().contains(": INCIDENT\n"));
    // The reconciler pages; it does not repair.
    assert_eq!(w.everything().await, before);
}

#[tokio::test]
async fn a_payout_called_twice_but_paid_once_is_an_incident() {
    // duplicate-ack-rate 0: the rail declines a repeated clientRef.
    let w = world_with(&[("rail.stub.duplicate-ack-rate", "0")]).await;
    w.account("acct", 1_000).await;
    let p = w.paid("acct", 100, at(10)).await;
    assert_eq!(w.rail_call(&p.to_string(), 100).await.0, 402);
    let r = w.run().await;
    assert_eq!(incident_kinds(&r), vec![FindingKind::RepeatedRailCall], "{}", r.render_table());
    assert_eq!(r.of_kind(FindingKind::RepeatedRailCall)[0].payout_id, Some(p));
    assert_eq!((r.exit_code(), r.max_rail_calls_per_payout), (EXIT_INCIDENT, 2));
}

#[tokio::test]
async fn a_rail_call_for_an_unknown_payout_is_an_incident() {
    let w = world().await;
    w.account("acct", 1_000).await;
    w.paid("acct", 100, at(10)).await;
    let stranger = Uuid::new_v4();
    w.rail_call("not-a-payout", 5).await;
    w.rail_call(&stranger.to_string(), 5).await;
    let r = w.run().await;
    assert_eq!(incident_kinds(&r), vec![FindingKind::RailCallForUnknownPayout], "{}", r.render_table());
    let f = r.of_kind(FindingKind::RailCallForUnknownPayout);
    assert_eq!(f.iter().map(|f| f.payout_id).collect::<Vec<_>>(), vec![None, Some(stranger)]);
    assert!(f[0].detail.contains("not-a-payout"), "{}", f[0].detail);
    assert_eq!(r.exit_code(), EXIT_INCIDENT);
}

#[tokio::test]
async fn a_rail_call_for_a_payout_never_admitted_is_an_incident() {
    let w = world().await;
    w.account("acct", 1_000).await;
    // Never claimed, never submitted.
    let pending = w.payout("acct", 100, at(10)).await;
    w.rail_call(&pending.to_string(), 100).await;
    // Submitted once, but the connection never opened (UNSENT: provably nothing presented).
    let unsent = w.payout("acct", 100, at(10)).await;
    let token = w.claimed(unsent, at(11)).await;
    let s = w.admit(unsent, token, at(11)).await;
    w.record(s, Resolution::Unsent { detail: "refused".into() }, at(11)).await;
    w.rail_call(&unsent.to_string(), 100).await;
    let r = w.run().await;
    assert_eq!(incident_kinds(&r), vec![FindingKind::RailCallNotAdmitted], "{}", r.render_table());
    let f = r.of_kind(FindingKind::RailCallNotAdmitted);
    let mut got: Vec<_> = f.iter().map(|f| f.payout_id).collect();
    let mut want = vec![Some(pending), Some(unsent)];
    got.sort();
    want.sort();
    assert_eq!(got, want);
    let unsent_finding = f.iter().find(|f| f.payout_id == Some(unsent)).expect("unsent");
    assert!(unsent_finding.detail.contains("CLAIMED after 1 intent"), "{}", unsent_finding.detail);
}

// ---------------------------------------------------------------- quarantine

#[tokio::test]
async fn an_ambiguous_payout_with_one_accepted_call_is_classified_paid() {
    let w = world().await;
    w.account("acct", 1_000).await;
    let p = w.ambiguous("acct", 300, true, at(10)).await;
    let reference = w.stub.calls()[0].rail_reference.clone().expect("accepted");
    let r = w.run().await;
    assert_eq!(r.ambiguous.len(), 1);
    let a = &r.ambiguous[0];
    assert_eq!(
        (a.payout_id, a.classification, a.rail_calls, a.paid_calls),
        (p, AmbiguousClass::Paid, Some(1), Some(1))
    );
    assert_eq!(a.rail_reference.as_deref(), Some(reference.as_str()));
    assert_eq!(r.ambiguous_by_class[&AmbiguousClass::Paid], 1);
    assert_eq!(kinds(&r), vec![FindingKind::AmbiguousPayout], "{}", r.render_table());
    let f = &r.findings[0];
    assert_eq!((f.severity, f.payout_id), (Severity::Warning, Some(p)));
    assert!(f.detail.contains(&format!("--as posted --rail-reference {reference}")), "{}", f.detail);
    // A quarantined payout needs a human, but breaks no invariant.
    assert_eq!((r.exit_code(), r.clean, r.warnings), (EXIT_CLEAN, true, 1));
}

#[tokio::test]
async fn an_ambiguous_payout_the_rail_never_paid_is_classified_not_paid() {
    let w = world_with(&[("rail.stub.decline-rate", "1")]).await;
    w.account("acct", 1_000).await;
    // Forwarded and lost before the rail; and forwarded, declined, answer lost.
    let never = w.ambiguous("acct", 100, false, at(10)).await;
    let declined = w.ambiguous("acct", 100, true, at(10)).await;
    let r = w.run().await;
    let classes: BTreeMap<Uuid, (AmbiguousClass, Option<u64>)> =
        r.ambiguous.iter().map(|a| (a.payout_id, (a.classification, a.rail_calls))).collect();
    assert_eq!(classes[&never], (AmbiguousClass::NotPaid, Some(0)));
    assert_eq!(classes[&declined], (AmbiguousClass::NotPaid, Some(1)));
    assert_eq!(r.ambiguous_by_class[&AmbiguousClass::NotPaid], 2);
    assert_eq!(kinds(&r), vec![FindingKind::AmbiguousPayout; 2], "{}", r.render_table());
    assert_eq!(r.exit_code(), EXIT_CLEAN);
}

#[tokio::test]
async fn an_ambiguous_payout_paid_twice_is_classified_unknown() {
    let w = world().await;
    w.account("acct", 1_000).await;
    let p = w.ambiguous("acct", 100, true, at(10)).await;
    w.rail_call(&p.to_string(), 100).await;
    let r = w.run().await;
    assert_eq!(r.ambiguous[0].classification, AmbiguousClass::Unknown);
    assert_eq!(r.ambiguous[0].paid_calls, Some(2));
    assert_eq!(incident_kinds(&r), vec![FindingKind::DoublePayment]);
    assert_eq!(r.exit_code(), EXIT_INCIDENT);
}

#[tokio::test]
async fn an_unreadable_rail_makes_ambiguous_payouts_unknown_and_the_run_incomplete() {
    let w = world().await;
    w.account("acct", 1_000).await;
    let p = w.ambiguous("acct", 100, true, at(10)).await;
    let rail = HttpRailRecord::new(closed_port().await, &budget());
    let r = w.run_with(at(10_000), rail).await;
    assert_eq!(r.ambiguous[0].payout_id, p);
    assert_eq!((r.ambiguous[0].classification, r.ambiguous[0].rail_calls), (AmbiguousClass::Unknown, None));
    assert!(!r.sources.rail.read && r.sources.paydb.read);
    let error = r.sources.rail.error.clone().unwrap_or_default();
    assert!(error.contains("after 3 of at most 3 tries"), "{error}");
    assert_eq!(r.of_kind(FindingKind::SourceUnreadable).len(), 1);
    assert_eq!((r.exit_code(), r.clean), (EXIT_INCOMPLETE, false));
    assert!(r.render_table().contains("INCOMPLETE"));
}

// ---------------------------------------------------------------- age bounds

#[tokio::test]
async fn an_intent_unresolved_past_its_bound_is_reported() {
    let w = world().await;
    w.account("acct", 1_000).await;
    let old = w.payout("acct", 100, at(0)).await;
    let token = w.claimed(old, at(0)).await;
    let s = w.admit(old, token, at(0)).await;
    w.rail_call(&old.to_string(), 100).await;
    let young = w.payout("acct", 100, at(30_000)).await;
    let token = w.claimed(young, at(30_000)).await;
    w.admit(young, token, at(30_000)).await;
    // 60 001 ms after the old intent, 30 001 ms after the young one; the bound is 60 000.
    let r = w.run_at(at(60_001)).await;
    assert_eq!(kinds(&r), vec![FindingKind::IntentUnresolved], "{}", r.render_table());
    let f = &r.findings[0];
    assert_eq!((f.payout_id, f.severity), (Some(old), Severity::Warning));
    assert!(f.detail.contains(&s.to_string()) && f.detail.contains("60001 ms"), "{}", f.detail);
    assert!(f.detail.contains("1 call(s), 1 paid"), "{}", f.detail);
    // At the bound exactly, nothing is late yet.
    assert_eq!(kinds(&w.run_at(at(60_000)).await), vec![]);
}

#[tokio::test]
async fn a_rail_acked_payout_not_posted_past_its_bound_is_reported() {
    let w = world().await;
    w.account("acct", 1_000).await;
    let (old, ..) = w.acked("acct", 100, at(0)).await;
    w.acked("acct", 100, at(50_000)).await;
    let r = w.run_at(at(60_001)).await;
    assert_eq!(kinds(&r), vec![FindingKind::AckedNotPosted], "{}", r.render_table());
    assert_eq!((r.findings[0].payout_id, r.findings[0].severity), (Some(old), Severity::Warning));
    assert_eq!(r.exit_code(), EXIT_CLEAN);
    // The bound is a parameter.
    let tight = Params {
        now: at(60_001),
        bounds: Bounds { acked_unposted_ms_max: 5_000, ..Bounds::default() },
        budget: budget(),
    };
    let r = reconcile(&w.paydb(), &HttpRailRecord::new(w.base.clone(), &budget()), &tight).await;
    assert_eq!(r.of_kind(FindingKind::AckedNotPosted).len(), 2);
}

// ---------------------------------------------------------------- POSTED and the ledger

#[tokio::test]
async fn a_posted_payout_without_an_acked_attempt_is_an_incident() {
    let w = world().await;
    w.account("acct", 1_000).await;
    let p = w.ambiguous("acct", 300, false, at(10)).await;
    // Hand-run SQL moves it to POSTED with its entries and debit, but no ACKED attempt and
    // no operator resolution backs it.
    let posting = AmbiguousResolution {
        resolution_id: Uuid::new_v4(),
        payout_id: p,
        resolved_as: PayoutState::Posted,
        operator: "nobody".into(),
        reason: "not recorded".into(),
        rail_reference: "RR-x".into(),
        posting_id: Uuid::new_v4(),
        entry_ids: [Uuid::new_v4(), Uuid::new_v4()],
        at: at(20),
    };
    w.mem()
        .with_tables(|t| {
            let payout = t.rail.payouts.get_mut(&p).expect("payout");
            payout.row.state = PayoutState::Posted;
            t.ledger.extend(posting.entries("acct", 300, EUR, at(20)));
            t.accounts.get_mut("acct").expect("acct").balance_minor -= 300;
        })
        .expect("tables");
    let r = w.run().await;
    assert_eq!(kinds(&r), vec![FindingKind::PostedWithoutAck], "{}", r.render_table());
    assert_eq!(r.findings[0].payout_id, Some(p));
    assert!(
        r.findings[0].detail.contains("0 ACKED attempt(s) and 0 operator resolution(s)"),
        "{}",
        r.findings[0].detail
    );
    assert_eq!(r.exit_code(), EXIT_INCIDENT);
}

#[tokio::test]
async fn an_operator_resolved_posted_payout_is_backed_by_its_resolution() {
    let w = world().await;
    w.account("acct", 1_000).await;
    let p = w.ambiguous("acct", 300, true, at(10)).await;
    let reference = w.stub.calls()[0].rail_reference.clone().expect("accepted");
    let req = ResolveRequest {
        payout_id: p,
        resolved_as: ResolveAs::Posted,
        operator: "ops-alice".into(),
        reason: "rail statement line 42".into(),
        rail_reference: reference.clone(),
    };
    let done = dlock_reconciler::resolve::resolve(w.mem(), &req, at(20)).await.expect("resolved");
    assert_eq!((done.state, done.balance_minor), (PayoutState::Posted, 700));
    let r = w.run().await;
    assert_eq!(kinds(&r), vec![FindingKind::OperatorResolution], "{}", r.render_table());
    let f = &r.findings[0];
    assert_eq!((f.severity, f.payout_id, f.account_id.as_deref()), (Severity::Info, Some(p), Some("acct")));
    assert!(f.detail.contains("ops-alice") && f.detail.contains(&reference), "{}", f.detail);
    assert_eq!((r.exit_code(), r.clean, r.ambiguous.len()), (EXIT_CLEAN, true, 0));
    // A second verdict is refused: the payout has left quarantine.
    let again =
        dlock_reconciler::resolve::resolve(w.mem(), &ResolveRequest { resolved_as: ResolveAs::Failed, ..req }, at(30))
            .await;
    assert!(
        matches!(again, Err(dlock_reconciler::resolve::ResolveError::Refused(ref e)) if e.contains("POSTED")),
        "{again:?}"
    );
}

#[tokio::test]
async fn a_posting_that_does_not_match_its_payout_is_an_incident() {
    let w = world().await;
    w.account("acct", 10_000).await;
    // Posted once by the payment-resource, then a second (balanced) posting by hand.
    let twice = w.paid("acct", 100, at(10)).await;
    // Entries (and the debit) for a payout that is only RAIL_ACKED.
    let (acked, ..) = w.acked("acct", 200, at(10)).await;
    w.mem()
        .with_tables(|t| {
            for (p, amount) in [(twice, 100), (acked, 200)] {
                let posting = Post {
                    payout_id: p,
                    token: 0,
                    owner_id: "hand".into(),
                    submission_id: Uuid::new_v4(),
                    rail_reference: "RR".into(),
                    posting_id: Uuid::new_v4(),
                    entry_ids: [Uuid::new_v4(), Uuid::new_v4()],
                    at: at(20),
                };
                t.ledger.extend(posting.entries("acct", amount, EUR, at(20)));
                t.accounts.get_mut("acct").expect("acct").balance_minor -= amount;
            }
        })
        .expect("tables");
    let r = w.run().await;
    assert_eq!(kinds(&r), vec![FindingKind::PostingMismatch; 2], "{}", r.render_table());
    let by_payout: BTreeMap<Option<Uuid>, &str> = r.findings.iter().map(|f| (f.payout_id, f.detail.as_str())).collect();
    assert!(by_payout[&Some(twice)].contains("POSTED needs DEBIT acct"), "{}", by_payout[&Some(twice)]);
    assert!(by_payout[&Some(acked)].contains("RAIL_ACKED, not POSTED"), "{}", by_payout[&Some(acked)]);
    assert!(r.ledger_balanced, "both postings balance");
}

#[tokio::test]
async fn a_balance_that_differs_from_its_ledger_sum_is_an_incident() {
    let w = world().await;
    w.account("acct", 1_000).await;
    w.paid("acct", 100, at(10)).await;
    w.mem().with_tables(|t| t.accounts.get_mut("acct").expect("acct").balance_minor += 1).expect("tables");
    let r = w.run().await;
    assert_eq!(kinds(&r), vec![FindingKind::BalanceMismatch], "{}", r.render_table());
    assert_eq!(r.findings[0].account_id.as_deref(), Some("acct"));
    assert!(r.findings[0].detail.contains("balance 901 but"), "{}", r.findings[0].detail);
    assert!(!r.ledger_balanced);
    assert!(r.render_table().contains("ledger balanced: NO"));
}

#[tokio::test]
async fn unbalanced_ledger_totals_are_an_incident() {
    let w = world().await;
    w.account("acct", 1_000).await;
    w.paid("acct", 100, at(10)).await;
    // A lone DEBIT of the funding account: no CUSTOMER balance moves, the books do not balance.
    w.mem()
        .with_tables(|t| {
            t.ledger.push(LedgerEntry {
                entry_id: Uuid::new_v4(),
                posting_id: Uuid::new_v4(),
                payout_id: None,
                account_id: funding_account(EUR),
                direction: Direction::Debit,
                amount_minor: 5,
                currency: EUR.into(),
                fence: 0,
                created_at: at(20),
            })
        })
        .expect("tables");
    let r = w.run().await;
    assert_eq!(kinds(&r), vec![FindingKind::LedgerUnbalanced; 2], "{}", r.render_table());
    assert!(r.findings.iter().any(|f| f.detail.contains("EUR: Σ DEBIT 1105 != Σ CREDIT 1100")), "{:?}", r.findings);
    assert!(r.findings.iter().any(|f| f.detail.starts_with("posting ")), "{:?}", r.findings);
    let eur = r.ledger_totals[EUR];
    assert_eq!((eur.debits_minor, eur.credits_minor), (1_105, 1_100));
    assert_eq!((r.ledger_balanced, r.exit_code()), (false, EXIT_INCIDENT));
}

#[tokio::test]
async fn a_negative_balance_is_an_incident() {
    let w = world().await;
    w.account("acct", 0).await;
    w.mem().with_tables(|t| t.accounts.get_mut("acct").expect("acct").balance_minor = -100).expect("tables");
    let r = w.run().await;
    assert!(kinds(&r).contains(&FindingKind::NegativeBalance), "{}", r.render_table());
    let f = r.of_kind(FindingKind::NegativeBalance);
    assert_eq!((f.len(), f[0].account_id.as_deref()), (1, Some("acct")));
    assert_eq!(r.exit_code(), EXIT_INCIDENT);
}

#[tokio::test]
async fn a_negative_available_balance_is_an_incident() {
    let w = world().await;
    w.account("acct", 1_000).await;
    // A payout seeded CLAIMED straight into paydb (the developer tool) bypasses the funds
    // check: 1 500 reserved against a balance of 1 000.
    w.rail
        .insert_payout(
            &rail::NewPayout {
                payout_id: Uuid::new_v4(),
                account_id: "acct".into(),
                amount_minor: 1_500,
                currency: EUR.into(),
                beneficiary_ref: "ben".into(),
                state: PayoutState::Claimed,
            },
            at(5),
        )
        .await
        .expect("seed");
    let r = w.run().await;
    assert_eq!(kinds(&r), vec![FindingKind::NegativeAvailableBalance], "{}", r.render_table());
    assert!(r.findings[0].detail.contains("available -500 EUR"), "{}", r.findings[0].detail);
    assert_eq!(r.exit_code(), EXIT_INCIDENT);
}

// ---------------------------------------------------------------- fences and marks

#[tokio::test]
async fn an_account_fence_below_a_committed_token_is_an_incident() {
    let w = world().await;
    w.account("posted", 1_000).await;
    w.account("claimed", 1_000).await;
    w.paid("posted", 100, at(10)).await;
    let p = w.payout("claimed", 100, at(10)).await;
    let claim_token = w.claimed(p, at(10)).await;
    let post_fence = w.pay.account("posted").await.expect("read").expect("acct").fence;
    // A restore or hand-run SQL set both fences back.
    w.mem()
        .with_tables(|t| {
            t.accounts.get_mut("posted").expect("acct").fence = post_fence - 1;
            t.accounts.get_mut("claimed").expect("acct").fence = claim_token - 1;
        })
        .expect("tables");
    let r = w.run().await;
    assert_eq!(kinds(&r), vec![FindingKind::FenceBelowCommittedToken; 2], "{}", r.render_table());
    let by_account: BTreeMap<&str, &str> =
        r.findings.iter().filter_map(|f| Some((f.account_id.as_deref()?, f.detail.as_str()))).collect();
    assert!(by_account["posted"].contains(&format!("below token {post_fence}")), "{}", by_account["posted"]);
    assert!(by_account["posted"].contains("posting"), "{}", by_account["posted"]);
    assert!(by_account["claimed"].contains(&format!("claim of payout {p}")), "{}", by_account["claimed"]);
}

#[tokio::test]
async fn a_rail_mark_below_an_admitted_token_is_an_incident() {
    let w = world().await;
    w.account("lowered", 1_000).await;
    w.account("lost", 1_000).await;
    w.paid("lowered", 100, at(10)).await;
    w.paid("lost", 100, at(10)).await;
    let mark = w.rail.high_water("lowered").await.expect("mark").expect("set");
    w.mem()
        .with_tables(|t| {
            t.rail.high_water.insert("lowered".into(), mark - 1);
            t.rail.high_water.remove("lost");
        })
        .expect("tables");
    let r = w.run().await;
    assert_eq!(kinds(&r), vec![FindingKind::MarkBelowAdmittedToken; 2], "{}", r.render_table());
    let by_account: BTreeMap<&str, &str> =
        r.findings.iter().filter_map(|f| Some((f.account_id.as_deref()?, f.detail.as_str()))).collect();
    assert!(by_account["lowered"].contains(&format!("rail mark {} is below token {mark}", mark - 1)));
    assert!(by_account["lost"].contains("rail mark absent"), "{}", by_account["lost"]);
}

#[tokio::test]
async fn fenced_out_attempts_are_counted_for_the_rail_only() {
    let w = world().await;
    w.account("acct", 1_000).await;
    let p = w.paid("acct", 100, at(10)).await;
    let q = w.payout("acct", 100, at(11)).await;
    let token = w.claimed(q, at(11)).await;
    w.admit(q, token, at(11)).await;
    // Two stale holders at the rail; then a newer holder repeats the forwarded payout.
    for stale in [1, 2] {
        assert!(matches!(w.attempt(q, stale, at(12)).await.1, Admission::Fenced { .. }));
    }
    assert!(matches!(w.attempt(p, token + 100, at(12)).await.1, Admission::Duplicate { .. }));
    let r = w.run().await;
    assert_eq!((r.fenced_out.rail, r.duplicate_submissions), (2, 1));
    assert_eq!(r.fenced_out.note, FENCED_OUT_NOTE);
    // Refusals are the fence working, not incidents; the duplicate's token raised the mark.
    assert_eq!(kinds(&r), vec![], "{}", r.render_table());
    let json = serde_json::to_value(&r).expect("json");
    assert_eq!(json["fencedOut"]["rail"], 2);
    assert!(json["fencedOut"]["note"].as_str().unwrap_or_default().contains("not stored"));
    let outcomes: Vec<_> = w.rail.submissions(None).await.expect("rows").iter().map(|s| s.outcome).collect();
    assert_eq!(outcomes.iter().filter(|o| **o == Some(SubmissionOutcome::Fenced)).count(), 2);
}

// ---------------------------------------------------------------- recorded findings

/// The `reconciler.finding` events paydb holds: (status, finding, payout, class).
async fn finding_events(w: &World) -> Vec<(String, String, Option<String>, Option<String>)> {
    let read = w.pay.read_events(0, 10_000).await.expect("events");
    read.events
        .iter()
        .filter(|e| e.kind == dlock_contract::stream::EventKind::ReconcilerFinding)
        .map(|e| {
            let s = |k: &str| e.body[k].as_str().map(str::to_owned);
            (s("status").unwrap_or_default(), s("finding").unwrap_or_default(), e.payout_id.clone(), s("class"))
        })
        .collect()
}

async fn records_findings_once_and_clears_them_only_on_a_complete_run(w: World) {
    let store: Arc<dyn ReconcileStore> = match &w.url {
        Some(url) => Arc::new(dlock_reconciler::open::open_migrated(url).await.expect("paydb")),
        None => w.mem.clone().expect("memory"),
    };
    let paydb = Paydb { store: store.clone(), describe: "test".into() };
    let params = |now| Params { now, bounds: Bounds::default(), budget: budget() };
    let rail = || HttpRailRecord::new(w.base.clone(), &budget());
    w.account("acct", 1_000).await;
    let quarantined = w.ambiguous("acct", 300, true, at(20)).await;
    let twice = w.paid("acct", 100, at(10)).await;
    assert_eq!(w.rail_call(&twice.to_string(), 100).await.0, 200);
    let before = w.everything().await;

    let r = reconcile(&paydb, &rail(), &params(at(10_000))).await;
    let o = dlock_reconciler::record::record(store.as_ref(), &r).await.expect("record").expect("paydb was read");
    assert_eq!((o.opened, o.cleared, o.open), (2, 0, 2), "{}", r.render_table());
    let mut opened = finding_events(&w).await;
    opened.sort();
    assert_eq!(
        opened,
        vec![
            ("open".into(), "AMBIGUOUS_PAYOUT".into(), Some(quarantined.to_string()), Some("PAID".into())),
            ("open".into(), "DOUBLE_PAYMENT".into(), Some(twice.to_string()), None),
        ]
    );
    // The same findings again: nothing new is written.
    let again = reconcile(&paydb, &rail(), &params(at(20_000))).await;
    let o = dlock_reconciler::record::record(store.as_ref(), &again).await.expect("record").expect("read");
    assert_eq!((o.opened, o.cleared, o.open), (0, 0, 2));
    assert_eq!(finding_events(&w).await.len(), 2);
    // Recording touched no payout, account, ledger entry, rail row or call.
    assert_eq!(w.everything().await, before);

    // The operator resolves the quarantined payout. A run that cannot read the rail clears
    // nothing (it cannot say the double payment is gone); a complete run clears the
    // ambiguity, and the double payment stays open.
    let resolved = ResolveRequest {
        payout_id: quarantined,
        resolved_as: ResolveAs::Posted,
        operator: "oncall".into(),
        reason: "the rail's statement shows it paid".into(),
        rail_reference: w.stub.calls()[0].rail_reference.clone().expect("accepted"),
    };
    dlock_reconciler::resolve::resolve(store.as_ref(), &resolved, at(30_000)).await.expect("resolved");
    let blind = reconcile(&paydb, &HttpRailRecord::new(closed_port().await, &budget()), &params(at(40_000))).await;
    assert!(!blind.sources.rail.read);
    let o = dlock_reconciler::record::record(store.as_ref(), &blind).await.expect("record").expect("read");
    assert_eq!((o.cleared, o.open), (0, 2), "an incomplete run clears nothing");
    let r = reconcile(&paydb, &rail(), &params(at(50_000))).await;
    let o = dlock_reconciler::record::record(store.as_ref(), &r).await.expect("record").expect("read");
    assert_eq!((o.opened, o.cleared, o.open), (0, 1, 1), "{}", r.render_table());
    let last = finding_events(&w).await.pop().expect("the cleared event");
    assert_eq!(last, ("cleared".into(), "AMBIGUOUS_PAYOUT".into(), Some(quarantined.to_string()), Some("PAID".into())));
}

#[tokio::test]
async fn findings_are_recorded_once_as_events_and_cleared_only_by_a_complete_run_in_memory() {
    records_findings_once_and_clears_them_only_on_a_complete_run(world().await).await;
}

#[tokio::test]
async fn findings_are_recorded_once_as_events_and_cleared_only_by_a_complete_run_on_sqlite() {
    records_findings_once_and_clears_them_only_on_a_complete_run(sql_world(dlock_testkit::Db::Sqlite).await).await;
}

#[tokio::test]
async fn findings_are_recorded_once_as_events_and_cleared_only_by_a_complete_run_on_postgres() {
    records_findings_once_and_clears_them_only_on_a_complete_run(sql_world(dlock_testkit::Db::Postgres).await).await;
}

// ---------------------------------------------------------------- SQL paydbs and the CLI

fn settings(w: &World, rail_url: &str) -> ReconcileSettings {
    ReconcileSettings {
        database_url: w.url.clone().expect("a SQL world"),
        rail_url: rail_url.to_owned(),
        json: false,
        bounds: Bounds::default(),
        record_findings: true,
    }
}

async fn reconciles_a_sql_paydb_and_resolves_through_the_cli(w: World) {
    let rail_url = format!("http://{}", w.base.authority);
    w.account("acct", 1_000).await;
    w.paid("acct", 100, at(10)).await;
    let p = w.ambiguous("acct", 300, true, at(20)).await;
    let reference = w.stub.calls()[1].rail_reference.clone().expect("accepted");
    let off = ReconcileSettings { record_findings: false, ..settings(&w, &rail_url) };
    reconcile_once(&off, at(10_000), budget()).await.expect("settings");
    assert_eq!(finding_events(&w).await, vec![], "reconcile.record-findings false records nothing");
    // Clean but for the quarantined payout, which the rail paid.
    let r = reconcile_once(&settings(&w, &rail_url), at(10_000), budget()).await.expect("settings");
    assert_eq!(kinds(&r), vec![FindingKind::AmbiguousPayout], "{}", r.render_table());
    assert_eq!((r.ambiguous[0].classification, r.exit_code()), (AmbiguousClass::Paid, EXIT_CLEAN));
    assert_eq!((r.payouts_total, r.rail_calls_total), (2, 2));
    assert!(!r.sources.paydb.source.contains('@'), "{}", r.sources.paydb.source);
    // The run recorded its finding (reconcile.record-findings defaults to true).
    let recorded = finding_events(&w).await;
    assert_eq!(recorded, vec![("open".into(), "AMBIGUOUS_PAYOUT".into(), Some(p.to_string()), Some("PAID".into()))]);
    // The operator resolves it through the CLI entry point.
    let args = ResolveArgs {
        payout: p,
        resolved_as: ResolveAs::Posted,
        operator: "ops-alice".into(),
        reason: "rail statement line 7".into(),
        rail_reference: Some(reference),
        database_url: None,
    };
    let url = w.url.clone().expect("url");
    assert_eq!(run_resolve(&args, &url).await, std::process::ExitCode::SUCCESS);
    assert_eq!(run_resolve(&args, &url).await, std::process::ExitCode::from(1), "a second verdict is refused");
    let r = reconcile_once(&settings(&w, &rail_url), at(10_000), budget()).await.expect("settings");
    assert_eq!(kinds(&r), vec![FindingKind::OperatorResolution], "{}", r.render_table());
    assert_eq!((r.exit_code(), r.payouts_by_state[&PayoutState::Posted]), (EXIT_CLEAN, 2));
    assert!(r.ledger_balanced);
    // Paid twice at the rail: exit 1.
    w.rail_call(&p.to_string(), 300).await;
    let r = reconcile_once(&settings(&w, &rail_url), at(10_000), budget()).await.expect("settings");
    assert_eq!(incident_kinds(&r), vec![FindingKind::DoublePayment]);
    assert_eq!(r.exit_code(), EXIT_INCIDENT);
    // Without the rail's record (the only evidence of the double payment) the run is
    // incomplete, never clean.
    let gone = format!("http://{}", closed_port().await.authority);
    let r = reconcile_once(&settings(&w, &gone), at(10_000), budget()).await.expect("settings");
    assert_eq!((r.exit_code(), r.clean), (EXIT_INCOMPLETE, false));
}

#[tokio::test]
async fn a_sqlite_paydb_is_reconciled_through_the_sql_stores() {
    reconciles_a_sql_paydb_and_resolves_through_the_cli(sql_world(dlock_testkit::Db::Sqlite).await).await;
}

#[tokio::test]
async fn a_postgres_paydb_is_reconciled_through_the_sql_stores() {
    reconciles_a_sql_paydb_and_resolves_through_the_cli(sql_world(dlock_testkit::Db::Postgres).await).await;
}

#[tokio::test]
async fn a_paydb_that_cannot_be_opened_is_incomplete_but_a_double_payment_still_pages() {
    let w = world().await;
    let dir = dlock_testkit::TempDir::new("reconcile-nopaydb");
    let s = ReconcileSettings {
        database_url: dlock_testkit::sqlite_url(&dir),
        rail_url: format!("http://{}", w.base.authority),
        json: true,
        bounds: Bounds::default(),
        record_findings: true,
    };
    let r = reconcile_once(&s, at(10_000), budget()).await.expect("settings");
    assert_eq!((r.exit_code(), r.sources.paydb.read, r.sources.rail.read), (EXIT_INCOMPLETE, false, true));
    assert_eq!(kinds(&r), vec![FindingKind::SourceUnreadable]);
    let p = Uuid::new_v4();
    w.rail_call(&p.to_string(), 5).await;
    w.rail_call(&p.to_string(), 5).await;
    let r = reconcile_once(&s, at(10_000), budget()).await.expect("settings");
    assert_eq!(incident_kinds(&r), vec![FindingKind::DoublePayment]);
    assert_eq!(r.exit_code(), EXIT_INCIDENT);
    // Settings that cannot be used are an error, not a report.
    let bad = ReconcileSettings { rail_url: "https://rail".into(), ..s.clone() };
    assert!(reconcile_once(&bad, at(0), budget()).await.is_err());
    let bad = ReconcileSettings { database_url: "mysql://x".into(), ..s };
    assert!(reconcile_once(&bad, at(0), budget()).await.is_err());
}

/// The reconciler's view of a paydb whose `submissions` read fails `failures` times first.
struct FlakyPaydb {
    inner: Arc<MemPaydb>,
    failures: std::sync::atomic::AtomicU32,
    reads: std::sync::atomic::AtomicU32,
}

#[async_trait::async_trait]
impl ReconcileStore for FlakyPaydb {
    async fn payout(&self, payout_id: Uuid) -> Result<Option<PayoutView>, StoreError> {
        ReconcileStore::payout(&*self.inner, payout_id).await
    }

    async fn list(&self, q: &ListQuery) -> Result<Vec<PayoutSummary>, StoreError> {
        ReconcileStore::list(&*self.inner, q).await
    }

    async fn submissions(&self, payout_id: Option<Uuid>) -> Result<Vec<rail::SubmissionRow>, StoreError> {
        self.reads.fetch_add(1, Ordering::SeqCst);
        let left = self.failures.load(Ordering::SeqCst);
        if left > 0 {
            self.failures.store(left - 1, Ordering::SeqCst);
            return Err(StoreError::Unavailable("database is locked".into()));
        }
        ReconcileStore::submissions(&*self.inner, payout_id).await
    }

    async fn resolutions(&self, payout_id: Option<Uuid>) -> Result<Vec<ResolutionRow>, StoreError> {
        ReconcileStore::resolutions(&*self.inner, payout_id).await
    }

    async fn ledger(&self, account_id: Option<&str>) -> Result<Vec<LedgerEntry>, StoreError> {
        ReconcileStore::ledger(&*self.inner, account_id).await
    }

    async fn accounts(&self) -> Result<Vec<AccountView>, StoreError> {
        ReconcileStore::accounts(&*self.inner).await
    }

    async fn high_water(&self, account_id: &str) -> Result<Option<i64>, StoreError> {
        ReconcileStore::high_water(&*self.inner, account_id).await
    }

    async fn resolve_ambiguous(&self, r: &AmbiguousResolution) -> Result<ResolveOutcome, StoreError> {
        ReconcileStore::resolve_ambiguous(&*self.inner, r).await
    }

    async fn record_findings(
        &self,
        run: &dlock_paydb::findings::FindingsRun,
    ) -> Result<dlock_paydb::findings::RecordOutcome, StoreError> {
        ReconcileStore::record_findings(&*self.inner, run).await
    }
}

#[tokio::test]
async fn a_paydb_read_is_tried_three_times_then_the_run_is_incomplete() {
    let w = world().await;
    w.account("acct", 1_000).await;
    w.paid("acct", 100, at(10)).await;
    let rail_record = || HttpRailRecord::new(w.base.clone(), &budget());
    let params = Params { now: at(10_000), bounds: Bounds::default(), budget: budget() };
    for (failures, reads, exit) in [(2, 3, EXIT_CLEAN), (3, 3, EXIT_INCOMPLETE)] {
        let flaky =
            Arc::new(FlakyPaydb { inner: w.mem.clone().expect("memory"), failures: failures.into(), reads: 0.into() });
        let paydb = Paydb { store: flaky.clone(), describe: "memory".into() };
        let r = reconcile(&paydb, &rail_record(), &params).await;
        assert_eq!(flaky.reads.load(Ordering::SeqCst), reads, "{failures} failures");
        assert_eq!(r.exit_code(), exit, "{failures} failures: {}", r.render_table());
        if exit == EXIT_INCOMPLETE {
            assert!(!r.sources.paydb.read);
            let error = r.sources.paydb.error.clone().unwrap_or_default();
            assert!(error.contains("read rail submissions") && error.contains("database is locked"), "{error}");
            assert_eq!(kinds(&r), vec![FindingKind::SourceUnreadable]);
        }
    }
}
