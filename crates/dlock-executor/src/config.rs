//! The executor's settings. Every hop budget of C3 §3.8 is a named setting with its unit.

use std::net::SocketAddr;

use dlock_config::{safety_switch, Layers, Profile};
use dlock_contract::OwnerId;
use dlock_rt::http::BaseUrl;

/// Every key the executor reads (`payment.fencing.enabled` is its lease check).
pub const KEYS: &[&str] = &[
    "executor.listen",
    "executor.lock-url",
    "executor.payment-url",
    "executor.proxy-url",
    "executor.owner-id",
    "executor.concurrency",
    "executor.poll-interval-ms",
    "executor.batch-max",
    "executor.lock-ttl-ms",
    "executor.lock-wait-ms",
    "executor.affinity-index",
    "executor.affinity-count",
    "executor.affinity-steal-after-ms",
    "executor.chain-payouts-max",
    "executor.payouts-per-grant-max",
    "executor.write.connect-timeout-ms",
    "executor.write.read-timeout-ms",
    "executor.write.retries-max",
    "executor.submit.connect-timeout-ms",
    "executor.submit.read-timeout-ms",
    "executor.read.connect-timeout-ms",
    "executor.read.read-timeout-ms",
    "executor.read.tries-max",
    "payment.fencing.enabled",
    "executor.chaos.pause-rate",
    "executor.chaos.pause-ms",
    "executor.chaos.pause-hops",
    "executor.auth.token-file",
    "executor.auth.token",
];

/// Default `executor.listen` (its `/metrics` and `/health`).
pub const LISTEN_DEFAULT: ([u8; 4], u16) = ([127, 0, 0, 1], 8085);

/// The executor's resolved settings.
#[derive(Debug, Clone)]
pub struct ExecutorSettings {
    pub listen: SocketAddr,
    pub config: ExecutorConfig,
}

