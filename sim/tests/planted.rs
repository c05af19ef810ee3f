//! Negative controls (issue 11): a simulation that never fails proves nothing, so each bug
//! this project exists to prevent is planted (`dlock_rt::planted`, simulation only) and a
//! campaign must find it.
//!
//! For each bug the test proves:
//! 1. **It is found**: a campaign with the bug planted, seeds 1, 2, … (stopping at the first
//!    failing seed), fails within [`SEEDS_MAX`] seeds;
//! 2. **by the invariant that should break**: that seed breaks the invariant the bug's row
//!    in [`CONTROLS`] expects (a correctness failure), and every other failure of it is one
//!    the row names as a consequence too (`also`: a lock bug that gives a key to two
//!    holders breaks the store's exclusion and the holders' alike);
//! 3. **reproducibly**: the failing seed, run again with the bug, fails the same way (the
//!    same failures, the same trace);
//! 4. **because of the bug**: the same seed with nothing planted is clean.
//!
//! A bug the swarm does not reach within [`SEEDS_MAX`] seeds gets a pinned seed (its row
//! names it: the bug table's reproduction, which may break a liveness invariant) or a
//! targeted scenario instead (its row names it; the default swarm draw is unchanged). None needs one today:
//! `mark-ge` needs a token equal to the mark, which the executors never present, and the
//! forger's equal-token replays present one (`scenarios/equal-token-at-the-mark.toml` still
//! does, for `sim/tests/shrink.rs`).
//!
//! The stream plants (`cursor-one-past`, `no-resync-after-retention`) live in the stream
//! code every service shares (`dlock_http::stream`), so each is also found stream by stream
//! ([`the_watcher_finds_on`]): on the lock server's stream and on the rail-proxy's, each
//! failure naming its stream, with the same four steps over the seeds that watch it.
//!
//! docs/simulation.md ("Planted bugs") has the table of seeds each bug took.
//! `DLOCK_SIM_JOBS` sets the worker threads.
#![allow(
    clippy::disallowed_methods,
    reason = "a simulation test: it times its own run on the host's clock, outside the services"
)]
#![cfg(madsim)]

use dlock_rt::planted::Bug;
use dlock_sim::campaign::{self, RunOptions};
use dlock_sim::outcome::{Failure, FailureClass, SeedOutcome};
use dlock_sim::swarm::{Backend, SwarmConfig};
use dlock_sim::watcher::Stream;

/// Seeds a campaign may take to find a planted bug (issue 11).
const SEEDS_MAX: u64 = 200;

/// One negative control: the bug, the invariant it must break, and the scenario it plays
/// when the swarm does not reach it.
struct Control {
    bug: Bug,
    invariant: &'static str,
    /// Other invariants (correctness or liveness) the bug may break as well.
    also: &'static [&'static str],
    scenario: Option<&'static str>,
    /// A pinned seed, for a bug the swarm's draw rarely reaches (a clock stepped ahead and
    /// back on a payment replica, say; with its scenario): the campaign is that seed alone,
    /// and its invariant may be a liveness one (the bug table's reproduction,
    /// docs/testing/bugs.md).
    pinned: Option<u64>,
}

