//! The per-node clocks of the runtime seam, proved at the seam (run under `--cfg madsim`).
//!
//! Global time is read with `sim_clock::reference_now()`; a node's time with
//! `Instant::now()` on the node or `sim_clock::now_on(node)` from the supervisor. Letting
//! global time pass uses madsim's own sleep on purpose: it is the clock under the node clocks.
#![cfg(madsim)]

use std::future::pending;

use dlock_rt::sim_clock::{self, Frame};
use dlock_rt::{Clock, Duration, Instant};
use madsim::runtime::{Handle, NodeHandle};

fn node(name: &str) -> NodeHandle {
    Handle::current().create_node().name(name).build()
}

/// Lets `d` of global time pass on the supervisor.
async fn global_sleep(d: Duration) {
    madsim::time::sleep(d).await;
}

const MS: Duration = Duration::from_millis(1);

/// madsim fires a timer 50 ns after its deadline; readings scaled from it are off by less
/// than this.
const EPS: Duration = Duration::from_micros(1);

#[track_caller]
fn assert_about(actual: Duration, want: Duration, what: &str) {
    assert!(actual >= want && actual < want + EPS, "{what}: {actual:?}, want {want:?}");
}

#[madsim::test]
async fn a_half_rate_node_sees_half_the_global_time() {
    let slow = node("slow");
    sim_clock::set_rate(slow.id(), 0.5);
    let seen = slow
        .spawn(async {
            let g0 = sim_clock::reference_now();
            let t0 = Instant::now();
            let c0 = Clock::system().now();
            global_sleep(Duration::from_secs(4)).await;
            (sim_clock::reference_now() - g0, Instant::now() - t0, t0.elapsed(), Clock::system().now() - c0)
        })
        .await
        .expect("node task");
    assert_about(seen.0, Duration::from_secs(4), "global");
    assert_about(seen.1, Duration::from_secs(2), "Instant::now on the node");
    assert_about(seen.2, Duration::from_secs(2), "Instant::elapsed on the node");
    assert_about(seen.3, Duration::from_secs(2), "Clock::now on the node");
    assert_eq!(sim_clock::rate(slow.id()), 0.5);
}

#[madsim::test]
async fn a_one_second_sleep_on_a_half_rate_node_lasts_two_global_seconds() {
    let slow = node("slow");
    sim_clock::set_rate(slow.id(), 0.5);
    let (global, local) = slow
        .spawn(async {
            let (g0, t0) = (sim_clock::reference_now(), Instant::now());
            dlock_rt::sleep(Duration::from_secs(1)).await;
            (sim_clock::reference_now() - g0, Instant::now() - t0)
        })
        .await
        .expect("node task");
    assert!(global >= Duration::from_secs(2) && global < Duration::from_secs(2) + MS, "{global:?}");
    assert!(local >= Duration::from_secs(1) && local < Duration::from_secs(1) + MS, "{local:?}");
}

#[madsim::test]
async fn a_sleep_on_a_fast_node_ends_early_in_global_time() {
    let fast = node("fast");
    sim_clock::set_rate(fast.id(), 1.5);
    let global = fast
        .spawn(async {
            let g0 = sim_clock::reference_now();
            dlock_rt::sleep(Duration::from_secs(3)).await;
            sim_clock::reference_now() - g0
        })
        .await
        .expect("node task");
    assert!(global >= Duration::from_secs(2) && global < Duration::from_secs(2) + MS, "{global:?}");
}

/// Sleeps `sleep` on a 1× node, changes its rate to `rate` after `change_after` of global
/// time, and answers how much global time the sleep took.
async fn sleep_across_a_rate_change(sleep: Duration, change_after: Duration, rate: f64) -> Duration {
    let n = node("changing");
    let sleeper = n.spawn(async move {
        let g0 = sim_clock::reference_now();
        dlock_rt::sleep(sleep).await;
        sim_clock::reference_now() - g0
    });
    global_sleep(change_after).await;
    sim_clock::set_rate(n.id(), rate);
    sleeper.await.expect("node task")
}

