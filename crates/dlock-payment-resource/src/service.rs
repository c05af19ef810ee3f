//! The payment-resource, independent of HTTP: configuration, the clock, the idempotency
//! identity of a request, the P1 cursor key, and the bounded purge of expired records.

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use dlock_rt::Clock;
use serde::Serialize;

use crate::cursor::CursorKey;
use crate::metrics::PaymentMetrics;
use crate::store::{IdemRequest, Operation, PaymentStore, StoreError};
use crate::store_timed::TimedPaymentStore;

/// Default `payment.resource.body-bytes-max`.
pub const BODY_BYTES_MAX_DEFAULT: usize = 64 * 1024;
/// Default `payment.idempotency.retention-ms` (24 h, the Remora seed's retention).
pub const IDEMPOTENCY_RETENTION_MS_DEFAULT: u64 = 86_400_000;
/// Smallest accepted `payment.idempotency.retention-ms` (1 min).
pub const IDEMPOTENCY_RETENTION_MS_MIN: u64 = 60_000;
/// Largest accepted `payment.idempotency.retention-ms` (7 days).
pub const IDEMPOTENCY_RETENTION_MS_MAX: u64 = 604_800_000;
/// Default `payment.idempotency.purge-interval-ms`.
pub const IDEMPOTENCY_PURGE_INTERVAL_MS_DEFAULT: u64 = 60_000;
/// Default `payment.idempotency.purge-batch-max`: rows one DELETE removes at most.
pub const IDEMPOTENCY_PURGE_BATCH_MAX_DEFAULT: i64 = 1_000;
/// Largest accepted `payment.idempotency.purge-batch-max`.
pub const IDEMPOTENCY_PURGE_BATCH_MAX_LIMIT: i64 = 100_000;
/// Batches one purge pass deletes at most (it repeats only while batches come back full).
pub const IDEMPOTENCY_PURGE_BATCHES_PER_PASS_MAX: u32 = 10;
/// `retryAfterMillis` on `NOT_READY` (paydb could not decide).
pub const NOT_READY_RETRY_AFTER_MS: u64 = 1_000;
/// How long a graceful shutdown waits for in-flight requests. Each is one short
/// transaction; nothing here calls out over the network.
pub const SHUTDOWN_GRACE_MS_MAX: u64 = 5_000;

/// The payment-resource's settings (C5 keys `payment.*`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PaymentConfig {
    pub body_bytes_max: usize,
    pub idempotency_retention_ms: u64,
    pub purge_interval_ms: u64,
    pub purge_batch_max: i64,
    /// `payment.grants.*`: whose grant signatures a claim or a post accepts (C3-extensions
    /// E-14). The default trusts no key and refuses every fenced write.
    pub grants: dlock_contract::grant::GrantVerifier,
    /// `auth.*` (C3-extensions E-13).
    pub auth: dlock_http::auth::AuthSettings,
    /// paydb's events kept by the purge (`payment.events.retention-events`; C3-extensions
    /// E-20): a stream cursor below them is expired.
    pub event_retention_events: i64,
}

impl Default for PaymentConfig {
    fn default() -> Self {
        PaymentConfig {
            body_bytes_max: BODY_BYTES_MAX_DEFAULT,
            idempotency_retention_ms: IDEMPOTENCY_RETENTION_MS_DEFAULT,
            purge_interval_ms: IDEMPOTENCY_PURGE_INTERVAL_MS_DEFAULT,
            purge_batch_max: IDEMPOTENCY_PURGE_BATCH_MAX_DEFAULT,
            grants: dlock_contract::grant::GrantVerifier::default(),
            auth: dlock_http::auth::AuthSettings::disabled(),
            event_retention_events: dlock_contract::stream::EVENT_RETENTION_EVENTS_DEFAULT,
        }
    }
}

