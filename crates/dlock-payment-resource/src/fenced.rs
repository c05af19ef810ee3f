//! The payment-resource's one fenced-write pipeline: P2 and P3 (one payout, C3 §3.4) and
//! their batches P2b and P3b (C3-extensions E-19) all run through [`write`], as the
//! rail-proxy's admissions run through its service.
//!
//! Check order (the first failure answers): the fenced-write headers ([`FencedHeaders`]:
//! token and the syntax of its signature, 400 `INVALID_TOKEN`; owner; key) → the path →
//! media type, size, JSON → fields (the handler, in `app`) → the grant's signature against
//! the account's lock key `payout:{accountId}` (400 `INVALID_TOKEN`, C3-extensions E-14; it
//! writes nothing) → idempotency identity → the store's one transaction (fence, each
//! payout's state, funds). Refusals are judged afresh on every request; committed
//! outcomes are answered from the bytes the store recorded with them.
//!
//! Invariants:
//! - **A single write is a batch of one.** The store runs every claim and post as a batch
//!   ([`crate::store::PaymentStore::claim`], [`crate::store::PaymentStore::post`]); the
//!   request's [`Shape`] decides only its identity's target, its answer and its log lines.
//! - **The account is known before the store runs.** A batch names it in its path; a single
//!   write reads its payout's (one column, never stale: a payout's account never changes).
//!   An unknown payout is a 404 that reached no store transaction and wrote nothing.
//! - **Everything around the store is here, once**: the grant check, the identity, the
//!   `fenced_write` event per payout ([`dlock_rt::events`]), the claim/post counters and
//!   log lines per payout, the `FENCED_OUT` refusal (logged and counted once per request)
//!   and the probes. Nothing here runs inside a store transaction: answers are rendered
//!   below the store ([`crate::answer`]).

use std::sync::Arc;

use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use dlock_contract::batch::batch_target;
use dlock_contract::fenced::{FencedOut, FencedResource};
use dlock_contract::{ErrorCode, IdempotencyKey, OwnerId};
use dlock_http::{ApiError, TraceId};
use serde::Serialize;
use serde_json::json;
use uuid::Uuid;

use crate::answer::{self, Answering, Shape};
use crate::metrics::{RESOURCE_ACCOUNT, RESOURCE_LEDGER};
use crate::service::{PaymentResource, NOT_READY_RETRY_AFTER_MS};
use crate::store::{
    BatchItemOutcome, BatchOutcome, ClaimBatch, ClaimBatchPayout, ClaimOutcome, ClassifiedStoreError, Decided,
    Idempotent, Operation, PostBatch, PostBatchPayout, PostOutcome, StoreError,
};

/// The headers every fenced write carries, read in the contract's order: token (and the
/// syntax of its signature), owner, key. The one extractor of P2, P3, P2b and P3b.
#[derive(Debug, Clone)]
pub struct FencedHeaders {
    pub token: i64,
    pub signature: Option<String>,
    pub owner: OwnerId,
    pub key: IdempotencyKey,
}

impl FencedHeaders {
    /// The fenced-write headers of `headers`, or the first one's refusal.
    pub fn read(headers: &HeaderMap) -> Result<FencedHeaders, ApiError> {
        let token = dlock_http::fencing_token(headers)?.get();
        let signature = dlock_http::fencing_signature(headers)?;
        let owner = dlock_http::owner_id(headers)?;
        let key = dlock_http::idempotency_key(headers)?;
        Ok(FencedHeaders { token, signature, owner, key })
    }
}

/// What a fenced write names in its path: the payout of P2/P3, or the account of P2b/P3b.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    Payout(Uuid),
    Account(String),
}

impl Target {
    fn shape(&self) -> Shape {
        match self {
            Target::Payout(_) => Shape::Single,
            Target::Account(_) => Shape::Batch,
        }
    }
}

/// The operation and its payouts (one for a single write), as validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FencedOp {
    Claim(Vec<ClaimBatchPayout>),
    Post(Vec<PostItem>),
}

/// One payout of a post as its request names it: the payout and its acknowledged attempt.
/// The pipeline gives it the ids of its posting once the request is admitted (after the
/// grant check and the identity), so a refused request draws none.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PostItem {
    pub payout_id: Uuid,
    pub submission_id: Uuid,
    pub rail_reference: String,
}

