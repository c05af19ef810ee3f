//! The admission pipeline, independent of HTTP: validate, admit (steps 1–3), forward once,
//! resolve. Handlers translate its [`Outcome`] into the wire; tests drive it directly.
//!
//! A batch ([`RailProxy::submit_batch`], C3-extensions E-19) runs the same pipeline for
//! several payouts of one account: the grant checked once, validation and steps 1–3 in one
//! transaction, the admitted payouts forwarded concurrently (at most
//! [`BATCH_PAYOUTS_MAX`]), the outcomes recorded in one transaction. The per-payout steps
//! are one code path for both: `RailProxy::past_the_mark` (what an admission past the
//! mark leads to), `RailProxy::forward_once` (the forward, with its BUGGIFY points) and
//! `RailProxy::resolved` (the answer for a recorded, or unrecordable, outcome).
//!
//! Invariants: no forward starts before its intent committed; each intent is forwarded at
//! most once, and nothing here loops around a forward; an outcome that could not be recorded
//! is answered `RAIL_AMBIGUOUS`, never as retry-safe; a batch is fenced whole or not at all.

use std::sync::Arc;

use chrono::{DateTime, Utc};
use dlock_contract::batch::BATCH_PAYOUTS_MAX;
use dlock_contract::payout::PayoutState;
use dlock_contract::rail::{RailAck, RailSubmit, SubmissionBatchRequest, SubmissionOutcome, SubmissionRequest};
use dlock_contract::{FencingToken, FieldError, IdempotencyKey, OwnerId};
use dlock_rt::http::{BaseUrl, ClientError, HttpClient};
use dlock_rt::probe::Probe;
use dlock_rt::Clock;
use uuid::Uuid;

use crate::metrics::{ProxyMetrics, RailCall, RESOURCE_RAIL};
use crate::store::{
    Admission, Attempt, Checked, ClassifiedStoreError, PayoutRow, RailStore, Resolution, StoreError, Unstamped,
};
use crate::store_timed::TimedRailStore;

/// Default `rail.proxy.connect-timeout-ms` (C3 §3.8: proxy → rail connect budget).
pub const CONNECT_TIMEOUT_MS_DEFAULT: u64 = 1_000;
/// Default `rail.proxy.read-timeout-ms` (C3 §3.8: below the executor's read timeout).
pub const READ_TIMEOUT_MS_DEFAULT: u64 = 8_000;
/// Default `rail.proxy.body-bytes-max`.
pub const BODY_BYTES_MAX_DEFAULT: usize = 64 * 1024;
/// `retryAfterMillis` on `RAIL_UNAVAILABLE`.
pub const RAIL_UNAVAILABLE_RETRY_AFTER_MS: u64 = 1_000;

/// The proxy's settings (C5 keys `rail.proxy.*`).
#[derive(Debug, Clone)]
pub struct ProxyConfig {
    pub rail_url: BaseUrl,
    pub connect_timeout_ms: u64,
    pub read_timeout_ms: u64,
    pub fencing_enabled: bool,
    /// `rail.proxy.duplicate-guard.enabled`. `false` (only under `--profile unsafe-test`)
    /// forwards an attempt that step 2 refused: its DUPLICATE row is still written, then the
    /// rail is called anyway. It exists to prove, with fencing also off, that the rail pays
    /// twice and the reconciler catches it (C3-extensions E-8).
    pub duplicate_guard_enabled: bool,
    pub body_bytes_max: usize,
    /// `rail.proxy.grants.*`: whose grant signatures a submission accepts (C3-extensions
    /// E-14), checked before step 1.
    pub grants: dlock_contract::grant::GrantVerifier,
    /// `auth.*` (C3-extensions E-13).
    pub auth: dlock_http::auth::AuthSettings,
}

/// Pause between two orphan sweeps ([`RailProxy::sweep_orphans`]).
pub const ORPHAN_SWEEP_INTERVAL_MS: u64 = 5_000;
/// Orphaned intents one sweep records at most.
pub const ORPHAN_SWEEP_BATCH_MAX: i64 = 100;
/// How far ahead of this proxy's wall clock an unresolved intent's `submitted_at` may lie
/// and still be watched by the sweep: the replica that wrote it had a wall clock running
/// ahead (an intent stamped further ahead is a broken clock and waits for it).
pub const ORPHAN_WALL_AHEAD_MS_MAX: i64 = 24 * 3_600_000;
/// Unresolved intents one sweeper watches at most (their first sighting on its own
/// monotonic clock); past it, the newest sightings are not kept.
pub const ORPHAN_WATCHED_MAX: usize = 10_000;

/// Whether an unresolved intent is an orphan (no forward can still be in flight for it):
/// its `submitted_at` is a whole forward budget (`budget_ms`) older than this proxy's wall
/// clock (`budget_old_by_wall`), or this
/// proxy has itself watched it unresolved for a whole budget on its monotonic clock. The
/// second covers an intent stamped by a replica whose wall clock ran ahead: by wall time
/// alone it would look fresh for as long as that clock was ahead, and its payout would stay
/// SUBMITTED that long.
pub fn is_orphan(budget_old_by_wall: bool, watched_ms: u64, budget_ms: u64) -> bool {
    budget_old_by_wall || watched_ms >= budget_ms
}

/// BUGGIFY fault points (`dlock_rt::buggify`, never firing outside the simulation): how
/// often the forward stalls after the intent row, for at most how long (well inside one
/// forward's budget, so the orphan sweep never races a live forward), and how often the
/// connect fails before any byte.
const BUGGIFY_FORWARD_DELAY_P: f64 = 0.05;
const BUGGIFY_FORWARD_DELAY_MS_MAX: u64 = 1_000;
const BUGGIFY_UNSENT_P: f64 = 0.02;

