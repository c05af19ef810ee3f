//! Every scenario under `scenarios/` that names a topology (not the proxy-only ones, which
//! `sim/tests/scenarios.rs` plays on the proxy world) plays here as a campaign seed
//! (`campaign::run_seed_with`, the path of `dlock-sim run --scenario NAME`): the world of
//! `world::build` with the file's topology, settings and workload, its steps as the fault
//! phase's schedule, then the campaign's heal, liveness phase and oracle. Each seed must be
//! clean (no crash, liveness or correctness failure), must fire every probe its file lists,
//! and each test asserts the property its scenario exists to show from the run's ground
//! truth (`campaign::ScenarioFacts`). `every_shipped_scenario_is_played_by_a_test` holds
//! every file to being played by some test. `DLOCK_SIM_SCENARIO_SEEDS` sets the seeds per
//! test (16 by default); a failing seed names its replay command.

#![cfg(madsim)]

use dlock_contract::payout::PayoutState;
use dlock_payment_resource::store_mem::FencedOp;
use dlock_rt::probe::Probe;
use dlock_sim::campaign::{self, RunOptions, ScenarioFacts};
use dlock_sim::faults::FaultKind;
use dlock_sim::oracle::Seen;
use dlock_sim::scenario;
use dlock_sim::store_faults::{Injected, StoreName};
use dlock_sim::world::Topology;
use uuid::Uuid;

/// Scenarios played as campaign seeds in the whole-cluster world, each by its test below.
const PLAYED_IN_THE_WORLD: &[&str] = &[
    "clock-drift-40",
    "duplicate-ack-rail",
    "lock-leader-loss",
    "lock-leader-loss-etcd",
    "p1-clock-ahead",
    "partition-holder-lock-server",
    "pause-during-rail-call",
    "revoke-mid-flight",
    "stale-batch-post",
    "stale-writer-second-proxy",
    "waiter-session-expires",
];

/// Every file under `scenarios/` is played by a test: the proxy scenarios by
/// `every_scenario_holds_its_invariants` (sim/tests/scenarios.rs, which plays every one of
/// them), the others by a test of this file (`PLAYED_IN_THE_WORLD`). A new file fails here
/// until a test plays it.
#[test]
fn every_shipped_scenario_is_played_by_a_test() {
    let all = scenario::all().expect("scenarios load");
    let names: Vec<&str> = all.iter().map(|(_, s)| s.name.as_str()).collect();
    for (path, s) in &all {
        let played = s.is_proxy_only() || PLAYED_IN_THE_WORLD.contains(&s.name.as_str());
        assert!(played, "{path} is played by no test");
    }
    for listed in PLAYED_IN_THE_WORLD {
        assert!(names.contains(listed), "{listed} is listed as played but has no file");
    }
}

// ---------------------------------------------------------------------------------------
// Scenarios played as campaign seeds in the whole-cluster world.
// ---------------------------------------------------------------------------------------

/// Seeds each world scenario test plays (`DLOCK_SIM_SCENARIO_SEEDS` sets it).
const WORLD_SEEDS_DEFAULT: u64 = 16;

fn world_seeds() -> Vec<u64> {
    let n = std::env::var("DLOCK_SIM_SCENARIO_SEEDS").ok().and_then(|v| v.parse().ok()).unwrap_or(WORLD_SEEDS_DEFAULT);
    (1..=n.max(1)).collect()
}

/// Plays `name` as a campaign seed; asserts the seed is clean (no crash, liveness or
/// correctness failure) and returns its outcome and facts.
fn play_in_the_world(name: &str, seed: u64) -> (dlock_sim::outcome::SeedOutcome, ScenarioFacts) {
    eprintln!("dlock-sim seed={seed} scenario={name} (replay: cargo xtask sim replay --seed {seed} --scenario {name})");
    let opts = RunOptions { scenario: Some(name.to_owned()), ..RunOptions::default() };
    let (outcome, facts) = campaign::run_seed_with(seed, &opts);
    let lines: Vec<String> = outcome.failures.iter().map(|f| f.line(seed)).collect();
    assert!(lines.is_empty(), "{name} seed {seed}: {lines:?}\n{}", outcome.trace.join("\n"));
    let facts = facts.expect("a world scenario leaves its facts");
    // The file names the probes it exists to reach: each fired in this seed.
    let s = scenario::load_named(name).expect("scenario");
    for p in &s.probes {
        let fired = outcome.probes.iter().any(|(probe, n)| probe.name() == p && *n > 0);
        assert!(fired, "{name} seed {seed}: probe {p} never fired ({:?})", outcome.probes);
    }
    (outcome, facts)
}