/// Resolves every executor key and checks the ranges; `payment.fencing.enabled=false` is
/// refused outside `unsafe-test`, with the same error for every command.
pub fn resolve(layers: &Layers, profile: Profile) -> Result<ExecutorSettings, String> {
    let listen = layers.get("executor.listen", SocketAddr::from(LISTEN_DEFAULT))?;
    let url = |key: &str, default: &str| -> Result<BaseUrl, String> {
        let raw = layers.get(key, default.to_owned())?;
        BaseUrl::parse(&raw).map_err(|e| format!("{key}: {e}"))
    };
    let owner = layers.get("executor.owner-id", "executor".to_owned())?;
    let owner = OwnerId::parse(&owner).map_err(|e| format!("executor.owner-id: {e}"))?;
    let mut cfg = ExecutorConfig::new(
        url("executor.lock-url", "http://127.0.0.1:8081")?,
        url("executor.payment-url", "http://127.0.0.1:8082")?,
        url("executor.proxy-url", "http://127.0.0.1:8083")?,
        owner,
    );
    cfg.concurrency = layers.get("executor.concurrency", cfg.concurrency)?;
    cfg.poll_interval_ms = layers.get("executor.poll-interval-ms", cfg.poll_interval_ms)?;
    cfg.batch_max = layers.get("executor.batch-max", cfg.batch_max)?;
    cfg.lock_ttl_ms = layers.get("executor.lock-ttl-ms", cfg.lock_ttl_ms)?;
    cfg.lock_wait_ms = layers.get("executor.lock-wait-ms", cfg.lock_wait_ms)?;
    cfg.affinity_index = layers.get("executor.affinity-index", cfg.affinity_index)?;
    cfg.affinity_count = layers.get("executor.affinity-count", cfg.affinity_count)?;
    cfg.affinity_steal_after_ms = layers.get("executor.affinity-steal-after-ms", cfg.affinity_steal_after_ms)?;
    cfg.chain_payouts_max = layers.get("executor.chain-payouts-max", cfg.chain_payouts_max)?;
    cfg.payouts_per_grant_max = layers.get("executor.payouts-per-grant-max", cfg.payouts_per_grant_max)?;
    cfg.write_connect_timeout_ms = layers.get("executor.write.connect-timeout-ms", cfg.write_connect_timeout_ms)?;
    cfg.write_read_timeout_ms = layers.get("executor.write.read-timeout-ms", cfg.write_read_timeout_ms)?;
    cfg.write_retries_max = layers.get("executor.write.retries-max", cfg.write_retries_max)?;
    cfg.submit_connect_timeout_ms = layers.get("executor.submit.connect-timeout-ms", cfg.submit_connect_timeout_ms)?;
    cfg.submit_read_timeout_ms = layers.get("executor.submit.read-timeout-ms", cfg.submit_read_timeout_ms)?;
    cfg.read_connect_timeout_ms = layers.get("executor.read.connect-timeout-ms", cfg.read_connect_timeout_ms)?;
    cfg.read_read_timeout_ms = layers.get("executor.read.read-timeout-ms", cfg.read_read_timeout_ms)?;
    cfg.read_tries_max = layers.get("executor.read.tries-max", cfg.read_tries_max)?;
    cfg.fencing_enabled = safety_switch(
        layers,
        profile,
        "payment.fencing.enabled",
        "a worker that writes past its lease can move money twice",
    )?;
    cfg.pause_rate = layers.get("executor.chaos.pause-rate", cfg.pause_rate)?;
    cfg.pause_ms = layers.get("executor.chaos.pause-ms", cfg.pause_ms)?;
    cfg.pause_hops = parse_hops(&layers.get("executor.chaos.pause-hops", "claim,submit,post".to_owned())?)?;
    cfg.auth = dlock_http::auth::resolve(layers, profile)?;
    cfg.bearer = dlock_rt::http::Bearer::from_keys(
        layers.get_opt::<String>("executor.auth.token")?,
        layers.get_opt::<String>("executor.auth.token-file")?.filter(|f| !f.is_empty()).map(std::path::PathBuf::from),
    )
    .map_err(|e| format!("executor.auth.token-file: {e}"))?;
    if cfg.auth.enabled && cfg.bearer.is_none() {
        return Err("the executor needs a worker credential: set executor.auth.token-file \
                    (DLOCK_EXECUTOR_AUTH_TOKEN_FILE) or executor.auth.token (DLOCK_EXECUTOR_AUTH_TOKEN)"
            .to_owned());
    }
    cfg.validate()?;
    Ok(ExecutorSettings { listen, config: cfg })
}

/// One line per safety switch `cfg` turns off (empty in production), for the loud warning
/// every start gives.
pub fn unsafe_warnings(cfg: &ExecutorConfig) -> Vec<String> {
    let mut w: Vec<String> = dlock_http::auth::unsafe_warning(&cfg.auth).into_iter().collect();
    if !cfg.fencing_enabled {
        w.push(
            "payment.fencing.enabled=false: the executor writes without checking its lease; a stale worker writes"
                .to_owned(),
        );
    }
    w
}