impl PaymentConfig {
    /// Refuses settings outside their documented ranges, naming the key.
    pub fn validate(&self) -> Result<(), String> {
        if self.body_bytes_max == 0 {
            return Err("payment.resource.body-bytes-max must be > 0".into());
        }
        if !(IDEMPOTENCY_RETENTION_MS_MIN..=IDEMPOTENCY_RETENTION_MS_MAX).contains(&self.idempotency_retention_ms) {
            return Err(format!(
                "payment.idempotency.retention-ms must be {IDEMPOTENCY_RETENTION_MS_MIN}..={IDEMPOTENCY_RETENTION_MS_MAX} \
                 (1 minute to 7 days)"
            ));
        }
        if self.event_retention_events < dlock_contract::stream::EVENT_RETENTION_EVENTS_MIN {
            return Err(format!(
                "payment.events.retention-events must be >= {}",
                dlock_contract::stream::EVENT_RETENTION_EVENTS_MIN
            ));
        }
        if self.purge_interval_ms == 0 {
            return Err("payment.idempotency.purge-interval-ms must be > 0".into());
        }
        if !(1..=IDEMPOTENCY_PURGE_BATCH_MAX_LIMIT).contains(&self.purge_batch_max) {
            return Err(format!("payment.idempotency.purge-batch-max must be 1..={IDEMPOTENCY_PURGE_BATCH_MAX_LIMIT}"));
        }
        Ok(())
    }
}

/// The service: a store, a clock, the cursor key, metrics. It keeps no payout or fence
/// state of its own between requests.
pub struct PaymentResource {
    pub store: Arc<dyn PaymentStore>,
    pub cfg: PaymentConfig,
    pub clock: Clock,
    pub metrics: PaymentMetrics,
    pub(crate) cursor: CursorKey,
    /// paydb's event stream as this service serves it (C3-extensions E-20): every paydb
    /// kind but the rail's.
    pub events: Arc<dlock_http::stream::EventHub>,
}

/// paydb's outbox, read through the store, as the event hub reads it.
struct StoreEvents(Arc<dyn PaymentStore>);

#[async_trait::async_trait]
impl dlock_http::stream::EventSource for StoreEvents {
    async fn read_events(
        &self,
        after: i64,
        upto: Option<i64>,
        limit: usize,
    ) -> Result<dlock_contract::stream::EventRead, StoreError> {
        match upto {
            Some(upto) => self.0.read_final_events(after, upto, limit).await,
            None => self.0.read_events(after, limit).await,
        }
    }
}

impl std::fmt::Debug for PaymentResource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PaymentResource").field("cfg", &self.cfg).finish_non_exhaustive()
    }
}

/// [`PaymentResource::write`] over `store` itself: also what start-up's one write (the cursor
/// secret) uses, before there is a [`PaymentResource`].
async fn write_to<T, W>(store: &Arc<dyn PaymentStore>, work: impl FnOnce(Arc<dyn PaymentStore>) -> W) -> T
where
    W: std::future::Future<Output = T> + Send + 'static,
    T: Send + 'static,
{
    dlock_rt::dedicated::run_on(store.writer_thread(), work(store.clone())).await
}

impl PaymentResource {
    /// Runs one of the store's write transactions (`work`, given the store) on the store's
    /// writer thread when it has one (SQLite,
    /// docs/performance.md "The SQLite writer thread"), else on this task. Either way it
    /// runs to its end.
    pub async fn write<T, W>(&self, work: impl FnOnce(Arc<dyn PaymentStore>) -> W) -> T
    where
        W: std::future::Future<Output = T> + Send + 'static,
        T: Send + 'static,
    {
        write_to(&self.store, work).await
    }

    /// Reads (or, on a fresh paydb, creates) the deployment's cursor key, then serves.
    pub async fn start(
        store: Arc<dyn PaymentStore>,
        cfg: PaymentConfig,
        clock: Clock,
    ) -> Result<Arc<PaymentResource>, StoreError> {
        let mut candidate = [0u8; 32];
        for chunk in candidate.chunks_mut(8) {
            chunk.copy_from_slice(&dlock_rt::rand::random_u64().to_le_bytes());
        }
        // Every paydb call of this instance is timed (`payout_store_op_seconds`).
        let metrics = PaymentMetrics::default();
        let store: Arc<dyn PaymentStore> = Arc::new(TimedPaymentStore {
            inner: store,
            ops: metrics.store_ops.clone(),
            off_writer: metrics.store_writes_off_writer.clone(),
            clock,
        });
        let at = dlock_contract::time::truncate_ms(clock.wall());
        let secret = write_to(&store, move |store| async move { store.cursor_secret(candidate, at).await }).await?;
        let cursor = CursorKey::new(secret);
        let events = dlock_http::stream::EventHub::new(
            dlock_paydb::events::STREAM,
            crate::NODE,
            Arc::new(StoreEvents(store.clone())),
            cursor.event_key(),
            |k| !k.is_rail(),
            clock,
        );
        Ok(Arc::new(PaymentResource { store, cfg, clock, metrics, cursor, events }))
    }