/// Time allowed, beyond one forward's connect and read budgets, for the two transactions
/// around it when the proxy drains on shutdown.
pub const SHUTDOWN_MARGIN_MS: u64 = 5_000;

impl ProxyConfig {
    /// How long a graceful shutdown waits for in-flight submissions: the whole budget of
    /// one forward plus [`SHUTDOWN_MARGIN_MS`], so a drain never abandons a forward between
    /// the rail's answer and its recording.
    pub fn shutdown_grace_ms(&self) -> u64 {
        self.connect_timeout_ms.saturating_add(self.read_timeout_ms).saturating_add(SHUTDOWN_MARGIN_MS)
    }
}

/// What one submission came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The grant's signature did not verify (C3-extensions E-14); nothing written.
    GrantRefused(dlock_contract::grant::GrantError),
    /// Body or payout validation failed before step 1; nothing written.
    Invalid {
        message: String,
        fields: Vec<FieldError>,
    },
    /// The store could not commit steps 1–3, provably: nothing presented, nothing written
    /// (`StoreFault::Unavailable`).
    StoreUnavailable {
        cause: String,
    },
    /// The store's answer was lost (the intent may have committed, `CommitUnknown`) or
    /// unreadable (`Corrupt`): nothing was presented by this call, but whether its intent
    /// row exists is unknown, so the answer is never retry-safe.
    StoreUnknown {
        cause: String,
        /// The cause is a contradiction (corrupt content, or answers the rules say cannot
        /// be), not a lost commit answer (`dlock_http::ApiError::contradiction`).
        contradiction: bool,
    },
    /// The submission's task failed at an unknown point: it may have been forwarded.
    Unknown {
        cause: String,
    },
    Fenced {
        submission_id: Uuid,
        highest_token: i64,
    },
    Duplicate {
        submission_id: Uuid,
        first_submission_id: Uuid,
        first_submitted_at: DateTime<Utc>,
    },
    NotClaimable {
        state: PayoutState,
    },
    Acked {
        submission_id: Uuid,
        rail_reference: String,
        submitted_at: DateTime<Utc>,
        resolved_at: DateTime<Utc>,
    },
    Rejected {
        submission_id: Uuid,
    },
    Ambiguous {
        submission_id: Uuid,
        cause: String,
    },
    Unsent {
        submission_id: Uuid,
        cause: String,
    },
}

/// A store failure before the forward, by its class (C3-extensions C-29): only
/// `Unavailable` (provably nothing written) is `RAIL_UNAVAILABLE`; a lost or unreadable
/// answer is [`Outcome::StoreUnknown`].
fn store_outcome(e: StoreError) -> Outcome {
    match e.fault().code(dlock_contract::ErrorCode::RailUnavailable) {
        dlock_contract::ErrorCode::RailUnavailable => Outcome::StoreUnavailable { cause: e.to_string() },
        _ => Outcome::StoreUnknown {
            contradiction: e.fault() == dlock_contract::store::StoreFault::Corrupt,
            cause: e.to_string(),
        },
    }
}

/// Everything a submission carries once its headers have been validated.
#[derive(Debug, Clone)]
pub struct Submission {
    pub token: FencingToken,
    /// `X-Fencing-Signature`, if sent (syntax already checked).
    pub signature: Option<String>,
    pub owner: OwnerId,
    pub key: IdempotencyKey,
    pub body: SubmissionRequest,
    pub trace_id: String,
}

/// Everything a batch (R1b `POST /v1/rail/submission-batches`, C3-extensions E-19)
/// carries once its headers have been validated. It has no `X-Idempotency-Key`: each
/// submission carries its payout's key in the body.
#[derive(Debug, Clone)]
pub struct BatchSubmission {
    pub token: FencingToken,
    /// `X-Fencing-Signature`, if sent (syntax already checked).
    pub signature: Option<String>,
    pub owner: OwnerId,
    pub body: SubmissionBatchRequest,
    pub trace_id: String,
}

/// What one batch came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BatchOutcome {
    /// What concerns the whole request, answered as the single submission answers it (a
    /// refused grant, a store failure before any forward, a failed task); no item exists.
    Whole(Outcome),
    /// The mark fenced the batch's token: one FENCED row per validated payout, nothing
    /// forwarded; no item exists.
    Fenced { highest_token: i64 },
    /// One outcome per submission, in the request's order: each exactly the single
    /// submission's for that payout under the batch's token.
    Items(Vec<Outcome>),
}

/// Who a submission or a batch is sent by: its token, its owner, its trace.
struct Caller<'a> {
    token: i64,
    owner: &'a str,
    trace_id: &'a str,
}

/// One admitted payout's forward: its intent row, the body to present, and when the
/// intent was stamped.
struct Forward {
    submission_id: Uuid,
    body: SubmissionRequest,
    submitted_at: DateTime<Utc>,
}

/// The proxy: a store, a rail client, a clock, metrics. No token state of its own.
pub struct RailProxy {
    pub store: Arc<dyn RailStore>,
    pub cfg: ProxyConfig,
    pub clock: Clock,
    pub metrics: ProxyMetrics,
    client: HttpClient,
    /// Each unresolved intent the orphan sweep has seen, with when it first saw it (this
    /// proxy's monotonic clock). At most [`ORPHAN_WATCHED_MAX`]; forgotten once resolved.
    watched: std::sync::Mutex<std::collections::BTreeMap<Uuid, dlock_rt::Instant>>,
    /// paydb's event stream as this proxy serves it (its `rail.*` kinds, C3-extensions
    /// E-20), made at the first request for it: its cursor key is paydb's, read then.
    events: tokio::sync::OnceCell<Arc<dlock_http::stream::EventHub>>,
}

/// paydb's outbox, read through the proxy's store, as the event hub reads it.
struct StoreEvents(Arc<dyn RailStore>);

