//! Swarm testing: each seed draws its own configuration of the world.
//!
//! [`SwarmConfig::draw`] turns a seed into a topology, a lock backend, TTLs, executor
//! concurrency, the rail-stub's chaos knobs, the executors' stall rate, a workload and the
//! fault rates the fault schedule consumes. The draw uses its own generator seeded from the
//! seed (splitmix64), not the runtime's, so the configuration is known (and printed)
//! before anything runs, and replaying a seed draws the same configuration.
//!
//! How knobs are drawn, so that configurations that always succeed do not dominate: every
//! chaos knob (each stub rate, the stub's latency, the stall rate, each fault rate, the
//! operator's revokes and resolutions) is **zero with probability 0.3**, else uniform in its
//! range. Topology sizes are uniform in their ranges (1–3 lock replicas, 1–2 payment and
//! proxy replicas, 1–6 executors each with concurrency 1–8); the backend is the simulated
//! etcd with probability 0.25. So about one seed in ~4 000 has every chaos knob at zero
//! (0.3^7 for the seven stub/stall/operator knobs alone is 0.02 %).
//!
//! Invariants: `draw` is a pure function of the seed; every drawn value is within the bound
//! the world accepts (asserted by the tests below over many seeds).

use std::fmt;

/// The lock servers' backend (mirrors `world::LockBackend`, which exists only under madsim).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Mem,
    Etcd,
}

/// The fault schedule's rates (one type for the swarm and the schedule): events per
/// simulated minute of each fault kind, drawn per seed by [`SwarmConfig::draw`].
pub use crate::schedule::FaultRates;

/// One seed's drawn configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct SwarmConfig {
    pub seed: u64,
    pub lock_replicas: usize,
    pub payment_replicas: usize,
    pub proxy_replicas: usize,
    /// Each executor's concurrency (1–6 executors).
    pub executors: Vec<usize>,
    pub backend: Backend,
    /// `executor.lock-ttl-ms`.
    pub lock_ttl_ms: u64,
    /// `rail.stub.latency-ms`.
    pub stub_latency_ms: u64,
    pub stub_failure_rate: f64,
    pub stub_duplicate_ack_rate: f64,
    pub stub_decline_rate: f64,
    /// `executor.chaos.pause-rate` (a stall between the lease check and a fenced write).
    pub executor_pause_rate: f64,
    /// `executor.chaos.pause-ms` (past the lease: 1–3 lock TTLs).
    pub executor_pause_ms: u64,
    /// Payouts the workload creates over the arrival window.
    pub payouts: usize,
    pub accounts: usize,
    /// Accounts `acct-0 .. acct-{hot_accounts-1}` are hot: they take `hot_share` of payouts.
    pub hot_accounts: usize,
    pub hot_share: f64,
    /// Payouts arrive over `[0, arrival_ms]` of simulated time.
    pub arrival_ms: u64,
    /// Operator revokes of a held lock during the fault phase.
    pub operator_revokes: usize,
    /// Whether the operator resolves RAIL_AMBIGUOUS payouts mid-run.
    pub operator_resolves: bool,
    pub faults: FaultRates,
    /// Simulated length of the fault phase.
    pub fault_ms: u64,
    /// `executor.lock-wait-ms`: how long an executor's acquire of a contended account waits
    /// in the lock server's queue (0: skipped at once, the executor's default); at most a
    /// quarter of `lock_ttl_ms`.
    pub lock_wait_ms: u64,
    /// One executor (0-based index) whose clock runs at this rate, beyond the lock client's
    /// safety margin (below 0.7×), for the whole fault phase: the stale writer the fences
    /// must catch (`drift_caught_by_fence`). `None` with [`ZERO_P`].
    pub drifted_executor: Option<(usize, f64)>,
    /// `executor.chain-payouts-max`: payouts of one account a task works under one chain of
    /// rotated grants; 1 (no chain: acquire, rotate, release per payout) with [`ZERO_P`],
    /// else uniform in `2..=`[`CHAIN_PAYOUTS_DRAW_MAX`].
    pub chain_payouts_max: u32,
    /// `executor.payouts-per-grant-max` (C3-extensions E-19): claimable payouts of one
    /// account a task claims, submits and posts together under one grant; 1 (the single
    /// writes) with [`ZERO_P`], else uniform in `2..=`[`PAYOUTS_PER_GRANT_DRAW_MAX`].
    pub payouts_per_grant_max: u32,
    /// Whether the stream watcher ([`crate::watcher`]) follows the services' event streams
    /// this seed ([`WATCHER_P`] of seeds; printed only when on).
    pub watcher: bool,
    /// Clock events a sweep imposes on the seed (`crate::envelope`), played beside the
    /// drawn schedule; never drawn (empty in a campaign).
    pub clock_events: Vec<crate::schedule::Timed>,
}

