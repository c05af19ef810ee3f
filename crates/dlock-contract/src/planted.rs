//! Negative controls: planted bugs, one test-only switch per bug this project exists to
//! prevent, so a simulation campaign can show that its oracle finds each one (issue 11).
//!
//! Each bug lives at exactly the one place the defect would live in real code, which asks
//! this module with [`on`]:
//!
//! ```text
//! if dlock_contract::planted::on(Bug::MarkGe) { the defective comparison } else { the right one }
//! ```
//!
//! | bug | where it lives |
//! |---|---|
//! | `fencing-off-payment` | the payment-resource's account fence at claim and at post (both [`crate::defence::Layer::ClaimFence`] and `PostFence` off) |
//! | `fencing-off-proxy` | the rail-proxy's high-water mark ([`crate::defence::Layer::RailMark`] off) |
//! | `fencing-off-both` | all three fences above |
//! | `executor-retries-submit` | the executor, after a rail timeout or a lost answer: it submits again under a fresh idempotency key |
//! | `mark-ge` | the mark's comparison in `dlock_paydb::admission::mark_verdict`: `>=` where `>` belongs (an equal token passes) |
//! | `mark-after-call` | the proxy's admission: the mark is not written with the intent, but when the rail call's outcome is recorded (after the forward returns) |
//! | `revoke-keeps-floor` | the lock server's revoke: the grant is deleted, the token floor is not raised |
//! | `grant-unexpired` | the lock server's acquire rule: a key whose grant still lives is granted again |
//! | `skip-grant-signature-check` | [`crate::grant::GrantVerifier::verify`]: every grant is admitted, signed or not (the forger's writes reach the fences) |
//! | `etcd-wall-clock-judge` | the lock server on etcd judges leases by the old rule: its own wall clock against the deadline another replica wrote with its wall clock (`store_etcd`, "Time"), instead of durations on its monotonic clock since it first saw the record |
//! | `skip-owner-check` | the lock server's owner check (`LockServer::may_address`, C3-extensions E-9): a credential bound to owner ids may address any owner's session or grant (the forger's owner attacks are judged on their merits) |
//! | `fence-off-by-one` | the account fence's comparison in `dlock_payment_resource::rules::fence_check`: `stored + 1 < presented` where `stored < presented` belongs (the next token is refused as if a newer one held the fence); the SQL stores' statement binds `rules::fence_sql_bound`, one below the token |
//! | `lease-end-inclusive` | the lock server's liveness rule (`rules::grant_live`): a grant still live at the very tick its lease or session ends (`now <= end`), the conservative direction no safety invariant objects to |
//! | `rotate-lapsed-session` | the lock server's rotate rule (`rules::decide_rotate`): the caller's grant judged by its lease alone, its session not checked (a holder whose session lapsed keeps rotating) |
//! | `batch-ignores-account` | a batch's read, every store's (`dlock_payment_resource::rules::batch_may_write`): a batch's payouts read by id alone, not filtered by the account whose fence the batch passed (a store that stopped filtering by account) |
//! | `reconciler-trusts-answer` | the reconciler's reading of the rail's record: a call counts as paid when the rail *answered* it paid (`outcome == ACCEPTED`), not when the record says it moved money (`paid`) |
//! | `event-outside-txn` | the simulation's paydb (`dlock_paydb::mem`): a claim's events (`fence.raised`, `payout.state_changed`) written for the request even when the claim was refused and rolled back, as a service that writes its events apart from its transaction would |
//! | `cursor-one-past` | the event stream's resume (`dlock_http::stream::EventHub::resume`): the stream continues one seq past the cursor |
//! | `no-resync-after-retention` | the event stream's resume and its connections (`dlock_http::stream`): a cursor the retention purge has passed is resumed, not answered `resync_required` |
//! | `p1-hides-ahead` | the payment-resource's payouts list (P1, `app::list_payouts`): a first page without the rows stamped after its millisecond (bug B8, docs/testing/bugs.md), so payouts a clock ahead stamped stay hidden from every scan until this clock catches up |
//!
//! The fencing bugs (1–3) are the defence layers of [`crate::defence`] switched off
//! together, with one difference from a defence-in-depth run: the oracle is not told, so a
//! lower token a switched-off fence takes is a finding ([`crate::defence::off`] asks this
//! module too).
//!
//! ## A test-only build for real processes
//!
//! The real run (docs/real-runs.md, "Planted bugs on real processes") plants bugs in real
//! processes through a **test-only build**: `cargo build --release -p dlock --features
//! planted`. Only that build reads [`ENV`] (`DLOCK_PLANTED_BUG=NAME`), once, when a bug
//! point first asks; its binary says so on stderr at every start. The fencing bugs are not
//! planted this way: in the SQL stores the fences are the `unsafe-test` profile's safety
//! switches, so the real run turns those off instead ([`parse_env`] refuses their names).
//!
//! ## Invariants
//! - **Compiled out of production.** Outside `cfg(madsim)` and without the `planted`
//!   feature, [`on`] is the constant `false` (`#[inline]`, no state) and [`current`] is
//!   `None`: no production build can plant a bug, because the only setter, `set`, exists only
//!   under `cfg(madsim)` and only the feature reads [`ENV`]. No crate of the workspace turns
//!   the feature on by default (`dlock`'s own `planted` feature forwards to it). A
//!   normal-cfg unit test holds the first half, a `compile_fail` doctest (on [`current`])
//!   the second, and `scripts/test.sh`'s release stage checks that the release binary
//!   ignores [`ENV`].
//! - [`turns_off`] never reads [`ENV`]: a planted build switches no defence layer off.
//! - **At most one bug is planted**, and only on the thread that planted it (one madsim
//!   runtime per thread): a campaign plants it before a seed and clears it after. A planted
//!   build plants one bug in the whole process.
//! - **Nothing changes when no bug is planted**: every bug point then takes the path the code
//!   took before the switch existed.
//! - The names ([`Bug::name`]) are stable: `dlock-sim --plant NAME` and the campaign
//!   summaries use them.