    /// This replica's wall clock, truncated to whole milliseconds (every instant paydb
    /// stores is, so that PostgreSQL, SQLite, memory and the cursor agree exactly).
    pub fn now(&self) -> DateTime<Utc> {
        dlock_contract::time::truncate_ms(self.clock.wall())
    }

    /// The identity and fingerprint of one mutating request (see [`crate::idempotency`]).
    #[allow(clippy::too_many_arguments)]
    pub fn identity<T: Serialize>(
        &self,
        operation: Operation,
        target_id: &str,
        key: &str,
        token: i64,
        owner_id: &str,
        body: &T,
        at: DateTime<Utc>,
    ) -> Result<IdemRequest, String> {
        let fingerprint = crate::idempotency::fingerprint(operation.as_str(), target_id, owner_id, body)?;
        let retention = chrono::Duration::milliseconds(i64::try_from(self.cfg.idempotency_retention_ms).unwrap_or(0));
        Ok(IdemRequest {
            operation,
            target_id: target_id.to_owned(),
            key: key.to_owned(),
            token,
            owner_id: owner_id.to_owned(),
            fingerprint,
            at,
            expires_at: at + retention,
        })
    }

    /// One purge pass: deletes expired records in batches of `purge_batch_max`, repeating
    /// while batches come back full, at most [`IDEMPOTENCY_PURGE_BATCHES_PER_PASS_MAX`] times.
    /// Safe on every replica at once.
    pub async fn purge_pass(&self, now: DateTime<Utc>) -> Result<u64, StoreError> {
        let mut deleted = 0u64;
        let batch_max = self.cfg.purge_batch_max;
        for _ in 0..IDEMPOTENCY_PURGE_BATCHES_PER_PASS_MAX {
            let n = self.write(move |store| async move { store.purge_idempotency(now, batch_max).await }).await?;
            deleted += n;
            for _ in 0..n {
                self.metrics.purged.inc();
            }
            if n < u64::try_from(self.cfg.purge_batch_max).unwrap_or(u64::MAX) {
                break;
            }
        }
        Ok(deleted)
    }

    /// The purge job: one pass every `purge_interval_ms`, until the task is aborted.
    pub async fn run_purger(self: Arc<Self>) {
        loop {
            dlock_rt::sleep(Duration::from_millis(self.cfg.purge_interval_ms)).await;
            match self.purge_pass(self.now()).await {
                Ok(0) => {}
                Ok(deleted) => tracing::info!(deleted, "idempotency_purge_pass"),
                Err(e) => tracing::warn!(cause = %e, "idempotency_purge_failed"),
            }
            let keep = self.cfg.event_retention_events;
            match self.write(move |store| async move { store.purge_events(keep).await }).await {
                Ok(0) => {}
                Ok(deleted) => tracing::info!(deleted, "event_purge_pass"),
                Err(e) => tracing::warn!(cause = %e, "event_purge_failed"),
            }
        }
    }

    /// Readiness of paydb.
    pub async fn readiness(&self) -> Result<(), String> {
        self.store.ping().await.map_err(|e| e.to_string())
    }

    /// The metrics exposition, with the backlog age read from paydb now.
    pub async fn render_metrics(&self) -> String {
        let age = match self.store.oldest_pending_created_at().await {
            Ok(Some(oldest)) => Some(((self.now() - oldest).num_milliseconds().max(0) as f64) / 1000.0),
            Ok(None) => Some(0.0),
            Err(_) => None,
        };
        self.metrics.pool.set(self.store.pool_stats());
        self.metrics.render(age)
    }
}