/// Bounds of the draw (the world's default size; see docs/simulation.md "Speed").
pub const PAYOUTS_MIN: usize = 8;
/// The share of seeds the stream watcher plays in ([`crate::watcher`]): a quarter, so most
/// seeds keep the world (and its speed) without a stream client.
pub const WATCHER_P: f64 = 0.25;
/// `payment.events.retention-events` (and, on the simulation lockdb,
/// `lock.events.retention-events`) in the watcher's seeds (the smallest a deployment may
/// set): a seed's few hundred events are purged as it runs.
pub const WATCHER_RETENTION_EVENTS: i64 = dlock_contract::stream::EVENT_RETENTION_EVENTS_MIN;
/// `payment.idempotency.purge-interval-ms` (the purge of paydb's events runs with the
/// idempotency purge) and, on the simulation lockdb, `lock.events.purge-interval-ms` in the
/// watcher's seeds, ms.
pub const WATCHER_PURGE_INTERVAL_MS: u64 = 1_000;
pub const PAYOUTS_MAX: usize = 32;
pub const ACCOUNTS_MAX: usize = 8;
pub const FAULT_MS_MIN: u64 = 5_000;
pub const FAULT_MS_MAX: u64 = 12_000;
pub const LOCK_TTL_MS_MIN: u64 = 1_000;
pub const LOCK_TTL_MS_MAX: u64 = 5_000;
pub const STUB_LATENCY_MS_MAX: u64 = 800;
pub const STUB_RATE_MAX: f64 = 0.2;
pub const PAUSE_RATE_MAX: f64 = 0.2;
pub const REVOKES_MAX: usize = 3;
/// Bound of the drawn `executor.lock-wait-ms` (the executor's own bound).
pub const LOCK_WAIT_MS_MAX: u64 = dlock_executor::config::LOCK_WAIT_MS_MAX;
/// Range of a drifted executor's clock rate: beyond the lock client's 30 % margin (< 0.7×),
/// and not so slow that its heartbeats (every third of the TTL on its clock) miss the
/// session's TTL on the server's.
pub const DRIFT_RATE_MIN: f64 = 0.5;
pub const DRIFT_RATE_MAX: f64 = 0.69;
/// Largest drawn `executor.chain-payouts-max` (the executor's default).
pub const CHAIN_PAYOUTS_DRAW_MAX: u64 = dlock_executor::config::CHAIN_PAYOUTS_MAX_DEFAULT as u64;
/// Largest drawn `executor.payouts-per-grant-max` (the executor's default).
pub const PAYOUTS_PER_GRANT_DRAW_MAX: u64 = dlock_executor::config::PAYOUTS_PER_GRANT_MAX_DEFAULT as u64;
/// `executor.poll-interval-ms` of every executor (an idle task scans this often: the main
/// cost of an idle simulated second).
pub const POLL_INTERVAL_MS: u64 = 500;
/// Probability that a chaos knob is drawn as zero.
pub const ZERO_P: f64 = 0.3;

/// splitmix64: small, fast, and good enough to draw a configuration.
struct Draw(u64);