#[async_trait::async_trait]
impl dlock_http::stream::EventSource for StoreEvents {
    async fn read_events(
        &self,
        after: i64,
        upto: Option<i64>,
        limit: usize,
    ) -> Result<dlock_contract::stream::EventRead, crate::store::StoreError> {
        match upto {
            Some(upto) => self.0.read_final_events(after, upto, limit).await,
            None => self.0.read_events(after, limit).await,
        }
    }
}

impl RailProxy {
    /// The event hub, made at the first call (reading paydb's cursor key, or writing this
    /// proxy's candidate if none is stored yet).
    pub async fn event_hub(&self) -> Result<Arc<dlock_http::stream::EventHub>, crate::store::StoreError> {
        self.events
            .get_or_try_init(|| async {
                let mut candidate = [0u8; 32];
                for chunk in candidate.chunks_mut(8) {
                    chunk.copy_from_slice(&dlock_rt::rand::random_u64().to_le_bytes());
                }
                let at = self.clock.wall();
                let key = self.write(move |store| async move { store.cursor_secret(candidate, at).await }).await?;
                Ok(dlock_http::stream::EventHub::new(
                    dlock_paydb::events::STREAM,
                    crate::NODE,
                    Arc::new(StoreEvents(self.store.clone())),
                    key,
                    |k| k.is_rail(),
                    self.clock,
                ))
            })
            .await
            .cloned()
    }

    /// Runs one of the store's write transactions (`work`, given the store) on the store's
    /// writer thread when it has one (SQLite,
    /// docs/performance.md "The SQLite writer thread"), else on this task. Either way it
    /// runs to its end.
    pub async fn write<T, W>(&self, work: impl FnOnce(Arc<dyn RailStore>) -> W) -> T
    where
        W: std::future::Future<Output = T> + Send + 'static,
        T: Send + 'static,
    {
        dlock_rt::dedicated::run_on(self.store.writer_thread(), work(self.store.clone())).await
    }

    pub fn new(store: Arc<dyn RailStore>, cfg: ProxyConfig, clock: Clock) -> Arc<RailProxy> {
        let client = HttpClient::new(cfg.connect_timeout_ms, cfg.read_timeout_ms).without_bearer();
        // Every store call of this proxy is timed (`rail_store_op_seconds`).
        let metrics = ProxyMetrics::default();
        let store: Arc<dyn RailStore> = Arc::new(TimedRailStore {
            inner: store,
            ops: metrics.store_ops.clone(),
            off_writer: metrics.store_writes_off_writer.clone(),
            clock,
        });
        Arc::new(RailProxy {
            store,
            cfg,
            clock,
            metrics,
            client,
            watched: std::sync::Mutex::new(std::collections::BTreeMap::new()),
            events: tokio::sync::OnceCell::new(),
        })
    }

    /// One orphan sweep: every unresolved intent [`is_orphan`] judges to be one (older than
    /// one forward's whole budget, [`ProxyConfig::shutdown_grace_ms`], by this proxy's wall
    /// clock, or watched unresolved by this proxy for that long) belongs to a forward that
    /// can no longer be in flight (its proxy died or stalled mid-forward). The rail may have
    /// paid, so it is recorded as TIMEOUT and its payout quarantined (RAIL_AMBIGUOUS), never
    /// handed back for another attempt. At most [`ORPHAN_SWEEP_BATCH_MAX`] per pass; safe on
    /// every replica at once (recording an outcome is a no-op once one exists).
    pub async fn sweep_orphans(&self) -> Result<usize, crate::store::StoreError> {
        self.sweep_orphans_at(self.clock.wall(), self.clock.now()).await
    }

    /// [`RailProxy::sweep_orphans`] at the given wall and monotonic readings of this
    /// proxy's clock (a test drives time through it).
    pub async fn sweep_orphans_at(
        &self,
        now: DateTime<Utc>,
        mono: dlock_rt::Instant,
    ) -> Result<usize, crate::store::StoreError> {
        let budget_ms = self.cfg.shutdown_grace_ms();
        let budget = chrono::Duration::milliseconds(i64::try_from(budget_ms).unwrap_or(i64::MAX));
        let ahead = now + chrono::Duration::milliseconds(ORPHAN_WALL_AHEAD_MS_MAX);
        // Two reads, no new store query: every unresolved intent the sweep watches, and
        // those of them already a budget old by this proxy's wall clock.
        let unresolved = self.store.unresolved_before(ahead, ORPHAN_SWEEP_BATCH_MAX).await?;
        let aged = self.store.unresolved_before(now - budget, ORPHAN_SWEEP_BATCH_MAX).await?;
        let mut orphans: Vec<Uuid> = Vec::new();
        {
            let mut watched = self.watched.lock().unwrap_or_else(|e| e.into_inner());
            watched.retain(|id, _| unresolved.contains(id) || aged.contains(id));
            for id in unresolved.iter().chain(aged.iter()) {
                if orphans.contains(id) {
                    continue;
                }
                if !watched.contains_key(id) && watched.len() < ORPHAN_WATCHED_MAX {
                    watched.insert(*id, mono);
                }
                let watched_ms = watched.get(id).map_or(0, |first| {
                    u64::try_from(mono.saturating_duration_since(*first).as_millis()).unwrap_or(u64::MAX)
                });
                if is_orphan(aged.contains(id), watched_ms, budget_ms) {
                    orphans.push(*id);
                }
            }
        }
        for id in &orphans {
            let detail = "orphaned intent: the forward's outcome was never recorded (the proxy that sent it stopped); \
                          the rail may have paid";
            let (id, timeout) = (*id, Resolution::Timeout { detail: detail.into() });
            self.write(move |store| async move { store.resolve(id, &timeout, now).await }).await?;
            dlock_rt::probe::hit(Probe::OrphanIntentSwept);
            self.metrics.outcome(SubmissionOutcome::Timeout);
            // The sweep knows the row by its id only: the rest of the line says nothing.
            dlock_rt::events::emit(crate::NODE, "intent_outcome", || {
                let none = serde_json::Value::Null;
                [
                    ("submission", id.to_string().into()),
                    ("payout", none.clone()),
                    ("account", none.clone()),
                    ("owner", none.clone()),
                    ("presented_token", none.clone()),
                    ("outcome", format!("{:?}", SubmissionOutcome::Timeout).into()),
                    ("detail", detail.into()),
                    ("submitted_wall_ms", none),
                    ("resolved_wall_ms", now.timestamp_millis().into()),
                ]
            });
            tracing::warn!(submissionId = %id, cause = detail, "rail_ambiguous");
        }
        Ok(orphans.len())
    }