use crate::defence::Layer;

/// One planted bug (module doc).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Bug {
    /// Fencing off at the payment-resource: the account fence neither at claim nor at post.
    FencingOffPayment,
    /// Fencing off at the rail-proxy: the high-water mark never refuses.
    FencingOffProxy,
    /// Both of the above.
    FencingOffBoth,
    /// The executor submits again after a rail timeout (`RAIL_AMBIGUOUS`) or a lost answer.
    ExecutorRetriesSubmit,
    /// `>=` in place of `>` at the rail's mark: a token equal to the mark passes.
    MarkGe,
    /// The proxy advances the mark after the rail call instead of with the intent.
    MarkAfterCall,
    /// Revoke deletes the grant without raising the token floor.
    RevokeKeepsFloor,
    /// The lock server grants a key whose lease has not expired.
    GrantUnexpired,
    /// The resources admit every grant without checking its signature.
    SkipGrantSignatureCheck,
    /// The lock server lets a credential bound to owner ids address any owner's session or
    /// grant.
    SkipOwnerCheck,
    /// On etcd, each replica judges leases by its wall clock against deadlines other
    /// replicas wrote with theirs (the rule before C1 §1.5.4).
    EtcdWallClockJudge,
    /// The reconciler counts a rail call as paid by the rail's answer, not by its record.
    ReconcilerTrustsAnswer,
    /// The account fence refuses the token right above it: `FENCED_OUT` with no newer holder.
    FenceOffByOne,
    /// A grant is judged still live at the tick its lease or session ends.
    LeaseEndInclusive,
    /// A rotate judges the caller's grant by its lease alone and never checks its session.
    RotateLapsedSession,
    /// A batch writes the payouts it names whatever their account.
    BatchIgnoresAccount,
    /// P1's first page lists only the rows created before its millisecond (bug B8).
    P1HidesAhead,
    /// paydb's events written outside the transaction of their change: a fenced write's
    /// events are written even when the write was refused and rolled back.
    EventOutsideTxn,
    /// The event stream resumes one past the cursor: the first event after it is skipped.
    CursorOnePast,
    /// The event stream resumes from a cursor the retention purge has passed, instead of
    /// sending `resync_required`.
    NoResyncAfterRetention,
}

impl Bug {
    /// Every bug, in the issue's order.
    pub const ALL: [Bug; 20] = [
        Bug::FencingOffPayment,
        Bug::FencingOffProxy,
        Bug::FencingOffBoth,
        Bug::ExecutorRetriesSubmit,
        Bug::MarkGe,
        Bug::MarkAfterCall,
        Bug::RevokeKeepsFloor,
        Bug::GrantUnexpired,
        Bug::SkipGrantSignatureCheck,
        Bug::SkipOwnerCheck,
        Bug::EtcdWallClockJudge,
        Bug::ReconcilerTrustsAnswer,
        Bug::FenceOffByOne,
        Bug::LeaseEndInclusive,
        Bug::RotateLapsedSession,
        Bug::BatchIgnoresAccount,
        Bug::P1HidesAhead,
        Bug::EventOutsideTxn,
        Bug::CursorOnePast,
        Bug::NoResyncAfterRetention,
    ];