impl Draw {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in [0, 1).
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
    fn chance(&mut self, p: f64) -> bool {
        self.unit() < p
    }
    /// Uniform in `lo..=hi`.
    fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next() % (hi - lo + 1)
    }
    fn usize(&mut self, lo: usize, hi: usize) -> usize {
        self.range(lo as u64, hi as u64) as usize
    }
    /// Zero with [`ZERO_P`], else uniform in `(0, max]`.
    fn rate(&mut self, max: f64) -> f64 {
        if self.chance(ZERO_P) {
            0.0
        } else {
            let r = (self.unit() * max * 1_000.0).ceil() / 1_000.0;
            r.clamp(0.001, max)
        }
    }
}

/// Each fault kind's rate (events per simulated minute), zero with [`ZERO_P`], else uniform
/// up to its row's bound (`crate::fault::KINDS`, in table order); durations and parameter
/// ranges are the schedule's defaults ([`FaultRates::none`]).
fn draw_fault_rates(d: &mut Draw) -> FaultRates {
    let mut r = FaultRates::none();
    for row in &crate::fault::KINDS {
        r.set(row.name, d.rate(row.rate_max_per_min));
    }
    r
}

impl SwarmConfig {
    /// The configuration of `seed` (a pure function of it).
    pub fn draw(seed: u64) -> SwarmConfig {
        let mut d = Draw(seed ^ 0x646C_6F63_6B2D_7369); // "dlock-si"
        let lock_replicas = d.usize(1, 3);
        let payment_replicas = d.usize(1, 2);
        let proxy_replicas = d.usize(1, 2);
        let executors: Vec<usize> = (0..d.usize(1, 6)).map(|_| d.usize(1, 8)).collect();
        let backend = if d.chance(0.25) { Backend::Etcd } else { Backend::Mem };
        let lock_ttl_ms = d.range(LOCK_TTL_MS_MIN / 100, LOCK_TTL_MS_MAX / 100) * 100;
        let stub_latency_ms = if d.chance(ZERO_P) { 0 } else { d.range(1, STUB_LATENCY_MS_MAX) };
        let stub_failure_rate = d.rate(STUB_RATE_MAX);
        let stub_duplicate_ack_rate = d.rate(STUB_RATE_MAX);
        let stub_decline_rate = d.rate(STUB_RATE_MAX);
        let executor_pause_rate = d.rate(PAUSE_RATE_MAX);
        let executor_pause_ms = lock_ttl_ms * d.range(1, 3);
        let payouts = d.usize(PAYOUTS_MIN, PAYOUTS_MAX);
        let accounts = d.usize(1, ACCOUNTS_MAX);
        let hot_accounts = d.usize(1, accounts.min(2));
        let hot_share = if accounts == hot_accounts { 1.0 } else { d.range(0, 8) as f64 / 10.0 };
        let fault_ms = d.range(FAULT_MS_MIN / 1_000, FAULT_MS_MAX / 1_000) * 1_000;
        let arrival_ms = d.range(0, fault_ms / 2 / 100) * 100;
        let operator_revokes = if d.chance(ZERO_P) { 0 } else { d.usize(1, REVOKES_MAX) };
        let operator_resolves = !d.chance(ZERO_P);
        let faults = draw_fault_rates(&mut d);
        // Drawn after everything above, so adding them left every earlier draw unchanged.
        // At most a quarter of the lease (the executor's bound: a queued wait uses it up).
        let wait_steps_max =
            (LOCK_WAIT_MS_MAX.min(lock_ttl_ms / dlock_executor::config::LOCK_WAIT_TTL_DIVISOR) / 100).max(1);
        let lock_wait_ms = if d.chance(ZERO_P) { 0 } else { d.range(1, wait_steps_max) * 100 };
        let drifted_executor = if d.chance(ZERO_P) {
            None
        } else {
            let i = d.usize(0, executors.len() - 1);
            let rate = DRIFT_RATE_MIN + d.unit() * (DRIFT_RATE_MAX - DRIFT_RATE_MIN);
            Some((i, (rate * 100.0).floor() / 100.0))
        };
        // Drawn last, so adding it left every earlier draw unchanged.
        let chain_payouts_max = if d.chance(ZERO_P) { 1 } else { d.range(2, CHAIN_PAYOUTS_DRAW_MAX) as u32 };
        // Drawn after `chain`, for the same reason.
        let payouts_per_grant_max = if d.chance(ZERO_P) { 1 } else { d.range(2, PAYOUTS_PER_GRANT_DRAW_MAX) as u32 };
        // Drawn after `per_grant`, for the same reason.
        let watcher = d.chance(WATCHER_P);
        SwarmConfig {
            seed,
            lock_replicas,
            payment_replicas,
            proxy_replicas,
            executors,
            backend,
            lock_ttl_ms,
            stub_latency_ms,
            stub_failure_rate,
            stub_duplicate_ack_rate,
            stub_decline_rate,
            executor_pause_rate,
            executor_pause_ms,
            payouts,
            accounts,
            hot_accounts,
            hot_share,
            arrival_ms,
            operator_revokes,
            operator_resolves,
            faults,
            fault_ms,
            lock_wait_ms,
            drifted_executor,
            chain_payouts_max,
            payouts_per_grant_max,
            watcher,
            clock_events: Vec::new(),
        }
    }

