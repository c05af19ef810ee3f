//! Planted bugs on real processes (docs/real-runs.md, "Planted bugs on real processes"):
//! which of the simulation's planted bugs ([`dlock_contract::planted::Bug`]) a real run can
//! switch on, how, and the invariants that must then break; and, for each bug a real run
//! cannot plant, why.
//!
//! Two ways in:
//! - [`How::Switches`]: the fencing bugs are the `unsafe-test` profile's safety switches,
//!   set in the release binary's configuration;
//! - [`How::Build`]: every other bug whose code point runs in a real process is planted in
//!   the test-only build (`cargo build --release -p dlock --features planted`, copied to
//!   [`PLANTED_BIN`]) through `DLOCK_PLANTED_BUG`.
//!
//! Invariants: every bug of [`Bug::ALL`] is in exactly one of [`REAL`] and [`NOT_REAL`]
//! (a test holds it); a planted run is caught when any of its bug's invariants broke.

use dlock_contract::planted::Bug;
use dlock_sim::oracle::ids;

/// Where the real run looks for the test-only build, under the workspace root.
pub const PLANTED_BIN: &str = "target/planted/dlock";

/// How a bug is planted in real processes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum How {
    /// The release binary, with the `unsafe-test` profile's switches set.
    Switches(&'static [(&'static str, &'static str)]),
    /// The test-only build, with `DLOCK_PLANTED_BUG` set.
    Build,
}

/// One bug a real run plants.
#[derive(Debug, Clone, Copy)]
pub struct RealPlant {
    pub bug: Bug,
    pub how: How,
    /// The invariants of which at least one must break.
    pub invariants: &'static [&'static str],
    /// The faults that reach its code point, used when `--nemesis` is not given.
    pub nemesis: &'static str,
    /// Settings the run adds so the workload reaches the bug (e.g. stalls on one hop).
    pub env: &'static [(&'static str, &'static str)],
    /// The seed and fault phase (s) `dlock-real plants` runs it at: a plan that reaches it.
    pub seed: u64,
    pub duration_s: u64,
}