    /// The orphan sweep, every [`ORPHAN_SWEEP_INTERVAL_MS`], until the task is aborted.
    pub async fn run_orphan_sweeper(self: Arc<Self>) {
        loop {
            if let Err(e) = self.sweep_orphans().await {
                tracing::warn!(cause = %e, "rail_orphan_sweep_failed");
            }
            dlock_rt::sleep(std::time::Duration::from_millis(ORPHAN_SWEEP_INTERVAL_MS)).await;
        }
    }

    /// Readiness: the database answers and the rail accepts a connection.
    pub async fn readiness(&self) -> (Result<(), String>, Result<(), String>) {
        let db = self.store.ping().await.map_err(|e| e.to_string());
        let rail = self.client.probe(&self.cfg.rail_url).await.map_err(|e| e.to_string());
        (db, rail)
    }

    /// Runs one submission to its end. The work runs in its own task, so a caller that
    /// disconnects mid-forward cannot cancel the recording of the outcome.
    pub async fn submit(self: &Arc<Self>, s: Submission) -> Outcome {
        let this = self.clone();
        // The task stays in the request's trace (E-17): its rail call is a child span.
        match dlock_rt::spawn(dlock_rt::trace::carry(async move { this.run(s).await })).await {
            Ok(o) => o,
            // The task died somewhere between validation and recording: whether the rail was
            // reached is unknown, so the answer must not claim that nothing was presented.
            Err(e) => Outcome::Unknown { cause: format!("submission task failed: {e}") },
        }
    }

    /// Validation before step 1: the answer for a submission whose payout is missing, or
    /// whose body does not match it; `None` when it matches.
    fn invalid(asked: &Unstamped, payout: Option<&PayoutRow>) -> Option<Outcome> {
        let Some(payout) = payout else {
            return Some(Outcome::Invalid {
                message: "no such payout".into(),
                fields: vec![FieldError::new("payoutId", "does not name a known payout")],
            });
        };
        let mismatched = asked.mismatches(payout);
        (!mismatched.is_empty()).then(|| Outcome::Invalid {
            message: "the body does not match the payout".into(),
            fields: mismatched.into_iter().map(|f| FieldError::new(f, "does not match the payout")).collect(),
        })
    }

    async fn run(&self, s: Submission) -> Outcome {
        let body = &s.body;
        let caller = Caller { token: s.token.get(), owner: s.owner.as_str(), trace_id: &s.trace_id };
        let asked = self.unstamped(&caller, body, s.key.as_str());
        // The grant check (C3-extensions E-14), before step 1 compares the token to the
        // mark: signed by a trusted key for `payout:{accountId}` of the payout as stored, this
        // token and this owner. Checked against the body's account, which the admission then
        // requires to be the payout's; a refusal writes no row, and is answered only once
        // validation has passed (a body that does not match its payout is answered as that).
        if let Err(e) = self.verify_grant(&caller, &body.account_id, s.signature.as_deref()) {
            let payout = match self.store.payout(body.payout_id).await {
                Ok(p) => p,
                Err(e) => return store_outcome(e),
            };
            if let Some(invalid) = Self::invalid(&asked, payout.as_ref()) {
                return invalid;
            }
            tracing::warn!(payoutId = %body.payout_id, accountId = %body.account_id, presentedToken = caller.token,
                ownerId = %caller.owner, cause = %e, traceId = %caller.trace_id, "grant_signature_refused");
            return Outcome::GrantRefused(e);
        }

        // Validation and steps 1-3; the attempt is stamped (its id, its instant) between them.
        let stamp = self.stamper();
        let admitting = asked.clone();
        let checked = self.write(move |store| async move { store.admit_checked(&admitting, &*stamp).await }).await;
        let (attempt, admission) = match checked {
            Ok(Checked::Decided { attempt, admission }) => (attempt, admission),
            Ok(Checked::Unmatched(payout)) => return Self::unmatched(&asked, payout.as_ref()),
            Err(e) => {
                tracing::warn!(traceId = %caller.trace_id, payoutId = %body.payout_id, cause = %e, "rail_intent_not_committed");
                return store_outcome(e);
            }
        };
        self.emit_admission(&attempt, &admission);
        if let Admission::Fenced { highest_token } = admission {
            self.fenced_out(&caller, &body.account_id, &[body.payout_id], highest_token);
            return Outcome::Fenced { submission_id: attempt.submission_id, highest_token };
        }
        let forward = match self.past_the_mark(&caller, body, &attempt, admission) {
            Ok(forward) => forward,
            Err(answer) => return answer,
        };

        // Step 4: forward exactly once. No retry, no fallback, no second socket.
        let resolution = self.forward_once(body).await;
        let resolved_at = self.clock.wall();
        let (submission_id, recorded) = (forward.submission_id, resolution.clone());
        let resolve =
            move |store: Arc<dyn RailStore>| async move { store.resolve(submission_id, &recorded, resolved_at).await };
        let recorded = self.write(resolve).await;
        self.resolved(&caller, &forward, resolution, resolved_at, recorded.as_ref().err())
    }