impl PostItem {
    /// The payout as the store posts it, with fresh ids for its posting and its two
    /// entries (in that order).
    fn stamped(self) -> PostBatchPayout {
        PostBatchPayout {
            payout_id: self.payout_id,
            submission_id: self.submission_id,
            rail_reference: self.rail_reference,
            posting_id: dlock_rt::rand::uuid_v4(),
            entry_ids: [dlock_rt::rand::uuid_v4(), dlock_rt::rand::uuid_v4()],
        }
    }
}

/// One fenced write, as the handler validated it: `request` is the body as sent (its
/// fingerprint is the identity's).
#[derive(Debug)]
pub struct FencedWrite<'a, B> {
    pub op: FencedOp,
    pub target: Target,
    pub grant: FencedHeaders,
    pub request: &'a B,
}

/// A store failure, by its class (C3-extensions C-29): only `Unavailable` (nothing was
/// changed) is the retry-safe 503 `NOT_READY`; the others are 500 `INTERNAL`.
pub fn store_error(e: StoreError) -> ApiError {
    let code = e.fault().code(ErrorCode::NotReady);
    match e {
        StoreError::Unavailable(cause) => {
            ApiError::new(code, "paydb could not decide the request; nothing was changed")
                .with_retry_after_ms(NOT_READY_RETRY_AFTER_MS)
                .with_internal(cause)
        }
        StoreError::CommitUnknown(cause) => ApiError::new(
            code,
            "the outcome is unknown; replay the same request with the same key and token to learn it",
        )
        .with_internal(cause),
        StoreError::Corrupt(cause) => ApiError::internal(cause),
    }
}

/// Turns what the store decided into the answer: a replay or a committed outcome is the
/// recorded bytes; a refusal is rendered now by `refusal`. `committed` logs and counts a
/// committed outcome (after commit, never before).
pub fn answer<T, R: IntoResponse>(
    pr: &PaymentResource,
    decided: Decided<T>,
    (operation, target_id, owner_id): (Operation, &str, &str),
    committed: impl FnOnce(&T),
    refusal: impl FnOnce(T) -> R,
) -> Response {
    match decided {
        Err(e) => store_error(e).into_response(),
        Ok(Idempotent::Replayed(r)) => {
            pr.metrics.idempotency("replayed");
            dlock_http::prerendered(r.status, r.body)
        }
        Ok(Idempotent::Conflict) => {
            pr.metrics.idempotency("conflict");
            tracing::warn!(
                operation = operation.as_str(),
                targetId = target_id,
                ownerId = owner_id,
                "idempotency_conflict"
            );
            ApiError::new(
                ErrorCode::IdempotencyConflict,
                "this idempotency key was used with a materially different request; neither has any effect",
            )
            .with_details(json!({ "operation": operation.as_str(), "targetId": target_id }))
            .into_response()
        }
        Ok(Idempotent::Executed { outcome, stored: Some(r) }) => {
            pr.metrics.idempotency("executed");
            committed(&outcome);
            dlock_http::prerendered(r.status, r.body)
        }
        Ok(Idempotent::Executed { outcome, stored: None }) => {
            pr.metrics.idempotency("executed");
            refusal(outcome).into_response()
        }
    }
}

/// What differs between a claim and a post once the store has decided: the event's name,
/// the fence layer, the operation, the per-payout counting and logging, the refusal of one
/// payout, the answer, and the fenced-out resource and probe.
struct Kind<T> {
    op: &'static str,
    layer: dlock_rt::defence::Layer,
    operation: Operation,
    note: fn(&PaymentResource, &TraceId, Uuid, i64, &str, &T),
    refusal: fn(Uuid, &T) -> ApiError,
    render: fn(&BatchOutcome<T>, &str, i64, &Answering) -> crate::store::StoredResponse,
    resource: usize,
    probe: dlock_rt::probe::Probe,
}

const CLAIMS: Kind<ClaimOutcome> = Kind {
    op: "claim",
    layer: dlock_rt::defence::Layer::ClaimFence,
    operation: Operation::Claim,
    note: note_claim,
    refusal: answer::claim_refusal,
    render: answer::claim,
    resource: RESOURCE_ACCOUNT,
    probe: dlock_rt::probe::Probe::FencedOutAccount,
};

const POSTS: Kind<PostOutcome> = Kind {
    op: "post",
    layer: dlock_rt::defence::Layer::PostFence,
    operation: Operation::Post,
    note: note_post,
    refusal: answer::post_refusal,
    render: answer::post,
    resource: RESOURCE_LEDGER,
    probe: dlock_rt::probe::Probe::FencedOutLedger,
};