    /// The node name of the drifted executor and its clock rate, if one is drawn.
    pub fn drifted_executor_node(&self) -> Option<(String, f64)> {
        self.drifted_executor.map(|(i, rate)| (format!("executor-{}", i + 1), rate))
    }

    /// Whether every chaos knob is zero (a seed that only exercises the happy path).
    pub fn is_calm(&self) -> bool {
        self.stub_latency_ms == 0
            && self.stub_failure_rate == 0.0
            && self.stub_duplicate_ack_rate == 0.0
            && self.stub_decline_rate == 0.0
            && self.executor_pause_rate == 0.0
            && self.operator_revokes == 0
            && !self.operator_resolves
            && self.drifted_executor.is_none()
            && self.faults.is_zero()
    }

    /// The C5 settings this configuration gives every service and executor.
    pub fn settings(&self) -> Vec<(String, String)> {
        let kv = |k: &str, v: String| (k.to_owned(), v);
        let mut v = vec![
            kv("executor.lock-ttl-ms", self.lock_ttl_ms.to_string()),
            kv("executor.lock-wait-ms", self.lock_wait_ms.to_string()),
            kv("executor.chain-payouts-max", self.chain_payouts_max.to_string()),
            kv("executor.payouts-per-grant-max", self.payouts_per_grant_max.to_string()),
            kv("executor.poll-interval-ms", POLL_INTERVAL_MS.to_string()),
            kv("executor.chaos.pause-rate", self.executor_pause_rate.to_string()),
            kv("executor.chaos.pause-ms", self.executor_pause_ms.to_string()),
            kv("rail.stub.latency-ms", self.stub_latency_ms.to_string()),
            kv("rail.stub.failure-rate", self.stub_failure_rate.to_string()),
            kv("rail.stub.duplicate-ack-rate", self.stub_duplicate_ack_rate.to_string()),
            kv("rail.stub.decline-rate", self.stub_decline_rate.to_string()),
        ];
        if self.watcher {
            // The watcher's seeds keep few events and purge often, so a watcher that naps
            // comes back to a cursor the purge has passed (`resync_required`, expired).
            v.push(kv("payment.events.retention-events", WATCHER_RETENTION_EVENTS.to_string()));
            v.push(kv("payment.idempotency.purge-interval-ms", WATCHER_PURGE_INTERVAL_MS.to_string()));
            // lockdb's too, where the lock server's stream is watched (the simulation
            // lockdb; on etcd a purge every second would only slow the seed).
            if self.backend == Backend::Mem {
                v.push(kv("lock.events.retention-events", WATCHER_RETENTION_EVENTS.to_string()));
                v.push(kv("lock.events.purge-interval-ms", WATCHER_PURGE_INTERVAL_MS.to_string()));
            }
        }
        v
    }
}