    /// Runs one batch (R1b, C3-extensions E-19) to its end, in its own task as
    /// [`RailProxy::submit`] runs a submission: a caller that disconnects mid-forward cannot
    /// cancel the recording of the outcomes.
    pub async fn submit_batch(self: &Arc<Self>, b: BatchSubmission) -> BatchOutcome {
        let this = self.clone();
        match dlock_rt::spawn(dlock_rt::trace::carry(async move { this.run_batch(b).await })).await {
            Ok(o) => o,
            // The task died between validation and recording: whether any payout reached the
            // rail is unknown, so no answer may claim that nothing was presented.
            Err(e) => BatchOutcome::Whole(Outcome::Unknown { cause: format!("batch task failed: {e}") }),
        }
    }

    /// A batch: the grant checked once for `payout:{accountId}`, before anything is read;
    /// validation and steps 1-3 of every payout in one transaction
    /// ([`RailStore::admit_batch`]: one fence pass); a fenced batch answered whole; every
    /// admitted payout forwarded exactly once, all at once, never retried
    /// ([`RailProxy::forward_once`], the single path's); every outcome recorded in one
    /// transaction ([`RailStore::resolve_batch`]). Per payout, every event, metric and log
    /// line is the single submission's, written by the same code.
    async fn run_batch(self: Arc<Self>, b: BatchSubmission) -> BatchOutcome {
        let caller = Caller { token: b.token.get(), owner: b.owner.as_str(), trace_id: &b.trace_id };
        let account_id = &b.body.account_id;
        if let Err(e) = self.verify_grant(&caller, account_id, b.signature.as_deref()) {
            tracing::warn!(accountId = %account_id, presentedToken = caller.token, ownerId = %caller.owner,
                payouts = b.body.submissions.len(), cause = %e, traceId = %caller.trace_id, "grant_signature_refused");
            return BatchOutcome::Whole(Outcome::GrantRefused(e));
        }
        let bodies: Vec<SubmissionRequest> = b.body.submissions.iter().map(|s| s.request(account_id)).collect();
        let asked: Vec<Unstamped> = bodies
            .iter()
            .zip(&b.body.submissions)
            .map(|(body, s)| self.unstamped(&caller, body, &s.idempotency_key))
            .collect();
        let stamp = self.stamper();
        let admitting = asked.clone();
        let checked = self.write(move |store| async move { store.admit_batch(&admitting, &*stamp).await }).await;
        let checked = match checked {
            Ok(c) if c.len() == asked.len() => c,
            Ok(c) => {
                return BatchOutcome::Whole(Outcome::StoreUnknown {
                    cause: format!("{} answers for a batch of {}", c.len(), asked.len()),
                    contradiction: true,
                })
            }
            Err(e) => {
                tracing::warn!(traceId = %caller.trace_id, accountId = %account_id, payouts = asked.len(), cause = %e,
                    "rail_intent_not_committed");
                return BatchOutcome::Whole(store_outcome(e));
            }
        };
        for c in &checked {
            if let Checked::Decided { attempt, admission } = c {
                self.emit_admission(attempt, admission);
            }
        }
        let fenced: Vec<(Uuid, i64)> = checked
            .iter()
            .filter_map(|c| match c {
                Checked::Decided { attempt, admission: Admission::Fenced { highest_token } } => {
                    Some((attempt.payout_id, *highest_token))
                }
                _ => None,
            })
            .collect();
        if let Some((_, highest_token)) = fenced.first().copied() {
            let decided = checked.iter().filter(|c| matches!(c, Checked::Decided { .. })).count();
            if fenced.len() != decided {
                return BatchOutcome::Whole(Outcome::StoreUnknown {
                    cause: format!("the mark fenced {} of {decided} payouts of one pass", fenced.len()),
                    contradiction: true,
                });
            }
            let payouts: Vec<Uuid> = fenced.iter().map(|(p, _)| *p).collect();
            self.fenced_out(&caller, account_id, &payouts, highest_token);
            return BatchOutcome::Fenced { highest_token };
        }

        // Every answer that needs no forward; the forwards, each with its item's place.
        let mut items: Vec<Option<Outcome>> = Vec::with_capacity(checked.len());
        let mut forwards: Vec<(usize, Forward)> = Vec::new();
        for (i, (c, (body, asked))) in checked.into_iter().zip(bodies.iter().zip(&asked)).enumerate() {
            items.push(match c {
                Checked::Unmatched(payout) => Some(Self::unmatched(asked, payout.as_ref())),
                Checked::Decided { attempt, admission } => match self.past_the_mark(&caller, body, &attempt, admission)
                {
                    Ok(forward) => {
                        forwards.push((i, forward));
                        None
                    }
                    Err(answer) => Some(answer),
                },
            });
        }
        // Step 4 of every admitted payout: each forwarded exactly once, all of them at once
        // (at most the batch's size, `BATCH_PAYOUTS_MAX`), never retried.
        assert!(forwards.len() <= BATCH_PAYOUTS_MAX, "a batch forwards at most {BATCH_PAYOUTS_MAX} payouts");
        let calls: Vec<_> = forwards
            .iter()
            .map(|(_, f)| {
                let (this, body) = (self.clone(), f.body.clone());
                dlock_rt::spawn(dlock_rt::trace::carry(async move { this.forward_once(&body).await }))
            })
            .collect();
        let mut resolutions = Vec::with_capacity(calls.len());
        for call in calls {
            resolutions.push(call.await.map_err(|e| format!("forward task failed: {e}")));
        }
        let resolved_at = self.clock.wall();
        // Every outcome known, in one transaction. A forward whose task failed has no
        // outcome: its intent stays unresolved until the orphan sweep quarantines it.
        let outcomes: Vec<(Uuid, Resolution)> = forwards
            .iter()
            .zip(&resolutions)
            .filter_map(|((_, f), r)| r.as_ref().ok().map(|r| (f.submission_id, r.clone())))
            .collect();
        let recorded = if outcomes.is_empty() {
            Ok(())
        } else {
            self.write(move |store| async move { store.resolve_batch(&outcomes, resolved_at).await }).await
        };
        for ((i, forward), resolution) in forwards.iter().zip(resolutions) {
            let outcome = match resolution {
                Ok(resolution) => self.resolved(&caller, forward, resolution, resolved_at, recorded.as_ref().err()),
                // As a single submission whose task failed: whether the rail was reached is
                // unknown, and the unresolved intent is the orphan sweep's to quarantine.
                Err(cause) => {
                    tracing::error!(payoutId = %forward.body.payout_id, submissionId = %forward.submission_id,
                        presentedToken = caller.token, cause = %cause, traceId = %caller.trace_id,
                        "rail_forward_task_failed");
                    Outcome::Unknown { cause }
                }
            };
            if let Some(item) = items.get_mut(*i) {
                *item = Some(outcome);
            }
        }
        let items: Option<Vec<Outcome>> = items.into_iter().collect();
        match items {
            Some(items) => BatchOutcome::Items(items),
            None => BatchOutcome::Whole(Outcome::Unknown { cause: "a batch item was never answered".into() }),
        }
    }