/// The bugs a real run plants.
pub const REAL: [RealPlant; 12] = [
    RealPlant {
        bug: Bug::FencingOffProxy,
        how: How::Switches(&[("DLOCK_RAIL_PROXY_FENCING_ENABLED", "false")]),
        invariants: &[ids::FENCE_ACCEPTS_RISING_TOKENS],
        nemesis: "pause",
        // Half the submissions stall past the lease: a newer holder that did not stall
        // reaches the mark before the stale one that did.
        env: &[("DLOCK_EXECUTOR_CHAOS_PAUSE_RATE", "0.5"), ("DLOCK_EXECUTOR_CHAOS_PAUSE_HOPS", "submit")],
        seed: 1,
        duration_s: 10,
    },
    RealPlant {
        bug: Bug::FencingOffBoth,
        how: How::Switches(&[
            ("DLOCK_PAYMENT_FENCING_ENABLED", "false"),
            ("DLOCK_RAIL_PROXY_FENCING_ENABLED", "false"),
            ("DLOCK_RAIL_PROXY_DUPLICATE_GUARD_ENABLED", "false"),
        ]),
        invariants: &[ids::AT_MOST_ONE_RAIL_CALL, ids::FENCE_ACCEPTS_RISING_TOKENS],
        nemesis: "pause",
        env: &[("DLOCK_EXECUTOR_CHAOS_PAUSE_RATE", "1"), ("DLOCK_EXECUTOR_CHAOS_PAUSE_HOPS", "submit")],
        seed: 2,
        duration_s: 10,
    },
    RealPlant {
        bug: Bug::ExecutorRetriesSubmit,
        how: How::Build,
        invariants: &[ids::AMBIGUOUS_NEVER_RESUBMITTED],
        nemesis: "pause",
        env: &[],
        seed: 1,
        duration_s: 10,
    },
    RealPlant {
        bug: Bug::GrantUnexpired,
        how: How::Build,
        invariants: &[ids::NO_TWO_LIVE_GRANTS, ids::NO_TWO_BELIEVING_HOLDERS, ids::FENCED_OUT_HAS_NEWER_HOLDER],
        nemesis: "pause",
        env: &[],
        seed: 1,
        duration_s: 10,
    },
    RealPlant {
        bug: Bug::EtcdWallClockJudge,
        how: How::Build,
        invariants: &[ids::NO_TWO_BELIEVING_HOLDERS],
        // lock-server-2's wall clock stepped 3 511 s ahead at 8.7 s.
        nemesis: "skew",
        env: &[],
        seed: 11,
        duration_s: 40,
    },
    RealPlant {
        bug: Bug::ReconcilerTrustsAnswer,
        how: How::Build,
        invariants: &[ids::RECONCILER_MATCHES_RAIL, ids::RECONCILER_AGREES],
        nemesis: "pause",
        env: &[],
        seed: 2,
        duration_s: 20,
    },
    RealPlant {
        bug: Bug::P1HidesAhead,
        how: How::Build,
        invariants: &[ids::EVERY_PAYOUT_SETTLES],
        // The payment-resource's wall clock stepped 1 800 s back at 5.5 s: the payouts it
        // created before then are stamped ahead of it, and only the first page's rows
        // ahead list them (bug B8).
        nemesis: "skew",
        // Executors that scan every 2 s leave the last seconds' payouts to the next scan,
        // which comes after the step.
        env: &[("DLOCK_EXECUTOR_POLL_INTERVAL_MS", "2000")],
        seed: 343,
        duration_s: 30,
    },
    RealPlant {
        bug: Bug::FenceOffByOne,
        how: How::Build,
        // The SQL stores' fence statement binds the rule's bound (`rules::fence_sql_bound`):
        // a token one above the account's fence is refused with nobody newer holding it.
        invariants: &[ids::FENCED_OUT_HAS_NEWER_HOLDER, ids::EVERY_PAYOUT_SETTLES],
        nemesis: "pause",
        env: &[],
        seed: 1,
        duration_s: 10,
    },
    // The forger's finds (crate::forger): it runs after the settle in every run, so a short
    // fault phase under any nemesis reaches them.
    RealPlant {
        bug: Bug::SkipGrantSignatureCheck,
        how: How::Build,
        invariants: &[ids::FORGED_WRITE_REFUSED],
        nemesis: "pause",
        env: &[],
        seed: 1,
        duration_s: 10,
    },
    RealPlant {
        bug: Bug::SkipOwnerCheck,
        how: How::Build,
        invariants: &[ids::OWNER_ATTACK_REFUSED],
        nemesis: "pause",
        env: &[],
        seed: 1,
        duration_s: 10,
    },
    RealPlant {
        bug: Bug::BatchIgnoresAccount,
        how: How::Build,
        // The forger's claim batch of `forger-a` names a payout of `forger-b`: the SQL
        // stores' batch read keeps it (`rules::batch_may_write`), and the claim writes it.
        invariants: &[ids::FENCED_WRITE_WITHIN_ITS_ACCOUNT],
        nemesis: "pause",
        env: &[],
        seed: 1,
        duration_s: 10,
    },
    RealPlant {
        bug: Bug::RotateLapsedSession,
        how: How::Build,
        // The rule lets the lapsed grant rotate; etcd's own txn refuses it, so the lock
        // server answers 500 (docs/real-runs.md, "Planted bugs on real processes").
        invariants: &[ids::DEAD_GRANT_NEVER_REVIVED, ids::NO_CONTRADICTION],
        nemesis: "pause",
        // A reaper pass between the lapse and the forger's rotate would remove the grant
        // (the rotate then finds nothing to judge): it runs once a minute here.
        env: &[("DLOCK_LOCK_REAPER_INTERVAL_MS", "60000")],
        seed: 1,
        duration_s: 10,
    },
];