const CONTROLS: [Control; 20] = [
    Control {
        bug: Bug::FencingOffPayment,
        invariant: "fence_accepts_only_rising_tokens",
        also: &[],
        scenario: None,
        pinned: None,
    },
    Control {
        bug: Bug::FencingOffProxy,
        invariant: "fence_accepts_only_rising_tokens",
        also: &[],
        scenario: None,
        pinned: None,
    },
    Control {
        bug: Bug::FencingOffBoth,
        invariant: "fence_accepts_only_rising_tokens",
        also: &[],
        scenario: None,
        pinned: None,
    },
    Control {
        bug: Bug::ExecutorRetriesSubmit,
        invariant: "ambiguous_payout_never_resubmitted",
        also: &[],
        scenario: None,
        pinned: None,
    },
    Control {
        bug: Bug::MarkGe,
        invariant: "fence_accepts_only_rising_tokens",
        also: &[],
        scenario: None,
        pinned: None,
    },
    Control {
        bug: Bug::MarkAfterCall,
        invariant: "fence_accepts_only_rising_tokens",
        also: &[],
        scenario: None,
        pinned: None,
    },
    Control {
        bug: Bug::RevokeKeepsFloor,
        invariant: "revoke_raises_the_token_floor",
        also: &[],
        scenario: None,
        pinned: None,
    },
    Control {
        bug: Bug::GrantUnexpired,
        invariant: "no_two_live_grants_per_key",
        also: &["no_two_believing_holders"],
        scenario: None,
        pinned: None,
    },
    Control {
        bug: Bug::SkipGrantSignatureCheck,
        invariant: "forged_write_refused",
        also: &[],
        scenario: None,
        pinned: None,
    },
    Control { bug: Bug::SkipOwnerCheck, invariant: "owner_attack_refused", also: &[], scenario: None, pinned: None },
    Control {
        bug: Bug::EtcdWallClockJudge,
        invariant: "no_two_live_grants_per_key",
        // The replica whose wall clock ran ahead also judges sessions dead that another
        // replica just heartbeated, and its holders overlap; one an hour behind judges
        // every lease an hour longer: keys stall.
        also: &[
            "no_two_believing_holders",
            "heartbeat_keeps_its_session_live",
            "lock_delay_honoured",
            "every_payout_settles",
        ],
        scenario: None,
        pinned: None,
    },
    Control {
        bug: Bug::ReconcilerTrustsAnswer,
        invariant: "reconciler_findings_match_the_rails_record",
        also: &[],
        scenario: None,
        pinned: None,
    },
    Control {
        bug: Bug::FenceOffByOne,
        invariant: "fenced_out_means_a_newer_holder",
        // Every holder of a quiet account is refused: its payouts may never settle.
        also: &["every_payout_settles"],
        scenario: None,
        pinned: None,
    },
    Control {
        bug: Bug::LeaseEndInclusive,
        invariant: "lock_decision_justified",
        also: &["dead_grant_never_revived"],
        scenario: None,
        pinned: None,
    },
    Control {
        bug: Bug::RotateLapsedSession,
        invariant: "dead_grant_never_revived",
        also: &[],
        scenario: None,
        pinned: None,
    },
    Control {
        bug: Bug::BatchIgnoresAccount,
        invariant: "fenced_write_within_its_account",
        // The foreign write raised the forger's fence to its token: its next batch under
        // that token is refused by it.
        also: &["fenced_out_means_a_newer_holder"],
        scenario: None,
        pinned: None,
    },
    Control {
        bug: Bug::P1HidesAhead,
        invariant: "every_payout_settles",
        also: &[],
        // Bug B8's situation, played by a scenario: payouts created while payment-1's clock
        // ran 200 s ahead, listed after it stepped back; P1 then hides them from every scan.
        scenario: Some("p1-clock-ahead"),
        pinned: Some(1),
    },
    Control {
        bug: Bug::EventOutsideTxn,
        invariant: "outbox_matches_tables",
        // The watcher's seeds stream the phantom events too: they match paydb's outbox.
        also: &[],
        scenario: None,
        pinned: None,
    },
    Control { bug: Bug::CursorOnePast, invariant: "stream_never_gaps", also: &[], scenario: None, pinned: None },
    Control {
        bug: Bug::NoResyncAfterRetention,
        invariant: "stream_never_gaps",
        also: &[],
        scenario: None,
        pinned: None,
    },
];

fn jobs() -> usize {
    std::env::var("DLOCK_SIM_JOBS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1))
}

fn options(c: &Control, planted: Option<Bug>) -> RunOptions {
    RunOptions { planted, scenario: c.scenario.map(str::to_owned), ..RunOptions::default() }
}

/// The first failing seed of a campaign with `c`'s bug planted: seeds 1..=SEEDS_MAX in
/// rounds of `jobs()` (one madsim runtime per thread), stopping after the first round with a
/// failure. Returns the lowest failing seed's outcome.
fn first_failing(c: &Control) -> Option<SeedOutcome> {
    let opts = options(c, Some(c.bug));
    if let Some(seed) = c.pinned {
        let o = campaign::run_seed(seed, &opts);
        return (!o.failures.is_empty()).then_some(o);
    }
    let jobs = jobs().max(1) as u64;
    let mut start = 1;
    while start <= SEEDS_MAX {
        let round: Vec<u64> = (start..=(start + jobs - 1).min(SEEDS_MAX)).collect();
        let failed = std::sync::Mutex::new(Vec::new());
        campaign::for_each_seed(&round, round.len(), &|seed| {
            let o = campaign::run_seed(seed, &opts);
            if !o.failures.is_empty() {
                if let Ok(mut f) = failed.lock() {
                    f.push(o);
                }
            }
        });
        let mut failed = failed.into_inner().unwrap_or_else(|e| e.into_inner());
        failed.sort_by_key(|o| o.seed);
        if let Some(o) = failed.into_iter().next() {
            return Some(o);
        }
        start += jobs;
    }
    None
}

fn control(bug: Bug) -> &'static Control {
    CONTROLS.iter().find(|c| c.bug == bug).expect("every bug has a control")
}