#[madsim::test]
async fn a_rate_change_mid_sleep_applies_to_the_rest_of_the_sleep() {
    // 2 s at 1×, then the remaining 8 s of node time at 0.5×: 16 s.
    let slowed = sleep_across_a_rate_change(Duration::from_secs(10), Duration::from_secs(2), 0.5).await;
    assert!(slowed >= Duration::from_secs(18) && slowed < Duration::from_secs(18) + MS, "{slowed:?}");
}

#[madsim::test]
async fn a_speed_up_mid_sleep_wakes_the_sleeper_early() {
    // 2 s at 1×, then the remaining 8 s of node time at 2×: 4 s, not the 8 s first planned.
    let sped = sleep_across_a_rate_change(Duration::from_secs(10), Duration::from_secs(2), 2.0).await;
    assert!(sped >= Duration::from_secs(6) && sped < Duration::from_secs(6) + MS, "{sped:?}");
}

#[madsim::test]
async fn timeout_on_a_slow_node_fires_after_the_node_clocks_deadline() {
    let slow = node("slow");
    sim_clock::set_rate(slow.id(), 0.5);
    let (out, global) = slow
        .spawn(async {
            let g0 = sim_clock::reference_now();
            let out = dlock_rt::timeout(Duration::from_secs(1), pending::<()>()).await;
            (out, sim_clock::reference_now() - g0)
        })
        .await
        .expect("node task");
    assert_eq!(out, None);
    assert!(global >= Duration::from_secs(2) && global < Duration::from_secs(2) + MS, "{global:?}");
    // A ready future wins, even at a zero deadline.
    let ready = slow.spawn(dlock_rt::timeout(Duration::ZERO, async { 7 })).await.expect("node task");
    assert_eq!(ready, Some(7));
}

#[madsim::test]
async fn wait_until_gives_up_on_the_node_clocks_deadline() {
    let fast = node("fast");
    sim_clock::set_rate(fast.id(), 2.0);
    let (out, global) = fast
        .spawn(async {
            let g0 = sim_clock::reference_now();
            let out =
                dlock_rt::wait_until(Duration::from_millis(100), Duration::from_secs(1), || async { None::<()> }).await;
            (out, sim_clock::reference_now() - g0)
        })
        .await
        .expect("node task");
    assert_eq!(out, None);
    // One node second is half a global second; the last poll interval may overshoot it.
    assert!(global >= Duration::from_millis(500) && global <= Duration::from_millis(560), "{global:?}");
}

#[madsim::test]
async fn sleep_until_a_node_instant_waits_for_that_nodes_clock() {
    let slow = node("slow");
    sim_clock::set_rate(slow.id(), 0.25);
    let global = slow
        .spawn(async {
            let g0 = sim_clock::reference_now();
            let deadline = Instant::now() + Duration::from_millis(500);
            dlock_rt::sleep_until(deadline).await;
            assert!(Instant::now() >= deadline);
            sim_clock::reference_now() - g0
        })
        .await
        .expect("node task");
    assert!(global >= Duration::from_secs(2) && global < Duration::from_secs(2) + MS, "{global:?}");
}

#[madsim::test]
async fn a_zero_sleep_on_a_drifted_node_still_lets_time_move() {
    let slow = node("slow");
    sim_clock::set_rate(slow.id(), 0.1);
    let global = slow
        .spawn(async {
            let g0 = sim_clock::reference_now();
            dlock_rt::sleep(Duration::ZERO).await;
            sim_clock::reference_now() - g0
        })
        .await
        .expect("node task");
    assert!(global >= MS, "{global:?}");
}