/// The bugs a real run cannot plant, and why.
pub const NOT_REAL: [(Bug, &str); 8] = [
    (
        Bug::MarkGe,
        "only a token presented twice at the mark shows it: the simulation's forger replays an executor's signed submission from its wire log, which a real run does not record, and the executors never present one; and the SQL stores decide the mark in their own statement (`highest_token < EXCLUDED.highest_token`), where the rule only checks the refusal (an equal token it would pass is refused as corrupt)",
    ),
    (
        Bug::LeaseEndInclusive,
        "a grant live one millisecond too long is seen only by the simulation's `lock_decision_justified`, which judges lockdb's own log of decisions; the real run judges the lock servers from their store calls, where a grant living longer than its lease breaks no bound",
    ),
    (
        Bug::FencingOffPayment,
        "the payment-resource's fences have no switch outside the simulation (`payment.fencing.enabled` is the executor's lease check), and the SQL stores judge them in their own statement",
    ),
    (
        Bug::MarkAfterCall,
        "its code point is the simulation's paydb (`dlock_paydb::mem`); the SQL stores write the mark in the intent's own statement",
    ),
    (
        Bug::RevokeKeepsFloor,
        "its code point is the simulation's lock store (`store_mem`); on etcd, where the real run's revokes go, the floor is the revoke txn's own revision, which every later grant's token exceeds, and the SQL stores raise it in their own revoke txn",
    ),
    (
        Bug::EventOutsideTxn,
        "its code point is the simulation's paydb (`dlock_paydb::mem`); the SQL stores write every event by a trigger, in the statement of its change",
    ),
    (
        Bug::CursorOnePast,
        "only a client of the event stream shows it, and the real run has none yet: the simulation's stream watcher judges it",
    ),
    (
        Bug::NoResyncAfterRetention,
        "only a client of the event stream resuming past the retention purge shows it, and the real run has none yet: the simulation's stream watcher judges it",
    ),
];

/// The real plant of a `--plant` name, or why there is none.
pub fn find(name: &str) -> Result<&'static RealPlant, String> {
    let Some(bug) = Bug::parse(name) else {
        let names: Vec<&str> = REAL.iter().map(|p| p.bug.name()).collect();
        return Err(format!("--plant {name}: no such planted bug (a real run plants {})", names.join(", ")));
    };
    if let Some(p) = REAL.iter().find(|p| p.bug == bug) {
        return Ok(p);
    }
    let why = NOT_REAL.iter().find(|(b, _)| *b == bug).map_or("not listed", |(_, w)| w);
    Err(format!("--plant {name}: a real run cannot plant it: {why}"))
}

/// Bound on a planted run's settle phase (s): a planted bug is caught in the judgement, and
/// a run whose bug stalls the cluster is judged as it stands.
pub const PLANT_SETTLE_S: u64 = 30;

/// The outcome of one plant of [`run_all`].
#[derive(Debug, Clone)]
pub struct PlantRun {
    pub bug: Bug,
    pub seed: u64,
    pub duration_s: u64,
    pub exit: u8,
    pub caught: bool,
}