fn the_campaign_finds(bug: Bug) {
    let c = control(bug);
    let started = std::time::Instant::now();
    let Some(found) = first_failing(c) else {
        panic!("bug {bug} planted: no violation within {SEEDS_MAX} seeds (scenario {:?})", c.scenario);
    };
    let seed = found.seed;
    eprintln!(
        "planted {bug}: found at seed {seed} ({:.1} s): {}",
        started.elapsed().as_secs_f64(),
        found.failures.iter().map(|f| f.line(seed)).collect::<Vec<_>>().join("; ")
    );
    // 2. The invariant that should break, and nothing the row does not name.
    let names: Vec<(FailureClass, &str)> = found.failures.iter().map(|f| (f.class, f.invariant)).collect();
    // A pinned seed's bug may be a liveness one; a swarm's must break safety.
    let allowed = if c.pinned.is_some() { FailureClass::Liveness } else { FailureClass::Correctness };
    assert!(
        (names.contains(&(FailureClass::Correctness, c.invariant)) || names.contains(&(allowed, c.invariant)))
            && names.iter().all(|(class, name)| {
                *name == c.invariant && (*class == FailureClass::Correctness || *class == allowed)
                    || c.also.contains(name) && matches!(class, FailureClass::Correctness | FailureClass::Liveness)
            }),
        "bug {bug}, seed {seed}: expected {} (and only {:?} besides) to break, found {names:?}",
        c.invariant,
        c.also
    );
    assert!(found.trace.iter().any(|l| l == &format!("planted: bug {bug}")) || c.scenario.is_some());
    // 3. The failing seed replays to the same violation.
    let again = campaign::run_seed(seed, &options(c, Some(bug)));
    assert_eq!(again.failures, found.failures, "bug {bug}, seed {seed}: the replay failed differently");
    assert_eq!(again.trace, found.trace, "bug {bug}, seed {seed}: the replay's trace differs");
    // 4. Without the bug the same seed is clean.
    let clean = campaign::run_seed(seed, &options(c, None));
    assert!(clean.failures.is_empty(), "seed {seed} with nothing planted: {:?}", clean.failures);
    assert_eq!(dlock_rt::planted::current(), None, "the bug leaked past its seed");
}

#[test]
fn fencing_off_at_the_payment_resource_is_found_as_a_lower_token_accepted() {
    the_campaign_finds(Bug::FencingOffPayment);
}

#[test]
fn fencing_off_at_the_rail_proxy_is_found_as_a_lower_token_admitted() {
    the_campaign_finds(Bug::FencingOffProxy);
}

#[test]
fn fencing_off_at_both_is_found_as_a_lower_token_accepted() {
    the_campaign_finds(Bug::FencingOffBoth);
}

#[test]
fn an_executor_retrying_a_submit_after_a_rail_timeout_is_found_as_an_ambiguous_payout_resubmitted() {
    the_campaign_finds(Bug::ExecutorRetriesSubmit);
}

#[test]
fn greater_or_equal_at_the_mark_is_found_as_an_equal_token_admitted() {
    the_campaign_finds(Bug::MarkGe);
}

#[test]
fn the_mark_advanced_after_the_rail_call_is_found_as_a_lower_token_admitted_in_flight() {
    the_campaign_finds(Bug::MarkAfterCall);
}

#[test]
fn a_revoke_that_keeps_the_token_floor_is_found() {
    the_campaign_finds(Bug::RevokeKeepsFloor);
}

#[test]
fn granting_a_key_whose_lease_has_not_expired_is_found_as_two_live_grants() {
    the_campaign_finds(Bug::GrantUnexpired);
}

#[test]
fn resources_that_skip_the_grant_signature_check_are_found_by_the_forger() {
    the_campaign_finds(Bug::SkipGrantSignatureCheck);
}

