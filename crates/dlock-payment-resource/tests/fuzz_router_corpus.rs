//! Replays the committed seed corpus of the `router_body` fuzz target
//! (`fuzz/corpus/router_body/`) through its property (`fuzz/props/router.rs`): the real
//! router over the in-memory store never answers a body with a 5xx or a non-envelope error.
//! The coverage-guided run is the `fuzz` stage of `scripts/test.sh` (`fuzz/README.md`).

#![cfg(not(madsim))]

#[path = "../../../fuzz/props/replay.rs"]
mod corpus;
#[path = "../../../fuzz/props/router.rs"]
mod props;
use corpus::replay;

#[test]
fn router_body_corpus_never_yields_a_5xx_or_a_non_envelope_error() {
    replay("router_body", props::router_body);
}