/// Runs every plant of [`REAL`] (or those named in `only`) at its pinned seed and fault
/// phase, without the queue and the lock-set, one after another; each run's report as
/// `dlock-real run` prints it, then one line per plant. A caught plant's directory is
/// removed; a missed one's is kept.
pub fn run_all(root: &std::path::Path, only: &[String]) -> Vec<PlantRun> {
    let mut out = Vec::new();
    for p in REAL.iter().filter(|p| only.is_empty() || only.iter().any(|n| n == p.bug.name())) {
        let kinds = match crate::nemesis::parse_kinds(p.nemesis) {
            Ok(k) => k,
            Err(e) => {
                eprintln!("dlock-real: {}: {e}", p.bug);
                continue;
            }
        };
        println!("== plant {} (seed {}, {} s, nemesis {})", p.bug, p.seed, p.duration_s, p.nemesis);
        let a = crate::run::Args {
            seed: p.seed,
            duration_ms: p.duration_s * 1_000,
            kinds,
            json: false,
            plant: Some(p.bug.name().to_owned()),
            keep: false,
            dir: None,
            per_s: crate::run::RATE_PER_S_DEFAULT,
            accounts: crate::run::ACCOUNTS_DEFAULT,
            settle_s: PLANT_SETTLE_S,
            queue: false,
            lock_set: false,
        };
        let (exit, caught) = crate::run::run_verdict(root, &a);
        out.push(PlantRun { bug: p.bug, seed: p.seed, duration_s: p.duration_s, exit, caught: caught == Some(true) });
    }
    println!("planted bugs on real processes:");
    for r in &out {
        let verdict = if r.caught { "caught" } else { "NOT CAUGHT" };
        println!("  {:<26} seed {:>3} {:>3} s  exit {:>3}  {verdict}", r.bug.name(), r.seed, r.duration_s, r.exit);
    }
    for (b, why) in NOT_REAL {
        println!("  {:<26} not on real processes: {why}", b.name());
    }
    out
}

impl RealPlant {
    /// The binary it runs, under the workspace root (`None`: the release binary).
    pub fn binary(&self) -> Option<&'static str> {
        (self.how == How::Build).then_some(PLANTED_BIN)
    }
}

/// The profile and the settings a plant adds to the cluster's.
pub fn cluster_settings(p: &RealPlant) -> (&'static str, Vec<(String, String)>) {
    let mut env: Vec<(String, String)> = p.env.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect();
    match p.how {
        How::Switches(s) => {
            env.extend(s.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())));
            ("unsafe-test", env)
        }
        How::Build => {
            env.push((dlock_contract::planted::ENV.to_owned(), p.bug.name().to_owned()));
            ("production", env)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_planted_bug_is_planted_by_a_real_run_or_has_a_reason_why_not() {
        for b in Bug::ALL {
            let real = REAL.iter().filter(|p| p.bug == b).count();
            let not = NOT_REAL.iter().filter(|(n, _)| *n == b).count();
            assert_eq!(real + not, 1, "{b}: in REAL {real} times, in NOT_REAL {not} times");
        }
        for p in REAL {
            assert!(!p.invariants.is_empty(), "{}", p.bug);
            let switches = matches!(p.how, How::Switches(_));
            assert_eq!(
                switches,
                !p.bug.layers_off().is_empty(),
                "{}: fencing bugs are switches, others the build",
                p.bug
            );
            assert!(crate::nemesis::parse_kinds(p.nemesis).is_ok(), "{}: {}", p.bug, p.nemesis);
        }
    }

    #[test]
    fn a_plant_the_real_run_cannot_make_is_refused_with_its_reason() {
        assert!(find("grant-unexpired").is_ok());
        assert!(find("skip-owner-check").is_ok());
        let e = find("mark-ge").unwrap_err();
        assert!(e.contains("forger"), "{e}");
        let e = find("nope").unwrap_err();
        assert!(e.contains("fencing-off-both"), "{e}");
    }

    #[test]
    fn a_build_plant_runs_the_test_only_build_with_its_name_and_a_switch_plant_the_unsafe_profile() {
        let p = find("grant-unexpired").unwrap();
        let ((profile, env), bin) = (cluster_settings(p), p.binary());
        assert_eq!((profile, bin), ("production", Some(PLANTED_BIN)));
        assert!(env.contains(&("DLOCK_PLANTED_BUG".to_owned(), "grant-unexpired".to_owned())));
        let p = find("fencing-off-both").unwrap();
        let ((profile, env), bin) = (cluster_settings(p), p.binary());
        assert_eq!((profile, bin), ("unsafe-test", None));
        assert!(env.iter().all(|(k, _)| k != "DLOCK_PLANTED_BUG"));
        assert!(env.contains(&("DLOCK_RAIL_PROXY_DUPLICATE_GUARD_ENABLED".to_owned(), "false".to_owned())));
    }
}