fn probe(o: &dlock_sim::outcome::SeedOutcome, p: Probe) -> u64 {
    o.probes.get(&p).copied().unwrap_or(0)
}

fn all_posted(f: &ScenarioFacts) -> bool {
    !f.final_states.is_empty() && f.final_states.values().all(|s| *s == Some(PayoutState::Posted))
}

fn rail_calls_of(f: &ScenarioFacts, payout: Uuid) -> usize {
    f.rail_calls.iter().filter(|c| **c == payout.to_string()).count()
}

/// C3 §3.5 on two proxies over one paydb: the zombie (executor 1, whose proxy is proxy-1)
/// submits with its older token while the newer holder's forward (executor 2, through
/// proxy-2) is in flight; the mark both replicas share refuses it, and the rail sees the
/// payout once.
#[test]
fn a_stale_writer_on_the_second_proxy_is_fenced_by_the_shared_mark_while_the_newer_forward_is_in_flight() {
    // Executor i calls proxy replica i here: the two writers reach two replicas.
    assert_eq!((Topology::replica_for(1, 2), Topology::replica_for(2, 2)), (1, 2));
    for seed in world_seeds() {
        let (o, f) = play_in_the_world("stale-writer-second-proxy", seed);
        let mut caught = 0;
        for s in &f.seen {
            let Seen::Fenced { op: FencedOp::Admit, accepted: false, payout_id, token, owner_id, in_flight, .. } = s
            else {
                continue;
            };
            if !owner_id.starts_with("executor-1/") {
                continue;
            }
            // The newer holder's forward of the same account is in flight at that instant,
            // and it was admitted (on the other replica) with a larger token.
            let newer = in_flight.iter().find(|(t, o)| t > token && o.starts_with("executor-2/"));
            let Some((newer_token, _)) = newer else { continue };
            let admitted = f.seen.iter().any(|e| {
                matches!(e, Seen::Fenced { op: FencedOp::Admit, accepted: true, token: t, owner_id: w, .. }
                    if t == newer_token && w.starts_with("executor-2/"))
            });
            assert!(admitted, "seed {seed}: in-flight token {newer_token} was never admitted");
            assert_eq!(rail_calls_of(&f, *payout_id), 1, "seed {seed}: payout {payout_id} at the rail");
            caught += 1;
        }
        assert!(
            caught >= 1,
            "seed {seed}: no stale submission fenced on proxy-1 during a forward:\n{}",
            o.trace.join("\n")
        );
        assert!(probe(&o, Probe::FencedOutRail) >= 1, "seed {seed}: {:?}", o.probes);
        assert!(all_posted(&f), "seed {seed}: {:?}", f.final_states);
    }
}

/// A queued waiter whose session lapses while it waits is never granted (the server
/// re-checks the session at grant time); the waiter behind it is granted after its wait,
/// with a token above the holder's.
#[test]
fn a_waiter_whose_session_expires_while_queued_is_never_granted_and_the_next_waiter_is() {
    for seed in world_seeds() {
        let (o, f) = play_in_the_world("waiter-session-expires", seed);
        let session_of = |client: &str| {
            f.clients.iter().find_map(|l| l.strip_prefix(&format!("{client}: session ")).map(str::to_owned))
        };
        let expired = session_of("client-2").expect("client-2 opened a session");
        let grants: Vec<(i64, &str, String)> = f
            .seen
            .iter()
            .filter_map(|s| match s {
                Seen::Granted { token, owner_id, session_id, .. } => {
                    Some((*token, owner_id.as_str(), session_id.to_string()))
                }
                _ => None,
            })
            .collect();
        assert!(
            grants.iter().all(|(_, owner, session)| *owner != "client-2" && *session != expired),
            "seed {seed}: the expired waiter was granted: {grants:?}"
        );
        assert!(
            f.clients.iter().any(|l| l.starts_with("client-2: refused payout:acct-0 SESSION_EXPIRED")),
            "seed {seed}: {:?}",
            f.clients
        );
        let token_of = |client: &str| grants.iter().find(|(_, o, _)| *o == client).map(|(t, _, _)| *t);
        let (holder, next) = (token_of("client-1"), token_of("client-3"));
        assert!(
            matches!((holder, next), (Some(h), Some(n)) if n > h),
            "seed {seed}: holder {holder:?}, next waiter {next:?}; {:?}",
            f.clients
        );
        assert!(probe(&o, Probe::WaiterGrantedAfterWait) >= 1, "seed {seed}: {:?}", o.probes);
        assert!(all_posted(&f), "seed {seed}: {:?}", f.final_states);
    }
}