/// One fenced write, as its answer needs it.
struct Done<'a> {
    shape: Shape,
    account_id: &'a str,
    payout_ids: &'a [Uuid],
    token: i64,
    owner: &'a str,
    target: &'a str,
    answering: &'a Answering,
}

/// Runs one fenced write through the pipeline (module doc) and answers it.
pub async fn write<B: Serialize>(pr: &Arc<PaymentResource>, w: FencedWrite<'_, B>, trace: &TraceId) -> Response {
    match run(pr, w, trace).await {
        Ok(r) => r,
        Err(e) => e.into_response(),
    }
}

async fn run<B: Serialize>(
    pr: &Arc<PaymentResource>,
    w: FencedWrite<'_, B>,
    trace: &TraceId,
) -> Result<Response, ApiError> {
    let FencedWrite { op, target, grant, request } = w;
    let shape = target.shape();
    let (token, owner) = (grant.token, grant.owner.as_str());
    let payout_ids: Vec<Uuid> = match &op {
        FencedOp::Claim(p) => p.iter().map(|p| p.payout_id).collect(),
        FencedOp::Post(p) => p.iter().map(|p| p.payout_id).collect(),
    };
    let target_id = match &target {
        Target::Payout(id) => id.to_string(),
        Target::Account(account) => batch_target(account),
    };
    let answering = Answering { shape, key: grant.key.as_str().to_owned(), trace_id: trace.0.clone() };
    // 1. The account: the path's, or the payout's (an unknown payout reaches no store
    // transaction and writes nothing: its answer is the store's `NotFound`).
    let account_id = match &target {
        Target::Account(account) => account.clone(),
        Target::Payout(payout_id) => match pr.store.payout_account(*payout_id).await.map_err(store_error)? {
            Some(account) => account,
            None => {
                let done = Done {
                    shape,
                    account_id: "",
                    payout_ids: &payout_ids,
                    token,
                    owner,
                    target: &target_id,
                    answering: &answering,
                };
                return Ok(match op {
                    FencedOp::Claim(_) => finish(pr, trace, &CLAIMS, &done, unknown(*payout_id)),
                    FencedOp::Post(_) => finish(pr, trace, &POSTS, &done, unknown(*payout_id)),
                });
            }
        },
    };
    // 2. The grant, over the account's lock key.
    verify_grant(pr, &target, &account_id, &grant)?;
    // 3. The identity, then the store's one transaction.
    let at = pr.now();
    let operation = match op {
        FencedOp::Claim(_) => Operation::Claim,
        FencedOp::Post(_) => Operation::Post,
    };
    let idem = pr
        .identity(operation, &target_id, grant.key.as_str(), token, owner, request, at)
        .map_err(|cause| ApiError::internal(format!("fingerprint: {cause}")))?;
    let done = Done {
        shape,
        account_id: &account_id,
        payout_ids: &payout_ids,
        token,
        owner,
        target: &target_id,
        answering: &answering,
    };
    let (account, owner_id, how) = (account_id.clone(), owner.to_owned(), answering.clone());
    Ok(match op {
        FencedOp::Claim(payouts) => {
            let b = ClaimBatch { account_id: account, token, owner_id, payouts, at };
            let decided = pr.write(move |store| async move { store.claim(&b, &idem, &how).await }).await;
            finish(pr, trace, &CLAIMS, &done, decided)
        }
        FencedOp::Post(items) => {
            let payouts = items.into_iter().map(PostItem::stamped).collect();
            let b = PostBatch { account_id: account, token, owner_id, payouts, at };
            let decided = pr.write(move |store| async move { store.post(&b, &idem, &how).await }).await;
            finish(pr, trace, &POSTS, &done, decided)
        }
    })
}

/// What the store decides for a single write of a payout that does not exist (nothing
/// runs, nothing is written).
fn unknown<T: BatchItemOutcome>(payout_id: Uuid) -> Decided<BatchOutcome<T>> {
    Ok(Idempotent::Executed {
        outcome: BatchOutcome::Decided { items: vec![(payout_id, T::not_found())] },
        stored: None,
    })
}