/// executor → payment-resource claim / post: connect budget (C3 §3.8: 500 ms / 3 s).
pub const WRITE_CONNECT_TIMEOUT_MS_DEFAULT: u64 = 500;
/// executor → payment-resource claim / post: read budget.
pub const WRITE_READ_TIMEOUT_MS_DEFAULT: u64 = 3_000;
/// Retries of a claim or post after the first try, only on 503 or a connect failure
/// (nothing was sent). Never on a 409 (C3 §3.8).
pub const WRITE_RETRIES_MAX_DEFAULT: u32 = 1;
/// executor → rail-proxy submit: connect budget (C3 §3.8: 1 s / rail read timeout + 2 s).
pub const SUBMIT_CONNECT_TIMEOUT_MS_DEFAULT: u64 = 1_000;
/// The proxy's default read timeout towards the rail (`rail.proxy.read-timeout-ms`).
pub const RAIL_READ_TIMEOUT_MS_DEFAULT: u64 = 8_000;
/// What the submit read budget adds to the rail's read timeout (C3 §3.8 "+ 2 s").
pub const SUBMIT_READ_MARGIN_MS: u64 = 2_000;
/// executor → payment-resource advisory GETs: connect budget (C3 §3.8: 300 ms / 1 s).
pub const READ_CONNECT_TIMEOUT_MS_DEFAULT: u64 = 300;
/// Advisory GET read budget.
pub const READ_READ_TIMEOUT_MS_DEFAULT: u64 = 1_000;
/// Advisory GET tries, the first included (C3 §3.8 "2").
pub const READ_TRIES_MAX_DEFAULT: u32 = 2;
/// Pause between two scans of the work queue when the last found nothing to do.
pub const POLL_INTERVAL_MS_DEFAULT: u64 = 200;
/// Payouts read per state per scan (P1 `limit`).
pub const BATCH_MAX_DEFAULT: u32 = 100;
/// Worker tasks in one process.
pub const CONCURRENCY_DEFAULT: usize = 1;
/// Largest `--concurrency`.
pub const CONCURRENCY_MAX: usize = 256;
/// Lease asked for on each grant (the lock client keeps 70 % of it as its local deadline).
pub const LOCK_TTL_MS_DEFAULT: u64 = 10_000;
/// Default `executor.lock-wait-ms`: 0, a contended account is skipped and revisited on a
/// later scan (one acquire attempt, no server-side wait).
pub const LOCK_WAIT_MS_DEFAULT: u64 = 0;
/// Largest `executor.lock-wait-ms`: the server-side wait must end, and its answer come back,
/// inside the lock client's acquire read budget
/// (`dlock_lock_client::config::ACQUIRE_READ_TIMEOUT_MS_DEFAULT`, 2 s), or the client would
/// give up first and manufacture an ambiguous acquire. 500 ms is left for the answer.
pub const LOCK_WAIT_MS_MAX: u64 = 1_500;
const _: () = assert!(LOCK_WAIT_MS_MAX < dlock_lock_client::config::ACQUIRE_READ_TIMEOUT_MS_DEFAULT);
/// `executor.lock-wait-ms` is at most `executor.lock-ttl-ms / LOCK_WAIT_TTL_DIVISOR`. The
/// lock client's local deadline runs from the instant the acquire was *sent*
/// (`ttl × (1 − 0.30)`), so time spent queued is lease lost: after the longest wait a grant
/// still has 45 % of its lease to work in. A longer wait hands out grants that are dead on
/// arrival, and a deep queue of such waiters makes no progress at all.
pub const LOCK_WAIT_TTL_DIVISOR: u64 = 4;
/// Default `executor.affinity-count`: 1, every account is this executor's own (no
/// preference, the behaviour before issue 14 cut 6).
pub const AFFINITY_COUNT_DEFAULT: u32 = 1;
/// Largest `executor.affinity-count`.
pub const AFFINITY_COUNT_MAX: u32 = 1_024;
/// Default `executor.affinity-index`: 0.
pub const AFFINITY_INDEX_DEFAULT: u32 = 0;
/// Default `executor.affinity-steal-after-ms`: another executor's account whose oldest
/// candidate has stayed the same payout this long in this executor's scans (no payout of it
/// settled: its owner is dead or stuck) is tried like an own one
/// ([`crate::worker::stalled_accounts`]). Half the default lease: a dead executor's
/// accounts are taken soon after its grants would expire.
pub const AFFINITY_STEAL_AFTER_MS_DEFAULT: u64 = 5_000;
/// Largest `executor.affinity-steal-after-ms`.
pub const AFFINITY_STEAL_AFTER_MS_MAX: u64 = 600_000;
/// Default `executor.chain-payouts-max` (issue 14): after a payout is posted, a task whose
/// pass holds another payout of the same account rotates the post's grant into that
/// payout's claim instead of releasing and acquiring again, for at most this many payouts
/// under one chain of grants; then the account is released, so a lock-server waiter and
/// the task's other accounts get their turn.
pub const CHAIN_PAYOUTS_MAX_DEFAULT: u32 = 16;
/// Largest `executor.chain-payouts-max`.
pub const CHAIN_PAYOUTS_MAX_MAX: u32 = 1_024;
/// Default `executor.payouts-per-grant-max` (issue 14, C3-extensions E-19): a task claims,
/// submits and posts up to this many PENDING or CLAIMED payouts of one account together,
/// under one grant for the claims and submissions and one newer grant for the posts, each
/// fence passed once for all of them.
pub const PAYOUTS_PER_GRANT_MAX_DEFAULT: u32 = 16;
/// Largest `executor.payouts-per-grant-max` (the contract's batch bound).
pub const PAYOUTS_PER_GRANT_MAX_MAX: u32 = dlock_contract::batch::BATCH_PAYOUTS_MAX as u32;
/// Longest injected stall (`executor.chaos.pause-ms`).
pub const PAUSE_MS_MAX: u64 = 120_000;
/// Longest any single budget may be set to.
pub const TIMEOUT_MS_CEILING_MAX: u64 = 60_000;
/// Largest number of tries or retries any hop may be given.
pub const TRIES_CEILING_MAX: u32 = 10;