/// The window in which lockdb refused calls (runtime ms), from the store plan's record.
fn lockdb_refusals(f: &ScenarioFacts) -> Option<(u64, u64)> {
    let at: Vec<u64> = f
        .store_faults
        .iter()
        .filter(|r| r.store == StoreName::Lockdb && r.decision.fault == Some(Injected::Unavailable))
        .map(|r| r.at_ms)
        .collect();
    Some((*at.iter().min()?, *at.iter().max()?))
}

/// Tokens of (grants, accepted claims) before `from` and after `to` (runtime ms).
fn tokens_around(f: &ScenarioFacts, from: u64, to: u64, grants: bool) -> (Vec<i64>, Vec<i64>) {
    let (mut before, mut after) = (Vec::new(), Vec::new());
    for s in &f.seen {
        let (at, token) = match s {
            Seen::Granted { at_ms, token, .. } if grants => (*at_ms, *token),
            Seen::Fenced { at_ms, token, op: FencedOp::Claim, accepted: true, .. } if !grants => (*at_ms, *token),
            _ => continue,
        };
        let at = f.monitor_started_ms + at;
        if at < from {
            before.push(token);
        } else if at > to {
            after.push(token);
        }
    }
    (before, after)
}

/// lockdb loses its leader while a lease is held: the lock servers answer NOT_LEADER, the
/// oracle sees no two live grants and rising tokens, grants resume after the loss with
/// tokens above every earlier one, and every payout is paid once and posted.
#[test]
fn a_lockdb_leader_loss_answers_not_leader_and_grants_resume_above_every_earlier_token() {
    for seed in world_seeds() {
        let (o, f) = play_in_the_world("lock-leader-loss", seed);
        let (from, to) = lockdb_refusals(&f).expect("lockdb refused calls during the leader loss");
        assert!(f.acquires_not_leader >= 1.0, "seed {seed}: no acquire answered NOT_LEADER");
        let (before, after) = tokens_around(&f, from, to, true);
        assert!(
            !before.is_empty() && !after.is_empty(),
            "seed {seed}: grants {before:?} / {after:?}\n{}",
            o.trace.join("\n")
        );
        assert!(after.iter().min() > before.iter().max(), "seed {seed}: {before:?} then {after:?}");
        assert!(all_posted(&f), "seed {seed}: {:?}", f.final_states);
        assert!(f.final_states.keys().all(|p| rail_calls_of(&f, *p) == 1), "seed {seed}: {:?}", f.rail_calls);
    }
}

/// The simulated etcd loses its leader (unreachable and frozen) while a lease is held: the
/// lock server refuses (NOT_LEADER, or INTERNAL for a write it cannot prove unapplied),
/// the fences accept only rising tokens, claims after the election carry tokens above every
/// earlier one, and every payout is paid once and posted.
#[test]
fn an_etcd_leader_loss_refuses_the_lock_server_and_tokens_rise_across_the_election() {
    for seed in world_seeds() {
        let (o, f) = play_in_the_world("lock-leader-loss-etcd", seed);
        let loss = f.faults.iter().find_map(|r| match r.kind {
            FaultKind::EtcdLeaderLoss { for_ms } => Some((r.at_ms, r.at_ms + for_ms)),
            _ => None,
        });
        let (from, to) = loss.expect("the etcd leader was lost");
        assert!(f.acquires_not_leader >= 1.0, "seed {seed}: no acquire was refused during the election");
        let (before, after) = tokens_around(&f, from, to, false);
        assert!(
            !before.is_empty() && !after.is_empty(),
            "seed {seed}: claims {before:?} / {after:?}\n{}",
            o.trace.join("\n")
        );
        assert!(after.iter().min() > before.iter().max(), "seed {seed}: {before:?} then {after:?}");
        assert!(all_posted(&f), "seed {seed}: {:?}", f.final_states);
        assert!(f.final_states.keys().all(|p| rail_calls_of(&f, *p) == 1), "seed {seed}: {:?}", f.rail_calls);
    }
}