/// `x` rounded to three decimals (drawn rates already are; this keeps the line short).
fn r3(x: f64) -> f64 {
    (x * 1_000.0).round() / 1_000.0
}

impl fmt::Display for SwarmConfig {
    /// One line: `seed=7 topo=lock2/pay1/proxy2 exec=[3,1] backend=mem ttl=2400ms ...`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let execs: Vec<String> = self.executors.iter().map(|c| c.to_string()).collect();
        let rates: Vec<String> =
            crate::fault::KINDS.iter().map(|row| format!("{}={}", row.name, r3(self.faults.get(row.name)))).collect();
        write!(
            f,
            "seed={} topo=lock{}/pay{}/proxy{} exec=[{}] backend={} ttl={}ms \
             stub(lat={}ms fail={} dup={} decl={}) stall(rate={} ms={}) \
             work(payouts={} accounts={} hot={}@{} arrival={}ms) operator(revokes={} resolves={}) \
             faults/min({}) fault_ms={} lock_wait={}ms drifted={} chain={} per_grant={}",
            self.seed,
            self.lock_replicas,
            self.payment_replicas,
            self.proxy_replicas,
            execs.join(","),
            match self.backend {
                Backend::Mem => "mem",
                Backend::Etcd => "etcd",
            },
            self.lock_ttl_ms,
            self.stub_latency_ms,
            self.stub_failure_rate,
            self.stub_duplicate_ack_rate,
            self.stub_decline_rate,
            self.executor_pause_rate,
            self.executor_pause_ms,
            self.payouts,
            self.accounts,
            self.hot_accounts,
            self.hot_share,
            self.arrival_ms,
            self.operator_revokes,
            self.operator_resolves,
            rates.join(" "),
            self.fault_ms,
            self.lock_wait_ms,
            match self.drifted_executor_node() {
                Some((node, rate)) => format!("{node}@{rate}"),
                None => "none".to_owned(),
            },
            self.chain_payouts_max,
            self.payouts_per_grant_max,
        )?;
        if self.watcher {
            write!(f, " watcher")?;
        }
        if !self.clock_events.is_empty() {
            write!(f, " clocks={}", self.clock_events.len())?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_seed_draws_the_same_configuration_every_time() {
        for seed in [0, 1, 42, u64::MAX] {
            assert_eq!(SwarmConfig::draw(seed), SwarmConfig::draw(seed));
        }
        assert_ne!(SwarmConfig::draw(1), SwarmConfig::draw(2));
    }

    #[test]
    fn every_draw_is_within_the_worlds_bounds_and_prints_on_one_line() {
        for seed in 0..2_000 {
            let c = SwarmConfig::draw(seed);
            assert!((1..=3).contains(&c.lock_replicas) && (1..=2).contains(&c.payment_replicas));
            assert!((1..=2).contains(&c.proxy_replicas) && (1..=6).contains(&c.executors.len()));
            assert!(c.executors.iter().all(|n| (1..=8).contains(n)));
            assert!((LOCK_TTL_MS_MIN..=LOCK_TTL_MS_MAX).contains(&c.lock_ttl_ms));
            assert!((PAYOUTS_MIN..=PAYOUTS_MAX).contains(&c.payouts));
            assert!(c.hot_accounts >= 1 && c.hot_accounts <= c.accounts && c.accounts <= ACCOUNTS_MAX);
            assert!(c.arrival_ms <= c.fault_ms);
            assert!(c.lock_wait_ms <= LOCK_WAIT_MS_MAX && c.lock_wait_ms.is_multiple_of(100));
            assert!(c.lock_wait_ms * dlock_executor::config::LOCK_WAIT_TTL_DIVISOR <= c.lock_ttl_ms, "{c}");
            assert!((1..=CHAIN_PAYOUTS_DRAW_MAX as u32).contains(&c.chain_payouts_max), "{c}");
            if let Some((i, rate)) = c.drifted_executor {
                assert!(i < c.executors.len());
                assert!((DRIFT_RATE_MIN..=DRIFT_RATE_MAX).contains(&rate), "{rate}");
                assert!(rate < 1.0 - dlock_lock_client::config::SAFETY_MARGIN_DEFAULT, "{rate} within the margin");
            }
            for row in &crate::fault::KINDS {
                assert!((0.0..=row.rate_max_per_min).contains(&c.faults.get(row.name)), "{c}");
            }
            for r in [c.stub_failure_rate, c.stub_duplicate_ack_rate, c.stub_decline_rate, c.executor_pause_rate] {
                assert!((0.0..=STUB_RATE_MAX.max(PAUSE_RATE_MAX)).contains(&r));
            }
            let line = c.to_string();
            assert!(!line.contains('\n') && line.starts_with(&format!("seed={seed} ")), "{line}");
        }
    }

    #[test]
    fn knobs_added_later_leave_every_earlier_draw_of_a_seed_unchanged() {
        // Seed 1's line before `lock_wait`, `drifted` and `chain` were drawn (they are drawn
        // last, in that order).
        let before = "seed=1 topo=lock2/pay2/proxy1 exec=[4,3,5,6,8] backend=mem ttl=2200ms \
            stub(lat=0ms fail=0.174 dup=0.124 decl=0.132) stall(rate=0 ms=6600) \
            work(payouts=30 accounts=3 hot=2@0.7 arrival=600ms) operator(revokes=0 resolves=true) \
            faults/min(pause=0 crash=2.457 partition=0 one-way=0.292 clog=0 lossy-link=0 drift=0 skew=0 \
            store-unavailable=0 lost-ack=2.411 store-latency=2.501 leader-loss=0.59 revoke=1.279) fault_ms=9000 ";
        let line = SwarmConfig::draw(1).to_string();
        assert!(line.starts_with(before), "{line}");
        let line = line.trim_end_matches(" watcher");
        let (head, per_grant) = line.rsplit_once(" per_grant=").expect("per_grant last");
        let (head, chain) = head.rsplit_once(" chain=").expect("chain before it");
        assert!(head.ends_with("lock_wait=400ms drifted=executor-5@0.61"), "{line}");
        assert_eq!(chain, SwarmConfig::draw(1).chain_payouts_max.to_string(), "{line}");
        assert_eq!(per_grant, SwarmConfig::draw(1).payouts_per_grant_max.to_string(), "{line}");
    }

    #[test]
    fn calm_configurations_do_not_dominate_and_each_knob_is_sometimes_zero() {
        let draws: Vec<SwarmConfig> = (0..2_000).map(SwarmConfig::draw).collect();
        let calm = draws.iter().filter(|c| c.is_calm()).count();
        assert!(calm <= 2, "{calm} calm configurations in 2000");
        let zero = |f: &dyn Fn(&SwarmConfig) -> bool| draws.iter().filter(|c| f(c)).count();
        for (name, n) in [
            ("failure", zero(&|c| c.stub_failure_rate == 0.0)),
            ("dup", zero(&|c| c.stub_duplicate_ack_rate == 0.0)),
            ("pause", zero(&|c| c.executor_pause_rate == 0.0)),
            ("crash", zero(&|c| c.faults.get("crash") == 0.0)),
            ("store", zero(&|c| c.faults.get("lost-ack") == 0.0)),
            ("lock-wait", zero(&|c| c.lock_wait_ms == 0)),
            ("drift", zero(&|c| c.drifted_executor.is_none())),
            ("chain", zero(&|c| c.chain_payouts_max == 1)),
            ("per-grant", zero(&|c| c.payouts_per_grant_max == 1)),
        ] {
            assert!((400..=800).contains(&n), "{name} zero in {n} of 2000 draws");
        }
        assert!(draws.iter().any(|c| c.backend == Backend::Etcd) && draws.iter().any(|c| c.backend == Backend::Mem));
        assert!(draws.iter().any(|c| c.lock_replicas == 3 && c.proxy_replicas == 2 && c.executors.len() == 6));
    }
}