/// The grant check (C3-extensions E-14), before the store's transaction compares the token
/// to the fence: the signature must be a trusted key's over (`payout:{accountId}`, the
/// token, the request's owner). A refusal is 400 `INVALID_TOKEN` and writes nothing (no
/// row, no fence, no idempotency record). A batch's grant is checked once, against its
/// path's account, with no read: a payout it names of another account is that item's
/// `NOT_FOUND`, decided in the store's transaction.
fn verify_grant(pr: &PaymentResource, target: &Target, account_id: &str, g: &FencedHeaders) -> Result<(), ApiError> {
    let lock_key = dlock_contract::grant::payout_lock_key(account_id);
    let (token, owner) = (g.token, g.owner.as_str());
    pr.cfg.grants.verify(g.signature.as_deref(), &lock_key, token, Some(owner)).map(|_| ()).map_err(|e| {
        match target {
            Target::Payout(payout_id) => tracing::warn!(payoutId = %payout_id, accountId = %account_id,
                presentedToken = token, ownerId = owner, cause = %e, "grant_signature_refused"),
            Target::Account(_) => tracing::warn!(accountId = %account_id, presentedToken = token, ownerId = owner,
                cause = %e, "grant_signature_refused"),
        }
        dlock_http::grant_refused(e)
    })
}

/// The answer of a decided fenced write: each payout's `fenced_write` event, counter and log
/// line; a committed or replayed write's recorded bytes; a write where nothing moved
/// answered now (a single write: its payout's refusal; a batch: its `200`, not recorded);
/// a fenced write one `FENCED_OUT` for the account; an unknown account 404.
fn finish<T: BatchItemOutcome>(
    pr: &PaymentResource,
    trace: &TraceId,
    kind: &Kind<T>,
    d: &Done<'_>,
    decided: Decided<BatchOutcome<T>>,
) -> Response {
    trace_writes(kind, d, &decided);
    let note_items = |o: &BatchOutcome<T>| {
        for (payout_id, item) in o.items() {
            (kind.note)(pr, trace, *payout_id, d.token, d.owner, item);
        }
    };
    answer(pr, decided, (kind.operation, d.target, d.owner), note_items, |o| match o {
        BatchOutcome::Decided { ref items } => {
            // Nothing moved: the answer is not recorded, and is judged afresh next time.
            note_items(&o);
            match (d.shape, items.as_slice()) {
                (Shape::Single, [(payout_id, item)]) => (kind.refusal)(*payout_id, item).into_response(),
                _ => {
                    let r = (kind.render)(&o, d.account_id, d.token, d.answering);
                    dlock_http::prerendered(r.status, r.body)
                }
            }
        }
        BatchOutcome::Fenced { highest_token } => {
            dlock_rt::probe::hit(kind.probe);
            for payout_id in d.payout_ids {
                let item = T::fenced(d.account_id, highest_token);
                (kind.note)(pr, trace, *payout_id, d.token, d.owner, &item);
            }
            fenced_out(pr, kind.resource, d, highest_token, trace).into_response()
        }
        BatchOutcome::AccountNotFound => match d.shape {
            Shape::Single => answer::not_found("payout").into_response(),
            Shape::Batch => answer::not_found("account").into_response(),
        },
    })
}

/// The `fenced_write` event of each payout (`kind`'s op, guarded by its layer), when a sink
/// listens: `accepted` for a payout the write moved, `fenced_out` (with the stored token it
/// did not exceed) for each payout of a fenced write, `no_decision` for the rest (not
/// found, not claimable; a conflict, a replay, a store error).
fn trace_writes<T: BatchItemOutcome>(kind: &Kind<T>, d: &Done<'_>, decided: &Decided<BatchOutcome<T>>) {
    if !dlock_rt::events::enabled() {
        return;
    }
    for payout_id in d.payout_ids {
        let (answer, stored_token, account, replay) = match decided {
            Ok(Idempotent::Executed { outcome, .. }) if outcome.moved_payout(*payout_id) => {
                ("accepted", Some(d.token), Some(d.account_id), false)
            }
            Ok(Idempotent::Executed { outcome, .. }) => match outcome.fenced_by() {
                Some(highest) => ("fenced_out", Some(highest), Some(d.account_id), false),
                None => ("no_decision", None, None, false),
            },
            Ok(Idempotent::Replayed(_)) => ("no_decision", None, None, true),
            _ => ("no_decision", None, None, false),
        };
        dlock_rt::events::emit(crate::NODE, "fenced_write", || {
            [
                ("op", kind.op.into()),
                ("payout", payout_id.to_string().into()),
                ("account", account.unwrap_or_default().into()),
                ("owner", d.owner.into()),
                ("presented_token", d.token.into()),
                ("stored_token", dlock_rt::events::opt(stored_token)),
                ("answer", answer.into()),
                ("admission", serde_json::Value::Null),
                ("fenced", (!dlock_rt::defence::off(kind.layer)).into()),
                ("state_before", serde_json::Value::Null),
                ("replay", replay.into()),
            ]
        });
    }
}