    /// A submission's ask of the store, under `caller`'s token and owner.
    fn unstamped(&self, caller: &Caller<'_>, body: &SubmissionRequest, key: &str) -> Unstamped {
        Unstamped {
            payout_id: body.payout_id,
            account_id: body.account_id.clone(),
            presented_token: caller.token,
            owner_id: caller.owner.to_owned(),
            idempotency_key: key.to_owned(),
            amount_minor: body.amount_minor,
            currency: body.currency.clone(),
            beneficiary_ref: body.beneficiary_ref.clone(),
            fencing_enabled: self.cfg.fencing_enabled,
        }
    }

    /// The grant check (C3-extensions E-14): `caller`'s token and owner signed for
    /// `payout:{account_id}` by a trusted key.
    fn verify_grant(
        &self,
        caller: &Caller<'_>,
        account_id: &str,
        signature: Option<&str>,
    ) -> Result<(), dlock_contract::grant::GrantError> {
        let lock_key = dlock_contract::grant::payout_lock_key(account_id);
        self.cfg.grants.verify(signature, &lock_key, caller.token, Some(caller.owner)).map(|_| ())
    }

    /// Each attempt's id and instant, drawn from the runtime's seam when the store stamps it.
    fn stamper(&self) -> Arc<dyn Fn() -> (Uuid, DateTime<Utc>) + Send + Sync> {
        let clock = self.clock;
        Arc::new(move || (dlock_rt::rand::uuid_v4(), clock.wall()))
    }

    /// The answer for a submission the store found unmatched (no such payout, or a body
    /// that does not match it).
    fn unmatched(asked: &Unstamped, payout: Option<&PayoutRow>) -> Outcome {
        Self::invalid(asked, payout).unwrap_or_else(|| Outcome::StoreUnknown {
            cause: format!("payout {} matches the submission the store refused as unmatched", asked.payout_id),
            contradiction: true,
        })
    }

    /// Step 1 refused `caller`'s token for `payouts` of `account_id` (their FENCED rows
    /// committed): the probe and the log line once, the fenced-out count once, one
    /// `rail_submission_total{outcome=fenced}` per row. A single submission names its one
    /// payout (`payoutId`); a batch names them all (`payoutIds`).
    fn fenced_out(&self, caller: &Caller<'_>, account_id: &str, payouts: &[Uuid], highest_token: i64) {
        dlock_rt::probe::hit(Probe::FencedOutRail);
        for _ in payouts {
            self.metrics.outcome(SubmissionOutcome::Fenced);
        }
        self.metrics.fenced_out.inc(RESOURCE_RAIL);
        match payouts {
            [payout_id] => tracing::warn!(
                resource = "rail",
                resourceId = %account_id,
                payoutId = %payout_id,
                presentedToken = caller.token,
                highestToken = highest_token,
                ownerId = %caller.owner,
                traceId = %caller.trace_id,
                "fenced_out"
            ),
            _ => tracing::warn!(
                resource = "rail",
                resourceId = %account_id,
                payoutIds = %payouts.iter().map(Uuid::to_string).collect::<Vec<_>>().join(","),
                presentedToken = caller.token,
                highestToken = highest_token,
                ownerId = %caller.owner,
                traceId = %caller.trace_id,
                "fenced_out"
            ),
        }
    }