    /// The stable name (`--plant NAME`).
    pub fn name(self) -> &'static str {
        match self {
            Bug::FencingOffPayment => "fencing-off-payment",
            Bug::FencingOffProxy => "fencing-off-proxy",
            Bug::FencingOffBoth => "fencing-off-both",
            Bug::ExecutorRetriesSubmit => "executor-retries-submit",
            Bug::MarkGe => "mark-ge",
            Bug::MarkAfterCall => "mark-after-call",
            Bug::RevokeKeepsFloor => "revoke-keeps-floor",
            Bug::GrantUnexpired => "grant-unexpired",
            Bug::SkipGrantSignatureCheck => "skip-grant-signature-check",
            Bug::SkipOwnerCheck => "skip-owner-check",
            Bug::EtcdWallClockJudge => "etcd-wall-clock-judge",
            Bug::ReconcilerTrustsAnswer => "reconciler-trusts-answer",
            Bug::FenceOffByOne => "fence-off-by-one",
            Bug::LeaseEndInclusive => "lease-end-inclusive",
            Bug::RotateLapsedSession => "rotate-lapsed-session",
            Bug::BatchIgnoresAccount => "batch-ignores-account",
            Bug::P1HidesAhead => "p1-hides-ahead",
            Bug::EventOutsideTxn => "event-outside-txn",
            Bug::CursorOnePast => "cursor-one-past",
            Bug::NoResyncAfterRetention => "no-resync-after-retention",
        }
    }

    /// The bug of a stable name; `None` for anything else.
    pub fn parse(name: &str) -> Option<Bug> {
        Bug::ALL.into_iter().find(|b| b.name() == name)
    }

    /// The defence layers this bug switches off (the fencing bugs; empty for the others).
    pub fn layers_off(self) -> &'static [Layer] {
        match self {
            Bug::FencingOffPayment => &[Layer::ClaimFence, Layer::PostFence],
            Bug::FencingOffProxy => &[Layer::RailMark],
            Bug::FencingOffBoth => &[Layer::ClaimFence, Layer::PostFence, Layer::RailMark],
            _ => &[],
        }
    }
}

impl std::fmt::Display for Bug {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// The environment variable a `planted` build reads its one bug from (module doc).
pub const ENV: &str = "DLOCK_PLANTED_BUG";

/// The bug a value of [`ENV`] names: `None` when unset or empty; an error for a name that is
/// not a bug, or for a fencing bug (planted on real processes through the `unsafe-test`
/// profile's switches instead, module doc).
pub fn parse_env(value: Option<&str>) -> Result<Option<Bug>, String> {
    let Some(name) = value.map(str::trim).filter(|v| !v.is_empty()) else {
        return Ok(None);
    };
    let Some(bug) = Bug::parse(name) else {
        let names: Vec<&str> = Bug::ALL.iter().map(|b| b.name()).collect();
        return Err(format!("{ENV}={name:?} names no planted bug (one of: {})", names.join(", ")));
    };
    if !bug.layers_off().is_empty() {
        return Err(format!(
            "{ENV}={name}: a fencing bug is planted with the unsafe-test profile's switches, not in a planted build"
        ));
    }
    Ok(Some(bug))
}

/// Whether this build can plant a bug outside the simulation (the `planted` feature).
pub const fn planted_build() -> bool {
    cfg!(all(not(madsim), feature = "planted"))
}

#[cfg(all(not(madsim), feature = "planted"))]
mod from_env {
    static PLANTED: std::sync::OnceLock<Option<super::Bug>> = std::sync::OnceLock::new();

    /// The bug [`super::ENV`] names, read once; a bad value plants nothing (the binary
    /// refuses to start on it first: `dlock`'s `main`).
    pub fn get() -> Option<super::Bug> {
        *PLANTED.get_or_init(|| super::parse_env(std::env::var(super::ENV).ok().as_deref()).ok().flatten())
    }
}

#[cfg(madsim)]
mod state {
    use std::cell::Cell;

