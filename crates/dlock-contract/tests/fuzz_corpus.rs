//! Replays the committed seed corpus of each header fuzz target (`fuzz/corpus/<target>/`)
//! through the same property the target checks (`fuzz/props/headers.rs`), so the properties
//! run in every normal `cargo test`, on stable, without libFuzzer. The coverage-guided runs
//! are the `fuzz` stage of `scripts/test.sh` (`fuzz/README.md`).

#[path = "../../../fuzz/props/headers.rs"]
mod props;

use std::path::Path;

use dlock_contract::headers::{FencingToken, HeaderError};

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
    for f in files {
        let data = std::fs::read(&f).unwrap_or_else(|e| panic!("{}: {e}", f.display()));
        property(&data);
    }
}

#[test]
fn fencing_token_corpus_keeps_the_canonical_spelling_property() {
    replay("fencing_token", props::fencing_token);
}

#[test]
fn owner_id_corpus_keeps_the_visible_ascii_property() {
    replay("owner_id", props::owner_id);
}

#[test]
fn idempotency_key_corpus_keeps_the_visible_ascii_property() {
    replay("idempotency_key", props::idempotency_key);
}

#[test]
fn submission_body_corpus_keeps_the_validated_body_property() {
    replay("submission_body", props::submission_body);
}

#[test]
#[should_panic(expected = "refused the canonical token")]
fn the_fencing_token_property_fails_a_parser_that_refuses_a_canonical_token() {
    props::fencing_token_check("1", Err(HeaderError::MalformedToken));
}

#[test]
#[should_panic(expected = "accepted a non-canonical token")]
fn the_fencing_token_property_fails_a_parser_that_accepts_a_padded_token() {
    props::fencing_token_check("01", FencingToken::parse("1"));
}