    /// An admission past the mark: a duplicate (counted, logged, refused; forwarded anyway
    /// only with the duplicate guard off, `--profile unsafe-test`), not claimable, or
    /// admitted: the forward to make (`Ok`), or the answer (`Err`). The mark's refusal is
    /// [`RailProxy::fenced_out`]'s, answered by the caller.
    fn past_the_mark(
        &self,
        caller: &Caller<'_>,
        body: &SubmissionRequest,
        attempt: &Attempt,
        admission: Admission,
    ) -> Result<Forward, Outcome> {
        let submission_id = attempt.submission_id;
        let submitted_at = match admission {
            Admission::Fenced { highest_token } => return Err(Outcome::Fenced { submission_id, highest_token }),
            Admission::Duplicate { first_submitted_at, first_submission_id } => {
                self.metrics.outcome(SubmissionOutcome::Duplicate);
                self.metrics.duplicates.inc();
                tracing::error!(
                    payoutId = %body.payout_id,
                    presentedToken = caller.token,
                    ownerId = %caller.owner,
                    firstSubmittedAt = %dlock_contract::time::rfc3339_ms(first_submitted_at),
                    firstSubmissionId = %first_submission_id,
                    traceId = %caller.trace_id,
                    "duplicate_rail_submission_attempted"
                );
                if self.cfg.duplicate_guard_enabled {
                    dlock_rt::probe::hit(Probe::DuplicateRefused);
                    return Err(Outcome::Duplicate { submission_id, first_submission_id, first_submitted_at });
                }
                // unsafe-test only: forward what step 2 refused. Its row already says DUPLICATE,
                // so the outcome of this forward is not recorded; the rail's record shows it.
                tracing::error!(payoutId = %body.payout_id, submissionId = %submission_id, traceId = %caller.trace_id,
                    "rail_duplicate_guard_bypassed");
                self.clock.wall()
            }
            Admission::NotClaimable { state } => return Err(Outcome::NotClaimable { state }),
            Admission::Admitted { submitted_at } => submitted_at,
        };
        Ok(Forward { submission_id, body: body.clone(), submitted_at })
    }

    /// Step 4's one forward of `body`, with its BUGGIFY points (simulation only): a stall
    /// between the intent row and the socket, or a connect that fails before any byte is
    /// sent. No retry, no fallback, no second socket.
    async fn forward_once(&self, body: &SubmissionRequest) -> Resolution {
        dlock_rt::buggify::delay(BUGGIFY_FORWARD_DELAY_P, BUGGIFY_FORWARD_DELAY_MS_MAX).await;
        if dlock_rt::buggify::fires(BUGGIFY_UNSENT_P) {
            Resolution::Unsent { detail: "buggify: the connect failed before any byte was sent".into() }
        } else {
            self.forward(body).await
        }
    }

    /// The answer for a forward's `resolution`, whose recording failed with `unrecorded`
    /// (`None`: recorded): an unrecorded outcome is quarantined by answer (the unresolved
    /// intent row is the evidence the reconciler reports); a recorded one is counted, traced
    /// (`intent_outcome`), logged and answered by what the rail did.
    fn resolved(
        &self,
        caller: &Caller<'_>,
        forward: &Forward,
        resolution: Resolution,
        resolved_at: DateTime<Utc>,
        unrecorded: Option<&StoreError>,
    ) -> Outcome {
        let (body, submission_id, submitted_at) = (&forward.body, forward.submission_id, forward.submitted_at);
        let outcome = resolution.outcome();
        if let Some(e) = unrecorded {
            // The rail may have acted and we cannot record it: quarantine by answer; the
            // unresolved intent row is the evidence the reconciler reports.
            tracing::error!(
                payoutId = %body.payout_id,
                submissionId = %submission_id,
                presentedToken = caller.token,
                cause = %format!("outcome {} not recorded: {e}", outcome.as_str()),
                traceId = %caller.trace_id,
                "rail_ambiguous"
            );
            self.metrics.outcome(SubmissionOutcome::Timeout);
            dlock_rt::probe::hit(Probe::AmbiguousOutcome);
            return Outcome::Ambiguous { submission_id, cause: "the outcome could not be recorded".into() };
        }
        self.metrics.outcome(outcome);
        dlock_rt::events::emit(crate::NODE, "intent_outcome", || {
            [
                ("submission", submission_id.to_string().into()),
                ("payout", body.payout_id.to_string().into()),
                ("account", body.account_id.clone().into()),
                ("owner", caller.owner.into()),
                ("presented_token", caller.token.into()),
                ("outcome", format!("{outcome:?}").into()),
                ("detail", dlock_rt::events::opt(resolution.detail().map(str::to_owned))),
                ("submitted_wall_ms", submitted_at.timestamp_millis().into()),
                ("resolved_wall_ms", resolved_at.timestamp_millis().into()),
            ]
        });
        tracing::info!(
            payoutId = %body.payout_id,
            submissionId = %submission_id,
            presentedToken = caller.token,
            outcome = outcome.as_str(),
            traceId = %caller.trace_id,
            "rail_submission_resolved"
        );
        match resolution {
            Resolution::Acked { rail_reference } => {
                Outcome::Acked { submission_id, rail_reference, submitted_at, resolved_at }
            }
            Resolution::Rejected { .. } => Outcome::Rejected { submission_id },
            Resolution::Timeout { detail } => {
                dlock_rt::probe::hit(Probe::AmbiguousOutcome);
                tracing::error!(
                    payoutId = %body.payout_id,
                    submissionId = %submission_id,
                    presentedToken = caller.token,
                    cause = %detail,
                    traceId = %caller.trace_id,
                    "rail_ambiguous"
                );
                Outcome::Ambiguous { submission_id, cause: detail }
            }
            Resolution::Unsent { detail } => Outcome::Unsent { submission_id, cause: detail },
        }
    }

