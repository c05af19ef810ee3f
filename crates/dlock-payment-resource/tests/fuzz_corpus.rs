//! Replays the committed seed corpus of the payment-resource's fuzz targets
//! (`fuzz/corpus/<target>/`) through the same property each target checks
//! (`fuzz/props/payment.rs`), so the properties run in every normal `cargo test`, on stable,
//! without libFuzzer. The coverage-guided runs are the `fuzz` stage of `scripts/test.sh`
//! (`fuzz/README.md`).

#[path = "../../../fuzz/props/replay.rs"]
mod corpus;
#[path = "../../../fuzz/props/payment.rs"]
mod props;
use corpus::replay;

#[test]
fn jcs_fingerprint_corpus_is_stable_under_respelling_and_changes_with_any_value() {
    replay("jcs_fingerprint", props::jcs_fingerprint);
}

#[test]
fn cursor_codec_corpus_accepts_only_issued_cursors_under_their_own_filter() {
    replay("cursor_codec", props::cursor_codec);
}

#[test]
fn the_cursor_corpus_holds_authentic_cursors_for_the_fuzzer_to_mutate() {
    // The seeds `seed-cursor-*` are cursors signed with the targets' key: without them the
    // fuzzer would only ever see cursors that fail the MAC.
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/corpus/cursor_codec");
    let key = props::cursor_key();
    let mut authentic = 0;
    for e in std::fs::read_dir(&dir).expect("corpus dir").filter_map(Result::ok) {
        let data = std::fs::read(e.path()).expect("seed");
        if let Some((0, raw)) = data.split_first().map(|(m, r)| (*m, r)) {
            let raw = std::str::from_utf8(raw).unwrap_or("");
            let states = [
                dlock_contract::payout::PayoutState::Pending,
                dlock_contract::payout::PayoutState::Claimed,
                dlock_contract::payout::PayoutState::Posted,
            ];
            let accepted = states
                .into_iter()
                .any(|s| [None, Some("acct:1"), Some("acct:2")].into_iter().any(|a| key.decode(raw, s, a).is_ok()));
            authentic += usize::from(accepted);
        }
    }
    assert!(authentic >= 2, "only {authentic} authentic cursors in {}", dir.display());
}