/// A scenario seed replays bit for bit, like a swarm seed: the same configuration line,
/// failures, probes and trace.
#[test]
fn a_scenario_seed_replays_the_same_outcome() {
    let opts = RunOptions { scenario: Some("waiter-session-expires".into()), ..RunOptions::default() };
    let (a, b) = (campaign::run_seed(3, &opts), campaign::run_seed(3, &opts));
    assert!(a.config.starts_with("seed=3 scenario=waiter-session-expires "), "{}", a.config);
    assert_eq!((a.config, a.failures, a.probes, a.sim_ms), (b.config, b.failures, b.probes, b.sim_ms));
    assert_eq!(a.trace, b.trace);
}

/// An unknown scenario name is refused, naming the known ones; a proxy scenario plays as a
/// seed on the proxy world and an unmet expectation there is a correctness failure.
#[test]
fn an_unknown_scenario_is_refused_and_a_proxy_scenario_plays_as_a_seed() {
    let err = scenario::load_named("no-such-scenario").expect_err("unknown");
    assert!(err.contains("known: ") && err.contains("stale-writer-second-proxy"), "{err}");
    let opts = RunOptions { scenario: Some("no-such-scenario".into()), ..RunOptions::default() };
    let o = campaign::run_seed(1, &opts);
    assert_eq!(o.worst(), Some(dlock_sim::outcome::FailureClass::Crash));
    let opts = RunOptions { scenario: Some("proxy-restart".into()), ..RunOptions::default() };
    let o = campaign::run_seed(1, &opts);
    assert!(o.failures.is_empty(), "{:?}", o.failures);
    assert!(o.trace.iter().any(|l| l.contains("token=41 -> 409 FENCED_OUT")), "{:?}", o.trace);
}

/// Runtime ms of the first fault record of `kind`'s variant.
fn first_fault(f: &ScenarioFacts, is: impl Fn(&FaultKind) -> bool) -> Option<u64> {
    f.faults.iter().find(|r| is(&r.kind)).map(|r| r.at_ms)
}

/// Payouts created while payment-1's wall clock ran 200 s ahead (both executors down), and
/// worked after it stepped back: P1's first page lists the rows stamped after its own
/// millisecond, so every payout settles long before that clock catches up (bug B8;
/// `sim/tests/planted.rs` plants `p1-hides-ahead` in the same scenario and sees none settle).
#[test]
fn payouts_stamped_by_a_payment_clock_ahead_settle_once_it_steps_back() {
    for seed in world_seeds() {
        let (o, f) = play_in_the_world("p1-clock-ahead", seed);
        let ahead = first_fault(&f, |k| matches!(k, FaultKind::WallStep { delta_ms: 200_000 }));
        let back = first_fault(&f, |k| matches!(k, FaultKind::WallStep { delta_ms: -200_000 }));
        let (Some(_), Some(_)) = (ahead, back) else {
            panic!("seed {seed}: the steps were not applied: {:?}", f.faults)
        };
        assert!(all_settled_once(&f), "seed {seed}: {:?} / {:?}", f.final_states, f.rail_calls);
        assert!(o.sim_ms < 60_000, "seed {seed}: settled only at {} ms: the payouts stamped ahead waited", o.sim_ms);
    }
}

/// An executor whose clock runs 40 % slow (past the 30 % margin), its wall clock stepped back
/// 90 s, keeps working beside a correct one: every payout settles, none reaches the rail
/// twice, the ledger balances.
#[test]
fn clock_drift_40_on_one_executor_pays_nothing_twice() {
    for seed in world_seeds() {
        let (o, f) = play_in_the_world("clock-drift-40", seed);
        let drifted = first_fault(&f, |k| matches!(k, FaultKind::ClockRate { rate } if (*rate - 0.6).abs() < 1e-9));
        let stepped = first_fault(&f, |k| matches!(k, FaultKind::WallStep { delta_ms: -90_000 }));
        let (Some(drifted), Some(_)) = (drifted, stepped) else {
            panic!("seed {seed}: the drift or the wall step was not applied: {:?}", f.faults)
        };
        // The drifted executor wrote (and was judged) after its clock slowed.
        let wrote = f.seen.iter().any(|s| {
            matches!(s, Seen::Fenced { at_ms, owner_id, accepted: true, .. }
                if owner_id.starts_with("executor-1/") && f.monitor_started_ms + at_ms > drifted)
        });
        assert!(wrote, "seed {seed}: executor 1 never wrote under its drifted clock:\n{}", o.trace.join("\n"));
        assert!(all_settled_once(&f), "seed {seed}: {:?} / {:?}", f.final_states, f.rail_calls);
    }
}