/// The executor's settings (C5 keys `executor.*`, plus `payment.fencing.enabled`).
#[derive(Debug, Clone)]
pub struct ExecutorConfig {
    pub lock_url: BaseUrl,
    pub payment_url: BaseUrl,
    pub proxy_url: BaseUrl,
    /// Sent as `X-Owner-Id`; each task appends `/<n>` (FR-30: a fenced-out log names it).
    pub owner_id: OwnerId,
    pub concurrency: usize,
    pub poll_interval_ms: u64,
    pub batch_max: u32,
    pub lock_ttl_ms: u64,
    /// `executor.lock-wait-ms`: how long an acquire of a contended account queues at the
    /// lock server (`waitMillis`) before the account is skipped; 0 skips it at once.
    /// At most [`LOCK_WAIT_MS_MAX`], below the lock client's acquire read budget, and at
    /// most `lock_ttl_ms / LOCK_WAIT_TTL_DIVISOR` (the wait uses up the local lease).
    pub lock_wait_ms: u64,
    /// `executor.affinity-index` / `executor.affinity-count` (issue 14 cut 6): this executor
    /// prefers the accounts whose stable hash mod `affinity_count` is `affinity_index`
    /// ([`crate::worker::affinity_of`]); it tries another executor's account only when no
    /// own candidate is left in its scan, or once that account has shown no progress (its
    /// oldest candidate the same payout) for `affinity_steal_after_ms` of this executor's
    /// scans. A preference only narrows what is tried: the lock server
    /// stays the only authority. Count 1 (the default): every account is its own.
    pub affinity_index: u32,
    pub affinity_count: u32,
    pub affinity_steal_after_ms: u64,
    /// `executor.chain-payouts-max`: payouts of one account a task works under one chain
    /// of rotated grants ([`CHAIN_PAYOUTS_MAX_DEFAULT`]); 1 = every payout acquires and
    /// releases its account on its own.
    pub chain_payouts_max: u32,
    /// `executor.payouts-per-grant-max`: PENDING or CLAIMED payouts of one account a task
    /// works together under one grant ([`PAYOUTS_PER_GRANT_MAX_DEFAULT`], C3-extensions
    /// E-19); 1 = each payout through the single writes (P2, the submission, P3).
    pub payouts_per_grant_max: u32,
    pub write_connect_timeout_ms: u64,
    pub write_read_timeout_ms: u64,
    pub write_retries_max: u32,
    pub submit_connect_timeout_ms: u64,
    pub submit_read_timeout_ms: u64,
    pub read_connect_timeout_ms: u64,
    pub read_read_timeout_ms: u64,
    pub read_tries_max: u32,
    /// `payment.fencing.enabled`. `false` (only under `--profile unsafe-test`) makes the
    /// executor write without checking its local lease deadline: the fail-open worker the
    /// simulation uses to prove that the fences matter (FR-27).
    pub fencing_enabled: bool,
    /// `executor.chaos.pause-rate`: the probability, at each fenced write, of stalling for
    /// `pause_ms` *after* the lease check and *before* the write is sent: the GC pause that
    /// makes a stale writer. The fences must stop every such write. 0 in production.
    pub pause_rate: f64,
    /// `executor.chaos.pause-ms`: how long an injected stall lasts.
    pub pause_ms: u64,
    /// `executor.chaos.pause-hops`: which writes a stall may precede.
    pub pause_hops: Hops,
    /// `executor.auth.token-file` / `executor.auth.token`: the worker credential every
    /// request to the lock server, payment-resource and rail-proxy presents (E-13).
    pub bearer: Option<dlock_rt::http::Bearer>,
    /// `auth.*`: who may read the executor's own `/metrics` (E-13).
    pub auth: dlock_http::auth::AuthSettings,
}

