//! Replays the committed seed corpus of the `router_body` fuzz target
//! (`fuzz/corpus/router_body/`) through its property (`fuzz/props/router.rs`): the real
//! router over the in-memory store never answers a body with a 5xx or a non-envelope error.
//! The coverage-guided run is the `fuzz` stage of `scripts/test.sh` (`fuzz/README.md`).

#![cfg(not(madsim))]

#[path = "../../../fuzz/props/router.rs"]
mod props;

use std::path::Path;

/// Runs `property` on every file of `fuzz/corpus/<target>/`; the corpus must not be empty.
fn replay(target: &str, property: fn(&[u8])) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/corpus").join(target);
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .filter_map(Result::ok)
        .map(|e| e.path())
        .collect();
    files.sort();
    assert!(!files.is_empty(), "{} holds no seed", dir.display());
    for f in &files {
        let data = std::fs::read(f).unwrap_or_else(|e| panic!("{}: {e}", f.display()));
        property(&data);
    }
}

#[test]
fn router_body_corpus_never_yields_a_5xx_or_a_non_envelope_error() {
    replay("router_body", props::router_body);
}