/// The 409 `FENCED_OUT` of a claim (`account`) or a post (`ledger`), logged and counted
/// once. A single write's details and log line name its payout (a post's resource is its
/// payout); a batch is refused for its account, and its details name no payout.
fn fenced_out(pr: &PaymentResource, resource: usize, d: &Done<'_>, highest: i64, trace: &TraceId) -> ApiError {
    let resource_type = crate::metrics::FENCED_RESOURCES[resource];
    pr.metrics.fenced_out.inc(resource);
    let single = match (d.shape, d.payout_ids) {
        (Shape::Single, [payout_id]) => Some(*payout_id),
        _ => None,
    };
    let resource_id = match single {
        Some(payout_id) if resource == RESOURCE_LEDGER => payout_id.to_string(),
        _ => d.account_id.to_owned(),
    };
    let (presented, owner_id) = (d.token, d.owner);
    let mut details = FencedOut::new(presented, highest, FencedResource::ALL[resource], &resource_id, owner_id);
    match single {
        Some(payout_id) => {
            tracing::warn!(resource = resource_type, resourceId = %resource_id, presentedToken = presented,
                highestToken = highest, ownerId = owner_id, payoutId = %payout_id, traceId = %trace.0, "fenced_out");
            details = details.for_payout(payout_id);
        }
        None => tracing::warn!(resource = resource_type, resourceId = %resource_id, presentedToken = presented,
            highestToken = highest, ownerId = owner_id, traceId = %trace.0, "fenced_out"),
    }
    ApiError::new(
        ErrorCode::FencedOut,
        "the presented token does not exceed the stored fence; a newer holder exists. Abort the critical section",
    )
    .with_details(details.to_value())
}

/// The counter and log line of one claim outcome (a committed outcome's after its commit).
/// `Fenced` counts here; its log line and `lock_fenced_out_total` are the fence refusal's
/// ([`fenced_out`]).
fn note_claim(pr: &PaymentResource, trace: &TraceId, payout_id: Uuid, token: i64, owner: &str, o: &ClaimOutcome) {
    match o {
        ClaimOutcome::Claimed { account_id, reclaimed, .. } => {
            pr.metrics.claim(if *reclaimed { "reclaimed" } else { "claimed" });
            tracing::info!(payoutId = %payout_id, accountId = %account_id, presentedToken = token,
                ownerId = owner, reclaimed = *reclaimed, traceId = %trace.0, "payout_claimed");
        }
        ClaimOutcome::InsufficientFunds { account_id, amount_minor, available_minor } => {
            pr.metrics.claim("insufficient_funds");
            tracing::warn!(payoutId = %payout_id, accountId = %account_id, amountMinor = *amount_minor,
                availableMinor = *available_minor, ownerId = owner, traceId = %trace.0,
                "payout_failed_insufficient_funds");
        }
        ClaimOutcome::Fenced { .. } => pr.metrics.claim("fenced"),
        ClaimOutcome::NotClaimable { .. } => pr.metrics.claim("not_claimable"),
        ClaimOutcome::NotFound => {}
    }
}

/// The counter and log line of one post outcome.
fn note_post(pr: &PaymentResource, trace: &TraceId, payout_id: Uuid, token: i64, owner: &str, o: &PostOutcome) {
    match o {
        PostOutcome::Posted { account_id, balance_minor, .. } => {
            pr.metrics.post("posted");
            tracing::info!(payoutId = %payout_id, accountId = %account_id, presentedToken = token,
                ownerId = owner, balanceMinor = *balance_minor, traceId = %trace.0, "payout_posted");
        }
        PostOutcome::Fenced { .. } => pr.metrics.post("fenced"),
        PostOutcome::NotClaimable { .. } => pr.metrics.post("not_claimable"),
        PostOutcome::RailMismatch => pr.metrics.post("rail_mismatch"),
        PostOutcome::NotFound => {}
    }
}