#[madsim::test]
async fn a_wall_step_backwards_moves_the_wall_clock_back_but_never_now() {
    let n = node("stepped");
    let id = n.id();
    let (wall_gap, reference_gap, skewed_gap, mono) = n
        .spawn(async move {
            let clock = Clock::system();
            let skewed = Clock::with_skew_ms(1_000);
            let (w0, r0, t0) = (clock.wall(), Clock::reference().wall(), Instant::now());
            sim_clock::step_wall(id, -60_000);
            let (w1, r1, s1, t1) = (clock.wall(), Clock::reference().wall(), skewed.wall(), Instant::now());
            ((w1 - w0).num_milliseconds(), (r1 - r0).num_milliseconds(), (s1 - w1).num_milliseconds(), t1 - t0)
        })
        .await
        .expect("node task");
    assert_eq!(wall_gap, -60_000, "the node's wall clock went back");
    assert_eq!(reference_gap, 0, "the reference wall clock did not move");
    assert_eq!(skewed_gap, 1_000, "a Clock's own skew still comes on top");
    assert_eq!(mono, Duration::ZERO, "the monotonic clock did not move, and certainly not back");
    assert_eq!(sim_clock::wall_offset_ms(id), -60_000);
    sim_clock::step_wall(id, 90_000);
    assert_eq!(sim_clock::wall_offset_ms(id), 30_000);
}

#[madsim::test]
async fn the_monotonic_clock_never_decreases_whatever_the_rate_does() {
    let n = node("wobbly");
    let mut last = sim_clock::now_on(n.id());
    for (i, rate) in [1.5, 0.1, 10.0, 0.5, 1.0, 0.1, 2.0].into_iter().enumerate() {
        sim_clock::set_rate(n.id(), rate);
        let at_change = sim_clock::now_on(n.id());
        assert!(at_change >= last, "step {i}: {at_change:?} < {last:?}");
        global_sleep(Duration::from_millis(700)).await;
        let after = sim_clock::now_on(n.id());
        assert!(after > at_change, "step {i}");
        last = after;
    }
}

#[madsim::test]
async fn two_nodes_drift_independently() {
    let (a, b) = (node("a"), node("b"));
    sim_clock::set_rate(a.id(), 0.5);
    sim_clock::set_rate(b.id(), 1.5);
    sim_clock::step_wall(b.id(), 5_000);
    let (a0, b0, me0, g0) =
        (sim_clock::now_on(a.id()), sim_clock::now_on(b.id()), Instant::now(), sim_clock::reference_now());
    global_sleep(Duration::from_secs(10)).await;
    assert_about(sim_clock::now_on(a.id()) - a0, Duration::from_secs(5), "a at 0.5×");
    assert_about(sim_clock::now_on(b.id()) - b0, Duration::from_secs(15), "b at 1.5×");
    assert_about(Instant::now() - me0, Duration::from_secs(10), "the supervisor's untouched clock");
    assert_about(sim_clock::reference_now() - g0, Duration::from_secs(10), "global");
    assert_eq!((sim_clock::wall_offset_ms(a.id()), sim_clock::wall_offset_ms(b.id())), (0, 5_000));
}

#[madsim::test]
async fn a_reset_restores_rate_and_wall_and_never_winds_the_clock_back() {
    let id = Handle::current().create_node().name("restarted").init(|| async { pending::<()>().await }).build().id();
    sim_clock::set_rate(id, 2.0);
    sim_clock::step_wall(id, -7_000);
    global_sleep(Duration::from_secs(10)).await;
    let before = sim_clock::now_on(id);
    Handle::current().restart(id);
    sim_clock::reset(id);
    let after = sim_clock::now_on(id);
    assert_eq!(after, before, "a reset continues the reading: 20 s of node time stay");
    assert_eq!(sim_clock::rate(id), 1.0);
    assert_eq!(sim_clock::wall_offset_ms(id), 0);
    global_sleep(Duration::from_secs(1)).await;
    assert_about(sim_clock::now_on(id) - after, Duration::from_secs(1), "after the reset, 1×");
    // The restarted node's own tasks read the reset clock.
    let restarted = Handle::current().get_node(id).expect("the node is still there");
    let wall_gap = restarted
        .spawn(async { (Clock::system().wall() - Clock::reference().wall()).num_milliseconds() })
        .await
        .expect("node task");
    assert_eq!(wall_gap, 0);
}