#[test]
fn a_lock_server_that_skips_the_owner_check_is_found_by_the_forgers_owner_attacks() {
    the_campaign_finds(Bug::SkipOwnerCheck);
}

/// The old rule on etcd (each replica's wall clock against deadlines others wrote) is found
/// by the oracle's view of etcd's acknowledged calls: a lock replica's wall clock stepped
/// ahead grants a key again while its grant still lives in true time.
#[test]
fn etcd_judging_leases_by_wall_clocks_is_found_as_two_live_grants() {
    the_campaign_finds(Bug::EtcdWallClockJudge);
}

/// A reconciler that reads the rail's answer for what it did is found payout by payout
/// against the rail's own record: a quarantined payout whose call was dropped after paying
/// is told to the operator as NOT_PAID.
#[test]
fn a_reconciler_trusting_the_rails_answer_over_its_record_is_found_payout_by_payout() {
    the_campaign_finds(Bug::ReconcilerTrustsAnswer);
}

/// A fence that refuses the token right above it answers `FENCED_OUT` with nobody newer
/// holding the account: found by the oracle's reading of every refusal.
#[test]
fn a_fence_refusing_the_next_token_is_found_as_fenced_out_without_a_newer_holder() {
    the_campaign_finds(Bug::FenceOffByOne);
}

/// A grant judged live at the very tick it ends is the conservative direction: no safety
/// invariant objects, but the decision is not what the records say.
#[test]
fn a_grant_judged_live_at_the_tick_it_ends_is_found_as_an_unjustified_decision() {
    the_campaign_finds(Bug::LeaseEndInclusive);
}

/// A holder whose session lapsed keeps rotating: its dead grant comes back.
#[test]
fn a_rotate_that_ignores_a_lapsed_session_is_found_as_a_dead_grant_revived() {
    the_campaign_finds(Bug::RotateLapsedSession);
}

/// A store whose batch stopped filtering by account writes another account's payout under
/// the fence it passed: the forger's cross-account batch shows it.
#[test]
fn a_batch_that_ignores_its_account_is_found_as_a_write_outside_its_account() {
    the_campaign_finds(Bug::BatchIgnoresAccount);
}

/// P1's first page without the rows a clock ahead stamped (bug B8): in `p1-clock-ahead` the
/// payouts created while payment-1 ran ahead stay hidden from every scan, and do not settle.
#[test]
fn a_payouts_list_that_hides_rows_stamped_ahead_is_found_as_payouts_never_settled() {
    the_campaign_finds(Bug::P1HidesAhead);
}

/// A claim's events written though the claim rolled back: paydb's outbox no longer
/// replays to its tables.
#[test]
fn events_written_outside_their_transaction_are_found_as_an_outbox_that_contradicts_its_tables() {
    the_campaign_finds(Bug::EventOutsideTxn);
}

/// A resume one seq past the cursor: the watcher misses the first event after it.
#[test]
fn a_stream_resuming_one_past_its_cursor_is_found_as_a_gap() {
    the_campaign_finds(Bug::CursorOnePast);
}

/// A cursor the purge passed, resumed instead of answered `resync_required`: the watcher,
/// back from a nap, never gets the purged events.
#[test]
fn a_stream_resuming_a_purged_cursor_is_found_as_a_gap() {
    the_campaign_finds(Bug::NoResyncAfterRetention);
}

// ---------------------------------------------------------------------------------------
// The stream plants, stream by stream
// ---------------------------------------------------------------------------------------

/// Seeds a campaign may take to find a stream plant on one given stream (only the seeds
/// whose draw watches that stream are run).
const STREAM_SEEDS_MAX: u64 = 400;

/// Whether seed `seed`'s draw watches `stream` (the watcher plays, and the lock server's
/// stream needs the simulation lockdb).
fn watches(seed: u64, stream: Stream) -> bool {
    let cfg = SwarmConfig::draw(seed);
    cfg.watcher && (stream != Stream::Lock || cfg.backend == Backend::Mem)
}

/// Whether `f` is `bug`'s invariant broken on `stream` (its detail names the stream).
fn broken_on(f: &Failure, c: &Control, stream: Stream) -> bool {
    f.class == FailureClass::Correctness && f.invariant == c.invariant && f.detail.starts_with(&stream.label())
}