    /// The `fenced_write` event of an admission (op `admit`: the rail's high-water mark),
    /// and its `intent` when the intent row was written ([`dlock_rt::events`]); emitted here,
    /// the one code path every store's admission answers through.
    fn emit_admission(&self, a: &Attempt, admission: &Admission) {
        if !dlock_rt::events::enabled() {
            return;
        }
        let (answer, stored, tag) = match admission {
            Admission::Admitted { .. } => ("accepted", Some(a.presented_token), "admitted"),
            Admission::Fenced { highest_token } => ("fenced_out", Some(*highest_token), "fenced"),
            Admission::Duplicate { .. } => ("accepted", Some(a.presented_token), "duplicate"),
            Admission::NotClaimable { .. } => ("no_decision", None, "not_claimable"),
        };
        let fenced = a.fencing_enabled && !dlock_rt::defence::off(dlock_rt::defence::Layer::RailMark);
        dlock_rt::events::emit(crate::NODE, "fenced_write", || {
            [
                ("op", "admit".into()),
                ("payout", a.payout_id.to_string().into()),
                ("account", a.account_id.clone().into()),
                ("owner", a.owner_id.clone().into()),
                ("presented_token", a.presented_token.into()),
                ("stored_token", dlock_rt::events::opt(stored)),
                ("answer", answer.into()),
                ("admission", tag.into()),
                ("fenced", fenced.into()),
                ("state_before", serde_json::Value::Null),
                ("replay", false.into()),
            ]
        });
        if matches!(admission, Admission::Admitted { .. }) {
            dlock_rt::events::emit(crate::NODE, "intent", || {
                [
                    ("payout", a.payout_id.to_string().into()),
                    ("account", a.account_id.clone().into()),
                    ("owner", a.owner_id.clone().into()),
                    ("presented_token", a.presented_token.into()),
                ]
            });
        }
    }

    async fn forward(&self, body: &SubmissionRequest) -> Resolution {
        let rail_body = RailSubmit {
            client_ref: body.payout_id.to_string(),
            amount_minor: body.amount_minor,
            currency: body.currency.clone(),
        };
        let bytes = match serde_json::to_vec(&rail_body) {
            Ok(b) => b,
            Err(e) => return Resolution::Unsent { detail: format!("could not encode the rail request: {e}") },
        };
        let started = self.clock.now();
        let sent = self
            .client
            .send(
                &self.cfg.rail_url,
                http::Method::POST,
                "/submit",
                &[("content-type", dlock_contract::CONTENT_TYPE_JSON)],
                Some(bytes.into()),
            )
            .await;
        let resolution = classify(sent);
        self.metrics.rail_calls.observe(RailCall::of(resolution.outcome()), self.clock.now() - started);
        resolution
    }

    /// The `/metrics` text, with the store's pool read now.
    pub fn render_metrics(&self) -> String {
        self.metrics.pool.set(self.store.pool_stats());
        self.metrics.render()
    }
}

/// Maps the one forward's fate onto a recorded outcome. Only an acknowledged 200 with a
/// well-formed body is ACKED, only 402 is a decline, only a failed connect is UNSENT;
/// everything else may have moved money and is ambiguous.
pub fn classify(sent: Result<dlock_rt::http::ClientResponse, ClientError>) -> Resolution {
    match sent {
        Ok(resp) if resp.status == 200 => match serde_json::from_slice::<RailAck>(&resp.body) {
            Ok(ack) if !ack.rail_reference.is_empty() => Resolution::Acked { rail_reference: ack.rail_reference },
            _ => Resolution::Timeout { detail: "malformed ack".into() },
        },
        Ok(resp) if resp.status == 402 => Resolution::Rejected { detail: "declined by the rail (402)".into() },
        Ok(resp) => Resolution::Timeout { detail: format!("rail answered {}", resp.status) },
        Err(e) if e.nothing_sent() => Resolution::Unsent { detail: e.to_string() },
        Err(ClientError::Timeout(ms)) => Resolution::Timeout { detail: format!("no answer within {ms} ms") },
        Err(e) => Resolution::Timeout { detail: e.to_string() },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use dlock_rt::http::ClientResponse;

    fn resp(status: u16, body: &str) -> Result<ClientResponse, ClientError> {
        Ok(ClientResponse { status, headers: http::HeaderMap::new(), body: body.to_owned().into() })
    }

    #[test]
    fn a_corrupt_store_answer_is_a_contradiction_and_a_lost_commit_answer_is_not() {
        let of = |e: StoreError| match store_outcome(e) {
            Outcome::StoreUnknown { contradiction, .. } => Some(contradiction),
            _ => None,
        };
        assert_eq!(of(StoreError::Corrupt("a guard refused what the rule decided".into())), Some(true));
        assert_eq!(of(StoreError::CommitUnknown("timeout".into())), Some(false));
        assert_eq!(of(StoreError::Unavailable("down".into())), None);
    }

    #[test]
    fn an_intent_is_an_orphan_once_a_budget_old_by_wall_or_watched_for_a_budget() {
        assert!(is_orphan(true, 0, 14_000));
        assert!(is_orphan(false, 14_000, 14_000));
        assert!(!is_orphan(false, 13_999, 14_000));
    }

    #[test]
    fn only_a_well_formed_200_counts_as_acked() {
        let ok = r#"{"railReference":"RR-1","acceptedAt":"2026-11-30T11:00:00.000Z"}"#;
        assert_eq!(classify(resp(200, ok)), Resolution::Acked { rail_reference: "RR-1".into() });
        assert_eq!(classify(resp(200, "{}")).outcome(), SubmissionOutcome::Timeout);
        assert_eq!(classify(resp(200, "garbage")).outcome(), SubmissionOutcome::Timeout);
    }

    #[test]
    fn decline_is_rejected_and_other_statuses_are_ambiguous() {
        assert_eq!(classify(resp(402, "")).outcome(), SubmissionOutcome::Rejected);
        for s in [400, 404, 409, 500, 502, 503] {
            assert_eq!(classify(resp(s, "")).outcome(), SubmissionOutcome::Timeout, "{s}");
        }
    }

    #[test]
    fn connect_failure_is_unsent_and_lost_answers_are_ambiguous() {
        assert_eq!(classify(Err(ClientError::Connect("refused".into()))).outcome(), SubmissionOutcome::Unsent);
        assert_eq!(classify(Err(ClientError::Timeout(8000))).outcome(), SubmissionOutcome::Timeout);
        assert_eq!(classify(Err(ClientError::Broken("reset".into()))).outcome(), SubmissionOutcome::Timeout);
    }
}