#[madsim::test]
async fn node_instants_carry_their_frame() {
    let n = node("framed");
    assert_eq!(sim_clock::now_on(n.id()).frame(), Frame::Node(n.id()));
    assert_eq!(Clock::reference().now().frame(), Frame::Reference);
    let on_node = n.spawn(async { Clock::system().now().frame() }).await.expect("node task");
    assert_eq!(on_node, Frame::Node(n.id()));
}

#[madsim::test]
#[should_panic(expected = "instants of two clocks compared")]
async fn instants_of_two_nodes_do_not_compare() {
    let (a, b) = (node("a"), node("b"));
    let _ = sim_clock::now_on(a.id()) < sim_clock::now_on(b.id());
}

#[madsim::test]
#[should_panic(expected = "instants of two clocks compared")]
async fn a_node_instant_does_not_subtract_from_a_reference_instant() {
    let a = node("a");
    let _ = sim_clock::reference_now() - sim_clock::now_on(a.id());
}

#[madsim::test]
#[should_panic(expected = "outside 0.1..=10")]
async fn a_rate_below_the_bound_is_refused() {
    sim_clock::set_rate(node("x").id(), 0.05);
}

#[madsim::test]
#[should_panic(expected = "outside 0.1..=10")]
async fn a_rate_that_is_not_a_number_is_refused() {
    sim_clock::set_rate(node("x").id(), f64::NAN);
}

#[madsim::test]
#[should_panic(expected = "beyond")]
async fn a_wall_offset_beyond_the_bound_is_refused() {
    sim_clock::step_wall(node("x").id(), sim_clock::WALL_OFFSET_MS_MAX + 1);
}

/// The clock readings of one seeded run: a slow node and a fast node sleeping in turns.
fn readings(seed: u64) -> Vec<Duration> {
    let rt = madsim::runtime::Runtime::with_seed_and_config(seed, madsim::Config::default());
    rt.block_on(async {
        let (a, b) = (node("a"), node("b"));
        sim_clock::set_rate(a.id(), 0.7);
        sim_clock::set_rate(b.id(), 1.3);
        let a0 = sim_clock::now_on(a.id());
        let mut out = Vec::new();
        for i in 0..5u64 {
            let d = Duration::from_millis(dlock_rt::rand::random_u64() % 1_000 + i);
            let on = if i % 2 == 0 { &a } else { &b };
            let g = on
                .spawn(async move {
                    let g0 = sim_clock::reference_now();
                    dlock_rt::sleep(d).await;
                    sim_clock::reference_now() - g0
                })
                .await
                .expect("node task");
            out.push(g);
            out.push(sim_clock::now_on(a.id()) - a0);
        }
        out
    })
}

#[test]
fn the_same_seed_gives_the_same_clock_readings() {
    assert_eq!(readings(7), readings(7));
    assert_ne!(readings(7), readings(8));
}

#[test]
fn a_new_runtime_starts_with_untouched_clocks() {
    let first = madsim::runtime::Runtime::new();
    let id = first.block_on(async {
        let n = node("n");
        sim_clock::set_rate(n.id(), 0.5);
        sim_clock::step_wall(n.id(), 9_000);
        n.id()
    });
    drop(first);
    let second = madsim::runtime::Runtime::new();
    let (rate, offset, same_id) = second.block_on(async move {
        let n = node("n");
        (sim_clock::rate(n.id()), sim_clock::wall_offset_ms(n.id()), n.id() == id)
    });
    assert!(same_id, "the second runtime reuses the node id, so a stale registry would show");
    assert_eq!((rate, offset), (1.0, 0));
}

#[madsim::test]
async fn a_timeout_too_far_to_represent_never_fires() {
    let slow = node("slow");
    sim_clock::set_rate(slow.id(), 0.1);
    let out = slow
        .spawn(async {
            let far = dlock_rt::timeout(Duration::MAX, async {
                dlock_rt::sleep(Duration::from_secs(5)).await;
                3
            });
            far.await
        })
        .await
        .expect("node task");
    assert_eq!(out, Some(3));
}