/// A set of the executor's fenced writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Hops {
    pub claim: bool,
    pub submit: bool,
    pub post: bool,
}

impl Hops {
    pub const ALL: Hops = Hops { claim: true, submit: true, post: true };

    pub fn contains(&self, hop: &str) -> bool {
        match hop {
            "claim" => self.claim,
            "submit" => self.submit,
            "post" => self.post,
            _ => false,
        }
    }
}

/// Parses `claim,submit,post` (any non-empty subset, comma-separated).
pub fn parse_hops(raw: &str) -> Result<Hops, String> {
    let mut hops = Hops { claim: false, submit: false, post: false };
    for part in raw.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        match part {
            "claim" => hops.claim = true,
            "submit" => hops.submit = true,
            "post" => hops.post = true,
            other => return Err(format!("executor.chaos.pause-hops: unknown write {other:?} (claim, submit, post)")),
        }
    }
    if hops == (Hops { claim: false, submit: false, post: false }) {
        return Err("executor.chaos.pause-hops must name at least one of claim, submit, post".into());
    }
    Ok(hops)
}

impl ExecutorConfig {
    /// Settings with every C3 §3.8 default.
    pub fn new(lock_url: BaseUrl, payment_url: BaseUrl, proxy_url: BaseUrl, owner_id: OwnerId) -> ExecutorConfig {
        ExecutorConfig {
            lock_url,
            payment_url,
            proxy_url,
            owner_id,
            concurrency: CONCURRENCY_DEFAULT,
            poll_interval_ms: POLL_INTERVAL_MS_DEFAULT,
            batch_max: BATCH_MAX_DEFAULT,
            lock_ttl_ms: LOCK_TTL_MS_DEFAULT,
            lock_wait_ms: LOCK_WAIT_MS_DEFAULT,
            affinity_index: AFFINITY_INDEX_DEFAULT,
            affinity_count: AFFINITY_COUNT_DEFAULT,
            affinity_steal_after_ms: AFFINITY_STEAL_AFTER_MS_DEFAULT,
            chain_payouts_max: CHAIN_PAYOUTS_MAX_DEFAULT,
            payouts_per_grant_max: PAYOUTS_PER_GRANT_MAX_DEFAULT,
            write_connect_timeout_ms: WRITE_CONNECT_TIMEOUT_MS_DEFAULT,
            write_read_timeout_ms: WRITE_READ_TIMEOUT_MS_DEFAULT,
            write_retries_max: WRITE_RETRIES_MAX_DEFAULT,
            submit_connect_timeout_ms: SUBMIT_CONNECT_TIMEOUT_MS_DEFAULT,
            submit_read_timeout_ms: RAIL_READ_TIMEOUT_MS_DEFAULT + SUBMIT_READ_MARGIN_MS,
            read_connect_timeout_ms: READ_CONNECT_TIMEOUT_MS_DEFAULT,
            read_read_timeout_ms: READ_READ_TIMEOUT_MS_DEFAULT,
            read_tries_max: READ_TRIES_MAX_DEFAULT,
            fencing_enabled: true,
            pause_rate: 0.0,
            pause_ms: 0,
            pause_hops: Hops::ALL,
            bearer: None,
            auth: dlock_http::auth::AuthSettings::disabled(),
        }
    }