    thread_local! {
        pub static PLANTED: Cell<Option<super::Bug>> = const { Cell::new(None) };
    }
}

/// Whether `bug` is planted on this thread. The constant `false` outside the simulation.
#[inline]
pub fn on(bug: Bug) -> bool {
    #[cfg(madsim)]
    return state::PLANTED.with(|p| p.get() == Some(bug));
    #[cfg(all(not(madsim), feature = "planted"))]
    return from_env::get() == Some(bug);
    #[cfg(all(not(madsim), not(feature = "planted")))]
    {
        let _ = bug;
        false
    }
}

/// Whether the planted bug (if any) switches `layer` off. The constant `false` outside the
/// simulation.
#[inline]
pub fn turns_off(layer: Layer) -> bool {
    #[cfg(madsim)]
    return state::PLANTED.with(|p| p.get().is_some_and(|b| b.layers_off().contains(&layer)));
    #[cfg(not(madsim))]
    {
        let _ = layer;
        false
    }
}

/// Plants `bug` on this thread (`None`: no bug). Simulation only: there is no way to plant
/// a bug in any other build.
#[cfg(madsim)]
pub fn set(bug: Option<Bug>) {
    state::PLANTED.with(|p| p.set(bug));
}

/// The bug planted on this thread, if any (outside the simulation: the planted build's
/// bug, and always `None` in any other build).
///
/// Outside the simulation there is no setter at all; this must not compile there:
#[cfg_attr(not(madsim), doc = "```compile_fail")]
#[cfg_attr(madsim, doc = "```text")]
/// dlock_contract::planted::set(Some(dlock_contract::planted::Bug::MarkGe));
/// ```
pub fn current() -> Option<Bug> {
    #[cfg(madsim)]
    return state::PLANTED.with(|p| p.get());
    #[cfg(all(not(madsim), feature = "planted"))]
    return from_env::get();
    #[cfg(all(not(madsim), not(feature = "planted")))]
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bug_names_are_stable_and_parse_back() {
        let names: Vec<&str> = Bug::ALL.iter().map(|b| b.name()).collect();
        assert_eq!(
            names,
            [
                "fencing-off-payment",
                "fencing-off-proxy",
                "fencing-off-both",
                "executor-retries-submit",
                "mark-ge",
                "mark-after-call",
                "revoke-keeps-floor",
                "grant-unexpired",
                "skip-grant-signature-check",
                "skip-owner-check",
                "etcd-wall-clock-judge",
                "reconciler-trusts-answer",
                "fence-off-by-one",
                "lease-end-inclusive",
                "rotate-lapsed-session",
                "batch-ignores-account",
                "p1-hides-ahead",
                "event-outside-txn",
                "cursor-one-past",
                "no-resync-after-retention",
            ]
        );
        for b in Bug::ALL {
            assert_eq!(Bug::parse(b.name()), Some(b));
        }
        assert_eq!(Bug::parse("mark_ge"), None);
        assert_eq!(Bug::parse(""), None);
    }

    #[test]
    fn the_fencing_bugs_are_the_fence_layers_off_together() {
        assert_eq!(Bug::FencingOffPayment.layers_off(), [Layer::ClaimFence, Layer::PostFence]);
        assert_eq!(Bug::FencingOffProxy.layers_off(), [Layer::RailMark]);
        assert_eq!(Bug::FencingOffBoth.layers_off(), [Layer::ClaimFence, Layer::PostFence, Layer::RailMark]);
        assert!(Bug::ALL[3..].iter().all(|b| b.layers_off().is_empty()));
    }

    #[test]
    fn the_planted_builds_variable_names_one_non_fencing_bug_or_nothing() {
        assert_eq!(parse_env(None), Ok(None));
        assert_eq!(parse_env(Some("  ")), Ok(None));
        assert_eq!(parse_env(Some("mark-ge")), Ok(Some(Bug::MarkGe)));
        assert_eq!(parse_env(Some(" grant-unexpired\n")), Ok(Some(Bug::GrantUnexpired)));
        let bad = parse_env(Some("mark_ge")).unwrap_err();
        assert!(bad.contains("DLOCK_PLANTED_BUG") && bad.contains("mark-ge"), "{bad}");
        for b in [Bug::FencingOffPayment, Bug::FencingOffProxy, Bug::FencingOffBoth] {
            let e = parse_env(Some(b.name())).unwrap_err();
            assert!(e.contains("unsafe-test"), "{e}");
        }
    }

    #[cfg(all(not(madsim), not(feature = "planted")))]
    #[test]
    fn outside_the_simulation_no_bug_is_ever_planted() {
        assert!(!planted_build());
        for b in Bug::ALL {
            assert!(!on(b), "{b} is planted in a production build");
        }
        for l in Layer::ALL {
            assert!(!turns_off(l), "{l} is off in a production build");
            assert!(crate::defence::stops(l, true));
        }
        assert_eq!(current(), None);
    }
}