/// The stream plants live in the shared stream code (`dlock_http::stream`), so each must
/// be found on every stream it applies to, not only the first one that shows it: the lowest
/// seed (of those watching `stream`, in rounds of `jobs()`) whose failures break the bug's
/// invariant on `stream`; then, as [`the_campaign_finds`], nothing the row does not name
/// breaks, the seed replays to the same failures and trace, and without the bug it is clean.
fn the_watcher_finds_on(bug: Bug, stream: Stream) {
    let c = control(bug);
    let opts = options(c, Some(bug));
    let seeds: Vec<u64> = (1..=STREAM_SEEDS_MAX).filter(|s| watches(*s, stream)).collect();
    let started = std::time::Instant::now();
    let mut found = None;
    for round in seeds.chunks(jobs().max(1)) {
        let hits = std::sync::Mutex::new(Vec::new());
        campaign::for_each_seed(round, round.len(), &|seed| {
            let o = campaign::run_seed(seed, &opts);
            if o.failures.iter().any(|f| broken_on(f, c, stream)) {
                if let Ok(mut h) = hits.lock() {
                    h.push(o);
                }
            }
        });
        let mut hits = hits.into_inner().unwrap_or_else(|e| e.into_inner());
        hits.sort_by_key(|o| o.seed);
        if let Some(o) = hits.into_iter().next() {
            found = Some(o);
            break;
        }
    }
    let Some(found) = found else {
        panic!("bug {bug} planted: not found on the {} within {} watching seeds", stream.label(), seeds.len());
    };
    let seed = found.seed;
    eprintln!(
        "planted {bug}: found on the {} at seed {seed} ({:.1} s): {}",
        stream.label(),
        started.elapsed().as_secs_f64(),
        found.failures.iter().map(|f| f.line(seed)).collect::<Vec<_>>().join("; ")
    );
    let names: Vec<(FailureClass, &str)> = found.failures.iter().map(|f| (f.class, f.invariant)).collect();
    assert!(
        names
            .iter()
            .all(|(class, name)| *class == FailureClass::Correctness && *name == c.invariant || c.also.contains(name)),
        "bug {bug}, seed {seed}: expected only {} (and {:?}) to break, found {names:?}",
        c.invariant,
        c.also
    );
    let again = campaign::run_seed(seed, &opts);
    assert_eq!(again.failures, found.failures, "bug {bug}, seed {seed}: the replay failed differently");
    assert_eq!(again.trace, found.trace, "bug {bug}, seed {seed}: the replay's trace differs");
    let clean = campaign::run_seed(seed, &options(c, None));
    assert!(clean.failures.is_empty(), "seed {seed} with nothing planted: {:?}", clean.failures);
    assert_eq!(dlock_rt::planted::current(), None, "the bug leaked past its seed");
}

/// lockdb's stream resumes through the same hub: a resume one past the cursor skips a lock
/// event, which the lock server's stream is judged for against lockdb's outbox.
#[test]
fn a_stream_resuming_one_past_its_cursor_is_found_on_the_lock_servers_stream() {
    the_watcher_finds_on(Bug::CursorOnePast, Stream::Lock);
}

/// lockdb's purge passes a napping client's cursor; resumed anyway, it never gets the
/// purged lock events.
#[test]
fn a_stream_resuming_a_purged_cursor_is_found_on_the_lock_servers_stream() {
    the_watcher_finds_on(Bug::NoResyncAfterRetention, Stream::Lock);
}

/// The rail-proxy's selection of paydb's events: a skipped `rail.*` event is a gap.
#[test]
fn a_stream_resuming_one_past_its_cursor_is_found_on_the_rail_proxys_stream() {
    the_watcher_finds_on(Bug::CursorOnePast, Stream::Rail);
}

/// paydb's purge passes the rail-proxy client's cursor; resumed anyway, it never gets the
/// purged `rail.*` events.
#[test]
fn a_stream_resuming_a_purged_cursor_is_found_on_the_rail_proxys_stream() {
    the_watcher_finds_on(Bug::NoResyncAfterRetention, Stream::Rail);
}

/// Every bug has exactly one control, in the order.
#[test]
fn every_planted_bug_has_a_negative_control() {
    let bugs: Vec<Bug> = CONTROLS.iter().map(|c| c.bug).collect();
    assert_eq!(bugs, Bug::ALL);
}