/// The first holder is partitioned from the lock server while it holds its lease: it cannot
/// renew, release or take its post's grant; the partition heals while that lease lives
/// (`partition_healed_mid_lease`); nothing is paid twice and every payout settles.
#[test]
fn a_holder_partitioned_from_the_lock_server_pays_nothing_twice() {
    for seed in world_seeds() {
        let (o, f) = play_in_the_world("partition-holder-lock-server", seed);
        let first_holder = f.seen.iter().find_map(|s| match s {
            Seen::Granted { owner_id, .. } => Some(owner_id.clone()),
            _ => None,
        });
        assert!(
            first_holder.as_deref().is_some_and(|o| o.starts_with("executor-1/")),
            "seed {seed}: the partitioned node was not the holder: {first_holder:?}"
        );
        assert!(probe(&o, Probe::PartitionHealedMidLease) >= 1, "seed {seed}: {:?}", o.probes);
        assert!(all_settled_once(&f), "seed {seed}: {:?} / {:?}", f.final_states, f.rail_calls);
    }
}

/// A holder frozen past its lease and its session while its rail call is in flight: the
/// other executor takes the key meanwhile, and nothing the zombie writes once it wakes
/// carries a token from before it woke: its post runs under a newer grant, above every
/// token granted while it was frozen. Nothing is paid twice; every payout is posted.
#[test]
fn a_holder_paused_during_its_rail_call_pays_nothing_twice() {
    for seed in world_seeds() {
        let (o, f) = play_in_the_world("pause-during-rail-call", seed);
        let paused = first_fault(&f, |k| matches!(k, FaultKind::Pause)).expect("executor 1 was paused");
        let resumed = first_fault(&f, |k| matches!(k, FaultKind::Resume)).expect("executor 1 was resumed");
        let at = |ms: &u64| f.monitor_started_ms + ms;
        let during: Vec<i64> = f
            .seen
            .iter()
            .filter_map(|s| match s {
                Seen::Granted { at_ms, token, owner_id, .. }
                    if (paused..resumed).contains(&at(at_ms)) && owner_id.starts_with("executor-2/") =>
                {
                    Some(*token)
                }
                _ => None,
            })
            .collect();
        assert!(!during.is_empty(), "seed {seed}: executor 2 took no grant during the freeze:\n{}", o.trace.join("\n"));
        let after: Vec<i64> = f
            .seen
            .iter()
            .filter_map(|s| match s {
                Seen::Fenced { at_ms, token, owner_id, accepted: true, .. }
                    if at(at_ms) >= resumed && owner_id.starts_with("executor-1/") =>
                {
                    Some(*token)
                }
                _ => None,
            })
            .collect();
        let newest = during.iter().max().copied().unwrap_or(0);
        assert!(!after.is_empty(), "seed {seed}: the zombie never wrote again:\n{}", o.trace.join("\n"));
        assert!(after.iter().all(|t| *t > newest), "seed {seed}: zombie wrote {after:?} after grants {during:?}");
        assert!(all_posted(&f) && all_settled_once(&f), "seed {seed}: {:?}", f.final_states);
    }
}

/// An operator revokes the key while its holder stalls before its post: the next holder
/// takes the key above the raised floor and writes; the revoked holder's post is refused at
/// the ledger (`revoke_fenced_holder`), and its payout, already paid, is posted once by a
/// later holder.
#[test]
fn a_revoke_mid_flight_pays_nothing_twice() {
    for seed in world_seeds() {
        let (o, f) = play_in_the_world("revoke-mid-flight", seed);
        let fenced_posts: Vec<Uuid> = f
            .seen
            .iter()
            .filter_map(|s| match s {
                Seen::Fenced { op: FencedOp::Post, accepted: false, owner_id, payout_id, .. }
                    if owner_id.starts_with("executor-1/") =>
                {
                    Some(*payout_id)
                }
                _ => None,
            })
            .collect();
        assert!(
            !fenced_posts.is_empty(),
            "seed {seed}: no post of the revoked holder was fenced:\n{}",
            o.trace.join("\n")
        );
        for p in &fenced_posts {
            assert_eq!(f.final_states.get(p), Some(&Some(PayoutState::Posted)), "seed {seed}: payout {p}");
            assert_eq!(rail_calls_of(&f, *p), 1, "seed {seed}: payout {p} at the rail");
        }
        assert!(probe(&o, Probe::RevokeFencedHolder) >= 1, "seed {seed}: {:?}", o.probes);
        assert!(all_posted(&f), "seed {seed}: {:?}", f.final_states);
    }
}

