//! The simulation's switches (a defence layer turned off, a planted bug) hold for the
//! thread that set them and no other. Plain `#[test]`s under `--cfg madsim`: they run
//! outside any madsim runtime, so no simulated node reaches them, and the second thread each
//! starts is a real OS thread on purpose (only another thread can show the switch does not
//! leak), not the runtime seam's spawn.
#![allow(
    clippy::disallowed_methods,
    reason = "a test of per-thread switches: it starts its own threads, outside the services"
)]
#![cfg(madsim)]

use dlock_contract::defence::{self, Layer, Tally};
use dlock_contract::planted::{self, Bug};

#[test]
fn a_switched_off_layer_lets_its_refusals_through_and_counts_them_on_this_thread_only() {
    defence::reset();
    defence::set_off(Some(Layer::RailMark));
    assert!(defence::off(Layer::RailMark) && !defence::off(Layer::ClaimFence));
    assert!(!defence::stops(Layer::RailMark, true));
    assert!(!defence::stops(Layer::RailMark, false));
    assert!(defence::stops(Layer::ClaimFence, true));
    let t = defence::snapshot();
    assert_eq!((t.bypassed(Layer::RailMark), t.stopped(Layer::RailMark)), (1, 0));
    assert_eq!(t.stopped(Layer::ClaimFence), 1);
    let other = std::thread::spawn(|| (defence::current(), defence::snapshot())).join().expect("thread");
    assert_eq!(other, (None, Tally::default()));
    defence::set_off(None);
    defence::reset();
    assert!(defence::stops(Layer::RailMark, true));
    assert_eq!(defence::snapshot().stopped(Layer::RailMark), 1);
    defence::reset();
}

#[test]
fn a_planted_bug_is_on_for_this_thread_only_and_its_layers_are_off() {
    planted::set(Some(Bug::FencingOffBoth));
    assert!(planted::on(Bug::FencingOffBoth) && !planted::on(Bug::MarkGe));
    for l in Layer::ALL {
        let expected = matches!(l, Layer::ClaimFence | Layer::PostFence | Layer::RailMark);
        assert_eq!(defence::off(l), expected, "{l}");
    }
    let other = std::thread::spawn(|| (planted::current(), defence::off(Layer::RailMark))).join().expect("thread");
    assert_eq!(other, (None, false));
    planted::set(None);
    assert_eq!(planted::current(), None);
    assert!(!defence::off(Layer::RailMark));
}