    /// Refuses settings outside their ranges, naming the key.
    pub fn validate(&self) -> Result<(), String> {
        let timeouts = [
            ("executor.poll-interval-ms", self.poll_interval_ms),
            ("executor.write.connect-timeout-ms", self.write_connect_timeout_ms),
            ("executor.write.read-timeout-ms", self.write_read_timeout_ms),
            ("executor.submit.connect-timeout-ms", self.submit_connect_timeout_ms),
            ("executor.submit.read-timeout-ms", self.submit_read_timeout_ms),
            ("executor.read.connect-timeout-ms", self.read_connect_timeout_ms),
            ("executor.read.read-timeout-ms", self.read_read_timeout_ms),
        ];
        for (key, v) in timeouts {
            if v == 0 || v > TIMEOUT_MS_CEILING_MAX {
                return Err(format!("{key} must be 1..={TIMEOUT_MS_CEILING_MAX}"));
            }
        }
        if !(1_000..=60_000).contains(&self.lock_ttl_ms) {
            return Err("executor.lock-ttl-ms must be 1000..=60000 (C3 L4)".into());
        }
        if self.lock_wait_ms > LOCK_WAIT_MS_MAX || self.lock_wait_ms * LOCK_WAIT_TTL_DIVISOR > self.lock_ttl_ms {
            return Err(format!(
                "executor.lock-wait-ms must be 0..={LOCK_WAIT_MS_MAX} (below the lock client's acquire read budget) \
                 and at most executor.lock-ttl-ms / {LOCK_WAIT_TTL_DIVISOR} (a queued wait uses up the lease)"
            ));
        }
        if !(1..=AFFINITY_COUNT_MAX).contains(&self.affinity_count) || self.affinity_index >= self.affinity_count {
            return Err(format!(
                "executor.affinity-count must be 1..={AFFINITY_COUNT_MAX} and executor.affinity-index \
                 0..executor.affinity-count (this executor's place among its peers)"
            ));
        }
        if self.affinity_steal_after_ms > AFFINITY_STEAL_AFTER_MS_MAX {
            return Err(format!("executor.affinity-steal-after-ms must be 0..={AFFINITY_STEAL_AFTER_MS_MAX}"));
        }
        if !(1..=CHAIN_PAYOUTS_MAX_MAX).contains(&self.chain_payouts_max) {
            return Err(format!("executor.chain-payouts-max must be 1..={CHAIN_PAYOUTS_MAX_MAX}"));
        }
        if !(1..=PAYOUTS_PER_GRANT_MAX_MAX).contains(&self.payouts_per_grant_max) {
            return Err(format!("executor.payouts-per-grant-max must be 1..={PAYOUTS_PER_GRANT_MAX_MAX}"));
        }
        if !(1..=CONCURRENCY_MAX).contains(&self.concurrency) {
            return Err(format!("executor.concurrency must be 1..={CONCURRENCY_MAX}"));
        }
        if !(1..=500).contains(&self.batch_max) {
            return Err("executor.batch-max must be 1..=500 (P1 limit)".into());
        }
        if self.write_retries_max > TRIES_CEILING_MAX {
            return Err(format!("executor.write.retries-max must be 0..={TRIES_CEILING_MAX}"));
        }
        if !(0.0..=1.0).contains(&self.pause_rate) {
            return Err("executor.chaos.pause-rate must be within 0.0..=1.0".into());
        }
        if self.pause_ms > PAUSE_MS_MAX {
            return Err(format!("executor.chaos.pause-ms must be 0..={PAUSE_MS_MAX}"));
        }
        if !(1..=TRIES_CEILING_MAX).contains(&self.read_tries_max) {
            return Err(format!("executor.read.tries-max must be 1..={TRIES_CEILING_MAX}"));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Layers of `pairs` with a credential, as every resolved service needs (E-13).
    fn authed(pairs: &[(&str, &str)]) -> Layers {
        let mut l = Layers::of(pairs);
        l.set_flag("auth.credentials", "worker unit-test-token-0000000001");
        l.set_flag("executor.auth.token", "unit-test-token-0000000001");
        l
    }

    #[test]
    fn an_executor_with_auth_on_needs_a_worker_credential() {
        let mut l = Layers::of(&[]);
        l.set_flag("auth.credentials", "worker unit-test-token-0000000001");
        let err = resolve(&l, Profile::Production).expect_err("no token");
        assert!(err.contains("executor.auth.token-file"), "{err}");
        assert!(resolve(&authed(&[]), Profile::Production).is_ok_and(|s| s.config.bearer.is_some()));
    }

    fn cfg() -> ExecutorConfig {
        let url = |p: u16| BaseUrl::parse(&format!("http://127.0.0.1:{p}")).expect("url");
        ExecutorConfig::new(url(8081), url(8082), url(8083), OwnerId::parse("executor-1").expect("owner"))
    }

    #[test]
    fn defaults_follow_the_c3_hop_budgets() {
        let c = cfg();
        assert_eq!((c.write_connect_timeout_ms, c.write_read_timeout_ms, c.write_retries_max), (500, 3_000, 1));
        assert_eq!((c.submit_connect_timeout_ms, c.submit_read_timeout_ms), (1_000, 8_000 + 2_000));
        assert_eq!((c.read_connect_timeout_ms, c.read_read_timeout_ms, c.read_tries_max), (300, 1_000, 2));
        assert!(c.fencing_enabled);
        assert_eq!(c.validate(), Ok(()));
    }

    #[test]
    fn pause_hops_parse_any_subset_and_refuse_the_rest() {
        assert_eq!(parse_hops("submit"), Ok(Hops { claim: false, submit: true, post: false }));
        assert_eq!(parse_hops("claim, post"), Ok(Hops { claim: true, submit: false, post: true }));
        assert!(parse_hops("").is_err());
        assert!(parse_hops("claim,refund").is_err_and(|e| e.contains("refund")));
    }

    #[test]
    fn an_executor_without_fencing_refuses_to_start_outside_unsafe_test() {
        let off = authed(&[("payment.fencing.enabled", "false")]);
        let err = resolve(&off, Profile::Production).expect_err("refused");
        assert!(err.contains("payment.fencing.enabled") && err.contains("unsafe-test"), "{err}");
        let s = resolve(&off, Profile::UnsafeTest).expect("allowed in unsafe-test");
        assert!(!s.config.fencing_enabled);
        assert_eq!(unsafe_warnings(&s.config).len(), 1);
        let s = resolve(&authed(&[]), Profile::Production).expect("defaults");
        assert!(s.config.fencing_enabled);
        assert_eq!(s.listen.port(), 8085);
        let c = s.config;
        assert_eq!((c.write_read_timeout_ms, c.submit_read_timeout_ms, c.read_tries_max), (3_000, 10_000, 2));
    }

    #[test]
    fn out_of_range_settings_name_their_key() {
        let mut c = cfg();
        c.concurrency = 0;
        assert!(c.validate().is_err_and(|e| e.contains("executor.concurrency")));
        let mut c = cfg();
        c.submit_read_timeout_ms = 0;
        assert!(c.validate().is_err_and(|e| e.contains("executor.submit.read-timeout-ms")));
        let mut c = cfg();
        c.read_tries_max = 0;
        assert!(c.validate().is_err_and(|e| e.contains("executor.read.tries-max")));
    }

    /// Cut 6: affinity defaults to "every account is mine"; the index must lie below the
    /// count, both keys resolve, and out-of-range values name their key.
    #[test]
    fn affinity_defaults_to_every_account_and_refuses_an_index_outside_the_count() {
        let c = cfg();
        assert_eq!((c.affinity_index, c.affinity_count, c.affinity_steal_after_ms), (0, 1, 5_000));
        let s = resolve(
            &authed(&[
                ("executor.affinity-index", "2"),
                ("executor.affinity-count", "3"),
                ("executor.affinity-steal-after-ms", "700"),
            ]),
            Profile::Production,
        )
        .expect("in range");
        assert_eq!((s.config.affinity_index, s.config.affinity_count, s.config.affinity_steal_after_ms), (2, 3, 700));
        let err = resolve(
            &authed(&[("executor.affinity-index", "3"), ("executor.affinity-count", "3")]),
            Profile::Production,
        )
        .expect_err("index outside the count");
        assert!(err.contains("executor.affinity-index"), "{err}");
        let mut c = cfg();
        c.affinity_count = 0;
        assert!(c.validate().is_err_and(|e| e.contains("executor.affinity-count")));
        let mut c = cfg();
        c.affinity_steal_after_ms = AFFINITY_STEAL_AFTER_MS_MAX + 1;
        assert!(c.validate().is_err_and(|e| e.contains("executor.affinity-steal-after-ms")));
    }

    #[test]
    fn payouts_per_grant_default_to_sixteen_resolve_and_stay_within_the_batch_bound() {
        assert_eq!(cfg().payouts_per_grant_max, PAYOUTS_PER_GRANT_MAX_DEFAULT);
        let s = resolve(&authed(&[("executor.payouts-per-grant-max", "64")]), Profile::Production).expect("in range");
        assert_eq!(s.config.payouts_per_grant_max, 64);
        for bad in ["0", "65"] {
            let err = resolve(&authed(&[("executor.payouts-per-grant-max", bad)]), Profile::Production).expect_err(bad);
            assert!(err.contains("executor.payouts-per-grant-max"), "{err}");
        }
    }

    #[test]
    fn payout_chains_default_to_sixteen_resolve_and_refuse_zero() {
        assert_eq!(cfg().chain_payouts_max, CHAIN_PAYOUTS_MAX_DEFAULT);
        let s = resolve(&authed(&[("executor.chain-payouts-max", "1")]), Profile::Production).expect("in range");
        assert_eq!(s.config.chain_payouts_max, 1);
        for bad in ["0", "1025"] {
            let err = resolve(&authed(&[("executor.chain-payouts-max", bad)]), Profile::Production).expect_err(bad);
            assert!(err.contains("executor.chain-payouts-max"), "{err}");
        }
    }

    #[test]
    fn lock_wait_defaults_to_skipping_and_stays_below_the_acquire_read_budget() {
        assert_eq!(cfg().lock_wait_ms, 0);
        let s = resolve(&authed(&[("executor.lock-wait-ms", "1500")]), Profile::Production).expect("in range");
        assert_eq!(s.config.lock_wait_ms, LOCK_WAIT_MS_MAX);
        let err = resolve(&authed(&[("executor.lock-wait-ms", "1501")]), Profile::Production).expect_err("refused");
        assert!(err.contains("executor.lock-wait-ms"), "{err}");
        let mut c = cfg();
        c.lock_wait_ms = dlock_lock_client::config::ACQUIRE_READ_TIMEOUT_MS_DEFAULT;
        assert!(c.validate().is_err_and(|e| e.contains("executor.lock-wait-ms")));
        // A quarter of the lease at most: a 1 s lease may wait 250 ms, not 251.
        let mut c = cfg();
        (c.lock_ttl_ms, c.lock_wait_ms) = (1_000, 250);
        assert_eq!(c.validate(), Ok(()));
        c.lock_wait_ms = 251;
        assert!(c.validate().is_err_and(|e| e.contains("executor.lock-ttl-ms / 4")));
    }
}