/// A holder stalled past its lease before its batch's post (C3-extensions E-19): it claimed
/// several payouts under one grant; when it wakes, its batch post carries the stale grant's
/// one token, and the account's fence, raised meanwhile by the newer holder, refuses it for
/// every payout it names. Each payout is posted once, by a newer holder, and paid once.
#[test]
fn a_stale_batch_post_is_refused_whole_at_the_ledger() {
    for seed in world_seeds() {
        let (o, f) = play_in_the_world("stale-batch-post", seed);
        let claims_by_token = f.seen.iter().fold(std::collections::BTreeMap::<i64, usize>::new(), |mut m, s| {
            if let Seen::Fenced { op: FencedOp::Claim, accepted: true, owner_id, token, .. } = s {
                if owner_id.starts_with("executor-1/") {
                    *m.entry(*token).or_default() += 1;
                }
            }
            m
        });
        assert!(
            claims_by_token.values().any(|n| *n >= 2),
            "seed {seed}: executor 1 claimed no batch: {claims_by_token:?}\n{}",
            o.trace.join("\n")
        );
        let fenced: Vec<(i64, Uuid)> = f
            .seen
            .iter()
            .filter_map(|s| match s {
                Seen::Fenced { op: FencedOp::Post, accepted: false, owner_id, token, payout_id, .. }
                    if owner_id.starts_with("executor-1/") =>
                {
                    Some((*token, *payout_id))
                }
                _ => None,
            })
            .collect();
        let first = fenced.first().map(|(t, _)| *t);
        let whole: Vec<&(i64, Uuid)> = fenced.iter().filter(|(t, _)| Some(*t) == first).collect();
        assert!(
            whole.len() >= 2,
            "seed {seed}: no batch post of executor 1 was fenced whole: {fenced:?}\n{}",
            o.trace.join("\n")
        );
        for (_, p) in whole {
            assert_eq!(f.final_states.get(p), Some(&Some(PayoutState::Posted)), "seed {seed}: payout {p}");
            assert_eq!(rail_calls_of(&f, *p), 1, "seed {seed}: payout {p} at the rail");
        }
        assert!(probe(&o, Probe::FencedOutLedger) >= 1, "seed {seed}: {:?}", o.probes);
        assert!(all_posted(&f) && all_settled_once(&f), "seed {seed}: {:?}", f.final_states);
    }
}

/// A rail that pays every repeat and fails 30 % of calls, a lossy proxy-to-rail link and a
/// proxy crash mid-call: unknown outcomes become RAIL_AMBIGUOUS and are never submitted
/// again (the oracle counts refused attempts too), orphaned intents are swept, and each
/// payout reaches the rail at most once.
#[test]
fn a_duplicate_paying_rail_with_a_lossy_link_and_a_proxy_crash_pays_nothing_twice() {
    for seed in world_seeds() {
        let (o, f) = play_in_the_world("duplicate-ack-rail", seed);
        assert!(first_fault(&f, |k| matches!(k, FaultKind::Kill)).is_some(), "seed {seed}: the proxy never crashed");
        assert!(probe(&o, Probe::AmbiguousOutcome) >= 1, "seed {seed}: {:?}", o.probes);
        assert!(all_settled_once(&f), "seed {seed}: {:?} / {:?}", f.final_states, f.rail_calls);
    }
}

/// Every created payout settled (POSTED, FAILED, ABANDONED or RAIL_AMBIGUOUS) and reached
/// the rail at most once.
fn all_settled_once(f: &ScenarioFacts) -> bool {
    let settled = |s: &Option<PayoutState>| s.is_some_and(|s| s.is_terminal() || s == PayoutState::RailAmbiguous);
    !f.final_states.is_empty()
        && f.final_states.values().all(settled)
        && f.final_states.keys().all(|p| rail_calls_of(f, *p) <= 1)
}
